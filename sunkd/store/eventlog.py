"""The append-only event log: append (fenced by the leader epoch), read, subscribe,
and the database lease that decides who the leader is.

Ordering and fencing share one mechanism: every append locks the single leadership
row (`SELECT ... FOR UPDATE` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite), checks the
writer's epoch, and assigns `seq = max(seq) + 1` explicitly. Appends are therefore
serialized, so sequence numbers are gap-free and commit order equals seq order; a
reader that has seen seq N can never later find a smaller seq appear (which an
identity column alone allows under concurrency, because sequences are handed out
before commit). The check of the epoch happens inside the same transaction as the
insert, so a deposed leader cannot slip a write in after a takeover.

Subscribers are woken by LISTEN/NOTIFY on PostgreSQL (the NOTIFY is sent inside the
appending transaction and delivered on commit) and by an in-process bus on SQLite.
A wake-up only says "read again from your last seq": delivery is driven by seq, so a
lost notification or a dropped connection can delay an event but never lose or
duplicate it. A slow fallback re-read covers writers in other processes (SQLite) and
notifications lost while the LISTEN connection was being re-established.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import structlog
from sqlalchemy import event as sa_event
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sunkd.domain.events import (
    Event,
    LeaderElected,
    RecordedEvent,
    decode_payload,
    encode_payload,
)
from sunkd.store.migrations_api import ensure_schema
from sunkd.store.models import LEADERSHIP_ROW, events, leadership, snapshots

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "sunkd_events"
_INSERT_COLUMNS = ("seq", "recorded_at", "kind", "subject", "epoch", "causation_seq", "payload")


class StaleLeaderError(Exception):
    """The writer's epoch is not the current leadership epoch: it must step down."""


@dataclass(frozen=True)
class Lease:
    """A held leadership lease. `renewed_monotonic` is the local monotonic clock taken
    *before* the acquire/renew request was sent, so the local view of expiry is never
    later than the database's."""

    identity: str
    epoch: int
    lease_seconds: float
    renewed_monotonic: float

    def remaining(self, now_monotonic: float | None = None) -> float:
        now = time.monotonic() if now_monotonic is None else now_monotonic
        return self.renewed_monotonic + self.lease_seconds - now


@dataclass(frozen=True)
class LeaderInfo:
    holder: str | None
    epoch: int
    renewed_at: datetime | None
    lease_seconds: float


class _WakeBus:
    """Generation counter + condition: waiters never miss a wake-up that happened
    between their read and their wait."""

    def __init__(self) -> None:
        self.generation = 0
        self._condition: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _cond(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._condition is None or self._loop is not loop:
            self._condition = asyncio.Condition()
            self._loop = loop
        return self._condition

    async def notify(self) -> None:
        self.generation += 1
        condition = self._cond()
        async with condition:
            condition.notify_all()

    async def wait(self, seen_generation: int, wait_seconds: float) -> None:
        condition = self._cond()
        async with condition:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    condition.wait_for(lambda: self.generation != seen_generation), wait_seconds
                )


# SQLite: one bus per database file, shared by every EventLog of this process.
_SQLITE_BUSES: dict[str, _WakeBus] = {}


def _sqlite_timestamp(moment: datetime) -> str:
    # SQLAlchemy's SQLite DateTime storage format (naive UTC).
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class EventLog:
    """The event log on one database (PostgreSQL or SQLite)."""

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url
        self.dialect = engine.dialect.name
        self._listener_task: asyncio.Task[None] | None = None
        self._closed = False
        if self.dialect == "sqlite":
            database = make_url(url).database or ""
            key = str(Path(database).resolve()) if database not in ("", ":memory:") else url
            self._bus = _SQLITE_BUSES.setdefault(key, _WakeBus())
            self._fallback_interval = 1.0
        else:
            self._bus = _WakeBus()
            self._fallback_interval = 5.0

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(cls, url: str, *, migrate: bool | None = None) -> EventLog:
        """Open the log. Migrations run automatically on SQLite (the embedded default)
        or when `migrate=True`; otherwise the schema must already be at head."""
        engine = create_engine(url)
        should_migrate = (engine.dialect.name == "sqlite") if migrate is None else migrate
        try:
            await ensure_schema(engine, migrate=should_migrate)
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine, url)

    async def close(self) -> None:
        self._closed = True
        if self._listener_task is not None:
            self._listener_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener_task
            self._listener_task = None
        await self.engine.dispose()

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # --------------------------------------------------------------------- writes

    async def append(self, batch: Sequence[Event], epoch: int) -> list[int]:
        """Append a batch atomically; returns the assigned seqs in order.

        Raises StaleLeaderError (and writes nothing) when `epoch` is not the current
        leadership epoch, checked under the same lock as the insert."""
        return await self._append(batch, epoch, fenced=True)

    async def append_unfenced(self, batch: Sequence[Event]) -> list[int]:
        """Append operator input (pins from the CLI) that is not a leader's decision.

        Recorded with epoch 0 ("no leader wrote this"); still serialized with every
        other append so seqs stay gap-free and ordered."""
        return await self._append(batch, 0, fenced=False)

    async def _append(self, batch: Sequence[Event], epoch: int, *, fenced: bool) -> list[int]:
        if not batch:
            return []
        encoded = [dumps_json(encode_payload(item.payload)) for item in batch]
        async with self._write_transaction() as connection:
            current_epoch, last_seq, now = await self._lock_for_append(connection)
            if fenced and epoch != current_epoch:
                raise StaleLeaderError(
                    f"append with epoch {epoch} refused: the current leadership epoch is "
                    f"{current_epoch}")
            first_seq = last_seq + 1
            seqs = list(range(first_seq, first_seq + len(batch)))
            if self.dialect == "postgresql":
                raw = await connection.get_raw_connection()
                driver = raw.driver_connection
                assert driver is not None
                # The driver's COPY path inside our own transaction: the fastest way
                # PostgreSQL ingests rows, and still atomic with the epoch check.
                await driver.copy_records_to_table(
                    "events",
                    records=[
                        (seq, now, item.kind, item.subject, epoch, item.causation_seq, body)
                        for seq, item, body in zip(seqs, batch, encoded, strict=True)
                    ],
                    columns=_INSERT_COLUMNS,
                )
                await connection.execute(text("SELECT pg_notify(:channel, :seq)"),
                                         {"channel": NOTIFY_CHANNEL, "seq": str(seqs[-1])})
            else:
                stamp = _sqlite_timestamp(now)
                await connection.exec_driver_sql(
                    "INSERT INTO events (seq, recorded_at, kind, subject, epoch, causation_seq, "
                    "payload) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (seq, stamp, item.kind, item.subject, epoch, item.causation_seq, body)
                        for seq, item, body in zip(seqs, batch, encoded, strict=True)
                    ],
                )
        if self.dialect == "sqlite":
            await self._bus.notify()
        return seqs

    @contextlib.asynccontextmanager
    async def _write_transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as connection:
            if self.dialect == "sqlite":
                # BEGIN IMMEDIATE takes SQLite's write lock up front, so two writers
                # serialize instead of failing with "database is locked" on upgrade.
                await connection.execution_options(sqlite_begin="IMMEDIATE")
            async with connection.begin():
                yield connection

    async def _lock_for_append(self, connection: AsyncConnection) -> tuple[int, int, datetime]:
        """Lock the leadership row; return (current epoch, last seq, now)."""
        if self.dialect == "postgresql":
            # Two statements on purpose: under READ COMMITTED a statement's snapshot is
            # taken before it waits for the row lock, so a max(seq) subquery in the
            # locking statement could miss the rows of the append we waited for and
            # hand out a duplicate seq. The second statement sees them.
            epoch = (await connection.execute(text(
                "SELECT epoch FROM leadership WHERE id = :id FOR UPDATE"),
                {"id": LEADERSHIP_ROW})).scalar_one()
            row = (await connection.execute(text(
                "SELECT coalesce(max(seq), 0), clock_timestamp() FROM events"))).one()
            return int(epoch), int(row[0]), _as_utc(row[1])
        # SQLite: BEGIN IMMEDIATE already holds the database's write lock.
        row = (await connection.execute(text(
            "SELECT epoch, (SELECT coalesce(max(seq), 0) FROM events) FROM leadership "
            "WHERE id = :id"), {"id": LEADERSHIP_ROW})).one()
        return int(row[0]), int(row[1]), datetime.now(UTC)

    async def _db_now(self, connection: AsyncConnection) -> datetime:
        if self.dialect == "postgresql":
            # The database's clock, not this host's: lease expiry must mean the same
            # thing to every candidate, whatever their clock skew.
            result = await connection.execute(text("SELECT clock_timestamp()"))
            return _as_utc(result.scalar_one())
        return datetime.now(UTC)

    # ---------------------------------------------------------------------- reads

    async def read(self, after_seq: int = 0, limit: int = 1000, kinds: Iterable[str] | None = None,
                   subject: str | None = None, upto: int | None = None) -> list[RecordedEvent]:
        """Events with after_seq < seq (<= upto) in seq order, at most `limit`."""
        query = select(events).where(events.c.seq > after_seq).order_by(events.c.seq).limit(limit)
        if upto is not None:
            query = query.where(events.c.seq <= upto)
        if kinds is not None:
            query = query.where(events.c.kind.in_(list(kinds)))
        if subject is not None:
            query = query.where(events.c.subject == subject)
        async with self.engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [_to_recorded(row._mapping) for row in rows]

    async def read_range(self, after_seq: int = 0, upto: int | None = None, *,
                         batch_size: int = 5000) -> AsyncIterator[list[RecordedEvent]]:
        """The events after `after_seq` (up to `upto`, else up to what exists now),
        page by page: for replays, reports and checks that read a finite stretch."""
        position = after_seq
        while upto is None or position < upto:
            limit = batch_size if upto is None else min(batch_size, upto - position)
            batch = await self.read(position, limit)
            if not batch:
                return
            yield batch
            position = batch[-1].seq

    async def latest_seq(self) -> int:
        async with self.engine.connect() as connection:
            result = await connection.execute(select(func.coalesce(func.max(events.c.seq), 0)))
            return int(result.scalar_one())

    async def subscribe(self, after_seq: int = 0, *, batch_size: int = 1000,
                        kinds: Iterable[str] | None = None) -> AsyncIterator[RecordedEvent]:
        """Yield every event with seq > after_seq exactly once, in order, forever.

        Database errors (a dropped connection, a restarting server) are retried with
        backoff; the position is the last yielded seq, so nothing is skipped or
        repeated across reconnects."""
        async for batch in self.subscribe_batches(after_seq, batch_size=batch_size,
                                                  kinds=kinds):
            for recorded in batch:
                yield recorded

    async def subscribe_batches(self, after_seq: int = 0, *, batch_size: int = 1000,
                                kinds: Iterable[str] | None = None
                                ) -> AsyncIterator[list[RecordedEvent]]:
        """`subscribe`, one non-empty batch at a time (what is available at once):
        consumers that fold can apply a batch in one go."""
        kind_list = list(kinds) if kinds is not None else None
        if self.dialect == "postgresql":
            self._ensure_listener()
        position = after_seq
        backoff = 0.1
        while not self._closed:
            generation = self._bus.generation
            try:
                # With a kind filter, an empty answer must still advance the position,
                # but only up to what existed *before* the read: an event appended in
                # between would otherwise be skipped. (Seqs commit in order, so every
                # event up to `latest` is visible to the read that follows.)
                latest = await self.latest_seq() if kind_list is not None else None
                batch = await self.read(position, batch_size, kinds=kind_list, upto=latest)
            except (TimeoutError, OSError, DBAPIError, OperationalError) as error:
                log.warning("eventlog.subscribe.read_failed", error=str(error), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            if batch:
                position = batch[-1].seq
                yield batch
                continue
            if latest is not None and latest > position:
                position = latest  # nothing of the wanted kinds up to here
                continue
            await self._bus.wait(generation, self._fallback_interval)

    def _ensure_listener(self) -> None:
        if self._listener_task is None or self._listener_task.done():
            self._listener_task = asyncio.create_task(self._listen_forever(),
                                                      name="sunkd-eventlog-listen")

    async def _listen_forever(self) -> None:
        """Keep one LISTEN connection open; reconnect with backoff when it drops."""
        import asyncpg

        dsn = make_url(self.url).set(drivername="postgresql").render_as_string(
            hide_password=False)
        backoff = 0.2
        while not self._closed:
            connection: Any = None
            try:
                connection = await asyncpg.connect(dsn, timeout=10)
                lost = asyncio.Event()
                connection.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await connection.add_listener(
                    NOTIFY_CHANNEL, lambda *_args: asyncio.ensure_future(self._bus.notify()))
                backoff = 0.2
                # Anything appended while we were not listening: make readers look.
                await self._bus.notify()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), 5.0)
                    if not lost.is_set():
                        # A half-open TCP connection never signals termination.
                        await asyncio.wait_for(connection.execute("SELECT 1"), 5.0)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure means: reconnect
                log.warning("eventlog.listen.lost", error=str(error), retry_in=backoff)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(connection.close(), 2.0)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    # ----------------------------------------------------------------- leadership

    async def acquire(self, identity: str, lease_seconds: float = 15.0) -> Lease | None:
        """Become leader if nobody holds a live lease. A takeover (and any new
        acquisition) increments the epoch; the new leader's first append is its
        `leader.elected` event. Returns None when someone else holds a live lease."""
        started = time.monotonic()
        async with self._write_transaction() as connection:
            row = await self._locked_leadership_row(connection)
            now = await self._db_now(connection)
            holder = row["holder"]
            renewed_at = _as_utc(row["renewed_at"]) if row["renewed_at"] is not None else None
            live = (
                holder is not None
                and renewed_at is not None
                and renewed_at + timedelta(seconds=float(row["lease_seconds"])) > now
            )
            if live:
                return None
            epoch = int(row["epoch"]) + 1
            await connection.execute(
                leadership.update()
                .where(leadership.c.id == LEADERSHIP_ROW)
                .values(holder=identity, epoch=epoch, renewed_at=now, lease_seconds=lease_seconds)
            )
        lease = Lease(identity, epoch, lease_seconds, started)
        await self.append([Event(subject=identity,
                                 payload=LeaderElected(epoch=epoch, identity=identity))], epoch)
        log.info("leadership.acquired", identity=identity, epoch=epoch,
                 previous_holder=holder)
        return lease

    async def _locked_leadership_row(self, connection: AsyncConnection) -> Any:
        """The leadership row, locked until the transaction ends (SQLite: BEGIN
        IMMEDIATE already holds the write lock)."""
        query = select(leadership).where(leadership.c.id == LEADERSHIP_ROW)
        if self.dialect == "postgresql":
            query = query.with_for_update()
        return (await connection.execute(query)).one()._mapping

    async def renew(self, lease: Lease) -> Lease:
        """Extend the lease; raises StaleLeaderError if it was taken over."""
        started = time.monotonic()
        async with self._write_transaction() as connection:
            row = await self._locked_leadership_row(connection)
            if row["holder"] != lease.identity or int(row["epoch"]) != lease.epoch:
                raise StaleLeaderError(
                    f"lease epoch {lease.epoch} lost: now held by {row['holder']!r} "
                    f"at epoch {row['epoch']}")
            now = await self._db_now(connection)
            await connection.execute(
                leadership.update().where(leadership.c.id == LEADERSHIP_ROW).values(renewed_at=now)
            )
        return Lease(lease.identity, lease.epoch, lease.lease_seconds, started)

    async def release(self, lease: Lease) -> None:
        """Give up the lease so a standby can take over at once (graceful shutdown)."""
        async with self._write_transaction() as connection:
            await connection.execute(
                leadership.update()
                .where(leadership.c.id == LEADERSHIP_ROW)
                .where(leadership.c.holder == lease.identity)
                .where(leadership.c.epoch == lease.epoch)
                .values(holder=None, renewed_at=None)
            )

    async def leader(self) -> LeaderInfo:
        async with self.engine.connect() as connection:
            row = (await connection.execute(
                select(leadership).where(leadership.c.id == LEADERSHIP_ROW))).one()._mapping
        renewed_at = _as_utc(row["renewed_at"]) if row["renewed_at"] is not None else None
        return LeaderInfo(row["holder"], int(row["epoch"]), renewed_at, float(row["lease_seconds"]))

    # ------------------------------------------------------------------ snapshots

    async def save_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        async with self._write_transaction() as connection:
            query = select(snapshots.c.seq).where(snapshots.c.seq == seq)
            if (await connection.execute(query)).first() is None:
                await connection.execute(snapshots.insert().values(
                    seq=seq, taken_at=datetime.now(UTC), state=state))

    async def latest_snapshot(self) -> tuple[int, dict[str, Any]] | None:
        async with self.engine.connect() as connection:
            row = (await connection.execute(
                select(snapshots.c.seq, snapshots.c.state).order_by(snapshots.c.seq.desc()).limit(1)
            )).first()
        if row is None:
            return None
        return int(row.seq), dict(row.state)


def _to_recorded(row: Any) -> RecordedEvent:
    payload = row["payload"]
    if isinstance(payload, str):  # a driver that returns JSON as text
        payload = json.loads(payload)
    return RecordedEvent(
        seq=int(row["seq"]),
        recorded_at=_as_utc(row["recorded_at"]),
        epoch=int(row["epoch"]),
        subject=row["subject"],
        payload=decode_payload(row["kind"], payload),
        causation_seq=row["causation_seq"],
    )


def dumps_json(value: Any) -> str:
    """Compact JSON text. orjson is ~10x faster than the stdlib here, which is most of
    an append's CPU (bench/eventlog.py); the stdlib takes over for what orjson refuses
    (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))


def create_engine(url: str) -> AsyncEngine:
    """An async engine with the settings sunkd relies on for each backend."""
    # Reads keep the stdlib parser: orjson turns integers beyond 64 bits into floats,
    # and a payload from a newer writer must come back exactly as it was written.
    codecs: dict[str, Any] = {"json_serializer": dumps_json}
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30}, **codecs)

        @sa_event.listens_for(engine.sync_engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let us issue BEGIN ourselves (pysqlite's implicit transactions would
            # defeat BEGIN IMMEDIATE), and use WAL so readers never block the writer.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @sa_event.listens_for(engine.sync_engine, "begin")
        def _sqlite_begin(connection: Any) -> None:
            mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
            connection.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return create_async_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                               connect_args={"timeout": 10, "command_timeout": 60}, **codecs)
