"""When Slurm being out of contact with a node is sunkd's own doing: its slurmd pod is gone.

With a Nodeset's `spec.slurmd`, slurmd runs in sunkd's pod, and a node lent to Kubernetes
runs none. Once that pod is gone slurmctld stops hearing from the node: it reports it
NOT_RESPONDING, then DOWN after `SlurmdTimeout` (slurm.conf(5)). Read as any other node
that would be a Slurm-side hold (`ownership.assess`, after `UNHEALTHY_GRACE_SECONDS`) and
a lend that can never finish (`slurmnode.slurm_drained` asks for contact). This module
says, from sunkd's own log only, when out of contact is the expected state:

- **gone**: sunkd's drain is on the node and still shows (its drain mark), nothing is
  allocated or completing, the last slurmd-pod action sunkd took on the node was a delete
  that succeeded, and the Node's pod report (known: unknown is never "gone") shows no
  slurmd pod for the node, terminating ones included. The delete itself waited for Slurm
  to report the node drained, idle and in contact (`policy/slurmd.py`, and the executor
  asked Slurm again), and the job steps ran in the pod's cgroup, so nothing of Slurm's
  runs there once the pod is gone;
- **starting**: the node is moving to Slurm (a reclaim or an adoption) in a pool whose
  Nodeset has `spec.slurmd`, nothing is allocated, and sunkd's pod is not yet created or
  was created less than `REGISTER_BOUND_SECONDS` ago: the new slurmd has not registered
  yet. Past the bound the node is held as any other.

- **absent**: a node of a Nodeset with `registration: Dynamic` is not in Slurm at all
  until its first slurmd registers (`slurmd -Z` creates the node record, slurmd(8)): not
  in Slurm yet, and sunkd has not adopted it or is moving it to Slurm, and its pod is not
  created yet or was created less than `REGISTER_BOUND_SECONDS` ago; or the node is lent
  to Kubernetes, runs no slurmd pod, and its record is gone (an administrator deleted
  the dynamic node, `scontrol delete nodename=`): no record, no slurmd, nothing of
  Slurm's runs there, and the next registration creates the record anew.

A Dynamic node is the Nodeset's only when Slurm reports it **with the Nodeset's feature**
(`--conf Features=<nodeset>`): slurmctld creates the record from the first `-Z`
registration and takes `--conf` only then; a slurmd registering under the name of a node
that already exists (a `NodeName=` line, another Nodeset's dynamic node) joins that record
as it is (`_slurm_rpc_node_registration` in src/slurmctld/proc_req.c, 22.05 to 26.05). A
record of the name without the feature is someone else's node: never registered here.

Slurm 24.11 and later append " : Not responding" to a node's reason when it loses contact
(`set_node_down_ptr` in src/slurmctld/node_mgr.c keeps the old reason and adds the cause):
sunkd's own drain still shows then, but only while the node is out of contact
(`authorship.drain_shows`).

Pure: `now` is an input.
"""

from __future__ import annotations

import math

from sunkd.domain import authorship as marks
from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodesetObserved, PodRef, SlurmdSpec, SlurmNodeObserved
from sunkd.domain.slurmnode import in_contact, registration_refused, slurm_busy
from sunkd.domain.state import OWNER_NONE, ClusterState, NodeState, OpenTransition

VERB_SLURMD_CREATE = "slurmd-create"  # the verbs of policy/slurmd.py (re-exported there)
VERB_SLURMD_DELETE = "slurmd-delete"
VERB_DELETE_NODE = "delete-node"  # slurm side: a defunct Dynamic record (slurmddefunct.py)
CREATE = f"{wk.OWNER_KUBERNETES}/{VERB_SLURMD_CREATE}"
DELETE = f"{wk.OWNER_KUBERNETES}/{VERB_SLURMD_DELETE}"
# A slurmd pod Running this long with Slurm not hearing it is unregistered (no longer
# "starting"); the plan reports it.
REGISTER_BOUND_SECONDS = 120.0
DYNAMIC = "Dynamic"  # spec.slurmd.registration: `slurmd -Z` creates the Slurm node


def nodeset_feature(name: str, spec: SlurmdSpec | None) -> str | None:
    """The Slurm feature a Dynamic Nodeset's slurmd registers its node with: the
    Nodeset's name (`metadata.name`, a DNS label). None for Static registration: the node
    is slurm.conf's, whatever its features."""
    return name if spec is not None and spec.registration == DYNAMIC else None


def observed_feature(nodeset: K8sNodesetObserved) -> str | None:
    """`nodeset_feature` of an observed Nodeset (its pool is `<namespace>/<name>`)."""
    return nodeset_feature(nodeset.pool.partition("/")[2], nodeset.slurmd)


def has_feature(slurm: SlurmNodeObserved | None, feature: str | None) -> bool:
    """Slurm reports the node with `feature` (None: nothing to check). No observation has
    no feature."""
    return feature is None or (slurm is not None and feature in slurm.features)


def dynamic_nodeset(state: ClusterState, node: NodeState) -> K8sNodesetObserved | None:
    """The Nodeset with `registration: Dynamic` the node belongs to: its open
    transition's, else the one Nodeset whose nodeSelector its Kubernetes labels satisfy
    (two or more: none, as `policy.model.membership` says of overlapping pools). None
    when no Nodeset is Dynamic (the common case costs one look at each Nodeset)."""
    if not any(ns.slurmd is not None and ns.slurmd.registration == DYNAMIC
               for ns in state.nodesets.values()):
        return None
    transition = node.transition
    if transition is not None and transition.pool:
        found = slurmd_nodeset(state, transition.pool)
    else:
        k8s = node.k8s
        if k8s is None:
            return None
        labels = {(label.key, label.value) for label in k8s.labels}
        matching = [ns for ns in state.nodesets.values() if not ns.deleted and ns.node_selector
                    and all((s.key, s.value) in labels for s in ns.node_selector)]
        found = matching[0] if len(matching) == 1 else None
    if found is None or found.slurmd is None or found.slurmd.registration != DYNAMIC \
            or not found.uid:
        return None
    return found


def slurmd_nodeset(state: ClusterState, pool: str | None) -> K8sNodesetObserved | None:
    """The pool's Nodeset when it asks for slurmd pods (and sunkd knows its uid)."""
    nodeset = state.nodesets.get(pool) if pool is not None else None
    if nodeset is None or nodeset.deleted or nodeset.slurmd is None or not nodeset.uid:
        return None
    return nodeset


def own_slurmd_pods(node: NodeState, nodeset_uid: str) -> list[PodRef]:
    """sunkd's slurmd pods for the node of the Nodeset `nodeset_uid`, terminating or ended
    ones included (as the source judged them, `PodRef.slurmd`)."""
    return [pod for pod in node.pods or ()
            if nodeset_uid and pod.slurmd == node.name and pod.slurmd_nodeset == nodeset_uid]


def slurmd_deleted(node: NodeState) -> bool:
    """The last slurmd-pod action sunkd took on the node was a delete that succeeded, and
    the Node's pods are known and show no slurmd pod for it (any Nodeset's, any phase)."""
    if node.pods is None or any(pod.slurmd == node.name for pod in node.pods):
        return False
    delete = node.outcomes.get(DELETE)
    if delete is None or not delete.succeeded:
        return False
    create = node.outcomes.get(CREATE)
    return create is None or create.seq < delete.seq


def _ours_still(node: NodeState) -> bool:
    """sunkd's drain is on the node and its mark shows it (or shows it on its way out: a
    poll read before sunkd's own undrain, `authorship.drain_lifting`)."""
    slurm = node.slurm
    mark = node.drain_mark
    return (slurm is not None and "DRAIN" in slurm.flags and mark is not None
            and (marks.drain_shows(mark, slurm) or marks.drain_lifting(mark, slurm)))


def slurmd_gone(node: NodeState) -> bool:
    """Out of contact because sunkd deleted the node's slurmd pod under its own drain
    (module docstring, "gone"): the one case a lend may finish without contact."""
    slurm = node.slurm
    return (slurm is not None and not in_contact(slurm) and not slurm_busy(slurm)
            and _ours_still(node) and slurmd_deleted(node))


def _pod_starting(node: NodeState, transition: OpenTransition, now: float) -> bool:
    """The transition's slurmd pod is not created yet, or was created less than
    `REGISTER_BOUND_SECONDS` ago."""
    create = node.outcomes.get(CREATE)
    created = (create is not None and create.succeeded
               and create.transition_id == transition.transition_id)
    if not created:
        return True  # the plan has not created it yet: the reclaim waits for that
    assert create is not None
    return now - create.at < REGISTER_BOUND_SECONDS


def slurmd_starting(state: ClusterState, node: NodeState, now: float) -> bool:
    """Out of contact because the node's slurmd pod is not there yet or has just been
    created, on its way to Slurm (module docstring, "starting")."""
    slurm = node.slurm
    transition = node.transition
    if (slurm is None or in_contact(slurm) or slurm_busy(slurm) or transition is None
            or transition.to_owner != wk.OWNER_SLURM):
        return False
    nodeset = slurmd_nodeset(state, transition.pool)
    if nodeset is None or node.pods is None:
        return False
    if not has_feature(slurm, observed_feature(nodeset)):
        return False  # a node of that name that is not the Nodeset's: a hold
    if "DRAIN" in slurm.flags and not _ours_still(node):
        return False  # someone else's drain is a hold whatever sunkd's pod does
    return _pod_starting(node, transition, now)


def dynamic_absent(state: ClusterState, node: NodeState, now: float) -> bool:
    """Not in Slurm because the node's Dynamic Nodeset has not registered it yet (module
    docstring, "absent"): sunkd has not adopted the node (no owner, no move: the
    adoption comes first), or is moving it to Slurm and its pod is not created yet or
    was created within the bound, or it is lent and no slurmd pod is on it. A
    Slurm-owned node, or a lend under way, missing in Slurm is a hold as before."""
    if node.slurm is not None or node.pods is None:
        return False
    nodeset = dynamic_nodeset(state, node)
    if nodeset is None:
        return False
    transition = node.transition
    if transition is None:
        if node.owner == wk.OWNER_KUBERNETES:
            return not any(pod.slurmd == node.name for pod in node.pods)
        return node.owner == OWNER_NONE
    return transition.to_owner == wk.OWNER_SLURM and _pod_starting(node, transition, now)


def expected_out_of_contact(state: ClusterState, node: NodeState, now: float) -> bool:
    """Slurm not hearing from the node is what sunkd's slurmd pods make of it: gone, or
    starting within its bound. Never a Slurm hold then."""
    return slurmd_gone(node) or slurmd_starting(state, node, now)


def heard_since(slurm: SlurmNodeObserved | None, started_at: float | None) -> bool:
    """The slurmd Slurm last heard registering started no earlier than the pod's slurmd
    container (`PodRef.started_at`: the runtime's start time on the node, slurmd's own
    clock). slurmctld keeps a node in contact from its previous slurmd until its next ping
    finds it gone (`ping_nodes` in src/slurmctld/ping_nodes.c), so contact alone does not
    say the new pod's slurmd registered. Both times are whole seconds (RFC 3339 in the
    pod's status; `time(NULL)` in slurmd). Unknown either side is not heard."""
    return (slurm is not None and slurm.slurmd_start_time is not None
            and started_at is not None and slurm.slurmd_start_time >= math.floor(started_at))


def slurmd_registered(node: NodeState, nodeset_uid: str, feature: str | None) -> bool:
    """sunkd's slurmd pod runs on the node (Running, not terminating), Slurm's slurmd is
    that pod's (`heard_since`), Slurm reports the node with the Nodeset's `feature` when
    it is Dynamic (module docstring: a node of the name without it is not the Nodeset's)
    and Slurm hears from it: in contact, or registered but
    left DOWN (no NOT_RESPONDING: with ReturnToService=1 slurmctld returns a DOWN node to
    service on registration only when its reason is "Not responding",
    `validate_node_specs` in src/slurmctld/node_mgr.c; a node DOWN under sunkd's drain
    reason stays DOWN). Not when slurmctld refused the registration (INVALID_REG,
    `slurmnode.registration_refused`): it hears slurmd but will neither run jobs there
    nor undrain the node."""
    slurm = node.slurm
    if slurm is None or registration_refused(slurm) or not any(
            pod.phase == "Running" and not pod.deleting and heard_since(slurm, pod.started_at)
            for pod in own_slurmd_pods(node, nodeset_uid)):
        return False
    if not has_feature(slurm, feature):
        return False
    if in_contact(slurm):
        return True
    return slurm.state.upper() == "DOWN" and "NOT_RESPONDING" not in slurm.flags
