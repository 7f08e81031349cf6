"""Fairness between the two sides: `prefer` decides contested nodes, but never starves.

`prefer` says which side wins when both have unmet demand. Read literally it let a
permanent Slurm backlog take the whole pool from Kubernetes (pending pods never placed),
and it let Slurm's demand evict running pods under `prefer: Kubernetes`, whose
replacements were pending demand that lent a node straight back (hundreds of moves a
day). The bounds below need no new knob:

- **Slurm's claim is its next job, not its whole queue.** A backlog can use every node,
  but what Slurm cannot do without is the nodes the job it schedules next needs
  (`head_nodes`: the widest job pending with reason `Resources`). Under `prefer:
  Kubernetes` Slurm's demand evicts running pool pods only for a head job past the
  reservation bound (below); under `prefer: Slurm` it evicts for any pending job except
  while Kubernetes is starved (its pods waited past the starvation bound and it holds at
  most its fair share), when it evicts only while Slurm holds fewer nodes than its
  claim. Otherwise it reclaims only Kubernetes nodes running no pool pods. Where the head job
  is not reported (`head_nodes` 0, an older source), the claim is every pending node,
  which is the literal `prefer: Slurm`.
- **Starvation bound.** When Kubernetes' pods have been pending without a break for
  `KUBERNETES_WAIT_BOUND_SECONDS` while it holds less than its fair share of the pool
  (half its members, `FAIR_SHARE`), Kubernetes' demand wins contested nodes against
  `prefer: Slurm`, up to that share and never below Slurm's claim. Above its share
  `prefer: Slurm` holds as before.
- **Damped starvation (hysteresis).** Once Kubernetes' pods stop waiting after a
  starvation (they waited past the bound), Kubernetes still counts as starved for
  `STARVATION_HOLD_SECONDS`. While Kubernetes is starved (now or within the hold) and
  holds at most its fair share, Slurm's demand under `prefer: Slurm` takes back no node
  beyond what its next job lacks, idle or running pods. Without it the nodes the starved
  pods won were reclaimed by eviction as soon as the pods ran (or as soon as one sat
  idle between two pods), the next pods starved again, and the pool churned (555 moves
  a day in `sunkd simulate --scenario diurnal+backlog`; measured on 2 days of it at 211
  nodes: 631 moves a day, 296 with the hold on running pods only, 222 with idle nodes
  held too, which also cut the pod p95 from 94 s to 79 s for 1 % less batch work).
- **Reservation bound.** Under `prefer: Kubernetes`, once the partition has had jobs
  waiting for nodes for `SLURM_HEAD_WAIT_BOUND_SECONDS` without a break (since a head
  job was first reported; whichever job is head now, `ClusterState.slurm_head_since`),
  Slurm's demand wins contested nodes (lending stops) and may evict pool pods until
  Slurm holds the nodes its current head job needs: a wide job no longer waits for pods
  to happen to leave enough nodes, and heads that change more often than the bound (one
  wide job after another) do not restart the wait.

The floors (`min_slurm`), `max_kubernetes`, pins and pool mode still move whatever they
must: those are the operator's orders, not demand. Everything here is a pure function of
the state and `now` (the pending clocks are folded from `k8s.demand.observed` and
`slurm.demand.observed` times, `ClusterState.k8s_pending_since` and `slurm_head_since`),
so decisions stay deterministic and replayable, and
nothing bypasses dwell, max_in_flight or holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.model import PREFER_KUBERNETES, PoolSpec
from sunkd.domain.state import STARVATION_BOUND_SECONDS, ClusterState, NodeState

# How long Kubernetes' pods may wait, without a break, before its demand wins contested
# nodes against `prefer: Slurm` (below its fair share, beyond Slurm's next job). Longer
# than a watch or scheduling lag (seconds), so a pod about to bind never flips the
# preference; inside the minute pods are commonly expected to wait (the simulator's
# pod-pending target is 60 s at p95). Measured: 120 s gave a p95 of 7 min with a Slurm
# backlog (each burst of pods waits the bound, then a drain).
KUBERNETES_WAIT_BOUND_SECONDS = STARVATION_BOUND_SECONDS
# How long a starvation that ended still protects Kubernetes' running pods from Slurm's
# demand under `prefer: Slurm` (beyond Slurm's next job). Longer than a pod's replacement
# takes to wait past the bound again (evict, pending, 30 s: the churn it damps); short
# next to a day, so a trough gives the nodes back the ordinary way (no pods, no
# eviction) and a backlog's evictions resume an hour after the last starvation.
STARVATION_HOLD_SECONDS = 3600.0
# How long a partition's jobs may wait for nodes, without a break and whichever job is
# at the head, under `prefer: Kubernetes` before the reservation starts: lending stops
# and Slurm's demand may evict pool pods until Slurm holds the nodes its head job needs.
# Wide jobs come in runs, each waiting for the one before, and a reservation of dozens
# of nodes takes hours (each reclaim waits `reclaim_grace`), so the bound must be short
# next to a day-long starvation cap. Measured while the clock still restarted with each
# head job (`sunkd simulate --knobs prefer=Kubernetes --nodes 179 --split 128,51`):
# jobs over 24 h: 63 without a reservation, 54 with 6 h, 0 with 3 h or 1 h (3 h: fewer
# evictions). Its price is paid where Slurm has a backlog, whose heads wait long
# anyway: a Slurm-backlogged diurnal pool under `prefer: Kubernetes` then misses its
# pod target (p95 104 s with 3 h, 110 s with 1 h, 0 s with 6 h; target 60 s).
SLURM_HEAD_WAIT_BOUND_SECONDS = 3 * 3600.0
# The share of a pool's members the non-preferred side may claim while its demand waits
# (max-min fairness between two equal claimants; `prefer` wins above it).
FAIR_SHARE = 0.5


def fair_share(members: int) -> int:
    """Nodes of a pool of `members` the non-preferred side may claim while it waits."""
    return int(members * FAIR_SHARE)


def holdings(members: Sequence[NodeState], *, moving_counts_for: str) -> tuple[int, int]:
    """(Kubernetes, Slurm): members each side owns; a member in a move counts for the
    side it goes to (`to`) or the side it leaves (`from`)."""
    k8s = slurm = 0
    for node in members:
        transition = node.transition
        if transition is None:
            owner = node.owner
        elif moving_counts_for == "to":
            owner = transition.to_owner
        else:
            owner = transition.from_owner
        k8s += owner == wk.OWNER_KUBERNETES
        slurm += owner == wk.OWNER_SLURM
    return k8s, slurm


def slurm_claim(state: ClusterState, pool: PoolSpec) -> int:
    """Nodes Slurm needs for the jobs it schedules next in the pool's partitions: each
    partition's head job, or all its pending nodes where the head is not reported."""
    claim = 0
    for partition in pool.partitions:
        demand = state.slurm_demand.get(partition)
        if demand is None or demand.pending_nodes <= 0:
            continue
        claim += demand.head_nodes if demand.head_nodes > 0 else demand.pending_nodes
    return claim


def kubernetes_pending_for(state: ClusterState, pool: PoolSpec, now: float) -> float | None:
    """Seconds Kubernetes' pods have been pending without a break (None: none pending)."""
    since = state.k8s_pending_since.get(pool.name)
    return None if since is None else max(now - since, 0.0)


def kubernetes_overrides(
    state: ClusterState, pool: PoolSpec, members: Sequence[NodeState], now: float
) -> int:
    """Under `prefer: Slurm`: how many contested nodes Kubernetes' demand may still win
    because its pods waited past the bound (0: `prefer` decides)."""
    if pool.ownership.prefer == PREFER_KUBERNETES:
        return 0
    waited = kubernetes_pending_for(state, pool, now)
    if waited is None or waited < KUBERNETES_WAIT_BOUND_SECONDS:
        return 0
    # Lends in flight are what Kubernetes already won: they count as Slurm's until they
    # complete, or each would make itself surplus (and be aborted) the round after.
    k8s, slurm = holdings(members, moving_counts_for="from")
    spare = slurm - slurm_claim(state, pool)
    return max(min(fair_share(len(members)) - k8s, spare), 0)


def kubernetes_starved(state: ClusterState, pool: PoolSpec, now: float) -> bool:
    """Kubernetes' pods wait past the starvation bound now, or did in a run of pending
    that ended less than `STARVATION_HOLD_SECONDS` ago (the hysteresis)."""
    waited = kubernetes_pending_for(state, pool, now)
    if waited is not None and waited >= KUBERNETES_WAIT_BOUND_SECONDS:
        return True
    return starvation_held_until(state, pool) > now


def starvation_held_until(state: ClusterState, pool: PoolSpec) -> float:
    """Until when the last starvation that ended still counts (-inf: none did)."""
    last = state.k8s_pending_last.get(pool.name)
    if last is None:
        return -math.inf
    return last[1] + STARVATION_HOLD_SECONDS


def slurm_head_waited(state: ClusterState, pool: PoolSpec, now: float) -> bool:
    """One of the pool's partitions has had jobs waiting for nodes past the bound, and
    reports a head job now (the reservation is for the nodes that job needs)."""
    for partition in pool.partitions:
        since = state.slurm_head_since.get(partition)
        demand = state.slurm_demand.get(partition)
        if (since is not None and demand is not None and demand.head_job > 0
                and now - since >= SLURM_HEAD_WAIT_BOUND_SECONDS):
            return True
    return False


def slurm_reserves(
    state: ClusterState, pool: PoolSpec, members: Sequence[NodeState], now: float
) -> int:
    """Under `prefer: Kubernetes`: how many contested nodes Slurm's demand wins because
    its head job waited past the bound (its reservation; 0: `prefer` decides)."""
    if pool.ownership.prefer != PREFER_KUBERNETES or not slurm_head_waited(state, pool, now):
        return 0
    # Reclaims in flight count as Kubernetes' until they complete (they are what the
    # reservation already asked for: `reclaim_more` subtracts them).
    _k8s, slurm = holdings(members, moving_counts_for="from")
    return max(slurm_claim(state, pool) - slurm, 0)


def protect_running_pods(
    state: ClusterState, pool: PoolSpec, members: Sequence[NodeState], now: float
) -> bool:
    """True if Slurm's demand may reclaim only members running no pool pods (`prefer:
    Kubernetes`), or none at all (`prefer: Slurm`, Kubernetes starved: the hysteresis)."""
    # A reclaim in flight already serves Slurm's next job: no second eviction for it.
    k8s, slurm = holdings(members, moving_counts_for="to")
    short = slurm < slurm_claim(state, pool)
    if pool.ownership.prefer == PREFER_KUBERNETES:
        return not (short and slurm_head_waited(state, pool, now))
    # prefer: Slurm evicts for any pending job (what the knob says, and what an operator
    # expects), except while Kubernetes is starved: its pods waited past the bound (now,
    # or within the hold: the hysteresis) and it holds at most its fair share. Then Slurm
    # takes only nodes running no pool pods.
    starving = kubernetes_starved(state, pool, now)
    return starving and not short and k8s <= fair_share(len(members))
