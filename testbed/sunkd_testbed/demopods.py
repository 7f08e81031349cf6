"""`sunkd demo --slurmd-pods`: the demo's story on real pods, where ownership is physical.

What runs (all on this machine, as root):
  * the real Kubernetes control plane (sunkd_testbed.kubernetes: etcd, kube-apiserver,
    controller-manager, scheduler) and N real kubelet Nodes, each with its own containerd
    (sunkd_testbed.kubelet), the bed tests/integration/test_slurmd_daemon_real.py runs;
  * the host's Slurm 22.05 slurmctld and slurmrestd (sunkd_testbed.slurm), whose slurm.conf
    has what a Static Nodeset needs (sunkd_testbed.slurmdpods); the host's slurmds are
    stopped once it is up: the Nodeset's slurmd pods take over;
  * the pool's Nodeset with `spec.slurmd` (22.05's slurmd image, made locally), and sunkd
    (`Daemon`, what `sunkd run` runs) on an SQLite log, serving HTTP on --listen;
  * the demo's demand generator: inference pods (a static busybox, one per Node) that the
    real scheduler places on untainted Nodes, then Slurm batch jobs that want every node.

Measured (the summary, `--summary-json`): the time from the Nodeset's apply to N slurmd
nodes registered (IDLE through a slurmd started after the apply, its pod Running); for
each lend, decision (transition.started in the log) -> the node's slurmd pod gone from the
API server -> the owner taint off; for each reclaim, decision -> the new pod Running and
its slurmd registered (a SlurmdStartTime after the decision, in contact) -> undrained (no
DRAIN, no DOWN). Those come from a sampler that reads the API server and
`scontrol -o show node` every SAMPLE_SECONDS (each figure is late by at most about one
sample). Memory: VmRSS from /proc/PID/status of each kubelet, its containerd and that
containerd's shims, and of each slurmd pod's slurmd process (sunkd_testbed.slurmdpods).

Everything started is stopped on exit and on Ctrl-C, in reverse order: sunkd, then the
kubelet Nodes (their pods deleted and waited for, kubelets, containerds and shims stopped,
mounts and cgroups removed, the host lock released), Slurm, the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.events import RecordedEvent, TransitionCompleted, TransitionStarted
from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings, parse_listen
from sunkd_testbed.demo import (
    APP,
    APP_LABEL,
    MANIFESTS,
    PARTITION,
    POOL,
    POOL_LABEL,
    Generator,
    Stimuli,
    nodeset_object,
    render_table,
    set_aside_previous_log,
    summarize,
)
from sunkd_testbed.slurmdpods import SlurmView

NAMESPACE = "default"
SLURM_VERSION = "22.05"  # the host's slurmctld; the image's slurmd is the same release
SAMPLE_SECONDS = 0.25
NEEDS = ("make demo DEMO_ARGS=--slurmd-pods builds what is missing: scripts/build-kubernetes.sh, "
         "scripts/build-kubelet.sh, scripts/prepare-slurm-root.sh bookworm")


def pool_pod(name: str, image: str) -> dict[str, Any]:
    """An inference pod: the busybox image sleeping, on the host network (the Nodes have no
    pod network), one per Node (anti-affinity), gone 1 s after a delete or an eviction."""
    from sunkd_testbed.kubelet import host_network_pod

    pod = host_network_pod(name, image, ["sleep", "1000000"], labels={APP_LABEL: APP})
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    pod["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {APP_LABEL: APP}},
            "topologyKey": "kubernetes.io/hostname"}]}}
    return pod


class PodGenerator(Generator):
    """The demo's alternating demand on the real API server: the real scheduler and
    kubelets run the inference pods (no stand-in)."""

    def __init__(self, client: Any, cluster: Any, node_count: int, phase_seconds: float,
                 stimuli: Stimuli, image: str) -> None:
        super().__init__(None, cluster, node_count, phase_seconds, stimuli)
        self.client = client
        self.image = image
        self._pods: list[dict[str, Any]] = []
        self._made = 0

    async def reconcile(self) -> None:
        from sunkd.kubernetes.client import PODS, KubeApiError

        items, _ = await self.client.list(PODS, namespace=NAMESPACE,
                                          label_selector=f"{APP_LABEL}={APP}")
        pods = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        for _ in range(self.replicas - len(pods)):
            self._made += 1
            await self.client.create(PODS, pool_pod(f"{APP}-{self._made}", self.image),
                                     NAMESPACE)
        for pod in pods[self.replicas:]:
            with contextlib.suppress(KubeApiError):
                await self.client.delete(PODS, pod["metadata"]["name"], NAMESPACE)
        self._pods = pods

    def pods_on(self) -> dict[str, str]:
        return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in self._pods
                if p["spec"].get("nodeName")}


@dataclass(frozen=True)
class NodeSample:
    pod: str | None  # the slurmd pod's phase, "Terminating", or None (no pod object)
    tainted: bool  # sunkd's owner taint on the Node
    slurm: SlurmView | None


class Sampler:
    """Both sides every SAMPLE_SECONDS: each Slurm node's slurmd pod, owner taint, and
    Slurm state (wall-clock times, taken when a sample's reads are done)."""

    def __init__(self, client: Any, cluster: Any, k8s: dict[str, str]) -> None:
        self.client = client
        self.cluster = cluster
        self.k8s = k8s  # Slurm node -> Kubernetes Node
        self.samples: list[tuple[float, dict[str, NodeSample]]] = []

    async def sample(self) -> dict[str, NodeSample]:
        from sunkd.kubernetes.client import NODES, PODS
        from sunkd_testbed.slurmdpods import slurm_nodes

        pods, _ = await self.client.list(PODS, namespace=NAMESPACE,
                                         label_selector=f"{wk.LABEL_SLURMD_NODESET}={POOL}")
        nodes, _ = await self.client.list(NODES, label_selector=f"{POOL_LABEL}={POOL}")
        slurm = await asyncio.to_thread(slurm_nodes, self.cluster)
        phase: dict[str, str] = {}
        for pod in pods:
            node = (pod["metadata"].get("annotations") or {}).get(wk.ANNOTATION_SLURMD_NODE)
            if node:
                phase[node] = ("Terminating" if pod["metadata"].get("deletionTimestamp")
                               else str((pod.get("status") or {}).get("phase") or "Pending"))
        tainted = {n["metadata"]["name"]: any(
            t.get("key") == wk.TAINT_OWNER for t in (n.get("spec") or {}).get("taints") or [])
            for n in nodes}
        now = {node: NodeSample(phase.get(node), tainted.get(k8s, False), slurm.get(node))
               for node, k8s in self.k8s.items()}
        self.samples.append((time.time(), now))
        return now

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a slow read is a missing sample, no more
                await self.sample()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SAMPLE_SECONDS):
                    await stop.wait()

    def first(self, node: str, after: float, check: Any) -> float | None:
        for at, nodes in self.samples:
            if at >= after and node in nodes and check(nodes[node]):
                return at
        return None


def registered(sample: NodeSample, since: float) -> bool:
    """The pod Running and Slurm hearing a slurmd started at or after `since`."""
    view = sample.slurm
    return (sample.pod == "Running" and view is not None and view.slurmd_started is not None
            and view.slurmd_started >= math.floor(since)
            and "NOT_RESPONDING" not in view.words)


def moves(events: list[RecordedEvent], sampler: Sampler) -> dict[str, list[dict[str, Any]]]:
    """Each completed lend and reclaim (as `summarize` counts them: not the adoption of
    a node at start), its steps in seconds from the decision."""
    started: dict[str, tuple[float, TransitionStarted]] = {}
    out: dict[str, list[dict[str, Any]]] = {"lends": [], "reclaims": []}
    for event in events:
        payload = event.payload
        at = event.recorded_at.timestamp()
        if isinstance(payload, TransitionStarted):
            started[payload.transition_id] = (at, payload)
        elif isinstance(payload, TransitionCompleted) and payload.transition_id in started:
            began, start = started[payload.transition_id]
            node = start.node

            def since(moment: float | None, began: float = began) -> float | None:
                return None if moment is None else round(moment - began, 2)

            row: dict[str, Any] = {"node": node, "completed_s": since(at)}
            if start.from_owner == wk.OWNER_SLURM and start.to_owner == wk.OWNER_KUBERNETES:
                gone = sampler.first(node, began, lambda s: s.pod is None)
                open_ = sampler.first(node, gone or began, lambda s: not s.tainted)
                row |= {"pod_gone_s": since(gone), "untainted_s": since(open_)}
                out["lends"].append(row)
            elif start.from_owner == wk.OWNER_KUBERNETES and start.to_owner == wk.OWNER_SLURM:
                up = sampler.first(node, began, lambda s, b=began: registered(s, b))
                undrained = sampler.first(node, up or began, lambda s: s.slurm is not None and
                                          not s.slurm.words & {"DRAIN", "DOWN"})
                row |= {"pod_registered_s": since(up), "undrained_s": since(undrained)}
                out["reclaims"].append(row)
    return out


def render_pods(figures: dict[str, Any]) -> str:
    lines = [f"\nslurmd pods on {figures['nodes']} real kubelet Nodes (Slurm "
             f"{figures['slurm_version']}; steps sampled every {SAMPLE_SECONDS} s):",
             f"  Nodeset apply -> {figures['nodes']} slurmd nodes registered: "
             f"{figures['apply_to_registered_s']} s"]
    for row in figures["lends"]:
        lines.append(f"  lend    {row['node']}: decision -> pod gone {row['pod_gone_s']} s "
                     f"-> untainted {row['untainted_s']} s (lent in the log "
                     f"{row['completed_s']} s)")
    for row in figures["reclaims"]:
        lines.append(f"  reclaim {row['node']}: decision -> pod registered "
                     f"{row['pod_registered_s']} s -> undrained {row['undrained_s']} s "
                     f"(reclaimed in the log {row['completed_s']} s)")
    for when, memory in figures["memory_mib"].items():
        if when == "measured":
            continue
        lines.append(f"  VmRSS MiB {when.replace('_', ' ')}:")
        for name, rss in memory["nodes"].items():
            lines.append(f"    Node {name}: kubelet {rss['kubelet']}, containerd "
                         f"{rss['containerd']}, shims {rss['shims']}")
        for node, rss in memory["slurmd"].items():
            lines.append(f"    slurmd pod of {node}: slurmd {rss}")
    return "\n".join(lines)


def _preflight() -> str | None:
    """Why the pods demo cannot start here, or None."""
    from sunkd_testbed.kubelet import available as kubelet_available
    from sunkd_testbed.kubernetes import available as plane_available
    from sunkd_testbed.slurm import available as slurm_available

    if os.geteuid() != 0:
        return ("sunkd demo --slurmd-pods needs root: it runs real kubelets and containerds "
                "(cgroups, mounts, host paths) and Slurm daemons; run it as root "
                "(`sudo make demo DEMO_ARGS=--slurmd-pods`)")
    for ok, why in (plane_available(), kubelet_available(), slurm_available(SLURM_VERSION)):
        if not ok:
            return f"{why}\n{NEEDS}"
    return None


async def run_pods_demo(settings: Settings, *, duration: float | None, node_count: int,
                        summary_json: Path | None, listen: str | None,
                        phase_seconds: float = 30.0) -> int:
    from sunkd.kubernetes.client import PODS, KubeClient
    from sunkd.runtime.daemon import Daemon
    from sunkd.slurm.client import SlurmRestClient
    from sunkd.store.eventlog import EventLog
    from sunkd_testbed import images
    from sunkd_testbed.kubelet import HOST_LOCK, KubeletNodes
    from sunkd_testbed.kubernetes import KubeControlPlane
    from sunkd_testbed.slurm import SlurmCluster
    from sunkd_testbed.slurmdpods import hand_over, memory, slurmd_spec

    if node_count < 2:
        print("sunkd demo: --nodes must be at least 2", file=sys.stderr)
        return 2
    why = _preflight()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    try:
        pause, busybox = images.pause_image(), images.busybox_image()
        slurmd_image = images.slurm_image(SLURM_VERSION)
    except images.ImageError as error:
        print(f"sunkd demo --slurmd-pods: {error}\n{NEEDS}", file=sys.stderr)
        return 2
    poll_interval = 2.0
    set_aside_previous_log(settings.database_url)
    hostlist = f"gpu-a[001-{node_count:03d}]"
    stack = contextlib.ExitStack()  # the bring-up's teardown, in reverse
    daemon: Daemon | None = None
    daemon_task: asyncio.Task[int] | None = None
    kube_client = slurm_client = None
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        print("starting the Kubernetes control plane ...", flush=True)
        plane = KubeControlPlane(kubelet_client=True)
        stack.callback(plane.stop)
        plane.start()
        print(f"starting a Slurm {SLURM_VERSION} cluster ({hostlist}) ...", flush=True)
        cluster = SlurmCluster(hostlist, partitions={PARTITION: hostlist},
                               version=SLURM_VERSION)
        stack.callback(cluster.stop)
        cluster.start()
        print(f"starting {node_count} kubelet Nodes (each with its containerd; waits while "
              f"another test bed holds {HOST_LOCK}) ...", flush=True)
        bed = KubeletNodes(plane, node_count, pause=pause, images=[slurmd_image, busybox])
        stack.callback(bed.stop)
        bed.start()
        k8s = dict(zip(cluster.node_names, bed.names, strict=True))
        plane.kubectl("apply", "-f", str(MANIFESTS / "crds" / "nodeset.yaml"))
        plane.kubectl("wait", "--for=condition=Established", "crd/nodesets.sunkd.io",
                      "--timeout=60s")
        plane.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": APP, "namespace": NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {APP_LABEL: APP}}}}))
        hand_over(plane, bed, cluster, cluster.node_names, {POOL_LABEL: POOL})
        nodeset = nodeset_object(
            maxKubernetes=node_count, dwellSeconds=5.0, maxInFlight=max(1, node_count // 2),
            drainTimeoutSeconds=60, reclaimGraceSeconds=10)
        nodeset["metadata"]["namespace"] = NAMESPACE
        nodeset["spec"]["slurmd"] = slurmd_spec(slurmd_image, cluster)
        applied = time.time()
        plane.kubectl("apply", "-f", "-", input=json.dumps(nodeset))

        daemon_settings = replace(
            settings, listen=listen or settings.listen,
            slurm=SlurmSettings(url=cluster.rest_unix_url, user="root",
                                poll_interval=poll_interval),
            kubernetes=KubernetesSettings(enabled=True, kubeconfig=plane.kubeconfig,
                                          namespace=NAMESPACE))
        parse_listen(daemon_settings.listen)
        slurm_client = SlurmRestClient.from_settings(daemon_settings.slurm)
        kube_client = await KubeClient.connect(str(plane.kubeconfig))
        daemon = Daemon(daemon_settings, slurm_client=slurm_client, kube_client=kube_client,
                        slurm_env=cluster.env)
        daemon_task = asyncio.create_task(daemon.run(), name="sunkd-daemon")
        sampler = Sampler(kube_client, cluster, k8s)
        pod_names: dict[str, str] = {}
        while True:  # N slurmd nodes registered through sunkd's pods
            if daemon_task.done():
                print("sunkd stopped before the slurmd pods registered", file=sys.stderr)
                return await daemon_task or 1
            now = await sampler.sample()
            if all(registered(s, applied) and s.slurm is not None and s.slurm.state == "IDLE"
                   for s in now.values()):
                break
            if time.time() - applied > 300:
                print(f"the slurmd pods did not register in 300 s: {now}", file=sys.stderr)
                return 1
            await asyncio.sleep(SAMPLE_SECONDS)
        apply_to_registered = round(sampler.samples[-1][0] - applied, 2)
        items, _ = await kube_client.list(
            PODS, namespace=NAMESPACE, label_selector=f"{wk.LABEL_SLURMD_NODESET}={POOL}")
        for pod in items:
            node = (pod["metadata"].get("annotations") or {}).get(wk.ANNOTATION_SLURMD_NODE)
            if node:
                pod_names[node] = pod["metadata"]["name"]
        memory_at_registered = await asyncio.to_thread(memory, bed, pod_names, NAMESPACE)
        print(f"{node_count} slurmd nodes registered {apply_to_registered} s after the "
              "Nodeset's apply", flush=True)
        host = parse_listen(daemon_settings.listen)[0]
        print(f"sunkd serves http://{host}:{daemon.http_port}/ ; kubectl --kubeconfig "
              f"{plane.kubeconfig} get nodes,pods,nds -o wide", flush=True)

        stimuli = Stimuli()
        generator = PodGenerator(kube_client, cluster, node_count, phase_seconds, stimuli,
                                 busybox.ref)
        tasks = [asyncio.create_task(generator.run(stop), name="sunkd-demo-load"),
                 asyncio.create_task(sampler.run(stop), name="sunkd-demo-sampler")]
        started = time.time()
        interactive = sys.stdout.isatty()
        last_print = 0.0
        while duration is None or time.time() - started < duration:
            if daemon_task.done() or any(t.done() for t in tasks):
                break
            elapsed = time.time() - started
            table = render_table(daemon.state(), generator, elapsed, duration)
            slurmd = "  ".join(f"{n}: {s.pod or '-'}" for n, s in (
                sampler.samples[-1][1].items() if sampler.samples else ()))
            table += f"\nslurmd pods  {slurmd}"
            if interactive:
                sys.stdout.write("\x1b[H\x1b[2J" + table + "\n")
                sys.stdout.flush()
            elif time.time() - last_print >= 10:
                last_print = time.time()
                print(table, flush=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(daemon_task)
        stop.set()
        for task in tasks:
            await task  # a failed generator or sampler fails the demo here
        memory_at_end = await asyncio.to_thread(memory, bed, pod_names, NAMESPACE)
        daemon.stop_event.set()
        exit_code = await daemon_task
        elapsed = time.time() - started
        event_log = await EventLog.open(settings.database_url)
        try:
            everything = [event async for batch in event_log.read_range() for event in batch]
        finally:
            await event_log.close()
        summary = summarize(everything, stimuli, poll_interval, elapsed)
        summary["slurmd_pods"] = {
            "nodes": node_count, "slurm_version": cluster.slurm_version,
            "sample_seconds": SAMPLE_SECONDS,
            "apply_to_registered_s": apply_to_registered,
            **moves(everything, sampler),
            "memory_mib": {
                "measured": "VmRSS of /proc/PID/status: per Node its kubelet, its "
                            "containerd, that containerd's shims (sum); per slurmd pod its "
                            "slurmd process (the container's main process)",
                "at_registered": memory_at_registered, "at_end": memory_at_end},
        }
        print(render_table(daemon.state(), generator, elapsed, duration))
        print(render_pods(summary["slurmd_pods"]))
        print("\nsummary:")
        print(json.dumps(summary, indent=2))
        if summary_json is not None:
            summary_json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nthe log stays in {settings.database_url}: try `sunkd status`, "
              "`sunkd history gpu-a001`, `sunkd replay --check`")
        return exit_code
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        if daemon is not None and daemon_task is not None and not daemon_task.done():
            daemon.stop_event.set()
            try:
                async with asyncio.timeout(30):
                    await daemon_task
            except BaseException:  # the cleanup goes on whatever happened
                daemon_task.cancel()
        for client in (slurm_client, kube_client):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        print("stopping the slurmd pods, kubelets, containerds, Slurm and the control "
              "plane ...", flush=True)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C waits
        try:
            stack.close()
        finally:
            signal.signal(signal.SIGINT, previous)
