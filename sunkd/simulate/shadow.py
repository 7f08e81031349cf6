"""Shadow replay: the demand a real sunkd recorded, replayed against candidate settings.

Why: a site running sunkd has its own workload in its event log. Before changing a knob
(dwell, prefer, maxInFlight, ...) it wants to know what the pool would have done with
it on *that* history: how many moves, when, what they would have cost, next to what
sunkd actually did.

The log is read only through the fold (`sunkd.domain.fold.fold`): the state after each
recorded instant says which nodes Slurm reported allocated, which pool pods Kubernetes
reported on which node, how many jobs were pending per partition and which pods were
pending with their requests, and where sunkd's transitions stood. Payload fields are
never parsed here, so every log format the fold reads replays.

The approximation (docs/evaluation.md, "Shadow replay"): the recorded world does not
react to the candidate's actions, so the replay does not re-play the recorded
schedules. It turns the record into a workload and simulates it (the same world,
schedulers and bridge as `sunkd simulate`):
- batch jobs: the intervals in which Slurm reported a node allocated, cut where the
  expected end of the node's jobs changed (a job ending and the next starting between
  two polls); nodes whose intervals start and end at the same recorded instants form
  one job of that many nodes (exclusive whole-node jobs; jobs sharing a node merge); run
  time = the interval, estimate = the run time. Submit times: every rise of a partition's
  pending-job count is an arrival, matched first-in first-out to job starts; a start
  without one was submitted when it started. Jobs still pending at the log's end (or
  cancelled while pending) are not replayed: their run time is unknown.
- pods: a pool pod (namespace/name) arrives when first seen pending (else when first
  seen running) and runs as long as it was seen running. Requests are those of its
  pending record; a pod never seen pending is given an even share of its node's GPUs,
  CPU and memory among the pool pods seen there with it. Pods never seen running are not
  replayed. A pod the recorded sunkd evicted ends where it ended in the record, and its
  replacement is a new pod arriving when the record saw it pending.
- the pool: its nodes (Nodeset selector, else the pool named by the node's transitions
  or workload), their shape (most common Kubernetes allocatable), the share Kubernetes
  owned when the log starts; time 0 is the first recorded event.
So a candidate's batch waits and pod pending times are the model's, on the recorded
arrivals and run times; they are comparable with each other and with the same replay
of the recorded settings (`replayed` next to `recorded`), which shows the model's error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.codec import legacy_node_job_ends
from sunkd.domain.events import K8sWorkloadObserved, OwnershipSpec, RecordedEvent
from sunkd.domain.fold import fold
from sunkd.domain.slurmnode import slurm_busy
from sunkd.domain.state import EMPTY, ClusterState, NodeState, OpenTransition, Phase
from sunkd.simulate.records import NodeShape
from sunkd.simulate.workload import BatchJob, SimPod, Workload

DAY = 86400.0


@dataclass(slots=True)
class RecordedMoves:
    """What the recorded sunkd did in one pool, from its transitions and actions."""

    lends: int = 0
    reclaims: int = 0
    aborted: int = 0
    evictions: int = 0  # distinct pods named by evict actions
    transit_seconds: float = 0.0  # node-seconds in TO_K8S / TO_SLURM
    moves: list[tuple[float, str, str]] = field(default_factory=list)  # (t, node, lend|reclaim)

    def per_day(self, days: int) -> list[int]:
        counts = [0] * max(days, 1)
        for t, _node, _direction in self.moves:
            counts[min(int(t // DAY), len(counts) - 1)] += 1
        return counts


@dataclass(frozen=True, slots=True)
class ReplayPool:
    """One pool of the log, turned into a workload the simulator runs."""

    pool: str
    nodes: tuple[str, ...]
    k8s_at_start: int
    shape: NodeShape
    ownership: OwnershipSpec | None  # the Nodeset's knobs when the log has them
    workload: Workload
    recorded: RecordedMoves
    skipped: Mapping[str, int]  # what could not be replayed, counted


@dataclass(slots=True)
class _NodeTrack:
    busy_since: float | None = None
    job_end: float | None = None  # expected end of the node's jobs when last seen
    intervals: list[tuple[float, float]] = field(default_factory=list)
    pods: dict[tuple[str, str], float] = field(default_factory=dict)  # running since
    first_phase: Phase | None = None
    transition: OpenTransition | None = None
    transit_from: float = 0.0
    pools: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class _PodTrack:
    pool: str
    node: str = ""
    first_pending: float | None = None
    first_running: float | None = None
    ran: float = 0.0
    request: tuple[int, int, int] | None = None  # cpu millis, memory bytes, gpus
    share: int = 1  # pool pods on its node when first seen there


def _instants(events: Iterable[RecordedEvent]) -> Iterator[list[RecordedEvent]]:
    """The log cut at every change of `recorded_at` (what the daemon appended together)."""
    batch: list[RecordedEvent] = []
    for event in events:
        if batch and event.recorded_at != batch[-1].recorded_at:
            yield batch
            batch = []
        batch.append(event)
    if batch:
        yield batch


class _Reader:
    def __init__(self) -> None:
        self.state: ClusterState = EMPTY
        self.start: float | None = None
        self.t = 0.0
        self.nodes: dict[str, _NodeTrack] = {}
        self.pods: dict[tuple[str, str], _PodTrack] = {}
        self.pending_jobs: dict[str, int] = {}
        self.arrivals: dict[str, list[float]] = {}  # partition -> pending-count rises
        self.moves: dict[str, RecordedMoves] = {}
        self.evicted: dict[str, set[str]] = {}  # pool -> pod names evicted
        self.seen_actions: set[str] = set()
        self.legacy_from: tuple[Any, ...] = ()
        self.legacy_ends: dict[str, float] = {}
        self._pools: dict[str, str] = {}  # node -> pool of its last transition

    def read(self, events: Iterable[RecordedEvent]) -> None:
        for batch in _instants(events):
            for event in batch:  # reports written before per-Node reports named a pool
                payload = event.payload
                if isinstance(payload, K8sWorkloadObserved) and payload.pool:
                    self._pools[self.state.k8s_names.get(payload.node, payload.node)] = (
                        payload.pool)
            self.state = fold(batch, self.state)
            at = batch[-1].recorded_at.timestamp()
            if self.start is None:
                self.start = at
            self.t = at - self.start
            self._look()

    def _pool_of(self, node: NodeState) -> str | None:
        """The pool of the node's open transition, else of its last one or of its last
        pod report that named one: pod reports are per Kubernetes Node and name no pool
        (older logs, and the simulator's, named one)."""
        if node.transition is not None:
            self._pools[node.name] = node.transition.pool
            return node.transition.pool
        return self._pools.get(node.name)

    def _look(self) -> None:
        state, t = self.state, self.t
        self._legacy()
        for name, node in state.nodes.items():
            track = self.nodes.get(name)
            if track is None:
                track = self.nodes[name] = _NodeTrack()
            pool = self._pool_of(node)
            if pool is not None:
                track.pools[pool] += 1
            self._slurm(track, node, t)
            self._ownership(track, node, pool, t)
            self._workload(name, node, t)
        for partition, demand in state.slurm_demand.items():
            before = self.pending_jobs.get(partition, 0)
            if demand.pending_jobs > before:
                self.arrivals.setdefault(partition, []).extend(
                    [t] * (demand.pending_jobs - before))
            self.pending_jobs[partition] = demand.pending_jobs
        for pool, k8s_demand in state.k8s_demand.items():
            for pending in k8s_demand.pending:
                key = (pending.namespace, pending.name)
                pod = self.pods.get(key)
                if pod is None:
                    pod = self.pods[key] = _PodTrack(pool)
                if pod.first_pending is None:
                    pod.first_pending = t
                if pending.gpus or pending.cpu_millis or pending.memory_bytes:
                    pod.request = (pending.cpu_millis, pending.memory_bytes, pending.gpus)

    def _slurm(self, track: _NodeTrack, node: NodeState, t: float) -> None:
        observed = node.slurm
        busy = observed is not None and not node.slurm_missing and slurm_busy(observed)
        end = self._job_end(node)
        if busy and track.busy_since is None:
            track.busy_since, track.job_end = t, end
        elif busy and end is not None and track.job_end is not None and end != track.job_end:
            # Still allocated, but the expected end moved: a job ended and the next one
            # started between two polls (back to back on the node).
            track.intervals.append((track.busy_since or t, t))
            track.busy_since, track.job_end = t, end
        elif busy and track.job_end is None:
            track.job_end = end
        elif not busy and track.busy_since is not None:
            track.intervals.append((track.busy_since, t))
            track.busy_since, track.job_end = None, None

    def _job_end(self, node: NodeState) -> float | None:
        """The expected end of the node's jobs: the node observation's `job_end` (current
        logs), else the per-node ends an old-format Slurm demand row carried."""
        observed = node.slurm
        end = None if observed is None else getattr(observed, "job_end", None)
        if end is not None:
            return float(end)
        return self.legacy_ends.get(node.name)

    def _legacy(self) -> None:
        demands = tuple(self.state.slurm_demand.values())
        if demands == self.legacy_from:
            return
        self.legacy_from = demands
        self.legacy_ends = {end.node: end.expected_end for demand in demands
                            for end in legacy_node_job_ends(demand)
                            if end.expected_end is not None}

    def _ownership(self, track: _NodeTrack, node: NodeState, pool: str | None,
                   t: float) -> None:
        if track.first_phase is None and node.phase in (Phase.SLURM, Phase.KUBERNETES,
                                                        Phase.TO_K8S, Phase.TO_SLURM):
            track.first_phase = node.phase
        previous, current = track.transition, node.transition
        if previous is not None and (current is None or
                                     current.transition_id != previous.transition_id):
            self._closed(previous, node.owner == previous.to_owner, node.name, t)
        if current is not None and (previous is None or
                                    current.transition_id != previous.transition_id):
            track.transit_from = t
        track.transition = current
        for action in node.open_actions.values():
            if action.verb != "evict" or action.action_id in self.seen_actions:
                continue
            self.seen_actions.add(action.action_id)
            names = self.evicted.setdefault(pool or "", set())
            for label in action.args:
                if label.key == "pod" and label.value not in names:
                    names.add(label.value)
                    self._moves(pool).evictions += 1

    def _closed(self, transition: OpenTransition, completed: bool, node: str,
                t: float) -> None:
        """A transition ended (seen at `t`): a completed or aborted move, or an adoption."""
        if not transition.is_move:
            return
        moves = self._moves(transition.pool)
        track = self.nodes[node]
        moves.transit_seconds += t - track.transit_from
        if not completed:
            moves.aborted += 1
            return
        lend = transition.to_owner == wk.OWNER_KUBERNETES
        moves.lends += lend
        moves.reclaims += not lend
        moves.moves.append((t, node, "lend" if lend else "reclaim"))

    def _moves(self, pool: str | None) -> RecordedMoves:
        return self.moves.setdefault(pool or "", RecordedMoves())

    def _workload(self, name: str, node: NodeState, t: float) -> None:
        track = self.nodes[name]
        running: dict[tuple[str, str], str] = {}
        pool = self._pool_of(node) or ""
        for ref in node.pods or ():
            if ref.pool_pod and ref.phase != "Pending":
                running[(ref.namespace, ref.name)] = pool
        for key in [key for key in track.pods if key not in running]:
            since = track.pods.pop(key)
            self.pods[key].ran += t - since
        for key, pool in running.items():
            if key in track.pods:
                continue
            track.pods[key] = t
            pod = self.pods.get(key)
            if pod is None:
                pod = self.pods[key] = _PodTrack(pool)
            if pod.first_running is None:
                pod.first_running, pod.node, pod.share = t, name, max(len(running), 1)

    def close(self) -> None:
        """Close what is still open at the log's end (intervals, pod runs, transit)."""
        t = self.t
        for track in self.nodes.values():
            if track.busy_since is not None:
                track.intervals.append((track.busy_since, t))
                track.busy_since = None
            for key, since in track.pods.items():
                self.pods[key].ran += t - since
            track.pods = {}
            if track.transition is not None and track.transition.is_move:
                self._moves(track.transition.pool).transit_seconds += t - track.transit_from


def _labels_match(node: NodeState, selector: Iterable[Any]) -> bool:
    if node.k8s is None:
        return False
    labels = {(label.key, label.value) for label in node.k8s.labels}
    wanted = [(label.key, label.value) for label in selector]
    return bool(wanted) and all(pair in labels for pair in wanted)


def _shape(nodes: list[NodeState]) -> NodeShape:
    shapes: Counter[tuple[int, int, int]] = Counter()
    for node in nodes:
        if node.k8s is not None and (node.k8s.gpus or node.k8s.cpu_millis):
            shapes[(node.k8s.gpus, node.k8s.cpu_millis, node.k8s.memory_bytes // 2**20)] += 1
        elif node.slurm is not None:
            shapes[(node.slurm.gpus_total, node.slurm.cpus * 1000, 0)] += 1
    if not shapes:
        return NodeShape()
    gpus, cpu, memory = shapes.most_common(1)[0][0]
    default = NodeShape()
    return NodeShape(gpus, cpu or default.cpu_milli, memory or default.memory_mib)


def read_log(events: Iterable[RecordedEvent]) -> list[ReplayPool]:
    """Every pool of the log, as a workload plus what the recorded sunkd did there."""
    reader = _Reader()
    reader.read(events)
    reader.close()
    state = reader.state
    horizon = max(reader.t, 1.0)
    members: dict[str, list[str]] = {}
    nodesets = {pool: nodeset for pool, nodeset in state.nodesets.items() if not nodeset.deleted}
    pools = sorted(set(nodesets) | {pool for track in reader.nodes.values()
                                    for pool in track.pools} | set(reader.moves) - {""})
    for name, track in reader.nodes.items():
        node = state.nodes.get(name)
        pool = next((p for p, nodeset in nodesets.items()
                     if node is not None and _labels_match(node, nodeset.node_selector)),
                    None)
        if pool is None and track.pools:
            pool = track.pools.most_common(1)[0][0]
        if pool is None and len(pools) == 1 and not nodesets and node is not None and \
                node.slurm is not None and node.k8s is not None:
            pool = pools[0]  # one config-file pool: every node both sides know
        if pool is not None:
            members.setdefault(pool, []).append(name)
    result = []
    for pool in pools:
        names = sorted(members.get(pool, []))
        if not names:
            continue
        result.append(_pool(reader, pool, names, horizon, nodesets.get(pool)))
    return result


def _pool(reader: _Reader, pool: str, names: list[str], horizon: float,
          nodeset: Any) -> ReplayPool:
    state = reader.state
    nodes = [state.nodes[name] for name in names if name in state.nodes]
    shape = _shape(nodes)
    skipped: Counter[str] = Counter()
    partitions = set(nodeset.partitions) if nodeset is not None and nodeset.partitions else {
        p for node in nodes if node.slurm is not None for p in node.slurm.partitions}
    groups: Counter[tuple[float, float]] = Counter()
    for name in names:
        for interval in reader.nodes[name].intervals:
            groups[interval] += 1
    arrivals = sorted(t for p in partitions for t in reader.arrivals.get(p, []))
    jobs = []
    next_arrival = 0
    for job_id, ((start, end), width) in enumerate(sorted(groups.items()), start=1):
        submit = start
        if next_arrival < len(arrivals) and arrivals[next_arrival] <= start:
            submit = arrivals[next_arrival]
            next_arrival += 1
        runtime = max(end - start, 1.0)
        jobs.append(BatchJob(job_id, submit, runtime, width, runtime))
    skipped["batch jobs pending at the log's end or cancelled"] = max(
        len(arrivals) - next_arrival, 0)
    pods = []
    for (namespace, name), track in sorted(reader.pods.items()):
        if track.pool != pool:
            continue
        if track.first_running is None:
            skipped["pods never seen running"] += 1
            continue
        create = track.first_pending if track.first_pending is not None else \
            track.first_running
        if track.request is not None:
            cpu, memory, gpus = track.request
        else:
            skipped["pods without a pending record (requests: a share of their node)"] += 1
            share = max(track.share, 1)
            cpu = shape.cpu_milli // share
            memory = shape.memory_mib * 2**20 // share
            gpus = shape.gpus // share
        pods.append(SimPod(f"{namespace}/{name}", create, max(track.ran, 1.0), gpus, 1000,
                           cpu, memory // 2**20))
    pods.sort(key=lambda pod: (pod.create, pod.name))
    k8s_at_start = sum(1 for name in names
                       if reader.nodes[name].first_phase in (Phase.KUBERNETES, Phase.TO_SLURM))
    notes = (f"shadow replay of pool {pool}: {len(names)} nodes, {horizon / DAY:.2f} days "
             f"of log, {len(jobs)} batch jobs and {len(pods)} pods reconstructed",)
    workload = Workload("shadow", horizon, tuple(jobs), tuple(pods), 0, False, notes)
    return ReplayPool(pool, tuple(names), k8s_at_start, shape,
                      None if nodeset is None else nodeset.ownership, workload,
                      reader.moves.get(pool, RecordedMoves()),
                      {key: value for key, value in skipped.items() if value})


def days_of(horizon: float) -> int:
    return max(math.ceil(horizon / DAY), 1)


def moves_per_day_from_series(series: Any, horizon: float, total: int) -> list[int]:
    """Completed moves per day of a replayed run, from its sampled cumulative count (the
    moves after the last sample go to the last day)."""
    days = days_of(horizon)
    times, moves = series.column("t"), series.column("moves")
    counts = []
    previous = 0.0
    for day in range(1, days + 1):
        boundary = min(day * DAY, horizon)
        value = previous
        for t, m in zip(times, moves, strict=True):
            if t <= boundary:
                value = m
            else:
                break
        counts.append(int(value - previous))
        previous = value
    counts[-1] += total - sum(counts)
    return counts
