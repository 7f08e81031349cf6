"""`Reconciler.defer`: records not worth a commit of their own (a Slurm hook's record of
a read that changed nothing, sunkd/runtime/hooks.py) go into the log with the term's
next append, fenced by its epoch like everything else, or alone once they have waited
`DEFERRED_SECONDS`; the caller of the append gets its own seqs only."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sunkd.domain.events import Event, SlurmHookReceived, SourceHealth
from sunkd.runtime import reconciler as reconciler_module
from sunkd.runtime.reconciler import LeaderTerm, Reconciler
from sunkd.store.eventlog import EventLog, StaleLeaderError


def _record(job: int) -> Event:
    return Event("slurm", SlurmHookReceived(event="prolog-slurmctld", job_id=job,
                                            received_at=1.0))


def _fresh(source: str) -> Event:
    return Event(source, SourceHealth(source=source, status="fresh"))


async def test_deferred_records_ride_on_the_next_append(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        engine = Reconciler(log)
        term = LeaderTerm(lease.epoch, lambda: True)
        before = await log.latest_seq()
        engine.defer([_record(1), _record(2)])
        assert await log.latest_seq() == before  # nothing written for them alone
        seqs = await engine.append([_fresh("slurm")], term)
        written = await log.read(before)
        assert [e.kind for e in written] == ["slurm.hook", "slurm.hook", "source.health"]
        assert seqs == [written[-1].seq]
        assert len({e.recorded_at for e in written}) == 1  # one transaction
        assert {e.epoch for e in written} == {lease.epoch}
        assert await engine.append([_fresh("kubernetes")], term) == [written[-1].seq + 1]
        # A deposed term's append writes nothing, the deferred records included.
        engine.defer([_record(3)])
        with pytest.raises(StaleLeaderError):
            await engine.append([_fresh("slurm")], LeaderTerm(lease.epoch + 1, lambda: True))
        assert all(not isinstance(e.payload, SlurmHookReceived) or e.payload.job_id != 3
                   for e in await log.read(before))
    finally:
        await log.close()


async def test_deferred_records_are_appended_alone_when_nothing_else_comes(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reconciler_module, "DEFERRED_SECONDS", 0.2)
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        engine = Reconciler(log, tick_seconds=0.02)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(LeaderTerm(lease.epoch, lambda: True)))
        try:
            await asyncio.sleep(0.3)  # the term's own first appends are done
            before = await log.latest_seq()
            engine.defer([_record(7)])
            await engine.wait_folded(before + 1, within=5)
            written = await log.read(before)
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert [e.kind for e in written] == ["slurm.hook"]
    finally:
        await log.close()
