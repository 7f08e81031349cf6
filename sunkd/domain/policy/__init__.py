"""The policy: which nodes should move, and what to do next for each node.

`decide(state, pools, now)` is a pure, deterministic function (architecture section
5). It never performs anything: it returns `Decision`s, which the daemon turns 1:1
into events (`decision_to_event`) and appends; the outbox then executes the actions
and appends their outcomes, and the next `decide` call sees them through the fold.
Because ids derive from `state.last_seq`, replaying the log reproduces the same
decisions, and calling `decide` twice on the same state proposes the same thing.

Every decision carries a human-readable `reason`: the audit trail explains itself.

Safety rules enforced here (and checked by the property tests):
- a node is handed to Kubernetes (`unlock`, lend completion) only when Slurm reports
  it drained (`ownership.slurm_drained`);
- nothing at all is decided for a node while a source is not fresh or the node has not
  been observed on both sides (`Assessment.actionable`);
- `resume` is requested only for a drain whose reason starts with `sunkd:`,
  a release only removes sunkd's own hold taint (`sunkd.io/slurm-hold`), never a cordon;
- at most one open action per node and side; a failed action is retried only after a
  backoff (retryable) or after a long pause (not retryable, outside a transition);
  inside a transition a non-retryable failure aborts the transition.

The package is split by concern (each module says why it exists):
- `model`: pools and membership, the decision types, verbs/modes, retry backoff;
- `planner`: `Planner`, the round's decisions and ids, and `ensure` (retry, backoff);
- `demand`: nodes each side's pending work needs, Slurm job end times;
- `lend`, `reclaim`: the two directions of a move, step by step;
- `ahead`: headroom ahead of the forecast peak (lends the pool's forecast justifies);
- `fairness`: `prefer` decides contested nodes, within a starvation bound and no
  preemption of waiting or preferred work;
- `transitions`: driving an open transition (or aborting it), adoption, and which
  queued actions an ended transition leaves stale (`stale_action`);
- `holds`: mirroring each side's holds to the other; `repair`: undoing tampering;
- `pool`: one pool's round, as a sequence of named steps;
- `defunct`: deleting defunct Dynamic Slurm records (`domain/slurmddefunct.py`).
Other code imports only from `sunkd.domain.policy` (this module).
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.ahead import forecast_wanted, lead_seconds
from sunkd.domain.policy.defunct import delete_defunct
from sunkd.domain.policy.fairness import (
    FAIR_SHARE,
    KUBERNETES_WAIT_BOUND_SECONDS,
    SLURM_HEAD_WAIT_BOUND_SECONDS,
    STARVATION_HOLD_SECONDS,
    kubernetes_overrides,
    kubernetes_starved,
    protect_running_pods,
    slurm_reserves,
    starvation_held_until,
)
from sunkd.domain.policy.holds import release_marks, unpooled_marks
from sunkd.domain.policy.model import (
    FORGET_AFTER_SECONDS,
    MODE_AUTO,
    MODE_KUBERNETES,
    MODE_SLURM,
    OBSERVATION_CATCHUP_SECONDS,
    PREFER_KUBERNETES,
    REFUSED_RETRY_SECONDS,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    RETURN_TO_SERVICE_ARG,
    SLURMD_GONE_ARG,
    SLURMD_REPAIR_ARG,
    VERB_DRAIN,
    VERB_EVICT,
    VERB_HOLD,
    VERB_LOCK,
    VERB_RELEASE,
    VERB_RESUME,
    VERB_UNLOCK,
    VERB_WARN,
    AbortTransition,
    CompleteTransition,
    Decision,
    ForgetNode,
    PoolSpec,
    RequestAction,
    StartTransition,
    decision_to_event,
    effective_pools,
    lend_reason,
    membership,
    membership_and_overlaps,
    pool_from_nodeset,
    pool_overlaps,
    retry_backoff,
)
from sunkd.domain.policy.planner import Planner
from sunkd.domain.policy.pool import plan_pool
from sunkd.domain.policy.reclaim import reclaim_grace_started_at
from sunkd.domain.policy.repair import report_overlap
from sunkd.domain.policy.transitions import stale_action
from sunkd.domain.state import ClusterState, NodeState

__all__ = [
    "FAIR_SHARE",
    "FORGET_AFTER_SECONDS",
    "KUBERNETES_WAIT_BOUND_SECONDS",
    "MODE_AUTO",
    "MODE_KUBERNETES",
    "MODE_SLURM",
    "OBSERVATION_CATCHUP_SECONDS",
    "PREFER_KUBERNETES",
    "REFUSED_RETRY_SECONDS",
    "RETRY_BASE_SECONDS",
    "RETRY_MAX_SECONDS",
    "RETURN_TO_SERVICE_ARG",
    "SLURMD_GONE_ARG",
    "SLURMD_REPAIR_ARG",
    "SLURM_HEAD_WAIT_BOUND_SECONDS",
    "STARVATION_HOLD_SECONDS",
    "VERB_DRAIN",
    "VERB_EVICT",
    "VERB_HOLD",
    "VERB_LOCK",
    "VERB_RELEASE",
    "VERB_RESUME",
    "VERB_UNLOCK",
    "VERB_WARN",
    "AbortTransition",
    "CompleteTransition",
    "Decision",
    "ForgetNode",
    "PoolSpec",
    "RequestAction",
    "StartTransition",
    "decide",
    "decision_to_event",
    "effective_pools",
    "forecast_wanted",
    "kubernetes_overrides",
    "kubernetes_starved",
    "lead_seconds",
    "lend_reason",
    "membership",
    "membership_and_overlaps",
    "pool_from_nodeset",
    "pool_overlaps",
    "protect_running_pods",
    "reclaim_grace_started_at",
    "retry_backoff",
    "slurm_reserves",
    "stale_action",
    "starvation_held_until",
    "unpooled_marks",
]


def decide(state: ClusterState, pools: Sequence[PoolSpec], now: float) -> list[Decision]:
    """What to do next, for every pool (by name) and node (by name).

    `pools` are the effective pool specs (`effective_pools(state, config_pools)`).
    Ids are `tx-<last_seq>-<n>` / `act-<last_seq>-<n>`: the daemon must append the
    decisions and fold them before calling `decide` again.
    Nodes in no pool get no decisions; a node in a transition whose pool disappeared
    keeps being driven with default knobs until the transition ends.
    """
    if not state.sources_fresh():
        # Nothing at all is decided then (each step checks it again per node); saying so
        # first keeps a restart's catch-up, which folds hundreds of outcomes before the
        # Kubernetes LIST is back, from paying for membership on every one of them.
        return []
    planner = Planner(state, now)
    by_name = {pool.name: pool for pool in pools}
    members: dict[str, list[NodeState]] = {}
    member_of, overlaps = membership_and_overlaps(state, pools)
    for name, pool_name in member_of.items():
        members.setdefault(pool_name, []).append(state.nodes[name])
    for pool_name in sorted(members):
        nodes = sorted(members[pool_name], key=lambda n: n.name)
        pool = by_name.get(pool_name) or PoolSpec(name=pool_name)
        plan_pool(planner, pool, nodes)
    for name, claimed_by in sorted(overlaps.items()):
        report_overlap(planner, state.nodes[name], claimed_by)
    delete_defunct(planner)  # defunct Dynamic Slurm records (policy/defunct.py)
    _forget_gone(planner, state, member_of.keys() | overlaps.keys())
    return planner.decisions


def _forget_gone(planner: Planner, state: ClusterState, pooled: Set[str]) -> None:
    """Forget nodes gone from both sides for FORGET_AFTER_SECONDS (bounded memory), and
    the history of nodes in no pool (`unpooled_since`) as long: not while anything is
    open on them, not while an operator's pin names them, not while they carry a mark
    sunkd made (`unpooled_marks`), and only while both sources are fresh in this term
    (decisions need that, always)."""
    if not state.sources_fresh():
        return
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if (
            node.gone_since is not None
            and planner.now - node.gone_since >= FORGET_AFTER_SECONDS
            and node.slurm is None
            and node.k8s is None
            and node.transition is None
            and not node.open_actions
            and node.pin is None
        ):
            planner.decisions.append(ForgetNode(
                name, f"gone from Slurm and Kubernetes for {FORGET_AFTER_SECONDS:g} s"))
        elif node.unpooled_since is not None and name not in pooled and unpooled_marks(node):
            # It still carries a drain or taint sunkd made: never forgotten with it (Slurm
            # would lose the node to a `sunkd:` drain no view shows); sunkd takes off what
            # is safe to take off, `sunkd status` shows what stays and why.
            release_marks(planner, node)
        elif (
            node.unpooled_since is not None
            and name not in pooled  # the pools decide() runs with agree
            and planner.now - node.unpooled_since >= FORGET_AFTER_SECONDS
            and node.transition is None
            and not node.open_actions
            and node.pin is None
            # A node lent to Kubernetes keeps its history: its Slurm drain is sunkd's,
            # and only a pool that takes it again may resume it (docs/safety.md).
            and node.owner != wk.OWNER_KUBERNETES
        ):
            # Its observations stay (compactly, `ClusterState.unpooled`): only sunkd's
            # history of it goes, so a pool that takes it later adopts it afresh.
            planner.decisions.append(ForgetNode(
                name, f"in no pool for {FORGET_AFTER_SECONDS:g} s"))
    gone = [name for name, record in state.unpooled.items()
            if record.gone_since is not None and record.slurm is None and record.k8s is None
            and planner.now - record.gone_since >= FORGET_AFTER_SECONDS]
    for name in sorted(gone):
        planner.decisions.append(ForgetNode(
            name, f"gone from Slurm and Kubernetes for {FORGET_AFTER_SECONDS:g} s"))
