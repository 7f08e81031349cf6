"""`sunkd sim kubeapi` as a developer runs it, driven by the real kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.kubectl
REPO = Path(__file__).resolve().parents[2]


async def test_sunkd_sim_kubeapi_serves_kubectl(tmp_path: Path) -> None:
    require(shutil.which("kubectl") is not None, "kubectl missing")
    (tmp_path / "node.yaml").write_text(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: gpu-a001\n  labels: {pool: gpu-a}\n")
    kubeconfig = tmp_path / "kubeconfig"
    emulator = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", "sim", "kubeapi", "--port", "0",
        "--kubeconfig-out", str(kubeconfig), "--load", str(REPO / "manifests" / "crds"),
        "--load", str(tmp_path / "node.yaml"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert emulator.stdout is not None
        banner = (await asyncio.wait_for(emulator.stdout.readline(), 30)).decode()
        assert "not a real API server" in banner and kubeconfig.exists(), banner
        # Each run with its own discovery cache (kubectl caches per server URL).
        env = {**os.environ, "KUBECACHEDIR": str(tmp_path / "cache")}

        async def kubectl(*args: str) -> str:
            process = await asyncio.create_subprocess_exec(
                "kubectl", "--kubeconfig", str(kubeconfig), *args, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), 60)
            assert process.returncode == 0, err.decode()
            return out.decode()

        nodes = json.loads(await kubectl("get", "nodes", "-o", "json"))
        assert [n["metadata"]["name"] for n in nodes["items"]] == ["gpu-a001"]
        await kubectl("apply", "-f", str(REPO / "manifests" / "examples" / "nodeset.yaml"))
        assert "gpu-a" in await kubectl("get", "nds", "-n", "sunkd")
        emulator.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(emulator.wait(), 30) == 0
    finally:
        if emulator.returncode is None:
            emulator.kill()
            await emulator.wait()
