"""Kubernetes watch benchmark: how fast a cluster change becomes a sunkd observation, and what
a full relist costs, at 5,000 nodes and 50,000 pods in the API emulator.

Why: sunkd's decisions are only as fresh as its view of the cluster. After a 410 (or a
restart) the source relists everything; that must stay a bounded, cheap operation at the scale
of a big cluster, and a single change must reach the event sink quickly.

Figures, each against a same-run baseline so they compare across machines:
- latency: from a write in the emulator (a Node label or a Pod phase) to the observation event
  reaching the sink (p50/p99), against a raw aiohttp watch on the same emulator seeing the same
  write (time to the line arriving, parsed);
- relist: a full paged LIST of all pods through `ListWatch` (JSON decode, slimming, cache
  diff), against raw aiohttp GETs of the same pages + `json.loads`;
- initial sync: source start to `wait_synced` (lists of nodes, pods and Nodesets and the
  payloads for every node and pool), informational.

`--quick` runs 1,000 nodes and 10,000 pods (the output says so). The last line of output is
one JSON object.

Usage: python bench/kube_watch.py [--quick] [--nodes N] [--pods N] [--changes N]
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
from sunkd.kubernetes.client import PODS, KubeClient, gc_paused, nodesets
from sunkd.kubernetes.listwatch import ListWatch, Relisted
from sunkd.kubernetes.normalize import slim_pod
from sunkd.kubernetes.source import KubernetesSource
from sunkd.testbed.kubeapi import KubeAPIEmulator

CRD = Path(__file__).resolve().parent.parent / "manifests" / "crds" / "nodeset.yaml"
# LIST page size. The emulator builds every page by scanning and sorting the whole collection
# (O(N) per page, so O(N^2/PAGE) per LIST: 29 s for 50k pods at 500, 7 s at 5,000 here), which
# would make the emulator, not sunkd, the subject of the benchmark. A real API server serves
# pages from etcd or its watch cache. Override with --page.
PAGE = 5000


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


def populate(api: KubeAPIEmulator, nodes: int, pods: int) -> None:
    with CRD.open() as handle:
        crd = next(d for d in yaml.safe_load_all(handle) if d)
    api.create(crd)
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    group = crd["spec"]["group"]
    version = crd["spec"]["versions"][0]["name"]
    for p in range(10):
        api.create({
            "apiVersion": f"{group}/{version}", "kind": "Nodeset",
            "metadata": {"name": f"pool{p}", "namespace": "ml"},
            "spec": {"nodeSelector": {"pool": f"p{p}"},
                     "workloadSelector": {"matchLabels": {"pool": f"p{p}"}},
                     "slurm": {"partitions": [f"part{p}"]}},
        }, "ml")
    for n in range(nodes):
        api.create({
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
        })
    for i in range(pods):
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
        api.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pod{i:06d}", "namespace": "ml",
                         "labels": {"pool": f"p{node % 10}", "app": "serve"}},
            "spec": spec,
            "status": {"phase": "Pending" if pending else "Running",
                       "conditions": [{"type": "PodScheduled",
                                       "status": "False" if pending else "True"}]},
        }, "ml")


async def raw_list(url: str) -> tuple[float, int]:
    """Baseline: the same paged LIST with plain aiohttp + json.loads."""
    started = time.perf_counter()
    count = 0
    async with aiohttp.ClientSession() as session:
        token = ""
        while True:
            params = {"limit": str(PAGE)}
            if token:
                params["continue"] = token
            async with session.get(f"{url}/api/v1/pods", params=params) as response:
                page = json.loads(await response.read())
            count += len(page["items"])
            token = page["metadata"].get("continue") or ""
            if not token:
                break
    return time.perf_counter() - started, count


async def client_side_relist(client: KubeClient, url: str) -> tuple[float, float]:
    """The client's own cost, without the (in-process) server: the same page bytes decoded
    with json.loads alone vs. decoded, slimmed and diffed against a warm cache by ListWatch."""
    pages: list[bytes] = []
    async with aiohttp.ClientSession() as session:
        token = ""
        while True:
            params = {"limit": str(PAGE)}
            if token:
                params["continue"] = token
            async with session.get(f"{url}/api/v1/pods", params=params) as response:
                raw = await response.read()
            pages.append(raw)
            token = json.loads(raw)["metadata"].get("continue") or ""
            if not token:
                break
    best_raw = best_ours = float("inf")
    lw = ListWatch(client, PODS, page_size=PAGE, transform=slim_pod)
    warm: list[Any] = []
    for raw in pages:
        warm.extend(json.loads(raw)["items"])
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
                items.extend(json.loads(raw)["items"])
        lw._reconcile(items, "2", False)
        best_ours = min(best_ours, time.perf_counter() - started)
        del items
    return best_ours, best_raw


async def sunkd_relist(client: KubeClient) -> tuple[float, int]:
    lw = ListWatch(client, PODS, page_size=PAGE, transform=slim_pod)
    # Warm cache (as after a first sync), so the relist also pays for the diff.
    items, rv = await client.list(PODS, page_size=PAGE)
    lw._reconcile(items, rv, True)
    del items
    started = time.perf_counter()
    items, rv = await client.list(PODS, page_size=PAGE)
    relisted: Relisted = lw._reconcile(items, rv, False)
    return time.perf_counter() - started, relisted.objects


async def raw_watch_latency(api: KubeAPIEmulator, changes: int) -> list[float]:
    """Baseline: a plain aiohttp watch on nodes; time from the write to the parsed line."""
    latencies: list[float] = []
    rv = str(api.resource_version)
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{api.url}/api/v1/nodes",
            params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300"},
        ) as response:
            for i in range(changes):
                name = f"node{(i * 7) % 1000:05d}"
                started = time.perf_counter()
                api.patch("nodes", name, {"metadata": {"labels": {"bench/raw": str(i)}}})
                while True:
                    line = await response.content.readline()
                    event = json.loads(line)
                    if event["type"] == "MODIFIED" and \
                            event["object"]["metadata"]["name"] == name:
                        break
                latencies.append(time.perf_counter() - started)
    return latencies


async def sunkd_latency(api: KubeAPIEmulator, sink: TimedSink, changes: int,
                        nodes: int, pods: int) -> list[float]:
    latencies: list[float] = []
    finished: set[int] = set()
    for i in range(changes):
        if i % 2 == 0:
            name = f"node{(i * 13) % nodes:05d}"
            future = sink.expect(name)
            started = time.perf_counter()
            # A sunkd.io/ label is part of the node observation: one change, one event.
            api.patch("nodes", name, {"metadata": {"labels": {"sunkd.io/bench": str(i)}}})
        else:
            pod = (i * 31) % pods
            if pod % 100 == 0:
                pod += 1  # a Running pod bound to a node
            node = f"node{pod % nodes:05d}"
            future = sink.expect(node)
            started = time.perf_counter()
            phase = "Running" if pod in finished else "Succeeded"
            finished.symmetric_difference_update({pod})
            api.patch("pods", f"pod{pod:06d}", {"status": {"phase": phase}}, "ml",
                      subresource="status")
        arrived = await asyncio.wait_for(future, 10)
        latencies.append(arrived - started)
    return latencies


async def run(nodes: int, pods: int, changes: int, rounds: int) -> dict[str, Any]:
    api = KubeAPIEmulator(history_size=max(1000, changes * 4))
    await api.start("127.0.0.1")
    try:
        t0 = time.perf_counter()
        populate(api, nodes, pods)
        populate_s = time.perf_counter() - t0
        print(f"populated in {populate_s:.1f}s", file=sys.stderr)
        api.record_requests = False
        client = KubeClient.for_url(api.url)
        try:
            gc.collect()
            # Relist cost against the raw baseline (best of `rounds` each, interleaved).
            raw_times, ours_times = [], []
            for _ in range(rounds):
                raw_s, raw_count = await raw_list(api.url)
                ours_s, ours_count = await sunkd_relist(client)
                assert raw_count == ours_count == pods, (raw_count, ours_count, pods)
                raw_times.append(raw_s)
                ours_times.append(ours_s)
            relist_raw = min(raw_times)
            relist_sunkd = min(ours_times)
            client_ours, client_raw = await client_side_relist(client, api.url)

            sink = TimedSink()
            with CRD.open() as handle:
                crd = next(d for d in yaml.safe_load_all(handle) if d)
            rt = nodesets(crd["spec"]["group"], crd["spec"]["versions"][0]["name"])
            source = KubernetesSource(client, sink, nodeset_resource=rt, page_size=PAGE)
            stop = asyncio.Event()
            started = time.perf_counter()
            task = asyncio.create_task(source.run(stop))
            await source.wait_synced(600)
            sync_s = time.perf_counter() - started
            print(f"initial sync {sync_s:.2f}s", file=sys.stderr)
            initial_events = sink.events
            try:
                await source.wait_idle(60)
                ours = await sunkd_latency(api, sink, changes, nodes, pods)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
            raw = await raw_watch_latency(api, changes)
        finally:
            await client.close()
    finally:
        await api.stop()
    return {
        "nodes": nodes,
        "pods": pods,
        "changes": changes,
        "page_size": PAGE,
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes / 10,000 pods")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--changes", type=int, default=None)
    parser.add_argument("--page", type=int, default=PAGE, help="LIST page size")
    parser.add_argument("--rounds", type=int, default=2, help="server-inclusive relist rounds")
    args = parser.parse_args(argv)
    globals()["PAGE"] = args.page
    nodes = args.nodes or (1_000 if args.quick else 5_000)
    pods = args.pods or (10_000 if args.quick else 50_000)
    changes = args.changes or (100 if args.quick else 400)
    if args.quick:
        print(f"--quick: scaled down to {nodes} nodes and {pods} pods "
              "(full run: 5,000 nodes, 50,000 pods)")
    figures = asyncio.run(run(nodes, pods, changes, args.rounds))
    for key, value in figures.items():
        print(f"{key:>22}: {value}")
    targets = {
        # sunkd's relist (paged, decoded, slimmed, diffed) within 3x of LIST + json.loads.
        "relist_ratio": {"value": figures["relist_ratio"], "target": 3.0, "better": "lower"},
        # Client-side only (no server in the timing): decode + slim + diff vs json.loads.
        "relist_client_ratio": {"value": figures["relist_client_ratio"], "target": 3.0,
                                "better": "lower"},
        # A change reaches the sink within 10x of a bare watch seeing it (and under 50 ms).
        "latency_ratio_p50": {"value": figures["latency_ratio_p50"], "target": 10.0,
                              "better": "lower"},
        "latency_p99_ms": {"value": figures["latency_p99_ms"], "target": 50.0,
                           "better": "lower"},
    }
    print(json.dumps({"benchmark": "kube_watch", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
