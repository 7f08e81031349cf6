"""The fold: `ClusterState` is a pure function of the event log.

sunkd never keeps state that is not derivable from the log (docs/architecture.md):
the in-memory `ClusterState` is a cache of `fold(events)`, snapshots are
`state_to_json(fold(prefix))`, and a restart is `fold(tail, state_from_json(snapshot))`.
So the fold must be deterministic (no clock, no randomness: times come from each
event's `recorded_at`), total (unknown payloads and stale references are ignored,
never fatal) and fast enough to replay a million events in seconds.

What the fold stores is the *evidence*: the last observation of each node on both
sides, the ownership-machine phase recorded by transition events, pins, open actions
and their outcomes, demand, source health. What the evidence *means* at a given
moment (HELD, UNKNOWN, hold reasons) depends on `now` (grace periods) and lives in
`sunkd.domain.ownership.assess`.

States are immutable values: `fold` builds a new state and never mutates the input
(copy-on-write of the containers it touches, per-node drafts frozen at the end), so
any earlier state stays valid as a snapshot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from sunkd.domain import authorship as marks
from sunkd.domain import forecast
from sunkd.domain import wellknown as wk
from sunkd.domain.authorship import DrainMark, HoldMark
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    ConfiguredPool,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    LeaderElected,
    LogArchived,
    NodeForgotten,
    OperatorPinned,
    Payload,
    PodRef,
    PoolsConfigured,
    RecordedEvent,
    SlurmDemandObserved,
    SlurmHookReceived,
    SlurmNodeObserved,
    SlurmNodeVanished,
    SourceHealth,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.forecast import DemandSummary
from sunkd.domain.slurmnode import (
    KNOWN_USABLE_STATES,
    UNHEALTHY_FLAGS,
    UNHEALTHY_STATES,
    slurm_unhealthy,
)

OWNER_SLURM = wk.OWNER_SLURM  # also the "side" of an action: which system it acts on
OWNER_KUBERNETES = wk.OWNER_KUBERNETES
OWNER_NONE = "none"

SOURCE_FRESH = "fresh"

# Slurm conditions that make a node unusable regardless of drains (`slurmnode.py`). They
# put the node in HELD once they last longer than the grace in `ownership`
# (NOT_RESPONDING shows up for a few seconds right after a resume or a slurmd restart).
UNHEALTHY_SLURM_STATES = UNHEALTHY_STATES
UNHEALTHY_SLURM_FLAGS = UNHEALTHY_FLAGS
# How long Kubernetes' pods may wait without a break before the policy counts them
# starved (policy/fairness.py, `KUBERNETES_WAIT_BOUND_SECONDS`); the fold remembers the
# last run of pending pods at least this long (`k8s_pending_last`).
STARVATION_BOUND_SECONDS = 30.0


class Phase(StrEnum):
    """Ownership phases (docs/architecture.md)."""

    SLURM = "SLURM"
    TO_K8S = "TO_K8S"
    KUBERNETES = "KUBERNETES"
    TO_SLURM = "TO_SLURM"
    HELD = "HELD"
    UNKNOWN = "UNKNOWN"


KNOWN_USABLE_SLURM_STATES = KNOWN_USABLE_STATES


# --------------------------------------------------------------------------- records
# The small records are NamedTuples: as immutable as frozen dataclasses, but several
# times cheaper to build, and the fold builds one for every action and transition event.


class OpenTransition(NamedTuple):
    """A transition started and not yet completed or aborted."""

    transition_id: str
    pool: str
    from_owner: str
    to_owner: str
    started_at: float
    reason: str
    done_verbs: tuple[str, ...] = ()  # "side/verb" that succeeded within it, sorted

    @property
    def direction(self) -> str:
        """`lend` (slurm -> kubernetes), `reclaim` (kubernetes -> slurm) or `adopt`."""
        if self.from_owner == OWNER_SLURM and self.to_owner == OWNER_KUBERNETES:
            return "lend"
        if self.from_owner == OWNER_KUBERNETES and self.to_owner == OWNER_SLURM:
            return "reclaim"
        return "adopt"

    @property
    def is_move(self) -> bool:
        return self.from_owner in (OWNER_SLURM, OWNER_KUBERNETES)

    def did(self, side: str, verb: str) -> bool:
        return f"{side}/{verb}" in self.done_verbs


class Pin(NamedTuple):
    """An operator's wish for a node: `slurm` or `kubernetes` (auto = no pin)."""

    to: str
    who: str
    why: str
    at: float
    source: str  # "operator" (operator.pinned) | "annotation" (sunkd.io/pin)


class OpenAction(NamedTuple):
    """An action requested and without an outcome yet (the outbox)."""

    action_id: str
    transition_id: str | None
    side: str
    verb: str
    node: str
    attempt: int
    reason: str
    args: tuple[Label, ...]
    requested_at: float
    seq: int


class ActionOutcome(NamedTuple):
    """The last outcome of a (side, verb) on a node: drives retries and backoff."""

    action_id: str
    transition_id: str | None
    succeeded: bool
    attempt: int
    at: float
    seq: int
    error: str = ""
    retryable: bool = False


class SourceState(NamedTuple):
    status: str  # fresh | stale | lost
    cause: str | None
    detail: str | None
    since: float  # when the status last changed
    last_fresh_at: float | None
    epoch: int = 0  # leadership term of the report: only the current term's counts (I3)


@dataclass(frozen=True, slots=True)
class NodeState:
    """Everything the log says about one node, keyed by its Slurm node name."""

    name: str
    k8s_name: str | None = None
    slurm: SlurmNodeObserved | None = None
    k8s: K8sNodeObserved | None = None
    slurm_seq: int = 0  # seq of the last Slurm observation (or vanish)
    k8s_seq: int = 0
    slurm_missing: bool = False  # seen in Slurm, then vanished
    k8s_missing: bool = False
    slurm_unhealthy_since: float | None = None
    owner: str = OWNER_NONE
    phase: Phase = Phase.UNKNOWN  # the ownership machine; see ownership.assess for HELD
    since: float | None = None  # recorded_at of the last ownership phase change
    last_move_at: float | None = None  # end of the last lend/reclaim (dwell)
    transition: OpenTransition | None = None
    pin: Pin | None = None
    # Every non-DaemonSet, non-mirror pod the Kubernetes source last reported on the node's
    # Kubernetes Node (`k8s_name`), whatever pool it serves: the whole list, replaced by
    # each report. None: no report from that Node (never reported, vanished, or the claim
    # changed hands to a Node that has not reported): *unknown*, which is never "no pods"
    # (`ownership.assess` makes the node UNKNOWN).
    pods: tuple[PodRef, ...] | None = None
    open_actions: Mapping[str, OpenAction] = field(default_factory=dict)  # by action_id
    outcomes: Mapping[str, ActionOutcome] = field(default_factory=dict)  # by "side/verb"
    # Other Kubernetes Nodes claiming this Slurm name (label sunkd.io/slurm-node-name), by
    # name: an identity conflict. The first claimant keeps `k8s`; nothing acts until one
    # of them is deleted or relabelled (ownership.assess holds the node).
    k8s_rivals: Mapping[str, K8sNodeObserved] = field(default_factory=dict)
    # When the node was last seen vanish so that neither side knows it (None while either
    # side observes it): after a grace the policy forgets it (`node.forgotten`).
    gone_since: float | None = None
    # When the node, carrying sunkd history (an owner, outcomes, a pin ...), stopped
    # matching any pool the log knows (None while it matches one, and always before the
    # log records the config-file pools): after a grace the policy forgets the history.
    unpooled_since: float | None = None
    # What sunkd itself wrote on the node and nobody changed since, as its log proves it
    # (`authorship`): the one drain and the one hold taint sunkd may lift.
    drain_mark: DrainMark | None = None
    hold_mark: HoldMark | None = None

    def open_action_on(self, side: str) -> OpenAction | None:
        for action in self.open_actions.values():
            if action.side == side:
                return action
        return None


class UnpooledNode(NamedTuple):
    """An observed node that no pool, pin or sunkd history names: only its last
    observations, so that a pool appearing later gets the node's state at once (the
    sources emit only on change). Exactly the fields a NodeState without history has:
    `expand` gives back the NodeState it stands for."""

    k8s_name: str | None
    slurm: SlurmNodeObserved | None
    k8s: K8sNodeObserved | None
    slurm_seq: int
    k8s_seq: int
    slurm_missing: bool
    k8s_missing: bool
    slurm_unhealthy_since: float | None
    gone_since: float | None
    k8s_rivals: Mapping[str, K8sNodeObserved]
    pods: tuple[PodRef, ...] | None = None

    def expand(self, name: str) -> NodeState:
        return NodeState(
            name=name, k8s_name=self.k8s_name, slurm=self.slurm, k8s=self.k8s,
            slurm_seq=self.slurm_seq, k8s_seq=self.k8s_seq, slurm_missing=self.slurm_missing,
            k8s_missing=self.k8s_missing, slurm_unhealthy_since=self.slurm_unhealthy_since,
            gone_since=self.gone_since, k8s_rivals=self.k8s_rivals, pods=self.pods)


def _record_of(node: NodeState) -> UnpooledNode:
    return UnpooledNode(node.k8s_name, node.slurm, node.k8s, node.slurm_seq, node.k8s_seq,
                        node.slurm_missing, node.k8s_missing, node.slurm_unhealthy_since,
                        node.gone_since, node.k8s_rivals, node.pods)


def without_history(node: NodeState | _NodeDraft) -> bool:
    """Nothing but observations: sunkd never owned, moved, pinned or acted on it (or
    forgot all that). Such a node is exactly its `UnpooledNode` record."""
    return (node.owner == OWNER_NONE and node.phase == Phase.UNKNOWN and node.since is None
            and node.last_move_at is None and node.transition is None and node.pin is None
            and not node.open_actions and not node.outcomes
            and node.unpooled_since is None
            and node.drain_mark is None and node.hold_mark is None)


class _PoolMatch(NamedTuple):
    """One pool's membership rule (the same as `policy.membership`'s)."""

    name: str
    partitions: frozenset[str]
    selector: frozenset[tuple[str, str]]
    nodes: frozenset[str]


def _pool_rules(nodesets: Mapping[str, K8sNodesetObserved],
                configured: tuple[ConfiguredPool, ...]) -> tuple[_PoolMatch, ...]:
    """The effective pools (a Nodeset wins a name clash, as in `effective_pools`)."""
    rules = {pool.name: _PoolMatch(pool.name, frozenset(pool.partitions),
                                   frozenset((lb.key, lb.value) for lb in pool.node_selector),
                                   frozenset(pool.nodes)) for pool in configured}
    for nodeset in nodesets.values():
        if not nodeset.deleted:
            rules[nodeset.pool] = _PoolMatch(
                nodeset.pool, frozenset(nodeset.partitions),
                frozenset((lb.key, lb.value) for lb in nodeset.node_selector), frozenset())
    return tuple(rules[name] for name in sorted(rules))


def _in_a_pool(rules: tuple[_PoolMatch, ...], node: NodeState | _NodeDraft) -> bool:
    """A pool, a pin or an open transition names the node (membership keeps a moving
    node in its transition's pool)."""
    if node.transition is not None or node.pin is not None:
        return True
    labels: frozenset[tuple[str, str]] | None = None
    for rule in rules:
        if node.name in rule.nodes:
            return True
        if rule.selector:
            if node.k8s is None:
                continue
            if labels is None:
                labels = frozenset((label.key, label.value) for label in node.k8s.labels)
            if rule.selector <= labels:
                return True
            continue
        if rule.nodes or not rule.partitions or node.slurm is None:
            continue
        if not rule.partitions.isdisjoint(node.slurm.partitions):
            return True
    return False


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: Mapping[str, NodeState] = field(default_factory=dict)
    k8s_names: Mapping[str, str] = field(default_factory=dict)  # k8s node -> slurm node
    # The last pod report of every Kubernetes Node, by Node name (rivals and Nodes of no
    # pool included): a claim that changes hands finds its successor's pods here.
    pod_reports: Mapping[str, tuple[PodRef, ...]] = field(default_factory=dict)
    # Observed nodes that no pool, pin or sunkd history names (compact: observations only),
    # once the log records the config-file pools (`configured_pools` not None); before
    # that, as in logs older than `pools.configured`, every node is in `nodes`.
    unpooled: Mapping[str, UnpooledNode] = field(default_factory=dict)
    configured_pools: tuple[ConfiguredPool, ...] | None = None
    nodesets: Mapping[str, K8sNodesetObserved] = field(default_factory=dict)  # by pool
    slurm_demand: Mapping[str, SlurmDemandObserved] = field(default_factory=dict)  # partition
    k8s_demand: Mapping[str, K8sDemandObserved] = field(default_factory=dict)  # by pool
    sources: Mapping[str, SourceState] = field(default_factory=dict)
    # Per pool: recorded_at of the first k8s.demand.observed of the current unbroken run of
    # non-empty pending lists (absent while nothing is pending). How long Kubernetes'
    # demand has waited: the policy's starvation bound reads it (policy/fairness.py).
    k8s_pending_since: Mapping[str, float] = field(default_factory=dict)
    # Per pool: (since, ended) of the last unbroken run of pending pods that lasted at
    # least `STARVATION_BOUND_SECONDS` (the first pending list and the first empty one
    # after it; shorter runs do not replace it). The starvation rule's hysteresis reads
    # it: a starvation that just ended still protects what Kubernetes won for a while,
    # whatever short waits follow it (policy/fairness.py).
    k8s_pending_last: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # Per pool: the bounded summary of its Kubernetes demand over time and of its lends'
    # durations, from which the policy forecasts (domain/forecast.py).
    demand_history: Mapping[str, DemandSummary] = field(default_factory=dict)
    # Per partition: recorded_at of the first slurm.demand.observed reporting a head job
    # (`head_job`) since jobs last stopped waiting for nodes (any head job: it runs on
    # when one head job starts and the next takes its place; absent once no job waits for
    # nodes, `head_job` and `pending_nodes` 0). How long the partition has waited without
    # a break: the policy's reservation bound reads it (policy/fairness.py).
    slurm_head_since: Mapping[str, float] = field(default_factory=dict)
    leader_epoch: int = 0
    leader_identity: str = ""
    last_seq: int = 0
    last_recorded_at: float | None = None

    def source_fresh(self, source: str) -> bool:
        """Fresh, as observed in the current leadership term: a new leader must not act
        on what the previous term's sources saw (it may be a whole outage old)."""
        health = self.sources.get(source)
        return (
            health is not None
            and health.status == SOURCE_FRESH
            and health.epoch >= self.leader_epoch
        )

    def sources_fresh(self) -> bool:
        """Both sources fresh in the current term: what deciding anything, running the
        previous term's actions and a Nodeset's Ready condition all wait for."""
        return self.source_fresh(OWNER_SLURM) and self.source_fresh(OWNER_KUBERNETES)

    def pending_actions(self) -> list[OpenAction]:
        """Requested actions without an outcome, oldest first (what the outbox runs)."""
        pending = [a for node in self.nodes.values() for a in node.open_actions.values()]
        pending.sort(key=lambda action: action.seq)
        return pending


EMPTY = ClusterState()


# ------------------------------------------------------------------------------ fold

_NODE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NodeState))


class _NodeDraft:
    """A mutable copy of a NodeState, private to one fold call."""

    __slots__ = _NODE_FIELDS

    name: str
    k8s_name: str | None
    slurm: SlurmNodeObserved | None
    k8s: K8sNodeObserved | None
    slurm_seq: int
    k8s_seq: int
    slurm_missing: bool
    k8s_missing: bool
    slurm_unhealthy_since: float | None
    owner: str
    phase: Phase
    since: float | None
    last_move_at: float | None
    transition: OpenTransition | None
    pin: Pin | None
    pods: tuple[PodRef, ...] | None
    open_actions: Mapping[str, OpenAction]
    outcomes: Mapping[str, ActionOutcome]
    k8s_rivals: Mapping[str, K8sNodeObserved]
    gone_since: float | None
    unpooled_since: float | None
    drain_mark: DrainMark | None
    hold_mark: HoldMark | None

    def __init__(self, node: NodeState) -> None:
        for name in _NODE_FIELDS:
            setattr(self, name, getattr(node, name))

    def freeze(self) -> NodeState:
        return NodeState(*[getattr(self, name) for name in _NODE_FIELDS])


class _Builder:
    """Applies events to copies of the containers of a base state (copy-on-write)."""

    def __init__(self, base: ClusterState) -> None:
        self.base = base
        self.nodes: dict[str, NodeState] | None = None
        self.drafts: dict[str, _NodeDraft] = {}
        self.forgotten: set[str] = set()
        self.k8s_names: dict[str, str] | None = None
        self.pod_reports: dict[str, tuple[PodRef, ...]] | None = None
        self.configured_pools = base.configured_pools
        # Pool-aware (the log records the config-file pools): nodes touched by the current
        # event, settled after it (`settle`); the pool rules, rebuilt when pools change.
        self.aware = base.configured_pools is not None
        self.touched: list[str] = []
        self._rules: tuple[_PoolMatch, ...] | None = None
        self.nodesets: dict[str, K8sNodesetObserved] | None = None
        self.slurm_demand: dict[str, SlurmDemandObserved] | None = None
        self.k8s_demand: dict[str, K8sDemandObserved] | None = None
        self.k8s_pending_since: dict[str, float] | None = None
        self.k8s_pending_last: dict[str, tuple[float, float]] | None = None
        self.demand_history: dict[str, DemandSummary] | None = None
        self.slurm_head_since: dict[str, float] | None = None
        self.sources: dict[str, SourceState] | None = None
        self.leader_epoch = base.leader_epoch
        self.leader_identity = base.leader_identity
        self.last_seq = base.last_seq
        self.last_recorded_at = base.last_recorded_at

    def draft(self, name: str) -> _NodeDraft:
        """The node's draft; in a pool-aware fold, settled after the event (`settle`)."""
        draft = self.quiet_draft(name)
        if self.aware:
            self.touched.append(name)
        return draft

    def quiet_draft(self, name: str) -> _NodeDraft:
        """The node's draft, not settled: for the hot observation handlers, which mark
        the node touched only when what a pool matches on changed."""
        draft = self.drafts.get(name)
        if draft is None:
            node = None
            if name not in self.forgotten:
                node = self.base.nodes.get(name)
                if node is None:
                    record = self.base.unpooled.get(name)
                    node = record.expand(name) if record is not None else None
            self.forgotten.discard(name)
            draft = _NodeDraft(node if node is not None else NodeState(name=name))
            self.drafts[name] = draft
        return draft

    def rules(self) -> tuple[_PoolMatch, ...]:
        if self._rules is None:
            nodesets = self.nodesets if self.nodesets is not None else self.base.nodesets
            self._rules = _pool_rules(nodesets, self.configured_pools or ())
        return self._rules

    def settle(self, at: float) -> None:
        """After an event: when a node with history stopped matching any pool (the
        policy forgets its history after a grace: `node.forgotten`)."""
        rules = self.rules()
        for name in self.touched:
            d = self.drafts.get(name)
            if d is None:
                continue
            if _in_a_pool(rules, d):
                d.unpooled_since = None
            elif d.unpooled_since is None and not without_history(d):
                d.unpooled_since = at
        self.touched.clear()

    def repool(self, at: float) -> None:
        """The set of pools changed (a Nodeset, the config-file pools) at `at`: every node
        may now match or not. Drafts only the nodes whose place or clock changes."""
        self._rules = None
        if not self.aware:
            return
        rules = self.rules()
        base = self.base
        for name, node in base.nodes.items():
            if name in self.drafts or name in self.forgotten:
                continue
            matched = _in_a_pool(rules, node)
            if without_history(node):
                if not matched:
                    self.draft(name)  # to the compact record at build()
            elif (node.unpooled_since is None) == (not matched):
                self.draft(name)
        for name, record in base.unpooled.items():
            if name in self.drafts or name in self.forgotten:
                continue
            if _in_a_pool(rules, record.expand(name)):
                self.draft(name)
        self.touched = list(self.drafts)
        self.settle(at)

    def history(self, pool: str) -> DemandSummary:
        found = self.demand_history if self.demand_history is not None \
            else self.base.demand_history
        return found.get(pool) or DemandSummary()

    def set_history(self, pool: str, summary: DemandSummary) -> None:
        if self.demand_history is None:
            self.demand_history = dict(self.base.demand_history)
        self.demand_history[pool] = summary

    def reports(self) -> Mapping[str, tuple[PodRef, ...]]:
        return self.pod_reports if self.pod_reports is not None else self.base.pod_reports

    def writable_reports(self) -> dict[str, tuple[PodRef, ...]]:
        if self.pod_reports is None:
            self.pod_reports = dict(self.base.pod_reports)
        return self.pod_reports

    def slurm_name_of(self, k8s_name: str) -> str:
        names = self.k8s_names if self.k8s_names is not None else self.base.k8s_names
        return names.get(k8s_name, k8s_name)

    def build(self) -> ClusterState:
        base = self.base
        nodes: Mapping[str, NodeState] = base.nodes
        unpooled: Mapping[str, UnpooledNode] = base.unpooled
        if self.drafts or self.forgotten:
            copied = dict(base.nodes)
            records = dict(base.unpooled) if self.aware else None
            for name in self.forgotten:
                copied.pop(name, None)
                if records is not None:
                    records.pop(name, None)
            rules = self.rules() if self.aware else ()
            for name, draft in self.drafts.items():
                node = draft.freeze()
                if records is not None and without_history(node) and not _in_a_pool(
                        rules, node):
                    copied.pop(name, None)
                    records[name] = _record_of(node)
                    continue
                copied[name] = node
                if records is not None:
                    records.pop(name, None)
            nodes = copied
            if records is not None:
                unpooled = records
        return ClusterState(
            nodes=nodes,
            unpooled=unpooled,
            configured_pools=self.configured_pools,
            k8s_names=self.k8s_names if self.k8s_names is not None else base.k8s_names,
            pod_reports=self.pod_reports if self.pod_reports is not None else base.pod_reports,
            nodesets=self.nodesets if self.nodesets is not None else base.nodesets,
            slurm_demand=(
                self.slurm_demand if self.slurm_demand is not None else base.slurm_demand
            ),
            k8s_demand=self.k8s_demand if self.k8s_demand is not None else base.k8s_demand,
            k8s_pending_since=(
                self.k8s_pending_since if self.k8s_pending_since is not None
                else base.k8s_pending_since
            ),
            k8s_pending_last=(
                self.k8s_pending_last if self.k8s_pending_last is not None
                else base.k8s_pending_last
            ),
            demand_history=(
                self.demand_history if self.demand_history is not None
                else base.demand_history
            ),
            slurm_head_since=(
                self.slurm_head_since if self.slurm_head_since is not None
                else base.slurm_head_since
            ),
            sources=self.sources if self.sources is not None else base.sources,
            leader_epoch=self.leader_epoch,
            leader_identity=self.leader_identity,
            last_seq=self.last_seq,
            last_recorded_at=self.last_recorded_at,
        )


_HEALTHY_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED"})


def _at(event: RecordedEvent) -> float:
    return event.recorded_at.timestamp()


def _on_slurm_node(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    # The hottest path of a replay: keep it to a few attribute stores.
    name = p.node or event.subject
    d = b.drafts.get(name) or b.quiet_draft(name)
    if b.aware and (d.slurm is None or d.slurm.partitions != p.partitions):
        b.touched.append(name)  # a partition pool may match it now, or no longer
    if (p.flags or p.state not in _HEALTHY_STATES) and slurm_unhealthy(p):
        if d.slurm_unhealthy_since is None:
            d.slurm_unhealthy_since = _at(event)
    elif d.slurm_unhealthy_since is not None:
        d.slurm_unhealthy_since = None
    if d.drain_mark is not None:
        d.drain_mark = marks.follow_drain(d.drain_mark, p, _at(event))
    d.slurm = p
    d.slurm_seq = seq
    d.slurm_missing = False
    d.gone_since = None


def _on_slurm_vanished(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    d = b.draft(p.node or subject)
    d.slurm = None
    d.slurm_seq = seq
    d.slurm_missing = True
    d.slurm_unhealthy_since = None
    d.drain_mark = None
    if d.k8s is None:
        d.gone_since = _at(event)


def _on_k8s_node(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    observation: K8sNodeObserved = p
    k8s_name = observation.node or event.subject
    name = observation.slurm_node or k8s_name
    names = b.k8s_names if b.k8s_names is not None else b.base.k8s_names
    old_name = names.get(k8s_name)
    if old_name != name:
        if b.k8s_names is None:
            b.k8s_names = dict(b.base.k8s_names)
        b.k8s_names[k8s_name] = name
        if old_name is not None:
            _release_claim(b, b.draft(old_name), k8s_name, seq)
    d = b.drafts.get(name) or b.quiet_draft(name)
    if d.k8s is not None and d.k8s_name not in (None, k8s_name):
        # A second Node claims this Slurm name: an identity conflict, never a takeover.
        rivals = dict(d.k8s_rivals)
        rivals[k8s_name] = observation
        d.k8s_rivals = rivals
        return
    previous = d.k8s
    if b.aware and (previous is None or previous.labels != observation.labels):
        b.touched.append(name)  # a selector may match it now, or no longer
    d.gone_since = None
    if observation.pin != (previous.pin if previous is not None else None):
        d.pin = _pin(observation.pin, "annotation", f"annotation sunkd.io/pin on {k8s_name}",
                     "", _at(event))
    if d.k8s_name != k8s_name:  # a new claimant: its own report, or unknown
        d.pods = b.reports().get(k8s_name) if d.k8s_name is None else None
    if d.hold_mark is not None:
        d.hold_mark = marks.follow_hold(d.hold_mark, observation, _at(event))
    d.k8s = observation
    d.k8s_name = k8s_name
    d.k8s_seq = seq
    d.k8s_missing = False


def _release_claim(b: _Builder, d: _NodeDraft, k8s_name: str, seq: int) -> None:
    """`k8s_name` no longer claims this Slurm node (deleted or relabelled). The pods the
    node holds follow the claim: a successor's own report, or unknown."""
    if k8s_name in d.k8s_rivals:
        rivals = dict(d.k8s_rivals)
        del rivals[k8s_name]
        d.k8s_rivals = rivals
        return
    if d.k8s_name != k8s_name:
        return
    d.hold_mark = None  # another Node object (or none) is the node's Kubernetes side now
    if d.k8s_rivals:  # the remaining claimant is the node's Kubernetes side now
        rivals = dict(d.k8s_rivals)
        successor = sorted(rivals)[0]
        d.k8s, d.k8s_name = rivals.pop(successor), successor
        d.k8s_rivals = rivals
        d.k8s_seq = seq
        # Unknown until the successor reports after the hand-over (the Kubernetes source
        # reports every claimant again when a claim is released): what the departed
        # claimant ran is not vouched for by a report the successor made before.
        d.pods = None
        return
    d.k8s = None
    d.k8s_seq = seq
    d.k8s_missing = True
    d.pods = None


def _on_k8s_vanished(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    k8s_name = p.node or subject
    if k8s_name in b.reports():  # its pods went with it
        del b.writable_reports()[k8s_name]
    d = b.draft(b.slurm_name_of(k8s_name))
    if d.k8s_name is None or d.k8s_name == k8s_name or k8s_name in d.k8s_rivals:
        _release_claim(b, d, k8s_name, seq)
        if d.k8s is None:
            d.k8s_missing = True
    else:  # older logs: a vanish for the node's only name
        d.k8s = None
        d.k8s_seq = seq
        d.k8s_missing = True
        d.pods = None
        d.hold_mark = None
    if d.k8s is None and d.slurm is None:
        d.gone_since = _at(event)


def _on_workload(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    """A Kubernetes Node's whole pod list (reports before per-Node reports named a pool;
    each already listed every pod on the Node, so the last one is the whole list too).
    It replaces the Node's report; it becomes the Slurm node's pods only when that Node
    is the node's claimant: a rival's report never touches the claimed node's pods."""
    observation: K8sWorkloadObserved = p
    k8s_name = observation.node or event.subject
    pods: tuple[PodRef, ...] | None = observation.pods
    if observation.pool:
        # The forecast's reading: nodes running the pool's pods, counted on change (a
        # Node whose report is dropped or unknown stops counting when next reported).
        was = _runs_pods(b.reports().get(k8s_name))
        now = observation.complete and _runs_pods(observation.pods)
        if was != now:
            summary = b.history(observation.pool)
            b.set_history(observation.pool, forecast.observe(
                summary, _at(event), busy=summary.busy + (1 if now else -1)))
    if observation.complete:
        b.writable_reports()[k8s_name] = observation.pods
    else:  # the source could not record them: unknown, not none
        pods = None
        if k8s_name in b.reports():
            del b.writable_reports()[k8s_name]
    name = b.slurm_name_of(k8s_name)
    d = b.drafts.get(name)
    if d is None:
        if name in b.forgotten or (name not in b.base.nodes and name not in b.base.unpooled):
            return  # no node claims it yet: its report waits in `pod_reports`
        d = b.quiet_draft(name)
    if d.k8s_name == k8s_name and d.k8s is not None:
        d.pods = pods
        if observation.pool:
            summary = b.history(observation.pool)
            sized = forecast.observe_node(summary, d.k8s.gpus, d.k8s.cpu_millis)
            if sized is not summary:
                b.set_history(observation.pool, sized)


def _runs_pods(pods: tuple[PodRef, ...] | None) -> bool:
    return bool(pods) and any(pod.phase not in ("Succeeded", "Failed") for pod in pods or ())


def _on_slurm_demand(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    if b.slurm_demand is None:
        b.slurm_demand = dict(b.base.slurm_demand)
    partition = p.partition or subject
    b.slurm_demand[partition] = p
    # The reservation clock: it starts with the first head job reported and runs, across
    # head jobs, while anything waits for nodes. A new head job is the previous one
    # started (it gathered its nodes) and the next in line: the partition has waited
    # all along (counted per job, heads changing more often than the bound would never
    # reach it).
    since = b.slurm_head_since if b.slurm_head_since is not None else b.base.slurm_head_since
    waiting = p.head_job > 0 or p.pending_nodes > 0
    if (p.head_job > 0 and partition not in since) or (not waiting and partition in since):
        if b.slurm_head_since is None:
            b.slurm_head_since = dict(b.base.slurm_head_since)
        if waiting:
            b.slurm_head_since[partition] = _at(event)
        else:
            del b.slurm_head_since[partition]


def _on_k8s_demand(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    if b.k8s_demand is None:
        b.k8s_demand = dict(b.base.k8s_demand)
    pool = p.pool or subject
    b.k8s_demand[pool] = p
    b.set_history(pool, forecast.observe(b.history(pool), _at(event),
                                         pending=_pending_nodes(b, p)))
    since = b.k8s_pending_since if b.k8s_pending_since is not None else b.base.k8s_pending_since
    if bool(p.pending) != (pool in since):
        if b.k8s_pending_since is None:
            b.k8s_pending_since = dict(b.base.k8s_pending_since)
        if p.pending:
            b.k8s_pending_since[pool] = _at(event)
        else:
            started, ended = b.k8s_pending_since.pop(pool), _at(event)
            if ended - started >= STARVATION_BOUND_SECONDS:
                if b.k8s_pending_last is None:
                    b.k8s_pending_last = dict(b.base.k8s_pending_last)
                b.k8s_pending_last[pool] = (started, ended)


def _pending_nodes(b: _Builder, demand: K8sDemandObserved) -> int:
    """Nodes the pending pods need, by their GPU and CPU requests against the largest
    Kubernetes node the pool's history has seen (one per pod until one is seen)."""
    pending = demand.pending
    summary = b.history(demand.pool)
    return forecast.pending_nodes(sum(max(p.gpus, 0) for p in pending),
                                  sum(max(p.cpu_millis, 0) for p in pending),
                                  summary.node_gpus, summary.node_cpu_millis, len(pending))


def _on_nodeset(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    nodeset: K8sNodesetObserved = p
    if b.nodesets is None:
        b.nodesets = dict(b.base.nodesets)
    pool = nodeset.pool or subject
    if nodeset.deleted:
        b.nodesets.pop(pool, None)
    else:
        b.nodesets[pool] = nodeset
    b.repool(_at(event))


def _on_pools_configured(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    configured: PoolsConfigured = p
    b.configured_pools = configured.pools
    b.aware = True
    b.repool(_at(event))


def _on_health(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    health: SourceHealth = p
    if b.sources is None:
        b.sources = dict(b.base.sources)
    source = health.source or subject
    previous = b.sources.get(source)
    since = at if previous is None or previous.status != health.status else previous.since
    last_fresh = previous.last_fresh_at if previous is not None else None
    if health.status == SOURCE_FRESH:
        last_fresh = at
    b.sources[source] = SourceState(health.status, health.cause, health.detail, since, last_fresh,
                                    event.epoch)


def _pin(to: str | None, source: str, who: str, why: str, at: float) -> Pin | None:
    if to is None or to == "auto" or to == "":
        return None
    return Pin(to=to, who=who, why=why, at=at, source=source)


def _on_pinned(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    pinned: OperatorPinned = p
    d = b.draft(pinned.node or subject)
    d.pin = _pin(pinned.to, "operator", pinned.who, pinned.why, at)


def _owner_phase(owner: str) -> Phase:
    if owner == OWNER_SLURM:
        return Phase.SLURM
    if owner == OWNER_KUBERNETES:
        return Phase.KUBERNETES
    return Phase.UNKNOWN


def _on_started(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    started: TransitionStarted = p
    d = b.draft(started.node or subject)
    d.transition = OpenTransition(
        transition_id=started.transition_id,
        pool=started.pool,
        from_owner=started.from_owner or OWNER_NONE,
        to_owner=started.to_owner,
        started_at=at,
        reason=started.reason,
    )
    d.phase = Phase.TO_K8S if started.to_owner == OWNER_KUBERNETES else Phase.TO_SLURM
    d.since = at


def _on_ended(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    ended: TransitionCompleted | TransitionAborted = p
    d = b.draft(ended.node or subject)
    transition = d.transition
    if transition is None or transition.transition_id != ended.transition_id:
        return  # stale or foreign reference: the log keeps it, the state ignores it
    if isinstance(ended, TransitionCompleted):
        d.owner = transition.to_owner
        if transition.direction == "lend" and transition.pool:
            b.set_history(transition.pool, forecast.observe_lend(
                b.history(transition.pool), at - transition.started_at))
    else:
        d.owner = transition.from_owner
    d.phase = _owner_phase(d.owner)
    d.transition = None
    d.since = at
    if transition.is_move:
        d.last_move_at = at


def _on_requested(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    requested: ActionRequested = p
    d = b.draft(requested.node or subject)
    d.open_actions = {
        **d.open_actions,
        requested.action_id: OpenAction(
            action_id=requested.action_id,
            transition_id=requested.transition_id,
            side=requested.side,
            verb=requested.verb,
            node=requested.node or subject,
            attempt=requested.attempt,
            reason=requested.reason,
            args=requested.args,
            requested_at=at,
            seq=seq,
        ),
    }


def _on_outcome(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = _at(event)
    outcome: ActionSucceeded | ActionFailed = p
    d = b.draft(outcome.node or subject)
    key = f"{outcome.side}/{outcome.verb}"
    succeeded = isinstance(outcome, ActionSucceeded)
    if key in _MARKING:
        retryable = False if succeeded else outcome.retryable  # type: ignore[union-attr]
        _mark(d, key, d.open_actions.get(outcome.action_id), succeeded, retryable, at)
    if outcome.action_id in d.open_actions:
        open_actions = dict(d.open_actions)
        del open_actions[outcome.action_id]
        d.open_actions = open_actions
    d.outcomes = {
        **d.outcomes,
        key: ActionOutcome(
            action_id=outcome.action_id,
            transition_id=outcome.transition_id,
            succeeded=succeeded,
            attempt=outcome.attempt,
            at=at,
            seq=seq,
            error="" if succeeded else outcome.error,  # type: ignore[union-attr]
            retryable=False if succeeded else outcome.retryable,  # type: ignore[union-attr]
        ),
    }
    transition = d.transition
    if (
        succeeded
        and transition is not None
        and outcome.transition_id == transition.transition_id
        and key not in transition.done_verbs
    ):
        d.transition = transition._replace(
            done_verbs=tuple(sorted((*transition.done_verbs, key)))
        )


_MARKING = frozenset({marks.DRAIN, marks.UNDRAIN, marks.HOLD, marks.UNHOLD})


def _mark(d: _NodeDraft, key: str, action: OpenAction | None, succeeded: bool,
          retryable: bool, at: float) -> None:
    """A drain or hold sunkd may have written (a success, or a retryable failure such as
    a timeout or an unconfirmed write, which may have landed) is marked as sunkd's; an
    undrain or unhold that succeeded drops the mark. A refusal wrote nothing."""
    if key == marks.DRAIN:
        if (succeeded or retryable) and action is not None:
            reason = marks.requested_reason(action.args, action.reason)
            d.drain_mark = marks.drain_written(reason, d.slurm, at)
    elif key == marks.HOLD:
        if succeeded or retryable:
            d.hold_mark = marks.hold_written(d.k8s, at)
    elif succeeded:  # an undrain or unhold (a failed one may have left the mark in place)
        if key == marks.UNDRAIN:
            d.drain_mark = None
        else:
            d.hold_mark = None


def _on_forgotten(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    name = p.node or event.subject
    d = b.draft(name)
    if d.slurm is not None or d.k8s is not None or d.k8s_rivals:
        # Still observed (it left every pool): forget what sunkd did, keep what the
        # sources see, so a pool that takes it later starts from the live node.
        d.owner, d.phase, d.since, d.last_move_at = OWNER_NONE, Phase.UNKNOWN, None, None
        d.transition, d.pin, d.unpooled_since = None, None, None
        d.open_actions, d.outcomes = {}, {}
        d.drain_mark, d.hold_mark = None, None  # unproven from now on: foreign (fail closed)
        return
    b.drafts.pop(name, None)
    b.forgotten.add(name)
    names = b.k8s_names if b.k8s_names is not None else b.base.k8s_names
    stale = [k8s for k8s, slurm in names.items() if slurm == name or k8s == name]
    if stale:
        if b.k8s_names is None:
            b.k8s_names = dict(b.base.k8s_names)
        for k8s in stale:
            del b.k8s_names[k8s]


def _on_leader(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    elected: LeaderElected = p
    if elected.epoch >= b.leader_epoch:
        b.leader_epoch = elected.epoch
        b.leader_identity = elected.identity


def _on_archived(b: _Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    """`log.archived` changes nothing the policy decides on: archived events stay
    folded into the state (the archive's base snapshot holds them), so only `last_seq`
    moves, as for every event."""
    return None


_HANDLERS: dict[type[Payload], Any] = {
    SlurmNodeObserved: _on_slurm_node,
    SlurmNodeVanished: _on_slurm_vanished,
    SlurmDemandObserved: _on_slurm_demand,
    K8sNodeObserved: _on_k8s_node,
    K8sNodeVanished: _on_k8s_vanished,
    K8sWorkloadObserved: _on_workload,
    K8sDemandObserved: _on_k8s_demand,
    K8sNodesetObserved: _on_nodeset,
    SourceHealth: _on_health,
    OperatorPinned: _on_pinned,
    TransitionStarted: _on_started,
    TransitionCompleted: _on_ended,
    TransitionAborted: _on_ended,
    ActionRequested: _on_requested,
    ActionSucceeded: _on_outcome,
    ActionFailed: _on_outcome,
    LeaderElected: _on_leader,
    PoolsConfigured: _on_pools_configured,
    LogArchived: _on_archived,
    NodeForgotten: _on_forgotten,
    SlurmHookReceived: lambda *_: None,  # a hint: the read it caused is what counts
}


def fold(events: Iterable[RecordedEvent], state: ClusterState = EMPTY) -> ClusterState:
    """The state after applying `events` (in log order) to `state`.

    Events at or below `state.last_seq` are skipped, so folding an overlapping tail
    onto a snapshot is safe. Unknown payload types only advance `last_seq`.
    """
    builder = _Builder(state)
    handlers = _HANDLERS
    last_seq = builder.last_seq
    last_event: RecordedEvent | None = None
    for event in events:
        seq = event.seq
        if seq <= last_seq:
            continue
        last_seq = seq
        last_event = event
        payload = event.payload
        handler = handlers.get(type(payload))
        if handler is not None:
            handler(builder, payload, seq, event)
            if builder.touched:
                builder.settle(_at(event))
    builder.last_seq = last_seq
    if last_event is not None:
        builder.last_recorded_at = _at(last_event)
    return builder.build()


def apply(state: ClusterState, event: RecordedEvent) -> ClusterState:
    """The state after one event. Prefer `fold` for batches: it copies containers once."""
    return fold((event,), state)
