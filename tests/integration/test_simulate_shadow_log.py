"""`sunkd simulate --from-log DB_URL` on real event logs (SQLite and PostgreSQL).

Two logs: the seeded pool history (tests/seeding.py: known moves, aborts and transit
times) and the log sunkd's fold and policy wrote while the simulator ran a small
workload, appended through EventLog with its own timestamps.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sunkd.cli.main import main
from sunkd.domain.events import Event, LeaderElected, OwnershipSpec
from tests.seeding import POOL, open_clocked, seed_pool_history
from tests.unit.test_simulate_shadow import recorded_run


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["simulate", "--no-progress", *args])
    return code, capsys.readouterr().out


async def test_seeded_history_recorded_moves_and_a_candidate(
        database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = await open_clocked(database_url)
    try:
        await seed_pool_history(log)
    finally:
        await log.close()
    out = tmp_path / "shadow.json"
    code, text = await asyncio.to_thread(run_cli, capsys, "--from-log", database_url,
                                         "--knobs", "dwell=0", "--json", str(out))
    assert code == 0
    assert f"shadow replay of pool {POOL}: 5 nodes" in text
    [pool] = json.loads(out.read_text())["pools"]
    assert pool["pool"] == POOL and pool["nodes"] == 5
    recorded = pool["recorded"]
    # n1, n2, n4, n5 lent; n2 reclaimed; n3's first lend aborted, its second still open.
    assert (recorded["lends"], recorded["reclaims"], recorded["aborted"]) == (4, 1, 1)
    assert [(m["node"], m["direction"], m["t_s"]) for m in recorded["moves"]] == [
        ("n1", "lend", 4200.0), ("n2", "lend", 4800.0), ("n4", "lend", 6000.0),
        ("n2", "reclaim", 9900.0), ("n5", "lend", 12300.0)]
    # In transit: n1 10 min, n2 20 + 15, n4 10, n3 30 (aborted) + 55 (open at the end),
    # n5 25: 165 node-minutes.
    assert recorded["transit_node_hours"] == 2.75
    assert recorded["moves_by_day"] == [5]
    labels = [replay["label"] for replay in pool["replays"]]
    assert labels[0] == "replayed, recorded knobs"  # the Nodeset's ownership
    assert labels[1].startswith("candidate ") and "dwell=0" in labels[1]
    assert pool["replays"][1]["knobs"]["dwell_seconds"] == 0
    assert all(replay["violations"] == 0 for replay in pool["replays"])


async def test_a_log_sunkd_wrote_replays_close_to_what_it_did(
        database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = OwnershipSpec(dwell_seconds=0)
    controller, _world = recorded_run(spec)
    start = controller.log[0].recorded_at
    log = await open_clocked(database_url, start)
    try:
        lease = await log.acquire("simulate")
        assert lease is not None
        batch: list[Event] = []
        stamp = start
        for event in controller.log:
            if isinstance(event.payload, LeaderElected):
                continue  # acquire() recorded this term's election
            if event.recorded_at != stamp and batch:
                log.clock = stamp
                await log.append(batch, lease.epoch)
                batch = []
            stamp = event.recorded_at
            batch.append(Event(event.subject, event.payload))
        log.clock = stamp
        await log.append(batch, lease.epoch)
    finally:
        await log.close()
    out = tmp_path / "shadow.json"
    code, _ = await asyncio.to_thread(
        run_cli, capsys, "--from-log", database_url, "--knobs", "dwell=0",
        "--sweep", "maxKubernetes=2,8", "--json", str(out))
    assert code == 0
    [pool] = json.loads(out.read_text())["pools"]
    stats = controller.stats
    assert (pool["recorded"]["lends"], pool["recorded"]["reclaims"]) == (stats.lends,
                                                                         stats.reclaims)
    assert pool["jobs"] == 15 and pool["kubernetes_at_start"] == 2
    first, *candidates = pool["replays"]
    assert first["label"].startswith("replayed, default knobs")  # no Nodeset in this log
    by_cap = {replay["knobs"]["max_kubernetes"]: replay for replay in candidates}
    assert set(by_cap) == {2, 8}
    # The recorded knobs were dwell=0, so the candidate with maxKubernetes=8 is them.
    assert abs(by_cap[8]["lends"] - stats.lends) <= 1
    assert by_cap[2]["lends"] == 0  # capped at the start share: nothing to lend
    assert by_cap[2]["pod_pending_s"]["max"] > by_cap[8]["pod_pending_s"]["max"]


def test_an_unreadable_log_is_a_usage_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'events.db'}"
    assert main(["simulate", "--no-progress", "--from-log", missing]) == 2
    err = capsys.readouterr().err
    assert "--from-log: cannot read the event log" in err
    assert "no SQLite event log at" in err  # said before opening: read only, nothing created
    assert not (tmp_path / "no-such-dir").exists()

