"""Migrate an embedded (SQLite file) log in a child process, so `sunkd run` never imports
Alembic.

Why: the embedded default migrates itself on its first start, and a module once imported
stays in the process for its life. Alembic with Mako is ~150 modules and ~8-11 MB of the
daemon's RSS (docs/performance.md, "Scale"), kept for years to run a few DDL statements
once. The child runs the same `upgrade` the in-process path runs (one transaction,
`BEGIN IMMEDIATE`, so a second starter waits for it), and the parent then checks the
schema as on any start. An in-memory database exists only in its own process, so it
keeps migrating in place (`EventLog.open`).

The URL reaches the child in its environment, not its argv (`ps` shows argv to every
user); the child's stderr is reported only when it fails.
"""

from __future__ import annotations

import asyncio
import os
import sys

from sunkd.store.migrations_api import SchemaError

URL_VARIABLE = "SUNKD_MIGRATE_URL"
# What of the child's stderr a failure reports (the end of it: the exception).
_STDERR_TAIL = 2000


class MigrationFailed(SchemaError):
    """The child that migrates the log exited with an error."""


async def migrate_in_child(url: str) -> None:
    """Upgrade the database at `url` to head in a child Python process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd.store.migrate_apart",
        env={**os.environ, URL_VARIABLE: url},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, stderr = await process.communicate()
    if process.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-_STDERR_TAIL:]
        raise MigrationFailed(
            f"migrating the log in a child process failed (exit {process.returncode}): "
            f"{tail or 'no output'}")


async def _upgrade(url: str) -> None:
    from sunkd.store.eventlog import create_engine
    from sunkd.store.migrations_api import upgrade

    engine = create_engine(url)
    try:
        await upgrade(engine, "head")
    finally:
        await engine.dispose()


def main() -> int:
    url = os.environ.get(URL_VARIABLE)
    if not url:
        print(f"{URL_VARIABLE} is not set", file=sys.stderr)
        return 2
    asyncio.run(_upgrade(url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
