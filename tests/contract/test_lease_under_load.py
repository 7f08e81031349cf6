"""In the store: a lease renewal is not starved by this process's appends, and
a write whose caller is cancelled is never abandoned half-way (on SQLite an abandoned
`BEGIN IMMEDIATE` kept the database's write lock until the garbage collector freed the
connection, and the lone daemon could never acquire its lease again). Both backends."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.store.eventlog import EventLog

WRITERS = 16  # the executor's max_concurrent_actions


def _events(count: int, tag: str = "") -> list[Event]:
    return [Event(subject=f"n{i}", payload=SlurmNodeObserved(node=f"n{i}", state="IDLE",
                                                              comment=tag or None))
            for i in range(count)]


@pytest.fixture
def no_gc() -> Iterator[None]:
    """What a quiet daemon with a big heap looks like: the cyclic collector does not run."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_renewal_goes_before_a_burst_of_appends(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    stop = asyncio.Event()

    async def writer(index: int) -> None:
        single, big = _events(1), _events(300)
        while not stop.is_set():
            await log.append(big if index == 0 else single, lease.epoch)

    try:
        lease = await log.acquire("d1", 15)
        assert lease is not None
        writers = [asyncio.create_task(writer(i)) for i in range(WRITERS)]
        await asyncio.sleep(1.0)  # every writer is appending or queued
        waits = []
        for _ in range(10):
            started = time.monotonic()
            lease = await log.renew(lease)
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*writers)
        # Behind at most the one transaction in progress (300 rows), never behind the
        # queue: before the write gate the slowest renewal here took seconds.
        assert max(waits) < 0.5, [round(wait, 3) for wait in waits]
    finally:
        stop.set()
        await log.close()


async def _hold_append_lock(log: EventLog, held: asyncio.Event, release: asyncio.Event
                            ) -> None:
    """Another writer holding the append lock (SQLite's write lock; the leadership row)."""
    async with log.engine.connect() as connection:
        if log.dialect == "sqlite":
            await connection.execution_options(sqlite_begin="IMMEDIATE")
        async with connection.begin():
            if log.dialect == "postgresql":
                await connection.execute(text("SELECT 1 FROM leadership FOR UPDATE"))
            held.set()
            await release.wait()


@pytest.mark.usefixtures("no_gc")
async def test_a_cancelled_append_runs_to_completion_and_leaves_no_lock(
        database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("d1", 15)
        assert lease is not None
        held, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_append_lock(log, held, release))
        await held.wait()
        appending = asyncio.create_task(log.append(_events(1, "cancelled"), lease.epoch))
        await asyncio.sleep(0.3)  # waiting for the lock
        appending.cancel()
        await asyncio.sleep(0.01)
        appending.cancel()  # twice, as a term that ends does to an action's task
        with pytest.raises(asyncio.CancelledError):
            await appending
        release.set()
        await holder
        # The write went on without its caller: committed, and the lock is free again.
        for _ in range(200):
            if any(getattr(e.payload, "comment", None) == "cancelled"
                   for e in await log.read(0, 100)):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the cancelled append was abandoned (rolled back)")
        async with asyncio.timeout(10):
            renewed = await log.renew(lease)
            assert await log.append(_events(1, "after"), renewed.epoch)
            await log.release(renewed)
            assert await log.acquire("d2", 15) is not None
    finally:
        await log.close()


@pytest.mark.usefixtures("no_gc")
async def test_a_renewal_that_times_out_leaves_no_lock(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("d1", 15)
        assert lease is not None
        held, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_append_lock(log, held, release))
        await held.wait()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await log.renew(lease)
        release.set()
        await holder
        async with asyncio.timeout(10):
            lease = await log.renew(lease)
            assert await log.append(_events(1), lease.epoch)
    finally:
        await log.close()
