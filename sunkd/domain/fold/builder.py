"""The fold's working copy: `Builder` applies one batch of events to copies of the
containers of a base state (copy-on-write) and builds the next `ClusterState`.

A node touched by the batch gets a mutable `NodeDraft`, frozen back into a `NodeState`
at `build()`; containers nobody touched are shared with the base state, so a fold that
changes one node costs one node, and any earlier state stays valid as a snapshot. The
event handlers (`slurm`, `kubernetes`, `decisions`) write only through a `Builder`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sunkd.domain.authorship import DrainMark, HoldMark
from sunkd.domain.events import (
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    PodRef,
    RecordedEvent,
    SlurmDemandObserved,
    SlurmNodeObserved,
)
from sunkd.domain.fold.pools import PoolMatch, in_a_pool, pool_rules, without_history
from sunkd.domain.forecast import DemandSummary
from sunkd.domain.state import (
    ActionOutcome,
    ClusterState,
    NodeState,
    OpenAction,
    OpenTransition,
    Phase,
    Pin,
    SourceState,
    UnpooledNode,
)


def event_time(event: RecordedEvent) -> float:
    """When the event was recorded: the fold's only clock."""
    return event.recorded_at.timestamp()


_NODE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NodeState))


class NodeDraft:
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


class Builder:
    """Applies events to copies of the containers of a base state (copy-on-write)."""

    def __init__(self, base: ClusterState) -> None:
        self.base = base
        self.nodes: dict[str, NodeState] | None = None
        self.drafts: dict[str, NodeDraft] = {}
        self.forgotten: set[str] = set()
        self.k8s_names: dict[str, str] | None = None
        self.pod_reports: dict[str, tuple[PodRef, ...]] | None = None
        self.configured_pools = base.configured_pools
        # Pool-aware (the log records the config-file pools): nodes touched by the current
        # event, settled after it (`settle`); the pool rules, rebuilt when pools change.
        self.aware = base.configured_pools is not None
        self.touched: list[str] = []
        self._rules: tuple[PoolMatch, ...] | None = None
        self.nodesets: dict[str, K8sNodesetObserved] | None = None
        self.slurm_demand: dict[str, SlurmDemandObserved] | None = None
        self.k8s_demand: dict[str, K8sDemandObserved] | None = None
        self.k8s_pending_since: dict[str, float] | None = None
        self.k8s_pending_last: dict[str, tuple[float, float]] | None = None
        self.demand_history: dict[str, DemandSummary] | None = None
        self.slurm_head_since: dict[str, float] | None = None
        self.sources: dict[str, SourceState] | None = None
        self.slurmd_created: dict[str, tuple[str, ...]] | None = None
        self.leader_epoch = base.leader_epoch
        self.leader_identity = base.leader_identity
        self.last_seq = base.last_seq
        self.last_recorded_at = base.last_recorded_at

    def draft(self, name: str) -> NodeDraft:
        """The node's draft; in a pool-aware fold, settled after the event (`settle`)."""
        draft = self.quiet_draft(name)
        if self.aware:
            self.touched.append(name)
        return draft

    def quiet_draft(self, name: str) -> NodeDraft:
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
            draft = NodeDraft(node if node is not None else NodeState(name=name))
            self.drafts[name] = draft
        return draft

    def rules(self) -> tuple[PoolMatch, ...]:
        if self._rules is None:
            nodesets = self.nodesets if self.nodesets is not None else self.base.nodesets
            self._rules = pool_rules(nodesets, self.configured_pools or ())
        return self._rules

    def settle(self, at: float) -> None:
        """After an event: when a node with history stopped matching any pool (the
        policy forgets its history after a grace: `node.forgotten`)."""
        rules = self.rules()
        for name in self.touched:
            d = self.drafts.get(name)
            if d is None:
                continue
            if in_a_pool(rules, d):
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
            matched = in_a_pool(rules, node)
            if without_history(node):
                if not matched:
                    self.draft(name)  # to the compact record at build()
            elif (node.unpooled_since is None) == (not matched):
                self.draft(name)
        for name, record in base.unpooled.items():
            if name in self.drafts or name in self.forgotten:
                continue
            if in_a_pool(rules, record.expand(name)):
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

    def created(self) -> Mapping[str, tuple[str, ...]]:
        return self.slurmd_created if self.slurmd_created is not None \
            else self.base.slurmd_created

    def set_created(self, uid: str, names: tuple[str, ...]) -> None:
        """The Slurm node names sunkd created a slurmd pod for under Nodeset `uid`
        (empty: the entry goes)."""
        if self.slurmd_created is None:
            self.slurmd_created = dict(self.base.slurmd_created)
        if names:
            self.slurmd_created[uid] = names
        else:
            self.slurmd_created.pop(uid, None)

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
                if records is not None and without_history(node) and not in_a_pool(
                        rules, node):
                    copied.pop(name, None)
                    records[name] = UnpooledNode.of(node)
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
            slurmd_created=(
                self.slurmd_created if self.slurmd_created is not None
                else base.slurmd_created
            ),
        )
