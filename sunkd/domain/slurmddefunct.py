"""When a Dynamic Slurm node record is defunct, so that sunkd may delete it.

A Dynamic Nodeset's slurmd (`slurmd -Z`) creates its node record in slurmctld on its first
registration (`create_dynamic_reg_node` in src/slurmctld/node_mgr.c), and the record stays
when the pod goes: a host whose Kubernetes Node was deleted, or which the Nodeset no longer
selects, leaves a record DOWN in Slurm for good (counted against `MaxNodeCount`) until
someone deletes it. slurmctld deletes dynamic records only (`delete_nodes` refuses a node
slurm.conf defines: "Invalid node state specified", and one with jobs: "Requested nodes
are busy"; tests/integration/test_slurm_delete_node.py on 24.11 and 26.05).

A record is **defunct**, and sunkd asks to delete it, only when all of this holds (each
unknown counts as not defunct: fail closed):

- **both sources are fresh in this leadership term** (`ClusterState.sources_fresh`): the
  Kubernetes Node list and every Node's pod report are current, as is Slurm's node list;
- **the Nodeset exists**, is `registration: Dynamic`, has a uid and a `nodeSelector`;
- **sunkd's log shows it created a slurmd pod for that Slurm node name under that
  Nodeset** (`ClusterState.slurmd_created`, kept by the fold from the `slurmd-create`
  actions that succeeded, by Nodeset uid, a name dropped once Slurm no longer lists the
  record): a record an operator made with the Nodeset's feature, or made again under a
  name after sunkd's record was deleted, or another Nodeset's, is not proven sunkd's;
- **Slurm reports it a Dynamic record of that Nodeset**: `DYNAMIC_NORM` and the Nodeset's
  feature (a node of the name slurm.conf defines has neither: a slurmd joining it keeps
  its `NodeName=` line, `_slurm_rpc_node_registration` in src/slurmctld/proc_req.c);
- **Slurm no longer hears it and nothing runs there**: DOWN and NOT_RESPONDING (the slurmd
  missed `SlurmdTimeout`), not ALLOCATED, MIXED or COMPLETING, no CPUs allocated, no job
  counted on it; no reason but slurmctld's own (`Not responding`) or one in sunkd's
  format (its lend's drain, which 24.11+ extend with " : Not responding"): a reason
  someone else wrote is their word on the record, never deleted over;
- **no slurmd pod exists for it**: no pod report of any Node shows a slurmd pod for the
  name (any Nodeset's, terminating or ended ones included), and when its Node is there,
  that Node's pods are known;
- **its Kubernetes Node is gone** (no Node claims the name: the source, fresh, lists
  every Node) **or no longer selected** by the Nodeset's `nodeSelector`; no identity
  rival claims the name;
- nothing is open on the node: no transition, no action on the Slurm side.

The executor asks Slurm again right before the delete (nodes and jobs: no job running on
it or requiring it, `runtime/executor.py`), and the Slurm actuator reads the node once
more (`SlurmActuator.delete_node`). On 22.05 (REST v0.0.38, no node delete) the actuator
refuses with the `scontrol delete nodename=` line; the gauge
`sunkd_slurm_defunct_dynamic_nodes{nodeset}` counts what this module finds either way.

Left open: a slurmd pod bound to a Node that was deleted is in no Node's pod report (the
source reports existing Nodes); its slurmd, if it still ran, would keep the record in
contact (not NOT_RESPONDING), and if it registers after the delete it creates the record
anew (`slurmd -Z`).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from sunkd.domain.events import K8sNodesetObserved, SlurmNodeObserved
from sunkd.domain.ownership import is_ours
from sunkd.domain.slurmdgone import DYNAMIC, observed_feature
from sunkd.domain.slurmnode import slurm_busy
from sunkd.domain.state import ClusterState, NodeState

DYNAMIC_FLAG = "DYNAMIC_NORM"  # slurmctld's flag on every dynamic record, for life
# slurmctld's own reason when it stops hearing a node (`set_node_down_ptr` in
# src/slurmctld/node_mgr.c; 24.11+ append it to a drained node's reason after " : ").
NOT_RESPONDING_REASON = "Not responding"


@dataclass(frozen=True, slots=True)
class DefunctRecord:
    """A Dynamic record sunkd may delete: the Slurm node, its Nodeset (pool
    `<namespace>/<name>` and uid) and the feature it carries."""

    node: str
    pool: str
    nodeset_uid: str
    feature: str
    why: str  # the evidence, for the action's reason and the log


def node_of(state: ClusterState, name: str) -> NodeState | None:
    """The node of that name, in a pool or not (a record whose Node left every pool)."""
    node = state.nodes.get(name)
    if node is not None:
        return node
    record = state.unpooled.get(name)
    return record.expand(name) if record is not None else None


def _someone_elses_reason(slurm: SlurmNodeObserved) -> bool:
    reason = (slurm.reason or "").strip()
    return bool(reason) and reason != NOT_RESPONDING_REASON and not is_ours(reason)


def _selected(nodeset: K8sNodesetObserved, node: NodeState) -> bool:
    k8s = node.k8s
    assert k8s is not None
    labels = {(label.key, label.value) for label in k8s.labels}
    return all((s.key, s.value) in labels for s in nodeset.node_selector)


def slurm_problem(slurm: SlurmNodeObserved | None, feature: str | None) -> str:
    """Why Slurm's word on a node says it is not a defunct Dynamic record of the Nodeset
    whose feature is `feature` ("": it is). The policy asks this of the folded state; the
    executor and the Slurm actuator ask it again of what Slurm answers right before."""
    if slurm is None:
        return "not in Slurm"
    if feature is None or DYNAMIC_FLAG not in slurm.flags or feature not in slurm.features:
        return f"not a Dynamic record with feature {feature}"
    if slurm.state.upper() != "DOWN" or "NOT_RESPONDING" not in slurm.flags:
        return "Slurm still hears it (not DOWN+NOT_RESPONDING)"
    if slurm_busy(slurm) or slurm.jobs > 0:
        return "a job is allocated or completing there"
    if _someone_elses_reason(slurm):
        return f"its reason is someone else's ({slurm.reason!r})"
    return ""


def record_problem(state: ClusterState, nodeset: K8sNodesetObserved, node: NodeState,
                   slurmd_pod_names: frozenset[str]) -> str:
    """Why `node`'s record is not a defunct record of `nodeset` ("": it is). The caller
    has checked the sources and that sunkd created a pod for the name under `nodeset`."""
    why = slurm_problem(node.slurm, observed_feature(nodeset))
    if why:
        return why
    if node.name in slurmd_pod_names:
        return "a slurmd pod for it exists"
    if node.k8s_rivals:
        return "two Kubernetes Nodes claim it"
    if node.k8s is not None:
        if node.pods is None:
            return "its Node's pods are unknown"
        if _selected(nodeset, node):
            return "its Node is still selected by the Nodeset"
    if node.transition is not None:
        return "a move is open on it"
    return ""


def slurmd_pod_names(state: ClusterState) -> frozenset[str]:
    """Every Slurm node name some Node's pod report shows a slurmd pod for (any Nodeset's,
    any phase)."""
    return frozenset(pod.slurmd for pods in state.pod_reports.values() for pod in pods
                     if pod.slurmd)


def defunct_records(state: ClusterState) -> list[DefunctRecord]:
    """The defunct Dynamic records sunkd may delete (module docstring), by Nodeset then
    node. None while a source is not fresh in this term."""
    if not state.sources_fresh() or not state.slurmd_created:
        return []
    pods: frozenset[str] | None = None  # every pod report read only when a record may be
    found: list[DefunctRecord] = []
    for pool in sorted(state.nodesets):
        nodeset = state.nodesets[pool]
        if (nodeset.deleted or not nodeset.uid or nodeset.slurmd is None
                or nodeset.slurmd.registration != DYNAMIC or not nodeset.node_selector):
            continue
        feature = observed_feature(nodeset)
        assert feature is not None
        for name in sorted(state.slurmd_created.get(nodeset.uid, ())):
            node = node_of(state, name)
            if node is None or record_problem(state, nodeset, node, frozenset()):
                continue
            if pods is None:
                pods = slurmd_pod_names(state)
            if name in pods:
                continue
            assert node.slurm is not None
            gone = ("its Kubernetes Node is gone" if node.k8s is None
                    else f"Node {node.k8s_name} no longer selected by {pool}")
            found.append(DefunctRecord(
                node=name, pool=pool, nodeset_uid=nodeset.uid, feature=feature,
                why=f"Dynamic record {name} of Nodeset {pool} (sunkd created its slurmd "
                    f"pod) is {node.slurm.state}+NOT_RESPONDING with nothing allocated, "
                    f"no slurmd pod for it, {gone}"))
    return found
