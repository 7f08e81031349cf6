"""The daemon's side of Slurm hooks: a hint turned into an immediate read of slurmrestd.

Polling slurmrestd (`slurm/source.py`) makes a Slurm change wait up to a poll interval;
slurmctld's PrologSlurmctld and EpilogSlurmctld (and slurmd's Epilog) run `sunkd hook`
the moment a job starts or ends, and the hook POSTs to `/api/v1/slurm/hook`
(`api/hooks.py` authenticates and bounds it). Here the hook is only a hint: the leader
reads the nodes and the jobs from slurmrestd at once (`SlurmSource.observe_nodes`, the
same diff as a poll over every node of the answer, so only a real change enters the
log, and one read serves every change it sees) and appends a `slurm.hook` record with
it, for the latency. Hooks that arrive together are read together (one reader), and a
hook naming more than `TARGETED_MAX` nodes is a full poll (which also says which nodes
vanished, and the source's health).

The record of a read that changed nothing is handed to the reconciler's `defer`: it goes
into the log with the term's next append (or alone a few seconds later), not as a
commit of its own (on SQLite an fsync, whose write lock the next reaction's appends
would wait for). The fold ignores these records, so this delays no decision.

End hooks arrive before the node is free (about 17 ms before, measured on 22.05.8:
slurmctld runs EpilogSlurmctld and slurmd its Epilog while it still cleans up: the node
is COMPLETING, or shows no job but its CPUs still allocated), so after an end hook the
named nodes are read again on `CONFIRM_DELAYS` until none of them is cleaning up
(`cleaning_up`). Polling stays the fallback for everything, and the only source of
node state changes no hook reports (an administrator's drain or DOWN).

A hook sent before this term began is ignored (stale, like any data of an earlier
term), and a standby answers 503: the hook exits 0 and the job runs. The fence
(`slurm.hook_fence`) answers from the folded state (`domain/fence.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from sunkd.api.metrics import Metrics
from sunkd.domain.events import Event, SlurmHookReceived, SlurmNodeObserved
from sunkd.domain.fence import fence_verdict
from sunkd.domain.hostlist import HostlistError, expand
from sunkd.domain.ports import EventSink
from sunkd.domain.state import ClusterState
from sunkd.slurm.source import SlurmSource
from sunkd.store.eventlog import StaleLeaderError

log = structlog.get_logger(__name__)

SUBJECT = "slurm"
TARGETED_MAX = 64  # more named nodes than this: one full poll reads them all
MAX_NAMES = 100_000  # a hook naming more is read as a full poll
# After an end hook: read again after these pauses (seconds) until no named node is
# cleaning up (`cleaning_up`); then the poll is the fallback.
# The first three follow each other without a pause (each read takes a `GET /nodes`,
# ~5-15 ms on a small cluster, longer on a big one): the cleaning up lasts a few tens
# of ms after the hook arrives (measured on 22.05.8 with bench/hooks.py --trace: a read
# at once still saw COMPLETING, one 20 ms later saw it long over); then pauses grow.
CONFIRM_DELAYS = (0.0, 0.0, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
END_EVENTS = frozenset({"epilog-slurmctld", "epilog"})
MAX_QUEUED = 10_000  # hooks waiting for the reader; beyond, they are dropped (polling)


class HookReceiver:
    """Accepts hooks for the current leadership term and reads what they name."""

    def __init__(self, *, state: Callable[[], ClusterState], may_act: Callable[[], bool],
                 metrics: Metrics, fence: bool = False,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._may_act = may_act
        self._metrics = metrics
        self.fence_enabled = fence
        self._wall = wall_clock
        self._source: SlurmSource | None = None
        self._sink: EventSink | None = None
        self._defer: Callable[[Sequence[Event]], None] | None = None
        self._term_started = float("inf")
        self._queue: list[tuple[SlurmHookReceived, tuple[str, ...]]] = []
        self._confirm: dict[str, tuple[int, float]] = {}  # node -> (attempt, due: monotonic)
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ API side

    async def receive(self, hook: SlurmHookReceived, *, fence: bool
                      ) -> tuple[int, Mapping[str, Any], str]:
        if self._source is None or not self._may_act():
            return 503, {"error": "this sunkd is not the acting leader"}, "not_leader"
        if hook.sent_at is not None and hook.sent_at < self._term_started:
            return 200, {"ignored": "sent before this leadership term"}, "stale"
        names, whole = _names(hook.nodes)
        answer: dict[str, Any] = {"accepted": True}
        result = "accepted"
        if fence and hook.event == "prolog-slurmctld":
            if not self.fence_enabled:
                answer["allow"] = True
                answer["why"] = "the fence is off (slurm.hook_fence)"
            else:
                allow, why = fence_verdict(self._state(), names)
                answer["allow"], answer["why"] = allow, why
                result = "fence_allowed" if allow else "fence_refused"
                if not allow:
                    log.warning("slurm.hook.fence_refused", job=hook.job_id, why=why)
        if len(self._queue) >= MAX_QUEUED:
            return 200, {**answer, "accepted": False, "why_not": "queue full"}, "dropped"
        self._queue.append((hook, names if whole else ()))
        self._wake.set()
        return 200, answer, result

    # ------------------------------------------------------------ the term's task

    async def serve(self, sources: Sequence[object], sink: EventSink, stop: asyncio.Event,
                    started_at: float,
                    defer: Callable[[Sequence[Event]], None] | None = None) -> None:
        """Read for hooks until `stop` (the term's end). Without a Slurm source there
        is nothing to read: hooks answer 503 like on a standby. `defer` takes the
        records of reads that changed nothing, for the term's next append (none: they
        are appended at once, a commit of their own)."""
        source = next((s for s in sources if isinstance(s, SlurmSource)), None)
        if source is None:
            await stop.wait()
            return
        self._source, self._sink, self._term_started = source, sink, started_at
        self._defer = defer
        self._queue.clear()
        self._confirm.clear()
        try:
            while not stop.is_set():
                await self._wait(stop)
                if stop.is_set():
                    break
                try:
                    await self._read_once(source)
                except (asyncio.CancelledError, StaleLeaderError):
                    raise  # the term is over
                except Exception as error:  # slurmrestd or the log: the poll catches up
                    log.warning("slurm.hook.read_failed", error=f"{type(error).__name__}: "
                                f"{str(error)[:300]}")
        finally:
            self._source, self._term_started, self._defer = None, float("inf"), None

    async def _wait(self, stop: asyncio.Event) -> None:
        if self._queue:
            return
        timeout = None
        if self._confirm:
            due = min(d for _, d in self._confirm.values())
            timeout = max(0.0, due - time.monotonic())
            if timeout == 0.0:
                return
        self._wake.clear()
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _read_once(self, source: SlurmSource) -> None:
        hooks, self._queue = self._queue, []
        now = time.monotonic()
        due = [name for name, (_, at) in self._confirm.items() if at <= now]
        names: dict[str, None] = dict.fromkeys(due)
        full = False
        for hook, named in hooks:
            if not named and hook.nodes:
                full = True
            names.update(dict.fromkeys(named))
        started = self._wall()
        if full or len(names) > TARGETED_MAX:
            events = await source.poll_once()
            records = self._records(hooks, started)(events)
            if records and self._sink is not None:
                await self._sink(records)
        else:
            events = await source.observe_nodes(extra=self._records(hooks, started))
        self._observe_lag(hooks)
        self._schedule_confirms(source, hooks, due)

    def _records(self, hooks: Sequence[tuple[SlurmHookReceived, tuple[str, ...]]],
                 started: float) -> Callable[[Sequence[Event]], list[Event]]:
        def records(changed: Sequence[Event]) -> list[Event]:
            read = max(0.0, self._wall() - started)
            made = [Event(subject=SUBJECT, payload=SlurmHookReceived(
                event=h.event, job_id=h.job_id, nodes=h.nodes, partition=h.partition,
                sent_at=h.sent_at, received_at=h.received_at,
                read_seconds=round(read + max(0.0, started - h.received_at), 6),
                changed=len(changed))) for h, _ in hooks]
            if not changed and self._defer is not None:
                # Nothing to append but the records: no commit (an fsync on SQLite, and
                # its write lock holding up the next reaction's appends) for them alone.
                self._defer(made)
                return []
            return made
        return records

    def _observe_lag(self, hooks: Sequence[tuple[SlurmHookReceived, tuple[str, ...]]]) -> None:
        now = self._wall()
        for hook, _ in hooks:
            if hook.sent_at is not None:
                self._metrics.hook_lag.observe(max(0.0, now - hook.sent_at))

    def _schedule_confirms(self, source: SlurmSource,
                           hooks: Sequence[tuple[SlurmHookReceived, tuple[str, ...]]],
                           confirmed: Sequence[str]) -> None:
        """End hooks: read again until the named nodes leave COMPLETING."""
        now = time.monotonic()
        for name in confirmed:
            attempt, _ = self._confirm.pop(name)
            if cleaning_up(source.nodes.get(name)) and attempt + 1 < len(CONFIRM_DELAYS):
                self._confirm[name] = (attempt + 1, now + CONFIRM_DELAYS[attempt + 1])
        for hook, named in hooks:
            if hook.event not in END_EVENTS:
                continue
            for name in named:
                if name not in self._confirm and cleaning_up(source.nodes.get(name)):
                    self._confirm[name] = (0, now + CONFIRM_DELAYS[0])


def cleaning_up(observed: SlurmNodeObserved | None) -> bool:
    """The node still clears a job that ended: COMPLETING, or CPUs allocated with no job
    running. slurmrestd 22.05 answers the latter right after EpilogSlurmctld (measured:
    IDLE+DRAIN, no job, alloc_cpus 2, no COMPLETING flag); the policy counts allocated
    CPUs as busy (`slurm_busy`), so without another read the node would wait for a poll.
    A node where another job still runs is not cleaning up: no read soon sees it free."""
    if observed is None:
        return False
    return "COMPLETING" in observed.flags or (observed.jobs == 0 and observed.alloc_cpus > 0)


def _names(hostlist: str) -> tuple[tuple[str, ...], bool]:
    """(node names, True) or ((), False) when the list cannot be expanded in full
    (malformed, cut short by the hook, or too long): the reader then polls."""
    try:
        names = expand(hostlist) if hostlist else []
    except HostlistError:
        return (), False
    if len(names) > MAX_NAMES:
        return (), False
    return tuple(dict.fromkeys(names)), True
