"""`sunkd doctor`'s Kubernetes half, as an operator runs it, against the API emulator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import yaml

from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.integration.kube_helpers import token_plugin, write_exec_kubeconfig

REPO = Path(__file__).resolve().parents[2]


async def doctor(tmp_path: Path, kubeconfig: Path) -> tuple[int, dict[str, object]]:
    config = tmp_path / "sunkd.toml"
    config.write_text(f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n')
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", "--config", str(config), "doctor", "--json",
        env={k: v for k, v in os.environ.items() if not k.startswith("SUNKD_")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, json.loads(out)


async def test_doctor_reports_the_api_server_nodes_and_the_crd(tmp_path: Path) -> None:
    async with KubeAPIEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a001"}})
        code, report = await doctor(tmp_path, kubeconfig)
        # No slurm.url configured: exit 2 ("nothing to check" there), Kubernetes found.
        assert code == 2
        kube = report["kubernetes"]
        assert isinstance(kube, dict)
        assert kube["nodes"] == 1 and kube["version"].startswith("v1.32")
        assert kube["auth"] == "none"  # the emulator's kubeconfig has no credentials
        assert kube["nodesets"] is None  # CRD not installed yet
        emulator.create(yaml.safe_load((REPO / "manifests/crds/nodeset.yaml").read_text()))
        code, report = await doctor(tmp_path, kubeconfig)
        assert report["kubernetes"]["nodesets"] == 0  # type: ignore[index]
    # The server is gone: a precise failure and exit 1.
    code, report = await doctor(tmp_path, kubeconfig)
    assert code == 1
    assert "error" in report["kubernetes"]  # type: ignore[operator]


async def test_doctor_authenticates_with_an_exec_plugin(tmp_path: Path) -> None:
    """The CLI loads credentials as the daemon does (kubernetes-asyncio's exec provider):
    the plugin runs once, and its token is on every request the doctor makes."""
    plugin = token_plugin(tmp_path / "plugin.py", "from-plugin")
    async with KubeAPIEmulator() as emulator:
        kubeconfig = write_exec_kubeconfig(emulator, tmp_path / "kubeconfig", plugin,
                                           "client.authentication.k8s.io/v1beta1")
        code, report = await doctor(tmp_path, kubeconfig)
        assert code == 2, report
        assert report["kubernetes"]["auth"] == f"exec plugin {plugin}"  # type: ignore[index]
        seen = {r.headers.get("Authorization") for r in emulator.requests}
        assert seen == {"Bearer from-plugin"}, seen
