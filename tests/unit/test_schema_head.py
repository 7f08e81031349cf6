"""`SCHEMA_HEAD` is what lets a daemon at head skip importing Alembic: it must be the
scripts' head, and opening a log at head must then not import Alembic at all."""

from __future__ import annotations

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
