"""Scale benchmark: what sunkd costs at 10,000 nodes in 10 Nodeset pools and
100,000 pods, in log bytes, memory and time.

Why: a site runs sunkd for years on thousands of nodes. The log must grow with what
changes (not with nodes x polls), `sunkd run` must stay flat in memory, and both a first
start and a restart must reach their first decision quickly. Each phase is a subcommand;
`all` (the default) runs them in turn. Everything runs on this machine: the Kubernetes API
emulator (`sunkd_testbed.kubeapi`, populated as `bench/kube_watch.py` does: N nodes with
labels pool=p0..p9, 10 Nodesets pool0..pool9 in namespace `ml` selecting them and the Slurm
partitions part0..part9, M pods spread over the nodes, 1 % pending), a fake slurmrestd of
this file (v0.0.39 dialect, the same N node names, node i in partition part{i % 10}, one
single-node job per busy node) and, for the daemon phases, a real `sunkd run` subprocess on
SQLite in a temporary directory (with `--real-apiserver`, a real kube-apiserver and etcd in
place of the emulator: see the end).

The churn model (per node per hour; `--job-changes`, `--pod-churn`, `--flaps`):
- 2 Slurm job changes: a job ends on a busy node and a new single-node job starts on an
  idle one, so the busy count stays at the chosen fraction (each is a node state change);
- 1 pod churn: a pod bound to the node is deleted and a new one is created on it (two
  changes of the node's pod set: one pod gone, one new);
- 0.02 Ready flaps: the Node turns NotReady and Ready again 5 s later (two changes);
- per partition per 5 s poll, with probability 0.2, the pending-job count moves by one.

Phases and what each drives:
- `log`: the real `SlurmSource` (its diff and demand computation; a stub client hands it
  the fake cluster's nodes and jobs as `SlurmNode`/`SlurmJob`, so slurmrestd's JSON is not
  parsed) and the real `KubernetesSource` against the emulator, stepped in virtual time
  (one Slurm poll per simulated 5 s), at two busy fractions (20 % and 60 % by default).
  Counted: the events they hand to the sink, each as its kind + subject + payload JSON as
  the log stores it (row columns and indexes not counted). Figures: bytes per simulated
  day (extrapolated from the window), bytes per node state change (target <= 1024), the
  largest event at each busy count and their ratio (target: no growth, <= 1.1).
- `memory`: `sunkd run` RSS after warm-up (first decision, then churn until the daemon
  has written `--warm-snapshots` (2) snapshots, then the log quiet for 6 s, 3 s with
  --quick, each within a time cap) and after a churn run (the fake slurmrestd flips
  `--churn-per-poll` nodes per `GET /nodes`, the emulator churns pods; full: until
  >= 1,000,000 events were appended, at most `--churn-cap` s, or 60 s without progress),
  targets <= 350 MB (300 MB before kubernetes-asyncio became a runtime dependency:
  it loads the kubeconfig and credentials, ~38 MB) and <= 5 % growth. `--tracemalloc`
  runs the daemon under tracemalloc and prints its top allocation sites after the churn
  (RSS then includes tracemalloc's own overhead).
- `sync`: `sunkd run` start to its first `engine.decision` log line (the adoption of the
  first nodes), target <= 30 s. The emulator's paged LIST scans the whole collection per
  page (see bench/kube_watch.py), so at 100,000 pods part of this is the emulator's.
  Also printed (every daemon phase): `sync_settled_at_s`, start to the log quiet again
  after the first decision (the adoption's one Kubernetes action per node done; the
  quiet window included; null when it did not settle within the warm cap), and
  `sync_actions_done`.
- `restart`: after a first sync, the daemon is stopped; the log gets a simulated
  `--history-days` (30) of history at N nodes appended through `EventLog.append` with
  recorded_at stamped in the past (`--history-changes` Slurm node changes per node-hour,
  each a pair that returns to the node's last observation, and one lend + reclaim cycle,
  12 events, per node every 3 days), a snapshot of its fold, then a tail of 500 events;
  10 new nodes appear in both systems, and `sunkd run` is started again: time to its
  first `engine.decision`, target <= 15 s.

Slurm poll interval: the memory phase's daemon polls every 1 s (its Slurm churn comes per
`GET /nodes`); a daemon that does not churn (the first sync of `sync` and `restart`, and
every restart) polls at `--poll` seconds, default sunkd's own default (5 s), which is what
a site runs. `--poll 1` measures the harsher case: at 10,000 nodes a 1 s poll costs about
a fifth of the daemon's CPU while it lists 100,000 pods.

`--quick` runs 200 nodes / 2,000 pods with short windows (under 60 s in all). The last
line of output is one JSON object.

`daemon` runs memory, sync and restart on one first sync.

`--real-apiserver` (daemon phases only: `memory`, `sync`, `restart`, `daemon`; `log` always
uses the emulator) runs them against the real Kubernetes control plane instead of the
emulator: `sunkd_testbed.kubernetes.KubeControlPlane` from the cached v1.37.2 binaries
(bench/real_kube.py; exit 2 when `available()` says they are missing). What runs: etcd
(no fsync, `--quota-backend-bytes` 8 GiB), kube-apiserver with the harness's flags (no
others were needed: the admin user is in system:masters, exempt from API Priority and
Fairness, and the population's 48 writes in flight, `--concurrency`, are below the
default 200 mutating in flight), and kube-controller-manager with only
serviceaccount-controller, serviceaccount-token-controller and namespace-controller
(pods need their namespace's default ServiceAccount). Not run: kube-scheduler (the 1 %
pending pods stay unbound), node-lifecycle-controller (with no kubelet it would mark every
Node Unknown, taint it and evict its pods), every other controller, and any kubelet
(HarnessKubelet included). The world is the emulator's: the Nodeset CRD from
manifests/crds/nodeset.yaml, namespace `ml`, Nodesets ml/pool0..9, the same N Node objects
(created with their Ready status, which a Node create keeps; a status PATCH follows if it
did not) and M pods, created over HTTPS with the admin client certificate; a bound pod's
status is then PATCHed to Running (the server resets a new pod's status to Pending). The
daemon gets the plane's admin kubeconfig (`write_kubeconfig`), the fake slurmrestd and
the daemon's HTTP port take free ports. The memory phase's pod churn (delete with grace 0,
create, status PATCH) and the restart's new Nodes are HTTP writes to the same server.
Extra figures: `kube_backend` ("emulator" or "real-apiserver v1.37.2", always),
`kube_populate_s` (and per part), `kube_plane_start_s`, and the components' RSS after
population and after the first sync (`kube_rss_mb_*`); `sync_rss_peak_mb` (the daemon's
VmHWM after the first sync settled) and `restart_rss_peak_mb` are printed on both backends.

Usage: python bench/scale.py [all|log|memory|sync|restart|daemon] [--quick] [--nodes N] [--pods M]
                             [--real-apiserver [--concurrency 48]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kube_watch import crd_object, node_object, populate
from real_kube import EmulatorWrites, KubeWrites, RealKube

from sunkd.domain.codec import payload_to_json
from sunkd.domain.events import (
    ActionRequested,
    ActionSucceeded,
    Event,
    RecordedEvent,
    SlurmNodeObserved,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.snapshot import state_to_json
from sunkd.kubernetes.client import KubeClient, nodesets
from sunkd.kubernetes.source import KubernetesSource
from sunkd.runtime.config import SlurmSettings
from sunkd.runtime.reconciler import load_state
from sunkd.slurm.model import SlurmJob, SlurmNode
from sunkd.slurm.source import SlurmSource
from sunkd.store.eventlog import EventLog
from sunkd_testbed.kubernetes import free_ports

ROOT = Path(__file__).resolve().parent.parent
SUNKD = ROOT / ".venv" / "bin" / "sunkd"
PYTHON = ROOT / ".venv" / "bin" / "python"
POOLS = 10
POLL = 5.0  # simulated seconds per Slurm poll in the log phase
PORT_BASE = 18400  # this benchmark's ports: 18400-18499
META = {"plugin": {"type": "openapi/v0.0.39"}, "Slurm": {"release": "23.02.8"}}
RSS_TARGET_MB = 350  # warm and after churn; kubernetes-asyncio loads the configuration
V39 = "/slurm/v0.0.39/"
NEW_NODES = 10  # nodes that appear before the restart (something to decide)


def node_name(n: int) -> str:
    return f"node{n:05d}"  # as bench/kube_watch.py names the emulator's nodes


@dataclasses.dataclass
class Rates:
    """The churn model, per node per hour."""

    job_changes: float = 2.0
    pod_churn: float = 1.0
    flaps: float = 0.02


class Cluster:
    """The fake Slurm cluster: nodes, one single-node job per busy node, pending counts,
    and the drains sunkd asked for. Shared by the stub client and the fake slurmrestd."""

    def __init__(self, nodes: int, busy_fraction: float, now: float, seed: int = 15) -> None:
        self.rng = random.Random(seed)
        self.names: list[str] = []
        self.partition: dict[str, str] = {}
        self.idle: list[str] = []
        self.busy: list[str] = []
        self.jobs: dict[str, tuple[int, float]] = {}  # node -> (job id, expected end)
        self.pending = {f"part{p}": 0 for p in range(POOLS)}
        self.drain: dict[str, str] = {}  # node -> reason
        self.next_job = 1
        for n in range(nodes):
            self.add_node(n)
        self.set_busy(busy_fraction, now)

    def add_node(self, n: int) -> None:
        name = node_name(n)
        self.names.append(name)
        self.partition[name] = f"part{n % POOLS}"
        self.idle.append(name)

    def _start(self, now: float) -> None:
        i = self.rng.randrange(len(self.idle))
        self.idle[i], self.idle[-1] = self.idle[-1], self.idle[i]
        name = self.idle.pop()
        self.busy.append(name)
        self.jobs[name] = (self.next_job, now + self.rng.uniform(1800, 7200))
        self.next_job += 1

    def _end(self) -> None:
        i = self.rng.randrange(len(self.busy))
        self.busy[i], self.busy[-1] = self.busy[-1], self.busy[i]
        name = self.busy.pop()
        self.idle.append(name)
        del self.jobs[name]

    def set_busy(self, fraction: float, now: float) -> None:
        target = round(fraction * len(self.names))
        while len(self.busy) < target and self.idle:
            self._start(now)
        while len(self.busy) > target:
            self._end()

    def churn(self, pairs: int, now: float) -> int:
        """`pairs` job ends, each followed by a job start on an idle node; returns the
        node state changes made (two per pair)."""
        done = 0
        for _ in range(pairs):
            if not self.busy or not self.idle:
                break
            self._end()
            self._start(now)
            done += 2
        for partition in self.pending:
            if self.rng.random() < 0.2:
                self.pending[partition] = max(0, min(20, self.pending[partition]
                                                     + self.rng.choice((-1, 1))))
        return done

    def slurm_nodes(self) -> list[SlurmNode]:
        out = []
        for name in self.names:
            busy = name in self.jobs
            reason = self.drain.get(name)
            out.append(SlurmNode(
                name=name, state="ALLOCATED" if busy else "IDLE",
                flags=frozenset({"DRAIN"}) if reason is not None else frozenset(),
                reason=reason, reason_set_by="root" if reason else None, cpus=64,
                alloc_cpus=64 if busy else 0, partitions=(self.partition[name],),
                boot_time=1_699_990_000.0))
        return out

    def slurm_jobs(self) -> list[SlurmJob]:
        jobs = [SlurmJob(job_id=job, state="RUNNING", partition=self.partition[name],
                         nodes=(name,), node_count=1, time_limit=120.0, end_time=end)
                for name, (job, end) in self.jobs.items()]
        for partition, count in self.pending.items():
            jobs.extend(SlurmJob(job_id=10_000_000 + i, state="PENDING", partition=partition,
                                 node_count=1, state_reason="Resources") for i in range(count))
        return jobs

    # ------------------------------------------------------- slurmrestd v0.0.39 JSON

    def nodes_json(self) -> dict[str, Any]:
        nodes = []
        for name in self.names:
            busy = name in self.jobs
            reason = self.drain.get(name)
            state = ["ALLOCATED" if busy else "IDLE"] + (["DRAIN"] if reason is not None else [])
            nodes.append({
                "name": name, "state": state, "reason": reason or "",
                "reason_set_by_user": "root" if reason else "", "reason_changed_at": 0,
                "boot_time": 1699990000, "last_busy": 1699999000, "cpus": 64,
                "alloc_cpus": 64 if busy else 0, "features": [],
                "partitions": [self.partition[name]], "gres": "", "gres_used": "",
                "comment": ""})
        return {"meta": META, "errors": [], "warnings": [], "nodes": nodes}

    def jobs_json(self) -> dict[str, Any]:
        def number(value: float) -> dict[str, Any]:
            return {"set": True, "infinite": False, "number": int(value)}

        jobs: list[dict[str, Any]] = [
            {"job_id": job, "job_state": "RUNNING", "partition": self.partition[name],
             "nodes": name, "node_count": number(1), "time_limit": number(120),
             "start_time": number(end - 3600), "end_time": number(end), "state_reason": "None"}
            for name, (job, end) in self.jobs.items()]
        for partition, count in self.pending.items():
            jobs.extend({"job_id": 10_000_000 + i, "job_state": "PENDING",
                         "partition": partition, "nodes": "", "node_count": number(1),
                         "time_limit": number(120), "state_reason": "Resources"}
                        for i in range(count))
        return {"meta": META, "errors": [], "warnings": [], "jobs": jobs}


class StubSlurmClient:
    """What `SlurmSource` asks of `SlurmRestClient`, answered from a `Cluster`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def negotiate(self) -> str:
        return "v0.0.39"

    async def get_nodes(self) -> list[SlurmNode]:
        return self.cluster.slurm_nodes()

    async def get_jobs(self) -> list[SlurmJob]:
        return self.cluster.slurm_jobs()


class FakeSlurmrestd:
    """slurmrestd's v0.0.39 endpoints sunkd uses, over a `Cluster`; `churn_per_poll`
    node changes are applied before every `GET /nodes`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.churn_per_poll = 0
        self.polls = 0
        self.runner: web.AppRunner | None = None

    async def start(self, port: int) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        if not path.startswith(V39):
            return web.Response(status=404, text="not found")
        tail = path[len(V39):]
        if tail == "ping":
            return web.json_response({"meta": META, "errors": [],
                                      "pings": [{"hostname": "ctl", "ping": "UP"}]})
        if tail == "jobs":
            return web.json_response(self.cluster.jobs_json())
        if tail == "nodes":
            self.polls += 1
            if self.churn_per_poll:
                self.cluster.churn(self.churn_per_poll // 2, time.time())
            return web.json_response(self.cluster.nodes_json())
        if tail.startswith("node/"):
            name = tail[len("node/"):]
            if name not in self.cluster.partition:
                return web.json_response({"meta": META, "errors": [
                    {"error": "Invalid node name specified", "error_number": 2018}]},
                    status=500)
            if request.method == "POST":
                body = await request.json()
                verb = (body.get("state") or [""])[0]
                if verb == "DRAIN":
                    self.cluster.drain[name] = body.get("reason", "")
                elif verb in ("RESUME", "UNDRAIN"):
                    self.cluster.drain.pop(name, None)
                return web.json_response({"meta": META, "errors": []})
            body = self.cluster.nodes_json()
            body["nodes"] = [n for n in body["nodes"] if n["name"] == name]
            return web.json_response(body)
        return web.Response(status=404, text="not found")


# ------------------------------------------------------------------------ log growth


class ByteSink:
    """Counts what the sources hand to the log, per phase, as the log stores it."""

    def __init__(self) -> None:
        self.phase = "sync"
        self.bytes: dict[str, int] = {}
        self.events: dict[str, int] = {}
        self.max_size: dict[str, tuple[int, str]] = {}
        self.by_kind: dict[str, dict[str, list[int]]] = {}

    async def __call__(self, batch: Sequence[Event]) -> None:
        phase = self.phase
        kinds = self.by_kind.setdefault(phase, {})
        for event in batch:
            size = len(event.kind) + len(event.subject) + len(payload_to_json(event.payload))
            self.bytes[phase] = self.bytes.get(phase, 0) + size
            self.events[phase] = self.events.get(phase, 0) + 1
            if size > self.max_size.get(phase, (0, ""))[0]:
                self.max_size[phase] = (size, event.kind)
            entry = kinds.setdefault(event.kind, [0, 0, 0])
            entry[0] += 1
            entry[1] += size
            entry[2] = max(entry[2], size)


class KubeChurn:
    """Pod churn and Ready flaps applied to the emulator or the real API server."""

    def __init__(self, writes: KubeWrites, nodes: int, pods: int, seed: int = 16) -> None:
        self.writes = writes
        self.nodes = nodes
        self.rng = random.Random(seed)
        # Bound pods (i % 100 != 0, see kube_watch.pod_object), by name -> node index.
        self.pods = [(f"pod{i:06d}", i % nodes) for i in range(pods) if i % 100 != 0]
        self.next_pod = pods
        self.flapped: list[str] = []

    def _conditions(self, ready: bool) -> list[dict[str, str]]:
        return [{"type": t, "status": ("True" if ready else "False") if t == "Ready" else "False",
                 "reason": "KubeletReady" if ready else "KubeletNotReady", "message": "ok",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]

    async def _replace_pod(self, old: str, new: str, node: int) -> None:
        with contextlib.suppress(Exception):
            await self.writes.delete_pod(old)
        await self.writes.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": new, "namespace": "ml",
                         "labels": {"pool": f"p{node % POOLS}", "app": "serve"}},
            "spec": {"nodeName": node_name(node), "containers": [
                {"name": "main", "image": "registry.example/app:1"}]},
            "status": {"phase": "Running"}}, "ml")

    async def step(self, pod_churn: int, flaps: int) -> int:
        """One step's writes (concurrently: on the real server each is an HTTP request)."""
        changes = 0
        writes: list[Awaitable[None]] = []
        for name in self.flapped:  # back to Ready after one step
            writes.append(self.writes.node_status(
                name, {"conditions": self._conditions(True)}))
            changes += 1
        self.flapped = []
        for _ in range(pod_churn):
            i = self.rng.randrange(len(self.pods))
            name, node = self.pods[i]
            new = f"pod{self.next_pod:06d}"
            self.next_pod += 1
            writes.append(self._replace_pod(name, new, node))
            self.pods[i] = (new, node)
            changes += 2  # the node's pod set changed twice: one pod gone, one new
        for _ in range(flaps):
            name = node_name(self.rng.randrange(self.nodes))
            if name in self.flapped:
                continue
            writes.append(self.writes.node_status(
                name, {"conditions": self._conditions(False)}))
            self.flapped.append(name)
            changes += 1
        await asyncio.gather(*writes)
        return changes


class Carry:
    """Turns a fractional rate per step into whole counts (keeps the remainder)."""

    def __init__(self, per_step: float) -> None:
        self.per_step = per_step
        self.acc = 0.0

    def take(self) -> int:
        self.acc += self.per_step
        whole = int(self.acc)
        self.acc -= whole
        return whole


async def log_growth(nodes: int, pods: int, steps: int, busy: tuple[float, float],
                     rates: Rates) -> dict[str, Any]:
    from sunkd_testbed.kubeapi import KubeAPIEmulator

    api = KubeAPIEmulator(history_size=100_000)
    started = time.perf_counter()
    populate(api, nodes, pods)
    api.record_requests = False
    await api.start("127.0.0.1", PORT_BASE + 10)
    client = KubeClient.for_url(api.url)
    crd = crd_object()
    sink = ByteSink()
    kube = KubernetesSource(client, sink, nodeset_resource=nodesets(
        crd["spec"]["group"], crd["spec"]["versions"][0]["name"]), page_size=5000)
    clock = [1_800_000_000.0]
    cluster = Cluster(nodes, busy[0], clock[0])
    slurm = SlurmSource(StubSlurmClient(cluster), sink,  # type: ignore[arg-type]
                        poll_interval=POLL, clock=lambda: clock[0])
    churn = KubeChurn(EmulatorWrites(api), nodes, pods)
    stop = asyncio.Event()
    task = asyncio.create_task(kube.run(stop))
    figures: dict[str, Any] = {}
    try:
        await kube.wait_synced(600)
        await slurm.poll_once()
        await kube.wait_idle(120)
        print(f"log: populated and synced in {time.perf_counter() - started:.1f}s "
              f"({sink.events.get('sync', 0)} initial events)", file=sys.stderr)
        per_step = nodes * POLL / 3600
        jobs, pod_churn, flaps = (Carry(rates.job_changes / 2 * per_step),
                                  Carry(rates.pod_churn * per_step), Carry(rates.flaps * per_step))
        for level, fraction in zip(("low", "high"), busy, strict=True):
            sink.phase = f"settle-{level}"
            cluster.set_busy(fraction, clock[0])
            await slurm.poll_once()
            sink.phase = level
            changes = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                clock[0] += POLL
                changes += cluster.churn(jobs.take(), clock[0])
                changes += await churn.step(pod_churn.take(), flaps.take())
                await slurm.poll_once()
                await asyncio.sleep(0.002)  # let the watch deliver this step's changes
                await kube.wait_idle(120)
            await asyncio.sleep(0.2)
            await kube.wait_idle(120)
            seconds = steps * POLL
            total = sink.bytes.get(level, 0)
            size, kind = sink.max_size.get(level, (0, ""))
            busy_nodes = len(cluster.busy)
            figures.update({
                f"{level}_busy_nodes": busy_nodes,
                f"{level}_events": sink.events.get(level, 0),
                f"{level}_node_changes": changes,
                f"{level}_bytes_per_day": round(total / seconds * 86400),
                f"{level}_bytes_per_node_change": round(total / max(1, changes), 1),
                f"{level}_max_event_bytes": size,
                f"{level}_max_event_kind": kind,
                f"{level}_wall_s": round(time.perf_counter() - t0, 1),
            })
            print(f"log[{level}, {busy_nodes} busy]: {sink.events.get(level, 0)} events, "
                  f"{total:,} bytes over {seconds:.0f} simulated s for {changes} node changes; "
                  "by kind (count, bytes, max): "
                  + json.dumps(sink.by_kind.get(level, {})), file=sys.stderr)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        await client.close()
        await api.stop()
    figures["simulated_seconds_per_level"] = steps * POLL
    figures["max_event_growth"] = round(
        figures["high_max_event_bytes"] / max(1, figures["low_max_event_bytes"]), 3)
    return figures


# ------------------------------------------------------------------- sunkd run phases


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB from /proc (proc(5))."""
    values = {"VmRSS": 0, "VmHWM": 0}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in values:
                values[key] = int(line.split()[1])
    return values["VmRSS"], values["VmHWM"]


TRACE_WRAPPER = """
import signal, sys, tracemalloc
tracemalloc.start(1)
TARGET = sys.argv[1]
def dump(*_):
    snap = tracemalloc.take_snapshot()
    with open(TARGET, "w") as out:
        for key in ("filename", "lineno"):
            for stat in snap.statistics(key)[:20]:
                out.write(f"{key} {stat}\\n")
    with open(TARGET + ".done", "w") as out:
        out.write("done")
signal.signal(signal.SIGUSR1, dump)
from sunkd.cli.main import main
sys.argv = ["sunkd"] + sys.argv[2:]
sys.exit(main())
"""

# --memstats: on SIGUSR2 the daemon writes where its memory is, as one JSON object: glibc's
# mallinfo2() (arena bytes in use / free, mmap'ed blocks), pymalloc's blocks in use, and
# the container objects the collector tracks, by type. The handler runs on the main thread
# between bytecodes; gc.get_objects() walks every tracked object (~0.5 s at 10,000 nodes).
MEMSTATS_WRAPPER = """
import collections, ctypes, gc, json, signal, sys
TARGET = sys.argv[1]
class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]
def dump(*_):
    out = {"pymalloc_blocks": sys.getallocatedblocks()}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
        out["mallinfo2"] = {name: getattr(info, name) for name, _ in _Mallinfo2._fields_}
    except (OSError, AttributeError) as error:
        out["mallinfo2"] = repr(error)
    tracked = gc.get_objects()
    counts = collections.Counter(type(o).__qualname__ for o in tracked)
    out["gc_tracked"] = sum(counts.values())
    out["gc_top"] = counts.most_common(25)
    # Objects of 1 MiB and more (glibc mmaps them): tracked containers and what they refer
    # to directly (bytes and str are not tracked), largest first.
    big, seen = [], set()
    for o in tracked:
        for x in (o, *gc.get_referents(o)):
            size = sys.getsizeof(x)
            if size >= 1 << 20 and id(x) not in seen:
                seen.add(id(x))
                length = len(x) if hasattr(x, "__len__") else None
                big.append((size, type(x).__qualname__, length,
                            type(o).__qualname__ if x is not o else None))
    big.sort(reverse=True)
    out["big"] = big[:30]
    del tracked
    with open(TARGET, "w") as f:
        json.dump(out, f)
    with open(TARGET + ".done", "w") as f:
        f.write("done")
signal.signal(signal.SIGUSR2, dump)
from sunkd.cli.main import main
sys.argv = ["sunkd"] + sys.argv[2:]
sys.exit(main())
"""


def smaps_summary(pid: int) -> dict[str, int]:
    """kB of RSS by kind of mapping, from /proc/PID/smaps: the brk heap, anonymous maps
    (glibc's other arenas, its mmap'ed blocks, pymalloc's 1 MiB arenas, thread stacks) and
    file-backed maps (code of Python, extension modules and libraries)."""
    kinds = {"heap": 0, "anon": 0, "file": 0, "other": 0}
    kind = "other"
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            head = line.split(None, 5)
            if head and not head[0].endswith(":"):  # a mapping's header line
                name = head[5] if len(head) > 5 else ""
                kind = ("heap" if name == "[heap]" else "anon" if not name
                        else "file" if name.startswith("/") else "other")
            elif head and head[0] == "Rss:":
                kinds[kind] += int(head[1])
    return kinds


class Daemon:
    """One `sunkd run` subprocess and what its JSON log lines said."""

    def __init__(self, workdir: Path, http_port: int, kube_port: int, slurm_port: int,
                 poll: float, trace: bool = False, memstats: bool = False) -> None:
        self.workdir = workdir
        self.http = f"http://127.0.0.1:{http_port}"
        self.env = dict(os.environ, KUBECONFIG=str(workdir / "kubeconfig"),
                        SUNKD_KUBERNETES_NAMESPACE="ml",
                        SUNKD_DATABASE_URL=f"sqlite+aiosqlite:///{workdir / 'sunkd.db'}",
                        SUNKD_SLURM_URL=f"http://127.0.0.1:{slurm_port}",
                        SUNKD_SLURM_TOKEN_FILE=str(workdir / "token"),
                        SUNKD_SLURM_POLL_INTERVAL=str(poll), SUNKD_LOG_FORMAT="json")
        (workdir / "token").write_text("x")
        self.args = ["run", "--listen", f"127.0.0.1:{http_port}"]
        self.trace = trace
        self.trace_file = workdir / "tracemalloc.txt"
        self.memstats = memstats and not trace
        self.memstats_file = workdir / "memstats.json"
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0
        self.first: dict[str, float] = {}  # log event -> seconds after start (first one)
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self.log_file = (workdir / "sunkd.log").open("a")

    async def start(self) -> None:
        if self.trace:
            command = [str(PYTHON), "-c", TRACE_WRAPPER, str(self.trace_file), *self.args]
        elif self.memstats:
            command = [str(PYTHON), "-c", MEMSTATS_WRAPPER, str(self.memstats_file),
                       *self.args]
        else:
            command = [str(SUNKD), *self.args]
        self.first, self.counts = {}, {}
        self.started = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            *command, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, limit=16 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            at = time.monotonic() - self.started
            self.log_file.write(line.decode(errors="replace"))
            try:
                record = json.loads(line)
                name = str(record.get("event", ""))
                level = str(record.get("level", ""))
            except ValueError:
                name, level = "non-json", ""
            self.first.setdefault(name, at)
            self.counts[name] = self.counts.get(name, 0) + 1
            if level in ("error", "critical") or name in ("leadership.acquire_failed",
                                                           "daemon.deposed"):
                self.errors.append(line.decode(errors="replace")[:300].strip())

    async def wait_for(self, event: str, within: float) -> float | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if event in self.first:
                return self.first[event]
            if self.proc is not None and self.proc.returncode is not None:
                return None
            await asyncio.sleep(0.05)
        return None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def get(self, path: str) -> str:
        try:
            async with ClientSession(timeout=ClientTimeout(total=10)) as session, \
                    session.get(self.http + path) as response:
                return await response.text()
        except Exception as error:  # the daemon may be busy or not listening yet
            return f"unreachable: {type(error).__name__}"

    async def events_folded(self) -> int | None:
        text = await self.get("/metrics")
        total, seen = 0.0, False
        for line in text.splitlines():
            if line.startswith("sunkd_events_folded_total{"):
                total += float(line.rsplit(" ", 1)[1])
                seen = True
        return int(total) if seen else None

    async def tracemalloc_top(self) -> str:
        done = Path(str(self.trace_file) + ".done")
        done.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        for _ in range(1200):
            if done.exists():
                return self.trace_file.read_text()
            await asyncio.sleep(0.1)
        return "tracemalloc snapshot not written within 120 s"

    async def memory_report(self) -> dict[str, Any]:
        """smaps by kind of mapping; with --memstats also the daemon's own breakdown."""
        report: dict[str, Any] = {"smaps_kb": smaps_summary(self.pid)}
        if not self.memstats:
            return report
        done = Path(str(self.memstats_file) + ".done")
        done.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR2)
        for _ in range(600):
            if done.exists():
                report.update(json.loads(self.memstats_file.read_text()))
                return report
            await asyncio.sleep(0.1)
        report["memstats"] = "not written within 60 s"
        return report

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 40)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        self.log_file.flush()
        return self.proc.returncode


async def settle(daemon: Daemon, quiet_for: float, cap: float) -> tuple[int | None, bool]:
    """Wait until the folded-event count has not moved for `quiet_for` seconds (or `cap`)."""
    deadline = time.monotonic() + cap
    last: int | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        count = await daemon.events_folded()
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_for:
            return last, True
        await asyncio.sleep(1.0)
    return last, False


@dataclasses.dataclass
class DaemonPlan:
    nodes: int
    pods: int
    sync_cap: float
    warm_cap: float
    churn_events: int
    churn_cap: float
    churn_per_poll: int
    quiet: float
    pod_churn_per_s: int
    history_days: float
    warm_snapshots: int
    history_changes: float
    poll: float  # Slurm poll interval of a daemon that does not churn
    memory: bool
    restart: bool
    trace: bool
    memstats: bool
    keep: bool
    real: bool = False  # --real-apiserver: KubeControlPlane instead of the emulator
    concurrency: int = 48  # --real-apiserver: population requests in flight


class Kube:
    """The daemon phases' Kubernetes: the emulator (in-process) or a real control plane
    (bench/real_kube.py), populated, serving on a port, with a kubeconfig for the daemon."""

    def __init__(self, plan: DaemonPlan) -> None:
        self.plan = plan
        self.api: Any = None
        self.real: RealKube | None = None
        self.writes: KubeWrites | None = None
        self.port = 0
        self.backend = "emulator"

    async def start(self, workdir: Path, figures: dict[str, Any]) -> None:
        plan = self.plan
        t0 = time.perf_counter()
        if not plan.real:
            from sunkd_testbed.kubeapi import KubeAPIEmulator

            self.api = KubeAPIEmulator(history_size=100_000)
            populate(self.api, plan.nodes, plan.pods)
            self.api.record_requests = False
            self.port = PORT_BASE + 20
            await self.api.start("127.0.0.1", self.port)
            self.api.write_kubeconfig(workdir / "kubeconfig", namespace="ml")
            self.writes = EmulatorWrites(self.api)
            figures["kube_backend"] = self.backend
            print(f"daemon: emulator populated ({plan.nodes} nodes, {plan.pods} pods) in "
                  f"{time.perf_counter() - t0:.1f}s; workdir {workdir}", file=sys.stderr)
            return
        self.real = RealKube(plan.concurrency)
        await self.real.start()
        self.writes = self.real
        self.port = self.real.plane.apiserver_port
        self.backend = f"real-apiserver {self.real.version}"
        figures["kube_backend"] = self.backend
        figures["kube_plane_start_s"] = self.real.plane.startup_seconds
        print(f"daemon: real control plane {self.real.version} up in "
              f"{self.real.plane.startup_seconds} s at {self.real.plane.url}; populating "
              f"{plan.nodes} nodes, {plan.pods} pods, {plan.concurrency} requests in flight",
              file=sys.stderr)
        parts = await self.real.populate(plan.nodes, plan.pods)
        self.real.write_kubeconfig(workdir / "kubeconfig")
        figures["kube_populate_s"] = parts["total_s"]
        figures["kube_populate_parts_s"] = parts
        figures["kube_node_status_patches"] = self.real.node_status_patches
        figures["kube_rss_mb_populated"] = self.real.rss()
        print(f"daemon: real API server populated in {parts['total_s']} s ({parts}); "
              f"RSS MB {figures['kube_rss_mb_populated']}; workdir {workdir}", file=sys.stderr)

    def rss(self) -> dict[str, float] | None:
        return self.real.rss() if self.real is not None else None

    async def stop(self) -> None:
        if self.real is not None:
            await self.real.stop()
        elif self.api is not None:
            await self.api.stop()


async def daemon_phases(plan: DaemonPlan) -> dict[str, Any]:
    figures: dict[str, Any] = {"daemon_nodes": plan.nodes, "daemon_pods": plan.pods}
    workdir = Path(tempfile.mkdtemp(prefix="sunkd-scale-"))
    kube = Kube(plan)
    # The real plane takes free ports; so do its Slurm and HTTP ports (another run of this
    # benchmark on the emulator may hold the fixed ones).
    slurm_port, http_port = (free_ports(2) if plan.real
                             else (PORT_BASE + 21, PORT_BASE + 22))
    cluster = Cluster(plan.nodes, 0.0, time.time())
    fake = FakeSlurmrestd(cluster)
    daemon: Daemon | None = None
    try:
        await kube.start(workdir, figures)
        await fake.start(slurm_port)
        poll = 1.0 if plan.memory else plan.poll  # the memory phase churns per GET /nodes
        figures["first_sync_poll_s"] = poll
        daemon = Daemon(workdir, http_port, kube.port, slurm_port, poll=poll, trace=plan.trace,
                        memstats=plan.memstats)
        await _daemon_run(daemon, kube, fake, cluster, plan, figures)
    finally:
        if daemon is not None:
            await daemon.stop()
        await fake.stop()
        await kube.stop()
        if daemon is not None:
            if daemon.errors:
                print("daemon: warnings/errors seen (first 5):\n  "
                      + "\n  ".join(daemon.errors[:5]), file=sys.stderr)
            daemon.log_file.close()
        if not plan.keep:
            for path in sorted(workdir.glob("*"), reverse=True):
                path.unlink(missing_ok=True)
            workdir.rmdir()
    return figures


async def _daemon_run(daemon: Daemon, kube: Kube, fake: FakeSlurmrestd, cluster: Cluster,
                      plan: DaemonPlan, figures: dict[str, Any]) -> None:
    assert kube.writes is not None
    await daemon.start()
    first = await daemon.wait_for("engine.decision", plan.sync_cap)
    figures["first_sync_s"] = round(first, 2) if first is not None else None
    figures["first_sync_leading_s"] = _rounded(daemon.first.get("daemon.leading"))
    print(f"daemon: first decision after {figures['first_sync_s']} s (leading after "
          f"{figures['first_sync_leading_s']} s)", file=sys.stderr)
    if first is None:
        figures["first_sync_note"] = f"no decision within {plan.sync_cap:g} s"
        return
    events, settled = await settle(daemon, plan.quiet, plan.warm_cap)
    # The adoption (one Kubernetes action per node) is what keeps the log moving after
    # the first decision; the moment includes the quiet window.
    figures["sync_settled_at_s"] = (round(time.monotonic() - daemon.started, 1)
                                    if settled else None)
    figures["sync_actions_done"] = daemon.counts.get("engine.action_done", 0)
    print(f"daemon: after the first sync, settled={settled} at "
          f"{figures['sync_settled_at_s']} s, {figures['sync_actions_done']} actions done",
          file=sys.stderr)
    rss, hwm = rss_kb(daemon.pid)
    figures["sync_rss_peak_mb"] = round(hwm / 1024, 1)  # the daemon's VmHWM after the sync
    if kube.real is not None:
        figures["kube_rss_mb_synced"] = kube.rss()
    if plan.memory:
        churn = KubeChurn(kube.writes, plan.nodes, plan.pods, seed=17)
        await warm_up_churn(daemon, fake, churn, plan, figures)
        events, settled = await settle(daemon, plan.quiet, plan.warm_cap)
        rss, hwm = rss_kb(daemon.pid)
        figures.update({"rss_warm_mb": round(rss / 1024, 1),
                        "warm_settled": settled, "warm_events": events,
                        "warm_at_s": round(time.monotonic() - daemon.started, 1)})
        print(f"daemon: warm RSS {rss / 1024:.0f} MB (HWM {hwm / 1024:.0f} MB) after "
              f"{figures['warm_at_s']} s, {events} events folded, settled={settled}",
              file=sys.stderr)
        # Printed, not a figure: the breakdown is for reading, not for a target.
        print(f"daemon: memory at warm {json.dumps(await daemon.memory_report())}",
              file=sys.stderr)
        await churn_run(daemon, fake, churn, plan, events or 0, figures)
    figures["readyz_after"] = (await daemon.get("/readyz"))[:60]
    figures["acquire_failed"] = daemon.counts.get("leadership.acquire_failed", 0)
    figures["deposed"] = daemon.counts.get("daemon.deposed", 0)
    stopping = time.monotonic()
    figures["exit_code"] = await daemon.stop()
    figures["stop_s"] = round(time.monotonic() - stopping, 1)
    if plan.restart:
        await restart_run(daemon, kube, cluster, plan, figures)


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


async def warm_up_churn(daemon: Daemon, fake: FakeSlurmrestd, churn: KubeChurn,
                        plan: DaemonPlan, figures: dict[str, Any]) -> None:
    """Churn until the daemon has written `plan.warm_snapshots` snapshots (or the warm cap).

    Part of warming up: a snapshot's encoding is the daemon's biggest transient, and the
    RSS it leaves (freed memory the allocator keeps) stays for the daemon's life, so a
    "warm" figure taken before the first snapshots measures a daemon that has not yet done
    all it does. At 2,000 nodes: 182 MB before, 228-233 MB from the second snapshot on,
    flat from 58,000 to 178,000 churn events (docs/performance.md, "Scale")."""
    if plan.warm_snapshots <= 0:
        return
    fake.cluster.set_busy(0.5, time.time())
    fake.churn_per_poll = plan.churn_per_poll
    target = daemon.counts.get("engine.snapshot", 0) + plan.warm_snapshots
    started = time.monotonic()
    while (daemon.counts.get("engine.snapshot", 0) < target
           and time.monotonic() - started < plan.warm_cap):
        await churn.step(plan.pod_churn_per_s, 0)
        await asyncio.sleep(1.0)
    fake.churn_per_poll = 0
    figures["warm_churn_s"] = round(time.monotonic() - started, 1)
    figures["warm_snapshots"] = daemon.counts.get("engine.snapshot", 0)
    print(f"daemon: warm-up churn {figures['warm_churn_s']} s, "
          f"{figures['warm_snapshots']} snapshots written", file=sys.stderr)


async def churn_run(daemon: Daemon, fake: FakeSlurmrestd, churn: KubeChurn,
                    plan: DaemonPlan, warm_events: int, figures: dict[str, Any]) -> None:
    fake.cluster.set_busy(0.5, time.time())  # half the nodes busy: jobs to end and start
    fake.churn_per_poll = plan.churn_per_poll
    started = time.monotonic()
    count = warm_events
    samples: list[int] = []
    moved_at = time.monotonic()
    stalled = False
    while time.monotonic() - started < plan.churn_cap:
        await churn.step(plan.pod_churn_per_s, 0)
        await asyncio.sleep(1.0)
        folded = await daemon.events_folded()
        if folded is not None and folded != count:
            count, moved_at = folded, time.monotonic()
        if time.monotonic() - moved_at > 60:  # e.g. no longer leader: nothing is appended
            stalled = True
            break
        if len(samples) % 10 == 0:
            rss, _ = rss_kb(daemon.pid)
            print(f"daemon: churn t={time.monotonic() - started:.0f}s events "
                  f"{count - warm_events:,} rss {rss / 1024:.0f} MB "
                  f"readyz {(await daemon.get('/readyz'))[:30]!r}", file=sys.stderr)
        samples.append(count)
        if count - warm_events >= plan.churn_events:
            break
    fake.churn_per_poll = 0
    churn_s = time.monotonic() - started
    # The same quiet window and cap as the warm point: both figures are of a daemon at rest.
    events, settled = await settle(daemon, plan.quiet, plan.warm_cap)
    rss, hwm = rss_kb(daemon.pid)
    churned = (events or count) - warm_events
    figures.update({
        "churn_events": churned, "churn_s": round(churn_s, 1),
        "churn_events_per_s": round(churned / max(churn_s, 1e-9)),
        "rss_after_churn_mb": round(rss / 1024, 1), "rss_peak_mb": round(hwm / 1024, 1),
        "rss_growth_pct": round((rss / 1024 / figures["rss_warm_mb"] - 1) * 100, 1),
        "after_settled": settled, "churn_stalled": stalled})
    print(f"daemon: after {churned:,} churn events in {churn_s:.0f}s: RSS {rss / 1024:.0f} MB "
          f"(peak {hwm / 1024:.0f} MB)", file=sys.stderr)
    print(f"daemon: memory after churn {json.dumps(await daemon.memory_report())}",
          file=sys.stderr)
    if plan.trace:
        top = await daemon.tracemalloc_top()
        print("daemon: tracemalloc top allocation sites (after churn):\n" + top, file=sys.stderr)


class _PastLog(EventLog):
    """An EventLog whose appends are stamped with `clock` (seeding a simulated past)."""

    clock: datetime = datetime(2026, 1, 1, tzinfo=UTC)

    async def _lock_for_append(self, connection: Any) -> tuple[int, int, datetime]:
        epoch, last_seq, _now = await super()._lock_for_append(connection)
        return epoch, last_seq, self.clock

    async def _db_now(self, connection: Any) -> datetime:
        return self.clock


async def seed_history(url: str, days: float, changes_per_node_hour: float,
                       seed: int = 18) -> dict[str, Any]:
    """Append `days` of simulated history to the log the first sync left, then a snapshot
    of its fold and a 500-event tail. Every Slurm change is a pair that returns to the
    node's last observation, every lend is followed by its reclaim, so the world the
    sources see afterwards still matches the log."""
    started = time.perf_counter()
    event_log = await _PastLog.open(url, migrate=False)
    assert isinstance(event_log, _PastLog)
    try:
        state, _ = await load_state(event_log)
        pools: dict[str, str] = {}
        position = 0
        while page := await event_log.read(position, 5000, kinds=["transition.started"]):
            for recorded in page:
                payload = recorded.payload
                if isinstance(payload, TransitionStarted) and payload.pool:
                    pools[payload.node] = payload.pool
            position = page[-1].seq
        observed: dict[str, SlurmNodeObserved] = {
            name: node.slurm for name, node in state.nodes.items()
            if node.slurm is not None and name in pools}
        names = sorted(observed)
        lease = await event_log.acquire("bench-scale-seeder", 3600)
        assert lease is not None, "the log's lease is held: is a daemon still running?"
        rng = random.Random(seed)
        start = datetime.now(UTC) - timedelta(days=days)
        hours = int(days * 24)
        pairs = Carry(changes_per_node_hour / 2 * len(names))
        cycles = Carry(len(names) / 72)  # one lend + reclaim per node every 3 days
        appended = 0
        cycle_id = 0

        async def append(events: list[Event], at: datetime) -> None:
            nonlocal state, appended
            event_log.clock = at
            for i in range(0, len(events), 5000):
                chunk = events[i:i + 5000]
                seqs = await event_log.append(chunk, lease.epoch)
                state = fold([RecordedEvent(seq, at, lease.epoch, e.subject, e.payload)
                              for seq, e in zip(seqs, chunk, strict=True)], state)
                appended += len(chunk)

        def pair(name: str) -> list[Event]:
            last = observed[name]
            busy = dataclasses.replace(last, state="ALLOCATED", alloc_cpus=last.cpus)
            return [Event(name, busy), Event(name, last)]

        def cycle(name: str) -> list[Event]:
            nonlocal cycle_id
            cycle_id += 1
            pool, out = pools[name], []
            for tid, src, dst, verbs in (
                    (f"h-lend-{cycle_id}", "slurm", "kubernetes",
                     (("slurm", "drain"), ("kubernetes", "unlock"))),
                    (f"h-reclaim-{cycle_id}", "kubernetes", "slurm",
                     (("kubernetes", "lock"), ("slurm", "resume")))):
                out.append(Event(name, TransitionStarted(
                    transition_id=tid, node=name, pool=pool, from_owner=src, to_owner=dst,
                    reason="simulated history")))
                for side, verb in verbs:
                    aid = f"{tid}-{verb}"
                    out.append(Event(name, ActionRequested(
                        action_id=aid, transition_id=tid, side=side, verb=verb, node=name,
                        reason="simulated history")))
                    out.append(Event(name, ActionSucceeded(
                        action_id=aid, transition_id=tid, side=side, verb=verb, node=name)))
                out.append(Event(name, TransitionCompleted(
                    transition_id=tid, node=name, pool=pool, from_owner=src, to_owner=dst,
                    reason="simulated history")))
            return out

        for hour in range(hours):
            at = start + timedelta(hours=hour)
            hourly: list[Event] = []
            for _ in range(pairs.take()):
                hourly.extend(pair(rng.choice(names)))
            for _ in range(cycles.take()):
                hourly.extend(cycle(rng.choice(names)))
            await append(hourly, at)
        at = datetime.now(UTC) - timedelta(minutes=5)
        body = state_to_json(state)
        await event_log.save_snapshot(state.last_seq, body)
        snapshot_bytes = len(json.dumps(body))
        tail: list[Event] = []
        while len(tail) < 500:
            tail.extend(pair(rng.choice(names)))
        await append(tail, at)
        await event_log.release(lease)
    finally:
        await event_log.close()
    return {"history_events": appended, "history_seed_s": round(time.perf_counter() - started, 1),
            "snapshot_bytes": snapshot_bytes, "history_last_seq": state.last_seq}


async def restart_run(daemon: Daemon, kube: Kube, cluster: Cluster, plan: DaemonPlan,
                      figures: dict[str, Any]) -> None:
    assert kube.writes is not None
    seeded = await seed_history(daemon.env["SUNKD_DATABASE_URL"], plan.history_days,
                                plan.history_changes)
    figures.update(seeded)
    db = daemon.workdir / "sunkd.db"
    figures["history_db_mb"] = round(sum(p.stat().st_size for p in db.parent.glob("sunkd.db*"))
                                     / 2**20, 1)
    print(f"restart: seeded {seeded['history_events']:,} events ({plan.history_days:g} days) in "
          f"{seeded['history_seed_s']}s; database {figures['history_db_mb']} MB, snapshot "
          f"{seeded['snapshot_bytes']:,} bytes", file=sys.stderr)
    for i in range(plan.nodes, plan.nodes + NEW_NODES):  # something new to decide about
        await kube.writes.create(node_object(i))
        cluster.add_node(i)
    daemon.env["SUNKD_SLURM_POLL_INTERVAL"] = str(plan.poll)
    figures["restart_poll_s"] = plan.poll
    await daemon.start()
    first = await daemon.wait_for("engine.decision", plan.sync_cap)
    figures["restart_s"] = _rounded(first)
    figures["restart_rss_peak_mb"] = round(rss_kb(daemon.pid)[1] / 1024, 1)
    figures["restart_loaded_s"] = _rounded(daemon.first.get("engine.loaded"))
    figures["restart_leading_s"] = _rounded(daemon.first.get("daemon.leading"))
    print(f"restart: engine.loaded after {figures['restart_loaded_s']} s, leading after "
          f"{figures['restart_leading_s']} s, first decision after {figures['restart_s']} s",
          file=sys.stderr)
    await daemon.stop()


# ---------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", nargs="?", default="all",
                        choices=("all", "log", "memory", "sync", "restart", "daemon"))
    parser.add_argument("--quick", action="store_true",
                        help="200 nodes / 2,000 pods, short windows (under 60 s)")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="log: simulated 5 s polls per busy level (full: 720 = 1 h)")
    parser.add_argument("--busy", type=float, nargs=2, default=(0.2, 0.6),
                        help="log: the two busy fractions")
    parser.add_argument("--job-changes", type=float, default=2.0, help="per node-hour")
    parser.add_argument("--pod-churn", type=float, default=1.0, help="per node-hour")
    parser.add_argument("--flaps", type=float, default=0.02, help="per node-hour")
    parser.add_argument("--churn-events", type=int, default=None,
                        help="memory: events to append in the churn run (full: 1,000,000)")
    parser.add_argument("--churn-cap", type=float, default=None, help="memory: seconds at most")
    parser.add_argument("--churn-per-poll", type=int, default=None,
                        help="memory: Slurm node changes per GET /nodes (1 s polls)")
    parser.add_argument("--history-days", type=float, default=30.0)
    parser.add_argument("--warm-snapshots", type=int, default=2,
                        help="memory: snapshots the warm-up churn waits for (0: none)")
    parser.add_argument("--history-changes", type=float, default=None,
                        help="restart: Slurm changes per node-hour in the history (full: 2)")
    parser.add_argument("--poll", type=float, default=SlurmSettings().poll_interval,
                        help="Slurm poll interval (s) of a daemon that does not churn "
                             "(default: sunkd's)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="memory: run the daemon under tracemalloc, print top sites")
    parser.add_argument("--memstats", action="store_true",
                        help="memory: the daemon reports mallinfo2, pymalloc blocks and "
                             "tracked objects by type at warm and after the churn")
    parser.add_argument("--keep", action="store_true", help="keep the daemon's temp directory")
    parser.add_argument("--real-apiserver", action="store_true",
                        help="daemon phases: the real kube-apiserver + etcd "
                             "(sunkd_testbed.kubernetes) instead of the emulator")
    parser.add_argument("--concurrency", type=int, default=48,
                        help="--real-apiserver: population requests in flight")
    args = parser.parse_args(argv)
    if args.real_apiserver:
        from sunkd_testbed.kubernetes import available

        ok, why = available()
        if not ok:
            print(f"--real-apiserver: {why}", file=sys.stderr)
            return 2
    quick = args.quick
    nodes = args.nodes or (200 if quick else 10_000)
    pods = args.pods or (2_000 if quick else 100_000)
    if quick:
        print(f"--quick: {nodes} nodes, {pods} pods (full: 10,000 nodes, 100,000 pods)")
    started = time.perf_counter()
    figures: dict[str, Any] = {"nodes": nodes, "pods": pods, "quick": quick}
    targets: dict[str, Any] = {}
    if args.phase in ("all", "log"):
        steps = args.steps or (60 if quick else 720)
        rates = Rates(args.job_changes, args.pod_churn, args.flaps)
        measured = asyncio.run(log_growth(nodes, pods, steps, tuple(args.busy), rates))
        figures.update({f"log_{k}": v for k, v in measured.items()})
        figures["log_churn_model"] = dataclasses.asdict(rates)
        targets["log_bytes_per_node_change"] = {
            "value": measured["high_bytes_per_node_change"], "target": 1024, "better": "lower"}
        targets["log_max_event_growth"] = {
            "value": measured["max_event_growth"], "target": 1.1, "better": "lower"}
    if args.phase in ("all", "memory", "sync", "restart", "daemon"):
        memory = args.phase in ("all", "memory", "daemon")
        plan = DaemonPlan(
            nodes=nodes, pods=pods, sync_cap=60.0 if quick else 900.0,
            warm_cap=6.0 if quick else 300.0, quiet=3.0 if quick else 6.0,
            churn_events=args.churn_events or (20_000 if quick else 1_000_000),
            churn_cap=args.churn_cap or (6.0 if quick else 1800.0),
            churn_per_poll=args.churn_per_poll or (nodes // 2 if quick else 5_000),
            pod_churn_per_s=max(1, nodes // 100), history_days=args.history_days,
            warm_snapshots=args.warm_snapshots,
            history_changes=args.history_changes or (0.2 if quick else 2.0), poll=args.poll,
            memory=memory, restart=args.phase in ("all", "restart", "daemon"),
            trace=args.tracemalloc, memstats=args.memstats, keep=args.keep,
            real=args.real_apiserver,
            concurrency=args.concurrency)
        measured = asyncio.run(daemon_phases(plan))
        figures.update(measured)
        if measured.get("first_sync_s") is not None or args.phase in ("all", "sync"):
            targets["first_sync_s"] = {"value": measured.get("first_sync_s"), "target": 30,
                                       "better": "lower"}
        if memory and "rss_warm_mb" in measured:
            targets["rss_warm_mb"] = {"value": measured["rss_warm_mb"], "target": RSS_TARGET_MB,
                                      "better": "lower"}
            if "rss_after_churn_mb" in measured:
                targets["rss_after_churn_mb"] = {"value": measured["rss_after_churn_mb"],
                                                 "target": RSS_TARGET_MB,
                                                 "better": "lower"}
                targets["rss_growth_pct"] = {"value": measured["rss_growth_pct"], "target": 5,
                                             "better": "lower"}
        if plan.restart and "restart_s" in measured:
            targets["restart_s"] = {"value": measured["restart_s"], "target": 15,
                                    "better": "lower"}
    figures["total_seconds"] = round(time.perf_counter() - started, 1)
    for key, value in figures.items():
        print(f"{key:>32}: {value}")
    print(json.dumps({"benchmark": "scale", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
