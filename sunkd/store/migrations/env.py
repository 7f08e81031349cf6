"""Alembic environment: runs on a connection handed in by sunkd (programmatic use), or
creates an async engine from `-x url=...` / SUNKD_DATABASE_URL (alembic CLI use)."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from sunkd.store.models import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      transaction_per_migration=False)
    with context.begin_transaction():
        context.run_migrations()


async def _run_cli() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(
        "SUNKD_DATABASE_URL", "sqlite+aiosqlite:///sunkd.db")
    engine = create_async_engine(url)
    async with engine.begin() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_run_cli())
