"""The append-only event log: append (fenced by the leader epoch), read, subscribe,
and the database lease that decides who the leader is.

Ordering and fencing share one mechanism: every append locks the single leadership
row (`SELECT ... FOR UPDATE` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite), checks the
writer's epoch, and assigns `seq = max(seq) + 1` explicitly. Appends are therefore
serialized, so sequence numbers are gap-free and commit order equals seq order; a
reader that has seen seq N can never later find a smaller seq appear (which an
identity column alone allows under concurrency, because sequences are handed out
before commit). The check of the epoch happens inside the same transaction as the
insert, so a deposed leader cannot slip a write in after a takeover. `max(seq)` can
shrink under the process (a detached partition hides its rows), so an append whose
seq this process has already seen is refused (LogShrankError) before it is written:
it would fork the log, and the hidden rows could never be put back.

Subscribers are woken by LISTEN/NOTIFY on PostgreSQL (the NOTIFY is sent inside the
appending transaction and delivered on commit) and by an in-process bus on SQLite.
A wake-up only says "read again from your last seq": delivery is driven by seq, so a
lost notification or a dropped connection can delay an event but never lose or
duplicate it. A slow fallback re-read covers writers in other processes (SQLite) and
notifications lost while the LISTEN connection was being re-established.

What differs between the two databases (engine settings, taking the lock, the bulk
insert, the clock, the wake-ups) lives behind one interface, `Backend`
(sunkd.store.backend), with one implementation per database: `PostgresBackend`
(sunkd.store.postgres) and `SqliteBackend` (sunkd.store.sqlite). This module holds only
what is the same on both, and picks the backend by the engine's dialect name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import orjson
import structlog
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import Event, LeaderElected, LogArchived, RecordedEvent
from sunkd.store.backend import Backend, EventRow, as_utc
from sunkd.store.migrate_apart import migrate_in_child
from sunkd.store.migrations_api import NotASunkdLog, at_head, ensure_schema, require_log
from sunkd.store.models import LEADERSHIP_ROW, events, leadership, snapshots
from sunkd.store.postgres import NOTIFY_CHANNEL, PostgresBackend
from sunkd.store.projections import CorruptRow, ReadModels, first_corrupt_row, read_tolerant
from sunkd.store.recent import RecentAppends
from sunkd.store.sqlite import SqliteBackend
from sunkd.store.writegate import WriteGate

__all__ = [
    "NOTIFY_CHANNEL",
    "Access",
    "EventLog",
    "LeaderInfo",
    "Lease",
    "LogShrankError",
    "NotASunkdLog",
    "StaleLeaderError",
    "backend_class",
    "create_engine",
    "database_name",
    "dumps_json",
    "sqlite_path",
]

log = structlog.get_logger(__name__)

# Lease lengths the log writes and believes: finite, positive, at most a day. The row
# is shared by every replica, so a number in it is never used unchecked: a NaN written
# by a daemon that accepted `SUNKD_LEASE_SECONDS=nan` made `timedelta(seconds=nan)`
# fail every acquisition, forever.
MAX_LEASE_SECONDS = 86400.0


def _valid_lease_seconds(value: object) -> bool:
    # Not a str either: SQLite can hand back text ('nan') from a REAL column.
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= MAX_LEASE_SECONDS)


def _row_lease_seconds(row: Any, fallback: float) -> float:
    """The row's lease length, or `fallback` (the caller's own) when the row's number
    cannot be trusted: the holder is then judged by our lease length, so a corrupt row
    neither wedges acquisition nor lets a just-renewed holder be taken over at once."""
    value = row["lease_seconds"]
    if _valid_lease_seconds(value):
        return float(value)
    log.warning("leadership.bad_lease_row", lease_seconds=repr(value), holder=row["holder"],
                using=fallback)
    return fallback


# The supported databases, by SQLAlchemy dialect name.
_BACKENDS: dict[str, type[Backend]] = {
    backend.dialect: backend for backend in (PostgresBackend, SqliteBackend)}


def backend_class(dialect: str) -> type[Backend]:
    """The backend for a SQLAlchemy dialect name (`engine.dialect.name`)."""
    try:
        return _BACKENDS[dialect]
    except KeyError:
        raise ValueError(f"unsupported database {dialect!r}: sunkd's event log runs on "
                         f"{' or '.join(sorted(_BACKENDS))}") from None


# Snapshots kept after each save (they were never pruned).
SNAPSHOTS_KEPT = 3


# How a command opens the log: "create" may create and migrate it (run, demo, migrate);
# "write" appends to an existing one (pin, log archive/restore); "read" only reads.
Access = Literal["create", "write", "read"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _runs_to_completion(
    method: Callable[Concatenate[EventLog, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[EventLog, _P], Coroutine[Any, Any, _R]]:
    """Run a write in a task of its own that a cancelled caller does not cancel: the
    caller stops waiting, the transaction commits or rolls back, the connection goes
    back to its pool.

    Why (measured at 10,000 nodes on SQLite): a term that ended cancelled
    appends that were waiting for the write lock; SQLAlchemy then gives up on such a
    connection ("terminates" it), and one whose `BEGIN IMMEDIATE` had just been granted
    stayed open, write transaction and all, until Python's cyclic garbage collector
    happened to free it. Nothing else ran in the process, so that took forever: every
    `acquire()` of the lone daemon waited out the busy timeout on its own lock
    ("database is locked"); a `gc.collect()` freed it at once. A write that is never
    abandoned half-way cannot leave the lock behind. (A cancelled caller does not learn
    whether its write committed, as before.)"""

    @functools.wraps(method)
    async def wrapper(self: EventLog, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        task = asyncio.ensure_future(method(self, *args, **kwargs))
        self._writes.add(task)
        task.add_done_callback(_write_done)
        task.add_done_callback(self._writes.discard)
        return await asyncio.shield(task)

    return wrapper


def _write_done(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: the caller may have stopped waiting for it


class StaleLeaderError(Exception):
    """The writer's epoch is not the current leadership epoch: it must step down."""


class LogShrankError(Exception):
    """The log ends before a seq this process has already seen (rows went missing: a
    detached partition, a restore from an older backup). Nothing was written: an append
    there would reuse seqs the missing rows hold, and the log could not be made whole
    again."""


@dataclass(frozen=True)
class Lease:
    """A held leadership lease. `renewed_monotonic` is the local monotonic clock taken
    *before* the acquire/renew request was sent, so the local view of expiry is never
    later than the database's."""

    identity: str
    epoch: int
    lease_seconds: float
    renewed_monotonic: float
    # The database clock minus this host's wall clock, measured at this acquire/renew (the
    # midpoint of the clock query). Event times are the database's, so the policy's `now`
    # must be too: host time + db_offset (docs/safety.md, "Clocks").
    db_offset: float = 0.0

    def remaining(self, now_monotonic: float | None = None) -> float:
        now = time.monotonic() if now_monotonic is None else now_monotonic
        return self.renewed_monotonic + self.lease_seconds - now


@dataclass(frozen=True)
class LeaderInfo:
    holder: str | None
    epoch: int
    renewed_at: datetime | None
    lease_seconds: float


class EventLog:
    """The event log on one database (PostgreSQL or SQLite)."""

    def __init__(self, engine: AsyncEngine, url: str, *, access: Access = "create") -> None:
        self.engine = engine
        self.url = url
        self.dialect = engine.dialect.name
        self._backend = backend_class(self.dialect)(url)
        self._closed = False
        # This process's write transactions queue here, the lease first (store/writegate.py),
        # and the lease has a connection pool of its own, so a renewal never waits for a
        # connection behind a burst of appends. An in-memory SQLite database
        # exists once per connection pool, so it keeps the one engine.
        self._gate = WriteGate()
        self._writes: set[asyncio.Future[Any]] = set()  # writes in progress
        self.access: Access = access
        self._lease_engine = engine if _in_memory(url) or access == "read" else \
            create_engine(url, create=access == "create")
        self.wall_clock: Callable[[], float] = time.time  # this host's clock (tests skew it)
        # What this process appended lately: a read of it shares the objects (recent.py).
        self.recent = RecentAppends()
        # The highest seq this process has seen (appended, read or folded): the log never
        # legitimately ends before it, so an append that would reuse it is refused.
        self.high_seq = 0

    def saw(self, seq: int) -> None:
        """This process has seen the log reach `seq` (e.g. a snapshot's seq, folded)."""
        self.high_seq = max(self.high_seq, seq)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(cls, url: str, *, migrate: bool | None = None,
                   migrate_apart: bool = False, access: Access = "create") -> EventLog:
        """Open the log. `access="create"` (`sunkd run`, `demo`, tests): migrations run
        automatically on SQLite (the embedded default) or when `migrate=True`; otherwise
        the schema must already be at head. `migrate_apart`: a SQLite file is migrated in
        a child process, so this one never imports Alembic (`sunkd run`:
        store/migrate_apart.py).

        `access="read"` (status, events, audit, ...) and `access="write"` (pin, log
        archive, ...) never create, migrate or change anything to open: the database must
        already hold a sunkd log at head (else `NotASunkdLog` / `SchemaError`), checked
        through a read-only engine; a "read" log keeps that engine, so it cannot write."""
        if access != "create":
            return await cls._open_existing(url, access)
        engine = create_engine(url)
        if migrate is None:
            migrate = backend_class(engine.dialect.name).migrate_by_default
        try:
            if (migrate and migrate_apart and engine.dialect.name == "sqlite"
                    and not _in_memory(url)):
                if not await at_head(engine):  # at head (every restart): one read, done
                    await migrate_in_child(url)
                    await ensure_schema(engine, migrate=migrate)
            else:
                await ensure_schema(engine, migrate=migrate)
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine, url)

    @classmethod
    async def _open_existing(cls, url: str, access: Access) -> EventLog:
        where = _where(url)
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite" and not _in_memory(url) \
                and not Path(parsed.database or "").is_file():
            raise NotASunkdLog(where, "no such file")
        engine = create_engine(url, read_only=True)
        try:
            try:
                await require_log(engine, where)
            except DBAPIError as error:
                if parsed.get_backend_name() != "sqlite":
                    raise  # PostgreSQL unreachable, refused...: says nothing of the data
                raise NotASunkdLog(where, str(error.orig)) from None  # not a database file
        except BaseException:
            await engine.dispose()
            raise
        if access == "read":
            return cls(engine, url, access=access)
        await engine.dispose()
        return cls(create_engine(url, create=False), url, access=access)

    async def close(self) -> None:
        self._closed = True
        if self._writes:  # let abandoned writes finish (bounded by the busy timeout)
            await asyncio.wait(list(self._writes), timeout=35.0)
        await self._backend.close()
        await self.engine.dispose()
        if self._lease_engine is not self.engine:
            await self._lease_engine.dispose()

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

    @_runs_to_completion
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
            if last_seq < self.high_seq:
                raise LogShrankError(
                    f"append refused: the event log ends at seq {last_seq}, but this "
                    f"process has already seen seq {self.high_seq}; rows are missing (a "
                    "detached partition? a restore from an older backup?) and nothing was "
                    "written")
            first_seq = last_seq + 1
            seqs = list(range(first_seq, first_seq + len(batch)))
            recorded_at = self._backend.recorded_at(now)
            rows: list[EventRow] = [
                (seq, recorded_at, item.kind, item.subject, epoch, item.causation_seq, body)
                for seq, item, body in zip(seqs, batch, encoded, strict=True)
            ]
            await self._backend.insert_events(connection, rows)
            await self._backend.announce(connection, seqs[-1])
        self.recent.remember(seqs, (item.payload for item in batch))  # committed
        self.saw(seqs[-1])
        await self._backend.announce_committed()
        return seqs

    @contextlib.asynccontextmanager
    async def _write_transaction(self, *, lease: bool = False,
                                 big_values: bool = False) -> AsyncIterator[AsyncConnection]:
        """A write transaction holding the database's append lock. Lease operations
        (`lease=True`) go first in this process's queue and use their own pool.
        `big_values`: the connection is closed after the commit, for it keeps a copy of
        what it sent. Python's sqlite3 resets a cached statement without
        sqlite3_clear_bindings() and binds text as SQLITE_TRANSIENT (SQLite copies it);
        asyncpg's connection keeps the buffer it grew to send the largest message. So each
        pooled connection that wrote a snapshot held one, ~26 MB at 10,000 nodes
        (tests/contract/test_snapshot_pruning.py). Snapshots are rare: a reconnect is
        cheap next to them."""
        engine = self._lease_engine if lease else self.engine
        async with self._gate.hold(urgent=lease), engine.connect() as connection:
            await self._backend.prepare_write(connection)
            try:
                async with connection.begin():
                    yield connection
            except TimeoutError as error:
                # The driver's statement timeout (asyncpg's `command_timeout`) raises a
                # TimeoutError without a message; an outer deadline would cancel instead.
                if str(error):
                    raise
                raise TimeoutError(
                    "a write to the event log waited longer than the database's statement "
                    "timeout, most likely for the leadership row, which another transaction "
                    "holds (a migration, `sunkd log archive`, a session left open: "
                    "PostgreSQL's pg_locks shows which); nothing was written") from None
            if big_values and not _in_memory(self.url):  # its only connection: the data
                await connection.invalidate()  # the pool opens a fresh one when needed

    # The two hooks below are methods of the EventLog (not only of its backend) so that
    # a subclass can stamp appends and leases with a clock of its own (tests/seeding.py).

    async def _lock_for_append(self, connection: AsyncConnection) -> tuple[int, int, datetime]:
        """Lock the leadership row; return (current epoch, last seq, now)."""
        return await self._backend.lock_for_append(connection)

    async def _db_now(self, connection: AsyncConnection) -> datetime:
        return await self._backend.db_now(connection)

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
        if rows:
            self.saw(int(rows[-1]._mapping["seq"]))
        return [_to_recorded(row._mapping, self.recent) for row in rows]

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

    async def live_range(self) -> tuple[int, int] | None:
        """(first, last) seq still in the log, None when it is empty (`sunkd log archive`
        removes the oldest seqs, so the first is not always 1)."""
        async with self.engine.connect() as connection:
            row = (await connection.execute(select(func.min(events.c.seq),
                                                   func.max(events.c.seq)))).one()
        return None if row[0] is None else (int(row[0]), int(row[1]))

    async def origin(self) -> tuple[str, str, str] | None:
        """What identifies this log (the daemon's guard against a database recreated under
        it): its first event's (recorded_at ISO, kind, subject), from the row at seq 1, or,
        once that is archived, as the newest `log.archived` event recorded it."""
        async with self.engine.connect() as connection:
            row = (await connection.execute(
                select(events.c.recorded_at, events.c.kind, events.c.subject)
                .where(events.c.seq == 1))).first()
            if row is not None:
                return (as_utc(row.recorded_at).isoformat(), str(row.kind), str(row.subject))
            archived = await _latest_archived(connection)
        if archived is None or not archived[1].origin_kind:
            return None
        payload = archived[1]
        return (payload.origin_recorded_at, payload.origin_kind, payload.origin_subject)

    async def read_tolerant(self, after_seq: int = 0, limit: int = 1000, *,
                            kinds: Sequence[str] | None = None, subject: str | None = None,
                            upto: int | None = None) -> list[RecordedEvent | CorruptRow]:
        """`read`, except that a row that does not decode comes back as a `CorruptRow`
        instead of failing the whole read. Slower (the payload is parsed from its text):
        for tools, and for finding the row when the fast read failed."""
        return await read_tolerant(self.engine, after_seq, limit, kinds=kinds,
                                   subject=subject, upto=upto)

    async def first_corrupt_row(self, after_seq: int = 0, upto: int | None = None
                                ) -> CorruptRow | None:
        """The first row after `after_seq` (up to `upto`) that does not decode, if any."""
        return await first_corrupt_row(self.engine, after_seq, upto)

    @functools.cached_property
    def read_models(self) -> ReadModels:
        """The audit views over this log (intervals, transitions, ...): store/projections.py."""
        return ReadModels(self.engine)

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
        self._backend.start_listening()
        position = after_seq
        backoff = 0.1
        while not self._closed:
            generation = self._backend.bus.generation
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
            await self._backend.bus.wait(generation, self._backend.fallback_interval)

    # ----------------------------------------------------------------- leadership

    @_runs_to_completion
    async def acquire(self, identity: str, lease_seconds: float = 15.0) -> Lease | None:
        """Become leader if nobody holds a live lease. A takeover (and any new
        acquisition) increments the epoch; the new leader's first append is its
        `leader.elected` event. Returns None when someone else holds a live lease.
        Raises ValueError (writing nothing) unless `lease_seconds` is a positive finite
        number of at most MAX_LEASE_SECONDS."""
        if not _valid_lease_seconds(lease_seconds):
            raise ValueError(f"lease_seconds must be a positive finite number of at most "
                             f"{MAX_LEASE_SECONDS:g}, got {lease_seconds!r}")
        started = time.monotonic()
        async with self._write_transaction(lease=True) as connection:
            row = await self._locked_leadership_row(connection)
            now, offset = await self._db_now_and_offset(connection)
            holder = row["holder"]
            renewed_at = as_utc(row["renewed_at"]) if row["renewed_at"] is not None else None
            live = (
                holder is not None
                and renewed_at is not None
                and renewed_at + timedelta(seconds=_row_lease_seconds(row, lease_seconds)) > now
            )
            if live:
                return None
            epoch = int(row["epoch"]) + 1
            await connection.execute(
                leadership.update()
                .where(leadership.c.id == LEADERSHIP_ROW)
                .values(holder=identity, epoch=epoch, renewed_at=now, lease_seconds=lease_seconds)
            )
        lease = Lease(identity, epoch, lease_seconds, started, offset)
        try:
            await self.append([Event(subject=identity, payload=LeaderElected(
                epoch=epoch, identity=identity))], epoch)
        except BaseException:
            # A leader whose first append fails (the log refuses writes) must not sit on
            # the lease for its length: a standby that can append takes it at once.
            with contextlib.suppress(Exception):
                await self.release(lease)
            raise
        log.info("leadership.acquired", identity=identity, epoch=epoch,
                 previous_holder=holder)
        return lease

    async def _locked_leadership_row(self, connection: AsyncConnection) -> Any:
        """The leadership row, locked until the transaction ends (SQLite: BEGIN
        IMMEDIATE already holds the write lock)."""
        query = self._backend.for_update(
            select(leadership).where(leadership.c.id == LEADERSHIP_ROW))
        return (await connection.execute(query)).one()._mapping

    @_runs_to_completion
    async def renew(self, lease: Lease) -> Lease:
        """Extend the lease; raises StaleLeaderError if it was taken over."""
        started = time.monotonic()
        async with self._write_transaction(lease=True) as connection:
            row = await self._locked_leadership_row(connection)
            if row["holder"] != lease.identity or int(row["epoch"]) != lease.epoch:
                raise StaleLeaderError(
                    f"lease epoch {lease.epoch} lost: now held by {row['holder']!r} "
                    f"at epoch {row['epoch']}")
            now, offset = await self._db_now_and_offset(connection)
            await connection.execute(
                leadership.update().where(leadership.c.id == LEADERSHIP_ROW).values(renewed_at=now)
            )
        return Lease(lease.identity, lease.epoch, lease.lease_seconds, started, offset)

    async def _db_now_and_offset(self, connection: AsyncConnection) -> tuple[datetime, float]:
        before = self.wall_clock()
        now = await self._db_now(connection)
        after = self.wall_clock()
        return now, now.timestamp() - (before + after) / 2

    @_runs_to_completion
    async def release(self, lease: Lease) -> None:
        """Give up the lease so a standby can take over at once (graceful shutdown)."""
        async with self._write_transaction(lease=True) as connection:
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
        renewed_at = as_utc(row["renewed_at"]) if row["renewed_at"] is not None else None
        # Reported as it is (NaN when it is not even a number): this is for people.
        return LeaderInfo(row["holder"], int(row["epoch"]), renewed_at,
                          _as_float(row["lease_seconds"]))

    # ------------------------------------------------------------------ snapshots

    @_runs_to_completion
    async def save_snapshot(self, seq: int, state: dict[str, Any] | JSONText, *,
                            keep: int = SNAPSHOTS_KEPT) -> None:
        """Store a snapshot at `seq` and prune all but the newest `keep` (a snapshot is a
        cache of the fold: the log alone can always rebuild it, so pruning loses nothing;
        at 10,000 nodes each one is ~10 MB, written every `snapshot_every` events)."""
        async with self._write_transaction(big_values=True) as connection:
            query = select(snapshots.c.seq).where(snapshots.c.seq == seq)
            if (await connection.execute(query)).first() is None:
                # Values as execute parameters, not `.values(...)` in the statement:
                # SQLAlchemy's compiled cache keeps the first statement it compiles,
                # values and all, so the first snapshot (~24 MB of text at 10,000 nodes)
                # stayed alive for the process's life.
                await connection.execute(snapshots.insert(), {
                    "seq": seq, "taken_at": datetime.now(UTC), "state": state})
            kept = (select(snapshots.c.seq).order_by(snapshots.c.seq.desc())
                    .limit(max(keep, 1)).subquery())
            prune: ColumnElement[bool] = snapshots.c.seq.not_in(select(kept.c.seq))
            base = await _archive_base_seq(connection)
            if base is not None:  # the archive's base: a replay without the archive needs it
                prune = prune & (snapshots.c.seq != base)
            await connection.execute(snapshots.delete().where(prune))

    async def archive_base_seq(self) -> int | None:
        """The seq of the snapshot the newest `sunkd log archive` made the base of the
        log (None: never archived); it is never pruned while it is the base."""
        async with self.engine.connect() as connection:
            return await _archive_base_seq(connection)

    async def snapshot_seqs(self) -> list[int]:
        """The seqs of the stored snapshots, oldest first."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(select(snapshots.c.seq).order_by(snapshots.c.seq))
            return [int(row.seq) for row in rows]

    async def snapshot_at(self, seq: int) -> dict[str, Any] | None:
        """The body of the snapshot saved at exactly `seq`, if there is one."""
        async with self.engine.connect() as connection:
            row = (await connection.execute(
                select(snapshots.c.state).where(snapshots.c.seq == seq))).first()
        return None if row is None else dict(row.state)

    async def latest_snapshot(self) -> tuple[int, dict[str, Any]] | None:
        async with self.engine.connect() as connection:
            row = (await connection.execute(
                select(snapshots.c.seq, snapshots.c.state).order_by(snapshots.c.seq.desc()).limit(1)
            )).first()
        if row is None:
            return None
        return int(row.seq), dict(row.state)


async def _latest_archived_body(connection: AsyncConnection) -> tuple[int, Any] | None:
    """The seq and JSON body of the newest `log.archived` event (the (kind, seq) index
    finds it), if any."""
    row = (await connection.execute(
        select(events.c.seq, events.c.payload).where(events.c.kind == LogArchived.KIND)
        .order_by(events.c.seq.desc()).limit(1))).first()
    if row is None:
        return None
    return int(row.seq), json.loads(row.payload) if isinstance(row.payload, str) else row.payload


async def _archive_base_seq(connection: AsyncConnection) -> int | None:
    """`base_seq` of the newest `log.archived` event, read leniently (a snapshot's pruning
    must not fail on it)."""
    found = await _latest_archived_body(connection)
    base = found[1].get("base_seq") if found is not None and isinstance(found[1], dict) \
        else None
    return base if isinstance(base, int) and not isinstance(base, bool) else None


async def _latest_archived(connection: AsyncConnection) -> tuple[int, LogArchived] | None:
    """The newest `log.archived` event, decoded (its seq and payload), if any."""
    found = await _latest_archived_body(connection)
    if found is None:
        return None
    payload = decode_payload(LogArchived.KIND, found[1])
    return (found[0], payload) if isinstance(payload, LogArchived) else None


def _in_memory(url: str) -> bool:
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def _as_float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _to_recorded(row: Any, recent: RecentAppends) -> RecordedEvent:
    payload = row["payload"]
    if isinstance(payload, str):  # a driver that returns JSON as text
        payload = json.loads(payload)
    seq = int(row["seq"])
    return RecordedEvent(
        seq=seq,
        recorded_at=as_utc(row["recorded_at"]),
        epoch=int(row["epoch"]),
        subject=row["subject"],
        payload=recent.share(seq, decode_payload(row["kind"], payload)),
        causation_seq=row["causation_seq"],
    )


@dataclass(frozen=True, slots=True)
class JSONText:
    """JSON text already encoded (a snapshot built a node at a time): stored as it is."""

    text: str


def dumps_json(value: Any) -> str:
    """Compact JSON text. orjson is ~10x faster than the stdlib here, which is most of
    an append's CPU (bench/eventlog.py); the stdlib takes over for what orjson refuses
    (integers beyond 64 bits)."""
    if type(value) is JSONText:
        return value.text
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))


def create_engine(url: str, *, read_only: bool = False, create: bool = True) -> AsyncEngine:
    """An async engine with the settings sunkd relies on for each backend (`read_only`:
    one that cannot write; `create=False`: one that never creates a SQLite file)."""
    # Reads keep the stdlib parser: orjson turns integers beyond 64 bits into floats,
    # and a payload from a newer writer must come back exactly as it was written.
    return backend_class(make_url(url).get_backend_name()).create_engine(
        url, json_serializer=dumps_json, read_only=read_only, create=create)


def database_name(url: str) -> str | None:
    """The database a URL names (PostgreSQL: its name; SQLite: the file's path)."""
    return make_url(url).database or None


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL; None for PostgreSQL or an in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or _in_memory(url):
        return None
    return parsed.database


def _where(url: str) -> str:
    """The database, as a refusal names it: a SQLite path, or the URL without password."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database or ":memory:"
    return parsed.render_as_string(hide_password=True)
