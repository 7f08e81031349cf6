"""Supply and demand of a pool: what it has (the census) and what each side needs.

The census assesses and counts the pool's members at the start of the round. Demand
is read from the observations in the state (`slurm_demand` per partition, `k8s_demand`
per pool), net of idle nodes already covering it, and raised to the pool's floors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sunkd.domain import wellknown as wk
from sunkd.domain.codec import legacy_node_job_ends
from sunkd.domain.forecast import HOUR
from sunkd.domain.ownership import (
    Assessment,
    assess,
    no_pods,
    slurm_busy,
    slurm_usable,
    sources_unknown,
)
from sunkd.domain.policy.ahead import ahead, forecast_surplus
from sunkd.domain.policy.blocks import RETURN, TROUGH, BlockNow, block_now, return_lead
from sunkd.domain.policy.fairness import (
    fair_share,
    holdings,
    kubernetes_overrides,
    slurm_claim,
    slurm_reserves,
)
from sunkd.domain.policy.model import PREFER_KUBERNETES, PoolSpec
from sunkd.domain.policy.planner import Planner
from sunkd.domain.state import ClusterState, NodeState


@dataclass(frozen=True, slots=True)
class Census:
    """The pool's members at the start of the round, assessed and counted."""

    members: list[NodeState]
    assessments: dict[str, Assessment]
    lends: list[NodeState]  # members in an open lend
    reclaims: list[NodeState]  # members in an open reclaim
    owned_k8s: int  # members settled with Kubernetes
    owned_slurm: int  # members settled with Slurm
    now: float = 0.0  # the round's time (fairness reads how long demand has waited)


@dataclass(frozen=True, slots=True)
class PoolDemand:
    """Nodes each side still needs (net of idle ones), and the targets with the floors."""

    k8s_needed: int
    slurm_needed: int
    lend_target: int
    reclaim_target: int
    ahead_why: str | None = None  # the forecast set lend_target (policy/ahead.py)
    ahead_by: float | None = None  # then: lend only nodes whose jobs end by this time
    ahead_extra: int = 0  # for those lends beyond what pending pods ask for
    block_why: str | None = None  # the trough's block sets reclaim_target (policy/blocks.py)
    # The block's return runs (policy/blocks.py): its lends in flight are not surplus.
    block_returning: bool = False


# Each node's last assessment with the NodeState and the sources' verdict it read.
# `assess` reads nothing else but `now`, and `now` only for a node Slurm reports
# unhealthy (the grace): such assessments are never kept. The fold is copy-on-write, so a
# node no event touched keeps its identity, and most rounds re-assess a few nodes of a
# large pool. At most one entry per node name (a bound for pathological callers below).
_ASSESSED: dict[str, tuple[NodeState, tuple[str, ...], Assessment]] = {}
_ASSESSED_MAX = 200_000


def _assess(state: ClusterState, node: NodeState, now: float,
            sources: tuple[str, ...]) -> Assessment:
    """`assess(state, node, now, sources)`, remembered while node and sources stay."""
    kept = _ASSESSED.get(node.name)
    if kept is not None and kept[0] is node and kept[1] == sources:
        return kept[2]
    assessment = assess(state, node, now, sources)
    if assessment.slurm_unhealthy:
        _ASSESSED.pop(node.name, None)
    else:
        if len(_ASSESSED) >= _ASSESSED_MAX:
            _ASSESSED.clear()
        _ASSESSED[node.name] = (node, sources, assessment)
    return assessment


def take_census(planner: Planner, members: list[NodeState]) -> Census:
    """Assess every member; count the pool's open moves and its settled owners."""
    state = planner.state
    now = planner.now
    sources = sources_unknown(state)
    assessments = {node.name: _assess(state, node, now, sources) for node in members}

    lends = [n for n in members if n.transition is not None and n.transition.direction == "lend"]
    reclaims = [
        n for n in members if n.transition is not None and n.transition.direction == "reclaim"
    ]
    owned_k8s = sum(1 for n in members if n.transition is None and n.owner == wk.OWNER_KUBERNETES)
    owned_slurm = sum(1 for n in members if n.transition is None and n.owner == wk.OWNER_SLURM)
    return Census(members, assessments, lends, reclaims, owned_k8s, owned_slurm, now)


def net_demand(state: ClusterState, pool: PoolSpec, census: Census) -> PoolDemand:
    """Nodes each side's pending work needs beyond its idle nodes (when both sides ask,
    `prefer` decides which), and the move targets once the floors are added."""
    spec = pool.ownership
    members = census.members
    assessments = census.assessments
    # Demand already covered by a node of that side that sits idle (the pods or jobs
    # will land there: the scheduler simply has not run since the node arrived) must
    # not move another node; otherwise every poll/watch lag over-lends or over-reclaims.
    idle_k8s = sum(
        1 for n in members
        if n.transition is None and n.owner == wk.OWNER_KUBERNETES
        and not assessments[n.name].held and no_pods(n)
    )
    idle_slurm = sum(
        1 for n in members
        if n.transition is None and n.owner == wk.OWNER_SLURM and not assessments[n.name].held
        and n.slurm is not None and slurm_usable(n.slurm) and not slurm_busy(n.slurm)
    )
    k8s_needed = max(_k8s_nodes_needed(state, pool, members) - idle_k8s, 0)
    slurm_needed = max(_slurm_nodes_needed(state, pool) - idle_slurm, 0)
    contested = k8s_needed > 0 and slurm_needed > 0
    if contested and spec.prefer == PREFER_KUBERNETES:
        # prefer: Kubernetes, unless Slurm's head job waited past the reservation bound:
        # then Slurm wins until it holds what that job needs (policy/fairness.py).
        reserve = slurm_reserves(state, pool, members, census.now)
        if reserve > 0:
            k8s_needed, slurm_needed = 0, min(slurm_needed, reserve)
        else:
            slurm_needed = 0
    elif contested:
        # prefer: Slurm, unless Kubernetes' pods waited past the starvation bound below
        # its fair share and Slurm holds more than its next job needs: then Kubernetes
        # wins up to that share (policy/fairness.py).
        override = kubernetes_overrides(state, pool, members, census.now)
        if override > 0:
            k8s_needed, slurm_needed = min(k8s_needed, override), 0
        else:
            k8s_needed = 0

    block = block_now(state.demand_history.get(pool.name), spec, census.now) \
        if spec.forecast else None
    if block is not None and block.phase == TROUGH and k8s_needed > 0:
        # Damped in the trough: pods pending within the forecast's error bound above the
        # block's keep wait for Kubernetes' own nodes (policy/blocks.py).
        held, _slurm = holdings(members, moving_counts_for="to")
        if held >= block.block.keep and held + k8s_needed <= block.block.keep + block.slack:
            k8s_needed = 0

    lend_target = max(k8s_needed, spec.min_kubernetes - census.owned_k8s)
    ahead_why: str | None = None
    ahead_by: float | None = None
    ahead_extra = 0
    block_why: str | None = None
    if block is not None:
        lend_target, slurm_needed, ahead_why, ahead_by, ahead_extra, block_why = _block_demand(
            state, pool, members, block, lend_target, slurm_needed, census.now)
    elif spec.forecast:
        # Headroom ahead of the forecast peak (policy/ahead.py): lend what the hours
        # within the lead time want, and keep what the hours within the horizon want
        # from Slurm's demand beyond its next job (the recent-peak hold).
        wanted = ahead(state, pool, members, census.now)
        if wanted is not None and wanted.target > lend_target:
            ahead_extra = wanted.target - lend_target
            lend_target, ahead_why, ahead_by = wanted.target, wanted.why, wanted.by
        surplus = 0 if ahead_why is not None else \
            forecast_surplus(state, pool, members, census.now) if slurm_needed > 0 else None
        if surplus is not None and slurm_needed > 0:
            _k8s, slurm = holdings(members, moving_counts_for="to")
            slurm_needed = min(slurm_needed,
                               max(slurm_claim(state, pool) - slurm, surplus))
    reclaim_target = max(slurm_needed, spec.min_slurm - census.owned_slurm)
    return PoolDemand(k8s_needed, slurm_needed, lend_target, reclaim_target, ahead_why,
                      ahead_by, ahead_extra, block_why,
                      block is not None and block.phase == RETURN)


def _block_demand(
    state: ClusterState, pool: PoolSpec, members: list[NodeState], block: BlockNow,
    lend_target: int, slurm_needed: int, now: float,
) -> tuple[int, int, str | None, float | None, int, str | None]:
    """The block's targets (policy/blocks.py). In the trough Slurm's demand takes back,
    beyond its next job, what Kubernetes holds above the block's keep. From `returns_at`
    and all day the pool lends up to the day's level (within the bounds a lend ahead
    obeys, only nodes drained within the hour after the window's end, or after now in
    the day) and Slurm's demand takes back only what its next job lacks: what
    Kubernetes won in the day it keeps until the next trough. Returns lend_target,
    slurm_needed, the lend ahead's why, by and extra, and the trough's reclaim why."""
    spec = pool.ownership
    claim = slurm_claim(state, pool)
    k8s, slurm = holdings(members, moving_counts_for="to")
    if block.phase == TROUGH:
        surplus = max(k8s - block.block.keep, 0)
        block_why: str | None = None
        if slurm_needed > 0:
            slurm_needed = min(slurm_needed, max(claim - slurm, surplus))
            if surplus > claim - slurm:
                block_why = block.trough_why(surplus)
        return lend_target, slurm_needed, None, None, 0, block_why
    if slurm_needed > 0:
        slurm_needed = min(slurm_needed, max(claim - slurm, 0))
    # Lends in flight count as Slurm's, as for a lend ahead (policy/ahead.py).
    k8s_from, slurm_from = holdings(members, moving_counts_for="from")
    room = slurm_from - claim
    if spec.prefer != PREFER_KUBERNETES:
        room = min(room, fair_share(len(members)) - k8s_from)
    target = min(block.block.level - k8s_from, room)
    if target <= lend_target:
        return lend_target, slurm_needed, None, None, 0, None
    if block.phase == RETURN:
        summary = state.demand_history[pool.name]
        why = block.return_why(target, return_lead(summary, spec, block.block))
        by = block.ends + HOUR
    else:
        why, by = block.day_why(target), now + HOUR
    return target, slurm_needed, why, by, target - lend_target, None


def _slurm_nodes_needed(state: ClusterState, pool: PoolSpec) -> int:
    total = 0
    for partition in pool.partitions:
        demand = state.slurm_demand.get(partition)
        if demand is not None:
            total += max(demand.pending_nodes, 0)
    return total


def _k8s_nodes_needed(state: ClusterState, pool: PoolSpec, members: list[NodeState]) -> int:
    """Nodes the pending pool pods need: packed by requests against the smallest pool
    node's allocatable (conservative), one node per pod when requests are unknown, and
    never more nodes than pods."""
    demand = state.k8s_demand.get(pool.name)
    if demand is None or not demand.pending:
        return 0
    # The source reports a pod's binding (workload) and the pool's pending list as
    # separate observations; a pod already seen on a node is not demand any more, even
    # if the pending list that still names it has not been re-observed yet.
    bound = {(pod.namespace, pod.name) for member in members for pod in member.pods or ()}
    pods = tuple(pod for pod in demand.pending if (pod.namespace, pod.name) not in bound)
    if not pods:
        return 0
    sizes = [m.k8s for m in members if m.k8s is not None]
    if any(k.unparsed for k in sizes):
        return len(pods)  # a member's capacity is unknown: no packing by a made-up number
    requests = (
        sum(max(pod.cpu_millis, 0) for pod in pods),
        sum(max(pod.memory_bytes, 0) for pod in pods),
        sum(max(pod.gpus, 0) for pod in pods),
    )
    capacities = (
        [k.cpu_millis for k in sizes if k.cpu_millis > 0],
        [k.memory_bytes for k in sizes if k.memory_bytes > 0],
        [k.gpus for k in sizes if k.gpus > 0],
    )
    needed = 0
    for total, capacity in zip(requests, capacities, strict=True):
        if total > 0 and capacity:
            needed = max(needed, math.ceil(total / min(capacity)))
    if needed == 0:
        return len(pods)
    return min(len(pods), needed)


class _JobEnds(Mapping[str, float]):
    """Node name -> when its running jobs are expected to end (inf: unlimited/unknown),
    for the nodes running jobs. Read per node from its `slurm.node.observed` (`jobs`,
    `job_end`), lazily: the policy looks up only the lend candidates. Old logs carried
    the ends in the pool's partitions' `slurm.demand.observed` (`node_job_ends`); those
    still count, exactly as they did (the latest end wins), until a current demand
    event of the partition replaces them."""

    __slots__ = ("_legacy", "_nodes")

    def __init__(self, state: ClusterState, pool: PoolSpec) -> None:
        self._nodes = state.nodes
        legacy: dict[str, float] = {}
        for partition in pool.partitions:
            demand = state.slurm_demand.get(partition)
            if demand is None:
                continue
            for job_end in legacy_node_job_ends(demand):
                end = math.inf if job_end.expected_end is None else job_end.expected_end
                legacy[job_end.node] = max(legacy.get(job_end.node, -math.inf), end)
        self._legacy = legacy

    def __getitem__(self, name: str) -> float:
        end = self._legacy.get(name)
        node = self._nodes.get(name)
        slurm = node.slurm if node is not None else None
        if slurm is not None and slurm.jobs > 0:
            own = math.inf if slurm.job_end is None else slurm.job_end
            end = own if end is None else max(end, own)
        if end is None:
            raise KeyError(name)
        return end

    def __iter__(self) -> Iterator[str]:
        names = set(self._legacy)
        names.update(name for name, node in self._nodes.items()
                     if node.slurm is not None and node.slurm.jobs > 0)
        return iter(sorted(names))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def job_ends(state: ClusterState, pool: PoolSpec) -> Mapping[str, float]:
    return _JobEnds(state, pool)
