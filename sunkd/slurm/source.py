"""Slurm source: poll slurmrestd, turn what changed into observation events.

slurmrestd has no watch and its `update_time` filter is broken for nodes on every
release before 26.05.3 (304-empty or HTTP 500), so the only reliable way to follow
Slurm is a full `GET /nodes` (+ `GET /jobs` for demand) every `poll_interval` and a
diff on our side. This module does that diff: it emits `slurm.node.observed` only when
a node's normalized content changed (its running jobs and their latest expected end
included, within `JOB_END_TOLERANCE_SECONDS`), `slurm.node.vanished` when it disappears,
`slurm.demand.observed` per partition when its counters changed (never a per-node list:
an event's size does not grow with the busy nodes), and `source.health` when
the source turns fresh / stale / lost (with the cause). Seeded with the last payloads
from the fold, a restarted daemon does not re-emit what the log already has.

A failed poll never crashes the loop and never leaves the source looking fresh: the
last good state stands and health goes stale with a cause. Failures slurmrestd's answer
explains are typed below this module (`SlurmError`: `auth`, `timeout`,
`controller_down`, `unreachable`, `api_error`, and the `SlurmPayloadError` causes
`bad_payload` (naming the field), `duplicate_node`, `too_large`, `truncated`,
`bad_response`); whatever else goes wrong in a poll is caught here, at the source
boundary: `append_failed` when the sink refused the observations (the log would not
take them), `internal_error` for anything else (the exception named).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

import structlog

from sunkd.domain.events import (
    Event,
    SlurmDemandObserved,
    SlurmNodeObserved,
    SlurmNodeVanished,
    SourceHealth,
)
from sunkd.domain.ports import EventSink
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import (
    SlurmApiError,
    SlurmAuthError,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmPayloadError,
    SlurmTimeoutError,
    SlurmUnavailableError,
)
from sunkd.slurm.normalize import clean_text

log = structlog.get_logger(__name__)

SOURCE = "slurm"
ACTIVE_RUNNING = frozenset({"RUNNING", "CONFIGURING"})
# Pending reasons that mean "waiting for nodes" (squeue's Resources/Priority; a job
# whose required nodes are drained or down waits with ReqNodeNotAvail...).
# Pending reasons that mean "waiting for nodes". "None" is what a job carries from its
# submission until the scheduler first looks at it (which can take a scheduling cycle
# or more): counting it avoids waiting a whole extra poll for the reason to appear.
# If idle nodes exist the job simply starts there, and the policy subtracts idle
# Slurm-owned nodes from the demand, so this never moves a node needlessly.
RESOURCE_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required", "None")

# The interval used if `poll_interval` is changed to something that is not a positive
# finite number after construction (a NaN interval used to poll in a tight loop), and
# the least pause between two polls whatever the interval (a poll slower than the
# interval, failing at once, must not spin).
DEFAULT_POLL_INTERVAL = 5.0
MIN_POLL_GAP = 0.05

# A node's expected job end that moved by less than this is not a change (no event).
# The policy uses ends only to lend the node whose jobs end soonest first; a drain
# then waits for those jobs, which takes minutes, so ends within a minute of each other
# are equally good candidates. Any change of the job count, or between finite and
# unlimited, is always emitted.
JOB_END_TOLERANCE_SECONDS = 60.0

__all__ = ["JOB_END_TOLERANCE_SECONDS", "SlurmSource", "compute_demand", "compute_node_jobs"]


def compute_demand(
    jobs: Sequence[SlurmJob], partitions: Sequence[str]
) -> dict[str, SlurmDemandObserved]:
    """Per partition: pending jobs, the nodes they wait for, and running jobs (counters
    only: when the running jobs end is per node, `compute_node_jobs`)."""
    managed = set(partitions)
    pending: dict[str, int] = {p: 0 for p in partitions}
    pending_nodes: dict[str, int] = {p: 0 for p in partitions}
    running: dict[str, int] = {p: 0 for p in partitions}
    head: dict[str, tuple[int, int]] = {}  # partition -> (nodes, job id) of the head
    for job in jobs:
        is_pending = job.state == "PENDING"
        is_running = job.state in ACTIVE_RUNNING
        if not (is_pending or is_running):
            continue  # GET /jobs also lists jobs finished within MinJobAge
        for partition in job.partitions:
            if managed and partition not in managed:
                continue
            if partition not in pending:
                pending[partition] = pending_nodes[partition] = running[partition] = 0
            if is_pending:
                pending[partition] += 1
                reason = job.state_reason or ""
                if reason.startswith(RESOURCE_REASONS):
                    pending_nodes[partition] += max(1, job.node_count)
                if reason.startswith("Resources"):
                    head[partition] = max(head.get(partition, (0, 0)),
                                          (max(1, job.node_count), job.job_id))
                continue
            running[partition] += 1
    return {
        partition: SlurmDemandObserved(
            partition=partition,
            pending_jobs=pending[partition],
            pending_nodes=pending_nodes[partition],
            running_jobs=running[partition],
            head_nodes=head.get(partition, (0, 0))[0],
            head_job=head.get(partition, (0, 0))[1],
        )
        for partition in pending
    }


def compute_node_jobs(jobs: Sequence[SlurmJob]) -> dict[str, tuple[int, float | None]]:
    """Per node: the running jobs on it, whatever their partition (a job of any
    partition must end before the node can be lent), and the latest expected end
    (None = one of them is unlimited or has no end time: it dominates)."""
    per_node: dict[str, tuple[int, float | None]] = {}
    for job in jobs:
        if job.state not in ACTIVE_RUNNING:
            continue
        end = job.end_time
        for node in job.nodes:
            previous = per_node.get(node)
            if previous is None:
                per_node[node] = (1, end)
            else:
                count, old_end = previous
                new_end = None if old_end is None or end is None else max(old_end, end)
                per_node[node] = (count + 1, new_end)
    return per_node


def _settle_job_end(previous: SlurmNodeObserved | None, jobs: int,
                    job_end: float | None) -> float | None:
    """`job_end`, or the one last emitted if it moved by less than the tolerance: a
    recomputed end (a job whose limit slurmctld re-evaluates, a node whose latest job
    changes within the same minute) is not a change worth an event."""
    if (previous is not None and previous.jobs > 0 and jobs > 0
            and previous.job_end is not None and job_end is not None
            and abs(job_end - previous.job_end) < JOB_END_TOLERANCE_SECONDS):
        return previous.job_end
    return job_end


def _cause(error: BaseException) -> tuple[str, str]:
    """(cause, detail) for source.health. Causes are a small fixed set (they label the
    sunkd_source_errors_total metric); the detail says which node, field or exception."""
    if isinstance(error, SlurmAuthError):
        return "auth", str(error)
    if isinstance(error, SlurmTimeoutError):
        return "timeout", str(error)
    if isinstance(error, SlurmUnavailableError):
        return error.cause, str(error)
    if isinstance(error, SlurmPayloadError):
        return error.cause, f"field {error.field}: {error.problem}"
    if isinstance(error, SlurmApiError):
        return "api_error", str(error)
    if isinstance(error, SlurmError):
        return "error", str(error)
    return "internal_error", f"{type(error).__name__}: {error}"


class SlurmSource:
    """Polls slurmrestd and hands changed observations to `sink`."""

    def __init__(
        self,
        client: SlurmRestClient,
        sink: EventSink,
        *,
        partitions: Sequence[str] = (),
        poll_interval: float = 5.0,
        initial_nodes: Mapping[str, SlurmNodeObserved] | None = None,
        initial_demand: Mapping[str, SlurmDemandObserved] | None = None,
        initial_health: SourceHealth | None = None,
        lost_after: float = 60.0,
        not_responding_grace: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._sink = sink
        self.partitions = tuple(partitions)
        if not _positive_finite(poll_interval):
            raise ValueError(
                f"poll_interval must be a positive finite number of seconds, got {poll_interval!r}")
        self.poll_interval = poll_interval
        self._nodes: dict[str, SlurmNodeObserved] = dict(initial_nodes or {})
        self._demand: dict[str, SlurmDemandObserved] = dict(initial_demand or {})
        self._health: SourceHealth | None = initial_health
        self._lost_after = lost_after
        self._nr_grace = not_responding_grace
        self._clock = clock
        self._last_success = clock()
        self.last_good_at: float | None = None  # wall clock of the last good poll
        self._nr_since: dict[str, float] = {}
        # Last raw SlurmNode per name whose observation is in `_nodes`: an unchanged
        # node then costs one comparison, not a new payload (10k-node polls).
        self._raw: dict[str, SlurmNode] = {}
        self._pending_raw: dict[str, SlurmNode] = {}
        # A poll and a hook's targeted read (`observe_nodes`) never interleave: each
        # reads, diffs and appends as one step, so the log's order is the reads' order.
        self._reading = asyncio.Lock()

    @property
    def nodes(self) -> Mapping[str, SlurmNodeObserved]:
        """The last good normalized view (what was last emitted per node)."""
        return self._nodes

    @property
    def health(self) -> SourceHealth | None:
        return self._health

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set. Never raises for Slurm trouble."""
        while not stop.is_set():
            started = self._clock()
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # not even source.health could be appended: next poll retries
                log.exception("slurm.source.poll_failed")
            interval = self.poll_interval
            if not _positive_finite(interval):
                interval = DEFAULT_POLL_INTERVAL
            delay = max(MIN_POLL_GAP, interval - (self._clock() - started))
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def poll_once(self) -> list[Event]:
        """One cycle; returns the events handed to the sink (possibly none).

        Any failure of the poll or of handing its events to the sink turns the source
        stale (or lost) with a cause, and nothing of that poll counts as emitted. Raises
        only if the sink refuses even that source.health event (or on cancellation)."""
        async with self._reading:
            return await self._poll_locked()

    async def _poll_locked(self) -> list[Event]:
        try:
            await self._client.negotiate()
            raw_nodes, jobs = await asyncio.gather(
                self._client.get_nodes(), self._client.get_jobs()
            )
            events = self._diff(raw_nodes, jobs)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # typed SlurmErrors, and the catch-all: internal_error
            self._pending_raw = {}
            return await self._failed(error)
        health = self._health_event("fresh", None, None)
        if health is not None:
            events.append(health)
        if events:
            try:
                await self._sink(events)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # e.g. the database refused the batch
                self._pending_raw = {}
                return await self._failed(error, cause="append_failed")
        self._commit(events)
        self._last_success = self._clock()
        self.last_good_at = time.time()
        return events

    async def observe_nodes(
        self, extra: Callable[[Sequence[Event]], Sequence[Event]] | None = None,
    ) -> list[Event]:
        """A read for a Slurm hook's hint: `GET /nodes` and `GET /jobs`, every node of
        the answer diffed like a poll (not only those the hook named: the answer has
        them all, so one read serves every change it sees, such as the other nodes of a
        job array whose prologs are still on their way), appended with `extra(changes)`
        (the hook's record) in one batch; returns the observations appended. Nodes
        outside the managed partitions are skipped; a node missing here is not a vanish
        and the source's health is not touched (both are the poll's to say), so a failed
        read raises (the caller counts it) and changes nothing.

        Not `GET node/{name}`: on 22.05 its allocation counts stay stale after a job
        ends (measured: no job, no COMPLETING, CPUs still allocated, for as long as no
        read of every node came in between, i.e. until the next poll), so an end hook's
        node looked busy to the policy until then."""
        async with self._reading:
            await self._client.negotiate()
            jobs, nodes = await asyncio.gather(self._client.get_jobs(),
                                               self._client.get_nodes())
            self._pending_raw = {}
            events = self._node_events(nodes, jobs) + self._demand_events(nodes, jobs)
            batch = [*events, *(extra(events) if extra is not None else ())]
            if batch:
                try:
                    await self._sink(batch)
                except BaseException:
                    self._pending_raw = {}
                    raise
            self._commit(events)
            return events

    # ----------------------------------------------------------------- internals

    def _managed(self, node: SlurmNode) -> bool:
        if not self.partitions:
            return True
        return any(p in self.partitions for p in node.partitions)

    def _observed(self, node: SlurmNode, now: float,
                  jobs: tuple[int, float | None]) -> SlurmNodeObserved:
        count, job_end = jobs
        job_end = _settle_job_end(self._nodes.get(node.name), count, job_end)
        observed = node.to_observed(count, job_end if count else None)
        if "NOT_RESPONDING" in node.flags:
            # After a resume slurmctld shows idle+NOT_RESPONDING for ~1 s until its next
            # ping (docs/slurm.md, "Measured behaviour"). Report the flag only once it has
            # persisted.
            since = self._nr_since.setdefault(node.name, now)
            if now - since < self._nr_grace and node.state != "DOWN":
                previous = self._nodes.get(node.name)
                keep = previous is not None and "NOT_RESPONDING" in previous.flags
                if not keep:
                    flags = tuple(f for f in observed.flags if f != "NOT_RESPONDING")
                    observed = _replace_flags(observed, flags)
        else:
            self._nr_since.pop(node.name, None)
        return observed

    def _diff(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> list[Event]:
        self._pending_raw = {}
        events = self._node_events(nodes, jobs)
        seen = {node.name for node in nodes if self._managed(node)}
        for name in sorted(set(self._nodes) - seen):
            events.append(Event(subject=name, payload=SlurmNodeVanished(node=name)))
            self._nr_since.pop(name, None)
            self._raw.pop(name, None)
        return events + self._demand_events(nodes, jobs)

    def _node_events(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]
                     ) -> list[Event]:
        """The observations of `nodes` that changed (their raw nodes wait in
        `_pending_raw` for the commit)."""
        now = self._clock()
        events: list[Event] = []
        previous = self._nodes
        raw_cache = self._raw
        nr_pending = self._nr_since
        node_jobs = compute_node_jobs(jobs)
        no_jobs: tuple[int, float | None] = (0, None)
        for node in nodes:
            if not self._managed(node):
                continue
            name = node.name
            on_node = node_jobs.get(name, no_jobs)
            last = previous.get(name)
            if (last is not None and raw_cache.get(name) == node and name not in nr_pending
                    and _same_jobs(last, on_node)):
                continue
            observed = self._observed(node, now, on_node)
            if previous.get(name) != observed:
                events.append(Event(subject=name, payload=observed))
            self._pending_raw[name] = node
        return events

    def _demand_events(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]
                       ) -> list[Event]:
        events: list[Event] = []
        partitions = self.partitions
        if not partitions:
            names: set[str] = set(self._demand)
            for node in nodes:
                names.update(node.partitions)
            partitions = tuple(sorted(names))
        for partition, demand in sorted(compute_demand(jobs, partitions).items()):
            if self._demand.get(partition) != demand:
                events.append(Event(subject=partition, payload=demand))
        return events

    def _commit(self, events: Sequence[Event]) -> None:
        self._raw.update(self._pending_raw)
        self._pending_raw = {}
        for event in events:
            payload = event.payload
            if isinstance(payload, SlurmNodeObserved):
                self._nodes[payload.node] = payload
            elif isinstance(payload, SlurmNodeVanished):
                self._nodes.pop(payload.node, None)
            elif isinstance(payload, SlurmDemandObserved):
                self._demand[payload.partition] = payload
            elif isinstance(payload, SourceHealth):
                self._health = payload

    def _health_event(self, status: str, cause: str | None, detail: str | None) -> Event | None:
        current = self._health
        if current is not None and (current.status, current.cause) == (status, cause):
            return None
        return Event(
            subject=SOURCE,
            payload=SourceHealth(source=SOURCE, status=status, cause=cause, detail=detail),
        )

    async def _failed(self, error: BaseException, *, cause: str | None = None) -> list[Event]:
        typed_cause, detail = _cause(error)
        if cause is not None:
            detail = f"{type(error).__name__}: {error}"
        else:
            cause = typed_cause
        # The detail quotes what slurmrestd or the database said: make it safe to log,
        # append and print.
        detail = clean_text(detail[:1000])
        silent_for = self._clock() - self._last_success
        status = "lost" if silent_for >= self._lost_after else "stale"
        log.warning("slurm.source.poll_error", cause=cause, status=status, detail=detail[:300],
                    exc_info=cause == "internal_error")
        event = self._health_event(status, cause, detail)
        if event is None:
            return []
        await self._sink([event])
        self._commit([event])
        return [event]


def _same_jobs(last: SlurmNodeObserved, jobs: tuple[int, float | None]) -> bool:
    """The jobs on a node are what `last` says, within the job-end tolerance."""
    count, job_end = jobs
    if count != last.jobs:
        return False
    if count == 0 or job_end is None or last.job_end is None:
        return job_end == last.job_end or count == 0
    return abs(job_end - last.job_end) < JOB_END_TOLERANCE_SECONDS


def _positive_finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _replace_flags(observed: SlurmNodeObserved, flags: tuple[str, ...]) -> SlurmNodeObserved:
    return dataclasses.replace(observed, flags=flags)
