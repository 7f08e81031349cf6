"""Client configuration from a kubeconfig file, and bearer tokens on the wire."""

from __future__ import annotations

import shutil
from pathlib import Path

import certifi
import pytest
import yaml

from sunkd.kubernetes.client import NODES, PODS, KubeClient

from .kube_helpers import node_body, running_emulator


async def test_connect_from_kubeconfig(tmp_path: Path) -> None:
    async with running_emulator() as emulator:
        emulator.create(node_body("n1"))
        path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        client = await KubeClient.connect(str(path))
        try:
            items, rv = await client.list(NODES)
            assert [i["metadata"]["name"] for i in items] == ["n1"]
            assert rv
        finally:
            await client.close()


async def test_token_user_sends_bearer_header(tmp_path: Path) -> None:
    async with running_emulator() as emulator:
        config = emulator.kubeconfig()
        config["users"][0]["user"] = {"token": "s3cret-token"}
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        client = await KubeClient.connect(str(path))
        try:
            await client.list(PODS)
        finally:
            await client.close()
        request = next(r for r in emulator.requests if r.path == "/api/v1/pods")
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers.get("authorization") == "Bearer s3cret-token"
        assert request.query.get("limit") == "500"


async def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pod: KUBERNETES_SERVICE_HOST/PORT plus the mounted token and CA bundle."""
    (tmp_path / "token").write_text("projected-token")
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    client = await KubeClient.connect(service_account_dir=str(tmp_path))
    try:
        assert client.host == "https://10.96.0.1:443"
        auth = await client.endpoint.credentials.authorization()
        assert auth["Authorization"] == "Bearer projected-token"
    finally:
        await client.close()
