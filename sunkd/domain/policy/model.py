"""The policy's vocabulary: pools, the decisions it returns, and its constants.

Everything here is data or a small pure function over data, shared by the planner
steps and by the rest of sunkd (the API, the CLI, the executor and the engine import
it through `sunkd.domain.policy`). It depends on nothing else in the package, so the
step modules can all build on it without import cycles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionRequested,
    Event,
    K8sNodesetObserved,
    Label,
    NodeForgotten,
    OwnershipSpec,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.state import ClusterState, NodeState

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
# An unlock's arg when sunkd's slurmd pod is gone (`slurmdgone.slurmd_gone`): the executor
# then accepts Slurm not hearing the node, still never an allocation.
SLURMD_GONE_ARG = "slurmd_gone"
# A slurmd-delete's arg when it repairs a Slurm-owned node's failed or unregistered pod
# (`policy/slurmdrepair.py`): Slurm does not hear that slurmd, so the executor accepts the
# node out of contact, still only under DRAIN and never with an allocation.
SLURMD_REPAIR_ARG = "slurmd_repair"
# A resume's arg when sunkd's slurmd pod registered on a node Slurm left DOWN under sunkd's
# drain (`slurmdgone.slurmd_registered`): the actuator returns exactly that DOWN to service.
RETURN_TO_SERVICE_ARG = "return_to_service"
# sunkd's hold: its hold taint sunkd.io/slurm-hold and the reason annotation, args
# `slurm_state`, `slurm_reason`; the release removes only that taint (a Kubernetes cordon,
# spec.unschedulable, is always someone else's). The verbs keep their first names in the
# log ("cordon"/"uncordon"): every event log, snapshot and dashboard since the first
# release reads them.
VERB_HOLD = "cordon"
VERB_RELEASE = "uncordon"
VERB_WARN = "warn"  # kubernetes: a Warning Event on the node; args `event_reason`, `message`
VERB_EVICT = "evict"  # kubernetes; args `pod` = "<namespace>/<name>" (repeated)


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


class _Rules:
    """The pools' membership rules, prepared once per call: at 10,000 nodes and 10 pools,
    `selector_matches` per (pool, node) rebuilt each node's label set 200,000 times a decision,
    most of a decision's time (py-spy of a restart, docs/performance.md)."""

    def __init__(self, pools: Sequence[PoolSpec]) -> None:
        self.pools = sorted(pools, key=lambda pool: pool.name)
        self.selectors = [tuple((label.key, label.value) for label in pool.node_selector)
                          for pool in self.pools]
        self.partitions = [frozenset(pool.partitions) for pool in self.pools]

    def matching(self, node: NodeState) -> list[str]:
        """Names of the pools that select `node`, sorted: those that name it, else those
        whose node selector its Kubernetes labels satisfy, else (pools with neither) those
        sharing a Slurm partition with it."""
        found = []
        for pool, selector, partitions in zip(self.pools, self.selectors, self.partitions,
                                              strict=True):
            if node.name in pool.nodes:
                found.append(pool.name)
            elif selector:
                if node.k8s is None:
                    continue
                # A scan, not a set: a selector names a label or two, and building each
                # node's label set on every round was most of `membership`'s time.
                labels = node.k8s.labels
                if all(any(label.key == key and label.value == value for label in labels)
                       for key, value in selector):
                    found.append(pool.name)
            elif not pool.nodes and partitions and node.slurm is not None and \
                    not partitions.isdisjoint(node.slurm.partitions):
                found.append(pool.name)
        return found


# The last pools' rules, and each node's matching pools with the NodeState they read
# (`_Rules.matching` reads only the node and the pools; the fold is copy-on-write, so an
# untouched node keeps its identity): most rounds match only the nodes an event touched.
# Forgotten whenever the pools change; at most one entry per node name.
_MATCHED: list[tuple[tuple[PoolSpec, ...], _Rules, dict[str, tuple[NodeState, list[str]]]]] = []


def _rules_for(pools: Sequence[PoolSpec]
               ) -> tuple[_Rules, dict[str, tuple[NodeState, list[str]]]]:
    key = tuple(pools)
    # One read of the shared entry: `membership` runs in several threads at once (decide
    # in a worker, the extender, the API), and another caller's pools may replace it.
    entry = _MATCHED[0] if _MATCHED else None
    if entry is None or entry[0] != key:
        entry = (key, _Rules(key), {})
        _MATCHED[:] = [entry]
    _key, rules, matched = entry
    if len(matched) >= 200_000:  # names come and go: a bound for very long runs
        matched.clear()
    return rules, matched


def membership(state: ClusterState, pools: Sequence[PoolSpec]) -> dict[str, str]:
    """Node name -> pool name. A node in a transition stays in that transition's pool
    (even if the pool is gone: it is driven to the end with default knobs). A node two or
    more pools select belongs to none of them (`pool_overlaps`): a Nodeset in another
    namespace selecting the same nodes must not silently take them over."""
    return membership_and_overlaps(state, pools)[0]


def pool_overlaps(state: ClusterState, pools: Sequence[PoolSpec]) -> dict[str, tuple[str, ...]]:
    """Nodes (not moving) that two or more pools select, with those pools' names."""
    return membership_and_overlaps(state, pools)[1]


def membership_and_overlaps(
    state: ClusterState, pools: Sequence[PoolSpec]
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """`membership` and `pool_overlaps` in one pass over the nodes (`decide` needs both
    every round; matching every node twice was a fifth of a simulated round's time)."""
    rules, matched = _rules_for(pools)
    result: dict[str, str] = {}
    overlaps: dict[str, tuple[str, ...]] = {}
    for name, node in state.nodes.items():
        if node.transition is not None and node.transition.pool:
            result[name] = node.transition.pool
            continue
        kept = matched.get(name)
        if kept is not None and kept[0] is node:
            matching = kept[1]
        else:
            matching = rules.matching(node)
            matched[name] = (node, matching)
        if len(matching) == 1:
            result[name] = matching[0]
        elif len(matching) > 1 and node.transition is None:
            overlaps[name] = tuple(matching)
    return result, overlaps


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


@dataclass(frozen=True, slots=True)
class ForgetNode:
    """-> `node.forgotten`: a node gone from both sides for FORGET_AFTER_SECONDS."""

    node: str
    reason: str


# A node that vanished from both Slurm and Kubernetes is forgotten after this long (it
# can come back: a later observation starts it afresh, as a first sighting).
FORGET_AFTER_SECONDS = 3600.0

Decision = StartTransition | CompleteTransition | AbortTransition | RequestAction | ForgetNode


def decision_to_event(decision: Decision) -> Event:
    """The event to append for a decision (subject = node name)."""
    if isinstance(decision, ForgetNode):
        return Event(subject=decision.node,
                     payload=NodeForgotten(node=decision.node, reason=decision.reason))
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
        return wk.REASON_LEND
    return f"{wk.REASON_LEND} [tx {transition_id}]"


def retry_backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    return float(min(RETRY_BASE_SECONDS * 2 ** max(attempt - 1, 0), RETRY_MAX_SECONDS))
