"""One leadership term: from a freshly acquired lease to stepping down, and why.

A term folds up to its own `leader.elected`, then runs, until the first of them ends:
the lease renewal (`Leadership.renew_forever`), the append watch (a log that takes none
of our appends), the sources (seeded from the state, appending with our epoch), the
hook reader, the Nodeset status writer and the reconciler's `lead` (decide + outbox).
It ends with a `TermEnd`, counted in `sunkd_leader_terms_ended_total{cause}` and said
in words in the `daemon.stepped_down` line (a lost lease used to look like a clean exit).
On a graceful stop running actions may finish (bounded); otherwise they stop at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import structlog

from sunkd.api.metrics import Metrics
from sunkd.domain import wellknown as wk
from sunkd.runtime.adapters import Adapters, Closers
from sunkd.runtime.appends import AppendWatch
from sunkd.runtime.config import Settings
from sunkd.runtime.leadership import Leadership, LeaseExpiredError, TermEnd
from sunkd.runtime.logguard import SHRANK_HINT
from sunkd.runtime.ports import Fatal, Source
from sunkd.runtime.reconciler import LeaderTerm, Reconciler, leader_sink
from sunkd.runtime.statuswriter import write_nodeset_status
from sunkd.store.eventlog import EventLog, Lease, StaleLeaderError

if TYPE_CHECKING:
    from sunkd.kubernetes.actuator import KubernetesActuator
    from sunkd.kubernetes.client import KubeClient
    from sunkd.runtime.hooks import HookReceiver

log = structlog.get_logger(__name__)

SHUTDOWN_GRACE_SECONDS = 20.0

Task = asyncio.Task[object]


class AppendsRefusedError(Exception):
    """Every append of this term failed for a lease's length: lead no longer."""


class Term:
    """Leads on one lease. Build one per acquired lease and `run` it once."""

    def __init__(self, lease: Lease, *, settings: Settings, event_log: EventLog,
                 leadership: Leadership, reconciler: Reconciler, adapters: Adapters,
                 appends: AppendWatch, metrics: Metrics, hooks: HookReceiver | None,
                 stop: asyncio.Event, fatal: Fatal,
                 fatal_error: Callable[[], str | None],
                 wall_clock: Callable[[], float]) -> None:
        self.lease = lease
        self._settings = settings
        self._log = event_log
        self._leadership = leadership
        self._reconciler = reconciler
        self._adapters = adapters
        self._appends = appends
        self._metrics = metrics
        self._hooks = hooks
        self._stop = stop  # the process's: set on SIGTERM/SIGINT and on a fatal error
        self._fatal = fatal
        self._fatal_error = fatal_error
        self._wall = wall_clock
        self._sources_stop = asyncio.Event()  # this term's sources and writers
        self.kube_actuator: KubernetesActuator | None = None

    async def run(self) -> TermEnd:
        lease, leadership, reconciler = self.lease, self._leadership, self._reconciler
        leadership.begin(lease)
        log.info("daemon.leading", epoch=lease.epoch, identity=lease.identity)
        tasks: list[Task] = []
        closers: Closers = []
        end, reason = TermEnd.ERROR, "the term ended"
        try:
            latest = await self._log.latest_seq()
            if latest < reconciler.state.last_seq:
                # Our leader.elected went into a log that ends before what we folded.
                reason = "the event log went backwards"
                self._fatal(f"the event log went backwards: it ends at seq {latest}, but "
                            f"this process has folded it up to seq "
                            f"{reconciler.state.last_seq} (a detached partition? the "
                            "database recreated, or restored from an older backup?). Do not "
                            f"restart: {SHRANK_HINT}", hint=SHRANK_HINT)
                return end
            # Fold up to our own leader.elected first: sources are seeded from the state.
            await reconciler.wait_folded(latest)
            tasks.append(asyncio.create_task(leadership.renew_forever(), name="sunkd-renew"))
            tasks.append(asyncio.create_task(self._watch_appends(), name="sunkd-appends"))
            end, reason = await self._start(tasks, closers)
        finally:
            await self._stop_all(tasks, closers, end)
            self._report(end, reason)
        return end

    async def _start(self, tasks: list[Task], closers: Closers) -> tuple[TermEnd, str]:
        """Start the term's tasks and wait for the first to end: why the term ends."""
        leadership, reconciler, adapters = self._leadership, self._reconciler, self._adapters
        try:
            executor, self.kube_actuator = await adapters.executor(leadership.may_act,
                                                                   closers)
        except Exception as failure:
            adapters.failed(failure, self._fatal)
            return TermEnd.ERROR, (f"cannot build the actuators: {type(failure).__name__}: "
                                   f"{failure}")
        term = LeaderTerm(epoch=self.lease.epoch, may_act=leadership.may_act,
                          paused=leadership.paused, executor=executor)
        kube_client = adapters.current_kube()
        if self._settings.kubernetes.lease and kube_client is not None:
            # In-cluster HA belt and braces: also hold a coordination.k8s.io Lease,
            # so that Kubernetes-side tooling sees one leader; acting needs both.
            if not await self._acquire_kube_lease(kube_client, tasks):
                if self._stop.is_set():
                    return TermEnd.SHUTDOWN, "shutdown requested"
                return TermEnd.KUBERNETES_LEASE, "the Kubernetes Lease was not acquired"
        sink = leader_sink(reconciler, term)
        try:
            sources = await adapters.sources(reconciler.state, sink, self._appends, closers)
        except Exception as failure:
            adapters.failed(failure, self._fatal)
            return TermEnd.ERROR, (f"cannot build the sources: {type(failure).__name__}: "
                                   f"{failure}")
        for source in sources:
            tasks.append(asyncio.create_task(source.run(self._sources_stop)))
        tasks.append(asyncio.create_task(self._mark_polls(sources), name="sunkd-polls"))
        if self._hooks is not None:
            tasks.append(asyncio.create_task(self._hooks.serve(
                sources, sink, self._sources_stop, self._wall(), defer=reconciler.defer),
                name="sunkd-hooks"))
        # The topology file slurmctld reads ([topology] file): kept by the leader only.
        delivery = adapters.topology(lambda: reconciler.state, leadership.may_act,
                                     leadership.clock, self._metrics.registry)
        if delivery is not None:
            tasks.append(asyncio.create_task(delivery.run(self._sources_stop),
                                             name="sunkd-topology"))

        def conditions() -> list[Mapping[str, str]]:
            return [delivery.last.condition] if delivery and delivery.last else []

        if self.kube_actuator is not None:
            tasks.append(asyncio.create_task(write_nodeset_status(
                self.kube_actuator, state=lambda: reconciler.state, pools=reconciler.pools,
                may_act=leadership.may_act, clock=leadership.clock, conditions=conditions),
                name="sunkd-nodeset-status"))
        lead_task: Task = asyncio.create_task(reconciler.lead(term), name="sunkd-lead")
        tasks.append(lead_task)
        stop_wait = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        why = self._why(done, lead_task)
        for task in done:
            if task is not stop_wait and not task.cancelled() and task.exception():
                error = task.exception()
                if isinstance(error, StaleLeaderError):
                    log.warning("daemon.deposed", error=str(error))
                else:
                    log.error("daemon.task_failed", task=task.get_name(), error=repr(error))
        self._sources_stop.set()
        if self._stop.is_set():
            # Graceful stop: no new decisions or actions, let running ones finish.
            reconciler.quiesce()
            await reconciler.drain_in_flight(SHUTDOWN_GRACE_SECONDS)
        lead_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await lead_task
        return why

    def _why(self, done: set[Task], lead_task: Task) -> tuple[TermEnd, str]:
        """Why leadership is being given up: the cause, and in words."""
        if self._stop.is_set():
            return TermEnd.SHUTDOWN, "shutdown requested"
        for task in done:
            if task.cancelled() or (task is lead_task and task.exception() is None):
                continue
            error = task.exception()
            if error is None:
                return TermEnd.ERROR, f"{task.get_name()} ended"
            if isinstance(error, LeaseExpiredError):  # our own renewals gave up
                return TermEnd.LEASE_EXPIRED, str(error)
            if isinstance(error, StaleLeaderError):  # someone else holds the lease
                return TermEnd.DEPOSED, f"deposed: {error}"
            if isinstance(error, AppendsRefusedError):
                return TermEnd.APPENDS_REFUSED, str(error)
            return TermEnd.ERROR, f"{task.get_name()} failed: {type(error).__name__}: {error}"
        return self._leadership.lapse()

    async def _stop_all(self, tasks: list[Task], closers: Closers, end: TermEnd) -> None:
        self._leadership.step_down()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._leadership.release_kube_lease()  # before its client is closed
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
        # Released: a standby takes over at once (after refused appends: one that can
        # append), instead of when the lease runs out.
        await self._leadership.end(
            self.lease, release=self._stop.is_set() or end is TermEnd.APPENDS_REFUSED)
        self._appends.reset()

    def _report(self, end: TermEnd, reason: str) -> None:
        epoch, error = self.lease.epoch, self._fatal_error()
        if self._stop.is_set() and error is None:
            self._metrics.terms_ended.labels(cause=TermEnd.SHUTDOWN.value).inc()
            log.info("daemon.stepped_down", epoch=epoch, reason="shutdown requested",
                     cause=TermEnd.SHUTDOWN.value)
            return
        cause = TermEnd.ERROR if error else end
        self._metrics.terms_ended.labels(cause=cause.value).inc()
        log.warning("daemon.stepped_down", epoch=epoch, reason=error or reason,
                    cause=cause.value)

    async def _acquire_kube_lease(self, kube_client: KubeClient, tasks: list[Task]) -> bool:
        from sunkd.kubernetes.lease import LeaseElector

        duration = max(self._settings.lease_seconds, 3.0)
        elector = LeaseElector(
            kube_client, namespace=self._settings.kubernetes.namespace,
            name=wk.LEASE_NAME, identity=self._settings.identity, lease_duration=duration,
            renew_deadline=duration * 2 / 3, retry_period=max(duration / 5, 1.0))
        acquiring = asyncio.create_task(elector.acquire(self._sources_stop))
        waiting = asyncio.create_task(self._stop.wait())
        await asyncio.wait([acquiring, waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not acquiring.done() or not acquiring.result():
            acquiring.cancel()
            return False
        self._leadership.hold_kube_lease(elector)
        tasks.append(asyncio.create_task(elector.renew_until_lost(self._sources_stop),
                                         name="sunkd-kube-lease"))
        return True

    async def _watch_appends(self) -> None:
        """End the term when every append has failed for a lease's length: the lease
        still renews (an UPDATE), but a leader whose observations never reach the log
        decides on a past it cannot see change, and holds off a standby that can."""
        limit = self._settings.lease_seconds
        while True:
            await asyncio.sleep(min(limit / 6, 0.5))
            failing = self._appends.all_failing_for()
            if failing >= limit:
                errors = {refusal.error for source in self._appends.failing_sources()
                          if (refusal := self._appends.refusal(source)) is not None}
                raise AppendsRefusedError(
                    f"appends refused: the event log took none of this leader's appends for "
                    f"{failing:.0f} s (the lease is {limit:g} s): {'; '.join(sorted(errors))}")

    async def _mark_polls(self, sources: list[Source]) -> None:
        """Feed `sunkd_source_seconds_since_success` from the poller's last good poll
        (a poller that silently stopped would otherwise look fresh: its last health
        event said so). Watch-based sources report trouble themselves."""
        from sunkd.slurm.source import SlurmSource

        while True:
            for source in sources:
                if isinstance(source, SlurmSource) and source.last_good_at is not None:
                    self._metrics.mark_source_good("slurm", source.last_good_at)
            await asyncio.sleep(1.0)
