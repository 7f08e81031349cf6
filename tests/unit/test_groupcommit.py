"""GroupAppender: outcomes that arrive while a transaction runs go together into the next
one, in order; a failed append fails exactly its own batch; a cancelled waiter's event is
still written."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sunkd.domain.events import Event, SourceHealth
from sunkd.runtime.groupcommit import GroupAppender
from sunkd.store.eventlog import StaleLeaderError


def _event(name: str) -> Event:
    return Event(name, SourceHealth(source="slurm", status="fresh"))


class SlowLog:
    """An append that takes a while, like a commit's fsync, and records its batches."""

    def __init__(self, fail_batches: Sequence[int] = ()) -> None:
        self.batches: list[list[str]] = []
        self.fail_batches = set(fail_batches)
        self.release = asyncio.Event()
        self.release.set()
        self._seq = 0

    async def append(self, events: Sequence[Event]) -> list[int]:
        self.batches.append([event.subject for event in events])
        await self.release.wait()
        await asyncio.sleep(0.01)
        if len(self.batches) in self.fail_batches:
            raise StaleLeaderError("fenced")
        seqs = list(range(self._seq + 1, self._seq + 1 + len(events)))
        self._seq += len(events)
        return seqs


async def test_a_lone_event_is_appended_at_once() -> None:
    log = SlowLog()
    appender = GroupAppender(log.append)
    assert await appender.append(_event("a")) == 1
    assert log.batches == [["a"]]


async def test_events_arriving_during_a_transaction_share_the_next_one_in_order() -> None:
    log = SlowLog()
    log.release.clear()
    appender = GroupAppender(log.append)
    first = asyncio.create_task(appender.append(_event("a")))
    await asyncio.sleep(0)  # "a" is being written
    rest = [asyncio.create_task(appender.append(_event(name))) for name in "bcdefgh"]
    await asyncio.sleep(0)
    log.release.set()
    seqs = await asyncio.gather(first, *rest)
    assert log.batches == [["a"], list("bcdefgh")]
    assert seqs == list(range(1, 9))
    assert appender.transactions == 2


async def test_batches_are_capped() -> None:
    log = SlowLog()
    log.release.clear()
    appender = GroupAppender(log.append, max_batch=3)
    tasks = [asyncio.create_task(appender.append(_event(str(i)))) for i in range(7)]
    await asyncio.sleep(0)
    log.release.set()
    assert await asyncio.gather(*tasks) == list(range(1, 8))
    assert [len(batch) for batch in log.batches] == [3, 3, 1]


async def test_a_failed_append_fails_its_batch_only() -> None:
    log = SlowLog(fail_batches=[2])
    log.release.clear()
    appender = GroupAppender(log.append, max_batch=2)
    tasks = [asyncio.create_task(appender.append(_event(str(i)))) for i in range(5)]
    await asyncio.sleep(0)
    log.release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[:2] == [1, 2]
    assert all(isinstance(result, StaleLeaderError) for result in results[2:4])
    assert results[4] == 3  # the next batch is tried afresh
    assert await appender.append(_event("later")) == 4


async def test_a_cancelled_waiter_still_has_its_event_written() -> None:
    log = SlowLog()
    log.release.clear()
    appender = GroupAppender(log.append)
    blocker = asyncio.create_task(appender.append(_event("a")))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(appender.append(_event("b")))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    log.release.set()
    await blocker
    await appender.close()
    assert log.batches == [["a"], ["b"]]


async def test_a_short_seq_list_fails_the_batch_instead_of_hanging() -> None:
    async def short(events: Sequence[Event]) -> list[int]:
        return [1]

    appender = GroupAppender(short)
    tasks = [asyncio.create_task(appender.append(_event(name))) for name in "ab"]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(result, RuntimeError) for result in results)
