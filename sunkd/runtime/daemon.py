"""The sunkd process: its life cycle, signals, systemd and HTTP.

Life cycle:
  1. open the log (SQLite migrates itself; PostgreSQL must be migrated), load the
     latest snapshot plus the tail (`Reconciler.load`), start following the log, guarding
     it (`LogGuard`) and serving HTTP; tell systemd READY=1 (and WATCHDOG=1 periodically
     when it asks for it).
  2. campaign for the lease (`Leadership.serve`). As a standby, keep folding the log so
     the read API is current. Holding the lease, lead one `Term` on it at a time.
  3. SIGTERM/SIGINT: stop deciding, let in-flight actions finish (bounded), release
     the lease so a standby takes over immediately, exit 0. SIGHUP: reload the
     config file (pools, log level). A fatal error (an undecodable row, a log that
     went backwards) stops the process the same way, with exit status 1.

Who owns what: `Leadership` the leases and the clock, `Term` one term's tasks, the
`Reconciler` the folded state and the outbox, `Adapters` the clients; the daemon
only builds them in order and stops them in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from sunkd.api.app import HTTP_IDLE_TIMEOUT, api_pools, build_app, start_http, tls_context
from sunkd.api.extender import ApiPool
from sunkd.api.metrics import Metrics
from sunkd.domain.events import EventDecodeError
from sunkd.domain.state import ClusterState
from sunkd.runtime import collector
from sunkd.runtime.adapters import Adapters
from sunkd.runtime.appends import AppendWatch
from sunkd.runtime.config import Settings, load_settings, parse_listen, pool_spec
from sunkd.runtime.leadership import Leadership, TermEnd
from sunkd.runtime.logguard import LOG_CHECK_INTERVAL, SHRANK_HINT, LogGuard
from sunkd.runtime.logs import configure_logging
from sunkd.runtime.reconciler import ArchivedLogError, CorruptRowError, Reconciler
from sunkd.runtime.term import Term
from sunkd.store.eventlog import EventLog, Lease, LogShrankError

if TYPE_CHECKING:
    from sunkd.kubernetes.client import KubeClient
    from sunkd.runtime.hooks import HookReceiver
    from sunkd.slurm.client import SlurmRestClient

log = structlog.get_logger(__name__)


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


async def _watchdog() -> None:
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        # Only a live event loop gets here; a wedged loop stops the pings and
        # systemd restarts us.
        sd_notify("WATCHDOG=1")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------- daemon

class Daemon:
    """One sunkd process. `slurm_client`/`kube_client` may be injected (demo, tests);
    otherwise each term builds them from the settings. The objects that need the open
    log (`event_log`, `leadership`, `reconciler`, `log_guard`) exist once `run` opened it."""

    def __init__(self, settings: Settings, *, config_path: Path | None = None,
                 slurm_client: SlurmRestClient | None = None,
                 kube_client: KubeClient | None = None,
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
        self.config_path = config_path
        self.adapters = Adapters(settings, slurm_client=slurm_client, kube_client=kube_client,
                                 slurm_env=slurm_env)
        self.metrics = Metrics()
        self.appends = AppendWatch()  # does the log take our sources' appends?
        self.metrics.append_failing = self.appends.failing_sources
        self.stop_event = asyncio.Event()
        self.fatal_error: str | None = None
        self.http_port: int | None = None
        self.event_log: EventLog | None = None
        self.leadership: Leadership | None = None
        self.reconciler: Reconciler | None = None
        self.log_guard: LogGuard | None = None
        self.term: Term | None = None  # the one leading now, or the last one
        self.hooks: HookReceiver | None = None  # when slurm.hook_token_file is set
        self._follow_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None

    # ----------------------------------------------------------------- DaemonView

    def state(self) -> ClusterState:
        return self.reconciler.state if self.reconciler is not None else ClusterState()

    def is_leader(self) -> bool:
        leadership = self.leadership
        return leadership is not None and leadership.leading() and leadership.may_act()

    def is_ready(self) -> tuple[bool, str]:
        if self._follow_task is None or self._follow_task.done():
            return False, "not following the event log"
        unreachable = self.log_guard.unreachable() if self.log_guard is not None else None
        if unreachable is not None:
            return False, unreachable
        state = self.state()
        for source in self.adapters.enabled_sources():
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

    # ------------------------------------------------------------------- running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop_event.set)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        settings = self.settings
        self.event_log = event_log = await EventLog.open(settings.database_url,
                                                         migrate_apart=True)
        event_log.wall_clock = self._wall
        try:
            self.leadership = leadership = Leadership(
                event_log, identity=settings.identity, lease_seconds=settings.lease_seconds,
                max_clock_skew=settings.max_clock_skew_seconds, metrics=self.metrics,
                wall_clock=self._wall)
            self.reconciler = reconciler = Reconciler(
                event_log,
                config_pools=[pool_spec(pool) for pool in settings.pools],
                snapshot_every=settings.snapshot_every,
                snapshots_kept=settings.snapshots_kept,
                snapshot_in_child=settings.snapshot_encoder == "child",
                observer=self.metrics,
                clock=leadership.clock,
            )
            if settings.slurm.hook_token_file is not None:
                from sunkd.runtime.hooks import HookReceiver

                self.hooks = HookReceiver(state=self.state, may_act=leadership.may_act,
                                          metrics=self.metrics, fence=settings.slurm.hook_fence,
                                          wall_clock=self._wall)
            if (failed := await self._load(reconciler)) is not None:
                return failed
            self.log_guard = guard = LogGuard(event_log, folded=lambda: reconciler.state.last_seq,
                                              interval=self.log_check_interval)
            await guard.remember()
            self._follow_task = asyncio.create_task(reconciler.follow(), name="sunkd-follow")
            self._follow_task.add_done_callback(self._follow_ended)
            guarding = asyncio.create_task(guard.run(self.stop_event, self._fatal),
                                           name="sunkd-log-guard")
            await self._start_http()
            sd_notify("READY=1\nSTATUS=following the event log")
            watchdog = asyncio.create_task(_watchdog(), name="sunkd-watchdog")
            try:
                await leadership.serve(self.stop_event, self._lead)
            finally:
                watchdog.cancel()
                guarding.cancel()
                sd_notify("STOPPING=1")
        finally:
            await self._shutdown()
        return 1 if self.fatal_error else 0

    async def _load(self, reconciler: Reconciler) -> int | None:
        """Load the log; the exit status when it cannot be trusted."""
        try:
            await reconciler.load()
        except CorruptRowError as error:
            return self._fatal(f"the event log has an undecodable row: {error}",
                               seq=error.row.seq)
        except EventDecodeError as error:
            return self._fatal(f"the event log has an undecodable event: {error}")
        except ArchivedLogError as error:
            return self._fatal(str(error), hint="restore the archive base snapshot, or "
                               "check the log with `sunkd replay --check --archive DIR`")
        except LogShrankError as error:
            return self._fatal(f"{error}. Do not start sunkd on it: {SHRANK_HINT}",
                               hint=SHRANK_HINT)
        if self.freeze_loaded_state:
            # The loaded state lives long: out of every later collection.
            log.info("daemon.gc_frozen", objects=collector.freeze())
        return None

    async def _lead(self, lease: Lease) -> TermEnd:
        """Lead one term on `lease` (`Leadership.serve` calls this for each)."""
        assert self.event_log is not None and self.leadership is not None
        assert self.reconciler is not None
        sd_notify(f"STATUS=leader (epoch {lease.epoch})")
        self.term = Term(
            lease, settings=self.settings, event_log=self.event_log,
            leadership=self.leadership, reconciler=self.reconciler, adapters=self.adapters,
            appends=self.appends, metrics=self.metrics, hooks=self.hooks,
            stop=self.stop_event, fatal=self._fatal, fatal_error=lambda: self.fatal_error,
            wall_clock=self._wall)
        return await self.term.run()

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
        lease = self.leadership.lease if self.leadership is not None else None
        self.metrics.set_leader(False, lease.epoch if lease else 0)
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

    def reload(self) -> None:
        """SIGHUP: the config file's pools and log level (nothing else changes live)."""
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
        if self.reconciler is not None:
            self.reconciler.config_pools = tuple(pool_spec(pool) for pool in settings.pools)
        log.info("daemon.reloaded", pools=[pool.name for pool in settings.pools])

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
