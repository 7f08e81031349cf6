"""`sunkd audit --from/--to`: busy and idle node-hours per pool and owner, on both
backends, run as a user runs it, over the seeded history plus some work."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from sunkd.domain.events import (
    Event,
    K8sWorkloadObserved,
    Payload,
    PodRef,
    SlurmNodeObserved,
)
from sunkd.store.archive import archive
from sunkd.store.eventlog import EventLog
from tests.contract.test_audit_cli import sunkd
from tests.seeding import POOL, T0, all_events, open_clocked, seed_pool_history


async def seed_with_work(url: str, start: datetime = T0) -> None:
    """The seeded history (docs: tests/seeding.py), then from T0+4h: a Slurm job on n2
    for an hour, a pool pod Running on k-n1 (lent) for 30 minutes; a DaemonSet-like pod
    (not the pool's) on k-n4 all along, which is not work the pool is for."""
    log = await open_clocked(url, start)
    try:
        epoch = await seed_pool_history(log, start)

        async def at(offset: timedelta, *items: tuple[str, Payload]) -> None:
            log.clock = start + offset
            await log.append([Event(subject, payload) for subject, payload in items], epoch)

        hour = timedelta(hours=1)
        await at(4 * hour,
                 ("n2", SlurmNodeObserved(node="n2", state="ALLOCATED", partitions=("gpu",),
                                          cpus=64, alloc_cpus=32)),
                 ("k-n1", K8sWorkloadObserved(node="k-n1", pool=POOL, pods=(
                     PodRef("serverless", "fn-1", phase="Running", uid="u1"),))),
                 ("k-n4", K8sWorkloadObserved(node="k-n4", pool=POOL, pods=(
                     PodRef("monitoring", "agent", phase="Running", pool_pod=False),))))
        await at(4.5 * hour, ("k-n1", K8sWorkloadObserved(node="k-n1", pool=POOL, pods=())))
        await at(5 * hour, ("n2", SlurmNodeObserved(node="n2", state="IDLE",
                                                    partitions=("gpu",), cpus=64)))
    finally:
        await log.close()


async def test_audit_busy_and_idle_node_hours(database_url: str, tmp_path: Path) -> None:
    await seed_with_work(database_url)
    period = ("--from", (T0 + timedelta(hours=4)).isoformat(),
              "--to", (T0 + timedelta(hours=6)).isoformat())
    result = sunkd("audit", *period, "--json", cwd=tmp_path, url=database_url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["until"] == (T0 + timedelta(hours=6)).isoformat()
    rows = {(r["pool"], r["owner"]): (r["busy_hours"], r["idle_hours"], r["busy_share"])
            for r in report["node_hours"]}
    # Slurm owns n2 (the job: 1 h busy, 1 h idle) and n3 (in transit to Kubernetes since
    # T0+3h: it counts for the side it comes from, idle); Kubernetes owns n1 (the pod:
    # 0.5 h busy), n4 (only a non-pool pod: idle) and n5; other-1 is in no pool.
    assert rows == {(POOL, "slurm"): (1.0, 3.0, 0.25),
                    (POOL, "kubernetes"): (0.5, 5.5, round(0.5 / 6, 4)),
                    ("none", "none"): (0.0, 2.0, 0.0)}
    # The same period's hours per owner (ownership_intervals) are busy + idle.
    hours = {(u["pool"], u["owner"]): u["hours"] for u in report["utilization"]}
    assert hours == {(POOL, "slurm"): 4.0, (POOL, "kubernetes"): 6.0}

    text = sunkd("audit", *period, cwd=tmp_path, url=database_url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    heading = lines.index("Busy and idle node-hours per pool and owner")
    assert lines[heading + 1].split() == ["pool", "owner", "busy", "h", "idle", "h", "busy",
                                          "share"]
    assert lines[heading + 3].split() == [POOL, "kubernetes", "0.50", "5.50", "8.3", "%"]
    assert lines[heading + 4].split() == [POOL, "slurm", "1.00", "3.00", "25.0", "%"]

    # Before the work started, nothing was busy; a window ending before it starts fails.
    early = sunkd("audit", "--from", T0.isoformat(), "--to",
                  (T0 + timedelta(hours=4)).isoformat(), "--json", cwd=tmp_path,
                  url=database_url)
    assert all(r["busy_hours"] == 0 for r in json.loads(early.stdout)["node_hours"])
    backwards = sunkd("audit", "--from", "1h", "--to", "2h", cwd=tmp_path, url=database_url)
    assert backwards.returncode == 2 and "is not after" in backwards.stderr


async def test_audit_of_an_archived_log_starts_from_its_base_snapshot(
        sqlite_url: str, tmp_path: Path) -> None:
    """After `sunkd log archive` removed the history up to the work, the nodes' owners and
    pools come from the base snapshot: the same figures as on the whole log."""
    await seed_with_work(sqlite_url)
    period = ("--from", (T0 + timedelta(hours=4)).isoformat(),
              "--to", (T0 + timedelta(hours=6)).isoformat(), "--json")
    whole = sunkd("audit", *period, cwd=tmp_path, url=sqlite_url)
    assert whole.returncode == 0, whole.stderr
    event_log = await EventLog.open(sqlite_url)
    try:
        first_work = next(e.seq for e in await all_events(event_log)
                          if e.recorded_at >= T0 + timedelta(hours=4))
        result = await archive(event_log, tmp_path / "archive", upto_seq=first_work - 1)
        assert result is not None and result.removed == first_work - 1
        assert (await event_log.read(0, 1))[0].seq == first_work
    finally:
        await event_log.close()
    archived = sunkd("audit", *period, cwd=tmp_path, url=sqlite_url)
    assert archived.returncode == 0, archived.stderr
    assert json.loads(archived.stdout)["node_hours"] == json.loads(whole.stdout)["node_hours"]
    assert len(json.loads(whole.stdout)["node_hours"]) == 3
