"""The state the fold computes: `ClusterState` and its per-node `NodeState`.

sunkd never keeps state that is not derivable from the log (docs/architecture.md):
the in-memory `ClusterState` is a cache of `fold(events)` (`sunkd.domain.fold`),
snapshots are `state_to_json(fold(prefix))`, and a restart is
`fold(tail, state_from_json(snapshot))`.

What the state stores is the *evidence*: the last observation of each node on both
sides, the ownership-machine phase recorded by transition events, pins, open actions
and their outcomes, demand, source health. What the evidence *means* at a given
moment (HELD, UNKNOWN, hold reasons) depends on `now` (grace periods) and lives in
`sunkd.domain.ownership.assess`.

States are immutable values: the fold builds a new state and never mutates its input,
so any earlier state stays valid as a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from sunkd.domain import wellknown as wk
from sunkd.domain.authorship import DrainMark, HoldMark
from sunkd.domain.events import (
    ConfiguredPool,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    Label,
    PodRef,
    SlurmDemandObserved,
    SlurmNodeObserved,
)
from sunkd.domain.forecast import DemandSummary
from sunkd.domain.slurmnode import (
    KNOWN_USABLE_STATES,
    UNHEALTHY_FLAGS,
    UNHEALTHY_STATES,
)

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
# At most this many Slurm node names per Nodeset in `ClusterState.slurmd_created` (one per
# Kubernetes Node: a larger pool keeps its newest creates, and an older name is then not
# proven sunkd's: its record is never deleted, fail closed).
SLURMD_CREATED_MAX = 16384


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
        if self.from_owner == wk.OWNER_SLURM and self.to_owner == wk.OWNER_KUBERNETES:
            return "lend"
        if self.from_owner == wk.OWNER_KUBERNETES and self.to_owner == wk.OWNER_SLURM:
            return "reclaim"
        return "adopt"

    @property
    def is_move(self) -> bool:
        return self.from_owner in (wk.OWNER_SLURM, wk.OWNER_KUBERNETES)

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

    @classmethod
    def of(cls, node: NodeState) -> UnpooledNode:
        """The record of a node without history (`expand`'s inverse)."""
        return cls(node.k8s_name, node.slurm, node.k8s, node.slurm_seq, node.k8s_seq,
                   node.slurm_missing, node.k8s_missing, node.slurm_unhealthy_since,
                   node.gone_since, node.k8s_rivals, node.pods)

    def expand(self, name: str) -> NodeState:
        return NodeState(
            name=name, k8s_name=self.k8s_name, slurm=self.slurm, k8s=self.k8s,
            slurm_seq=self.slurm_seq, k8s_seq=self.k8s_seq, slurm_missing=self.slurm_missing,
            k8s_missing=self.k8s_missing, slurm_unhealthy_since=self.slurm_unhealthy_since,
            gone_since=self.gone_since, k8s_rivals=self.k8s_rivals, pods=self.pods)


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
    # Per Nodeset uid: the Slurm node names sunkd's log shows it created a slurmd pod for
    # under that Nodeset (a `slurmd-create` that succeeded), oldest first, at most
    # `SLURMD_CREATED_MAX` (the oldest go first). The proof of authorship a defunct
    # Dynamic record needs before sunkd deletes it (`domain/slurmddefunct.py`): a record
    # someone else made with the Nodeset's feature was never one of sunkd's pods'. Bounded:
    # a Nodeset's deletion drops its entry; a record Slurm no longer lists (deleted by
    # sunkd or anyone) drops its name, so a record made again under that name by someone
    # else is not taken for sunkd's.
    slurmd_created: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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
        return self.source_fresh(wk.OWNER_SLURM) and self.source_fresh(wk.OWNER_KUBERNETES)

    def pending_actions(self) -> list[OpenAction]:
        """Requested actions without an outcome, oldest first (what the outbox runs)."""
        pending = [a for node in self.nodes.values() for a in node.open_actions.values()]
        pending.sort(key=lambda action: action.seq)
        return pending


EMPTY = ClusterState()
