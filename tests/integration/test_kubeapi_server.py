"""Kubernetes API emulator: server-level behaviour.

/version, discovery (aggregated and legacy), Table output, the OpenAPI v3 kubectl uses
for field validation, fault injection (fail_next, latency), the request log, the
kubeconfig, the CLI entry, and a round trip with kubernetes_asyncio (the client sunkd uses).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from sunkd_testbed.kubeapi import KubeAPIEmulator, running_emulator
from sunkd_testbed.kubeapi.cli import serve
from tests.integration.kubeapi_support import Raw, node, pod

TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
ROOT = Path(__file__).resolve().parents[2]


async def test_version_reports_1_32(raw: Raw) -> None:
    status, body = await raw.get("/version")
    assert status == 200 and (body["major"], body["minor"]) == ("1", "32")


async def test_discovery_documents(raw: Raw) -> None:
    _, versions = await raw.get("/api")
    assert versions["kind"] == "APIVersions" and versions["versions"] == ["v1"]
    _, groups = await raw.get("/apis")
    assert {g["name"] for g in groups["groups"]} >= {
        "policy", "coordination.k8s.io", "apiextensions.k8s.io"}
    _, core = await raw.get("/api/v1")
    names = {r["name"] for r in core["resources"]}
    assert {"nodes", "nodes/status", "pods", "pods/status", "pods/eviction", "namespaces",
            "events"} <= names
    _, group = await raw.get("/apis/coordination.k8s.io")
    assert group["preferredVersion"]["version"] == "v1"
    accept = {"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                        "application/json"}
    async with raw.session.get(raw.base + "/api", headers=accept) as resp:
        assert resp.headers["Content-Type"] == (
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        agg = await resp.json(content_type=None)
    resources = {r["resource"]: r for r in agg["items"][0]["versions"][0]["resources"]}
    assert resources["pods"]["scope"] == "Namespaced"
    assert resources["nodes"]["scope"] == "Cluster"
    assert {s["subresource"] for s in resources["pods"]["subresources"]} == {
        "status", "eviction"}


async def test_table_output(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a", {"node-role.kubernetes.io/gpu": ""}))
    api.create(node("b", ready=False))
    api.patch("nodes", "a", {"spec": {"unschedulable": True}})
    status, table = await raw.request("GET", "/api/v1/nodes", headers=TABLE)
    assert status == 200 and table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name", "Status", "Roles", "Age", "Version"]
    cells = [r["cells"][:3] for r in table["rows"]]
    assert cells == [["a", "Ready,SchedulingDisabled", "gpu"], ["b", "NotReady", "<none>"]]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert table["metadata"]["resourceVersion"] == str(api.resource_version)
    _, full = await raw.request("GET", "/api/v1/nodes", headers=TABLE,
                                params={"includeObject": "Object"})
    assert full["rows"][0]["object"]["kind"] == "Node"
    _, single = await raw.request("GET", "/api/v1/nodes/a", headers=TABLE)
    assert len(single["rows"]) == 1
    api.create(pod("p", "a"))
    _, pods = await raw.request("GET", "/api/v1/namespaces/default/pods", headers=TABLE)
    assert pods["rows"][0]["cells"][:3] == ["p", "0/1", "Running"]
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l", "namespace": "default"},
             "spec": {"holderIdentity": "me"}}
    api.create(lease)
    _, leases = await raw.request(
        "GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases", headers=TABLE)
    assert [c["name"] for c in leases["columnDefinitions"]] == ["Name", "Holder", "Age"]
    assert leases["rows"][0]["cells"][:2] == ["l", "me"]


async def test_openapi_v3_for_field_validation(api: KubeAPIEmulator, raw: Raw) -> None:
    _, index = await raw.get("/openapi/v3")
    url = index["paths"]["api/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/api/v1?hash=")
    _, doc = await raw.get(url.split("?")[0])
    op = doc["paths"]["/api/v1/nodes/{name}"]["patch"]
    assert op["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1",
                                                     "kind": "Node"}
    assert any(p["name"] == "fieldValidation" for p in op["parameters"])
    assert "/api/v1/namespaces/{namespace}" in "".join(doc["paths"])
    status, _ = await raw.get("/openapi/v2")
    assert status == 404


async def test_fail_next_and_latency(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a"))
    api.fail_next(2, status=503)
    assert (await raw.get("/api/v1/nodes"))[0] == 503
    status, body = await raw.get("/api/v1/nodes/a")
    assert status == 503 and body["kind"] == "Status" and body["code"] == 503
    assert (await raw.get("/api/v1/nodes"))[0] == 200
    # Discovery is not affected by injected faults (kubectl keeps working).
    api.fail_next(1, status=500)
    assert (await raw.get("/version"))[0] == 200
    assert (await raw.get("/api/v1/nodes"))[0] == 500
    # Filtered faults and Retry-After.
    api.fail_next(1, status=429, retry_after=2, method="PATCH", path_contains="/nodes/a")
    assert (await raw.get("/api/v1/nodes/a"))[0] == 200
    async with raw.session.patch(raw.base + "/api/v1/nodes/a", json={},
                                 headers={"Content-Type": "application/merge-patch+json"}
                                 ) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "2"
    api.set_latency(0.3)
    started = time.monotonic()
    await raw.get("/api/v1/nodes")
    assert time.monotonic() - started >= 0.3
    api.set_latency(0)


async def test_request_log(api: KubeAPIEmulator, raw: Raw) -> None:
    await raw.patch("/api/v1/nodes/x", {"a": 1})
    last = api.requests[-1]
    assert (last.method, last.path, last.content_type) == (
        "PATCH", "/api/v1/nodes/x", "application/merge-patch+json")
    assert last.body == '{"a": 1}'


async def test_kubeconfig_and_context_manager(tmp_path: Path) -> None:
    async with running_emulator() as api:
        path = api.write_kubeconfig(tmp_path / "kc")
        config = yaml.safe_load(path.read_text())
        assert config["clusters"][0]["cluster"]["server"] == api.url
        assert config["current-context"] == "sunkd-emulator"


async def test_cli_serve_loads_manifests(tmp_path: Path) -> None:
    stop = asyncio.Event()
    port_file = tmp_path / "kc"
    task = asyncio.create_task(serve(0, port_file, [ROOT / "manifests" / "crds"],
                                     "127.0.0.1", stop))
    for _ in range(100):
        if port_file.exists():
            break
        await asyncio.sleep(0.02)
    server = yaml.safe_load(port_file.read_text())["clusters"][0]["cluster"]["server"]
    async with aiohttp.ClientSession() as session:
        async with session.get(server + "/apis/sunkd.io/v1alpha1/nodesets") as resp:
            assert resp.status == 200
    stop.set()
    assert await task == 0


async def test_kubernetes_asyncio_round_trip(api: KubeAPIEmulator) -> None:
    api.create(node("a"))
    configuration = client.Configuration(host=api.url)
    async with client.ApiClient(configuration) as api_client:
        core = client.CoreV1Api(api_client)
        nodes = await core.list_node()
        assert [n.metadata.name for n in nodes.items] == ["a"]
        rv = nodes.metadata.resource_version
        patched = await core.patch_node("a", {"metadata": {"labels": {"x": "1"}}})
        assert patched.metadata.labels == {"x": "1"}
        async with watch.Watch() as w:
            seen = []
            async for event in w.stream(core.list_node, resource_version=rv,
                                        allow_watch_bookmarks=True, timeout_seconds=1):
                seen.append(event["type"])
        assert "MODIFIED" in seen
        with pytest.raises(ApiException) as info:
            await core.read_node("missing")
        assert info.value.status == 404
