"""`sunkd demo`: the whole system on one machine, on embedded defaults.

What runs:
  * a real Slurm cluster from Debian's packages (sunkd_testbed.slurm): slurmctld,
    one slurmd per node, slurmrestd on a unix socket;
  * the Kubernetes API emulator (sunkd_testbed.kubeapi; not a real API server) with one
    Node per Slurm node, the Nodeset CRD and a Nodeset for the pool, and a PDB;
  * sunkd itself (`Daemon`, exactly what `sunkd run` runs) on an SQLite log
    (`SUNKD_DATABASE_URL`, default ./sunkd.db) serving HTTP on --listen;
  * a workload generator that alternates demand: an inference "deployment" whose pods
    want whole nodes, then Slurm batch jobs that want them back;
  * a stand-in for kube-scheduler and kubelet (the emulator has neither): it binds
    pending pool pods to schedulable, untainted nodes and marks them Running. It is
    demo scaffolding, deliberately simple (one pool pod per node).

The summary (and `--summary-json`) is computed from the event log plus the times the
generator created its stimuli: reaction = stimulus -> first resulting action on the
other side (pods created -> Slurm drain; jobs submitted -> Kubernetes taint).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
import yaml

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionFailed,
    ActionSucceeded,
    RecordedEvent,
    TransitionAborted,
    TransitionCompleted,
)
from sunkd.domain.ownership import assess, slurm_state_text
from sunkd.domain.state import ClusterState
from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings, parse_listen

log = structlog.get_logger(__name__)

POOL_LABEL = wk.LABEL_POOL
POOL = "gpu-a"
PARTITION = "gpu"
APP_LABEL = "app"
APP = "inference"
NAMESPACE = "default"
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


@dataclass
class Stimuli:
    """When the generator created demand on each side (wall clock)."""

    pods_created: list[float] = field(default_factory=list)
    jobs_submitted: list[float] = field(default_factory=list)


def node_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {POOL_LABEL: POOL,
                                               "kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
        },
    }


def nodeset_object(name: str = POOL, **ownership: Any) -> dict[str, Any]:
    """The pool's Nodeset: its nodes by label, Slurm partition and inference pods;
    `ownership` knobs (CRD spelling) over Auto mode with no minimums, Slurm preferred."""
    return {
        "apiVersion": wk.API_VERSION, "kind": "Nodeset",
        "metadata": {"name": name, "namespace": "sunkd"},
        "spec": {
            "nodeSelector": {POOL_LABEL: POOL},
            "slurm": {"partitions": [PARTITION]},
            "workloadSelector": {"matchLabels": {APP_LABEL: APP}},
            "ownership": {"mode": "Auto", "minSlurm": 0, "minKubernetes": 0,
                          "prefer": "Slurm", **ownership},
        },
    }


def populate(emulator: Any, node_names: Sequence[str], nodeset: dict[str, Any]) -> None:
    """What a cluster with sunkd installed has: the namespace, the Nodeset CRD, one
    Ready Node per Slurm node, and the pool's Nodeset."""
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sunkd"}})
    emulator.create(yaml.safe_load((MANIFESTS / "crds" / "nodeset.yaml").read_text()))
    for name in node_names:
        emulator.create(node_object(name))
    emulator.create(nodeset)


def pod_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {APP_LABEL: APP}},
        "spec": {"containers": [{"name": "server", "image": "inference:demo",
                                 "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]},
        "status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/N nodes are available: node(s) had untolerated taint "
                       "{sunkd.io/owner: slurm}"}]},
    }


class KubeStandIn:
    """Binds pending pool pods like kube-scheduler would (and marks them Running like a
    kubelet would): a node qualifies when Ready, not cordoned, without NoSchedule or
    NoExecute taints, and not already running a pool pod."""

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator

    def schedulable_nodes(self) -> list[str]:
        busy = {pod["spec"].get("nodeName") for pod in self.pool_pods()}
        names = []
        for node in self.emulator.list("nodes"):
            spec, status = node.get("spec") or {}, node.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
            tainted = any(t.get("effect") in ("NoSchedule", "NoExecute")
                          for t in spec.get("taints") or [])
            name = node["metadata"]["name"]
            if ready and not spec.get("unschedulable") and not tainted and name not in busy:
                names.append(name)
        return sorted(names)

    def pool_pods(self) -> list[dict[str, Any]]:
        return [pod for pod in self.emulator.list("pods", NAMESPACE,
                                                  label_selector=f"{APP_LABEL}={APP}")
                if not pod["metadata"].get("deletionTimestamp")]

    def step(self) -> int:
        free = self.schedulable_nodes()
        bound = 0
        for pod in self.pool_pods():
            if pod["spec"].get("nodeName") or not free:
                continue
            node = free.pop(0)
            name = pod["metadata"]["name"]
            self.emulator.patch("pods", name, {"spec": {"nodeName": node}}, NAMESPACE)
            self.emulator.patch("pods", name, {"status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"}]}}, NAMESPACE, subresource="status")
            bound += 1
        return bound


class Generator:
    """Alternating demand. Phase "kubernetes": the inference deployment wants half the
    nodes. Phase "slurm": it scales to zero and batch jobs want every node."""

    def __init__(self, emulator: Any, cluster: Any, node_count: int, phase_seconds: float,
                 stimuli: Stimuli) -> None:
        self.emulator = emulator
        self.cluster = cluster
        self.node_count = node_count
        self.phase_seconds = phase_seconds
        self.stimuli = stimuli
        self.stand_in = KubeStandIn(emulator)
        self.replicas = 0
        self.phase = "start"

    def reconcile_pods(self) -> None:
        pods = self.stand_in.pool_pods()
        for _ in range(self.replicas - len(pods)):
            self.emulator.create(pod_object(f"{APP}-{uuid.uuid4().hex[:6]}"), NAMESPACE)
        for pod in pods[self.replicas:]:
            with contextlib.suppress(Exception):
                self.emulator.delete("pods", pod["metadata"]["name"], NAMESPACE)

    async def reconcile(self) -> None:
        """Make the pool pods match `replicas` and let them run (the stand-in)."""
        self.reconcile_pods()
        self.stand_in.step()

    def pods_on(self) -> dict[str, str]:
        """Node -> the pool pod bound to it."""
        return {pod["spec"]["nodeName"]: pod["metadata"]["name"]
                for pod in self.stand_in.pool_pods() if pod["spec"].get("nodeName")}

    async def run(self, stop: asyncio.Event) -> None:
        # A busy node from the start: it is lent only after its job ends.
        await asyncio.to_thread(self.cluster.sbatch, "-N1", "--exclusive",
                                wrap=f"sleep {int(self.phase_seconds * 0.8)}",
                                partition=PARTITION)
        phase_started = -1e9
        while not stop.is_set():
            now = time.time()
            if now - phase_started >= self.phase_seconds:
                phase_started = now
                if self.phase != "kubernetes":
                    self.phase = "kubernetes"
                    self.replicas = max(1, self.node_count // 2)
                    self.stimuli.pods_created.append(now)
                else:
                    self.phase = "slurm"
                    self.replicas = 0
                    self.stimuli.jobs_submitted.append(now)
                    for _ in range(self.node_count):
                        await asyncio.to_thread(
                            self.cluster.sbatch, "-N1", "--exclusive",
                            wrap=f"sleep {int(self.phase_seconds * 0.5)}", partition=PARTITION)
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()


# ---------------------------------------------------------------------- summary


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return round(ordered[index], 1)


def summarize(events: list[RecordedEvent], stimuli: Stimuli, poll_interval: float,
              duration: float) -> dict[str, Any]:
    lent = reclaimed = aborted = actions_failed = actions_succeeded = 0
    lend_seconds: list[float] = []
    reclaim_seconds: list[float] = []
    started_at: dict[str, float] = {}
    drains: list[float] = []
    locks: list[float] = []
    for event in events:
        payload = event.payload
        at = event.recorded_at.timestamp()
        if payload.kind == "transition.started":
            started_at[getattr(payload, "transition_id", "")] = at
        if isinstance(payload, TransitionCompleted):
            began = started_at.get(payload.transition_id)
            if payload.from_owner == "slurm" and payload.to_owner == "kubernetes":
                lent += 1
                if began is not None:
                    lend_seconds.append(at - began)
            elif payload.from_owner == "kubernetes" and payload.to_owner == "slurm":
                reclaimed += 1
                if began is not None:
                    reclaim_seconds.append(at - began)
        elif isinstance(payload, TransitionAborted):
            aborted += 1
        elif isinstance(payload, ActionFailed):
            actions_failed += 1
        elif isinstance(payload, ActionSucceeded):
            actions_succeeded += 1
            if payload.side == "slurm" and payload.verb == "drain" and payload.changed:
                drains.append(at)
            if payload.side == "kubernetes" and payload.verb == "lock" and payload.changed \
                    and payload.transition_id is not None:
                locks.append(at)

    def reactions(stimuli_times: list[float], responses: list[float]) -> list[float]:
        out = []
        for moment in stimuli_times:
            later = [r for r in responses if r >= moment]
            if later:
                out.append((min(later) - moment) * 1000)
        return out

    k8s_to_slurm = reactions(stimuli.pods_created, drains)
    slurm_to_k8s = reactions(stimuli.jobs_submitted, locks)
    return {
        "duration_s": round(duration, 1),
        "slurm_poll_interval_s": poll_interval,
        "lent": lent,
        "reclaimed": reclaimed,
        "aborted": aborted,
        "actions_succeeded": actions_succeeded,
        "actions_failed": actions_failed,
        "time_to_lend_s": {"p50": _percentile(lend_seconds, 0.5),
                           "p99": _percentile(lend_seconds, 0.99)},
        "time_to_reclaim_s": {"p50": _percentile(reclaim_seconds, 0.5),
                              "p99": _percentile(reclaim_seconds, 0.99)},
        "reaction_ms": {
            "kubernetes_to_slurm": {"p50": _percentile(k8s_to_slurm, 0.5),
                                    "p99": _percentile(k8s_to_slurm, 0.99),
                                    "samples": len(k8s_to_slurm)},
            "slurm_to_kubernetes": {"p50": _percentile(slurm_to_k8s, 0.5),
                                    "p99": _percentile(slurm_to_k8s, 0.99),
                                    "samples": len(slurm_to_k8s)},
        },
        "events": len(events),
    }


def render_table(state: ClusterState, generator: Generator, elapsed: float,
                 duration: float | None) -> str:
    now = time.time()
    lines = [f"sunkd demo  t={elapsed:5.0f}s{'/' + str(int(duration)) + 's' if duration else ''}"
             f"  demand phase: {generator.phase}  inference replicas: {generator.replicas}"
             f"  log seq: {state.last_seq}",
             f"{'NODE':<12}{'OWNER':<12}{'PHASE':<12}{'SLURM':<26}{'KUBERNETES':<22}NOTE"]
    pods_on = generator.pods_on()
    for name in sorted(state.nodes):
        node = state.nodes[name]
        phase = assess(state, node, now).phase if node.slurm and node.k8s else node.phase
        slurm = slurm_state_text(node.slurm)
        k8s = "-"
        if node.k8s is not None:
            tainted = any(t.key == wk.TAINT_OWNER for t in node.k8s.taints)
            k8s = ("tainted" if tainted else "open") + (
                f" pod {pods_on[node.k8s.node][-6:]}" if node.k8s.node in pods_on else "")
        note = node.transition.reason[:40] if node.transition else ""
        lines.append(f"{name:<12}{node.owner:<12}{phase!s:<12}{slurm:<26}{k8s:<22}{note}")
    return "\n".join(lines)


# -------------------------------------------------------------------------- main


def set_aside_previous_log(database_url: str) -> None:
    """Each demo starts a new cluster, so it starts a new log: an earlier demo's SQLite
    log is renamed (never deleted) so `sunkd status` shows this run."""
    from sunkd.store.eventlog import sqlite_path

    database = sqlite_path(database_url)
    if database is None:
        return
    path = Path(database)
    if not path.exists():
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        old = Path(f"{path}{suffix}")
        if old.exists():
            old.rename(f"{path}.previous-{stamp}{suffix}")
    print(f"an earlier demo's log was kept as {path}.previous-{stamp}", flush=True)



async def run_demo(settings: Settings, *, duration: float | None, node_count: int,
                   summary_json: Path | None, listen: str | None,
                   phase_seconds: float = 30.0) -> int:
    from sunkd.kubernetes.client import KubeClient
    from sunkd.runtime.daemon import Daemon
    from sunkd.slurm.client import SlurmRestClient
    from sunkd_testbed.kubeapi import KubeAPIEmulator
    from sunkd_testbed.slurm import SlurmCluster

    if node_count < 2:
        print("sunkd demo: --nodes must be at least 2", file=sys.stderr)
        return 2
    poll_interval = 2.0
    set_aside_previous_log(settings.database_url)
    hostlist = f"gpu-a[001-{node_count:03d}]"
    print(f"starting a real Slurm cluster ({hostlist}), the Kubernetes API emulator and "
          f"sunkd on {settings.database_url} ...", flush=True)
    cluster = SlurmCluster(hostlist, partitions={PARTITION: hostlist})
    await asyncio.to_thread(cluster.start)
    emulator = KubeAPIEmulator()
    await emulator.start()
    kube_client = None
    slurm_client = None
    stop = asyncio.Event()
    try:
        populate(emulator, cluster.node_names, nodeset_object(
            maxKubernetes=node_count, dwellSeconds=5.0, maxInFlight=max(1, node_count // 2),
            drainTimeoutSeconds=60, reclaimGraceSeconds=10))
        emulator.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                         "metadata": {"name": APP, "namespace": NAMESPACE},
                         "spec": {"maxUnavailable": 1,
                                  "selector": {"matchLabels": {APP_LABEL: APP}}}})
        kubeconfig = Path("sunkd-demo.kubeconfig").resolve()
        emulator.write_kubeconfig(kubeconfig)

        daemon_settings = replace(
            settings,
            listen=listen or settings.listen,
            slurm=SlurmSettings(url=cluster.rest_unix_url, user="root",
                                poll_interval=poll_interval),
            kubernetes=KubernetesSettings(enabled=True, namespace="sunkd"),
        )
        parse_listen(daemon_settings.listen)
        slurm_client = SlurmRestClient.from_settings(daemon_settings.slurm)
        kube_client = KubeClient.for_url(emulator.url)
        daemon = Daemon(daemon_settings, slurm_client=slurm_client, kube_client=kube_client,
                        slurm_env=cluster.env)
        stimuli = Stimuli()
        generator = Generator(emulator, cluster, node_count, phase_seconds, stimuli)
        daemon_task = asyncio.create_task(daemon.run(), name="sunkd-daemon")
        # Let sunkd adopt the nodes before demand starts.
        await asyncio.sleep(poll_interval * 2)
        generator_task = asyncio.create_task(generator.run(stop), name="sunkd-demo-load")
        started = time.time()
        host = parse_listen(daemon_settings.listen)[0]
        print(f"sunkd serves http://{host}:{daemon.http_port}/ ; kubectl --kubeconfig "
              f"{kubeconfig} get nodes,nds -A", flush=True)
        interactive = sys.stdout.isatty()
        last_print = 0.0
        while duration is None or time.time() - started < duration:
            if daemon_task.done():
                break
            elapsed = time.time() - started
            if interactive:
                table = render_table(daemon.state(), generator, elapsed, duration)
                sys.stdout.write("\x1b[H\x1b[2J" + table + "\n")
                sys.stdout.flush()
            elif time.time() - last_print >= 10:
                last_print = time.time()
                print(render_table(daemon.state(), generator, elapsed, duration), flush=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(daemon_task)
        stop.set()
        await generator_task
        daemon.stop_event.set()
        exit_code = await daemon_task
        elapsed = time.time() - started
        from sunkd.store.eventlog import EventLog

        event_log = await EventLog.open(settings.database_url)
        try:
            everything = [event async for batch in event_log.read_range()
                          for event in batch]
        finally:
            await event_log.close()
        summary = summarize(everything, stimuli, poll_interval, elapsed)
        print(render_table(daemon.state(), generator, elapsed, duration))
        print("\nsummary:")
        print(json.dumps(summary, indent=2))
        if summary_json is not None:
            summary_json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nthe log stays in {settings.database_url}: try `sunkd status`, "
              "`sunkd history gpu-a001`, `sunkd replay --check`")
        return exit_code
    finally:
        stop.set()
        if slurm_client is not None:
            with contextlib.suppress(Exception):
                await slurm_client.close()
        if kube_client is not None:
            with contextlib.suppress(Exception):
                await kube_client.close()
        await emulator.stop()
        await asyncio.to_thread(cluster.stop)


def cmd_demo(args: Any, settings: Settings) -> int:
    # The demo's own output is the live table; keep the logs to warnings.
    from sunkd.runtime.logs import configure_logging

    configure_logging(os.environ.get("SUNKD_LOG_LEVEL", "warning"), settings.log_format)
    try:
        if getattr(args, "slurmd_pods", False):
            from sunkd_testbed.demopods import run_pods_demo

            return asyncio.run(run_pods_demo(
                settings, duration=args.duration, node_count=args.nodes or 3,
                summary_json=args.summary_json, listen=args.listen,
                phase_seconds=args.phase_seconds))
        return asyncio.run(run_demo(settings, duration=args.duration,
                                    node_count=args.nodes or 4,
                                    summary_json=args.summary_json, listen=args.listen,
                                    phase_seconds=args.phase_seconds))
    except KeyboardInterrupt:
        return 130


__all__ = ["cmd_demo", "run_demo", "statistics", "summarize"]
