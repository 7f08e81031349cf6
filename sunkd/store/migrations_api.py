"""Run the Alembic migrations that ship inside the package (`sunkd migrate`).

The scripts live in `sunkd/store/migrations` rather than a top-level folder so that an
installed wheel (container image, systemd host) can migrate without a source checkout.
On PostgreSQL a transaction-scoped advisory lock makes concurrent migrators (two
replicas starting at once) run one after the other instead of racing on DDL.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# An arbitrary constant: "sunkd" in ASCII.
_ADVISORY_LOCK_KEY = 0x73756E6B64


class SchemaError(RuntimeError):
    """The database schema is not at the revision this sunkd needs."""


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


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
    await _run(engine, command.upgrade, revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    await _run(engine, command.downgrade, revision)


async def ensure_schema(engine: AsyncEngine, *, migrate: bool) -> None:
    """Upgrade to head when `migrate`, else check that the schema is at head."""
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
