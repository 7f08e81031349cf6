"""Shared test plumbing: strict mode, PostgreSQL and SQLite database URLs.

In CI `SUNKD_TEST_STRICT=1`: a test that would skip because a real peer (PostgreSQL,
Slurm, kubectl, chromium) is missing fails instead, so a broken install never looks green.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

STRICT = os.environ.get("SUNKD_TEST_STRICT") == "1"
DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def _dev_null() -> tuple[int, int, int]:
    status = os.stat("/dev/null")
    return status.st_mode, status.st_rdev, status.st_ctime_ns


@pytest.fixture(autouse=True)
def host_dev_null_kept() -> Any:
    """The host's /dev/null is still a character device anyone may write (0666) after
    each test. The harness runs Debian maintainer scripts and Slurm daemons in chroots
    that may see the host's /dev; once a host's /dev/null was found 0644 after a session,
    and every non-root daemon started afterwards aborted on opening it (slurmctld 24.11:
    "slurmscriptd failed to send return code"). This names the test that did it, and
    puts the mode back so the rest of the run is not lost to it."""
    before = _dev_null()
    yield
    after = _dev_null()
    if after[:2] != before[:2]:
        if after[1] == before[1]:
            os.chmod("/dev/null", before[0] & 0o7777)
        pytest.fail(f"this test changed the host's /dev/null: mode {before[0]:o} -> "
                    f"{after[0]:o}, device {before[1]} -> {after[1]}")


def require(condition: bool, why: str) -> None:
    """Skip (or, in strict mode, fail) when a real peer the test needs is missing."""
    if condition:
        return
    if STRICT:
        pytest.fail(f"SUNKD_TEST_STRICT=1 and a required peer is missing: {why}")
    pytest.skip(why)


def postgres_base_url() -> str:
    return os.environ.get("SUNKD_TEST_DATABASE_URL", DEFAULT_PG_URL)


async def _pg_admin(sql: str) -> None:
    import asyncpg

    dsn = postgres_base_url().replace("postgresql+asyncpg://", "postgresql://")
    connection = await asyncpg.connect(dsn, timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def fresh_postgres_database() -> AsyncIterator[str]:
    """A new, empty PostgreSQL database (own name, so parallel runs never collide),
    dropped afterwards. Skips, or fails in strict mode, when PostgreSQL is unusable."""
    name = f"sunkd_t_{uuid.uuid4().hex[:12]}"
    try:
        await _pg_admin(f'CREATE DATABASE "{name}"')
    except Exception as error:
        require(False, f"PostgreSQL at {postgres_base_url()} is not usable: {error}")
    base = postgres_base_url().rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'events.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Runs a test once on SQLite and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'events.db'}"
        return
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    """A test that runs the CLI in-process configures logging onto pytest's captured
    stream, which is closed after that test: put the previous configuration back."""
    import logging

    config = structlog.get_config()
    handlers = list(logging.getLogger().handlers)
    yield
    structlog.configure(**config)
    logging.getLogger().handlers[:] = handlers
