"""KubernetesSource over HTTP, on both backends (the API emulator and the real
kube-apiserver; tests/integration/kube_backends.py): the observation events it emits, only
on change, seeded from earlier payloads; stale and fresh again when the API server fails
(injected 500s on the emulator, a proxy refusing connections on the real server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.events import (
    Event,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    OwnershipSpec,
    PendingPod,
    SourceHealth,
    Taint,
)
from sunkd.kubernetes.actuator import KubernetesActuator
from sunkd.kubernetes.client import NODES, PODS, KubeClient, ResourceType
from sunkd.kubernetes.source import KubernetesSource

from .kube_backends import Kube, proxied_client
from .kube_helpers import (
    ListSink,
    create_node,
    create_pod,
    duplicates,
    ensure_namespace,
    install_crd,
    mark_unschedulable,
    nodeset_body,
    set_pod_phase,
)


class Cluster:
    def __init__(self, kube: Kube, client: KubeClient, rt: ResourceType) -> None:
        self.kube = kube
        self.client = client
        self.rt = rt


@pytest.fixture
async def cluster(kube: Kube) -> AsyncIterator[Cluster]:
    client = kube.client
    rt = await install_crd(client)
    await ensure_namespace(client, "ml")
    await client.create(rt, nodeset_body(
        "ml", "gpu", node_selector={"pool": "gpu"}, workload_selector={"app": "serve"},
        partitions=["gpu"], node_name_label="slurm.example/name", group=rt.group,
        version=rt.version, ownership={"mode": "Auto", "minSlurm": 1}), "ml")
    await create_node(client, "k-gpu-1", {"pool": "gpu", "slurm.example/name": "gpu1"},
                      cpu="16", memory="64Gi", gpus="4")
    await create_node(client, "k-gpu-2", {"pool": "gpu"}, ready=False)
    await create_node(client, "k-cpu-1", {"pool": "cpu",
                                          "sunkd.io/slurm-node-name": "cpu1"})
    await create_pod(client, "ml", "serve-a", {"app": "serve"}, node="k-gpu-1",
                     phase="Running")
    await create_pod(client, "ml", "other", {"app": "other"}, node="k-gpu-1",
                     phase="Running")
    await create_pod(client, "ml", "serve-pending", {"app": "serve"}, cpu="2",
                     memory="4Gi")
    await mark_unschedulable(client, "ml", "serve-pending")
    yield Cluster(kube, client, rt)


def pods(workload: K8sWorkloadObserved) -> tuple[tuple[str, str, bool], ...]:
    assert all(ref.namespace == "ml" for ref in workload.pods)
    return tuple((ref.name, ref.phase, ref.pool_pod) for ref in workload.pods)


async def start(cluster: Cluster, sink: ListSink, **kwargs: Any) -> tuple[
    KubernetesSource, asyncio.Event, asyncio.Task[None]
]:
    source = KubernetesSource(cluster.client, sink, nodeset_resource=cluster.rt, **kwargs)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    await source.wait_synced(10)
    await source.wait_idle(10)
    return source, stop, task


async def stop_source(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 10)


async def settle(source: KubernetesSource) -> None:
    """Give the watches a moment to deliver what the API already has, then drain."""
    await asyncio.sleep(0.3)
    await source.wait_idle(10)


async def test_initial_observations(cluster: Cluster) -> None:
    sink = ListSink()
    _source, stop, task = await start(cluster, sink)
    try:
        nodes = {p.node: p for p in sink.payloads(K8sNodeObserved)
                 if isinstance(p, K8sNodeObserved)}
        assert set(nodes) == {"k-gpu-1", "k-gpu-2", "k-cpu-1"}
        gpu1 = nodes["k-gpu-1"]
        assert gpu1.slurm_node == "gpu1"  # the Nodeset's slurm.nodeNameLabel
        assert gpu1.ready is True and gpu1.unschedulable is False
        assert (gpu1.cpu_millis, gpu1.memory_bytes, gpu1.gpus) == (16000, 64 * 2**30, 4)
        assert Label("pool", "gpu") in gpu1.labels
        assert nodes["k-gpu-2"].ready is False and nodes["k-gpu-2"].slurm_node == "k-gpu-2"
        assert nodes["k-cpu-1"].slurm_node == "cpu1"  # sunkd.io/slurm-node-name

        # Every non-DaemonSet pod on every Node (in a pool or not), with its uid; pool_pod
        # marks the pods of the Nodeset that selects the Node.
        workloads = sorted((p.node, p.pool, pods(p)) for p in sink.payloads(K8sWorkloadObserved)
                           if isinstance(p, K8sWorkloadObserved))
        assert workloads == [
            ("k-cpu-1", "", ()),
            ("k-gpu-1", "", (("other", "Running", False), ("serve-a", "Running", True))),
            ("k-gpu-2", "", ())]
        assert all(ref.uid for p in sink.payloads(K8sWorkloadObserved)
                   if isinstance(p, K8sWorkloadObserved) for ref in p.pods)
        assert sink.payloads(K8sDemandObserved) == [K8sDemandObserved(
            pool="ml/gpu", pending=(PendingPod("ml", "serve-pending", 2000, 4 * 2**30, 0),))]
        nodesets = sink.payloads(K8sNodesetObserved)
        assert len(nodesets) == 1
        assert isinstance(nodesets[0], K8sNodesetObserved)
        assert nodesets[0].ownership == OwnershipSpec(min_slurm=1)
        assert nodesets[0].partitions == ("gpu",)
        assert sink.payloads(SourceHealth) == [SourceHealth(source="kubernetes", status="fresh")]
        subjects = {e.subject for e in sink.events}
        assert {"k-gpu-1", "ml/gpu", "kubernetes"} <= subjects
    finally:
        await stop_source(stop, task)


async def test_gres_expectation_only_when_checked(cluster: Cluster) -> None:
    """With a GPU type map (`[gres] check`) each Node says what GRES Slurm must report;
    without one nothing is expected (the check is off)."""
    for type_map, wanted in (({}, {"k-gpu-1": "gpu:4", "k-cpu-1": ""}),
                             (None, {"k-gpu-1": None, "k-cpu-1": None})):
        sink = ListSink()
        _source, stop, task = await start(cluster, sink, gres_type_map=type_map)
        try:
            nodes = {p.node: p.gres for p in sink.payloads(K8sNodeObserved)
                     if isinstance(p, K8sNodeObserved)}
            assert {k: nodes[k] for k in wanted} == wanted
        finally:
            await stop_source(stop, task)


async def test_changes_emit_once(cluster: Cluster) -> None:
    sink = ListSink()
    source, stop, task = await start(cluster, sink)
    client = cluster.client
    try:
        before = len(sink.events)
        # A kubelet heartbeat bumps the resourceVersion but changes nothing we observe.
        await client.merge_patch(NODES, "k-gpu-1", {"status": {"conditions": [
            {"type": "Ready", "status": "True", "lastHeartbeatTime": "2030-01-01T00:00:00Z"}]}},
            subresource="status")
        await settle(source)
        assert len(sink.events) == before

        actuator = KubernetesActuator(client)
        await actuator.lock("k-gpu-1")
        await actuator.hold("k-gpu-2", "test")
        await settle(source)
        nodes = {p.node: p for p in sink.payloads(K8sNodeObserved)
                 if isinstance(p, K8sNodeObserved)}
        assert Taint("sunkd.io/owner", "NoSchedule", "slurm") in nodes["k-gpu-1"].taints
        assert Label("sunkd.io/owner", "slurm") in nodes["k-gpu-1"].labels
        assert not nodes["k-gpu-2"].unschedulable and nodes["k-gpu-2"].held_by_sunkd
        assert Taint("sunkd.io/slurm-hold", "NoSchedule", "slurm") in nodes["k-gpu-2"].taints

        # The pending pod gets scheduled: demand empties, workload grows.
        await client.delete(PODS, "serve-pending", "ml", grace_period_seconds=0)
        await create_pod(client, "ml", "serve-b", {"app": "serve"}, node="k-gpu-2",
                         phase="Running")
        await settle(source)
        assert sink.payloads(K8sDemandObserved)[-1] == K8sDemandObserved(pool="ml/gpu")
        last_workload = [p for p in sink.payloads(K8sWorkloadObserved)
                         if isinstance(p, K8sWorkloadObserved) and p.node == "k-gpu-2"][-1]
        assert pods(last_workload) == (("serve-b", "Running", True),)

        await set_pod_phase(client, "ml", "serve-a", "Succeeded")
        await client.delete(NODES, "k-cpu-1")
        await settle(source)
        assert K8sNodeVanished(node="k-cpu-1") in sink.payloads(K8sNodeVanished)
        # Reported gone, it is forgotten by the source too (bounded caches).
        assert not [p for p in source.last_payloads() if getattr(p, "node", "") == "k-cpu-1"]
        gpu1 = [p for p in sink.payloads(K8sWorkloadObserved)
                if isinstance(p, K8sWorkloadObserved) and p.node == "k-gpu-1"][-1]
        assert pods(gpu1) == (("other", "Running", False), ("serve-a", "Succeeded", True))

        await client.delete(cluster.rt, "gpu", "ml")
        await settle(source)
        last_nodeset = sink.payloads(K8sNodesetObserved)[-1]
        assert isinstance(last_nodeset, K8sNodesetObserved) and last_nodeset.deleted
        assert duplicates(sink.payloads()) == []
    finally:
        await stop_source(stop, task)


class GatedSink(ListSink):
    """A sink whose appends wait for `gate`, as on a slow commit; `waiting` is set while
    one waits."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def __call__(self, batch: Sequence[Event]) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        await super().__call__(batch)


async def test_changes_arriving_during_an_append_share_the_next_one(cluster: Cluster) -> None:
    sink = GatedSink()
    _source, stop, task = await start(cluster, sink)
    try:
        before = sink.batches
        sink.gate.clear()
        await create_node(cluster.client, "k-gpu-b00", {"pool": "gpu"})
        await asyncio.wait_for(sink.waiting.wait(), 10)  # its append is under way
        names = [f"k-gpu-b{i:02d}" for i in range(1, 20)]
        await asyncio.gather(*(create_node(cluster.client, name, {"pool": "gpu"})
                               for name in names))
        await asyncio.sleep(0.5)  # their watch events reach the source meanwhile
        sink.gate.set()
        await sink.wait_for(lambda s: {p.node for p in s.payloads(K8sNodeObserved)
                                       if isinstance(p, K8sNodeObserved)} >= set(names), 30)
        # One append per Node before the source's `_flusher` (20 here); now the first
        # Node's, then one (or a few) for the 19 that came while it waited.
        assert sink.batches - before <= 5, sink.batches - before
        assert duplicates(sink.payloads()) == []
    finally:
        sink.gate.set()
        await stop_source(stop, task)


async def test_a_nodeset_status_write_rebuilds_nothing(cluster: Cluster) -> None:
    """sunkd writes every Nodeset's status every few seconds. Each write is a MODIFIED
    event on the Nodeset watch; rebuilding every node's payloads for it cost ~1 s of the
    event loop per write at 10,000 nodes (bench/scale.py). Only a change of what the
    payloads read (spec, generation) may rebuild them."""
    sink = ListSink()
    source, stop, task = await start(cluster, sink)
    client = cluster.client
    try:
        rebuilt = source.full_flushes
        actuator = KubernetesActuator(client, nodeset_resource=cluster.rt)
        for count in range(3):
            await actuator.update_nodeset_status("ml", "gpu", {"observedGeneration": count})
        await settle(source)
        assert source.full_flushes == rebuilt
        assert (await client.get(cluster.rt, "gpu", "ml"))["status"]["observedGeneration"] == 2

        await client.merge_patch(cluster.rt, "gpu", {"spec": {"workloadSelector": {
            "matchLabels": {"app": "other"}}}}, "ml")
        await settle(source)
        assert source.full_flushes == rebuilt + 1
        gpu1 = [p for p in sink.payloads(K8sWorkloadObserved)
                if isinstance(p, K8sWorkloadObserved) and p.node == "k-gpu-1"][-1]
        assert pods(gpu1) == (("other", "Running", True), ("serve-a", "Running", False))
    finally:
        await stop_source(stop, task)


async def test_restart_with_seed_emits_nothing_new(cluster: Cluster) -> None:
    first = ListSink()
    source, stop, task = await start(cluster, first)
    seed = source.last_payloads()
    await stop_source(stop, task)

    second = ListSink()
    source2, stop2, task2 = await start(cluster, second, previous=seed)
    try:
        assert second.events == []
        # ...but what changed while we were away is reported, including vanished nodes.
        await stop_source(stop2, task2)
        await cluster.client.delete(NODES, "k-gpu-2")
        await create_node(cluster.client, "k-gpu-3", {"pool": "gpu"})
        third = ListSink()
        _, stop3, task3 = await start(cluster, third, previous=source2.last_payloads())
        try:
            kinds = {(type(e.payload).__name__, e.subject) for e in third.events}
            assert ("K8sNodeVanished", "k-gpu-2") in kinds
            assert ("K8sNodeObserved", "k-gpu-3") in kinds
            assert all(e.subject in ("k-gpu-2", "k-gpu-3") for e in third.events)
        finally:
            await stop_source(stop3, task3)
    finally:
        if not task2.done():
            await stop_source(stop2, task2)


async def test_health_goes_stale_then_fresh(cluster: Cluster, tmp_path: Path) -> None:
    """The API server fails for a while: the source goes stale, then fresh again. On the
    emulator, 500s on the next requests; on the real server, a proxy in front of it cuts
    every connection and refuses new ones for a second."""
    sink = ListSink()
    if cluster.kube.emulator is not None:
        _source, stop, task = await start(cluster, sink)
        try:
            cluster.kube.emulator.fail_next(6, 500)
            cluster.kube.emulator.drop_watches()
            await sink.wait_for(lambda s: any(
                isinstance(p, SourceHealth) and p.status == "stale" for p in s.payloads()), 15)
            await sink.wait_for(lambda s: s.payloads(SourceHealth)[-1].status == "fresh", 15)
        finally:
            await stop_source(stop, task)
        expected_cause = "server_error"
    else:
        async with proxied_client(cluster.kube, tmp_path) as (proxy, client):
            source = KubernetesSource(client, sink, nodeset_resource=cluster.rt)
            for lw in source.watches.values():
                lw.backoff.initial, lw.backoff.maximum = 0.05, 0.2
            stop = asyncio.Event()
            task = asyncio.create_task(source.run(stop))
            try:
                await source.wait_synced(10)
                await source.wait_idle(10)
                assert proxy.cut(refuse=True) >= 3  # the three watches (and more)
                await sink.wait_for(lambda s: any(
                    isinstance(p, SourceHealth) and p.status == "stale"
                    for p in s.payloads()), 15)
                proxy.resume()
                await sink.wait_for(
                    lambda s: s.payloads(SourceHealth)[-1].status == "fresh", 15)
            finally:
                await stop_source(stop, task)
        expected_cause = "connection"
    stale = [p for p in sink.payloads(SourceHealth)
             if isinstance(p, SourceHealth) and p.status == "stale"]
    assert stale[0].cause == expected_cause


async def test_unreachable_api_goes_lost() -> None:
    client = KubeClient.for_url("http://127.0.0.1:9")  # discard port: connection refused
    sink = ListSink()
    source = KubernetesSource(client, sink, lost_after=0.5)
    for lw in source.watches.values():
        lw.backoff.initial, lw.backoff.maximum = 0.02, 0.1
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await sink.wait_for(lambda s: any(
            isinstance(p, SourceHealth) and p.status == "lost" for p in s.payloads()), 10)
        statuses = [p.status for p in sink.payloads(SourceHealth)
                    if isinstance(p, SourceHealth)]
        assert statuses == ["stale", "lost"]
        assert {p.cause for p in sink.payloads(SourceHealth)
                if isinstance(p, SourceHealth)} == {"connection"}
        assert not any(isinstance(p, K8sNodeObserved) for p in sink.payloads())
    finally:
        await stop_source(stop, task)
        await client.close()
