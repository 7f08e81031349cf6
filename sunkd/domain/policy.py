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
  `uncordon` only for a cordon marked `cordoned_by_sunkd`;
- at most one open action per node and side; a failed action is retried only after a
  backoff (retryable) or after a long pause (not retryable, outside a transition);
  inside a transition a non-retryable failure aborts the transition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sunkd.domain.events import (
    ActionRequested,
    Event,
    K8sNodesetObserved,
    Label,
    OwnershipSpec,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.ownership import (
    LEND_REASON_PREFIX,
    MIRROR_REASON_PREFIX,
    Assessment,
    assess,
    has_owner_taint,
    is_lend_drain,
    is_mirror_drain,
    is_ours,
    slurm_busy,
    slurm_drained,
    slurm_state_text,
    slurm_usable,
)
from sunkd.domain.state import (
    OWNER_KUBERNETES,
    OWNER_NONE,
    OWNER_SLURM,
    SIDE_KUBERNETES,
    SIDE_SLURM,
    ClusterState,
    NodeState,
    OpenTransition,
    Phase,
)

# Retry of a retryable failure: 5 s, 10 s, 20 s ... capped at 5 minutes.
RETRY_BASE_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
# A non-retryable failure outside a transition (mirror/repair) is tried again after this.
REFUSED_RETRY_SECONDS = 600.0
# After an action succeeded, wait this long for an observation showing its effect
# before requesting it again (sources emit only on change; they may lag a poll).
OBSERVATION_CATCHUP_SECONDS = 60.0

MODE_AUTO = "Auto"
MODE_SLURM = "Slurm"
MODE_KUBERNETES = "Kubernetes"
PREFER_KUBERNETES = "Kubernetes"

# Verbs (ActionRequested.verb). Kubernetes actions carry arg `k8s_node`.
VERB_DRAIN = "drain"  # slurm; arg `reason`
VERB_RESUME = "resume"  # slurm; arg `expect_reason` (the drain reason being removed)
VERB_LOCK = "lock"  # kubernetes: add taint sunkd.io/owner=slurm:NoSchedule, label owner=slurm
VERB_UNLOCK = "unlock"  # kubernetes: remove that taint, label sunkd.io/owner=kubernetes
VERB_CORDON = "cordon"  # kubernetes; args `slurm_state`, `slurm_reason` (annotations)
VERB_UNCORDON = "uncordon"  # kubernetes: only a cordon marked cordoned-by: sunkd
VERB_EVICT = "evict"  # kubernetes; args `pod` = "<namespace>/<name>" (repeated)

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


# ------------------------------------------------------------------------------ pools


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool of shared nodes and its knobs (a Nodeset or a config-file pool).

    Membership: a node is in the pool if its name is in `nodes`, or `node_selector`
    is non-empty and all its labels are on the Kubernetes node, or (no selector, no
    node list) one of its Slurm partitions is in `partitions`. A node matching several
    pools belongs to the first by name. Slurm demand is read from `partitions`.
    """

    name: str
    partitions: tuple[str, ...] = ()
    node_selector: tuple[Label, ...] = ()
    nodes: tuple[str, ...] = ()
    ownership: OwnershipSpec = field(default_factory=OwnershipSpec)


def pool_from_nodeset(nodeset: K8sNodesetObserved) -> PoolSpec:
    return PoolSpec(
        name=nodeset.pool,
        partitions=nodeset.partitions,
        node_selector=nodeset.node_selector,
        ownership=nodeset.ownership,
    )


def effective_pools(
    state: ClusterState, config_pools: Iterable[PoolSpec] = ()
) -> tuple[PoolSpec, ...]:
    """Pools from Nodesets in the state plus config-file pools; a Nodeset wins a name clash
    (the custom resource is the live, operator-edited spec). Sorted by name."""
    pools = {pool.name: pool for pool in config_pools}
    for nodeset in state.nodesets.values():
        pools[nodeset.pool] = pool_from_nodeset(nodeset)
    return tuple(pools[name] for name in sorted(pools))


def _matches(pool: PoolSpec, node: NodeState) -> bool:
    if node.name in pool.nodes:
        return True
    if pool.node_selector:
        if node.k8s is None:
            return False
        labels = {(label.key, label.value) for label in node.k8s.labels}
        return all((label.key, label.value) in labels for label in pool.node_selector)
    if pool.nodes or not pool.partitions or node.slurm is None:
        return False
    return not set(pool.partitions).isdisjoint(node.slurm.partitions)


def membership(state: ClusterState, pools: Sequence[PoolSpec]) -> dict[str, str]:
    """Node name -> pool name. A node in a transition stays in that transition's pool
    (even if the pool is gone: it is driven to the end with default knobs)."""
    ordered = sorted(pools, key=lambda pool: pool.name)
    result: dict[str, str] = {}
    for name, node in state.nodes.items():
        if node.transition is not None and node.transition.pool:
            result[name] = node.transition.pool
            continue
        for pool in ordered:
            if _matches(pool, node):
                result[name] = pool.name
                break
    return result


# -------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class StartTransition:
    """-> `transition.started`. from_owner `none` marks an adoption."""

    transition_id: str
    node: str
    pool: str
    from_owner: str
    to_owner: str
    reason: str


@dataclass(frozen=True, slots=True)
class CompleteTransition:
    """-> `transition.completed`: the node now belongs to `to_owner`."""

    transition_id: str
    node: str
    pool: str
    from_owner: str
    to_owner: str
    reason: str


@dataclass(frozen=True, slots=True)
class AbortTransition:
    """-> `transition.aborted`: the node stays with (returns to) `from_owner`."""

    transition_id: str
    node: str
    pool: str
    from_owner: str
    to_owner: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestAction:
    """-> `action.requested` (the outbox). `node` is the Slurm node name."""

    action_id: str
    transition_id: str | None
    side: str
    verb: str
    node: str
    attempt: int
    reason: str
    args: tuple[Label, ...] = ()

    def arg(self, key: str) -> str | None:
        for label in self.args:
            if label.key == key:
                return label.value
        return None


Decision = StartTransition | CompleteTransition | AbortTransition | RequestAction


def decision_to_event(decision: Decision) -> Event:
    """The event to append for a decision (subject = node name)."""
    if isinstance(decision, RequestAction):
        return Event(
            subject=decision.node,
            payload=ActionRequested(
                action_id=decision.action_id,
                transition_id=decision.transition_id,
                side=decision.side,
                verb=decision.verb,
                node=decision.node,
                attempt=decision.attempt,
                reason=decision.reason,
                args=decision.args,
            ),
        )
    payload_type: type[TransitionStarted | TransitionCompleted | TransitionAborted]
    if isinstance(decision, StartTransition):
        payload_type = TransitionStarted
    elif isinstance(decision, CompleteTransition):
        payload_type = TransitionCompleted
    else:
        payload_type = TransitionAborted
    return Event(
        subject=decision.node,
        payload=payload_type(
            transition_id=decision.transition_id,
            node=decision.node,
            pool=decision.pool,
            from_owner=decision.from_owner,
            to_owner=decision.to_owner,
            reason=decision.reason,
        ),
    )


def lend_reason(transition_id: str | None) -> str:
    """The Slurm drain reason of a lend (our prefix: only we ever resume it)."""
    if transition_id is None:
        return LEND_REASON_PREFIX
    return f"{LEND_REASON_PREFIX} [tx {transition_id}]"


def retry_backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    return float(min(RETRY_BASE_SECONDS * 2 ** max(attempt - 1, 0), RETRY_MAX_SECONDS))


# ------------------------------------------------------------------------------ plan

_REQUESTED = "requested"
_WAITING = "waiting"
_FAILED = "failed"  # a non-retryable failure of this verb within this transition


def _active_pods(node: NodeState) -> list[str]:
    return sorted(
        f"{pod.namespace}/{pod.name}"
        for pods in node.workload.values()
        for pod in pods
        if pod.phase not in _DONE_PHASES
    )


def _may_resume(node: NodeState) -> bool:
    """Slurm may get the node back only while pool pods are kept off and gone."""
    return has_owner_taint(node.k8s) and not _active_pods(node)


class _Planner:
    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.now = now
        self.decisions: list[Decision] = []
        self.prefix = state.last_seq
        self.transition_count = 0
        self.action_count = 0
        self.touched: set[str] = set()  # nodes that got a decision in this round
        self.ended: set[str] = set()  # transition ids completed or aborted this round
        self.aborted: set[str] = set()  # the aborted ones among them
        self.busy_sides: set[tuple[str, str]] = set()

    # ids: unique per log position, identical on replay
    def _transition_id(self) -> str:
        self.transition_count += 1
        return f"tx-{self.prefix}-{self.transition_count}"

    def _action_id(self) -> str:
        self.action_count += 1
        return f"act-{self.prefix}-{self.action_count}"

    def ensure(
        self,
        node: NodeState,
        side: str,
        verb: str,
        reason: str,
        args: tuple[Label, ...] = (),
        transition_id: str | None = None,
    ) -> str:
        """Request `verb` unless it is open, just succeeded (awaiting its observation)
        or in backoff. The caller has already checked the world is not as wanted."""
        if (node.name, side) in self.busy_sides or node.open_action_on(side) is not None:
            return _WAITING
        attempt = 1
        outcome = node.outcomes.get(f"{side}/{verb}")
        if outcome is not None:
            if outcome.succeeded:
                observed_seq = node.slurm_seq if side == SIDE_SLURM else node.k8s_seq
                if (
                    observed_seq < outcome.seq
                    and self.now - outcome.at < OBSERVATION_CATCHUP_SECONDS
                ):
                    return _WAITING
            elif transition_id is not None and outcome.transition_id != transition_id:
                pass  # a failure of an earlier transition does not hold back a new one
            elif outcome.retryable:
                attempt = outcome.attempt + 1
                if self.now < outcome.at + retry_backoff(outcome.attempt):
                    return _WAITING
            else:
                if transition_id is not None:
                    return _FAILED
                attempt = outcome.attempt + 1
                if self.now < outcome.at + REFUSED_RETRY_SECONDS:
                    return _WAITING
        if side == SIDE_KUBERNETES:
            args = (Label("k8s_node", node.k8s_name or node.name), *args)
        self.decisions.append(
            RequestAction(
                action_id=self._action_id(),
                transition_id=transition_id,
                side=side,
                verb=verb,
                node=node.name,
                attempt=attempt,
                reason=reason,
                args=args,
            )
        )
        self.busy_sides.add((node.name, side))
        self.touched.add(node.name)
        return _REQUESTED

    def start(
        self, node: NodeState, pool: str, from_owner: str, to_owner: str, reason: str
    ) -> OpenTransition:
        transition_id = self._transition_id()
        self.decisions.append(
            StartTransition(transition_id, node.name, pool, from_owner, to_owner, reason)
        )
        self.touched.add(node.name)
        return OpenTransition(
            transition_id=transition_id,
            pool=pool,
            from_owner=from_owner,
            to_owner=to_owner,
            started_at=self.now,
            reason=reason,
        )

    def complete(self, node: NodeState, transition: OpenTransition, reason: str) -> None:
        self.ended.add(transition.transition_id)
        self.decisions.append(
            CompleteTransition(
                transition.transition_id,
                node.name,
                transition.pool,
                transition.from_owner,
                transition.to_owner,
                reason,
            )
        )
        self.touched.add(node.name)

    def abort(self, node: NodeState, transition: OpenTransition, reason: str) -> None:
        self.ended.add(transition.transition_id)
        self.aborted.add(transition.transition_id)
        self.decisions.append(
            AbortTransition(
                transition.transition_id,
                node.name,
                transition.pool,
                transition.from_owner,
                transition.to_owner,
                reason,
            )
        )
        self.touched.add(node.name)


# ------------------------------------------------------------------- per-node steps


def _abort_lend(
    planner: _Planner, node: NodeState, transition: OpenTransition, reason: str
) -> None:
    """Abort a lend: resume our drain (if it is ours and in place); the taint stays."""
    planner.abort(node, transition, reason)
    slurm = node.slurm
    if (
        slurm is not None
        and "DRAIN" in slurm.flags
        and is_ours(slurm.reason)
        and _may_resume(node)
    ):
        planner.ensure(
            node,
            SIDE_SLURM,
            VERB_RESUME,
            f"lend aborted ({reason}): give the node back to Slurm",
            (Label("expect_reason", slurm.reason or ""),),
            transition.transition_id,
        )


def _unlock_started(node: NodeState, transition: OpenTransition) -> bool:
    if transition.did(SIDE_KUBERNETES, VERB_UNLOCK):
        return True
    return any(
        a.verb == VERB_UNLOCK and a.transition_id == transition.transition_id
        for a in node.open_actions.values()
    )


def _resume_started(node: NodeState, transition: OpenTransition) -> bool:
    if transition.did(SIDE_SLURM, VERB_RESUME):
        return True
    return any(
        a.verb == VERB_RESUME and a.transition_id == transition.transition_id
        for a in node.open_actions.values()
    )


def _advance_to_kubernetes(
    planner: _Planner, node: NodeState, transition: OpenTransition
) -> None:
    """Lend (or adopt as lent): drain in Slurm, wait for drained, unlock, complete."""
    adopt = transition.direction == "adopt"
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    tx = transition.transition_id
    if "DRAIN" not in slurm.flags or not is_ours(slurm.reason):
        if adopt:
            planner.abort(node, transition, "adoption as lent no longer matches: not drained")
            return
        result = planner.ensure(
            node,
            SIDE_SLURM,
            VERB_DRAIN,
            f"lend to kubernetes: drain in Slurm ({transition.reason})",
            (Label("reason", lend_reason(tx)),),
            tx,
        )
        if result == _FAILED:
            _abort_lend(planner, node, transition, "the Slurm drain failed")
        return
    if not slurm_drained(slurm):
        return  # jobs still running or completing: wait (drain_timeout is checked earlier)
    unlock_done = adopt or transition.did(SIDE_KUBERNETES, VERB_UNLOCK)
    if has_owner_taint(k8s) or not unlock_done:
        result = planner.ensure(
            node,
            SIDE_KUBERNETES,
            VERB_UNLOCK,
            "Slurm reports the node drained: remove the owner taint",
            (),
            tx,
        )
        if result == _FAILED:
            _abort_lend(planner, node, transition, "removing the owner taint failed")
        return
    planner.complete(
        node,
        transition,
        "adopted: drained by sunkd in Slurm and untainted"
        if adopt
        else "Slurm reports drained and the owner taint is gone: node belongs to kubernetes",
    )


def _advance_to_slurm(
    planner: _Planner, node: NodeState, transition: OpenTransition, spec: OwnershipSpec
) -> None:
    """Reclaim (or adopt): taint, let pool pods finish or evict them, resume, complete."""
    adopt = transition.direction == "adopt"
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    tx = transition.transition_id
    lock_done = has_owner_taint(k8s) and (adopt or transition.did(SIDE_KUBERNETES, VERB_LOCK))
    if not lock_done:
        result = planner.ensure(
            node,
            SIDE_KUBERNETES,
            VERB_LOCK,
            "adopt for Slurm: add the owner taint"
            if adopt
            else "reclaim for Slurm: add the owner taint so no new pool pods land",
            (),
            tx,
        )
        if result == _FAILED:
            planner.abort(node, transition, "adding the owner taint failed")
        return
    pods = _active_pods(node)
    if pods:
        if planner.now - transition.started_at >= spec.reclaim_grace_seconds:
            result = planner.ensure(
                node,
                SIDE_KUBERNETES,
                VERB_EVICT,
                f"reclaim_grace ({spec.reclaim_grace_seconds:g}s) over: evict {len(pods)} "
                "pool pod(s)",
                tuple(Label("pod", pod) for pod in pods),
                tx,
            )
            if result == _FAILED:
                planner.abort(node, transition, "evicting pool pods failed")
        return
    if "DRAIN" in slurm.flags:
        if is_ours(slurm.reason):
            result = planner.ensure(
                node,
                SIDE_SLURM,
                VERB_RESUME,
                "no pool pods left: resume the node in Slurm",
                (Label("expect_reason", slurm.reason or ""),),
                tx,
            )
            if result == _FAILED:
                planner.abort(node, transition, "the Slurm resume failed")
        return
    if slurm_usable(slurm):
        planner.complete(
            node,
            transition,
            "adopted: usable in Slurm and tainted"
            if adopt
            else "Slurm reports the node usable and it is tainted: node belongs to slurm",
        )


def _handle_transition(
    planner: _Planner,
    node: NodeState,
    assessment: Assessment,
    spec: OwnershipSpec,
    surplus_lends: set[str],
) -> None:
    transition = node.transition
    assert transition is not None
    direction = transition.direction
    if assessment.held:
        # Past its point of no return (a lend's taint removal, a reclaim's resume), a
        # move waits out a passing hold (a kubelet or slurmd blip) instead of flipping
        # the node back; only a node gone from one side ends it.
        committed = (direction == "lend" and _unlock_started(node, transition)) or (
            direction == "reclaim" and _resume_started(node, transition)
        )
        missing = node.slurm is None or node.k8s is None
        if not committed or missing:
            planner.abort(node, transition, "held: " + "; ".join(assessment.hold_reasons))
        return
    now = planner.now
    if direction == "lend":
        committed = _unlock_started(node, transition)
        if not committed:
            if assessment.pin == OWNER_SLURM:
                _abort_lend(planner, node, transition, "operator pinned the node to slurm")
                return
            if spec.mode == MODE_SLURM and assessment.pin != OWNER_KUBERNETES:
                _abort_lend(planner, node, transition, "pool mode is Slurm")
                return
            if transition.transition_id in surplus_lends:
                _abort_lend(
                    planner, node, transition, "kubernetes demand gone (fewer nodes needed)"
                )
                return
            if (
                not slurm_drained(node.slurm)
                and now - transition.started_at >= spec.drain_timeout_seconds
            ):
                _abort_lend(
                    planner,
                    node,
                    transition,
                    f"Slurm drain not finished within drain_timeout "
                    f"({spec.drain_timeout_seconds:g}s)",
                )
                return
        _advance_to_kubernetes(planner, node, transition)
        return
    if direction == "reclaim" and not _resume_started(node, transition):
        if assessment.pin == OWNER_KUBERNETES:
            planner.abort(node, transition, "operator pinned the node to kubernetes")
            return
        if spec.mode == MODE_KUBERNETES and assessment.pin != OWNER_SLURM:
            planner.abort(node, transition, "pool mode is Kubernetes")
            return
    if transition.to_owner == OWNER_KUBERNETES:
        _advance_to_kubernetes(planner, node, transition)
    else:
        _advance_to_slurm(planner, node, transition, spec)


def _adopt(planner: _Planner, node: NodeState, pool: PoolSpec) -> None:
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    if is_lend_drain(slurm.reason) and slurm_drained(slurm) and not has_owner_taint(k8s):
        transition = planner.start(
            node,
            pool.name,
            OWNER_NONE,
            OWNER_KUBERNETES,
            "adopt: drained by sunkd in Slurm and no owner taint, so already lent",
        )
        _advance_to_kubernetes(planner, node, transition)
        return
    transition = planner.start(
        node,
        pool.name,
        OWNER_NONE,
        OWNER_SLURM,
        f"adopt: first seen {slurm.state.upper()} in Slurm; nodes start Slurm-owned",
    )
    _advance_to_slurm(planner, node, transition, pool.ownership)


def _mirror_holds(planner: _Planner, node: NodeState, assessment: Assessment) -> None:
    """Mirror each side's trouble to the other side; undo only our own mirrors."""
    slurm = node.slurm
    k8s = node.k8s
    if k8s is not None:
        if assessment.slurm_holds and not k8s.unschedulable:
            planner.ensure(
                node,
                SIDE_KUBERNETES,
                VERB_CORDON,
                "mirror Slurm hold: " + "; ".join(assessment.slurm_holds),
                (
                    Label("slurm_state", slurm_state_text(node.slurm, missing="MISSING")),
                    Label("slurm_reason", (slurm.reason or "") if slurm else "missing"),
                ),
            )
        elif (
            not assessment.slurm_holds
            and not assessment.slurm_unhealthy
            and k8s.unschedulable
            and k8s.cordoned_by_sunkd
        ):
            planner.ensure(
                node, SIDE_KUBERNETES, VERB_UNCORDON, "Slurm hold cleared: remove our cordon"
            )
    if slurm is not None:
        if assessment.k8s_holds and "DRAIN" not in slurm.flags:
            why = ", ".join(assessment.k8s_holds)
            planner.ensure(
                node,
                SIDE_SLURM,
                VERB_DRAIN,
                f"mirror Kubernetes hold: {why}",
                (Label("reason", f"{MIRROR_REASON_PREFIX}{why}"),),
            )
        elif (
            not assessment.k8s_holds
            and "DRAIN" in slurm.flags
            and is_mirror_drain(slurm.reason)
            and node.owner == OWNER_SLURM
            and node.transition is None
            and _may_resume(node)
        ):
            planner.ensure(
                node,
                SIDE_SLURM,
                VERB_RESUME,
                "Kubernetes hold cleared: resume our mirror drain",
                (Label("expect_reason", slurm.reason or ""),),
            )


def _repair(planner: _Planner, node: NodeState, assessment: Assessment) -> None:
    """Put back the side effects of a settled phase that someone or something undid."""
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    if assessment.phase == Phase.SLURM:
        if not has_owner_taint(k8s):
            planner.ensure(
                node, SIDE_KUBERNETES, VERB_LOCK, "repair: Slurm-owned node lost its owner taint"
            )
        pods = _active_pods(node)
        if pods and has_owner_taint(k8s):
            planner.ensure(
                node,
                SIDE_KUBERNETES,
                VERB_EVICT,
                f"repair: {len(pods)} pool pod(s) on a Slurm-owned node",
                tuple(Label("pod", pod) for pod in pods),
            )
        if "DRAIN" in slurm.flags and is_lend_drain(slurm.reason) and _may_resume(node):
            planner.ensure(
                node,
                SIDE_SLURM,
                VERB_RESUME,
                "repair: Slurm-owned node still carries a lend drain",
                (Label("expect_reason", slurm.reason or ""),),
            )
    elif assessment.phase == Phase.KUBERNETES:
        if "DRAIN" not in slurm.flags:
            planner.ensure(
                node,
                SIDE_SLURM,
                VERB_DRAIN,
                "repair: node lent to kubernetes was resumed in Slurm; drain it again",
                (Label("reason", lend_reason(None)),),
            )
        elif has_owner_taint(k8s) and slurm_drained(slurm) and is_ours(slurm.reason):
            planner.ensure(
                node,
                SIDE_KUBERNETES,
                VERB_UNLOCK,
                "repair: node lent to kubernetes carries the owner taint",
            )


# ------------------------------------------------------------------- pool-level moves


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
    bound = {(pod.namespace, pod.name) for member in members
             for pods_on_node in member.workload.values() for pod in pods_on_node}
    pods = tuple(pod for pod in demand.pending if (pod.namespace, pod.name) not in bound)
    if not pods:
        return 0
    sizes = [m.k8s for m in members if m.k8s is not None]
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


def _job_ends(state: ClusterState, pool: PoolSpec) -> dict[str, float]:
    ends: dict[str, float] = {}
    for partition in pool.partitions:
        demand = state.slurm_demand.get(partition)
        if demand is None:
            continue
        for job_end in demand.node_job_ends:
            end = math.inf if job_end.expected_end is None else job_end.expected_end
            ends[job_end.node] = max(ends.get(job_end.node, -math.inf), end)
    return ends


def _dwell_ok(node: NodeState, spec: OwnershipSpec, now: float) -> bool:
    return node.last_move_at is None or now - node.last_move_at >= spec.dwell_seconds


def _can_lend(planner: _Planner, node: NodeState, assessment: Assessment) -> bool:
    slurm = node.slurm
    k8s = node.k8s
    return (
        assessment.phase == Phase.SLURM
        and node.transition is None
        and node.name not in planner.touched
        and not node.open_actions
        and slurm is not None
        and k8s is not None
        and has_owner_taint(k8s)
        and "DRAIN" not in slurm.flags
        and not assessment.slurm_unhealthy
        and not k8s.unschedulable
        and assessment.pin != OWNER_SLURM
    )


def _can_reclaim(planner: _Planner, node: NodeState, assessment: Assessment) -> bool:
    slurm = node.slurm
    return (
        assessment.phase == Phase.KUBERNETES
        and node.transition is None
        and node.name not in planner.touched
        and not node.open_actions
        and slurm is not None
        and "DRAIN" in slurm.flags
        and is_ours(slurm.reason)
        and assessment.pin != OWNER_KUBERNETES
    )


def _lend_order(node: NodeState, ends: Mapping[str, float]) -> tuple[int, float, str]:
    slurm = node.slurm
    idle = slurm is not None and not slurm_busy(slurm) and slurm.alloc_cpus == 0
    return (0 if idle else 1, 0.0 if idle else ends.get(node.name, math.inf), node.name)


def _plan_pool(planner: _Planner, pool: PoolSpec, members: list[NodeState]) -> None:
    state = planner.state
    now = planner.now
    spec = pool.ownership
    assessments = {node.name: assess(state, node, now) for node in members}

    lends = [n for n in members if n.transition is not None and n.transition.direction == "lend"]
    reclaims = [
        n for n in members if n.transition is not None and n.transition.direction == "reclaim"
    ]
    owned_k8s = sum(1 for n in members if n.transition is None and n.owner == OWNER_KUBERNETES)
    owned_slurm = sum(1 for n in members if n.transition is None and n.owner == OWNER_SLURM)
    # Demand already covered by a node of that side that sits idle (the pods or jobs
    # will land there: the scheduler simply has not run since the node arrived) must
    # not move another node; otherwise every poll/watch lag over-lends or over-reclaims.
    idle_k8s = sum(
        1 for n in members
        if n.transition is None and n.owner == OWNER_KUBERNETES
        and not assessments[n.name].held and not _active_pods(n)
    )
    idle_slurm = sum(
        1 for n in members
        if n.transition is None and n.owner == OWNER_SLURM and not assessments[n.name].held
        and n.slurm is not None and slurm_usable(n.slurm) and not slurm_busy(n.slurm)
    )
    k8s_needed = max(_k8s_nodes_needed(state, pool, members) - idle_k8s, 0)
    slurm_needed = max(_slurm_nodes_needed(state, pool) - idle_slurm, 0)
    contested = k8s_needed > 0 and slurm_needed > 0
    if contested and spec.prefer == PREFER_KUBERNETES:
        slurm_needed = 0
    elif contested:
        k8s_needed = 0

    lend_target = max(k8s_needed, spec.min_kubernetes - owned_k8s)
    reclaim_target = max(slurm_needed, spec.min_slurm - owned_slurm)

    # Lends the demand no longer justifies (not yet handed over), newest first.
    surplus_lends: set[str] = set()
    if spec.mode == MODE_AUTO:
        voluntary = [
            n
            for n in lends
            if assessments[n.name].pin != OWNER_KUBERNETES
            and n.transition is not None
            and not _unlock_started(n, n.transition)
        ]
        surplus = len(lends) - lend_target
        voluntary.sort(
            key=lambda n: (n.transition.started_at if n.transition else 0.0, n.name),
            reverse=True,
        )
        for node in voluntary[: max(surplus, 0)]:
            assert node.transition is not None
            surplus_lends.add(node.transition.transition_id)

    # Per node: transitions, adoption, mirrors, repairs.
    for node in members:
        assessment = assessments[node.name]
        if not assessment.actionable:
            continue
        if node.transition is not None:
            _handle_transition(planner, node, assessment, spec, surplus_lends)
        elif node.owner == OWNER_NONE and not assessment.held:
            _adopt(planner, node, pool)
        _mirror_holds(planner, node, assessment)
        if node.transition is None and not assessment.held and node.owner != OWNER_NONE:
            _repair(planner, node, assessment)

    # New moves, within max_in_flight.
    lends_open = sum(1 for n in lends if n.transition and n.transition.transition_id
                     not in planner.ended)
    reclaims_open = sum(1 for n in reclaims if n.transition and n.transition.transition_id
                        not in planner.ended)
    in_flight = lends_open + reclaims_open
    budget = max(spec.max_in_flight - in_flight, 0)
    if budget == 0:
        return
    lendable = [n for n in members if _can_lend(planner, n, assessments[n.name])]
    reclaimable = [n for n in members if _can_reclaim(planner, n, assessments[n.name])]

    # Forced moves first: pins to the other side, then the pool's mode. They skip
    # dwell and the min/max knobs (the operator asked for exactly this).
    forced_lends = [n for n in lendable if assessments[n.name].pin == OWNER_KUBERNETES]
    forced_reclaims = [n for n in reclaimable if assessments[n.name].pin == OWNER_SLURM]
    if spec.mode == MODE_KUBERNETES:
        pinned_names = {n.name for n in forced_lends}
        forced_lends += [n for n in lendable if n.name not in pinned_names]
    elif spec.mode == MODE_SLURM:
        pinned_names = {n.name for n in forced_reclaims}
        forced_reclaims += [n for n in reclaimable if n.name not in pinned_names]
    for node in forced_lends:
        if budget == 0:
            return
        pinned = assessments[node.name].pin == OWNER_KUBERNETES
        why = "operator pinned the node to kubernetes" if pinned else "pool mode is Kubernetes"
        _start_lend(planner, node, pool, why)
        budget -= 1
    for node in forced_reclaims:
        if budget == 0:
            return
        pinned = assessments[node.name].pin == OWNER_SLURM
        why = "operator pinned the node to slurm" if pinned else "pool mode is Slurm"
        _start_reclaim(planner, node, pool, why)
        budget -= 1
    if spec.mode != MODE_AUTO:
        return

    forced = {n.name for n in forced_lends} | {n.name for n in forced_reclaims}
    # A lend completed in this very round still covers demand (its node is now an idle
    # Kubernetes node, which `idle_k8s` only sees from the next round on); only lends
    # aborted now stop counting. Otherwise every completion would start one more lend.
    lends_covering = sum(1 for n in lends if n.transition
                         and n.transition.transition_id not in planner.aborted)
    lend_more = lend_target - lends_covering
    lend_more = min(lend_more, owned_slurm - spec.min_slurm)
    if spec.max_kubernetes is not None:
        lend_more = min(lend_more, spec.max_kubernetes - owned_k8s - len(lends))
    reclaim_more = min(reclaim_target - len(reclaims), owned_k8s - spec.min_kubernetes)
    if spec.max_kubernetes is not None:
        excess = owned_k8s + len(lends) - len(reclaims) - spec.max_kubernetes
        reclaim_more = max(reclaim_more, excess)
    if lend_more > 0 and reclaim_more > 0:
        # Only the floors can ask for both; do not churn both ways at once.
        if spec.prefer == PREFER_KUBERNETES:
            reclaim_more = 0
        else:
            lend_more = 0

    if lend_more > 0:
        ends = _job_ends(state, pool)
        candidates = [
            n for n in lendable if n.name not in forced and _dwell_ok(n, spec, now)
        ]
        candidates.sort(key=lambda n: _lend_order(n, ends))
        why = (
            f"kubernetes needs {k8s_needed} node(s) for pending pool pods"
            if k8s_needed >= spec.min_kubernetes - owned_k8s
            else f"min_kubernetes is {spec.min_kubernetes}"
        )
        for node in candidates[: min(lend_more, budget)]:
            _start_lend(planner, node, pool, why)
            budget -= 1
    if reclaim_more > 0 and budget > 0:
        candidates = [
            n for n in reclaimable if n.name not in forced and _dwell_ok(n, spec, now)
        ]
        candidates.sort(key=lambda n: (len(_active_pods(n)), n.name))
        if spec.max_kubernetes is not None and owned_k8s + len(lends) > spec.max_kubernetes:
            why = f"max_kubernetes is {spec.max_kubernetes}"
        elif slurm_needed > 0:
            why = f"Slurm needs {slurm_needed} node(s) for pending jobs"
        else:
            why = f"min_slurm is {spec.min_slurm}"
        for node in candidates[: min(reclaim_more, budget)]:
            _start_reclaim(planner, node, pool, why)
            budget -= 1


def _start_lend(planner: _Planner, node: NodeState, pool: PoolSpec, why: str) -> None:
    transition = planner.start(node, pool.name, OWNER_SLURM, OWNER_KUBERNETES, why)
    _advance_to_kubernetes(planner, node, transition)


def _start_reclaim(planner: _Planner, node: NodeState, pool: PoolSpec, why: str) -> None:
    transition = planner.start(node, pool.name, OWNER_KUBERNETES, OWNER_SLURM, why)
    _advance_to_slurm(planner, node, transition, pool.ownership)


def decide(state: ClusterState, pools: Sequence[PoolSpec], now: float) -> list[Decision]:
    """What to do next, for every pool (by name) and node (by name).

    `pools` are the effective pool specs (`effective_pools(state, config_pools)`).
    Ids are `tx-<last_seq>-<n>` / `act-<last_seq>-<n>`: the daemon must append the
    decisions and fold them before calling `decide` again.
    Nodes in no pool get no decisions; a node in a transition whose pool disappeared
    keeps being driven with default knobs until the transition ends.
    """
    planner = _Planner(state, now)
    by_name = {pool.name: pool for pool in pools}
    members: dict[str, list[NodeState]] = {}
    for name, pool_name in membership(state, pools).items():
        members.setdefault(pool_name, []).append(state.nodes[name])
    for pool_name in sorted(members):
        nodes = sorted(members[pool_name], key=lambda n: n.name)
        pool = by_name.get(pool_name) or PoolSpec(name=pool_name)
        _plan_pool(planner, pool, nodes)
    return planner.decisions
