"""Run the Alembic migrations that ship inside the package (`sunkd migrate`).

The scripts live in `sunkd/store/migrations` rather than a top-level folder so that an
installed wheel (container image, systemd host) can migrate without a source checkout.
On PostgreSQL a transaction-scoped advisory lock makes concurrent migrators (two
replicas starting at once) run one after the other instead of racing on DDL.

Alembic (with Mako and its templates, ~12 MB and ~150 modules) is imported only to
migrate or to answer `sunkd migrate`: a daemon whose schema is at `SCHEMA_HEAD` checks
the `alembic_version` row with SQLAlchemy alone (a unit test keeps `SCHEMA_HEAD` equal to
the scripts' head).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# The newest script in migrations/versions (tests/unit/test_schema_head.py keeps them equal).
SCHEMA_HEAD = "0003"
VERSION_TABLE = "alembic_version"  # Alembic's default version table
# An arbitrary constant: "sunkd" in ASCII.
_ADVISORY_LOCK_KEY = 0x73756E6B64


class SchemaError(RuntimeError):
    """The database schema is not at the revision this sunkd needs."""


class NotASunkdLog(SchemaError):
    """The database holds no sunkd event log (a mistyped path, another application's
    database): commands that only read or append refuse it and create nothing."""

    def __init__(self, where: str, why: str = "") -> None:
        self.where = where
        super().__init__(f"not a sunkd log at {where}{f' ({why})' if why else ''}: "
                         "run `sunkd migrate` to create one")


def sunkd_revisions() -> frozenset[str]:
    """The revisions of the scripts in migrations/versions (`NNNN_name.py`), read from
    the file names so that no Alembic import is needed."""
    return frozenset(path.name.split("_", 1)[0]
                     for path in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The scripts' head, as Alembic reads it."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _version_rows(connection: Connection) -> list[str] | None:
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
    return [str(row[0]) for row in rows]


async def _lock(connection: AsyncConnection) -> None:
    if connection.dialect.name == "postgresql":
        await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                 {"key": _ADVISORY_LOCK_KEY})


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(_current)


async def _run(engine: AsyncEngine, action: Callable[[Config, str], None],
               revision: str) -> None:
    """Run an Alembic command on one connection, in one transaction, serialized against
    other migrators."""
    config = alembic_config()

    def run(connection: Connection) -> None:
        config.attributes["connection"] = connection
        action(config, revision)

    async with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            await connection.execution_options(sqlite_begin="IMMEDIATE")
        async with connection.begin():
            await _lock(connection)
            await connection.run_sync(run)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    from alembic import command

    await _run(engine, command.upgrade, revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    from alembic import command

    await _run(engine, command.downgrade, revision)


async def migrate(url: str, *, revision: str = "head", downgrade_to: str | None = None
                  ) -> str | None:
    """`sunkd migrate`: upgrade the database at `url` to `revision` (or, `downgrade_to`,
    down to that revision); returns the revision it is at then (None: base)."""
    from sunkd.store.eventlog import create_engine  # eventlog imports this module

    engine = create_engine(url)
    try:
        if downgrade_to:
            await downgrade(engine, downgrade_to)
        else:
            await upgrade(engine, revision)
        return await current_revision(engine)
    finally:
        await engine.dispose()


async def at_head(engine: AsyncEngine) -> bool:
    """Whether the schema is at `SCHEMA_HEAD`, read with SQLAlchemy alone."""
    async with engine.connect() as connection:
        rows = await connection.run_sync(_version_rows)
    return rows == [SCHEMA_HEAD]


def _log_tables(connection: Connection) -> tuple[list[str] | None, bool]:
    """(the `alembic_version` rows, whether sunkd's own tables are there)."""
    inspector = inspect(connection)
    tables = set(inspector.get_table_names())
    return _version_rows(connection), {"events", "leadership", "snapshots"} <= tables


async def require_log(engine: AsyncEngine, where: str) -> None:
    """Raise `NotASunkdLog` unless the database holds a sunkd log (sunkd's revision in
    `alembic_version` and its tables), `SchemaError` unless that log is at `SCHEMA_HEAD`.
    Reads only: nothing is created or changed (the caller's engine may be read-only)."""
    async with engine.connect() as connection:
        rows, tables = await connection.run_sync(_log_tables)
    if not rows or len(rows) != 1 or rows[0] not in sunkd_revisions() or not tables:
        raise NotASunkdLog(where)
    if rows != [SCHEMA_HEAD]:
        raise SchemaError(f"database schema is at {rows[0]}, this sunkd needs {SCHEMA_HEAD}: "
                          "run `sunkd migrate` first")


async def ensure_schema(engine: AsyncEngine, *, migrate: bool) -> None:
    """Upgrade to head when `migrate`, else check that the schema is at head."""
    if await at_head(engine):
        return  # at head: Alembic is not needed (not even imported)
    head = head_revision()
    current = await current_revision(engine)
    if current == head:
        return
    if migrate:
        await upgrade(engine, "head")
        return
    raise SchemaError(
        f"database schema is at {current or 'nothing'}, this sunkd needs {head}: "
        "run `sunkd migrate` first")
