"""A row the fold cannot trust stops the daemon loudly instead of letting it decide on
a state that silently skipped an event (and the row is left untouched)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from sqlalchemy import text

from sunkd.runtime.config import KubernetesSettings, Settings
from sunkd.runtime.daemon import Daemon
from sunkd.store.eventlog import EventLog


async def test_an_undecodable_event_stops_the_daemon_with_exit_1(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}"
    settings = replace(Settings(database_url=url, listen="127.0.0.1:0", lease_seconds=3),
                       kubernetes=KubernetesSettings(enabled=False))
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.run())
    for _ in range(200):
        if daemon.is_leader():
            break
        await asyncio.sleep(0.05)
    assert daemon.is_leader()
    event_log = await EventLog.open(url)
    try:
        async with event_log.engine.begin() as connection:
            await connection.execute(text(
                "INSERT INTO events (seq, recorded_at, kind, subject, epoch, payload) VALUES "
                "((SELECT max(seq) + 1 FROM events), CURRENT_TIMESTAMP, "
                "'slurm.node.observed', 'n1', 0, :payload)"),
                {"payload": '{"v": 1, "node": "n1", "cpus": "many"}'})
        assert await asyncio.wait_for(task, 30) == 1
        assert daemon.fatal_error is not None and "cpus" in daemon.fatal_error
        # Nothing was lost or rewritten: the row is still there for inspection.
        async with event_log.engine.connect() as connection:
            kinds = (await connection.execute(text(
                "SELECT kind FROM events ORDER BY seq DESC LIMIT 1"))).scalar_one()
        assert kinds == "slurm.node.observed"
        # And a restart refuses to start on it rather than skipping it.
        assert await asyncio.wait_for(Daemon(settings).run(), 30) == 1
    finally:
        if not task.done():
            task.cancel()
        await event_log.close()
