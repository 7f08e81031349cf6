"""`sunkd demo` -- the README's main command -- end to end: real Slurm, the API
emulator, sunkd on SQLite. Nodes must move both ways, the HTTP surface must be served
while it runs, and the log it leaves must pass `sunkd replay --check`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def sunkd(*args: str, cwd: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", *args, cwd=cwd, env={**os.environ},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_demo_moves_nodes_both_ways_and_serves_everything(tmp_path: Path) -> None:
    from sunkd_testbed.slurm import available
    from tests.conftest import require

    installed, why = available()
    require(installed, why)
    port = free_port()
    demo = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", "demo", "--duration", "42", "--nodes", "3",
        "--phase-seconds", "14", "--summary-json", "summary.json",
        "--listen", f"127.0.0.1:{port}", cwd=tmp_path, env={**os.environ},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    served: dict[str, bool] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                await asyncio.sleep(0.25)
                try:
                    async with session.get(f"http://127.0.0.1:{port}/api/v1/nodes") as nodes:
                        body = await nodes.json()
                        if len(body.get("items", body.get("nodes", []))) < 3:
                            continue
                    # Nodes can be listed from one source before the other has
                    # reported fresh: readiness comes a moment later.
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as ready:
                        served["readyz"] = ready.status == 200
                        if not served["readyz"]:
                            continue
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                        served["metrics"] = "sunkd_nodes" in await metrics.text()
                    async with session.get(f"http://127.0.0.1:{port}/") as page:
                        served["status page"] = "gpu-a001" in await page.text()
                    async with session.post(f"http://127.0.0.1:{port}/scheduler/filter",
                                            data=b"not json") as bad:
                        served["extender rejects garbage"] = bad.status == 400
                    break
                except aiohttp.ClientError:
                    continue
        output, _ = await asyncio.wait_for(demo.communicate(), 150)
    finally:
        if demo.returncode is None:
            demo.kill()
            await demo.wait()
    text = output.decode()
    assert demo.returncode == 0, text[-3000:]
    assert served == {"readyz": True, "metrics": True, "status page": True,
                      "extender rejects garbage": True}, served
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lent"] >= 1 and summary["reclaimed"] >= 1, summary
    # A retried failure (a PDB's 429 during a reclaim) is normal; a refusal is not.
    from sunkd.store.eventlog import EventLog

    event_log = await EventLog.open(f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}")
    try:
        failures = [e.payload for e in await event_log.read(0, 100_000, kinds=["action.failed"])]
    finally:
        await event_log.close()
    assert len(failures) == summary["actions_failed"]
    assert all(getattr(f, "retryable", False) for f in failures), failures
    for key in ("aborted", "reaction_ms"):
        assert key in summary
    code, replay = await sunkd("replay", "--check", cwd=tmp_path)
    assert code == 0 and "replay check passed" in replay, replay
    code, status = await sunkd("status", "--json", cwd=tmp_path)
    assert code == 0
    assert {row["node"] for row in json.loads(status)["nodes"]} == {
        "gpu-a001", "gpu-a002", "gpu-a003"}
    code, history = await sunkd("history", "gpu-a001", "--json", cwd=tmp_path)
    assert code == 0, history
    intervals = json.loads(history)
    rows = intervals if isinstance(intervals, list) else intervals["intervals"]
    assert {row["owner"] for row in rows} >= {"slurm", "kubernetes"}, rows


def test_a_new_demo_keeps_the_previous_log_aside(tmp_path: Path) -> None:
    from sunkd_testbed.demo import set_aside_previous_log

    (tmp_path / "sunkd.db").write_text("earlier run")
    (tmp_path / "sunkd.db-wal").write_text("wal")
    set_aside_previous_log(f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}")
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert not (tmp_path / "sunkd.db").exists()
    assert len(kept) == 2 and all(name.startswith("sunkd.db.previous-") for name in kept)
    assert any(name.endswith("-wal") for name in kept)
    set_aside_previous_log("postgresql+asyncpg://u@db/sunkd")  # never touches PostgreSQL


@pytest.mark.kubelet
@pytest.mark.timeout(1500)  # the kubelet host lock may be held by another test bed a while
async def test_demo_with_slurmd_pods_moves_nodes_both_ways_on_real_kubelets(
    tmp_path: Path,
) -> None:
    """`sunkd demo --slurmd-pods`: the real control plane, three real kubelet Nodes (the
    demo takes the host lock the other real-kubelet tests take), host Slurm 22.05 and a
    Nodeset with spec.slurmd. Nodes move both ways with their slurmd pods, each step is
    measured, the HTTP surface is served, and the log passes `sunkd replay --check`."""
    from sunkd_testbed import images
    from sunkd_testbed.kubelet import available as kubelet_available
    from sunkd_testbed.kubernetes import available as plane_available
    from sunkd_testbed.slurm import available
    from tests.conftest import require

    for ok, why in (plane_available(), kubelet_available(), available("22.05")):
        require(ok, why)
    try:
        images.slurm_image("22.05")
    except images.ImageError as error:
        require(False, str(error))
    port = free_port()
    demo = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", "demo", "--slurmd-pods", "--duration", "80",
        "--phase-seconds", "30", "--summary-json", "summary.json",
        "--listen", f"127.0.0.1:{port}", cwd=tmp_path, env={**os.environ},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    served: dict[str, bool] = {}
    try:
        async with aiohttp.ClientSession() as session:
            while demo.returncode is None and len(served) < 3:
                await asyncio.sleep(0.5)
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as ready:
                        if ready.status != 200:
                            continue
                    served["readyz"] = True
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                        served["metrics"] = "sunkd_nodes" in await metrics.text()
                    async with session.get(f"http://127.0.0.1:{port}/") as page:
                        served["status page"] = "gpu-a001" in await page.text()
                except aiohttp.ClientError:
                    continue
        output, _ = await asyncio.wait_for(demo.communicate(), 1400)
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)  # the demo cleans up what it started
            await asyncio.wait_for(demo.wait(), 300)
    text = output.decode()
    assert demo.returncode == 0, text[-4000:]
    assert served == {"readyz": True, "metrics": True, "status page": True}, served
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lent"] >= 1 and summary["reclaimed"] >= 1, summary
    pods = summary["slurmd_pods"]
    assert pods["nodes"] == 3 and pods["slurm_version"].startswith("22.05"), pods
    assert 0 < pods["apply_to_registered_s"] < 300, pods
    assert len(pods["lends"]) == summary["lent"] and pods["lends"], pods
    assert len(pods["reclaims"]) == summary["reclaimed"] and pods["reclaims"], pods
    for lend in pods["lends"]:  # the pod goes before the taint comes off
        assert lend["pod_gone_s"] is not None and lend["untainted_s"] is not None, lend
        assert lend["pod_gone_s"] <= lend["untainted_s"], lend
    for reclaim in pods["reclaims"]:  # the drain is lifted once the new slurmd registered
        assert reclaim["pod_registered_s"] is not None, reclaim
        assert reclaim["undrained_s"] is not None, reclaim
        assert reclaim["pod_registered_s"] <= reclaim["undrained_s"], reclaim
    memory = pods["memory_mib"]["at_registered"]
    assert len(memory["nodes"]) == 3 and len(memory["slurmd"]) == 3, memory
    assert all(n["kubelet"] > 0 and n["containerd"] > 0 for n in memory["nodes"].values())
    from sunkd.domain.slurmdgone import VERB_SLURMD_CREATE, VERB_SLURMD_DELETE
    from sunkd.store.eventlog import EventLog

    event_log = await EventLog.open(f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}")
    try:
        failures = [e.payload for e in await event_log.read(0, 100_000, kinds=["action.failed"])]
        verbs = {getattr(e.payload, "verb", "") for e in await event_log.read(
            0, 100_000, kinds=["action.succeeded"])}
    finally:
        await event_log.close()
    assert all(getattr(f, "retryable", False) for f in failures), failures
    assert {VERB_SLURMD_CREATE, VERB_SLURMD_DELETE} <= verbs, verbs
    code, replay = await sunkd("replay", "--check", cwd=tmp_path)
    assert code == 0 and "replay check passed" in replay, replay
