"""Operator commands against a hostile or damaged log, on SQLite and PostgreSQL,
run as a user runs them (`python -m sunkd ...`).

- 12.7: `sunkd pin` of a node never observed is refused without `--force`; a pin of a
  never-observed node (a phantom) no longer breaks `replay --check` and appears neither in
  `status` nor in `/metrics` nor in the API's lists.
- 12.8: a corrupt row is shown as corrupt (seq, kind, raw text) by `events --json`,
  `status` and `replay --check`, which go on past it.
- 12.10: `status` escapes terminal control characters; `events --after 1e23`,
  `history`/`audit --since 1e400h`, `--config DIR` and `doctor` (no kubeconfig, a broken
  slurmrestd) answer with a message, never a traceback.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from sqlalchemy import text

from sunkd.api.metrics import Metrics
from sunkd.domain.events import (
    Event,
    K8sNodeObserved,
    OperatorPinned,
    SlurmNodeObserved,
)
from sunkd.domain.fold import fold
from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
from sunkd.store.eventlog import EventLog

ROOT = Path(__file__).resolve().parents[2]


def sunkd(*args: str, url: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "SUNKD_DATABASE_URL": url, **env}
    return subprocess.run([sys.executable, "-m", "sunkd", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=120)


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout


@pytest.fixture
async def seeded(database_url: str) -> AsyncIterator[EventLog]:
    """A log with two observed nodes: n1 (Slurm and Kubernetes) and n2 (Slurm)."""
    event_log = await EventLog.open(database_url, migrate=True)
    lease = await event_log.acquire("hostile-cli")
    assert lease is not None
    await event_log.append([
        Event("n1", SlurmNodeObserved(node="n1", state="IDLE", partitions=("batch",))),
        Event("n2", SlurmNodeObserved(node="n2", state="IDLE", partitions=("batch",))),
        Event("k-n1", K8sNodeObserved(node="k-n1", slurm_node="n1", ready=True)),
    ], lease.epoch)
    try:
        yield event_log
    finally:
        await event_log.close()


async def insert_raw(event_log: EventLog, kind: str, subject: str, payload: str) -> int:
    """Append a row by hand, bypassing every check (as a broken tool would)."""
    seq = await event_log.latest_seq() + 1
    cast = "CAST(:payload AS JSONB)" if event_log.dialect == "postgresql" else ":payload"
    async with event_log.engine.begin() as connection:
        await connection.execute(text(
            "INSERT INTO events (seq, recorded_at, kind, subject, epoch, payload) VALUES "
            f"(:seq, CURRENT_TIMESTAMP, :kind, :subject, 0, {cast})"),
            {"seq": seq, "kind": kind, "subject": subject, "payload": payload})
    return seq


# ------------------------------------------------------------------------------ 12.7


async def test_pin_of_a_node_never_observed_is_refused_without_force(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.7: `sunkd pin typo-node` used to record the pin with a warning, after which
    `replay --check` failed for good."""
    url = seeded.url
    before = await seeded.latest_seq()
    refused = sunkd("pin", "typo-node", "--to", "slurm", "--reason", "typo", url=url,
                    cwd=tmp_path)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert "no node 'typo-node' has been observed" in refused.stderr
    assert "--force" in refused.stderr
    assert await seeded.latest_seq() == before  # nothing appended
    # Known names, Slurm or Kubernetes, are pinned as before.
    for name in ("n1", "k-n1"):
        pinned = sunkd("pin", name, "--to", "slurm", "--reason", "fw", url=url, cwd=tmp_path)
        assert pinned.returncode == 0, pinned.stderr
        assert "pinned n1 to slurm" in pinned.stdout
    forced = sunkd("pin", "future-node", "--to", "kubernetes", "--reason", "racked tomorrow",
                   "--force", url=url, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "has not been observed yet" in forced.stderr


async def test_pin_of_a_never_observed_node_is_no_phantom(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.7: a pin of a name never observed made `replay --check` fail ("node_ownership
    has no row for typo-node", and neither `--rebuild` nor pinning back to auto cleared
    it), and the phantom node appeared in `status` and `/metrics`."""
    url = seeded.url
    await seeded.append_unfenced([Event("typo-node", OperatorPinned(
        node="typo-node", to="slurm", who="ops", why="typo"))])
    check = sunkd("replay", "--check", url=url, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "replay check passed" in check.stdout
    await seeded.append_unfenced([Event("typo-node", OperatorPinned(
        node="typo-node", to="auto", who="ops", why="undo"))])
    assert sunkd("replay", "--check", url=url, cwd=tmp_path).returncode == 0
    await seeded.append_unfenced([Event("typo-2", OperatorPinned(
        node="typo-2", to="kubernetes", who="ops", why="typo"))])

    status = sunkd("status", "--json", url=url, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert sorted(row["node"] for row in report["nodes"]) == ["n1", "n2"]
    assert [pin["node"] for pin in report["pending_pins"]] == ["typo-2"]
    table = sunkd("status", url=url, cwd=tmp_path)
    assert "2 nodes" in table.stdout and "typo-2" in table.stdout  # as a pending pin only
    assert not any(line.startswith("typo") for line in table.stdout.splitlines())

    events = [e async for batch in seeded.read_range() for e in batch]
    state = fold(events)
    metrics = Metrics()
    metrics.set_state(state, 0.0)
    nodes_total = sum(sample.value for family in metrics.registry.collect()
                      if family.name == "sunkd_nodes" for sample in family.samples)
    assert nodes_total == 2

    from aiohttp.test_utils import TestClient, TestServer

    from sunkd.api.app import build_app
    from tests.integration.test_api import View

    async with TestClient(TestServer(build_app(View(state, seeded)))) as client:
        listed = await (await client.get("/api/v1/nodes")).json()
        assert [item["name"] for item in listed["items"]] == ["n1", "n2"]
        assert listed["total"] == 2
        page = await (await client.get("/")).text()
        assert "typo-2" not in page


# ------------------------------------------------------------------------------ 12.8


async def test_events_json_shows_a_corrupt_row_and_goes_on(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.8: the documented `sunkd events --after SEQ --json` crashed on the bad row."""
    bad = await insert_raw(seeded, "slurm.node.observed", "n1",
                           '{"v": 1, "node": "n1", "cpus": "many"}')
    await seeded.append_unfenced([Event("n2", OperatorPinned(
        node="n2", to="slurm", who="ops", why="after the bad row"))])
    listing = sunkd("events", "--after", str(bad - 1), "--json", url=seeded.url, cwd=tmp_path)
    no_traceback(listing)
    assert listing.returncode == 0, listing.stderr
    rows = [json.loads(line) for line in listing.stdout.splitlines()]
    assert [row["seq"] for row in rows] == [bad, bad + 1]
    assert rows[0]["corrupt"] is True and rows[0]["kind"] == "slurm.node.observed"
    assert "many" in rows[0]["raw"] and "cpus" in rows[0]["error"]
    assert rows[1]["kind"] == "operator.pinned"
    plain = sunkd("events", url=seeded.url, cwd=tmp_path)
    assert plain.returncode == 0 and "CORRUPT" in plain.stdout
    assert "after the bad row" in plain.stdout


async def test_status_and_replay_check_show_a_corrupt_row_and_go_on(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.8: `status` and `replay --check` crashed on the bad row."""
    bad = await insert_raw(seeded, "slurm.node.observed", "n2",
                           '{"v": 1, "node": "n2", "cpus": "many"}')
    await seeded.append_unfenced([Event("n2", OperatorPinned(
        node="n2", to="slurm", who="ops", why="after the bad row"))])
    status = sunkd("status", "--json", url=seeded.url, cwd=tmp_path)
    no_traceback(status)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [row["seq"] for row in report["corrupt_rows"]] == [bad]
    assert f"row seq {bad} (slurm.node.observed" in status.stderr
    n2 = next(row for row in report["nodes"] if row["node"] == "n2")
    assert "after the bad row" in n2["reason"]  # folded past the bad row
    check = sunkd("replay", "--check", url=seeded.url, cwd=tmp_path)
    no_traceback(check)
    assert check.returncode == 1
    assert f"row seq {bad} (slurm.node.observed" in check.stdout
    assert "many" in check.stdout


async def test_a_payload_that_is_not_json_is_shown_as_corrupt(
        sqlite_url: str, tmp_path: Path) -> None:
    """12.8 (SQLite stores payloads as text; PostgreSQL's JSONB cannot hold this)."""
    event_log = await EventLog.open(sqlite_url)
    try:
        await event_log.append_unfenced([Event("n1", SlurmNodeObserved(node="n1"))])
        bad = await insert_raw(event_log, "slurm.node.observed", "n1", "{not json")
        not_object = await insert_raw(event_log, "slurm.node.observed", "n1", '"a string"')
        for args in (("events", "--json"), ("status",), ("replay", "--check")):
            result = sunkd(*args, url=sqlite_url, cwd=tmp_path)
            no_traceback(result)
            assert str(bad) in result.stdout + result.stderr, args
            assert str(not_object) in result.stdout + result.stderr, args
    finally:
        await event_log.close()


# ----------------------------------------------------------------------------- 12.10


async def test_status_escapes_terminal_control_characters(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.10: pin and Slurm reasons were printed raw: an escape sequence in one cleared
    the operator's screen or retitled the terminal."""
    lease = await seeded.acquire("hostile-cli-2", 15)
    epoch = lease.epoch if lease is not None else (await seeded.leader()).epoch
    await seeded.append([Event("n2", SlurmNodeObserved(
        node="n2", state="IDLE", flags=("DRAIN",), partitions=("batch",),
        reason="\x1b]0;owned\x07maintenance\x1b[2J"))], epoch)
    await seeded.append_unfenced([Event("n1", OperatorPinned(
        node="n1", to="slurm", who="ops\x1b[31m", why="fw\x1b[8mhidden"))])
    status = sunkd("status", url=seeded.url, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "\x1b" not in status.stdout and "\x07" not in status.stdout
    assert "\\x1b[8mhidden" in status.stdout
    events = sunkd("events", url=seeded.url, cwd=tmp_path)
    assert "\x1b" not in events.stdout


async def test_events_after_a_seq_beyond_bigint_is_a_usage_error(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.10: `--after 100000000000000000000000` reached the driver: OverflowError."""
    for after in ("1e23", "100000000000000000000000", "-1"):
        result = sunkd("events", "--after", after, url=seeded.url, cwd=tmp_path)
        no_traceback(result)
        assert result.returncode == 2, (after, result.stderr)
        assert "--after" in result.stderr
    assert sunkd("events", "--after", str(2**63 - 1), url=seeded.url,
                 cwd=tmp_path).returncode == 0


async def test_history_and_audit_since_beyond_datetime_answer_without_traceback(
        seeded: EventLog, tmp_path: Path) -> None:
    """12.10: `--since 1e400h` (infinite) and `--since 1e12h` (past year 1) raised
    OverflowError from timedelta."""
    for command in (("history", "n1"), ("audit",)):
        for since in ("1e400h", "1e12h", "nanh"):
            result = sunkd(*command, "--since", since, url=seeded.url, cwd=tmp_path)
            no_traceback(result)
            assert result.returncode in (0, 1, 2), (command, since, result.returncode)
            if result.returncode == 2:
                assert "--since" in result.stderr or "duration" in result.stderr


def test_config_pointing_at_a_directory_exits_2(tmp_path: Path) -> None:
    """12.10: `--config /tmp` raised IsADirectoryError."""
    result = subprocess.run([sys.executable, "-m", "sunkd", "--config", str(tmp_path),
                             "status"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 2
    assert "is a directory" in result.stderr


def test_doctor_without_a_kubeconfig_says_where_it_looked(tmp_path: Path) -> None:
    """12.10: kubernetes-asyncio said "Invalid kube-config file. Expected key
    current-context in kube-config" about a file that does not exist."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "SUNKD_SLURM_URL")}
    env.update(HOME=str(tmp_path), SUNKD_KUBERNETES_ENABLED="true")
    result = subprocess.run([sys.executable, "-m", "sunkd", "doctor"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path, env=env)
    no_traceback(result)
    assert result.returncode == 1
    assert "no kubeconfig found" in result.stdout
    assert str(tmp_path / ".kube" / "config") in result.stdout
    assert "$KUBECONFIG is unset" in result.stdout
    assert "current-context" not in result.stdout


@pytest.mark.parametrize("fault", ["deep", "truncated"])
async def test_doctor_reports_a_broken_slurmrestd_without_a_traceback(fault: str) -> None:
    """12.10: JSON nested 100,000 deep (RecursionError) and a body cut short
    (ClientPayloadError) escaped `sunkd doctor` as tracebacks."""

    async def answer(request: web.Request) -> web.StreamResponse:
        if fault == "deep":
            return web.Response(text="[" * 100_000 + "]" * 100_000,
                                content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"meta":')
        assert request.transport is not None
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        from sunkd.cli.doctor import doctor

        settings = replace(Settings(), slurm=SlurmSettings(url=f"http://127.0.0.1:{port}"),
                           kubernetes=KubernetesSettings(enabled=False))
        out = io.StringIO()
        assert await doctor(settings, as_json=False, out=out) == 1
        assert "slurm: FAILED" in out.getvalue()
    finally:
        await runner.cleanup()
