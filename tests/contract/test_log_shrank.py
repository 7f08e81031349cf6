"""A missing partition must not fork the log (PostgreSQL).

`ALTER TABLE events DETACH PARTITION` of the live partition (a DBA's or a maintenance
script's mistake) hides every row in it. The next append used to take `max(seq) + 1 = 1`
(into the default partition), which made re-attaching impossible, and the guard told
the operator to restart, which began a new log that forgot the hidden history, pins
included. Now an append at or below what the process has seen is refused before it is
written, the daemon's fatal message says not to restart until the rows are back, and
a start on a log shorter than its snapshot refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.domain.snapshot import state_to_json
from sunkd.runtime.daemon import Daemon
from sunkd.runtime.reconciler import load_state
from sunkd.store.eventlog import EventLog, LogShrankError
from tests.contract.test_roles import _admin
from tests.integration.test_hostile_daemon import running, settings_for

pytestmark = pytest.mark.timeout(120)


async def _fill(url: str, count: int) -> EventLog:
    log = await EventLog.open(url, migrate=True)
    await log.append_unfenced([Event(f"n{i}", SlurmNodeObserved(node=f"n{i}"))
                               for i in range(count)])
    return log


async def _live_partition(log: EventLog) -> str:
    rows = await log.read(0, 1)
    assert rows
    async with log.engine.connect() as connection:
        return str((await connection.execute(text(
            "SELECT tableoid::regclass::text FROM events WHERE seq = :seq"),
            {"seq": rows[0].seq})).scalar_one())


async def _rows(log: EventLog) -> tuple[int, int]:
    """(count, max seq) of every row of `events`, default partition included."""
    async with log.engine.connect() as connection:
        row = (await connection.execute(text(
            "SELECT count(*), coalesce(max(seq), 0) FROM events"))).one()
    return int(row[0]), int(row[1])


async def test_an_append_after_the_live_partition_is_detached_is_refused(
        postgres_url: str) -> None:
    log = await _fill(postgres_url, 5)
    try:
        partition = await _live_partition(log)
        await _admin(f"ALTER TABLE events DETACH PARTITION {partition}", postgres_url)
        with pytest.raises(LogShrankError) as refused:
            await log.append_unfenced([Event("n9", SlurmNodeObserved(node="n9"))])
        assert "seq 5" in str(refused.value) and "nothing was written" in str(refused.value)
        assert await _rows(log) == (0, 0)
        # Nothing was written, so the partition goes back, and the log goes on after it.
        await _admin(f"ALTER TABLE events ATTACH PARTITION {partition} "
                     f"{await _bounds(log, partition)}", postgres_url)
        assert await log.append_unfenced([Event("n9", SlurmNodeObserved(node="n9"))]) == [6]
    finally:
        await log.close()


async def _bounds(log: EventLog, partition: str) -> str:
    """The bounds the partition had (its name says where it starts: events_s<first>)."""
    async with log.engine.connect() as connection:
        size = int((await connection.execute(text(
            "SELECT partition_size FROM sunkd_partitioning"))).scalar_one())
    first = int(partition.rsplit("_s", 1)[1])
    return f"FOR VALUES FROM ({first}) TO ({first + size})"


async def test_a_leader_whose_partition_vanishes_says_not_to_restart(
        postgres_url: str) -> None:
    log = await _fill(postgres_url, 20)
    try:
        partition = await _live_partition(log)
        daemon = Daemon(settings_for(postgres_url))
        daemon.log_check_interval = 0.3
        async with running(daemon) as task:
            assert daemon.is_leader()
            for _ in range(200):
                if daemon.state().last_seq > 20:
                    break
                await asyncio.sleep(0.05)
            before = await _rows(log)
            await _admin(f"ALTER TABLE events DETACH PARTITION {partition}", postgres_url)
            assert await asyncio.wait_for(task, 60) == 1
        assert daemon.fatal_error is not None
        assert "do not restart" in daemon.fatal_error.lower(), daemon.fatal_error
        assert await _rows(log) == (0, 0)  # nothing forged meanwhile
        await _admin(f"ALTER TABLE events ATTACH PARTITION {partition} "
                     f"{await _bounds(log, partition)}", postgres_url)
        # Every row is back, gap-free: the daemon may have appended one more (a source's
        # report) between `before` and the DETACH, never a row with a reused seq.
        count, last = await _rows(log)
        assert count == last and count >= before[0], (count, last, before)
    finally:
        await log.close()


async def test_a_start_on_a_log_shorter_than_its_snapshot_refuses(postgres_url: str) -> None:
    log = await _fill(postgres_url, 20)
    try:
        state, _ = await load_state(log)
        await log.save_snapshot(state.last_seq, state_to_json(state))
        partition = await _live_partition(log)
        await _admin(f"ALTER TABLE events DETACH PARTITION {partition}", postgres_url)
        daemon = Daemon(settings_for(postgres_url))
        assert await asyncio.wait_for(daemon.run(), 60) == 1
        assert daemon.fatal_error is not None
        assert "snapshot" in daemon.fatal_error and "seq 20" in daemon.fatal_error, \
            daemon.fatal_error
        assert "do not restart" in daemon.fatal_error.lower(), daemon.fatal_error
        assert await _rows(log) == (0, 0)  # no leader.elected at seq 1
    finally:
        await log.close()


async def test_a_start_on_a_log_shorter_than_its_archive_base_refuses(
        postgres_url: str, tmp_path: Path) -> None:
    """After `sunkd log archive`, the rows up to the archive's base are gone from the
    database on purpose; the live partition detached on top of it leaves a log that ends
    before the base the archive recorded: a start refuses (it must not begin the log anew
    at seq 1 and fork it from the archive)."""
    from sunkd.store import archive
    from tests.contract.test_archive import small_partitions

    log = await EventLog.open(postgres_url, migrate=True)
    try:
        await small_partitions(log, 10)
        await log.append_unfenced([Event(f"n{i}", SlurmNodeObserved(node=f"n{i}"))
                                   for i in range(25)])
        result = await archive.archive(log, tmp_path / "archive", upto_seq=24)
        assert result is not None
        base = result.upto_seq
        assert await log.archive_base_seq() == base and 0 < base < 25
        partition = await _live_partition(log)
        await _admin(f"ALTER TABLE events DETACH PARTITION {partition}", postgres_url)
        daemon = Daemon(settings_for(postgres_url))
        assert await asyncio.wait_for(daemon.run(), 60) == 1
        assert daemon.fatal_error is not None
        assert f"seq {base}" in daemon.fatal_error, daemon.fatal_error
        assert "do not restart" in daemon.fatal_error.lower(), daemon.fatal_error
        assert await _rows(log) == (0, 0)  # no leader.elected at seq 1
    finally:
        await log.close()
