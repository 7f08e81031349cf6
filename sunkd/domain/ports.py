"""Ports: the two shapes every adapter shares, so the Slurm and Kubernetes packages and
the runtime agree on them without importing each other.

* `EventSink`: a source never writes to the log itself; it hands batches of events to a
  sink (the daemon appends them with its leader epoch; tests pass a real EventLog). A
  source emits an observation only when the normalized content changed; it is seeded with
  the last observed payloads (from the fold) so a restart does not re-emit everything.
* `ActionError`: every actuator method is idempotent and returns whether it changed
  anything (`False` = the world already was as wanted). Failures raise `ActionError`,
  whose `retryable` flag tells the outbox whether to try again later (a PDB's 429, a 409
  race that ran out of retries, a timeout) or to give up and record why (a foreign drain,
  a missing node, a permission error).

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sunkd.domain.events import Event

EventSink = Callable[[Sequence[Event]], Awaitable[object]]
class ActionError(Exception):
    """An action could not be carried out."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class RefusedError(ActionError):
    """sunkd refused on purpose: the target is not ours to change (foreign drain or
    cordon). Never retried; the outbox records it and emits a warning."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
