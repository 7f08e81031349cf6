"""What the event log needs from a database, as one interface with one implementation
per backend: `sunkd.store.postgres.PostgresBackend` and `sunkd.store.sqlite.SqliteBackend`
(the shape of the `eventsourcing` library's per-backend recorders, which likewise share
one test case: tests/contract/test_eventlog.py runs unchanged on both).

`sunkd.store.eventlog.EventLog` owns everything that is the same on every database: the
SQL of reads, leases and snapshots, the epoch check, seq assignment, the subscription
loop. A `Backend` owns only what differs, each piece a method:

* engine settings (`create_engine`: read-only or not, creating a database or not) and
  whether `EventLog.open` migrates by default;
* taking the write lock: the connection options before BEGIN, and locking the
  leadership row (`lock_for_append`, `for_update`);
* inserting rows (`recorded_at` is the value the driver wants for the timestamp column,
  `insert_events` the fastest bulk path of that driver);
* the clock that leases are measured against (`db_now`);
* wake-ups: a `WakeBus` that subscribers wait on, how it is fed (`announce` inside the
  appending transaction, `announce_committed` after the commit, `start_listening`) and
  how long a subscriber waits before re-reading anyway (`fallback_interval`).

This module holds the interface and the pieces both implementations share; it imports
neither implementation (they import it), so there is no import cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import Select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# The columns an append writes, in the order of an `EventRow`.
EVENT_COLUMNS = ("seq", "recorded_at", "kind", "subject", "epoch", "causation_seq", "payload")

# One row to insert: (seq, recorded_at, kind, subject, epoch, causation_seq, payload JSON
# text), where recorded_at is whatever `Backend.recorded_at` made of the append's time.
EventRow = tuple[int, object, str, str, int, int | None, str]


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime (drivers return naive UTC on SQLite, aware on PostgreSQL)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class WakeBus:
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


class Backend(ABC):
    """The database-specific half of one `EventLog` (one instance per EventLog)."""

    # SQLAlchemy's dialect name (`engine.dialect.name`) this backend serves.
    dialect: ClassVar[str]
    # Whether `EventLog.open(url)` runs migrations when the caller did not say.
    migrate_by_default: ClassVar[bool]

    # Subscribers wait on this between reads; `fallback_interval` bounds the wait, so
    # a wake-up that never comes only delays an event.
    bus: WakeBus
    fallback_interval: float

    @abstractmethod
    def __init__(self, url: str) -> None:
        """The backend of the EventLog on `url` (the engine is created separately)."""

    @classmethod
    @abstractmethod
    def create_engine(cls, url: str, *, json_serializer: Any, read_only: bool = False,
                      create: bool = True) -> AsyncEngine:
        """An async engine with the settings sunkd relies on for this database.
        `read_only`: the engine can change nothing (not even a file's journal mode);
        `create=False`: it never creates the database (a SQLite file) either."""

    # ------------------------------------------------------------------ writes

    @abstractmethod
    async def prepare_write(self, connection: AsyncConnection) -> None:
        """Called on a fresh connection before the BEGIN of a write transaction."""

    @abstractmethod
    async def lock_for_append(self, connection: AsyncConnection) -> tuple[int, int, datetime]:
        """Lock the leadership row (appends serialize on it); return (current epoch,
        last seq, now), last seq read after the lock was granted."""

    @abstractmethod
    def for_update(self, query: Select[Any]) -> Select[Any]:
        """`query` (of the leadership row) made to lock what it reads until the
        transaction ends."""

    @abstractmethod
    def recorded_at(self, now: datetime) -> object:
        """`now` as the driver wants it for the `recorded_at` column of `insert_events`."""

    @abstractmethod
    async def insert_events(self, connection: AsyncConnection, rows: Sequence[EventRow]) -> None:
        """Insert the rows (at least one) inside the caller's transaction."""

    @abstractmethod
    async def db_now(self, connection: AsyncConnection) -> datetime:
        """The time leases are measured against (aware, UTC)."""

    # --------------------------------------------------------------- wake-ups

    @abstractmethod
    async def announce(self, connection: AsyncConnection, last_seq: int) -> None:
        """Inside the appending transaction, after the insert."""

    @abstractmethod
    async def announce_committed(self) -> None:
        """After an append committed."""

    @abstractmethod
    def start_listening(self) -> None:
        """Make sure appends by other connections feed `bus` (a subscriber starts)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop listening; the EventLog disposes of the engine afterwards."""

