"""One queue for this process's write transactions, with the leadership lease first.

Why it exists: every append, snapshot and lease operation takes the same
database-wide lock (SQLite's write lock, taken by `BEGIN IMMEDIATE`; on PostgreSQL the
leadership row, `SELECT ... FOR UPDATE`). At 4,000 nodes the executor's sixteen action
outcomes and the sources' batches were all waiting for it at once. On SQLite the waiting
is done by the busy handler, which sleeps and retries ("sqlite3_busy_timeout(): the
handler will sleep multiple times until at least ms milliseconds of sleeping have
accumulated", https://www.sqlite.org/c3ref/busy_timeout.html): it is not a queue, nobody
is first, and a one-row append was seen to wait 15 s. The lease renewal was one more
waiter, lost the race past its deadline and the leader stepped down.

So the process queues its own writers here before it asks the database: one write
transaction of this process at a time (they would serialize on the lock anyway), in
arrival order, except that lease operations (acquire, renew, release) go before every
waiting append. A renewal then waits at most for the one transaction in progress.

Cancellation-safe: a waiter cancelled while the gate is being handed to it passes it
on, so a cancelled task can never leave the gate held (or the database lock with it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class WriteGate:
    """A lock with two queues: `urgent` waiters are served before `normal` ones, each
    queue first come, first served. Used from one event loop."""

    def __init__(self) -> None:
        self._held = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._normal: deque[asyncio.Future[None]] = deque()

    @property
    def held(self) -> bool:
        return self._held

    def waiting(self) -> int:
        """How many writers wait (for tests and diagnostics)."""
        return sum(1 for queue in (self._urgent, self._normal)
                   for future in queue if not future.done())

    @contextlib.asynccontextmanager
    async def hold(self, *, urgent: bool = False) -> AsyncIterator[None]:
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, urgent: bool) -> None:
        if not self._held and not self._urgent and (urgent or not self._normal):
            self._held = True
            return
        queue = self._urgent if urgent else self._normal
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed to us just as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(future)
            raise

    def _release(self) -> None:
        # Hand the gate straight to the next waiter (it stays held), so nobody can
        # barge in between.
        for queue in (self._urgent, self._normal):
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    return
        self._held = False
