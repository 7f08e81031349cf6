"""Busy and idle node-seconds per pool and owner: the figure the pool exists to raise.

A shared pool pays when it turns idle node-hours into busy ones. This module
measures that from the log, as a small incremental fold of its own over the recorded
events, so `sunkd audit`, the status page and the `sunkd_node_seconds_total` counter
all count the same thing the same way. It is pure: time comes from each event's
`recorded_at` (and from `advance(at)`, which the caller gives), nothing is read.

What counts (per node, over time):

- A node is *counted* while at least one side observes it: from its first
  `slurm.node.observed` / `k8s.node.observed` until it vanished from both sides
  (`*.node.vanished`; `node.forgotten` then drops it). So a node's busy plus idle
  seconds equal the time it was observed.
- *Busy*: Slurm reports an allocation (base state ALLOCATED, MIXED or COMPLETING, the
  COMPLETING flag, or `alloc_cpus` > 0: the same `ownership.slurm_busy` the policy
  uses, plus allocation counts) or the Kubernetes source reports a pool pod Running on
  it (`PodRef.pool_pod` and phase Running; other pods are not what the pool is for).
  Either side's work makes the node busy, whoever owns it: during a drain the node is
  still running Slurm's jobs.
- *Owner*: as in the fold (`sunkd.domain.fold`): `none` until adopted, then the
  `to_owner` of a completed transition or the `from_owner` of an aborted one. A node in
  transit is counted for the side it comes from (the fold's `NodeState.owner`, the
  `ownership_intervals` view and the `sunkd_nodes{owner}` gauge say the same), so the
  idle tail of a drain is charged to Slurm and a reclaim's eviction time to Kubernetes:
  the cost of moving shows up as idle time of the giving side.
- *Pool*: the pool of the node's latest `transition.started` (as `ownership_intervals`);
  `none` before any transition and after `node.forgotten` (a node that left every
  pool). `from_state` seeds a node that is not moving with the
  membership the caller passes (the daemon's pools), since a folded state does not
  keep the pool of a finished transition.

Events are applied in log order. Time never runs backwards here: an event recorded
before the fold's clock (a database clock behind the caller's `advance(at)`) counts as
happening at the clock, so the counters derived from it only grow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from sunkd.domain.events import (
    K8sNodeObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    NodeForgotten,
    PodRef,
    RecordedEvent,
    SlurmNodeObserved,
    SlurmNodeVanished,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.slurmnode import slurm_busy
from sunkd.domain.state import OWNER_NONE, ClusterState, NodeState

BUSY = "busy"
IDLE = "idle"
NO_POOL = "none"
# The event kinds this fold reads (a reader can filter the log on them).
KINDS: tuple[str, ...] = tuple(cls.KIND for cls in (
    SlurmNodeObserved, SlurmNodeVanished, K8sNodeObserved, K8sNodeVanished,
    K8sWorkloadObserved, TransitionStarted, TransitionCompleted, TransitionAborted,
    NodeForgotten))

def slurm_allocated(observation: SlurmNodeObserved | None) -> bool:
    """Slurm runs (or cleans up) a job on the node (`slurmnode.slurm_busy`)."""
    return observation is not None and slurm_busy(observation)


_BUSY = frozenset({""})  # a node's pool pods run (older logs kept one entry per pool)


def pool_pods_running(pods: Iterable[PodRef]) -> bool:
    """A pool pod is Running among `pods`."""
    return any(pod.pool_pod and pod.phase == "Running" for pod in pods)


def node_busy(node: NodeState) -> bool:
    """The node does work now: a Slurm allocation or a Running pool pod."""
    return slurm_allocated(node.slurm) or pool_pods_running(node.pods or ())


def node_counted(node: NodeState) -> bool:
    """At least one side observes the node."""
    return node.slurm is not None or node.k8s is not None


class Key(NamedTuple):
    pool: str
    owner: str
    state: str  # BUSY | IDLE


@dataclass(frozen=True, slots=True)
class Row:
    """Busy and idle seconds of one (pool, owner)."""

    pool: str
    owner: str
    busy_s: float
    idle_s: float

    @property
    def busy_share(self) -> float | None:
        total = self.busy_s + self.idle_s
        return self.busy_s / total if total > 0 else None


class _Node:
    __slots__ = ("busy_pools", "k8s", "k8s_name", "k8s_rivals", "owner", "pool", "since",
                 "slurm", "slurm_busy", "transition")

    def __init__(self, since: float) -> None:
        self.pool = NO_POOL
        self.owner = OWNER_NONE
        self.transition: tuple[str, str, str] | None = None  # id, from_owner, to_owner
        self.slurm = False  # observed in Slurm (not vanished)
        self.slurm_busy = False
        # The Kubernetes side as the fold keeps it: the claimant Node's name, whether it
        # is observed, and other Nodes claiming the same Slurm name (an identity conflict).
        self.k8s = False
        self.k8s_name: str | None = None
        self.k8s_rivals: frozenset[str] = frozenset()
        self.busy_pools: frozenset[str] = frozenset()  # pools with a Running pool pod
        self.since = since  # accrued up to here

    def counted(self) -> bool:
        return self.slurm or self.k8s

    def k8s_observed(self, k8s_name: str, reports: Mapping[str, bool]) -> None:
        if self.k8s and self.k8s_name not in (None, k8s_name):
            self.k8s_rivals = self.k8s_rivals | {k8s_name}
            return
        if self.k8s_name != k8s_name:  # as the fold: its own report, or unknown (idle)
            self.busy_pools = (_BUSY if self.k8s_name is None and reports.get(k8s_name)
                               else frozenset())
        self.k8s, self.k8s_name = True, k8s_name

    def k8s_released(self, k8s_name: str) -> None:
        """`k8s_name` no longer claims the node (the fold's `_release_claim`)."""
        if k8s_name in self.k8s_rivals:
            self.k8s_rivals = self.k8s_rivals - {k8s_name}
        elif self.k8s_name != k8s_name:
            return
        elif self.k8s_rivals:
            successor = sorted(self.k8s_rivals)[0]
            self.k8s_rivals = self.k8s_rivals - {successor}
            self.k8s, self.k8s_name = True, successor
            self.busy_pools = frozenset()  # unknown until the successor reports
        else:
            self.k8s = False
            self.busy_pools = frozenset()

    def k8s_vanished(self, k8s_name: str) -> None:
        if self.k8s_name is None or self.k8s_name == k8s_name or k8s_name in self.k8s_rivals:
            self.k8s_released(k8s_name)
        else:  # as the fold does for older logs: a vanish for the node's only name
            self.k8s = False
            self.busy_pools = frozenset()

    def key(self) -> Key:
        busy = self.slurm_busy or bool(self.busy_pools)
        return Key(self.pool, self.owner, BUSY if busy else IDLE)


class Utilization:
    """The incremental fold: `apply` events in log order, `advance` to a moment, read
    `totals` (seconds per (pool, owner, busy|idle)) or `rows()`.

    With `start`/`end`, only time inside [start, end) is accrued (an audit period);
    events outside it still update who owns what and who is busy. With `bucket_seconds`,
    accrued time is also kept per bucket (`since(moment)` for a rolling window whose
    start is a bucket boundary; `prune` drops old buckets)."""

    def __init__(self, start: float | None = None, end: float | None = None,
                 bucket_seconds: float | None = None) -> None:
        if bucket_seconds is not None and not bucket_seconds > 0:
            raise ValueError(f"bucket_seconds must be positive, got {bucket_seconds!r}")
        self.start = start
        self.end = end
        self.bucket_seconds = bucket_seconds
        self.buckets: dict[tuple[int, Key], float] = {}
        self.clock: float | None = None
        self.totals: dict[Key, float] = {}
        self.node_totals: dict[str, float] = {}  # counted seconds per node
        self._nodes: dict[str, _Node] = {}
        self._k8s_names: dict[str, str] = {}  # Kubernetes Node -> Slurm node name
        self._reports: dict[str, bool] = {}  # Kubernetes Node -> pool pods Running

    # ------------------------------------------------------------------ seeding

    @classmethod
    def from_state(cls, state: ClusterState, at: float, pools_of: Mapping[str, str],
                   start: float | None = None, end: float | None = None,
                   bucket_seconds: float | None = None) -> Utilization:
        """A fold that continues from a folded state at `at` (a daemon started from a
        snapshot): nothing accrued yet, every node classified as the state says."""
        fold = cls(start, end, bucket_seconds)
        fold.clock = at
        fold._k8s_names = dict(state.k8s_names)
        fold._reports = {k8s: pool_pods_running(pods) for k8s, pods in state.pod_reports.items()}
        for name, node in state.nodes.items():
            record = _Node(at)
            record.owner = node.owner
            if node.transition is not None:
                record.transition = (node.transition.transition_id,
                                     node.transition.from_owner, node.transition.to_owner)
                record.pool = node.transition.pool or pools_of.get(name, NO_POOL)
            else:
                record.pool = pools_of.get(name, NO_POOL)
            record.slurm = node.slurm is not None
            record.slurm_busy = slurm_allocated(node.slurm)
            record.k8s = node.k8s is not None
            record.k8s_name = node.k8s_name
            record.k8s_rivals = frozenset(node.k8s_rivals)
            record.busy_pools = _BUSY if pool_pods_running(node.pods or ()) else frozenset()
            fold._nodes[name] = record
        return fold

    # ----------------------------------------------------------------- the fold

    def _tick(self, at: float) -> float:
        if self.clock is not None and at < self.clock:
            return self.clock
        self.clock = at
        return at

    def _accrue(self, name: str, record: _Node, at: float) -> None:
        begin, end = record.since, at
        record.since = at
        if not record.counted():
            return
        if self.start is not None:
            begin = max(begin, self.start)
        if self.end is not None:
            end = min(end, self.end)
        if end <= begin:
            return
        seconds = end - begin
        key = record.key()
        self.totals[key] = self.totals.get(key, 0.0) + seconds
        self.node_totals[name] = self.node_totals.get(name, 0.0) + seconds
        width = self.bucket_seconds
        if width is not None:
            index = int(begin // width)
            while begin < end:
                stop = min(end, (index + 1) * width)
                cell = (index, key)
                self.buckets[cell] = self.buckets.get(cell, 0.0) + (stop - begin)
                begin, index = stop, index + 1

    def _node(self, name: str, at: float) -> _Node:
        record = self._nodes.get(name)
        if record is None:
            record = self._nodes[name] = _Node(at)
        else:
            self._accrue(name, record, at)
        return record

    def apply(self, event: RecordedEvent) -> None:
        """Fold one event (unknown and irrelevant kinds are ignored)."""
        p = event.payload
        subject = event.subject
        if not isinstance(p, (SlurmNodeObserved, SlurmNodeVanished, K8sNodeObserved,
                              K8sNodeVanished, K8sWorkloadObserved, TransitionStarted,
                              TransitionCompleted, TransitionAborted, NodeForgotten)):
            return
        at = self._tick(event.recorded_at.timestamp())
        if isinstance(p, SlurmNodeObserved):
            record = self._node(p.node or subject, at)
            record.slurm = True
            record.slurm_busy = slurm_allocated(p)
        elif isinstance(p, SlurmNodeVanished):
            record = self._node(p.node or subject, at)
            record.slurm = False
            record.slurm_busy = False
        elif isinstance(p, K8sNodeObserved):
            k8s_name = p.node or subject
            name = p.slurm_node or k8s_name
            old = self._k8s_names.get(k8s_name)
            if old is not None and old != name and old in self._nodes:
                self._node(old, at).k8s_released(k8s_name)
            self._k8s_names[k8s_name] = name
            self._node(name, at).k8s_observed(k8s_name, self._reports)
        elif isinstance(p, K8sNodeVanished):
            k8s_name = p.node or subject
            self._reports.pop(k8s_name, None)
            name = self._k8s_names.get(k8s_name, k8s_name)
            if name in self._nodes:
                self._node(name, at).k8s_vanished(k8s_name)
        elif isinstance(p, K8sWorkloadObserved):
            # A report is the Node's whole pod list (older logs also named a pool); it
            # counts for the node its Node claims, as in the fold (`fold.kubernetes._on_workload`).
            k8s_name = p.node or subject
            running = pool_pods_running(p.pods) and p.complete
            if p.complete:
                self._reports[k8s_name] = running
            else:
                self._reports.pop(k8s_name, None)
            name = self._k8s_names.get(k8s_name, k8s_name)
            found = self._nodes.get(name)
            if found is not None and found.k8s and found.k8s_name == k8s_name:
                self._node(name, at).busy_pools = _BUSY if running else frozenset()
        elif isinstance(p, TransitionStarted):
            record = self._node(p.node or subject, at)
            record.transition = (p.transition_id, p.from_owner or OWNER_NONE, p.to_owner)
            if p.pool:
                record.pool = p.pool
        elif isinstance(p, TransitionCompleted | TransitionAborted):
            name = p.node or subject
            known = self._nodes.get(name)
            if known is None or known.transition is None \
                    or known.transition[0] != p.transition_id:
                return  # stale or foreign, as in the fold
            record = self._node(name, at)
            assert record.transition is not None
            _tid, from_owner, to_owner = record.transition
            record.owner = to_owner if isinstance(p, TransitionCompleted) else from_owner
            record.transition = None
        else:  # NodeForgotten
            name = p.node or subject
            known = self._nodes.get(name)
            if known is not None and (known.slurm or known.k8s or known.k8s_rivals):
                # Still observed (it left every pool): the fold forgets what sunkd did
                # (owner, transition) and keeps what the sources see, the pods its
                # Kubernetes Node reports included.
                record = self._node(name, at)
                record.owner, record.pool, record.transition = OWNER_NONE, NO_POOL, None
            elif known is not None:
                self._accrue(name, self._nodes.pop(name), at)
                for k8s_name in [k for k, v in self._k8s_names.items() if name in (k, v)]:
                    del self._k8s_names[k8s_name]

    def apply_all(self, events: Iterable[RecordedEvent]) -> None:
        for event in events:
            self.apply(event)

    def advance(self, at: float) -> None:
        """Accrue every node up to `at` (no-op for a moment before the clock)."""
        at = self._tick(at)
        for name, record in self._nodes.items():
            self._accrue(name, record, at)

    # ---------------------------------------------------------------- reading

    def current(self) -> dict[str, Key]:
        """Each counted node's (pool, owner, busy|idle) right now."""
        return {name: record.key() for name, record in self._nodes.items()
                if record.counted()}

    def rows(self) -> list[Row]:
        """Totals per (pool, owner), sorted; call `advance` first for "up to now"."""
        return _rows(self.totals.items())

    def since(self, moment: float) -> list[Row]:
        """Rows of the time accrued from the bucket holding `moment` on (exact when
        `moment` is a bucket boundary). Needs `bucket_seconds`."""
        if self.bucket_seconds is None:
            raise ValueError("since() needs a fold with bucket_seconds")
        first = int(moment // self.bucket_seconds)
        return _rows((key, seconds) for (index, key), seconds in self.buckets.items()
                     if index >= first)

    def prune(self, before: float) -> None:
        """Forget buckets that end at or before `before`."""
        if self.bucket_seconds is None:
            return
        first = int(before // self.bucket_seconds)
        for cell in [cell for cell in self.buckets if cell[0] < first]:
            del self.buckets[cell]


def _rows(items: Iterable[tuple[Key, float]]) -> list[Row]:
    merged: dict[tuple[str, str], list[float]] = {}
    for key, seconds in items:
        cell = merged.setdefault((key.pool, key.owner), [0.0, 0.0])
        cell[0 if key.state == BUSY else 1] += seconds
    return [Row(pool, owner, busy, idle)
            for (pool, owner), (busy, idle) in sorted(merged.items())]
