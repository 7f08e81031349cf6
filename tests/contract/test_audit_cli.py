"""`sunkd history` and `sunkd audit` on both backends, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from tests.seeding import DRAIN_TIMEOUT_REASON, POOL, T0, open_clocked, seed_pool_history


def sunkd(*args: str, cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUNKD_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "sunkd", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


async def seed(url: str) -> None:
    log = await open_clocked(url)
    try:
        await seed_pool_history(log)
    finally:
        await log.close()


async def test_history_table_and_json(database_url: str, tmp_path: Path) -> None:
    await seed(database_url)
    result = sunkd("history", "n3", "--json", cwd=tmp_path, url=database_url)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [(i["phase"], i["transition_id"]) for i in body["intervals"]] == [
        ("UNKNOWN", None), ("TO_SLURM", "adopt-n3"), ("SLURM", "adopt-n3"),
        ("TO_K8S", "t-lend-3"), ("SLURM", "t-lend-3"), ("TO_K8S", "t-lend-3b")]
    assert body["intervals"][4]["reason"] == DRAIN_TIMEOUT_REASON
    assert body["intervals"][3]["decided_by"] == "sunkd-a"

    text = sunkd("history", "n3", cwd=tmp_path, url=database_url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["from", "to", "duration", "owner", "phase", "pool",
                                "transition", "by", "why"]
    assert len(lines) == 2 + 6
    aborted = lines[2 + 3]
    assert "2026-11-02 10:00:00" in aborted and "30m00s" in aborted and "TO_K8S" in aborted
    assert "sunkd-a" in aborted
    assert lines[-1].split()[2] == "now"  # the current interval is open

    since = sunkd("history", "n3", "--since", "2026-11-02T10:40:00+00:00", "--json",
                  cwd=tmp_path, url=database_url)
    assert [i["transition_id"] for i in json.loads(since.stdout)["intervals"]] == [
        "t-lend-3", "t-lend-3b"]
    missing = sunkd("history", "nope", cwd=tmp_path, url=database_url)
    assert missing.returncode == 1 and "no history" in missing.stdout
    bad = sunkd("history", "n3", "--since", "yesterday", cwd=tmp_path, url=database_url)
    assert bad.returncode == 2 and "not a duration" in bad.stderr


async def test_audit_json_and_table(database_url: str, tmp_path: Path) -> None:
    await seed(database_url)
    result = sunkd("audit", "--since", "2026-11-01T00:00:00Z", "--json", cwd=tmp_path,
                   url=database_url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    until = datetime.fromisoformat(report["until"])
    assert {(t["direction"], t["outcome"]): t["count"] for t in report["transitions"]} == {
        ("adopt", "completed"): 5, ("lend", "aborted"): 1, ("lend", "completed"): 4,
        ("lend", "open"): 1, ("reclaim", "completed"): 1}
    assert [(a["transition_id"], a["abort_reason"], a["duration_s"])
            for a in report["aborts"]] == [("t-lend-3", DRAIN_TIMEOUT_REASON, 1800.0)]
    assert [d["transition_id"] for d in report["slowest_drains"]] == [
        "t-lend-3", "t-lend-5", "t-lend-2", "t-lend-1", "t-lend-4"]
    assert [(a["action_id"], a["error"], a["retryable"]) for a in report["failed_actions"]] == [
        ("a-2", "slurmrestd: HTTP 500", True)]
    hours = {(u["pool"], u["owner"]): u["hours"] for u in report["utilization"]}
    # Up to T0+4h as in docs/audit.md (765 min slurm, 430 min kubernetes), then the open
    # intervals run on until now: n2 slurm, n3 slurm (moving), n1/n4/n5 kubernetes.
    extra = (until - T0.replace(hour=12)).total_seconds() / 3600
    assert abs(hours[(POOL, "slurm")] - (765 / 60 + 2 * extra)) < 0.02
    assert abs(hours[(POOL, "kubernetes")] - (430 / 60 + 3 * extra)) < 0.02

    text = sunkd("audit", "--since", "2026-11-01T00:00:00Z", cwd=tmp_path, url=database_url)
    assert text.returncode == 0, text.stderr
    for heading in ("Hours per pool and owner", "Transitions", "Aborted transitions",
                    "Slowest drains", "Failed actions"):
        assert heading in text.stdout
    assert DRAIN_TIMEOUT_REASON in text.stdout and "slurm/drain" in text.stdout
    assert "slurmrestd: HTTP 500" in text.stdout

    recent = sunkd("audit", "--since", "1h", "--json", cwd=tmp_path, url=database_url)
    assert json.loads(recent.stdout)["transitions"] == []
    assert datetime.now(UTC) > until
