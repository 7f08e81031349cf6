"""Which observations cannot change a round that decided nothing (a speed-up, checked).

Most of a trace's events are pods starting and ending on nodes Kubernetes already owns and
jobs starting and ending on nodes Slurm owns. When the last `decide` returned nothing and
no time-based rule came due, such an observation cannot make the next one return anything:

- pods changing on a settled Kubernetes node that had pods and still has pods (it is not
  an idle node, it is not moving, and pod counts only order reclaims, which nothing
  wanted);
- a settled, undrained Slurm node going between IDLE and ALLOCATED while no Slurm job
  waits (idle Slurm nodes only net Slurm demand, and there is none);
- Slurm demand whose pending jobs, nodes and head job did not change (running jobs'
  expected ends only order lends, which nothing wanted);
- any change of pending pods while the pool prefers Slurm, Slurm's demand, net of its
  idle nodes, is positive and Kubernetes' demand cannot win by the starvation bound (it
  has not waited long enough, or holds its fair share: `kubernetes_overrides`): the
  policy then ignores Kubernetes' demand altogether. A pending list turning empty or
  non-empty is never quiet: it stops or starts the pending clock the bound reads.

The bridge then folds the events but skips `decide`. This is knowledge about the policy,
so it is tested, not trusted: tests/unit/test_simulate_bridge.py runs the same workload
with and without the shortcut (`exact=True`) and requires the same decisions (digest)
and figures. If the policy learns to care about one of these, that test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sDemandObserved,
    K8sWorkloadObserved,
    SlurmDemandObserved,
    SlurmNodeObserved,
)
from sunkd.domain.ownership import assess, running_pods, slurm_busy, slurm_usable
from sunkd.domain.policy import PREFER_KUBERNETES, PoolSpec, kubernetes_overrides, membership
from sunkd.domain.state import ClusterState, NodeState, Phase

_SETTLED_SLURM_STATES = frozenset({"IDLE", "ALLOCATED"})


def _settled(node: NodeState | None, phase: Phase) -> bool:
    return (node is not None and node.transition is None and not node.open_actions
            and node.phase == phase and node.pin is None)


def slurm_outweighs(state: ClusterState, pool: PoolSpec, now: float) -> bool:
    """The pool prefers Slurm and Slurm's demand net of its idle nodes is positive (the
    policy's `net_demand`: then Kubernetes' demand counts as zero, whatever it is)."""
    if pool.ownership.prefer == PREFER_KUBERNETES:
        return False
    if pool.name in state.k8s_pending_since:
        members = [state.nodes[name] for name, in_pool in membership(state, [pool]).items()
                   if in_pool == pool.name]
        if kubernetes_overrides(state, pool, members, now) > 0:
            return False
    pending = sum(max(demand.pending_nodes, 0) for partition, demand in
                  state.slurm_demand.items() if partition in pool.partitions)
    if pending == 0:
        return False
    idle = 0
    for node in state.nodes.values():
        slurm = node.slurm  # cheapest tests first: most nodes are busy in such a pool
        if slurm is None or slurm_busy(slurm) or node.owner != wk.OWNER_SLURM:
            continue
        if (node.transition is None and slurm_usable(slurm)
                and not assess(state, node, now).held):
            idle += 1
            if idle >= pending:
                return False
    return True


def quiet(events: Sequence[object], state: ClusterState,
          outweighs: Callable[[], bool]) -> bool:
    """True if folding `events` (RecordedEvents) onto `state` cannot change what `decide`
    answers, given it answered nothing on `state` and no time-based rule came due.
    `outweighs()` is `slurm_outweighs` on `state` (the caller may remember it across
    quiet rounds: none of them changes what it reads)."""
    outweighed: bool | None = None
    for event in events:
        payload = getattr(event, "payload", None)
        if isinstance(payload, K8sWorkloadObserved):
            node = state.nodes.get(state.k8s_names.get(payload.node, payload.node))
            if not _settled(node, Phase.KUBERNETES) or node is None:
                return False
            slurm = node.slurm
            if slurm is None or slurm.state != "IDLE" or slurm.alloc_cpus or not running_pods(node):
                return False
            if not payload.pods or any(pod.phase != "Running" for pod in payload.pods):
                return False
        elif isinstance(payload, SlurmNodeObserved):
            node = state.nodes.get(payload.node)
            if not _settled(node, Phase.SLURM) or node is None or node.slurm is None:
                return False
            old = node.slurm
            if (payload.flags or old.flags or payload.reason != old.reason
                    or payload.partitions != old.partitions
                    or {payload.state, old.state} - _SETTLED_SLURM_STATES
                    or running_pods(node)):
                return False
            if any(demand.pending_nodes or demand.pending_jobs
                   for demand in state.slurm_demand.values()):
                return False
        elif isinstance(payload, K8sDemandObserved):
            if bool(payload.pending) != (payload.pool in state.k8s_pending_since):
                return False
            if outweighed is None:
                outweighed = outweighs()
            if not outweighed:
                return False
        elif isinstance(payload, SlurmDemandObserved):
            old_demand = state.slurm_demand.get(payload.partition)
            if (old_demand is None or old_demand.pending_jobs != payload.pending_jobs
                    or old_demand.pending_nodes != payload.pending_nodes
                    or old_demand.head_nodes != payload.head_nodes
                    or old_demand.head_job != payload.head_job):
                return False
        else:
            return False
    return True
