"""The log guard: is the event log reachable, and is it still the log this process folded?

A database recreated (or restored from an older backup) under a running daemon used to
leave it "ready" on a log it never folded again. Every few seconds the guard checks that
the log does not end before what was folded and that its first row is the one loaded;
either failing stops the process (`Fatal`). A log that does not answer makes `/readyz`
answer 503 after a short grace (`unreachable`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from sunkd.runtime.ports import Fatal
from sunkd.runtime.reconciler import LogWentBackwardsError
from sunkd.store.eventlog import EventLog, LogShrankError

log = structlog.get_logger(__name__)

LOG_CHECK_INTERVAL = 2.0
# How long one check may take, and for how long failed checks make /readyz answer 503.
LOG_CHECK_TIMEOUT = 5.0
LOG_UNREACHABLE_GRACE = 3.0
# What to do when the log lost rows: a restart would begin the log anew after its
# current end and forget what the missing rows hold (operators' pins included).
SHRANK_HINT = ("do not restart sunkd until the missing rows are back: re-attach a detached "
               "partition, or restore the database from a backup that has them; a restart "
               "on the shorter log begins it anew after its end and forgets their history, "
               "operators' pins included")


class LogGuard:
    """Watches one event log for going away, shrinking or being replaced."""

    def __init__(self, event_log: EventLog, *, folded: Callable[[], int],
                 interval: float = LOG_CHECK_INTERVAL) -> None:
        self._log = event_log
        self._folded = folded  # the seq this process has folded up to
        self.interval = interval
        self._identity: tuple[str, str, str] | None = None  # the log's first row
        self._failed_since: float | None = None
        self._error = ""

    async def remember(self) -> None:
        """Record which log this is (right after loading it)."""
        self._identity = await self._log.origin()

    def unreachable(self) -> str | None:
        """Why `/readyz` should fail, when the log has not answered for the grace."""
        failed_since = self._failed_since
        if failed_since is None or time.monotonic() - failed_since < LOG_UNREACHABLE_GRACE:
            return None
        return (f"event log unreachable for {time.monotonic() - failed_since:.0f} s:"
                f" {self._error}")

    async def check(self) -> None:
        """Raise LogShrankError when the log ends before what we folded, and
        LogWentBackwardsError when its first row is not the one we loaded."""
        folded = self._folded()
        latest = await self._log.latest_seq()
        if latest < folded:
            raise LogShrankError(
                f"the event log went backwards: it ends at seq {latest}, but this process "
                f"has folded it up to seq {folded}")
        # What identifies this log: its first event (seq 1), as the row or, once
        # `sunkd log archive` removed it, as the `log.archived` event recorded it.
        identity = await self._log.origin()
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity:
            raise LogWentBackwardsError(
                f"the event log was replaced: its first row is now {identity!r}, it was "
                f"{self._identity!r}")

    async def run(self, stop: asyncio.Event, fatal: Fatal) -> None:
        """Check every `interval` until `stop`; a replaced log stops the process (the
        restart loads it as it is), a shrunk one too (without a restart: SHRANK_HINT)."""
        while not stop.is_set():
            try:
                async with asyncio.timeout(LOG_CHECK_TIMEOUT):
                    await self.check()
            except LogShrankError as error:
                fatal(f"{error} (a detached partition? the database recreated, or "
                      f"restored from an older backup?). Do not restart: {SHRANK_HINT}",
                      hint=SHRANK_HINT)
                return
            except LogWentBackwardsError as error:
                fatal(f"{error} (was the database recreated, or restored from an older "
                      "backup?). Restart sunkd to load the log as it is now",
                      hint="check the database; a restart starts from the log as it is now")
                return
            except Exception as error:
                if self._failed_since is None:
                    self._failed_since = time.monotonic()
                    log.warning("daemon.log_unreachable", error=str(error)[:300])
                self._error = f"{type(error).__name__}: {error}"[:300]
            else:
                if self._failed_since is not None:
                    log.info("daemon.log_reachable")
                self._failed_since = None
            await asyncio.sleep(self.interval)
