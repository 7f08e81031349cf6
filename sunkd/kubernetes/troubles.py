"""What is wrong with the Kubernetes source right now, and what its health says.

Two kinds of trouble: its watches' (a list or watch failing, reported by each
`ListWatch`, retried by the loop itself) and its own side's (an append the log refused,
an internal error: `failed`), which make the source stale at once and are retried with
backoff. `verdict` turns them into the source's health: stale after repeated failures
(or at once for an immediate one), lost once unhealthy for `lost_after` seconds; a
single blip says nothing, the loop is already retrying.
"""

from __future__ import annotations

import time

from sunkd.kubernetes.listwatch import WatchTrouble
from sunkd.kubernetes.normalize import clean_text

RETRY_MAX_SECONDS = 30.0


class Troubles:
    """The source's current troubles, since when it is unhealthy, and its retry clock."""

    def __init__(self, *, stale_after_failures: int, lost_after: float) -> None:
        self.stale_after_failures = stale_after_failures
        self.lost_after = lost_after
        self.watches: dict[str, WatchTrouble] = {}
        # Failures of our own side (appends, internal errors), by kind.
        self.own: dict[str, WatchTrouble] = {}
        self.retry_at: float | None = None
        self.retry_delay = 1.0
        self.unhealthy_since: float | None = None

    def watch_failing(self, name: str, trouble: WatchTrouble) -> None:
        self.watches[name] = trouble
        if self.unhealthy_since is None:
            self.unhealthy_since = time.monotonic()

    def watch_ok(self, name: str) -> None:
        self.watches.pop(name, None)
        if not self.watches:
            self.unhealthy_since = None

    def failed(self, what: str, cause: str, error: Exception) -> str:
        """Our side failed (`what`: append | internal): record it and back off. Returns
        the error's cleaned detail."""
        previous = self.own.get(what)
        detail = clean_text(f"{type(error).__name__}: {error}")[:300]
        self.own[what] = WatchTrouble(
            cause, detail, (previous.consecutive if previous else 0) + 1, immediate=True)
        if self.unhealthy_since is None:
            self.unhealthy_since = time.monotonic()
        self.retry_at = time.monotonic() + self.retry_delay
        self.retry_delay = min(self.retry_delay * 2, RETRY_MAX_SECONDS)
        return detail

    def recovered(self, what: str) -> bool:
        """Our side's `what` works again; False when it was not failing."""
        if self.own.pop(what, None) is None:
            return False
        if not self.own:
            self.retry_at = None
            self.retry_delay = 1.0
        if not self.watches and not self.own:
            self.unhealthy_since = None
        return True

    def any(self) -> bool:
        return bool(self.watches or self.own)

    def verdict(self) -> tuple[str, WatchTrouble] | None:
        """(status, worst trouble) while troubled: "lost" or "stale"; None for a single
        blip. Only when `any()`."""
        worst = max([*self.watches.values(), *self.own.values()],
                    key=lambda t: (t.immediate, t.consecutive))
        if self.unhealthy_since is None:
            self.unhealthy_since = time.monotonic()
        if time.monotonic() - self.unhealthy_since >= self.lost_after:
            return "lost", worst
        if worst.immediate or worst.consecutive >= self.stale_after_failures:
            return "stale", worst
        return None
