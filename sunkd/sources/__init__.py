"""Sources: turn Slurm and Kubernetes API state into normalized observation events.

A source never writes to the log itself: it hands batches of events to an `EventSink`
(the daemon appends them with its leader epoch; tests pass a real EventLog). A source
emits an observation only when the normalized content changed; it is seeded with the
last observed payloads (from the fold) so a restart does not re-emit everything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sunkd.domain.events import Event

EventSink = Callable[[Sequence[Event]], Awaitable[object]]
