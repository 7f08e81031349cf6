"""The event log's SQLite backend (aiosqlite): the `Backend` of sunkd.store.backend for
the embedded default (one file, WAL mode, migrated automatically on open by the commands
that may create a log; the others open it with a `mode=ro` or `mode=rw` URI, which never
creates a file).

* Write lock: `BEGIN IMMEDIATE` takes the database's write lock up front, which covers
  the leadership row too, so nothing needs `FOR UPDATE` (SQLite has none).
* Inserts: one `executemany` of a plain INSERT; timestamps in SQLAlchemy's SQLite
  DateTime storage format (naive UTC text).
* Clock: this host's (`datetime.now(UTC)`): every writer of a SQLite file shares a host.
* Wake-ups: an in-process `WakeBus` per database file, shared by every EventLog of this
  process and notified after each commit; writers in other processes are only noticed
  by the 1 s fallback re-read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Select, text
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from sunkd.store.backend import Backend, EventRow, WakeBus
from sunkd.store.models import LEADERSHIP_ROW

_INSERT_EVENTS = ("INSERT INTO events (seq, recorded_at, kind, subject, epoch, causation_seq, "
                  "payload) VALUES (?, ?, ?, ?, ?, ?, ?)")  # the order of EVENT_COLUMNS

# One bus per database file, shared by every EventLog of this process.
_BUSES: dict[str, WakeBus] = {}


def _timestamp(moment: datetime) -> str:
    # SQLAlchemy's SQLite DateTime storage format (naive UTC).
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _writable(path: Path) -> bool:
    """Whether this process may write the file and create its -wal beside it."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


class SqliteBackend(Backend):
    dialect = "sqlite"
    migrate_by_default = True  # the embedded default: a new file just works

    def __init__(self, url: str) -> None:
        database = make_url(url).database or ""
        key = str(Path(database).resolve()) if database not in ("", ":memory:") else url
        self.bus = _BUSES.setdefault(key, WakeBus())
        self.fallback_interval = 1.0

    @classmethod
    def create_engine(cls, url: str, *, json_serializer: Any, read_only: bool = False,
                      create: bool = True) -> AsyncEngine:
        parsed = make_url(url)
        connect_args: dict[str, Any] = {"timeout": 30}
        if (read_only or not create) and parsed.database not in (None, "", ":memory:") \
                and not parsed.query:
            # SQLite's URI filenames: `mode=rw` opens read-write, `mode=ro` read-only; neither
            # creates a missing file (https://www.sqlite.org/uri.html). A read-only engine
            # still opens the file read-write when it may: a `mode=ro` connection cannot
            # read a WAL database whose -wal file is absent (after a clean shutdown), since
            # it may not create it; `PRAGMA query_only` below then refuses every change.
            path = Path(parsed.database or "").absolute()
            mode = "ro" if read_only and not _writable(path) else "rw"
            parsed = parsed.set(database=f"file:{quote(str(path))}",
                                query={"mode": mode, "uri": "true"})
        engine = create_async_engine(parsed, connect_args=connect_args,
                                     json_serializer=json_serializer)

        @sa_event.listens_for(engine.sync_engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let us issue BEGIN ourselves (pysqlite's implicit transactions would
            # defeat BEGIN IMMEDIATE), and use WAL so readers never block the writer
            # (a read-only engine leaves the file's journal mode as it is).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            if read_only:
                cursor.execute("PRAGMA query_only=ON")
            else:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @sa_event.listens_for(engine.sync_engine, "begin")
        def _sqlite_begin(connection: Any) -> None:
            mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
            connection.exec_driver_sql(f"BEGIN {mode}")

        return engine

    # ------------------------------------------------------------------ writes

    async def prepare_write(self, connection: AsyncConnection) -> None:
        # BEGIN IMMEDIATE takes SQLite's write lock up front, so two writers
        # serialize instead of failing with "database is locked" on upgrade.
        await connection.execution_options(sqlite_begin="IMMEDIATE")

    async def lock_for_append(self, connection: AsyncConnection) -> tuple[int, int, datetime]:
        # BEGIN IMMEDIATE already holds the database's write lock.
        row = (await connection.execute(text(
            "SELECT epoch, (SELECT coalesce(max(seq), 0) FROM events) FROM leadership "
            "WHERE id = :id"), {"id": LEADERSHIP_ROW})).one()
        return int(row[0]), int(row[1]), datetime.now(UTC)

    def for_update(self, query: Select[Any]) -> Select[Any]:
        return query  # BEGIN IMMEDIATE already holds the write lock

    def recorded_at(self, now: datetime) -> object:
        return _timestamp(now)

    async def insert_events(self, connection: AsyncConnection, rows: Sequence[EventRow]) -> None:
        await connection.exec_driver_sql(_INSERT_EVENTS, rows)

    async def db_now(self, connection: AsyncConnection) -> datetime:
        return datetime.now(UTC)

    # --------------------------------------------------------------- wake-ups

    async def announce(self, connection: AsyncConnection, last_seq: int) -> None:
        return None  # the bus is told after the commit, when the rows are visible

    async def announce_committed(self) -> None:
        await self.bus.notify()

    def start_listening(self) -> None:
        return None  # appends of this process notify the bus directly

    async def close(self) -> None:
        return None
