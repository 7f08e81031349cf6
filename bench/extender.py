"""Scheduler-extender filter latency over 10,000 nodes, against a JSON-only baseline.

kube-scheduler calls `/scheduler/filter` once per pod scheduling attempt with its
default 5 s timeout; the extender must stay far below that so it never slows
scheduling. The state has N nodes in one pool (40 % Kubernetes-owned, 10 % moving,
the rest Slurm) and the request is a pool pod with every node's name
(nodeCacheCapable, the shipped configuration). Measured in the same run:
  * filter: `Extender.filter_bytes(body)`: decode, verdicts from the per-node cache,
    encode - the handler's work without the HTTP framing;
  * baseline: `json.loads(body)` + `json.dumps(<the same result>)` - the floor any
    JSON extender pays for these bodies;
  * http: the same request through aiohttp on 127.0.0.1 (client and server in one
    process), for the end-to-end order of magnitude;
  * cold: the first filter after a state change (verdicts rebuilt for every node).
Target: filter p99 < 5 ms.

Usage: python bench/extender.py [--quick] [--nodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web

from sunkd.api.app import api_pools, build_app
from sunkd.api.extender import ApiPool, Extender
from sunkd.api.metrics import Metrics
from sunkd.domain.events import (
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    Payload,
    RecordedEvent,
    SlurmNodeObserved,
    SourceHealth,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.state import ClusterState

POOL = "default/gpu"
POOL_LABEL = Label("sunkd.io/pool", "gpu")


def build_state(count: int) -> ClusterState:
    events: list[RecordedEvent] = []
    start = time.time() - 7200

    def add(payload: Payload, subject: str, offset: float = 0.0) -> None:
        events.append(RecordedEvent(seq=len(events) + 1,
                                    recorded_at=datetime.fromtimestamp(start + offset, UTC),
                                    epoch=1, subject=subject, payload=payload))

    add(SourceHealth(source="slurm", status="fresh"), "slurm")
    add(SourceHealth(source="kubernetes", status="fresh"), "kubernetes")
    add(K8sNodesetObserved(pool=POOL, node_selector=(POOL_LABEL,), partitions=("gpu",),
                           workload_selector=(Label("app", "serverless"),)), POOL)
    for index in range(count):
        name = f"gpu-{index:05d}"
        add(SlurmNodeObserved(node=name, state="IDLE", partitions=("gpu",)), name)
        add(K8sNodeObserved(node=name, slurm_node=name, ready=True, labels=(POOL_LABEL,)), name)
        add(K8sWorkloadObserved(node=name), name)  # the source reports every Node's pods
        add(TransitionStarted(transition_id=f"a-{index}", node=name, pool=POOL,
                              from_owner="none", to_owner="slurm", reason="adopt"), name, 60)
        add(TransitionCompleted(transition_id=f"a-{index}", node=name, pool=POOL,
                                from_owner="none", to_owner="slurm", reason="adopted"), name, 60)
        bucket = index % 10
        if bucket < 5:
            add(TransitionStarted(transition_id=f"l-{index}", node=name, pool=POOL,
                                  from_owner="slurm", to_owner="kubernetes", reason="demand"),
                name, 600)
        if bucket < 4:
            add(TransitionCompleted(transition_id=f"l-{index}", node=name, pool=POOL,
                                    from_owner="slurm", to_owner="kubernetes", reason="drained"),
                name, 900)
    return fold(events)


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(function: Callable[[], Any], iterations: int) -> list[float]:
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


class View:
    def __init__(self, state: ClusterState) -> None:
        self.current = state
        self.metrics = Metrics()
        self.event_log = None
        self._pools = api_pools(state)

    def state(self) -> ClusterState:
        return self.current

    def pools(self) -> Sequence[ApiPool]:
        return self._pools

    def is_leader(self) -> bool:
        return True

    def is_ready(self) -> tuple[bool, str]:
        return True, "bench"


async def measure_http(view: View, body: bytes, iterations: int) -> list[float]:
    runner = web.AppRunner(build_app(view))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/scheduler/filter"
    samples = []
    try:
        async with aiohttp.ClientSession() as session:
            for index in range(iterations + 5):
                started = time.perf_counter()
                async with session.post(url, data=body,
                                        headers={"Content-Type": "application/json"}) as reply:
                    assert reply.status == 200
                    await reply.read()
                if index >= 5:
                    samples.append((time.perf_counter() - started) * 1000)
    finally:
        await runner.cleanup()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (< 60 s)")
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    iterations = 300 if args.quick else 2000
    http_iterations = 100 if args.quick else 500

    built = time.perf_counter()
    state = build_state(args.nodes)
    fold_seconds = time.perf_counter() - built
    view = View(state)
    extender = Extender(view.state, view.pools)
    names = sorted(node.k8s_name or node.name for node in state.nodes.values())
    body = json.dumps({
        "Pod": {"metadata": {"name": "fn-1", "namespace": "default",
                             "labels": {"app": "serverless"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        "Nodes": None, "NodeNames": names}).encode()

    cold_started = time.perf_counter()
    result = extender.filter(body)
    cold_ms = (time.perf_counter() - cold_started) * 1000
    passed = len(result["NodeNames"])
    assert passed == args.nodes * 4 // 10, passed

    for _ in range(20):  # warm-up
        extender.filter_bytes(body)
    filter_ms = measure(lambda: extender.filter_bytes(body), iterations)
    baseline_ms = measure(lambda: json.dumps(json.loads(body) and result,
                                             separators=(",", ":")).encode(), iterations)
    http_ms = asyncio.run(measure_http(view, body, http_iterations))

    figures = {
        "nodes": args.nodes,
        "passing_nodes": passed,
        "request_bytes": len(body),
        "filter_p50_ms": round(statistics.median(filter_ms), 3),
        "filter_p99_ms": round(percentile(filter_ms, 0.99), 3),
        "baseline_p50_ms": round(statistics.median(baseline_ms), 3),
        "baseline_p99_ms": round(percentile(baseline_ms, 0.99), 3),
        "filter_over_baseline_p50": round(statistics.median(filter_ms)
                                          / statistics.median(baseline_ms), 2),
        "http_p50_ms": round(statistics.median(http_ms), 3),
        "http_p99_ms": round(percentile(http_ms, 0.99), 3),
        "cold_filter_ms": round(cold_ms, 1),
        "fold_seconds": round(fold_seconds, 2),
        "iterations": iterations,
        "python": platform.python_version(),
    }
    print(f"filter over {args.nodes} nodes: p50 {figures['filter_p50_ms']} ms, "
          f"p99 {figures['filter_p99_ms']} ms (baseline json p50 {figures['baseline_p50_ms']} "
          f"ms); over HTTP p50 {figures['http_p50_ms']} ms, p99 {figures['http_p99_ms']} ms; "
          f"cold {figures['cold_filter_ms']} ms", file=sys.stderr)
    print(json.dumps({
        "benchmark": "extender",
        "figures": figures,
        "targets": {"filter_p99_ms": {"value": figures["filter_p99_ms"], "target": 5,
                                      "better": "lower"}},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
