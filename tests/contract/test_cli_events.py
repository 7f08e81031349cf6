"""`sunkd migrate` and `sunkd events` on both backends, as a user runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from sunkd.domain.events import Event, OperatorPinned, SlurmNodeObserved
from sunkd.store.eventlog import EventLog
from sunkd.store.migrations_api import head_revision


def sunkd(*args: str, cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUNKD_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "sunkd", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


async def test_migrate_then_events_filters_and_follows(database_url: str, tmp_path: Path) -> None:
    result = sunkd("migrate", cwd=tmp_path, url=database_url)
    assert result.returncode == 0, result.stderr
    assert f"at revision {head_revision()}" in result.stdout

    event_log = await EventLog.open(database_url)
    try:
        lease = await event_log.acquire("cli-test")
        assert lease is not None
        await event_log.append([
            Event("gpu-a001", SlurmNodeObserved(node="gpu-a001", state="IDLE")),
            Event("gpu-a002", SlurmNodeObserved(node="gpu-a002", state="MIXED")),
        ], lease.epoch)

        listing = sunkd("events", "--json", cwd=tmp_path, url=database_url)
        assert listing.returncode == 0, listing.stderr
        rows = [json.loads(line) for line in listing.stdout.splitlines()]
        assert [row["kind"] for row in rows] == [
            "leader.elected", "slurm.node.observed", "slurm.node.observed"]
        assert rows[2]["payload"]["state"] == "MIXED"

        by_subject = sunkd("events", "--subject", "gpu-a002", cwd=tmp_path, url=database_url)
        assert "gpu-a002" in by_subject.stdout and "gpu-a001" not in by_subject.stdout
        after = sunkd("events", "--json", "--after", "2", cwd=tmp_path, url=database_url)
        assert [json.loads(line)["seq"] for line in after.stdout.splitlines()] == [3]

        follower = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sunkd", "events", "--follow", "--json", "--after", "3",
            "--kind", "operator.pinned", cwd=tmp_path,
            env={**os.environ, "SUNKD_DATABASE_URL": database_url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await asyncio.sleep(1.5)
            await event_log.append([Event("gpu-a001", SlurmNodeObserved(node="gpu-a001"))],
                                   lease.epoch)
            await event_log.append_unfenced([Event("gpu-a001", OperatorPinned(
                node="gpu-a001", to="slurm", who="ops", why="maintenance"))])
            assert follower.stdout is not None
            line = await asyncio.wait_for(follower.stdout.readline(), 20)
            row = json.loads(line)
            assert (row["kind"], row["seq"], row["payload"]["why"]) == (
                "operator.pinned", 5, "maintenance")
        finally:
            follower.terminate()
            await follower.wait()
    finally:
        await event_log.close()
