"""Whether the event log takes this process's appends: readiness follows the append path.

A source's health lives in the log, so a log that refuses every append (INSERT revoked,
a full disk, a missing partition) also refuses the event that would say the source is
stale: the fold keeps saying "fresh" while nothing observed since reaches it. This
watch sits between each source and the log's sink and remembers, per source, since when
its appends fail and why; `/readyz`, `sunkd_source_fresh` and the leader's term read it.
A fenced refusal (StaleLeaderError) is not the log failing but our term ending: it is
passed on untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sunkd.domain.events import Event
from sunkd.domain.ports import EventSink
from sunkd.store.eventlog import StaleLeaderError


@dataclass(frozen=True, slots=True)
class Refusal:
    since: float  # time.monotonic() of the first failed append of the current run
    error: str  # the last failure, as `Type: message`


class AppendWatch:
    """Per source: since when its appends fail (None: the last one succeeded)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failing: dict[str, Refusal] = {}
        self._all_since: float | None = None  # every append of the process fails since

    def wrap(self, source: str, sink: EventSink) -> EventSink:
        async def watched(events: Sequence[Event]) -> object:
            try:
                result = await sink(events)
            except StaleLeaderError:
                raise
            except Exception as error:
                self.failed(source, f"{type(error).__name__}: {error}"[:300])
                raise
            self.succeeded(source)
            return result

        return watched

    def failed(self, source: str, error: str) -> None:
        now = self._clock()
        previous = self._failing.get(source)
        self._failing[source] = Refusal(previous.since if previous else now, error)
        if self._all_since is None:
            self._all_since = now

    def succeeded(self, source: str) -> None:
        self._failing.pop(source, None)
        self._all_since = None

    def refusal(self, source: str) -> Refusal | None:
        return self._failing.get(source)

    def failing_sources(self) -> frozenset[str]:
        return frozenset(self._failing)

    def all_failing_for(self) -> float:
        """Seconds since which every append of this process failed (0: one succeeded)."""
        return 0.0 if self._all_since is None else self._clock() - self._all_since

    def reset(self) -> None:
        """A term ended: its sources are gone, and what they could not append is the
        next leader's to observe again."""
        self._failing.clear()
        self._all_since = None
