"""The protected rolling update of a Nodeset's slurmd pods: which nodes, how many at once.

A Nodeset's `spec.slurmd` changes (an image, an env var, a mount): every Slurm-owned
node's slurmd pod runs the old spec, and its revision annotation (`policy/slurmd.py`
`revision`) says so. Replacing a pod kills slurmd, and killing slurmd under a running job
leaves the node busy until `SlurmdTimeout` and the job's steps without their slurmd
(slurmd(8)), so a pod is replaced only as a repair is: under sunkd's own drain, once
Slurm reports nothing allocated. The steps are the repair's (`policy/slurmdrepair.py`,
trouble `OUTDATED`); this module only chooses the nodes:

- **which**: under `updateStrategy.type: RollingUpdate`, a settled Slurm-owned node (no
  transition: never during a lend or a reclaim) whose one pod of sunkd's runs, its slurmd
  registered and in contact, with a reported revision that is not the spec's; nothing
  else holds it (no Kubernetes hold, conflict or GRES problem, pods known, both sources
  fresh), not pinned to Kubernetes (the lend takes it), and no drain or DOWN on it, nor
  anyone's reason that still means something (`ownership.foreign_word`): a node someone
  else drained waits for them. A revision not reported is unknown, never outdated.
- **how many**: at most `maxUnavailable` of the Nodeset's Slurm-owned nodes unavailable
  at once, counting the nodes in update (sunkd's update drain requested, written or
  showing), under repair, and every Slurm-owned node whose pod is not registered. An
  integer, or a percentage of the Slurm-owned nodes rounded down and at least 1: the
  conservative reading (a DaemonSet rounds a percentage up,
  `GetScaledValueFromIntOrPercent(..., roundUp=true)` in pkg/controller/daemon/util;
  a Deployment's maxUnavailable rounds down).
- **in what order**: idle nodes first (by name), then busy ones by the earliest end of
  their jobs when Slurm reported one (`policy/lend.py` `lend_order`, as for a lend), by
  name otherwise. A busy node chosen is drained at once and waits for its jobs; it holds
  its slot meanwhile, so with the idle ones first it comes last.

`OnDelete`: no running pod is replaced; a pod that is gone (someone deleted it) is
recreated by the repair from the spec as it is now, i.e. at the new revision. A node in
update whose pod is no longer outdated (the spec changed back, the strategy became
`OnDelete`) gets its drain lifted; one whose new pod registered at a revision the spec
has since left stays drained and is replaced again.

Pure: no I/O; `planner.now` is the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sunkd.domain import authorship as marks
from sunkd.domain import wellknown as wk
from sunkd.domain.ownership import Assessment, foreign_word
from sunkd.domain.policy.demand import job_ends
from sunkd.domain.policy.lend import lend_order
from sunkd.domain.policy.model import VERB_DRAIN, PoolSpec
from sunkd.domain.policy.planner import Planner
from sunkd.domain.policy.slurmd import SlurmdNodeset
from sunkd.domain.policy.slurmdrepair import (
    is_update_drain,
    outdated_pod,
    repair_node,
)
from sunkd.domain.slurmdgone import slurmd_registered
from sunkd.domain.slurmnode import in_contact, slurm_unhealthy
from sunkd.domain.state import NodeState, Phase


def max_unavailable(text: str, slurm_owned: int) -> int:
    """`maxUnavailable` ("2" or "25%", checked by the source) as a number of nodes: a
    percentage of `slurm_owned` rounded down, never below 1."""
    if text.endswith("%"):
        return max(1, slurm_owned * int(text[:-1]) // 100)
    return max(1, int(text))


def in_update(node: NodeState) -> bool:
    """sunkd's update drain is on the node or on its way: requested (open), written (its
    mark, not lifted) or showing. Such a node is unavailable and the update's."""
    mark = node.drain_mark
    if mark is not None and mark.lifted is None and is_update_drain(mark.reason):
        return True
    return any(action.side == wk.OWNER_SLURM and action.verb == VERB_DRAIN
               and is_update_drain(marks.requested_reason(action.args, action.reason))
               for action in node.open_actions.values())


def unavailable(planner: Planner, nodeset: SlurmdNodeset,
                members: Sequence[NodeState]) -> set[str]:
    """The Slurm-owned nodes that do not count as serving Slurm through sunkd's pod: in
    update, under repair, or their pod not registered (unknown pods included)."""
    return {node.name for node in members if node.owner == wk.OWNER_SLURM
            and (in_update(node) or node.name in planner.repairing
                 or not slurmd_registered(node, nodeset.uid, nodeset.feature))}


def _candidate(planner: Planner, node: NodeState, nodeset: SlurmdNodeset,
               assessment: Assessment) -> bool:
    slurm = node.slurm
    return (node.owner == wk.OWNER_SLURM and node.transition is None
            and node.name not in planner.repairing and not in_update(node)
            and assessment.actionable and assessment.phase == Phase.SLURM
            and not assessment.k8s_holds and not assessment.conflicts
            and assessment.gres_problem is None and assessment.pin != wk.OWNER_KUBERNETES
            and node.k8s is not None and node.pods is not None
            and slurm is not None and in_contact(slurm) and not slurm_unhealthy(slurm)
            and "DRAIN" not in slurm.flags and not foreign_word(slurm, node.drain_mark)
            and outdated_pod(node, nodeset) is not None)


def choose(planner: Planner, pool: PoolSpec, nodeset: SlurmdNodeset,
           members: Sequence[NodeState], assessments: Mapping[str, Assessment]
           ) -> list[NodeState]:
    """The nodes whose outdated pod the update starts to replace this round, in order,
    within `maxUnavailable` (module docstring)."""
    if not planner.state.sources_fresh():
        return []
    candidates = [n for n in members
                  if _candidate(planner, n, nodeset, assessments[n.name])]
    if not candidates:
        return []
    slurm_owned = sum(1 for n in members if n.owner == wk.OWNER_SLURM)
    slots = (max_unavailable(nodeset.spec.max_unavailable, slurm_owned)
             - len(unavailable(planner, nodeset, members)))
    if slots <= 0:
        return []
    ends = job_ends(planner.state, pool)
    candidates.sort(key=lambda n: lend_order(n, ends))
    return candidates[:slots]


def repair_and_update(planner: Planner, pool: PoolSpec, nodeset: SlurmdNodeset,
                      members: Sequence[NodeState],
                      assessments: Mapping[str, Assessment]) -> set[str]:
    """One round of the repair and the rolling update over the pool's nodes: the nodes
    whose slurmd pod is theirs this round (the plan leaves them alone)."""
    taken = {node.name for node in members
             if repair_node(planner, node, nodeset, assessments[node.name],
                            update=in_update(node))}
    for node in choose(planner, pool, nodeset, members, assessments):
        if repair_node(planner, node, nodeset, assessments[node.name], update=True):
            taken.add(node.name)
    return taken
