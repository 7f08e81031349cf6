"""The HTTP API over a state folded from a seeded log: health, metrics, the read API,
history from the SQL read models, and the kube-scheduler extender protocol."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sunkd.api.app import api_pools, build_app
from sunkd.api.extender import WHY_HELD, WHY_MOVING, WHY_SLURM, ApiPool
from sunkd.api.metrics import Metrics
from sunkd.domain.fold import fold
from sunkd.domain.state import ClusterState
from sunkd.store.eventlog import EventLog
from tests.seeding import POOL, all_events, open_clocked, seed_pool_history

POOL_NODES = ["k-n1", "k-n2", "k-n3", "k-n4", "k-n5", "other-1", "stranger"]
POOL_POD = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "fn-1", "namespace": "default",
                         "labels": {"app": "serverless", "x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
OTHER_POD = {"metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
             "spec": {}}


@dataclass
class View:
    current: ClusterState
    event_log: EventLog | None
    metrics: Metrics = field(default_factory=Metrics)
    leader: bool = True
    ready: tuple[bool, str] = (True, "leader")

    def state(self) -> ClusterState:
        return self.current

    def pools(self) -> Sequence[ApiPool]:
        return api_pools(self.current)

    def is_leader(self) -> bool:
        return self.leader

    def is_ready(self) -> tuple[bool, str]:
        return self.ready


async def seeded_view(url: str) -> View:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=4)
    log = await open_clocked(url, start)
    await seed_pool_history(log, start)
    events = await all_events(log)
    view = View(fold(events), log)
    view.metrics.observe_events(events)
    return view


@pytest.fixture
async def view(sqlite_url: str) -> AsyncIterator[View]:
    seeded = await seeded_view(sqlite_url)
    yield seeded
    assert seeded.event_log is not None
    await seeded.event_log.close()


@pytest.fixture
async def client(view: View) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(view))) as test_client:
        yield test_client


def interpret_filter(args: dict[str, Any], result: dict[str, Any], node_cache_capable: bool
                     ) -> list[str]:
    """kube-scheduler's HTTPExtender.Filter result handling (pkg/scheduler/extender.go)."""
    if result.get("Error"):
        raise AssertionError(f"extender error: {result['Error']}")
    if node_cache_capable and result.get("NodeNames") is not None:
        names = list(result["NodeNames"])
        assert set(names) <= set(args["NodeNames"]), "extender returned unknown nodes"
        return names
    if result.get("Nodes") is not None:
        return [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    return []


def node_list(names: list[str]) -> dict[str, Any]:
    return {"metadata": {}, "items": [
        {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
         "status": {"allocatable": {"cpu": "64"}}} for name in names]}


# ------------------------------------------------------------------------ health


async def test_healthz_and_readyz(client: TestClient[Any, Any], view: View) -> None:
    assert (await client.get("/healthz")).status == 200
    response = await client.get("/readyz")
    assert response.status == 200 and "leader" in await response.text()
    view.ready = (False, "kubernetes source is stale: timeout")
    response = await client.get("/readyz")
    assert response.status == 503
    assert "kubernetes source is stale" in await response.text()


async def test_metrics_exposes_state_and_event_counters(client: TestClient[Any, Any]) -> None:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    # n1, n5 KUBERNETES; n4 owner kubernetes but HELD (NotReady); n2 slurm; n3 moving.
    assert f'sunkd_nodes{{owner="kubernetes",phase="KUBERNETES",pool="{POOL}"}} 2.0' in text
    assert f'sunkd_nodes{{owner="kubernetes",phase="HELD",pool="{POOL}"}} 1.0' in text
    assert f'sunkd_nodes{{owner="slurm",phase="TO_K8S",pool="{POOL}"}} 1.0' in text
    assert 'sunkd_transitions_aborted_total{direction="lend",reason="drain_timeout"} 1.0' in text
    assert 'sunkd_transitions_completed_total{direction="lend",reason="completed"} 4.0' in text
    assert "sunkd_time_to_lend_seconds_count 4.0" in text
    assert "sunkd_time_to_reclaim_seconds_sum 900.0" in text
    assert 'sunkd_actions_total{outcome="failed",side="slurm",verb="drain"} 1.0' in text
    assert 'sunkd_transitions_open{direction="lend"} 1.0' in text
    assert 'sunkd_source_fresh{source="slurm"} 1.0' in text


# ---------------------------------------------------------------------- read API


async def test_nodes_paginate_with_continue(client: TestClient[Any, Any]) -> None:
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        params = {"limit": "2", **({"continue": token} if token else {})}
        body = await (await client.get("/api/v1/nodes", params=params)).json()
        assert len(body["items"]) <= 2
        seen.extend(item["name"] for item in body["items"])
        pages += 1
        token = body["continue"]
        if token is None:
            break
    assert seen == ["n1", "n2", "n3", "n4", "n5", "other-1"] and pages == 3
    assert (await client.get("/api/v1/nodes", params={"limit": "0"})).status == 400
    assert (await client.get("/api/v1/nodes", params={"limit": "x"})).status == 400
    assert (await client.get("/api/v1/nodes", params={"continue": "%%%"})).status == 400
    big = await (await client.get("/api/v1/nodes", params={"limit": "100000"})).json()
    assert len(big["items"]) == 6 and big["continue"] is None


async def test_node_detail_by_either_name(client: TestClient[Any, Any]) -> None:
    body = await (await client.get("/api/v1/nodes/n4")).json()
    assert body["owner"] == "kubernetes" and body["phase"] == "HELD"
    assert body["machinePhase"] == "KUBERNETES" and body["holdReasons"] == ["NotReady"]
    assert body["pool"] == POOL
    same = await (await client.get("/api/v1/nodes/k-n3")).json()
    assert same["name"] == "n3" and same["phase"] == "TO_K8S"
    assert same["transition"]["id"] == "t-lend-3b"
    assert (await client.get("/api/v1/nodes/nope")).status == 404


async def test_node_history_from_read_models(client: TestClient[Any, Any]) -> None:
    body = await (await client.get("/api/v1/nodes/n3/history")).json()
    phases = [(row["phase"], row["owner"], row["transition_id"]) for row in body["items"]]
    assert phases == [
        ("UNKNOWN", "none", None), ("TO_SLURM", "none", "adopt-n3"),
        ("SLURM", "slurm", "adopt-n3"), ("TO_K8S", "slurm", "t-lend-3"),
        ("SLURM", "slurm", "t-lend-3"), ("TO_K8S", "slurm", "t-lend-3b")]
    assert body["items"][4]["reason"].startswith("Slurm drain not finished")
    assert body["items"][3]["duration_s"] == 1800.0
    assert body["items"][-1]["to_at"] is None
    paged = await (await client.get("/api/v1/nodes/n3/history",
                                    params={"limit": "4", "offset": "2"})).json()
    assert [row["transition_id"] for row in paged["items"]] == [
        "adopt-n3", "t-lend-3", "t-lend-3", "t-lend-3b"]
    assert paged["nextOffset"] is None
    recent = await (await client.get("/api/v1/nodes/n3/history", params={"since": "90m"})).json()
    assert [row["transition_id"] for row in recent["items"]] == ["t-lend-3", "t-lend-3b"]
    assert (await client.get("/api/v1/nodes/n3/history", params={"since": "x"})).status == 400


async def test_pools(client: TestClient[Any, Any]) -> None:
    body = await (await client.get("/api/v1/pools")).json()
    pools = {item["name"]: item for item in body["items"]}
    assert pools[POOL]["nodesByPhase"] == {"KUBERNETES": 2, "HELD": 1, "TO_K8S": 1, "SLURM": 1}
    assert pools[POOL]["partitions"] == ["gpu"]
    assert pools["none"]["nodesByPhase"] == {"UNKNOWN": 1}


# ---------------------------------------------------------------------- extender


@pytest.mark.parametrize("node_cache_capable", [True, False])
async def test_filter_pool_pod_only_on_kubernetes_nodes(
        client: TestClient[Any, Any], node_cache_capable: bool) -> None:
    args: dict[str, Any] = {"Pod": POOL_POD}
    if node_cache_capable:
        args.update(Nodes=None, NodeNames=POOL_NODES)
    else:
        args.update(Nodes=node_list(POOL_NODES), NodeNames=None)
    response = await client.post("/scheduler/filter", json=args)
    assert response.status == 200
    result = await response.json()
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes",
                           "FailedAndUnresolvableNodes", "Error"}
    assert interpret_filter(args, result, node_cache_capable) == ["k-n1", "k-n5"]
    if node_cache_capable:
        assert result["Nodes"] is None
    else:
        assert result["NodeNames"] is None
        assert result["Nodes"]["items"][0] == node_list(["k-n1"])["items"][0]
    failed = result["FailedAndUnresolvableNodes"]
    assert set(failed) == {"k-n2", "k-n3", "k-n4", "other-1", "stranger"}
    assert failed["k-n2"] == WHY_SLURM and failed["k-n3"] == WHY_MOVING
    assert failed["k-n4"] == WHY_HELD
    assert failed["other-1"] == f"sunkd: not a node of pool {POOL}"
    assert "not a node of pool" in failed["stranger"]
    assert result["Error"] == ""


@pytest.mark.parametrize("node_cache_capable", [True, False])
async def test_filter_passes_other_pods_unchanged(
        client: TestClient[Any, Any], node_cache_capable: bool) -> None:
    args: dict[str, Any] = {"Pod": OTHER_POD}
    if node_cache_capable:
        args["NodeNames"] = POOL_NODES
    else:
        args["Nodes"] = node_list(POOL_NODES)
    result = await (await client.post("/scheduler/filter", json=args)).json()
    assert interpret_filter(args, result, node_cache_capable) == POOL_NODES
    assert result["FailedAndUnresolvableNodes"] == {} and result["FailedNodes"] == {}


async def test_field_names_are_case_insensitive(client: TestClient[Any, Any]) -> None:
    result = await (await client.post("/scheduler/filter", json={
        "pod": POOL_POD, "nodenames": ["k-n1", "k-n2"]})).json()
    assert result["NodeNames"] == ["k-n1"]


async def test_prioritize_prefers_long_lived_kubernetes_nodes(
        client: TestClient[Any, Any]) -> None:
    args = {"Pod": POOL_POD, "NodeNames": POOL_NODES}
    response = await client.post("/scheduler/prioritize", json=args)
    assert response.status == 200
    scores = {item["Host"]: item["Score"] for item in await response.json()}
    assert set(scores) == set(POOL_NODES)
    assert all(0 <= score <= 10 for score in scores.values())
    # No Slurm demand in the pool (+5); n1 has been Kubernetes' for 2h50m (+2), n5 35m.
    assert scores["k-n1"] == 7 and scores["k-n5"] == 5
    assert all(scores[name] == 0 for name in ("k-n2", "k-n3", "k-n4", "other-1", "stranger"))
    neutral = await (await client.post("/scheduler/prioritize", json={
        "Pod": OTHER_POD, "Nodes": node_list(["k-n1", "k-n2"])})).json()
    assert neutral == [{"Host": "k-n1", "Score": 0}, {"Host": "k-n2", "Score": 0}]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"NodeNames": ["a"]}', "Pod"),
    (b'{"Pod": {}, "NodeNames": "a"}', "list of strings"),
    (b'{"Pod": {}, "NodeNames": [1]}', "list of strings"),
    (b'{"Pod": {}}', "NodeNames"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}', "metadata.name"),
    (b'{"Pod": {}, "Nodes": {"items": {}}}', "items must be a list"),
    (b'{"Pod": {"metadata": {"labels": []}}, "NodeNames": []}', "labels"),
    (b"\xff\xfe", "not JSON"),
])
async def test_malformed_requests_get_400(client: TestClient[Any, Any], verb: str, body: bytes,
                                          message: str) -> None:
    response = await client.post(f"/scheduler/{verb}", data=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert message in (await response.json())["Error"]


async def test_body_limit_is_413(client: TestClient[Any, Any]) -> None:
    names = [f"node-{index:08d}" for index in range(700_000)]  # ~10 MiB of JSON
    body = json.dumps({"Pod": POOL_POD, "NodeNames": names}).encode()
    assert len(body) > 8 * 1024 * 1024
    response = await client.post("/scheduler/filter", data=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status == 413
    # Within both limits (bytes, and at most MAX_NODES names) still works.
    ok = json.dumps({"Pod": OTHER_POD, "NodeNames": names[:20_000]}).encode()
    assert len(ok) < 8 * 1024 * 1024
    response = await client.post("/scheduler/filter", data=ok,
                                 headers={"Content-Type": "application/json"})
    assert response.status == 200
    assert len((await response.json())["NodeNames"]) == 20_000


async def test_history_on_postgres(postgres_url: str) -> None:
    seeded = await seeded_view(postgres_url)
    try:
        async with TestClient(TestServer(build_app(seeded))) as test_client:
            body = await (await test_client.get("/api/v1/nodes/k-n2/history")).json()
        assert body["node"] == "n2"
        assert [(row["phase"], row["duration_s"]) for row in body["items"]][2:] == [
            ("SLURM", 3540.0), ("TO_K8S", 1200.0), ("KUBERNETES", 4200.0),
            ("TO_SLURM", 900.0), ("SLURM", None)]
        assert body["items"][3]["decided_by"] == "sunkd-a"
    finally:
        assert seeded.event_log is not None
        await seeded.event_log.close()


def test_kube_scheduler_config_registers_the_extender() -> None:
    """The shipped KubeSchedulerConfiguration points at our routes and passes the
    scheduler's validateExtenders rules (weight > 0 with prioritize, one binder, ...)."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "manifests/scheduler/kube-scheduler-config.yaml"
    config = yaml.safe_load(path.read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [
        "default-scheduler", "sunkd-scheduler"]
    (extender,) = config["extenders"]
    routes = {route.resource.canonical for route in build_app(  # type: ignore[union-attr]
        View(ClusterState(), None)).router.routes() if route.method == "POST"}
    prefix = extender["urlPrefix"].rstrip("/").split("8080", 1)[1]
    assert f"{prefix}/{extender['filterVerb']}" in routes
    assert f"{prefix}/{extender['prioritizeVerb']}" in routes
    assert extender["weight"] > 0 and extender["nodeCacheCapable"] is True
    assert "bindVerb" not in extender and "managedResources" not in extender
    assert extender["httpTimeout"] == "5s" and isinstance(extender["ignorable"], bool)
