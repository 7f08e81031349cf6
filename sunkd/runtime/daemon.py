"""`sunkd run`: the process. Leadership, sources, the engine, HTTP, signals, systemd.

Life cycle:
  1. open the log (SQLite migrates itself; PostgreSQL must be migrated), load the
     latest snapshot plus the tail, start following the log and serving HTTP;
     tell systemd READY=1 (and WATCHDOG=1 periodically when it asks for it).
  2. loop: try to acquire the database lease. As a standby, keep folding the log so
     the read API is current. As the leader: renew the lease every third of its
     duration, run the sources (their events are appended with our epoch) and the
     engine (decide + outbox). Acting stops as soon as the lease has less than a
     third left without a successful renewal, i.e. well before another process can
     take it over; a StaleLeaderError anywhere ends the term at once.
  3. SIGTERM/SIGINT: stop deciding, let in-flight actions finish (bounded), release
     the lease so a standby takes over immediately, exit 0. SIGHUP: reload the
     config file (pools, log level).

Why one long module: leadership, the term's tasks, signals, systemd and the log guard
all act on the same few fields (lease, term, stop event) and their order at start and
stop is the point; the engine, executor and HTTP app are already separate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from sunkd.api.app import HTTP_IDLE_TIMEOUT, api_pools, build_app, start_http, tls_context
from sunkd.api.extender import ApiPool
from sunkd.api.metrics import Metrics
from sunkd.domain import wellknown as wk
from sunkd.domain.events import EventDecodeError, Payload, SlurmNodeObserved
from sunkd.domain.state import ClusterState
from sunkd.runtime import collector
from sunkd.runtime.appends import AppendWatch
from sunkd.runtime.config import Settings, load_settings, parse_listen, pool_spec
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.runtime.logs import configure_logging
from sunkd.runtime.malloc import ARENAS, limit_arenas
from sunkd.runtime.reconciler import (
    ArchivedLogError,
    CorruptRowError,
    LeaderTerm,
    LogWentBackwardsError,
    Reconciler,
    leader_sink,
)
from sunkd.store.archive import log_origin
from sunkd.store.eventlog import EventLog, Lease, LogShrankError, StaleLeaderError

log = structlog.get_logger(__name__)

SHUTDOWN_GRACE_SECONDS = 20.0
NODESET_STATUS_INTERVAL = 2.0
# How often the log is checked for reachability and for having gone backwards, how long
# one check may take, and for how long failed checks make /readyz answer 503.
LOG_CHECK_INTERVAL = 2.0
LOG_CHECK_TIMEOUT = 5.0
LOG_UNREACHABLE_GRACE = 3.0
# What to do when the log lost rows: a restart would begin the log anew after its
# current end and forget what the missing rows hold (operators' pins included).
SHRANK_HINT = ("do not restart sunkd until the missing rows are back: re-attach a detached "
               "partition, or restore the database from a backup that has them; a restart "
               "on the shorter log begins it anew after its end and forgets their history, "
               "operators' pins included")


# ------------------------------------------------------------------------ systemd


def sd_notify(message: str) -> bool:
    """Send a sd_notify(3) datagram when systemd asked for it (NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as error:
        log.warning("systemd.notify_failed", error=str(error))
        return False


def watchdog_interval() -> float | None:
    """Half of WatchdogSec, as systemd recommends; None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.05)
    except ValueError:
        return None


# ---------------------------------------------------------------------- sources


def slurm_seed(state: ClusterState) -> dict[str, SlurmNodeObserved]:
    """The node observations the Slurm source should consider already emitted (the
    compact records of nodes in no pool included: they are observed all the same)."""
    seed = {name: node.slurm for name, node in state.nodes.items()
            if node.slurm is not None and not node.slurm_missing}
    seed.update((name, record.slurm) for name, record in state.unpooled.items()
                if record.slurm is not None and not record.slurm_missing)
    return seed


def kubernetes_seed(state: ClusterState) -> list[Payload]:
    """The observations the Kubernetes source should consider already emitted."""
    from sunkd.domain.events import K8sWorkloadObserved

    seed: list[Payload] = []
    for node in state.nodes.values():
        if node.k8s is not None and not node.k8s_missing:
            seed.append(node.k8s)
    # Nodes in no pool are compact records in the fold, observed all the same.
    seed.extend(record.k8s for record in state.unpooled.values()
                if record.k8s is not None and not record.k8s_missing)
    # Every Node's last pod report (rivals' too): a Node the fold holds no report for is
    # not seeded, so the source reports it at its first sync.
    seed.extend(K8sWorkloadObserved(node=k8s_name, pool="", pods=pods)
                for k8s_name, pods in state.pod_reports.items())
    seed.extend(state.k8s_demand.values())
    seed.extend(nodeset for nodeset in state.nodesets.values() if not nodeset.deleted)
    return seed


def term_end_cause(reason: str) -> str:
    """The `cause` label of `sunkd_leader_terms_ended_total` for a `_why_term_ended` text."""
    if reason.startswith(("lease expired", "the lease was not renewed")):
        return "lease_expired"
    if reason.startswith("deposed"):
        return "deposed"
    if "Kubernetes Lease" in reason:
        return "kubernetes_lease"
    if reason == "shutdown requested":
        return "shutdown"
    if reason.startswith("appends refused"):
        return "appends_refused"
    return "error"


class AppendsRefusedError(Exception):
    """Every append of this term failed for a lease's length: lead no longer."""


# ------------------------------------------------------------------------- daemon

class Daemon:
    """One sunkd process. `slurm_client`/`kube_client` may be injected (demo, tests);
    otherwise they are built from the settings."""

    def __init__(self, settings: Settings, *, config_path: Path | None = None,
                 slurm_client: Any = None, kube_client: Any = None,
                 slurm_env: dict[str, str] | None = None,
                 tls_cert: Path | None = None, tls_key: Path | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 freeze_loaded_state: bool = False) -> None:
        self.settings = settings
        # gc.freeze() once the log is loaded (collector.py): for the process `sunkd run`
        # is, not for a test process that runs daemons among other things.
        self.freeze_loaded_state = freeze_loaded_state
        self._wall = wall_clock  # this host's clock; the policy's is the database's
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        # Connections idle (or sending their request slower) than this are closed.
        self.http_idle_timeout = HTTP_IDLE_TIMEOUT
        self.log_check_interval = LOG_CHECK_INTERVAL
        self._log_failed_since: float | None = None
        self._log_error = ""
        self._log_identity: tuple[Any, ...] | None = None
        self._last_renew_error: str | None = None
        self._skew_reported: int | None = None
        self.config_path = config_path
        self._slurm_client = slurm_client
        self._kube_client = kube_client
        self._slurm_env = slurm_env
        self.event_log: EventLog | None = None
        self.engine: Reconciler | None = None
        self.metrics = Metrics()
        self.appends = AppendWatch()  # does the log take our sources' appends?
        self._appends_refused = False  # the last term ended for that
        self.metrics.append_failing = self.appends.failing_sources
        self.lease: Lease | None = None
        self.leading = False
        self.stop_event = asyncio.Event()
        self._stepping_down = False
        self._follow_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self._kube_actuator: Any = None
        self._kube_elector: Any = None
        self.fatal_error: str | None = None
        self.hooks: Any = None  # runtime.hooks.HookReceiver when slurm.hook_token_file is set
        if settings.slurm.hook_token_file is not None:
            from sunkd.runtime.hooks import HookReceiver

            self.hooks = HookReceiver(state=self.state, may_act=self.may_act,
                                      metrics=self.metrics, fence=settings.slurm.hook_fence,
                                      wall_clock=wall_clock)

    # ----------------------------------------------------------------- DaemonView

    def state(self) -> ClusterState:
        return self.engine.state if self.engine is not None else ClusterState()

    def is_leader(self) -> bool:
        return self.leading and self.may_act()

    def is_ready(self) -> tuple[bool, str]:
        if self._follow_task is None or self._follow_task.done():
            return False, "not following the event log"
        failed_since = self._log_failed_since
        if failed_since is not None and \
                time.monotonic() - failed_since >= LOG_UNREACHABLE_GRACE:
            return False, (f"event log unreachable for {time.monotonic() - failed_since:.0f} s:"
                           f" {self._log_error}")
        state = self.state()
        for source in self._enabled_sources():
            refusal = self.appends.refusal(source)
            if refusal is not None:  # the log would not even take "stale"
                return False, (f"source {source} is not fresh: its appends to the event log "
                               f"fail for {time.monotonic() - refusal.since:.0f} s: "
                               f"{refusal.error}")
            health = state.sources.get(source)
            if health is None or health.status != "fresh":
                status = health.status if health is not None else "not yet observed"
                return False, f"source {source} is {status}"
        return True, "leader" if self.is_leader() else "standby"

    def pools(self) -> Sequence[ApiPool]:
        return api_pools(self.state(), self.settings.pools)

    def _enabled_sources(self) -> list[str]:
        sources = []
        if self.settings.slurm.url or self._slurm_client is not None:
            sources.append("slurm")
        if self.settings.kubernetes.enabled:
            sources.append("kubernetes")
        return sources

    def may_act(self) -> bool:
        """Stop acting with a third of the lease left: before anyone can take over.
        With `kubernetes.lease` the Kubernetes Lease must be held too. A host clock that
        disagrees with the database's by more than `max_clock_skew_seconds` stops acting
        too: the offset is measured, but so large a skew means a broken clock somewhere."""
        lease = self.lease
        if lease is None or self._stepping_down:
            return False
        if self._kube_elector is not None and not self._kube_elector.holds_lease():
            return False
        if abs(lease.db_offset) > self.settings.max_clock_skew_seconds:
            self._report_skew(lease.db_offset)
            return False
        return lease.remaining() > lease.lease_seconds / 3

    def _clock_paused(self) -> bool:
        """The lease is fine but the clocks disagree too much: lead without acting."""
        lease = self.lease
        if lease is None or self._stepping_down:
            return False
        if lease.remaining() <= lease.lease_seconds / 3:
            return False
        return abs(lease.db_offset) > self.settings.max_clock_skew_seconds

    def _renewal_late(self) -> bool:
        """The lease is still ours but a renewal is late (less than the third left that
        acting needs): lead without acting until a renewal succeeds, instead of ending the
        term (issue 15.5: a renewal that waited behind a burst of appends used to end the
        term, and the next one started with every source stale). The term ends when the
        lease runs out unrenewed (`_renew_forever`) or someone else holds it."""
        lease = self.lease
        if lease is None or self._stepping_down:
            return False
        if self._kube_elector is not None and not self._kube_elector.holds_lease():
            return False
        return 0 < lease.remaining() <= lease.lease_seconds / 3

    def _paused(self) -> bool:
        return self._clock_paused() or self._renewal_late()

    def clock(self) -> float:
        """The policy's `now`: the database's clock (event times are the database's), as
        this host's wall clock plus the offset measured at the last acquire or renew."""
        lease = self.lease
        return self._wall() + (lease.db_offset if lease is not None else 0.0)

    def _report_skew(self, offset: float) -> None:
        if self._skew_reported != round(offset):
            self._skew_reported = round(offset)
            log.error("daemon.clock_skew", offset_seconds=round(offset, 3),
                      limit_seconds=self.settings.max_clock_skew_seconds,
                      hint="fix NTP on this host or the database host; sunkd takes no action")

    # ------------------------------------------------------------------- running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop_event.set)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        self.event_log = await EventLog.open(self.settings.database_url, migrate_apart=True)
        self.event_log.wall_clock = self._wall
        try:
            self.engine = Reconciler(
                self.event_log,
                config_pools=[pool_spec(pool) for pool in self.settings.pools],
                snapshot_every=self.settings.snapshot_every,
                snapshots_kept=self.settings.snapshots_kept,
                snapshot_in_child=self.settings.snapshot_encoder == "child",
                observer=self.metrics,
                clock=self.clock,
            )
            try:
                await self.engine.load()
            except CorruptRowError as error:
                return self._fatal(f"the event log has an undecodable row: {error}",
                                   seq=error.row.seq)
            except EventDecodeError as error:
                return self._fatal(f"the event log has an undecodable event: {error}")
            except ArchivedLogError as error:
                return self._fatal(str(error), hint="restore the archive base snapshot, "
                                   "or check the log with `sunkd replay --check --archive DIR`")
            except LogShrankError as error:
                return self._fatal(f"{error}. Do not start sunkd on it: {SHRANK_HINT}",
                                   hint=SHRANK_HINT)
            if self.freeze_loaded_state:
                # The loaded state lives long: out of every later collection.
                log.info("daemon.gc_frozen", objects=collector.freeze())
            self._log_identity = await self._first_row()
            self._follow_task = asyncio.create_task(self.engine.follow(), name="sunkd-follow")
            self._follow_task.add_done_callback(self._follow_ended)
            guard = asyncio.create_task(self._guard_log(), name="sunkd-log-guard")
            await self._start_http()
            sd_notify("READY=1\nSTATUS=following the event log")
            watchdog = asyncio.create_task(self._watchdog(), name="sunkd-watchdog")
            try:
                await self._leadership_loop()
            finally:
                watchdog.cancel()
                guard.cancel()
                sd_notify("STOPPING=1")
        finally:
            await self._shutdown()
        return 1 if self.fatal_error else 0

    def _fatal(self, why: str, *, seq: int | None = None,
               hint: str = "inspect with `sunkd events --after <seq> --json`; the log is "
                           "untouched") -> int:
        """Stop, loudly: state can no longer be trusted, so nothing may be decided."""
        if self.fatal_error is not None:
            return 1  # the first reason is the one that counts
        self.fatal_error = why
        if seq is not None:
            hint = hint.replace("<seq>", str(max(seq - 1, 0)))
        log.critical("daemon.fatal", error=why, seq=seq, hint=hint)
        self.metrics.set_leader(False, self.lease.epoch if self.lease else 0)
        self.stop_event.set()
        return 1

    def _follow_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self.stop_event.is_set():
            return
        error = task.exception()
        if isinstance(error, CorruptRowError):
            self._fatal(f"the event log has an undecodable row: {error}", seq=error.row.seq)
        elif error is not None:
            self._fatal(f"following the event log failed after seq "
                        f"{self.state().last_seq}: {error!r}", seq=self.state().last_seq + 1)

    # ------------------------------------------------------------ log guard

    async def _first_row(self) -> tuple[Any, ...] | None:
        """What identifies this log: its first event (seq 1), as the row or, once
        `sunkd log archive` removed it, as the `log.archived` event recorded it. A
        recreated database has another one (or none yet)."""
        assert self.event_log is not None
        return await log_origin(self.event_log.engine)

    async def check_log(self) -> None:
        """Raise LogShrankError when the log ends before what we folded, and
        LogWentBackwardsError when its first row is not the one we loaded (a database
        recreated under a running daemon used to leave it "ready" on a log it never
        folded again)."""
        assert self.event_log is not None
        folded = self.state().last_seq
        latest = await self.event_log.latest_seq()
        if latest < folded:
            raise LogShrankError(
                f"the event log went backwards: it ends at seq {latest}, but this process "
                f"has folded it up to seq {folded}")
        identity = await self._first_row()
        if self._log_identity is None:
            self._log_identity = identity
        elif identity != self._log_identity:
            raise LogWentBackwardsError(
                f"the event log was replaced: its first row is now {identity!r}, it was "
                f"{self._log_identity!r}")

    async def _guard_log(self) -> None:
        """Every few seconds: is the log reachable (for /readyz), and is it still the log
        we folded? A replaced log stops the process: the restart loads it as it is."""
        while not self.stop_event.is_set():
            try:
                async with asyncio.timeout(LOG_CHECK_TIMEOUT):
                    await self.check_log()
            except LogShrankError as error:
                self._fatal(f"{error} (a detached partition? the database recreated, or "
                            f"restored from an older backup?). Do not restart: {SHRANK_HINT}",
                            hint=SHRANK_HINT)
                return
            except LogWentBackwardsError as error:
                self._fatal(f"{error} (was the database recreated, or restored from an "
                            "older backup?). Restart sunkd to load the log as it is now",
                            hint="check the database; a restart starts from the log as "
                                 "it is now")
                return
            except Exception as error:
                if self._log_failed_since is None:
                    self._log_failed_since = time.monotonic()
                    log.warning("daemon.log_unreachable", error=str(error)[:300])
                self._log_error = f"{type(error).__name__}: {error}"[:300]
            else:
                if self._log_failed_since is not None:
                    log.info("daemon.log_reachable")
                self._log_failed_since = None
            await asyncio.sleep(self.log_check_interval)

    def reload(self) -> None:
        if self.config_path is None:
            log.info("daemon.reload_skipped", why="no --config file")
            return
        try:
            settings = load_settings(self.config_path)
        except Exception as error:
            log.error("daemon.reload_failed", error=str(error))
            return
        self.settings = replace(self.settings, pools=settings.pools, log_level=settings.log_level)
        configure_logging(settings.log_level, self.settings.log_format)
        if self.engine is not None:
            self.engine.config_pools = tuple(pool_spec(pool) for pool in settings.pools)
        log.info("daemon.reloaded", pools=[pool.name for pool in settings.pools])

    async def _watchdog(self) -> None:
        interval = watchdog_interval()
        if interval is None:
            return
        while True:
            # Only a live event loop gets here; a wedged loop stops the pings and
            # systemd restarts us.
            sd_notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _leadership_loop(self) -> None:
        assert self.event_log is not None
        retry = max(self.settings.lease_seconds / 3, 0.5)
        while not self.stop_event.is_set():
            try:
                lease = await self.event_log.acquire(self.settings.identity,
                                                     self.settings.lease_seconds)
            except Exception as error:
                log.warning("leadership.acquire_failed", error=str(error))
                self.metrics.acquire_failures.inc()
                lease = None
            self.metrics.set_leader(lease is not None, lease.epoch if lease else 0)
            if lease is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(retry):
                        await self.stop_event.wait()
                continue
            await self._lead(lease)
            self.metrics.set_leader(False, lease.epoch)
            if self._appends_refused:  # leave the lease to a standby that can append
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.lease_seconds):
                        await self.stop_event.wait()

    async def _lead(self, lease: Lease) -> None:
        assert self.event_log is not None and self.engine is not None
        self.lease, self.leading, self._stepping_down = lease, True, False
        self.metrics.clock_offset.set(lease.db_offset)
        self._last_renew_error = None
        term = LeaderTerm(epoch=lease.epoch, may_act=self.may_act, paused=self._paused)
        log.info("daemon.leading", epoch=lease.epoch, identity=lease.identity)
        sd_notify(f"STATUS=leader (epoch {lease.epoch})")
        sources_stop = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        closers: list[Callable[[], Awaitable[None]]] = []
        reason = "the term ended"
        try:
            latest = await self.event_log.latest_seq()
            if latest < self.state().last_seq:
                # Our leader.elected went into a log that ends before what we folded.
                reason = "the event log went backwards"
                self._fatal(f"the event log went backwards: it ends at seq {latest}, but "
                            f"this process has folded it up to seq {self.state().last_seq} "
                            "(a detached partition? the database recreated, or restored "
                            f"from an older backup?). Do not restart: {SHRANK_HINT}",
                            hint=SHRANK_HINT)
                return
            # Fold up to our own leader.elected first: sources are seeded from the state.
            await self.engine.wait_folded(latest)
            tasks.append(asyncio.create_task(self._renew_forever(), name="sunkd-renew"))
            tasks.append(asyncio.create_task(self._watch_appends(), name="sunkd-appends"))
            try:
                term = replace(term, executor=await self._build_executor(term, closers))
            except Exception as failure:
                reason = f"cannot build the actuators: {type(failure).__name__}: {failure}"
                self._adapter_failed(failure)
                return
            if self.settings.kubernetes.lease and self._kube_client is not None:
                # In-cluster HA belt and braces: also hold a coordination.k8s.io Lease,
                # so that Kubernetes-side tooling sees one leader; acting needs both.
                if not await self._acquire_kube_lease(sources_stop, tasks):
                    reason = ("shutdown requested" if self.stop_event.is_set() else
                              "the Kubernetes Lease was not acquired")
                    return
            sink = leader_sink(self.engine, term)
            try:
                sources = await self._build_sources(sink, closers)
            except Exception as failure:
                reason = f"cannot build the sources: {type(failure).__name__}: {failure}"
                self._adapter_failed(failure)
                return
            for source in sources:
                tasks.append(asyncio.create_task(source.run(sources_stop)))
            tasks.append(asyncio.create_task(self._mark_polls(sources), name="sunkd-polls"))
            if self.hooks is not None:
                tasks.append(asyncio.create_task(self.hooks.serve(
                    sources, sink, sources_stop, self._wall()), name="sunkd-hooks"))
            if self._kube_actuator is not None:
                tasks.append(asyncio.create_task(self._write_nodeset_status(self._kube_actuator),
                                                 name="sunkd-nodeset-status"))
            lead_task = asyncio.create_task(self.engine.lead(term), name="sunkd-lead")
            tasks.append(lead_task)
            stop_wait = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            reason = self._why_term_ended(done, lead_task)
            for task in done:
                if task is not stop_wait and not task.cancelled() and task.exception():
                    error = task.exception()
                    if isinstance(error, StaleLeaderError):
                        log.warning("daemon.deposed", error=str(error))
                    else:
                        log.error("daemon.task_failed", task=task.get_name(), error=repr(error))
            sources_stop.set()
            if self.stop_event.is_set():
                # Graceful stop: no new decisions or actions, let running ones finish.
                self.engine.quiesce()
                await self.engine.drain_in_flight(SHUTDOWN_GRACE_SECONDS)
            lead_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lead_task
        finally:
            self._stepping_down = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._kube_elector is not None:
                with contextlib.suppress(Exception):
                    await self._kube_elector.release()
                self._kube_elector = None
            for close in closers:
                with contextlib.suppress(Exception):
                    await close()
            if self.stop_event.is_set():
                with contextlib.suppress(Exception):
                    await self.event_log.release(lease)
            self._appends_refused = reason.startswith("appends refused")
            if self._appends_refused:  # a standby that can append takes over at once
                with contextlib.suppress(Exception):
                    await self.event_log.release(lease)
            self.appends.reset()
            self.leading, self.lease = False, None
            if self.stop_event.is_set() and self.fatal_error is None:
                self.metrics.terms_ended.labels(cause="shutdown").inc()
                log.info("daemon.stepped_down", epoch=lease.epoch, reason="shutdown requested",
                         cause="shutdown")
            else:
                cause = "error" if self.fatal_error else term_end_cause(reason)
                self.metrics.terms_ended.labels(cause=cause).inc()
                log.warning("daemon.stepped_down", epoch=lease.epoch,
                            reason=self.fatal_error or reason, cause=cause)

    def _why_term_ended(self, done: set[asyncio.Task[Any]], lead_task: asyncio.Task[Any]
                        ) -> str:
        """Why leadership is being given up, in words for the `daemon.stepped_down` line
        (issue 12: it used to say nothing, and a lost lease looked like a clean exit)."""
        if self.stop_event.is_set():
            return self.fatal_error or "shutdown requested"
        for task in done:
            if task.cancelled() or (task is lead_task and task.exception() is None):
                continue
            error = task.exception()
            if error is None:
                return f"{task.get_name()} ended"
            if isinstance(error, StaleLeaderError):
                text = str(error)  # our own renewal gave up, or someone took the lease
                return text if text.startswith("lease expired") else f"deposed: {text}"
            if isinstance(error, AppendsRefusedError):
                return str(error)
            return f"{task.get_name()} failed: {type(error).__name__}: {error}"
        if self._kube_elector is not None and not self._kube_elector.holds_lease():
            return "the Kubernetes Lease was lost"
        lease = self.lease
        if lease is not None:
            renew = f"; last renewal error: {self._last_renew_error}" \
                if self._last_renew_error else ""
            return (f"the lease was not renewed in time: {max(lease.remaining(), 0.0):.1f} s "
                    f"of {lease.lease_seconds:g} s left, less than the third that acting "
                    f"needs{renew}")
        return "the term ended"

    def _adapter_failed(self, error: Exception) -> None:
        """Building a client failed. A missing or unusable kubeconfig will not fix itself:
        stop with the message. Anything else (an exec plugin that failed just now, too)
        is retried with the next term."""
        from sunkd.kubernetes.kubeconfig import CredentialUnavailable, KubeConfigError

        if isinstance(error, KubeConfigError) and not isinstance(error, CredentialUnavailable):
            self._fatal(f"kubernetes: {error}", hint="fix the configuration")
        else:
            log.error("daemon.adapter_failed", error=f"{type(error).__name__}: {error}")

    async def _mark_polls(self, sources: list[Any]) -> None:
        """Feed `sunkd_source_seconds_since_success` from the poller's last good poll
        (a poller that silently stopped would otherwise look fresh: its last health
        event said so). Watch-based sources report trouble themselves."""
        from sunkd.slurm.source import SlurmSource

        while True:
            for source in sources:
                if isinstance(source, SlurmSource) and source.last_good_at is not None:
                    self.metrics.mark_source_good("slurm", source.last_good_at)
            await asyncio.sleep(1.0)

    async def _write_nodeset_status(self, actuator: Any) -> None:
        """Keep every Nodeset's status current (counters, nodes, conditions)."""
        from sunkd.domain.policy.model import membership
        from sunkd.kubernetes.nodeset_status import build_nodeset_status

        written: dict[str, dict[str, Any]] = {}
        while True:
            await asyncio.sleep(NODESET_STATUS_INTERVAL)
            if not self.may_act() or self.engine is None:
                continue
            state = self.state()
            pools = self.engine.pools()
            member_of: dict[str, str] | None = None
            for pool_name, nodeset in sorted(state.nodesets.items()):
                if nodeset.deleted or "/" not in pool_name:
                    continue
                namespace, name = pool_name.split("/", 1)
                previous = written.get(pool_name, {})
                if member_of is None:
                    member_of = membership(state, pools)
                status = build_nodeset_status(
                    state, pools, pool_name, nodeset.generation, time.time(),
                    {c["type"]: c for c in previous.get("conditions", [])}, member_of)
                if status == previous:
                    continue
                try:
                    await actuator.update_nodeset_status(namespace, name, status)
                    written[pool_name] = status
                except Exception as error:  # retried on the next round
                    log.warning("nodeset.status_failed", pool=pool_name, error=str(error))

    async def _acquire_kube_lease(self, stop: asyncio.Event,
                                  tasks: list[asyncio.Task[Any]]) -> bool:
        from sunkd.kubernetes.lease import LeaseElector

        duration = max(self.settings.lease_seconds, 3.0)
        elector = LeaseElector(
            self._kube_client, namespace=self.settings.kubernetes.namespace,
            name=wk.LEASE_NAME, identity=self.settings.identity, lease_duration=duration,
            renew_deadline=duration * 2 / 3, retry_period=max(duration / 5, 1.0))
        acquiring = asyncio.create_task(elector.acquire(stop))
        waiting = asyncio.create_task(self.stop_event.wait())
        await asyncio.wait([acquiring, waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not acquiring.done() or not acquiring.result():
            acquiring.cancel()
            return False
        self._kube_elector = elector
        tasks.append(asyncio.create_task(elector.renew_until_lost(stop),
                                         name="sunkd-kube-lease"))
        log.info("daemon.kube_lease_acquired", identity=self.settings.identity)
        return True

    async def _watch_appends(self) -> None:
        """End the term when every append has failed for a lease's length: the lease
        still renews (an UPDATE), but a leader whose observations never reach the log
        decides on a past it cannot see change, and holds off a standby that can."""
        limit = self.settings.lease_seconds
        while True:
            await asyncio.sleep(min(limit / 6, 0.5))
            failing = self.appends.all_failing_for()
            if failing >= limit:
                errors = {refusal.error for source in self.appends.failing_sources()
                          if (refusal := self.appends.refusal(source)) is not None}
                raise AppendsRefusedError(
                    f"appends refused: the event log took none of this leader's appends for "
                    f"{failing:.0f} s (the lease is {limit:g} s): {'; '.join(sorted(errors))}")

    async def _renew_forever(self) -> None:
        """Renew at a third of the lease, measured from the last renewal (not from when
        the previous attempt ended, so a slow attempt does not push the next one back);
        after a failure retry soon. An attempt may take until the lease runs out: acting
        stops on its own at a third left (`may_act`), so a slow renewal costs no safety,
        while giving up on it at a third left used to end terms that a renewal arriving a
        second later would have kept (a busy event loop makes every await late)."""
        assert self.event_log is not None
        while True:
            lease = self.lease
            if lease is None:
                return
            due = lease.remaining() - lease.lease_seconds * 2 / 3
            await asyncio.sleep(0.5 if self._last_renew_error is not None else max(due, 0.0))
            try:
                async with asyncio.timeout(max(lease.remaining(), 1.0)):
                    self.lease = await self.event_log.renew(lease)
                    self.metrics.clock_offset.set(self.lease.db_offset)
                self._last_renew_error = None
            except StaleLeaderError:
                raise
            except Exception as error:
                # Keep trying; may_act() turns false on its own as the lease runs out.
                self._last_renew_error = f"{type(error).__name__}: {error}"[:300]
                log.warning("leadership.renew_failed", error=self._last_renew_error,
                            remaining=round(lease.remaining(), 1))
                if lease.remaining() <= 0:
                    raise StaleLeaderError(
                        f"lease expired without renewal ({self._last_renew_error})") from error

    # ------------------------------------------------------------------ adapters

    async def _slurm(self, closers: list[Callable[[], Awaitable[None]]]) -> Any:
        if self._slurm_client is not None:
            return self._slurm_client
        if not self.settings.slurm.url:
            return None
        from sunkd.slurm.client import SlurmRestClient

        client = SlurmRestClient.from_settings(self.settings.slurm)
        self._slurm_client = client
        closers.append(self._close_slurm)
        return client

    async def _close_slurm(self) -> None:
        if self._slurm_client is not None:
            await self._slurm_client.close()
            self._slurm_client = None

    async def _kube(self, closers: list[Callable[[], Awaitable[None]]]) -> Any:
        if not self.settings.kubernetes.enabled:
            return None
        if self._kube_client is not None:
            return self._kube_client
        from sunkd.kubernetes.client import KubeClient

        kubeconfig = self.settings.kubernetes.kubeconfig
        client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None,
                                          context=self.settings.kubernetes.context)
        self._kube_client = client

        async def close() -> None:
            await client.close()
            self._kube_client = None

        closers.append(close)
        return client

    async def _build_executor(self, term: LeaderTerm,
                              closers: list[Callable[[], Awaitable[None]]]) -> ActuatorExecutor:
        slurm_actuator = None
        slurm_client = await self._slurm(closers)
        if slurm_client is not None:
            from sunkd.slurm.actuator import SlurmActuator

            # Writes re-check leadership right before they go out, and give up before
            # may_act() could turn false underneath them: a third of the lease.
            slurm_actuator = SlurmActuator(
                slurm_client, scontrol_env=self._slurm_env, may_write=self.may_act,
                write_timeout=max(1.0, self.settings.lease_seconds / 3))
        self._kube_actuator = None
        kube_actuator = None
        kube_client = await self._kube(closers)
        if kube_client is not None:
            from sunkd.kubernetes.actuator import KubernetesActuator

            # Events about a Node go to `default`: the API server refuses an Event whose
            # involvedObject is a cluster-scoped Node in any other namespace (422), which
            # the real control plane showed (docs/kubernetes.md).
            kube_actuator = KubernetesActuator(
                kube_client, instance=self.settings.identity, may_act=term.may_act)
            self._kube_actuator = kube_actuator
        return ActuatorExecutor(slurm_actuator, kube_actuator, slurm_reader=slurm_client)

    async def _build_sources(self, sink: Any,
                             closers: list[Callable[[], Awaitable[None]]]) -> list[Any]:
        state = self.state()
        sources: list[Any] = []
        slurm_client = await self._slurm(closers)
        if slurm_client is not None:
            from sunkd.slurm.source import SlurmSource

            sources.append(SlurmSource(
                slurm_client, self.appends.wrap("slurm", sink),
                partitions=self.settings.slurm.partitions,
                poll_interval=self.settings.slurm.poll_interval,
                initial_nodes=slurm_seed(state),
                initial_demand=dict(state.slurm_demand),
                # No health seed: the source reports health after its first poll of this
                # term, and only that report makes it fresh again (docs/safety.md, I3).
                initial_health=None))
        kube_client = await self._kube(closers)
        if kube_client is not None:
            from sunkd.kubernetes.source import KubernetesSource

            # Only a fenced append ends the source (our term is over); anything else makes
            # it stale and it recovers by itself.
            sources.append(KubernetesSource(kube_client, self.appends.wrap("kubernetes", sink),
                                            previous=kubernetes_seed(state),
                                            fatal_errors=(StaleLeaderError,)))
        return sources

    # ---------------------------------------------------------------------- HTTP

    async def _start_http(self) -> None:
        hooks = None
        if self.hooks is not None and self.settings.slurm.hook_token_file is not None:
            from sunkd.api.hooks import HookEndpoint

            hooks = HookEndpoint(self.hooks, token_file=self.settings.slurm.hook_token_file,
                                 rate=self.settings.slurm.hook_rate, metrics=self.metrics)
        app = build_app(self, hooks=hooks)
        host, port = parse_listen(self.settings.listen)
        context = None
        if self.tls_cert is not None and self.tls_key is not None:
            context = tls_context(str(self.tls_cert), str(self.tls_key))
        self._runner, self.http_port = await start_http(
            app, host, port, ssl_context=context, idle_timeout=self.http_idle_timeout)
        log.info("daemon.http", listen=f"{host}:{self.http_port}",
                 scheme="https" if context is not None else "http")

    async def _shutdown(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._follow_task
        if self._runner is not None:
            await self._runner.cleanup()
        if self.event_log is not None:
            await self.event_log.close()


def cmd_run(args: Any, settings: Settings) -> int:
    """`sunkd run [--tls-cert PEM --tls-key PEM]`."""
    import sys

    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if (cert is None) != (key is None):
        print("sunkd run: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if cert is not None and key is not None:
        try:
            tls_context(str(cert), str(key))
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            print(f"sunkd run: cannot use --tls-cert {cert} / --tls-key {key}: {error}",
                  file=sys.stderr)
            return 2
    # Before any thread exists (malloc.py says why).
    log.info("daemon.malloc", arenas=ARENAS if limit_arenas() else "glibc default or operator's",
             gc_thresholds=collector.tune())
    daemon = Daemon(settings, config_path=getattr(args, "config", None),
                    tls_cert=cert, tls_key=key, freeze_loaded_state=True)
    return asyncio.run(daemon.run())
