"""`sunkd run` drives a Nodeset with spec.slurmd on real kubelet Nodes (Slurm 22.05, 24.11,
26.05): the daemon's policy runs the slurmd-pod plan.

Real: the control plane and three kubelets with their containerds, slurmctld and
slurmrestd of each generation, PostgreSQL, and sunkd's daemon as its own process (`python
-m sunkd run`), reading the Nodeset, the Nodes and their pods from the API server and the
nodes from slurmrestd. The harness is test_slurmd_pods_real.py's. The cycle:

- start: every node gets sunkd's slurmd pod, which registers: N nodes IDLE;
- a job runs on node1, node1 is pinned to Kubernetes: the drain waits for the job; the
  pod is deleted only once Slurm reports node1 drained, and the owner taint comes off only
  once the pod is gone (never a slurmd pod deleted under a job, never a pool pod beside a
  slurmd);
- node1 stays lent while Slurm no longer hears it (DOWN), without sunkd's hold taint;
- an idle node2 pinned to Kubernetes is lent (figure: pin -> lent);
- node1 pinned back to Slurm: the taint comes back, the pod is created, its slurmd
  registers, the drain is lifted: IDLE again (figure: reclaim -> resumed);
- (22.05) someone deletes Slurm-owned node3's slurmd pod: sunkd drains node3, creates the
  pod again, and lifts its drain once the new slurmd registered: IDLE, a job runs there
  (figure: pod deleted -> IDLE through a new one);
- a job on node1: sunkd labels its slurmd pod busy under the Nodeset's
  PodDisruptionBudget (its status computed by the real disruption controller), and
  `kubectl drain` of node1 is refused (the API server answers 429 to the eviction): the
  pod and the job survive; once the job ends the label goes and a dry-run eviction
  passes (figures: job start -> labelled, job end -> unlabelled).

The rolling update (its own test, a fresh Nodeset): `spec.slurmd` changes (an env var)
with a job on node1; every pod is replaced one at a time (maxUnavailable 1), the idle
nodes first, node1 last and only after its job ended; no slurmd pod deleted while Slurm
reports its node allocated; every node IDLE again through a pod at the new revision, no
hold taint (figures: spec change -> all pods new and registered, with the busy node, and
again with every node idle).

kill -9 mid-update (its own test, a fresh Nodeset): the same spec change with a 60 s job on
node1, and sunkd SIGKILLed three times, a new process (a new identity, so a new term)
started at once each time: while a node's old pod is being deleted, while its new pod
exists under sunkd's update drain, and while busy node1 is drained under its job. The
update converges: every pod at the new revision, every node IDLE through a new slurmd,
sunkd's drains lifted, no hold, nothing open in sunkd's log, the job ran to its end, no
pod deleted while Slurm reported its node allocated, never two nodes in update (figure:
spec change -> all new and registered, with the three restarts).

The figures are printed (`-s`) and recorded in docs/nodeset.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.slurmd import revision
from sunkd.kubernetes.client import NODES, NODESETS, PDBS, PODS, KubeApiError, KubeClient
from sunkd.kubernetes.normalize import parse_nodeset, slim_nodeset
from sunkd_testbed.images import Image
from sunkd_testbed.kubelet import KubeletNodes
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.slurm import SlurmCluster
from sunkd_testbed.slurmdpods import delete_nodeset, hand_over, install_nodeset_crd, slurm_nodes
from tests.integration import test_slurmd_pods_real as pods_real
from tests.integration.slurm_helpers import slurm_test_versions
from tests.integration.test_e2e import (
    assert_log_safe,
    current_state,
    migrated_database,
    read_all,
)
from tests.integration.test_slurmd_pods_real import (
    NODES_N,
    SLURM_NODES,
    _nodeset,
    _slurmd_started,
)

pytestmark = [pytest.mark.slow, pytest.mark.kubelet, pytest.mark.timeout(900)]
# The test bed of test_slurmd_pods_real.py: the control plane, three kubelet Nodes, and a
# Slurm cluster of each generation with its slurmd image imported.
plane = pods_real.plane
bed = pods_real.bed
generation = pods_real.generation


def _config(path: Path, database_url: str, cluster: SlurmCluster, kubeconfig: Path) -> Path:
    path.write_text(f"""
database_url = "{database_url}"
listen = "127.0.0.1:0"
lease_seconds = 3
[slurm]
url = "{cluster.rest_url}"
jwt_key_file = "{cluster.jwt_key_path}"
poll_interval = 1
[kubernetes]
kubeconfig = "{kubeconfig}"
namespace = "default"
""")
    return path


class Daemon:
    """`sunkd run` as its own process, its log beside the config."""

    def __init__(self, config: Path, cluster: SlurmCluster) -> None:
        self.config = config
        self.cluster = cluster
        self.log = config.parent / "sunkd.log"
        self.process: asyncio.subprocess.Process | None = None
        self.identity = "slurmd-e2e"

    async def start(self, identity: str = "slurmd-e2e") -> None:
        self.identity = identity
        env = {**os.environ, **self.cluster.env, "SUNKD_IDENTITY": identity,
               "SUNKD_LOG_FORMAT": "json"}
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sunkd", "--config", str(self.config), "run",
                env=env, stdout=asyncio.subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)

    def alive(self) -> None:
        if self.process is not None and self.process.returncode is not None:
            raise AssertionError(f"sunkd exited {self.process.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def kill(self) -> None:
        """SIGKILL: a crash, nothing runs on the way out (no lease released, no action's
        outcome appended)."""
        assert self.process is not None and self.process.returncode is None, self.tail()
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await self.process.wait()
        except TimeoutError:
            self.process.send_signal(signal.SIGINT)
            await self.process.wait()


class Watch:
    """Reads both sides now; waits, failing with the daemon's log."""

    def __init__(self, client: KubeClient, cluster: SlurmCluster, bed: KubeletNodes,
                 daemon: Daemon) -> None:
        self.client = client
        self.cluster = cluster
        self.bed = bed
        self.daemon = daemon
        self.k8s = dict(zip(SLURM_NODES, bed.names, strict=True))

    async def flags(self, node: str) -> str:
        return await asyncio.to_thread(self.cluster.node_flags, node)

    async def node(self, node: str) -> dict[str, Any]:
        return await self.client.get(NODES, self.k8s[node])

    async def tainted(self, node: str) -> bool:
        taints = ((await self.node(node)).get("spec") or {}).get("taints") or []
        return any(t.get("key") == wk.TAINT_OWNER for t in taints)

    async def held(self, node: str) -> bool:
        taints = ((await self.node(node)).get("spec") or {}).get("taints") or []
        return any(t.get("key") == wk.TAINT_HOLD for t in taints)

    def pod(self, node: str) -> str | None:
        return self.bed.phase(f"pods-{node}")

    async def pin(self, node: str, to: str) -> None:
        await self.client.merge_patch(NODES, self.k8s[node], {
            "metadata": {"annotations": {wk.ANNOTATION_PIN: to}}})

    async def until(self, what: str, check: Callable[[], Awaitable[object] | object],
                    within: float = 120.0) -> float:
        started = time.monotonic()
        while True:
            self.daemon.alive()
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return round(time.monotonic() - started, 2)
            if time.monotonic() - started > within:
                state = {n: (await self.flags(n), self.pod(n), await self.tainted(n))
                         for n in SLURM_NODES}
                raise AssertionError(f"timed out ({within:g} s) waiting for {what}: "
                                     f"{state}\n--- sunkd log ---\n{self.daemon.tail()}")
            await asyncio.sleep(0.1)


def _idle(flags: str) -> bool:
    return flags == "IDLE"


async def test_sunkd_run_drives_slurmd_pods_through_lend_and_reclaim(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    cluster, image = generation
    install_nodeset_crd(plane)
    # The host's slurmds go; sunkd's pods take over.
    before = hand_over(plane, bed, cluster, SLURM_NODES, {"pool": "pods"})
    body = _nodeset(image, cluster)
    body["spec"]["ownership"] = {"mode": "Auto", "dwellSeconds": 0, "maxInFlight": 3,
                                 "reclaimGraceSeconds": 2, "drainTimeoutSeconds": 600}
    plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    figures: dict[str, float] = {}
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Watch(client, cluster, bed, daemon)
        started = time.monotonic()
        await daemon.start()
        try:
            # --- start: N nodes IDLE through sunkd's slurmd pods
            async def all_registered() -> bool:
                for node in SLURM_NODES:
                    if not (_slurmd_started(cluster, node) not in ("", before[node])
                            and _idle(await watch.flags(node)) and watch.pod(node) == "Running"
                            and await watch.tainted(node)):
                        return False
                return True

            await watch.until(f"{NODES_N} nodes IDLE through sunkd's slurmd pods",
                              all_registered, within=180)
            figures["start"] = round(time.monotonic() - started, 2)

            # --- a job on node1, node1 pinned to Kubernetes: the drain waits for it
            job = cluster.sbatch(nodelist="node1", wrap="sleep 12")
            await watch.until("node1 busy", lambda: _busy(watch, "node1"), within=30)
            await watch.pin("node1", "kubernetes")
            await watch.until("node1 draining under its job",
                              lambda: _has(watch, "node1", "DRAIN"), within=30)
            while "DRAIN" in (flags := await watch.flags("node1")) and _allocated(flags):
                assert watch.pod("node1") == "Running", "slurmd pod deleted under a job"
                assert await watch.tainted("node1"), "untainted under a job"
                daemon.alive()
                await asyncio.sleep(0.1)
            job_end = time.monotonic()
            assert not _job_running(cluster, job)
            # The pod goes first, then the taint: never untainted while a slurmd pod is on it.
            pod_gone_at = untainted_at = None
            deadline = time.monotonic() + 120
            while untainted_at is None:
                daemon.alive()
                assert time.monotonic() < deadline, daemon.tail()
                phase = watch.pod("node1")
                tainted = await watch.tainted("node1")
                now = time.monotonic()
                if phase is None and pod_gone_at is None:
                    pod_gone_at = now
                if not tainted:
                    assert phase is None, f"untainted with its slurmd pod {phase}"
                    untainted_at = now
                await asyncio.sleep(0.05)
            assert pod_gone_at is not None
            figures["job_end_to_untainted"] = round(untainted_at - job_end, 2)
            figures["job_end_to_pod_gone"] = round(pod_gone_at - job_end, 2)

            # --- an idle node2 pinned: pin -> lent (untainted, its pod gone)
            pinned = time.monotonic()
            await watch.pin("node2", "kubernetes")

            async def node2_lent() -> bool:
                return watch.pod("node2") is None and not await watch.tainted("node2")

            await watch.until("node2 lent", node2_lent, within=120)
            figures["pin_to_lent"] = round(time.monotonic() - pinned, 2)

            # --- lent node1: Slurm no longer hears it, and that is no hold
            await watch.until("Slurm reports node1 DOWN (its slurmd is gone)",
                              lambda: _has(watch, "node1", "DOWN"), within=120)
            await asyncio.sleep(35)  # past ownership.UNHEALTHY_GRACE_SECONDS
            assert not await watch.held("node1"), daemon.tail()
            assert not await watch.tainted("node1")

            # --- reclaim node1: taint, pod, registered, undrained
            reclaimed = time.monotonic()
            await watch.pin("node1", "slurm")

            async def node1_undrained() -> bool:
                words = set((await watch.flags("node1")).split("+"))
                return not words & {"DRAIN", "DOWN"}

            await watch.until("node1 undrained", node1_undrained, within=180)
            figures["reclaim_to_undrained"] = round(time.monotonic() - reclaimed, 2)
            async def node1_back() -> bool:
                return (_idle(await watch.flags("node1")) and watch.pod("node1") == "Running"
                        and await watch.tainted("node1"))

            await watch.until("node1 back in Slurm through a new slurmd pod", node1_back,
                              within=180)
            figures["reclaim_to_resumed"] = round(time.monotonic() - reclaimed, 2)
            ran = cluster.sbatch(nodelist="node1", wrap="true")
            await watch.until("a job runs on the reclaimed node1",
                              lambda: not _job_running(cluster, ran), within=60)
            # Never a hold on any node: the lent nodes' lost contact, Slurm's suffix on
            # sunkd's reason and polls read before sunkd's own undrain are all sunkd's.
            assert '"verb": "cordon"' not in daemon.log.read_text(), daemon.tail()

            # --- someone deletes Slurm-owned node3's slurmd pod (22.05: the repair is the
            # same policy on every generation, and real kubelets are heavy): sunkd drains
            # node3 first, creates the pod again, and lifts its drain once the new slurmd
            # registered: IDLE again, in contact, tainted.
            if (cluster.slurm_version or "").startswith("22.05"):
                figures["repair"] = await _repair(cluster, plane, watch)
            # --- a job on node1: `kubectl drain` of node1 is refused, pod and job survive.
            figures.update(await _drain_refused(cluster, plane, watch))
        finally:
            await daemon.stop()
            for node in SLURM_NODES:
                try:
                    await client.merge_patch(NODES, watch.k8s[node], {
                        "metadata": {"annotations": {wk.ANNOTATION_PIN: None}}})
                except KubeApiError:
                    pass
            delete_nodeset(plane, "pods")
            bed.wait("the Nodeset's pods gone",
                     lambda: all(bed.phase(f"pods-{n}") is None for n in SLURM_NODES))
    print(f"\nsunkd run, Nodeset spec.slurmd, Slurm {cluster.slurm_version}: "
          f"start -> {NODES_N} IDLE {figures['start']} s; job end -> pod gone "
          f"{figures['job_end_to_pod_gone']} s, -> untainted "
          f"{figures['job_end_to_untainted']} s; pin -> lent {figures['pin_to_lent']} s; "
          f"reclaim -> undrained {figures['reclaim_to_undrained']} s, -> IDLE in contact "
          f"{figures['reclaim_to_resumed']} s"
          + (f"; node3's pod deleted -> IDLE through a new one {figures['repair']} s"
             if "repair" in figures else "")
          + (f"; job start -> pod labelled busy {figures['labelled']} s, job end -> "
             f"unlabelled {figures['unlabelled']} s" if "labelled" in figures else ""))


async def test_sunkd_run_rolls_slurmd_pods_busy_node_last(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    cluster, image = generation
    install_nodeset_crd(plane)
    for slurm_node, k8s in zip(SLURM_NODES, bed.names, strict=True):
        plane.kubectl("label", "node", k8s, "--overwrite", "pool=pods",
                      f"{wk.LABEL_SLURM_NODE_NAME}={slurm_node}")
        plane.kubectl("annotate", "node", k8s, f"{wk.ANNOTATION_PIN}-")
    before = {n: _slurmd_started(cluster, n) for n in SLURM_NODES}
    for name in SLURM_NODES:
        cluster.kill_slurmd(name, sig=signal.SIGTERM)
    await asyncio.sleep(1.1)
    body = _nodeset(image, cluster)
    body["spec"]["ownership"] = {"mode": "Slurm", "dwellSeconds": 0, "maxInFlight": 3}
    plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    figures: dict[str, float] = {}
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Watch(client, cluster, bed, daemon)
        await daemon.start()
        try:
            async def all_up(rev: str | None) -> bool:
                for node in SLURM_NODES:
                    pod = bed.pod(f"pods-{node}") or {}
                    meta = pod.get("metadata") or {}
                    if not (_slurmd_started(cluster, node) not in ("", before[node])
                            and _idle(await watch.flags(node))
                            and (pod.get("status") or {}).get("phase") == "Running"
                            and not meta.get("deletionTimestamp")
                            and (rev is None or (meta.get("annotations") or {}).get(
                                wk.ANNOTATION_SLURMD_REVISION) == rev)):
                        return False
                return True

            await watch.until("3 nodes IDLE through sunkd's slurmd pods",
                              lambda: all_up(None), within=180)
            job = cluster.sbatch(nodelist="node1", wrap="sleep 15")
            await watch.until("node1 busy", lambda: _busy(watch, "node1"), within=30)
            await asyncio.sleep(3)  # sunkd's Slurm poll (1 s) has seen the job too
            figures["busy"] = await _roll(cluster, client, watch, body, "1", busy=job)
            # Every node idle: the rolling update alone (once sunkd's Slurm poll has seen
            # the last undrain: a node still showing DRAIN to it is no candidate yet).
            await asyncio.sleep(3)
            figures["idle"] = await _roll(cluster, client, watch, body, "2", busy=None)
            assert '"verb": "cordon"' not in daemon.log.read_text(), daemon.tail()
            for node in SLURM_NODES:
                assert not await watch.held(node) and await watch.tainted(node)

            async def status_updated() -> bool:
                obj = await client.get(NODESETS, "pods", "default")
                return ((obj.get("status") or {}).get("slurmd") or {}).get("updated") == 3

            await watch.until("status.slurmd.updated = 3", status_updated, within=60)
        finally:
            await daemon.stop()
            delete_nodeset(plane, "pods")
            bed.wait("the Nodeset's pods gone",
                     lambda: all(bed.phase(f"pods-{n}") is None for n in SLURM_NODES))
    print(f"\nsunkd run, rolling update of {NODES_N} slurmd pods, Slurm "
          f"{cluster.slurm_version}: spec change -> all new and registered "
          f"{figures['busy']} s with a 15 s job on node1 (started before the change), "
          f"{figures['idle']} s with every node idle")


async def test_sunkd_killed_mid_update_converges(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    """kill -9 of sunkd while a node is in update, three times in one rolling update: its
    old pod being deleted, its new pod created under the drain, and a busy node drained
    under its job. Each time a new process (a new identity, a new term) takes over from
    the log and the update converges: every pod at the new revision, every node IDLE
    through a new slurmd, sunkd's drains lifted, no hold, no pod deleted under an
    allocation, never more than maxUnavailable (1) nodes in update."""
    cluster, image = generation
    install_nodeset_crd(plane)
    before = hand_over(plane, bed, cluster, SLURM_NODES, {"pool": "pods"})
    body = _nodeset(image, cluster)
    body["spec"]["ownership"] = {"mode": "Slurm", "dwellSeconds": 0, "maxInFlight": 3}
    plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Watch(client, cluster, bed, daemon)
        await daemon.start("killmid-0")
        try:
            async def all_up() -> bool:
                views = await asyncio.to_thread(slurm_nodes, cluster)
                for node in SLURM_NODES:
                    view = views.get(node)
                    pod = bed.pod(f"pods-{node}") or {}
                    if not (view is not None and view.state == "IDLE"
                            and view.slurmd_started not in (None, _epoch(before[node]))
                            and (pod.get("status") or {}).get("phase") == "Running"
                            and not (pod.get("metadata") or {}).get("deletionTimestamp")):
                        return False
                return True

            await watch.until("3 nodes IDLE through sunkd's slurmd pods", all_up, within=180)
            job = cluster.sbatch(nodelist="node1", wrap="sleep 60")
            await watch.until("node1 busy", lambda: _busy(watch, "node1"), within=30)
            await asyncio.sleep(3)  # sunkd's Slurm poll (1 s) has seen the job too
            kills, took = await _roll_killing(cluster, client, watch, body, job)
            takeovers = _takeovers(daemon.log, kills)
            assert '"verb": "cordon"' not in daemon.log.read_text(), daemon.tail()
            for node in SLURM_NODES:
                assert not await watch.held(node), daemon.tail()
                assert await watch.tainted(node), daemon.tail()

            async def status_updated() -> bool:
                obj = await client.get(NODESETS, "pods", "default")
                return ((obj.get("status") or {}).get("slurmd") or {}).get("updated") == 3

            await watch.until("status.slurmd.updated = 3", status_updated, within=60)

            # The last process settled: nothing open, no drain mark left (every drain of
            # the update lifted by sunkd), each process led one term.
            async def settled() -> bool:
                state = await current_state(database_url)
                return (state.leader_identity == daemon.identity
                        and not state.pending_actions()
                        and all(n.transition is None for n in state.nodes.values()))

            await watch.until("the log settled", settled, within=60)
            events = await read_all(database_url)
            elected = [e.payload.identity for e in events  # type: ignore[attr-defined]
                       if e.kind == "leader.elected"]
            assert elected == [f"killmid-{i}" for i in range(len(kills) + 1)], elected
            assert_log_safe(events)
            # The job on node1 ran to its end: its pod was never deleted under it.
            assert _job_state(cluster, job) == "COMPLETED", _job_state(cluster, job)
            # A job runs on each updated node.
            ran = cluster.sbatch("-N3", wrap="true")
            await watch.until("a job on the three updated nodes",
                              lambda: not _job_running(cluster, ran), within=60)
        finally:
            await daemon.stop()
            delete_nodeset(plane, "pods")
            bed.wait("the Nodeset's pods gone",
                     lambda: all(bed.phase(f"pods-{n}") is None for n in SLURM_NODES))
    print(f"\nsunkd killed -9 mid-update, Slurm {cluster.slurm_version}: "
          + "; ".join(f"{w} on {n}: kill -> new leader {lead} s"
                      + (f", -> its first action {act} s" if act is not None else "")
                      for (w, n, _), (lead, act) in zip(kills, takeovers, strict=True))
          + f"; spec change -> all {NODES_N} pods new and registered {took} s with a 60 s "
          f"job on node1 and three restarts")


# Where _roll_killing kills sunkd: each the first moment a node is seen so (in any order:
# a stage the test's poll missed on one node is caught on the next).
_KILL_AT = ("old pod deleting", "new pod created under the drain", "drained under a job")


async def _roll_killing(cluster: SlurmCluster, client: KubeClient, watch: Watch,
                        body: dict[str, Any], job: int
                        ) -> tuple[list[tuple[str, str, float]], float]:
    """Change spec.slurmd (an env var) and SIGKILL sunkd once at each stage of `_KILL_AT`,
    starting a new process at once each time; watch every pod be replaced with no pod
    deleted while Slurm reports its node allocated (node1's only after its job ended),
    never two nodes in update at once. The kills (stage, node, when) and seconds from the
    change to every pod at the new revision, Running, its node IDLE through a new
    slurmd."""
    bed, daemon = watch.bed, watch.daemon
    old: dict[str, str] = {}
    for node in SLURM_NODES:
        pod = bed.pod(f"pods-{node}") or {}
        old[node] = (pod.get("metadata") or {}).get("uid") or ""
        assert old[node], f"no slurmd pod on {node}"
    slurmd = body["spec"]["slurmd"]
    slurmd["env"] = [*slurmd["env"], {"name": "SUNKD_ROLL", "value": "killed"}]
    views = await asyncio.to_thread(slurm_nodes, cluster)
    started_before = {n: views[n].slurmd_started for n in SLURM_NODES}
    changed = time.monotonic()
    await client.merge_patch(NODESETS, "pods", {"spec": {"slurmd": {"env": slurmd["env"]}}},
                             "default")
    observed = parse_nodeset(slim_nodeset(await client.get(NODESETS, "pods", "default")))
    assert observed.slurmd is not None
    rev = revision(observed.slurmd)
    kills: list[tuple[str, str, float]] = []
    replaced: dict[str, float] = {}  # node -> when its old pod was first seen going
    while True:
        daemon.alive()
        now = time.monotonic()
        assert now - changed < 300, (f"not rolled in 300 s: kills {kills}, replaced "
                                     f"{replaced}\n{daemon.tail()}")
        # One `scontrol show node` for all: the nodes' states at one moment.
        views = await asyncio.to_thread(slurm_nodes, cluster)
        job_running = _job_running(cluster, job)
        in_update, through_n, stage = [], 0, None
        for node in SLURM_NODES:
            view = views[node]
            pod = bed.pod(f"pods-{node}") or {}
            meta = pod.get("metadata") or {}
            uid = meta.get("uid")
            deleting = uid == old[node] and bool(meta.get("deletionTimestamp"))
            gone = uid != old[node] or deleting
            if gone and node not in replaced:
                # Read after the pod: an allocation now was there at its deletion too
                # (the node is drained: no job starts there until sunkd undrains it).
                assert not _allocated(view.state), f"{node}'s pod deleted while {view.state}"
                if node == "node1":
                    assert not _job_running(cluster, job), "node1's pod deleted under its job"
                replaced[node] = now
            drained = "DRAIN" in view.words
            through = (uid not in (None, old[node]) and not meta.get("deletionTimestamp")
                       and (meta.get("annotations") or {}).get(
                           wk.ANNOTATION_SLURMD_REVISION) == rev
                       and (pod.get("status") or {}).get("phase") == "Running"
                       and view.slurmd_started not in (None, started_before[node])
                       and not drained)
            if drained or (node in replaced and not through):
                in_update.append(node)
            through_n += through and view.state == "IDLE"
            now_at = {
                _KILL_AT[0]: deleting or (uid is None and drained),
                _KILL_AT[1]: drained and uid not in (None, old[node])
                and not meta.get("deletionTimestamp"),
                _KILL_AT[2]: drained and uid == old[node] and _allocated(view.state)
                and job_running,
            }
            if stage is None:
                stage = next(((want, node) for want in _KILL_AT
                              if now_at[want] and want not in {w for w, _, _ in kills}),
                             None)
        assert len(in_update) <= 1, f"more than maxUnavailable=1 nodes in update: {in_update}"
        if stage is not None:
            await daemon.kill()
            kills.append((*stage, time.time()))
            await daemon.start(f"killmid-{len(kills)}")
            continue
        if len(kills) == len(_KILL_AT) and len(replaced) == NODES_N and through_n == NODES_N:
            break
        if len(replaced) == NODES_N and through_n == NODES_N:
            raise AssertionError(f"rolled before every kill: kills {kills}\n{daemon.tail()}")
        await asyncio.sleep(0.1)
    return kills, round(time.monotonic() - changed, 2)


def _takeovers(log: Path, kills: list[tuple[str, str, float]]
               ) -> list[tuple[float, float | None]]:
    """For each kill, from the daemon's JSON log: seconds to the next process's
    `leadership.acquired` (the lease, 3 s here, runs out first), and to its first action
    done (None after the kill under a job: its next action waits for the job's end)."""
    def stamp(entry: dict[str, Any]) -> float:
        return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()

    entries = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and "timestamp" in entry:
                entries.append(entry)
    out: list[tuple[float, float | None]] = []
    for index, (stage, _node, killed) in enumerate(kills, start=1):
        acquired = next(stamp(e) for e in entries if e.get("event") == "leadership.acquired"
                        and e.get("identity") == f"killmid-{index}")
        acted = next((stamp(e) for e in entries if e.get("event") == "engine.action_done"
                      and stamp(e) > acquired), None)
        out.append((round(acquired - killed, 2),
                    None if stage == _KILL_AT[2] or acted is None else round(acted - killed, 2)))
    return out


async def _roll(cluster: SlurmCluster, client: KubeClient, watch: Watch,
                body: dict[str, Any], value: str, *, busy: int | None) -> float:
    """Change spec.slurmd (an env var) and watch every pod be replaced: one node at a
    time, idle ones first, the busy node1 last and only once its job ended; no pod
    deleted while Slurm reports its node allocated, never two nodes in update at once.
    Seconds from the change to every pod at the new revision, Running, its node IDLE
    through a new slurmd."""
    bed = watch.bed
    old = {}
    for node in SLURM_NODES:
        pod = bed.pod(f"pods-{node}") or {}
        old[node] = (pod.get("metadata") or {}).get("uid")
        assert old[node], f"no slurmd pod on {node}"
    slurmd = body["spec"]["slurmd"]
    env = [e for e in slurmd["env"] if e["name"] != "SUNKD_ROLL"]
    slurmd["env"] = [*env, {"name": "SUNKD_ROLL", "value": value}]
    started_before = {n: _slurmd_started(cluster, n) for n in SLURM_NODES}
    changed = time.monotonic()
    await client.merge_patch(NODESETS, "pods", {"spec": {"slurmd": {"env": slurmd["env"]}}},
                             "default")
    observed = parse_nodeset(slim_nodeset(await client.get(NODESETS, "pods", "default")))
    assert observed.slurmd is not None
    rev = revision(observed.slurmd)
    replaced: dict[str, float] = {}  # node -> when its old pod was first seen going
    job_done_at: float | None = None
    while True:
        watch.daemon.alive()
        now = time.monotonic()
        assert now - changed < 240, (f"not rolled in 240 s: replaced {replaced}\n"
                                     f"{watch.daemon.tail()}")
        if busy is not None and job_done_at is None and not _job_running(cluster, busy):
            job_done_at = now
        going, idle = [], 0
        for node in SLURM_NODES:
            pod = bed.pod(f"pods-{node}") or {}
            meta = pod.get("metadata") or {}
            gone = meta.get("uid") != old[node] or bool(meta.get("deletionTimestamp"))
            flags = await watch.flags(node)
            if gone and node not in replaced:
                # Polled after the pod: an allocation now was there at its deletion too
                # (the node is drained: no job starts there until sunkd undrains it).
                assert not _allocated(flags), f"{node}'s slurmd pod deleted while {flags}"
                if busy is not None and node == "node1":
                    assert not _job_running(cluster, busy), "node1's pod deleted under its job"
                    job_done_at = job_done_at or now
                replaced[node] = now
            # Through: a new pod at the new revision, its slurmd registered (a new start
            # time), sunkd's drain lifted. (Slurm may show it NOT_RESPONDING for a while
            # after: slurmctld pings a node it had missed only at its next ping.)
            through = (meta.get("uid") != old[node] and not meta.get("deletionTimestamp")
                       and (meta.get("annotations") or {}).get(
                           wk.ANNOTATION_SLURMD_REVISION) == rev
                       and (pod.get("status") or {}).get("phase") == "Running"
                       and _slurmd_started(cluster, node) not in ("", started_before[node])
                       and "DRAIN" not in flags.split("+"))
            if node in replaced and not through:
                going.append(node)
            idle += through and _idle(flags)
        assert len(going) <= 1, f"more than maxUnavailable=1 nodes in update: {going}"
        if len(replaced) == NODES_N and idle == NODES_N:
            break
        await asyncio.sleep(0.1)
    took = round(time.monotonic() - changed, 2)
    order = sorted(replaced, key=replaced.__getitem__)
    if busy is not None:
        assert order[-1] == "node1", f"the busy node is not last: {order}"
        assert order[:2] == ["node2", "node3"], order
        assert job_done_at is not None and replaced["node1"] >= job_done_at - 0.2
    else:
        assert order == SLURM_NODES, order
    return took


async def _repair(cluster: SlurmCluster, plane: KubeControlPlane, watch: Watch) -> float:
    """Delete node3's slurmd pod as someone else would; wait until node3 is IDLE through a
    new slurmd of a new pod, having seen sunkd's drain on it before that pod registered."""
    before = _slurmd_started(cluster, "node3")
    assert _idle(await watch.flags("node3")) and watch.pod("node3") == "Running"
    deleted = time.monotonic()
    plane.kubectl("delete", "pod", "pods-node3", "--wait=false")
    drained = False
    while True:
        watch.daemon.alive()
        flags = await watch.flags("node3")
        started = _slurmd_started(cluster, "node3")
        if "DRAIN" in flags.split("+"):
            drained = True
            shown = cluster.scontrol("show", "node", "node3")  # read after `flags`: the
            # drain may be lifted by now (the new slurmd registered meanwhile)
            if "DRAIN" in next((w for w in shown.split() if w.startswith("State=")), ""):
                assert wk.REASON_SLURMD_REPAIR in shown, shown
        if started not in ("", before):
            assert drained, f"a new slurmd registered on node3 before sunkd's drain: {flags}"
        if (started not in ("", before) and _idle(flags) and watch.pod("node3") == "Running"
                and await watch.tainted("node3")):
            break
        assert time.monotonic() - deleted < 180, (
            f"node3 not repaired in 180 s: {flags}\n{watch.daemon.tail()}")
        await asyncio.sleep(0.1)
    took = round(time.monotonic() - deleted, 2)
    ran = cluster.sbatch(nodelist="node3", wrap="true")
    await watch.until("a job runs on the repaired node3",
                      lambda: not _job_running(cluster, ran), within=60)
    assert not await watch.held("node3"), watch.daemon.tail()
    return took


async def _busy_label(watch: Watch, pod: str) -> str | None:
    try:
        obj = await watch.client.get(PODS, pod, "default")
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise
    return ((obj.get("metadata") or {}).get("labels") or {}).get(wk.LABEL_SLURMD_BUSY)


async def _drain_refused(cluster: SlurmCluster, plane: KubeControlPlane,
                         watch: Watch) -> dict[str, float]:
    """A job on node1: its pod labelled busy, `kubectl drain` refused, pod and job alive;
    the job ends: the label goes and an eviction (dry run) would pass."""
    k8s, pod = watch.k8s["node1"], "pods-node1"
    assert _idle(await watch.flags("node1")) and watch.pod("node1") == "Running"
    uid = (await watch.client.get(PODS, pod, "default"))["metadata"]["uid"]
    job = cluster.sbatch(nodelist="node1", wrap="sleep 30")
    await watch.until("node1 busy", lambda: _busy(watch, "node1"), within=30)

    async def labelled() -> bool:
        return await _busy_label(watch, pod) == wk.SLURMD_BUSY_VALUE

    labelled_in = await watch.until("node1's slurmd pod labelled busy", labelled, within=30)
    name = f"pods{wk.PDB_SLURMD_BUSY_SUFFIX}"

    async def budget_counted() -> bool:
        # The real disruption controller (kube-controller-manager) computed the status
        # of the PDB's current generation, with the busy pod in it.
        obj = await watch.client.get(PDBS, name, "default")
        status = obj.get("status") or {}
        return (status.get("observedGeneration") == obj["metadata"].get("generation")
                and status.get("expectedPods") == 1 and status.get("currentHealthy") == 1
                and status.get("disruptionsAllowed") == 0)

    await watch.until("the PDB's status counts the busy pod", budget_counted, within=60)
    drained = await asyncio.to_thread(
        plane.kubectl, "drain", k8s, "--ignore-daemonsets", "--delete-emptydir-data",
        "--timeout=8s", check=False)
    await asyncio.to_thread(plane.kubectl, "uncordon", k8s)
    assert drained.returncode != 0, drained.stdout + drained.stderr
    assert "disruption budget" in drained.stderr, drained.stderr
    assert watch.pod("node1") == "Running", "the busy slurmd pod was evicted"
    assert (await watch.client.get(PODS, pod, "default"))["metadata"]["uid"] == uid
    assert _job_running(cluster, job), "the job did not survive the drain"
    await watch.until("the job on node1 ends", lambda: not _job_running(cluster, job),
                      within=90)
    job_end = time.monotonic()

    async def unlabelled() -> bool:
        return await _busy_label(watch, pod) is None and not await _busy(watch, "node1")

    await watch.until("node1's slurmd pod unlabelled", unlabelled, within=60)
    unlabelled_in = round(time.monotonic() - job_end, 2)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": "default"},
                "deleteOptions": {"dryRun": ["All"]}}
    await watch.client.create(PODS, eviction, "default", name=pod, subresource="eviction")
    assert watch.pod("node1") == "Running"
    # sunkd lifts the drain it mirrored from kubectl drain's cordon: node1 IDLE again.
    await watch.until("node1 IDLE after the uncordon",
                      lambda: _idle_now(watch, "node1"), within=120)
    return {"labelled": labelled_in, "unlabelled": unlabelled_in}


async def _idle_now(watch: Watch, node: str) -> bool:
    return _idle(await watch.flags(node))


async def _has(watch: Watch, node: str, word: str) -> bool:
    return word in (await watch.flags(node)).split("+")


async def _busy(watch: Watch, node: str) -> bool:
    return _allocated(await watch.flags(node))


def _allocated(flags: str) -> bool:
    return bool({"ALLOCATED", "MIXED", "COMPLETING"} & set(flags.split("+")))


def _job_state(cluster: SlurmCluster, job: int) -> str:
    """The job's JobState as slurmctld still reports it (it keeps an ended job for
    MinJobAge, 300 s by default)."""
    out = cluster.scontrol("-o", "show", "job", str(job), check=False)
    found = re.search(r"\bJobState=(\S+)", out)
    return found.group(1) if found else out.strip()


def _epoch(text: str) -> float | None:
    """A SlurmdStartTime as `slurm_nodes` reads it (epoch seconds)."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _job_running(cluster: SlurmCluster, job: int) -> bool:
    out = cluster.run("squeue", "-h", "-j", str(job), "-o", "%T", check=False)
    return bool(re.search(r"RUNNING|PENDING|COMPLETING|CONFIGURING", out))


# The finalizer's steps are the lend's gate (drained, idle, in contact), which every
# generation's run above exercises: the host's 22.05 only (no other cluster started), and
# only when the run asks for 22.05 (SUNKD_TEST_SLURM_VERSIONS).
@pytest.mark.parametrize("generation", [v for v in slurm_test_versions() if v == "22.05"],
                         indirect=True)
async def test_sunkd_run_deleting_a_nodeset_spares_the_busy_nodes_pod(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    """`kubectl delete nodeset` with a job on node1: sunkd's finalizer keeps the Nodeset
    Terminating; node2's and node3's pods go (drained, idle, in contact), node1's stays
    while its job runs (SlurmdProgressing says Deleting, naming node1); the job ends ->
    node1's pod goes, the finalizer comes off, the garbage collector lets the Nodeset go.
    Every node is left drained with sunkd's reason."""
    cluster, image = generation
    install_nodeset_crd(plane)
    before = hand_over(plane, bed, cluster, SLURM_NODES, {"pool": "pods"})
    body = _nodeset(image, cluster)
    body["spec"]["ownership"] = {"mode": "Slurm", "dwellSeconds": 0, "maxInFlight": 3}
    plane.kubectl("apply", "-f", "-", input=json.dumps(body))
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Watch(client, cluster, bed, daemon)
        await daemon.start()

        async def nodeset() -> dict[str, Any] | None:
            try:
                return await client.get(NODESETS, "pods", "default")
            except KubeApiError as error:
                if error.status == 404:
                    return None
                raise

        async def finalized() -> bool:
            meta = ((await nodeset()) or {}).get("metadata") or {}
            return wk.FINALIZER_SLURMD_PODS in (meta.get("finalizers") or [])

        try:
            async def all_up() -> bool:
                for node in SLURM_NODES:
                    if not (_slurmd_started(cluster, node) not in ("", before[node])
                            and _idle(await watch.flags(node))
                            and watch.pod(node) == "Running"):
                        return False
                return True

            await watch.until("3 nodes IDLE through sunkd's slurmd pods", all_up, within=180)
            await watch.until("sunkd's finalizer on the Nodeset", finalized, within=30)
            job = cluster.sbatch(nodelist="node1", wrap="sleep 20")
            await watch.until("node1 busy", lambda: _busy(watch, "node1"), within=30)
            await asyncio.sleep(2)  # sunkd's Slurm poll (1 s) has seen the job too
            plane.kubectl("delete", "nodeset", "pods", "--wait=false")

            async def idle_pods_gone() -> bool:
                return watch.pod("node2") is None and watch.pod("node3") is None

            async def says_deleting() -> bool:
                status = ((await nodeset()) or {}).get("status") or {}
                for c in status.get("conditions") or []:
                    if (c.get("type") == wk.CONDITION_SLURMD_PROGRESSING
                            and c.get("reason") == wk.REASON_DELETING
                            and "node1" in c.get("message", "")):
                        return True
                return False

            await watch.until("node2's and node3's pods gone", idle_pods_gone, within=60)
            await watch.until("SlurmdProgressing Deleting, naming node1", says_deleting,
                              within=30)
            while _job_running(cluster, job):
                obj = await nodeset()
                assert obj is not None and obj["metadata"].get("deletionTimestamp"), obj
                assert watch.pod("node1") == "Running", "slurmd pod deleted under a job"
                daemon.alive()
                await asyncio.sleep(0.1)
            job_end = time.monotonic()
            await watch.until("node1's pod gone", lambda: watch.pod("node1") is None,
                              within=60)
            pod_gone = round(time.monotonic() - job_end, 2)

            async def gone() -> bool:
                return await nodeset() is None

            await watch.until("the Nodeset gone", gone, within=60)
            nodeset_gone = round(time.monotonic() - job_end, 2)
            for node in SLURM_NODES:
                shown = cluster.scontrol("show", "node", node)
                assert "DRAIN" in (await watch.flags(node)), shown
                assert "sunkd: slurmd pods removed (Nodeset deleted)" in shown, shown
        finally:
            await daemon.stop()
            delete_nodeset(plane, "pods")
            bed.wait("the Nodeset's pods gone",
                     lambda: all(bed.phase(f"pods-{n}") is None for n in SLURM_NODES))
            with contextlib.suppress(Exception):
                cluster.scontrol("update", f"nodename={','.join(SLURM_NODES)}",
                                 "state=resume", check=False)
    print(f"\nsunkd run, Nodeset deleted with a 20 s job on node1, Slurm "
          f"{cluster.slurm_version}: job end -> node1's pod gone {pod_gone} s, "
          f"-> Nodeset gone {nodeset_gone} s")
