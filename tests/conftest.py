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


# The test files that start real kubelet Nodes (their tests are marked `kubelet`; the
# collection hook below checks the two agree). Those Nodes share host-wide state (a
# device-plugin socket path, sysctls, containerd), so each bed takes a host lock
# (sunkd_testbed.kubelet): on two workers they would only wait on each other.
KUBELET_FILES = frozenset({
    "tests/integration/test_demo.py",
    "tests/integration/test_kubelet_real.py",
    "tests/integration/test_slurmd_daemon_real.py",
    "tests/integration/test_slurmd_dynamic_real.py",
    "tests/integration/test_slurmd_invalid_reg_real.py",
    "tests/integration/test_slurmd_pods_real.py",
})
KUBELET_SCOPE = "real-kubelet"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-kubelet test files run first (`make test` runs two pytest-xdist workers:
    one takes them, serially, while the other starts on everything else)."""
    for item in items:
        if item.get_closest_marker("kubelet") and _file_of(item.nodeid) not in KUBELET_FILES:
            raise pytest.UsageError(f"{item.nodeid} is marked kubelet: list its file in "
                                    "tests/conftest.py's KUBELET_FILES")
    items.sort(key=lambda item: _file_of(item.nodeid) not in KUBELET_FILES)  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler for `make test`: each test file is one unit of work, run
    whole on one worker (its module-scoped fixtures, a control plane or a Slurm
    cluster, start once), and the real-kubelet files are one unit together. (xdist's own
    `--dist loadgroup` does not group under pytest 9.2, whose node ids it can no longer
    suffix; this is its `loadscope` with our scope.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrKubelet(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return KUBELET_SCOPE if path in KUBELET_FILES else path

    return FileOrKubelet(config, log)


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
