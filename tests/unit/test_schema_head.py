"""`SCHEMA_HEAD` is what lets a daemon at head skip importing Alembic: it must be the
scripts' head, and opening a log at head must then not import Alembic at all."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from sunkd.store.migrations_api import SCHEMA_HEAD, head_revision


def test_schema_head_is_the_newest_migration_script() -> None:
    assert SCHEMA_HEAD == head_revision()


def test_a_log_at_head_opens_without_alembic(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'events.db'}"
    program = """
import asyncio, sys
from sunkd.store.eventlog import EventLog

async def main(url, migrate):
    log = await EventLog.open(url, migrate=migrate)
    await log.close()

asyncio.run(main(sys.argv[1], sys.argv[2] == "migrate"))
print(sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic.")))
"""

    def run(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", program, url, mode], check=True,
                              capture_output=True, text=True, timeout=120).stdout.strip()

    assert run("migrate") != "[]"  # creating the schema is Alembic's work
    assert run("check") == "[]"


_APART = """
import asyncio, sys
from sunkd.store.eventlog import EventLog
from sunkd.store.migrations_api import SchemaError

async def main(url):
    try:
        log = await EventLog.open(url, migrate_apart=True)
    except SchemaError as error:
        print("error:", error)
        return
    await log.close()

asyncio.run(main(sys.argv[1]))
print(sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic.")))
"""


def _open_apart(url: str) -> str:
    return subprocess.run([sys.executable, "-c", _APART, url], check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()


def test_a_fresh_log_migrated_apart_leaves_alembic_out_of_the_process(tmp_path: Path) -> None:
    """`sunkd run` creates the embedded schema in a child: the daemon gets a log at head
    without importing Alembic (~8-11 MB it would keep for its life)."""
    path = tmp_path / "events.db"
    url = f"sqlite+aiosqlite:///{path}"
    assert _open_apart(url) == "[]"
    with sqlite3.connect(path) as db:  # the child migrated the file itself
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (SCHEMA_HEAD,)]
        assert db.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_a_failed_child_migration_is_a_schema_error_that_says_why(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with sqlite3.connect(path) as db:  # a revision these scripts do not know
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('9999')")
    out = _open_apart(f"sqlite+aiosqlite:///{path}")
    assert out.startswith("error: migrating the log in a child process failed (exit 1)")
    assert "9999" in out  # Alembic's own words on the unknown revision
