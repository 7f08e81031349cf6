"""The event log's PostgreSQL backend (asyncpg): the `Backend` of sunkd.store.backend for
production.

* Write lock: `SELECT ... FOR UPDATE` on the single leadership row; a plain BEGIN.
* Inserts: asyncpg's COPY (`copy_records_to_table`) inside our own transaction, the
  fastest way PostgreSQL ingests rows and still atomic with the epoch check.
* Clock: the database's `clock_timestamp()`, for appends and leases alike, so lease
  expiry means the same thing to every candidate whatever their clock skew.
* Wake-ups: `pg_notify` inside the appending transaction (delivered on commit, to
  every process), received by one LISTEN connection per EventLog that feeds the
  EventLog's own `WakeBus`; it reconnects with backoff, and on every (re)connect wakes
  readers for whatever was appended while it was not listening. Readers also re-read
  every 5 s regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import Select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sunkd.store.backend import EVENT_COLUMNS, Backend, EventRow, WakeBus, as_utc
from sunkd.store.models import LEADERSHIP_ROW

log = structlog.get_logger("sunkd.store.eventlog")

NOTIFY_CHANNEL = "sunkd_events"


class PostgresBackend(Backend):
    dialect = "postgresql"
    migrate_by_default = False  # production: `sunkd migrate` is an explicit step

    def __init__(self, url: str) -> None:
        self.url = url
        self.bus = WakeBus()
        self.fallback_interval = 5.0
        self._listener_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def create_engine(cls, url: str, *, json_serializer: Any, read_only: bool = False,
                      create: bool = True) -> AsyncEngine:
        # PostgreSQL never creates a database on connect; a read-only engine's
        # transactions are READ ONLY, so the server refuses any write it might attempt.
        connect_args: dict[str, Any] = {"timeout": 10, "command_timeout": 60}
        if read_only:
            connect_args["server_settings"] = {"default_transaction_read_only": "on"}
        return create_async_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                                   connect_args=connect_args, json_serializer=json_serializer)

    # ------------------------------------------------------------------ writes

    async def prepare_write(self, connection: AsyncConnection) -> None:
        return None  # the row lock below serializes writers; a plain BEGIN will do

    async def lock_for_append(self, connection: AsyncConnection) -> tuple[int, int, datetime]:
        # Two statements on purpose: under READ COMMITTED a statement's snapshot is
        # taken before it waits for the row lock, so a max(seq) subquery in the
        # locking statement could miss the rows of the append we waited for and
        # hand out a duplicate seq. The second statement sees them.
        epoch = (await connection.execute(text(
            "SELECT epoch FROM leadership WHERE id = :id FOR UPDATE"),
            {"id": LEADERSHIP_ROW})).scalar_one()
        row = (await connection.execute(text(
            "SELECT coalesce(max(seq), 0), clock_timestamp() FROM events"))).one()
        return int(epoch), int(row[0]), as_utc(row[1])

    def for_update(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update()

    def recorded_at(self, now: datetime) -> object:
        return now  # asyncpg encodes datetimes itself

    async def insert_events(self, connection: AsyncConnection, rows: Sequence[EventRow]) -> None:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        # The driver's COPY path inside our own transaction: the fastest way
        # PostgreSQL ingests rows, and still atomic with the epoch check.
        await driver.copy_records_to_table("events", records=rows, columns=EVENT_COLUMNS)

    async def db_now(self, connection: AsyncConnection) -> datetime:
        # The database's clock, not this host's: lease expiry must mean the same
        # thing to every candidate, whatever their clock skew.
        result = await connection.execute(text("SELECT clock_timestamp()"))
        return as_utc(result.scalar_one())

    # --------------------------------------------------------------- wake-ups

    async def announce(self, connection: AsyncConnection, last_seq: int) -> None:
        # Sent inside the appending transaction: delivered on commit, never before.
        await connection.execute(text("SELECT pg_notify(:channel, :seq)"),
                                 {"channel": NOTIFY_CHANNEL, "seq": str(last_seq)})

    async def announce_committed(self) -> None:
        return None  # our own LISTEN connection receives the NOTIFY like everyone else

    def start_listening(self) -> None:
        if self._listener_task is None or self._listener_task.done():
            self._listener_task = asyncio.create_task(self._listen_forever(),
                                                      name="sunkd-eventlog-listen")

    async def close(self) -> None:
        self._closed = True
        if self._listener_task is not None:
            self._listener_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener_task
            self._listener_task = None

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
                    NOTIFY_CHANNEL, lambda *_args: asyncio.ensure_future(self.bus.notify()))
                backoff = 0.2
                # Anything appended while we were not listening: make readers look.
                await self.bus.notify()
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
