"""Benchmark: one Slurm poll cycle at 10,000 nodes, and drain/resume round trips.

The poller's per-cycle cost must stay close to the unavoidable cost of parsing the
`GET /nodes` body, or a large cluster's poll interval would be eaten by our own CPU.
For each JSON family (v0.0.38, v0.0.39, v0.0.42) this builds a synthetic 10,000-node
payload (node shapes as in tests/fixtures/slurm), then times, in the same run:

* the parse floor: `json.loads` of the same bytes;
* a cycle: `json.loads` + normalize (`normalize_nodes`) + diff against the previous
  cycle (`SlurmSource`'s diff, 1% of the nodes changed), i.e. what the daemon does.

Target: cycle <= 2x parse floor. Peak memory of a cycle comes from tracemalloc (in a
separate, untimed run). Then, on a real private cluster (sunkd_testbed.slurm), the
median drain and resume round trip through `SlurmActuator` (REST or scontrol).

Usage: python bench/slurm_poll.py [--quick]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, cast

from sunkd.domain.events import Event
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.normalize import normalize_nodes
from sunkd.slurm.source import SlurmSource

NODES = 10_000


def _nv(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


def node_v038(i: int) -> dict[str, Any]:
    # Field set and order of a real 22.05.8 node (tests/fixtures/slurm/v0.0.38_nodes_busy.json).
    state = ("idle", "mixed", "allocated", "idle")[i % 4]
    return {
        "architecture": "x86_64", "burstbuffer_network_address": "", "boards": 1,
        "boot_time": 1795988082, "comment": "", "cores": 32, "cpu_binding": 0, "cpu_load": 0,
        "extra": "", "free_memory": 23884, "cpus": 64, "last_busy": 1795990016 + i,
        "features": "gpu,ib", "active_features": "gpu,ib", "gres": "gpu:8",
        "gres_drained": "N/A", "gres_used": "gpu:2(IDX:0-1)", "mcs_label": "",
        "name": f"gpu-a{i:05d}", "next_state_after_reboot": "invalid", "address": "10.0.0.1",
        "hostname": f"gpu-a{i:05d}", "state": state,
        "state_flags": ["DRAIN"] if i % 50 == 0 else [],
        "next_state_after_reboot_flags": [], "operating_system": "Linux 6.1", "owner": None,
        "partitions": ["batch", "gpu"], "port": 6818, "real_memory": 512000,
        "reason": "sunkd: lent" if i % 50 == 0 else "", "reason_changed_at": 0,
        "reason_set_by_user": None, "slurmd_start_time": 1795990016, "sockets": 2,
        "threads": 1, "temporary_disk": 0, "weight": 1,
        "tres": "cpu=64,mem=500G,billing=64,gres/gpu=8", "slurmd_version": "22.05.8",
        "alloc_memory": 0, "alloc_cpus": 0 if state == "idle" else 32,
        "idle_cpus": 64 if state == "idle" else 32, "tres_used": "cpu=32", "tres_weighted": 1.0,
    }  # fmt: skip


def node_v039(i: int) -> dict[str, Any]:
    base = node_v038(i)
    base["state"] = [base["state"].upper(), *base.pop("state_flags")]
    base["features"] = base["active_features"] = ["gpu", "ib"]
    base["free_mem"] = _nv(base.pop("free_memory"))
    base["cpu_load"] = _nv(0)
    base["alloc_idle_cpus"] = base.pop("idle_cpus")
    base["reason_set_by_user"] = ""
    base["next_state_after_reboot"] = ["INVALID"]
    base["version"] = base.pop("slurmd_version")
    return base


def node_v042(i: int) -> dict[str, Any]:
    base = node_v039(i)
    for key in ("boot_time", "last_busy", "slurmd_start_time", "reason_changed_at"):
        base[key] = _nv(base[key]) if base[key] else {"set": False, "infinite": False, "number": 0}
    base["resume_after"] = _nv(0)
    base["reservation"] = ""
    base["effective_cpus"] = base["cpus"]
    return base


FAMILIES: dict[str, Callable[[int], dict[str, Any]]] = {
    "v0.0.38": node_v038,
    "v0.0.39": node_v039,
    "v0.0.42": node_v042,
}


def payload(family: str, nodes: list[dict[str, Any]]) -> bytes:
    if family == "v0.0.42":
        meta = {"slurm": {"release": "24.11.5"}}
    else:
        meta = {"Slurm": {"release": "22.05.8"}}
    return json.dumps({"meta": meta, "errors": [], "warnings": [], "nodes": nodes}).encode()


async def _sink(events: Any) -> None:
    return None


def bench_family(family: str, repeats: int) -> dict[str, float]:
    make = FAMILIES[family]
    nodes_a = [make(i) for i in range(NODES)]
    nodes_b = copy.deepcopy(nodes_a)
    for i in range(0, NODES, 100):  # 1% of the nodes change between polls
        nodes_b[i]["alloc_cpus"] = 7
    bodies = [payload(family, nodes_a), payload(family, nodes_b)]
    source = SlurmSource(cast(SlurmRestClient, None), _sink)

    def cycle(body: bytes) -> list[Event]:
        nodes = normalize_nodes(json.loads(body))
        events = source._diff(nodes, [])
        source._commit(events)
        return events

    assert len(cycle(bodies[0])) == NODES + 2  # all nodes + 2 partitions' demand
    assert len(cycle(bodies[1])) == NODES // 100
    parse: list[float] = []
    full: list[float] = []
    for r in range(repeats):
        body = bodies[r % 2]
        gc.collect()  # start both timings from the same heap; the GC still runs inside
        t0 = time.perf_counter()
        json.loads(body)
        t1 = time.perf_counter()
        gc.collect()
        t1 = time.perf_counter()
        cycle(body)
        t2 = time.perf_counter()
        parse.append(t1 - t0)
        full.append(t2 - t1)
    tracemalloc.start()
    cycle(bodies[0])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    parse_ms = statistics.median(parse) * 1000
    cycle_ms = statistics.median(full) * 1000
    return {
        "payload_mb": round(len(bodies[0]) / 1e6, 2),
        "parse_ms": round(parse_ms, 1),
        "cycle_ms": round(cycle_ms, 1),
        "ratio": round(cycle_ms / parse_ms, 2),
        "peak_mb": round(peak / 1e6, 1),
    }


async def bench_actuator(rounds: int) -> dict[str, float] | None:
    from sunkd.slurm.actuator import SlurmActuator
    from sunkd_testbed.slurm import SlurmCluster, available

    ok, why = available()
    if not ok:
        print(f"skipping drain/resume round trips: {why}", file=sys.stderr)
        return None
    async with SlurmCluster("bn[1-2]") as cluster:
        async with SlurmRestClient(cluster.rest_url, jwt_key_file=cluster.jwt_key_path) as client:
            actuator = SlurmActuator(client, scontrol_env=cluster.env)
            drains: list[float] = []
            resumes: list[float] = []
            for i in range(rounds):
                t0 = time.perf_counter()
                assert await actuator.drain("bn1", f"bench {i}")
                t1 = time.perf_counter()
                assert await actuator.resume("bn1")
                t2 = time.perf_counter()
                drains.append(t1 - t0)
                resumes.append(t2 - t1)
            return {
                "transport": 1.0 if actuator.transport == "rest" else 0.0,
                "drain_ms": round(statistics.median(drains) * 1000, 1),
                "resume_ms": round(statistics.median(resumes) * 1000, 1),
                "rounds": rounds,
                "version": cluster.rest_version or "",  # type: ignore[dict-item]
            }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats (< 60 s)")
    args = parser.parse_args()
    repeats = 6 if args.quick else 20
    figures: dict[str, Any] = {
        "nodes": NODES,
        "machine": f"{platform.machine()} "
        f"{platform.python_implementation()} {platform.python_version()}",
    }
    targets: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        result = bench_family(family, repeats)
        print(
            f"{family}: {result['payload_mb']} MB, parse floor {result['parse_ms']} ms, "
            f"cycle (parse+normalize+diff) {result['cycle_ms']} ms = {result['ratio']}x, "
            f"peak {result['peak_mb']} MB"
        )
        for key, value in result.items():
            figures[f"{family}_{key}"] = value
        targets[f"{family}_cycle_over_parse"] = {
            "value": result["ratio"],
            "target": 2.0,
            "better": "lower",
        }
    rounds = 5 if args.quick else 20
    actuator = asyncio.run(bench_actuator(rounds))
    if actuator is not None:
        transport = "rest" if actuator["transport"] else "scontrol"
        print(
            f"real cluster ({actuator['version']}, {transport}): drain {actuator['drain_ms']} ms, "
            f"resume {actuator['resume_ms']} ms (median of {rounds})"
        )
        figures["drain_ms"] = actuator["drain_ms"]
        figures["resume_ms"] = actuator["resume_ms"]
        figures["actuator_transport"] = transport
    print(json.dumps({"benchmark": "slurm_poll", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
