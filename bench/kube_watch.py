"""Kubernetes watch benchmark: how fast a cluster change becomes a sunkd observation, and what
a full relist costs, at 5,000 nodes and 50,000 pods, in the API emulator and in the real
kube-apiserver (sunkd_testbed.kubernetes; built by scripts/build-kubernetes.sh), in one run.

Why: sunkd's decisions are only as fresh as its view of the cluster. After a 410 (or a
restart) the source relists everything; that must stay a bounded, cheap operation at the scale
of a big cluster, and a single change must reach the event sink quickly.

Figures, per backend, each against a same-run baseline on the same server so they compare
across machines:
- latency: from a write (a Node label or a Pod phase) to the observation event reaching the
  sink (p50/p99), against a raw aiohttp watch on the same server seeing the same kind of
  write (time to the line arriving, parsed). On the emulator the write is in-process; on the
  real server it is an HTTP PATCH, in both the measurement and the baseline;
- relist: a full paged LIST of all pods through `ListWatch` (JSON decode, slimming, cache
  diff), against raw aiohttp GETs of the same pages + `json.loads`;
- initial sync: source start to `wait_synced` (lists of nodes, pods and Nodesets and the
  payloads for every node and pool), informational.

The real server runs without scheduler and with only the serviceaccount and namespace
controllers (the pods need their ServiceAccount; nothing else should compete for the two
cores), etcd without fsync. Pages: 5,000 on the emulator (it builds each page by scanning
the whole collection), 500 on the real server (client-go's and sunkd's default).

`--quick` runs 1,000 nodes and 10,000 pods (the output says so). `--backend emulator|real|both`
(default both; `real` needs the built binaries). The last line of output is one JSON object;
real-server figures carry the prefix `real_`.

Usage: python bench/kube_watch.py [--quick] [--backend both] [--nodes N] [--pods N] [--changes N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sunkd.domain.events import Event
from sunkd.kubernetes.client import NODES, PODS, KubeApiError, KubeClient, ResourceType, nodesets
from sunkd.kubernetes.listwatch import ListWatch, Relisted
from sunkd.kubernetes.normalize import pod_version, slim_pod
from sunkd.kubernetes.source import KubernetesSource
from sunkd.kubernetes.wire import gc_paused
from sunkd_testbed.kubeapi import KubeAPIEmulator
from sunkd_testbed.kubernetes import KubeControlPlane

CRD = Path(__file__).resolve().parent.parent / "manifests" / "crds" / "nodeset.yaml"
# LIST page size. The emulator used to build every page by scanning and sorting the whole
# collection (O(N) per page: 29 s for 50k pods at 500, 7 s at 5,000 here); it now sorts once
# per list version and starts each page by bisection, but still copies the collection per
# page (store only: 15.6 s -> 3.4 s for 50k pods at 500), which would make the emulator, not
# sunkd, the subject of the benchmark. A real API server serves
# pages from etcd or its watch cache. Override with --page.
PAGE = 5000
REAL_PAGE = 500  # the real server: client-go's and sunkd's default page


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class TimedSink:
    """Records when each subject's latest event arrived (time.perf_counter)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.events = 0
        self.waiters: dict[str, asyncio.Future[float]] = {}

    async def __call__(self, batch: Sequence[Event]) -> None:
        now = time.perf_counter()
        self.events += len(batch)
        for event in batch:
            self.arrived[event.subject] = now
            waiter = self.waiters.pop(event.subject, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(now)

    def expect(self, subject: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters[subject] = future
        return future


def crd_object() -> dict[str, Any]:
    with CRD.open() as handle:
        crd: dict[str, Any] = next(d for d in yaml.safe_load_all(handle) if d)
    return crd


def nodeset_objects(crd: dict[str, Any]) -> list[dict[str, Any]]:
    group = crd["spec"]["group"]
    version = crd["spec"]["versions"][0]["name"]
    return [{
        "apiVersion": f"{group}/{version}", "kind": "Nodeset",
        "metadata": {"name": f"pool{p}", "namespace": "ml"},
        "spec": {"nodeSelector": {"pool": f"p{p}"},
                 "workloadSelector": {"matchLabels": {"pool": f"p{p}"}},
                 "slurm": {"partitions": [f"part{p}"]}},
    } for p in range(10)]


def node_object(n: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"node{n:05d}", "labels": {
            "pool": f"p{n % 10}", "kubernetes.io/hostname": f"node{n:05d}",
            "topology.kubernetes.io/zone": f"zone-{n % 3}"}},
        "spec": {"podCIDR": f"10.{n // 250}.{n % 250}.0/24"},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8",
                            "pods": "110", "ephemeral-storage": "900Gi"},
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8",
                         "pods": "110", "ephemeral-storage": "1Ti"},
            "conditions": [
                {"type": t, "status": "False" if t != "Ready" else "True",
                 "reason": "KubeletReady", "message": "ok",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
            "nodeInfo": {"kubeletVersion": "v1.32.4", "osImage": "Debian 12",
                         "containerRuntimeVersion": "containerd://1.7"},
            "addresses": [{"type": "InternalIP", "address": f"10.0.{n // 250}.{n % 250}"}],
        },
    }


def pod_object(i: int, nodes: int) -> dict[str, Any]:
    node = i % nodes
    pending = i % 100 == 0
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                      "limits": {"cpu": "1", "memory": "2Gi"}},
                        "env": [{"name": "MODE", "value": "serve"}]}],
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}],
    }
    if not pending:
        spec["nodeName"] = f"node{node:05d}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"pod{i:06d}", "namespace": "ml",
                     "labels": {"pool": f"p{node % 10}", "app": "serve"}},
        "spec": spec,
        "status": {"phase": "Pending" if pending else "Running",
                   "conditions": [{"type": "PodScheduled",
                                   "status": "False" if pending else "True"}]},
    }


def populate(api: KubeAPIEmulator, nodes: int, pods: int) -> None:
    crd = crd_object()
    api.create(crd)
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    for nodeset in nodeset_objects(crd):
        api.create(nodeset, "ml")
    for n in range(nodes):
        api.create(node_object(n))
    for i in range(pods):
        api.create(pod_object(i, nodes), "ml")


class EmulatorTarget:
    """The in-process API emulator; writes are in-process (no HTTP in the write path)."""

    name = "emulator"

    def __init__(self, changes: int, page: int) -> None:
        self.api = KubeAPIEmulator(history_size=max(1000, changes * 4))
        self.page = page
        self.url = ""

    async def start(self) -> None:
        await self.api.start("127.0.0.1")
        self.url = self.api.url

    async def stop(self) -> None:
        await self.api.stop()

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    async def client(self) -> KubeClient:
        return KubeClient.for_url(self.url)

    async def populate(self, nodes: int, pods: int) -> None:
        populate(self.api, nodes, pods)
        self.api.record_requests = False

    async def label_node(self, name: str, key: str, value: str) -> None:
        self.api.patch("nodes", name, {"metadata": {"labels": {key: value}}})

    async def pod_phase(self, name: str, phase: str) -> None:
        self.api.patch("pods", name, {"status": {"phase": phase}}, "ml", subresource="status")


class RealTarget:
    """kube-apiserver and etcd (sunkd_testbed.kubernetes); writes are HTTP PATCHes."""

    name = "real"
    CRDS = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                        "CustomResourceDefinition", namespaced=False)
    NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
    SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True)

    def __init__(self, page: int) -> None:
        self.plane = KubeControlPlane(
            scheduler=False, controllers="serviceaccount,serviceaccount-token,namespace")
        self.page = page
        self.url = ""
        self.admin: KubeClient | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self.plane.start)
        self.url = self.plane.url
        self.admin = await KubeClient.connect(str(self.plane.kubeconfig))
        print(f"real control plane up in {self.plane.startup_seconds} s", file=sys.stderr)

    async def stop(self) -> None:
        if self.admin is not None:
            await self.admin.close()
        await asyncio.to_thread(self.plane.stop)

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.plane.ssl_context(), limit=64))

    async def client(self) -> KubeClient:
        return await KubeClient.connect(str(self.plane.kubeconfig))

    async def populate(self, nodes: int, pods: int) -> None:
        admin = self.admin
        assert admin is not None
        crd = crd_object()
        await admin.create(self.CRDS, crd)
        await admin.create(self.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": "ml"}})
        rt = nodesets(crd["spec"]["group"], crd["spec"]["versions"][0]["name"])
        deadline = time.monotonic() + 60
        while True:  # the CRD established and the namespace's ServiceAccount made
            try:
                await admin.list(rt, namespace="ml")
                await admin.get(self.SERVICE_ACCOUNTS, "default", "ml")
                break
            except KubeApiError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        for nodeset in nodeset_objects(crd):
            await admin.create(rt, nodeset, "ml")
        gate = asyncio.Semaphore(32)

        async def create(resource: ResourceType, body: dict[str, Any],
                         namespace: str | None = None) -> None:
            async with gate:
                await admin.create(resource, body, namespace)

        # Nodes keep the status they are created with; pods get Pending (no kubelet).
        await asyncio.gather(*(create(NODES, node_object(n)) for n in range(nodes)))
        await asyncio.gather(*(create(PODS, pod_object(i, nodes), "ml") for i in range(pods)))

    async def label_node(self, name: str, key: str, value: str) -> None:
        assert self.admin is not None
        await self.admin.merge_patch(NODES, name, {"metadata": {"labels": {key: value}}})

    async def pod_phase(self, name: str, phase: str) -> None:
        assert self.admin is not None
        await self.admin.merge_patch(PODS, name, {"status": {"phase": phase}}, "ml",
                                     subresource="status")


Target = EmulatorTarget | RealTarget


async def raw_list(target: Target) -> tuple[float, int]:
    """Baseline: the same paged LIST with plain aiohttp + json.loads."""
    started = time.perf_counter()
    count = 0
    async with target.session() as session:
        token = ""
        while True:
            params = {"limit": str(target.page)}
            if token:
                params["continue"] = token
            async with session.get(f"{target.url}/api/v1/pods", params=params) as response:
                page = json.loads(await response.read())
            count += len(page["items"])
            token = page["metadata"].get("continue") or ""
            if not token:
                break
    return time.perf_counter() - started, count


async def client_side_relist(client: KubeClient, target: Target) -> tuple[float, float]:
    """The client's own cost, without the server: the same page bytes decoded with
    json.loads alone vs. decoded, slimmed and diffed against a warm cache by ListWatch."""
    pages: list[bytes] = []
    async with target.session() as session:
        token = ""
        while True:
            params = {"limit": str(target.page)}
            if token:
                params["continue"] = token
            async with session.get(f"{target.url}/api/v1/pods", params=params) as response:
                raw = await response.read()
            pages.append(raw)
            token = json.loads(raw)["metadata"].get("continue") or ""
            if not token:
                break
    best_raw = best_ours = float("inf")
    lw = ListWatch(client, PODS, page_size=target.page, transform=slim_pod,
                   version=pod_version)
    warm: list[Any] = []
    for raw in pages:
        warm.extend(map(lw._admit, json.loads(raw)["items"]))
    lw._reconcile(warm, "1", True)
    del warm
    for _ in range(3):
        started = time.perf_counter()
        with gc_paused():  # same GC treatment as ours: the ratio is the extra work only
            for raw in pages:
                json.loads(raw)
        best_raw = min(best_raw, time.perf_counter() - started)
        started = time.perf_counter()
        items: list[Any] = []
        for raw in pages:
            with gc_paused():  # as KubeClient.list decodes each page
                page_items = json.loads(raw)["items"]
            items.extend(map(lw._admit, page_items))  # as ListWatch slims each page
        lw._reconcile(items, "2", False)
        best_ours = min(best_ours, time.perf_counter() - started)
        del items
    return best_ours, best_raw


async def sunkd_relist(client: KubeClient, page: int) -> tuple[float, int]:
    lw = ListWatch(client, PODS, page_size=page, transform=slim_pod, version=pod_version)
    # Warm cache (as after a first sync), so the relist also pays for the diff.
    items, rv = await client.list_mapped(PODS, lw._admit, page_size=page)
    lw._reconcile(items, rv, True)
    del items
    started = time.perf_counter()
    items, rv = await client.list_mapped(PODS, lw._admit, page_size=page)
    relisted: Relisted = lw._reconcile(items, rv, False)
    return time.perf_counter() - started, relisted.objects


async def raw_watch_latency(target: Target, changes: int, nodes: int) -> list[float]:
    """Baseline: a plain aiohttp watch on nodes; time from the write to the parsed line."""
    latencies: list[float] = []
    async with target.session() as session:
        async with session.get(f"{target.url}/api/v1/nodes", params={"limit": "1"}) as listed:
            rv = json.loads(await listed.read())["metadata"]["resourceVersion"]
        async with session.get(
            f"{target.url}/api/v1/nodes",
            params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300"},
        ) as response:
            for i in range(changes):
                name = f"node{(i * 7) % nodes:05d}"
                started = time.perf_counter()
                await target.label_node(name, "bench/raw", str(i))
                while True:
                    line = await response.content.readline()
                    event = json.loads(line)
                    if event["type"] == "MODIFIED" and \
                            event["object"]["metadata"]["name"] == name:
                        break
                latencies.append(time.perf_counter() - started)
    return latencies


async def sunkd_latency(target: Target, sink: TimedSink, changes: int,
                        nodes: int, pods: int) -> list[float]:
    latencies: list[float] = []
    finished: set[int] = set()
    for i in range(changes):
        if i % 2 == 0:
            name = f"node{(i * 13) % nodes:05d}"
            future = sink.expect(name)
            started = time.perf_counter()
            # A sunkd.io/ label is part of the node observation: one change, one event.
            await target.label_node(name, "sunkd.io/bench", str(i))
        else:
            pod = (i * 31) % pods
            if pod % 100 == 0:
                pod += 1  # a pod bound to a node
            node = f"node{pod % nodes:05d}"
            future = sink.expect(node)
            started = time.perf_counter()
            phase = "Running" if pod in finished else "Succeeded"
            finished.symmetric_difference_update({pod})
            await target.pod_phase(f"pod{pod:06d}", phase)
        arrived = await asyncio.wait_for(future, 10)
        latencies.append(arrived - started)
    return latencies


async def run(target: Target, nodes: int, pods: int, changes: int,
              rounds: int) -> dict[str, Any]:
    await target.start()
    try:
        t0 = time.perf_counter()
        await target.populate(nodes, pods)
        populate_s = time.perf_counter() - t0
        print(f"{target.name}: populated in {populate_s:.1f}s", file=sys.stderr)
        client = await target.client()
        try:
            gc.collect()
            # Relist cost against the raw baseline (best of `rounds` each, interleaved).
            raw_times, ours_times = [], []
            for _ in range(rounds):
                raw_s, raw_count = await raw_list(target)
                ours_s, ours_count = await sunkd_relist(client, target.page)
                assert raw_count == ours_count == pods, (raw_count, ours_count, pods)
                raw_times.append(raw_s)
                ours_times.append(ours_s)
            relist_raw = min(raw_times)
            relist_sunkd = min(ours_times)
            client_ours, client_raw = await client_side_relist(client, target)

            sink = TimedSink()
            crd = crd_object()
            rt = nodesets(crd["spec"]["group"], crd["spec"]["versions"][0]["name"])
            source = KubernetesSource(client, sink, nodeset_resource=rt, page_size=target.page)
            stop = asyncio.Event()
            started = time.perf_counter()
            task = asyncio.create_task(source.run(stop))
            await source.wait_synced(600)
            sync_s = time.perf_counter() - started
            print(f"{target.name}: initial sync {sync_s:.2f}s", file=sys.stderr)
            initial_events = sink.events
            try:
                await source.wait_idle(60)
                ours = await sunkd_latency(target, sink, changes, nodes, pods)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
            raw = await raw_watch_latency(target, changes, nodes)
        finally:
            await client.close()
    finally:
        await target.stop()
    return {
        "nodes": nodes,
        "pods": pods,
        "changes": changes,
        "page_size": target.page,
        "populate_s": round(populate_s, 2),
        "initial_sync_s": round(sync_s, 3),
        "initial_events": initial_events,
        "relist_pods_s": round(relist_sunkd, 3),
        "relist_pods_raw_s": round(relist_raw, 3),
        "relist_ratio": round(relist_sunkd / relist_raw, 2),
        "relist_client_s": round(client_ours, 3),
        "relist_client_json_only_s": round(client_raw, 3),
        "relist_client_ratio": round(client_ours / client_raw, 2),
        "latency_p50_ms": round(statistics.median(ours) * 1000, 2),
        "latency_p99_ms": round(percentile(ours, 0.99) * 1000, 2),
        "raw_latency_p50_ms": round(statistics.median(raw) * 1000, 2),
        "raw_latency_p99_ms": round(percentile(raw, 0.99) * 1000, 2),
        "latency_ratio_p50": round(statistics.median(ours) / statistics.median(raw), 2),
    }


def targets_for(figures: dict[str, Any], prefix: str) -> dict[str, Any]:
    def figure(name: str) -> Any:
        return figures[prefix + name]

    return {
        # sunkd's relist (paged, decoded, slimmed, diffed) within 3x of LIST + json.loads.
        prefix + "relist_ratio": {"value": figure("relist_ratio"), "target": 3.0,
                                  "better": "lower"},
        # Client-side only (no server in the timing): decode + slim + diff vs json.loads.
        prefix + "relist_client_ratio": {"value": figure("relist_client_ratio"),
                                         "target": 3.0, "better": "lower"},
        # A change reaches the sink within 10x of a bare watch seeing it (and under 50 ms).
        prefix + "latency_ratio_p50": {"value": figure("latency_ratio_p50"), "target": 10.0,
                                       "better": "lower"},
        prefix + "latency_p99_ms": {"value": figure("latency_p99_ms"), "target": 50.0,
                                    "better": "lower"},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes / 10,000 pods")
    parser.add_argument("--backend", choices=("emulator", "real", "both"), default="both",
                        help="the API emulator, the real kube-apiserver, or both (default)")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--changes", type=int, default=None)
    parser.add_argument("--page", type=int, default=PAGE, help="LIST page size (emulator)")
    parser.add_argument("--real-page", type=int, default=REAL_PAGE,
                        help="LIST page size (real server)")
    parser.add_argument("--rounds", type=int, default=2, help="server-inclusive relist rounds")
    args = parser.parse_args(argv)
    nodes = args.nodes or (1_000 if args.quick else 5_000)
    pods = args.pods or (10_000 if args.quick else 50_000)
    changes = args.changes or (100 if args.quick else 400)
    if args.quick:
        print(f"--quick: scaled down to {nodes} nodes and {pods} pods "
              "(full run: 5,000 nodes, 50,000 pods)")
    backends = ["emulator", "real"] if args.backend == "both" else [args.backend]
    figures: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for backend in backends:
        target: Target = (EmulatorTarget(changes, args.page) if backend == "emulator"
                          else RealTarget(args.real_page))
        prefix = "" if backend == "emulator" else "real_"
        measured = asyncio.run(run(target, nodes, pods, changes, args.rounds))
        figures.update({prefix + key: value for key, value in measured.items()})
        targets.update(targets_for(figures, prefix))
    for key, value in figures.items():
        print(f"{key:>27}: {value}")
    print(json.dumps({"benchmark": "kube_watch", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
