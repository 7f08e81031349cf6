"""The event-log contract, run unchanged against SQLite and the real PostgreSQL.

Each test gets its own database (a fresh SQLite file or a fresh PostgreSQL database),
so parallel runs never collide.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import text

from sunkd.domain.events import (
    Event,
    LeaderElected,
    OperatorPinned,
    SlurmNodeObserved,
    UnknownPayload,
)
from sunkd.store import migrations_api
from sunkd.store.eventlog import EventLog, StaleLeaderError, create_engine
from sunkd.store.projections import CorruptRow


def observed(node: str, index: int = 0) -> Event:
    return Event(subject=node, payload=SlurmNodeObserved(
        node=node, state="IDLE", cpus=64, alloc_cpus=index % 64, partitions=("gpu",)))


async def open_leader(url: str, identity: str = "leader-a",
                      lease_seconds: float = 30.0) -> tuple[EventLog, int]:
    event_log = await EventLog.open(url, migrate=True)
    lease = await event_log.acquire(identity, lease_seconds)
    assert lease is not None
    return event_log, lease.epoch


async def test_append_assigns_contiguous_seqs_and_reads_back(database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    try:
        first = await event_log.append([observed("n1", i) for i in range(5)], epoch)
        second = await event_log.append([observed("n2")], epoch)
        # seq 1 is the leader.elected event written by acquire().
        assert first == [2, 3, 4, 5, 6]
        assert second == [7]
        assert await event_log.latest_seq() == 7
        everything = await event_log.read(0, 100)
        assert [e.seq for e in everything] == list(range(1, 8))
        assert isinstance(everything[0].payload, LeaderElected)
        assert everything[1].payload == observed("n1", 0).payload
        assert [e.seq for e in await event_log.read(3, 2)] == [4, 5]
        assert [e.seq for e in await event_log.read(0, 100, subject="n2")] == [7]
        assert [e.kind for e in await event_log.read(0, 100, kinds=["leader.elected"])] == [
            "leader.elected"]
    finally:
        await event_log.close()


async def test_concurrent_appends_are_gap_free_and_batches_stay_contiguous(
        database_url: str) -> None:
    leader, epoch = await open_leader(database_url)
    writers = [await EventLog.open(database_url) for _ in range(4)]
    try:
        async def write(writer: EventLog, name: str) -> list[list[int]]:
            return [await writer.append([observed(name, i) for i in range(7)], epoch)
                    for _ in range(10)]

        results = await asyncio.gather(*(write(w, f"w{i}") for i, w in enumerate(writers)))
        for batches in results:
            for seqs in batches:
                assert seqs == list(range(seqs[0], seqs[0] + 7))
        stored = await leader.read(0, 10_000)
        assert [e.seq for e in stored] == list(range(1, 1 + 1 + 4 * 10 * 7))
        # Within a batch the subjects are one writer's: batches were not interleaved.
        for batches in results:
            for seqs in batches:
                assert len({stored[s - 1].subject for s in seqs}) == 1
    finally:
        for writer in writers:
            await writer.close()
        await leader.close()


async def test_stale_epoch_cannot_append_and_takeover_fences_old_leader(
        database_url: str) -> None:
    old, old_epoch = await open_leader(database_url, "old", lease_seconds=0.3)
    new = await EventLog.open(database_url)
    try:
        with pytest.raises(StaleLeaderError):
            await old.append([observed("n1")], old_epoch + 1)
        assert await new.acquire("new") is None  # the old lease is still live
        await asyncio.sleep(0.5)
        lease = await new.acquire("new")
        assert lease is not None and lease.epoch == old_epoch + 1
        before = await old.latest_seq()
        with pytest.raises(StaleLeaderError):
            await old.append([observed("n1")], old_epoch)
        assert await old.latest_seq() == before
        from sunkd.store.eventlog import Lease
        with pytest.raises(StaleLeaderError):
            await old.renew(Lease("old", old_epoch, 0.3, 0.0))
        assert (await new.append([observed("n1")], lease.epoch)) == [before + 1]
        info = await new.leader()
        assert (info.holder, info.epoch) == ("new", old_epoch + 1)
        elected = await new.read(0, 100, kinds=["leader.elected"])
        assert [e.payload.epoch for e in elected if isinstance(e.payload, LeaderElected)] == [
            old_epoch, old_epoch + 1]
    finally:
        await old.close()
        await new.close()


async def test_fencing_during_takeover_race(database_url: str) -> None:
    """While a takeover happens, the old leader keeps appending: every append either
    lands before the takeover (old epoch) or is refused; none lands after it."""
    old, old_epoch = await open_leader(database_url, "old", lease_seconds=0.2)
    new = await EventLog.open(database_url)
    try:
        await asyncio.sleep(0.3)
        attempts = 0
        refused = 0

        async def keep_appending() -> None:
            nonlocal attempts, refused
            # Keep writing until a few appends have been refused (bounded).
            while refused < 5 and attempts < 5000:
                attempts += 1
                try:
                    await old.append([observed("old", attempts)], old_epoch)
                except StaleLeaderError:
                    refused += 1
                await asyncio.sleep(0)

        async def take_over() -> int:
            await asyncio.sleep(0.01)
            lease = await new.acquire("new")
            assert lease is not None
            return lease.epoch

        _, new_epoch = await asyncio.gather(keep_appending(), take_over())
        stored = await new.read(0, 10_000)
        takeover_seq = next(e.seq for e in stored if isinstance(e.payload, LeaderElected)
                            and e.payload.epoch == new_epoch)
        written = [e for e in stored if isinstance(e.payload, SlurmNodeObserved)]
        assert all(e.epoch == old_epoch for e in written)
        assert all(e.seq < takeover_seq for e in written)
        assert refused == 5
        assert attempts - refused == len(written)
    finally:
        await old.close()
        await new.close()


async def test_release_lets_a_standby_take_over_at_once(database_url: str) -> None:
    first, _ = await open_leader(database_url, "first", lease_seconds=60)
    try:
        lease = await first.acquire("second")
        assert lease is None
        info = await first.leader()
        from sunkd.store.eventlog import Lease
        await first.release(Lease("first", info.epoch, 60, 0.0))
        taken = await first.acquire("second", 60)
        assert taken is not None and taken.epoch == info.epoch + 1
    finally:
        await first.close()


def test_two_processes_racing_get_exactly_one_leader(database_url: str) -> None:
    asyncio.run(_migrate(database_url))
    script = textwrap.dedent(f"""
        import asyncio, time
        from sunkd.store.eventlog import EventLog
        async def main():
            log = await EventLog.open({database_url!r})
            while time.time() < START:
                await asyncio.sleep(0.001)
            lease = await log.acquire(IDENTITY, 60)
            print("LEADER" if lease else "STANDBY")
            await log.close()
        asyncio.run(main())
    """)
    import time
    start = time.time() + 2.0
    procs = [subprocess.Popen(
        [sys.executable, "-c", f"START={start}\nIDENTITY='p{i}'\n" + script],
        stdout=subprocess.PIPE, text=True) for i in range(4)]
    outputs = [proc.communicate(timeout=60)[0].strip().splitlines()[-1] for proc in procs]
    assert sorted(outputs) == ["LEADER", "STANDBY", "STANDBY", "STANDBY"], outputs


async def _migrate(url: str) -> None:
    engine = create_engine(url)
    try:
        await migrations_api.upgrade(engine)
    finally:
        await engine.dispose()


async def test_subscribe_yields_every_event_exactly_once_across_reconnects(
        database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    reader = await EventLog.open(database_url)
    seen: list[int] = []
    total_batches = 30

    async def consume() -> None:
        async for recorded in reader.subscribe(0):
            seen.append(recorded.seq)
            if len(seen) == 1 + total_batches * 3:
                return

    consumer = asyncio.create_task(consume())
    try:
        for batch in range(total_batches):
            await event_log.append([observed(f"n{batch}", i) for i in range(3)], epoch)
            if batch in (10, 20):
                await _drop_connections(database_url)
            await asyncio.sleep(0.01)
        await asyncio.wait_for(consumer, 30)
        assert seen == list(range(1, 2 + total_batches * 3))
    finally:
        consumer.cancel()
        await reader.close()
        await event_log.close()


async def test_subscribe_is_prompt(database_url: str) -> None:
    """A new event reaches a waiting subscriber well before the fallback re-read."""
    event_log, epoch = await open_leader(database_url)
    reader = await EventLog.open(database_url)
    try:
        iterator = reader.subscribe(await event_log.latest_seq())
        waiting = asyncio.ensure_future(iterator.__anext__())
        await asyncio.sleep(0.5)  # the subscriber is parked, listening
        loop = asyncio.get_running_loop()
        started = loop.time()
        await event_log.append([observed("prompt")], epoch)
        recorded = await asyncio.wait_for(waiting, 10)
        assert recorded.subject == "prompt"
        assert loop.time() - started < 0.5
    finally:
        await reader.close()
        await event_log.close()


async def _drop_connections(url: str) -> None:
    if not url.startswith("postgresql"):
        return
    import asyncpg

    from tests.conftest import postgres_base_url
    database = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(postgres_base_url().replace("postgresql+asyncpg", "postgresql"))
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database)
    finally:
        await admin.close()


async def test_events_table_rejects_update_delete_truncate(database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    try:
        await event_log.append([observed("n1")], epoch)
        statements = ["UPDATE events SET subject = 'x'", "DELETE FROM events"]
        if event_log.dialect == "postgresql":
            statements.append("TRUNCATE events")
        for statement in statements:
            with pytest.raises(Exception, match="append-only"):
                async with event_log.engine.begin() as connection:
                    await connection.execute(text(statement))
        assert await event_log.latest_seq() == 2
        assert [e.subject for e in await event_log.read(0, 10)] == ["leader-a", "n1"]
    finally:
        await event_log.close()


async def test_migrations_up_down_up(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        await migrations_api.upgrade(engine)
        assert await migrations_api.current_revision(engine) == migrations_api.head_revision()
        await migrations_api.downgrade(engine, "base")
        assert await migrations_api.current_revision(engine) is None
        async with engine.connect() as connection:
            tables = await connection.run_sync(
                lambda sync: __import__("sqlalchemy").inspect(sync).get_table_names())
        assert "events" not in tables
        await migrations_api.upgrade(engine)
        assert await migrations_api.current_revision(engine) == migrations_api.head_revision()
    finally:
        await engine.dispose()
    event_log, epoch = await open_leader(database_url)
    try:
        assert await event_log.append([observed("n1")], epoch) == [2]
    finally:
        await event_log.close()


async def test_open_without_migrate_on_empty_postgres_names_the_fix(postgres_url: str) -> None:
    # PostgreSQL only: SQLite, the embedded default, migrates automatically on open.
    with pytest.raises(migrations_api.SchemaError, match="sunkd migrate"):
        await EventLog.open(postgres_url)


async def test_unknown_kinds_and_fields_pass_through(database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    try:
        future = Event(subject="n1", payload=UnknownPayload(
            unknown_kind="slurm.node.teleported", data={"v": 3, "to": "mars"}))
        await event_log.append([future], epoch)
        async with event_log.engine.begin() as connection:
            await connection.execute(text(
                "INSERT INTO events (seq, recorded_at, kind, subject, epoch, payload) VALUES "
                "(3, CURRENT_TIMESTAMP, 'operator.pinned', 'n2', 0, "
                + ("CAST(:p AS JSONB))" if event_log.dialect == "postgresql" else ":p)")),
                {"p": '{"v": 2, "node": "n2", "to": "slurm", "who": "ops", "why": "x", '
                      '"ticket": "OPS-1"}'})
        stored = await event_log.read(1, 10)
        assert stored[0].payload == future.payload
        assert stored[0].kind == "slurm.node.teleported"
        pinned = stored[1].payload
        assert isinstance(pinned, OperatorPinned) and pinned.to == "slurm"
        assert pinned.extra["ticket"] == "OPS-1"
    finally:
        await event_log.close()


async def test_operator_input_is_unfenced_but_ordered(database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    try:
        seqs = await event_log.append_unfenced([Event(subject="n1", payload=OperatorPinned(
            node="n1", to="slurm", who="ops", why="maintenance"))])
        assert seqs == [2]
        assert (await event_log.read(1, 1))[0].epoch == 0
        assert await event_log.append([observed("n1")], epoch) == [3]
    finally:
        await event_log.close()


async def test_snapshots(database_url: str) -> None:
    event_log, _ = await open_leader(database_url)
    try:
        assert await event_log.latest_snapshot() is None
        await event_log.save_snapshot(5, {"nodes": {"n1": {"owner": "slurm"}}})
        await event_log.save_snapshot(9, {"nodes": {}})
        await event_log.save_snapshot(9, {"nodes": {}})  # idempotent
        assert await event_log.latest_snapshot() == (9, {"nodes": {}})
    finally:
        await event_log.close()


async def test_filtered_subscribe_misses_nothing_while_other_kinds_flow(
        database_url: str) -> None:
    """A kind-filtered subscriber skips over other kinds without skipping its own, even
    when they are appended between its read and its next position update."""
    event_log, epoch = await open_leader(database_url)
    reader = await EventLog.open(database_url)
    wanted: list[str] = []

    async def consume() -> None:
        async for recorded in reader.subscribe(0, kinds=["operator.pinned"]):
            assert isinstance(recorded.payload, OperatorPinned)
            wanted.append(recorded.payload.why)
            if len(wanted) == 40:
                return

    consumer = asyncio.create_task(consume())
    try:
        for index in range(40):
            await event_log.append([observed(f"n{index}")] * 3, epoch)
            await event_log.append([Event(subject="n", payload=OperatorPinned(
                node="n", to="auto", who="t", why=str(index)))], epoch)
            await asyncio.sleep(0)
        await asyncio.wait_for(consumer, 30)
        assert wanted == [str(index) for index in range(40)]
    finally:
        consumer.cancel()
        await reader.close()
        await event_log.close()


async def test_payload_values_survive_exactly(database_url: str) -> None:
    """Big integers, unicode and floats come back exactly as written (no lossy codec)."""
    event_log, epoch = await open_leader(database_url)
    try:
        data = {"v": 2, "big": 2**70, "text": "naïve ✓ \u2028", "ratio": 0.1, "neg": -0.0}
        await event_log.append([Event(subject="n", payload=UnknownPayload(
            unknown_kind="future.kind", data=data))], epoch)
        stored = (await event_log.read(1, 1))[0].payload
        assert isinstance(stored, UnknownPayload)
        assert stored.data == data and isinstance(stored.data["big"], int)
    finally:
        await event_log.close()


async def test_read_range_pages_a_finite_stretch(database_url: str) -> None:
    event_log, epoch = await open_leader(database_url)
    try:
        await event_log.append([observed(f"n{i}") for i in range(9)], epoch)  # seqs 2..10
        pages = [[e.seq for e in batch]
                 async for batch in event_log.read_range(1, upto=8, batch_size=3)]
        assert pages == [[2, 3, 4], [5, 6, 7], [8]]
        everything = [e.seq async for batch in event_log.read_range() for e in batch]
        assert everything == list(range(1, 11))
    finally:
        await event_log.close()


async def test_live_range_and_origin_name_the_log(database_url: str) -> None:
    """What the log guard and the tools read: the seqs still in the log and its first
    event, which a recreated database does not share."""
    event_log = await EventLog.open(database_url, migrate=True)
    try:
        assert await event_log.live_range() is None
        assert await event_log.origin() is None
        lease = await event_log.acquire("leader-a")  # seq 1: leader.elected
        assert lease is not None
        await event_log.append([observed("n1"), observed("n2")], lease.epoch)
        assert await event_log.live_range() == (1, 3)
        first = (await event_log.read(0, 1))[0]
        assert await event_log.origin() == (first.recorded_at.isoformat(),
                                            "leader.elected", "leader-a")
    finally:
        await event_log.close()


async def test_read_tolerant_names_a_corrupt_row_and_reads_past_it(database_url: str) -> None:
    """A row that does not decode comes back as a CorruptRow (the tools go on past it),
    and `first_corrupt_row` finds it; `read` itself fails on it."""
    event_log, epoch = await open_leader(database_url)
    try:
        await event_log.append([observed("n1")], epoch)  # seq 2
        cast = "CAST(:payload AS JSONB)" if event_log.dialect == "postgresql" else ":payload"
        async with event_log.engine.begin() as connection:  # as a broken tool would write it
            await connection.execute(text(
                "INSERT INTO events (seq, recorded_at, kind, subject, epoch, payload) VALUES "
                f"(3, CURRENT_TIMESTAMP, 'slurm.node.observed', 'n2', 0, {cast})"),
                {"payload": '{"v": 1, "node": "n2", "cpus": "many"}'})
        await event_log.append_unfenced([observed("n3")])  # seq 4
        with pytest.raises((ValueError, TypeError)):
            await event_log.read(0, 10)
        rows = await event_log.read_tolerant(1, 10)
        assert [row.seq for row in rows] == [2, 3, 4]
        corrupt = rows[1]
        assert isinstance(corrupt, CorruptRow)
        assert (corrupt.kind, corrupt.subject) == ("slurm.node.observed", "n2")
        assert "many" in corrupt.raw and "cpus" in corrupt.error
        assert [row.seq for row in await event_log.read_tolerant(
            0, 10, kinds=["slurm.node.observed"], subject="n3")] == [4]
        assert await event_log.read_tolerant(1, 10, upto=2) == rows[:1]
        assert await event_log.first_corrupt_row() == corrupt
        assert await event_log.first_corrupt_row(3) is None
        assert await event_log.first_corrupt_row(0, upto=2) is None
    finally:
        await event_log.close()
