"""Group commit for the outbox's action outcomes: one write transaction for all the
outcomes that are ready at once.

Why: each executed action appends its outcome (`action.succeeded` / `action.failed`), and
the next action starts only when a slot frees, i.e. after that append. On SQLite every
commit is an fsync (WAL with `synchronous=FULL`: "a WAL file is synced before each
transaction commit", https://www.sqlite.org/pragma.html#pragma_synchronous), ~40 ms on
the benchmark machine, and the process writes one transaction at a time (writegate.py).
So sixteen actions in flight ran about 25 a second whatever the actuators' latency: the
adoption of 10,000 nodes took 8 minutes (docs/performance.md, "Scale").

Here an outcome waits while a transaction is in progress and goes with every other
outcome that arrived meanwhile into the next one, in arrival order. Nothing is held back
when nothing is being written: a lone outcome is appended at once. An append that fails
fails for every outcome in it (each caller sees the same exception: a fenced term's
StaleLeaderError, say); the next batch is tried afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from sunkd.domain.events import Event

Append = Callable[[Sequence[Event]], Awaitable[list[int]]]

MAX_BATCH = 256  # outcomes per transaction; more wait for the next one


class GroupAppender:
    """Appends events through `append`, batching those submitted while one is running.
    Used from one event loop."""

    def __init__(self, append: Append, max_batch: int = MAX_BATCH) -> None:
        self._append = append
        self._max_batch = max_batch
        self._queue: list[tuple[Event, asyncio.Future[int]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.transactions = 0  # appends made (for tests and diagnostics)

    async def append(self, event: Event) -> int:
        """Append `event` with whatever else is waiting; its seq once committed."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self._queue.append((event, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="sunkd-group-commit")
        # A caller cancelled while waiting leaves its event queued: it is still appended
        # (the action did run), only nobody waits for the seq.
        return await asyncio.shield(future)

    async def _write(self) -> None:
        while self._queue:
            batch, self._queue = (self._queue[:self._max_batch],
                                  self._queue[self._max_batch:])
            try:
                self.transactions += 1
                seqs = await self._append([event for event, _ in batch])
                if len(seqs) != len(batch):
                    raise RuntimeError(f"append returned {len(seqs)} seqs for "
                                       f"{len(batch)} events")
            except BaseException as error:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    for _, future in self._queue:
                        if not future.done():
                            future.set_exception(error)
                    self._queue = []
                    raise
                continue
            for (_, future), seq in zip(batch, seqs, strict=True):  # lengths checked
                if not future.done():
                    future.set_result(seq)

    async def close(self) -> None:
        """Wait for the batch being written and those queued behind it."""
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.gather(writer, return_exceptions=True)


def _retrieved(future: asyncio.Future[int]) -> None:
    """Mark an exception as seen: a caller cancelled while waiting never reads it, and
    asyncio would log "exception was never retrieved" for it."""
    if not future.cancelled():
        future.exception()
