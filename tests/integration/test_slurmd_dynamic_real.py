"""`sunkd run` with a Nodeset of `registration: Dynamic` on a real kubelet Node (Slurm
22.05, 24.11, 26.05): the node does not exist in Slurm until sunkd's slurmd pod
(`slurmd -D -Z -N dyn1 --conf "Features=dyn Weight=5" --conf-server HOST:PORT`,
configless) registers it, with the Nodeset's feature.

Real: the control plane, a kubelet Node with containerd, slurmctld and slurmrestd of each
generation (configless, `MaxNodeCount`, `TreeWidth=65533`, `NodeSet=dyn Feature=dyn` and
partition `dyn` over it; one static node, whose host slurmd is stopped so the pod's slurmd
can listen on `SlurmdPort`), PostgreSQL, and `python -m sunkd run`. The cycle:

- apply: Slurm has never heard of dyn1; sunkd adopts the Node, taints it, creates the
  pod, its slurmd registers dyn1 with feature `dyn` and the site's `Weight=5`: IDLE in
  partition `dyn` (figure: apply -> registered), `status.slurmd.registered` 1;
- a job runs on dyn1;
- dyn1 pinned to Kubernetes: drained, pod deleted, untainted (figure: pin -> lent);
  Slurm keeps the dynamic record (DOWN+DRAIN once it stops hearing it), no hold;
- pinned back: the new slurmd registers to the same record (slurmctld keeps it and its
  features), RESUME with return-to-service, IDLE in contact (figure: pin -> IDLE); a job
  runs there again;
- lent again, an administrator deletes the record: no hold; pinned back, the new pod's
  slurmd creates the record anew (figure). No hold taint over the whole run.

One Dynamic node per host: every slurmd of a Nodeset takes the same `--conf`, so on one
machine its pods would all listen on `SlurmdPort` (22.05 also refuses `Port=` in --conf;
23.11+ takes one port for them all). A site runs one slurmd per host; this bed's Nodes
share one machine, so the test runs one Node of the Nodeset.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain import wellknown as wk
from sunkd.kubernetes.client import NODES, NODESETS, KubeApiError, KubeClient
from sunkd_testbed import images as images_mod
from sunkd_testbed.images import Image
from sunkd_testbed.kubelet import KubeletNodes, available
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.kubernetes import available as plane_available
from sunkd_testbed.slurm import SlurmCluster
from sunkd_testbed.slurmdpods import delete_nodeset, install_nodeset_crd
from tests.conftest import require
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster
from tests.integration.test_e2e import migrated_database
from tests.integration.test_slurmd_daemon_real import Daemon, _config, _job_running
from tests.integration.test_slurmd_pods_real import _image

pytestmark = [pytest.mark.slow, pytest.mark.kubelet, pytest.mark.timeout(900)]

NODE = "dyn1"  # the Slurm name sunkd gives the Node (label sunkd.io/slurm-node-name)
NODESET = "dyn"  # the Nodeset, its feature, Slurm's NodeSet and the partition
POD = f"{NODESET}-{NODE}"


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    for ok, why in (plane_available(), available()):
        require(ok, why)
    with KubeControlPlane(kubelet_client=True) as control_plane:
        yield control_plane


@pytest.fixture(scope="module")
def bed(plane: KubeControlPlane) -> Iterator[KubeletNodes]:
    nodes = KubeletNodes(plane, 1, pause=images_mod.pause_image())
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


def _dynamic_conf(version: str | None) -> list[str]:
    lines = ["SlurmctldParameters=enable_configless", "MaxNodeCount=4",
             f"NodeSet={NODESET} Feature={NODESET}"]
    # Before 23.02 dynamic nodes need the flat fan-out (slurm.conf(5), TreeWidth).
    return [*lines, "TreeWidth=65533"] if (version or "22.05").startswith("22.") else lines


@pytest.fixture(params=slurm_test_versions())
def generation(request: pytest.FixtureRequest, bed: KubeletNodes) -> Iterator[
        tuple[SlurmCluster, Image]]:
    version: str = request.param
    image = _image(version)
    bed.import_images([image])
    for cluster in start_cluster("static1", version=version,
                                 partitions={"debug": "static1", NODESET: NODESET},
                                 extra_conf=_dynamic_conf(version)):
        # static1's slurmd listens on SlurmdPort, the port a dynamic node takes.
        cluster.kill_slurmd("static1", sig=signal.SIGTERM)
        yield cluster, image


def _nodeset(image: Image, cluster: SlurmCluster) -> dict[str, Any]:
    base = str(cluster.base)
    return {
        "apiVersion": wk.API_VERSION, "kind": "Nodeset",
        "metadata": {"name": NODESET, "namespace": "default"},
        "spec": {
            "slurm": {"partitions": [NODESET]}, "nodeSelector": {"pool": NODESET},
            "ownership": {"mode": "Auto", "dwellSeconds": 0, "maxInFlight": 3,
                          "reclaimGraceSeconds": 2, "drainTimeoutSeconds": 600},
            "slurmd": {
                "image": image.ref, "imagePullPolicy": "Never", "registration": "Dynamic",
                "confServer": f"127.0.0.1:{cluster.ctld_port}", "conf": "Weight=5",
                # Configless: slurmd asks slurmctld for slurm.conf through munged's
                # default socket before it has one; the config names the cluster's paths.
                "volumes": [
                    {"name": "cluster", "hostPath": {"path": base, "type": "Directory"}},
                    {"name": "munge", "hostPath": {"path": str(cluster.munge_socket.parent),
                                                   "type": "Directory"}}],
                "volumeMounts": [{"name": "cluster", "mountPath": base},
                                 {"name": "munge", "mountPath": "/run/munge"}],
                "terminationGracePeriodSeconds": 10,
            },
        },
    }  # fmt: skip


def _words(shown: dict[str, str]) -> set[str]:
    """The node's state words without DYNAMIC_NORM (every node a dynamic registration
    created carries it: `IDLE+DYNAMIC_NORM`)."""
    return set(shown.get("State", "").split("+")) - {"DYNAMIC_NORM", ""}


def _show(cluster: SlurmCluster) -> dict[str, str]:
    """`scontrol -o show node dyn1` as fields ({} while Slurm has no such node)."""
    out = cluster.scontrol("-o", "show", "node", NODE, check=False, timeout=15)
    return dict(re.findall(r"(\w+)=(\S*)", out)) if f"NodeName={NODE}" in out else {}


class Bed:
    def __init__(self, client: KubeClient, cluster: SlurmCluster, bed: KubeletNodes,
                 daemon: Daemon) -> None:
        self.client, self.cluster, self.bed, self.daemon = client, cluster, bed, daemon
        self.k8s = bed.names[0]

    async def show(self) -> dict[str, str]:
        return await asyncio.to_thread(_show, self.cluster)

    async def taints(self) -> set[str]:
        node = await self.client.get(NODES, self.k8s)
        return {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}

    async def pin(self, to: str | None) -> None:
        await self.client.merge_patch(NODES, self.k8s, {
            "metadata": {"annotations": {wk.ANNOTATION_PIN: to}}})

    async def until(self, what: str, check: Any, within: float = 120.0) -> float:
        started = time.monotonic()
        while True:
            self.daemon.alive()
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return round(time.monotonic() - started, 2)
            if time.monotonic() - started > within:
                raise AssertionError(
                    f"timed out ({within:g} s) waiting for {what}: Slurm {await self.show()}, "
                    f"pod {self.bed.phase(POD)}, taints {await self.taints()}\n"
                    f"--- sunkd log ---\n{self.daemon.tail()}")
            await asyncio.sleep(0.1)


async def test_a_dynamic_nodeset_registers_its_node_and_lends_and_reclaims_it(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    cluster, image = generation
    install_nodeset_crd(plane)
    k8s = bed.names[0]
    plane.kubectl("label", "node", k8s, "--overwrite", f"pool={NODESET}",
                  f"{wk.LABEL_SLURM_NODE_NAME}={NODE}")
    plane.kubectl("annotate", "node", k8s, f"{wk.ANNOTATION_PIN}-")
    assert _show(cluster) == {}, "Slurm knows dyn1 before any pod registered it"
    figures: dict[str, float] = {}
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Bed(client, cluster, bed, daemon)
        await daemon.start()
        try:
            await asyncio.sleep(3)  # sunkd up; the clock starts at the Nodeset's apply
            applied = time.monotonic()
            plane.kubectl("apply", "-f", "-", input=json.dumps(_nodeset(image, cluster)))

            async def registered() -> bool:
                shown = await watch.show()
                return (_words(shown) == {"IDLE"} and bed.phase(POD) == "Running"
                        and NODESET in shown.get("ActiveFeatures", "").split(","))

            await watch.until("dyn1 registered by its Dynamic slurmd pod", registered, 180)
            figures["apply_to_registered"] = round(time.monotonic() - applied, 2)
            shown = await watch.show()
            assert shown.get("Weight") == "5", shown  # the site's --conf words
            assert "DYNAMIC_NORM" in shown["State"], shown  # slurmctld created it
            assert NODESET in shown.get("Partitions", "").split(","), shown
            assert wk.TAINT_OWNER in await watch.taints()

            async def status_registered() -> bool:
                obj = await client.get(NODESETS, NODESET, "default")
                return ((obj.get("status") or {}).get("slurmd") or {}).get("registered") == 1

            await watch.until("status.slurmd.registered = 1", status_registered, 60)

            job = cluster.sbatch(nodelist=NODE, partition=NODESET, wrap="true")
            await watch.until("a job runs on dyn1", lambda: not _job_running(cluster, job), 60)

            # --- lend: drained, pod deleted, untainted
            pinned = time.monotonic()
            await watch.pin("kubernetes")

            async def lent() -> bool:
                return bed.phase(POD) is None and wk.TAINT_OWNER not in await watch.taints()

            await watch.until("dyn1 lent", lent, 120)
            figures["pin_to_lent"] = round(time.monotonic() - pinned, 2)

            async def down() -> bool:
                return "DOWN" in _words(await watch.show())

            await watch.until("Slurm keeps dyn1's record, DOWN", down, 60)
            await asyncio.sleep(35)  # past ownership.UNHEALTHY_GRACE_SECONDS: no hold
            assert wk.TAINT_HOLD not in await watch.taints(), daemon.tail()
            assert "DRAIN" in _words(await watch.show())

            # --- reclaim: the new slurmd registers to the kept record, RESUME, IDLE
            reclaimed = time.monotonic()
            await watch.pin("slurm")
            await watch.until("dyn1 back in Slurm through a new pod", registered, 180)
            figures["pin_back_to_idle"] = round(time.monotonic() - reclaimed, 2)
            assert wk.TAINT_OWNER in await watch.taints()
            again = cluster.sbatch(nodelist=NODE, partition=NODESET, wrap="true")
            await watch.until("a job runs on the reclaimed dyn1",
                              lambda: not _job_running(cluster, again), 60)

            # --- lent again, and an administrator deletes the record (`scontrol delete
            # nodename=`): no hold; the reclaim's slurmd creates the record anew.
            await watch.pin("kubernetes")
            await watch.until("dyn1 lent again", lent, 120)
            await asyncio.to_thread(cluster.scontrol, "delete", f"nodename={NODE}")
            await watch.until("dyn1's record gone", lambda: _show(cluster) == {}, 30)
            await asyncio.sleep(5)  # a few polls of the source without the record
            assert wk.TAINT_HOLD not in await watch.taints(), daemon.tail()
            anew = time.monotonic()
            await watch.pin("slurm")
            await watch.until("dyn1 created anew by a new pod", registered, 180)
            figures["record_deleted_pin_back_to_idle"] = round(time.monotonic() - anew, 2)
            assert (await watch.show()).get("Weight") == "5"
            text = daemon.log.read_text()
            assert '"verb": "cordon"' not in text and '"verb": "hold"' not in text, \
                daemon.tail()
        finally:
            await daemon.stop()
            try:
                await watch.pin(None)
            except KubeApiError:
                pass
            delete_nodeset(plane, NODESET)
            bed.wait("the Nodeset's pod gone", lambda: bed.phase(POD) is None)
    print(f"\nsunkd run, Dynamic Nodeset, Slurm {cluster.slurm_version}: apply -> "
          f"{NODE} registered (IDLE, feature {NODESET}) {figures['apply_to_registered']} s; "
          f"pin -> lent {figures['pin_to_lent']} s; pin back -> IDLE through a new pod "
          f"{figures['pin_back_to_idle']} s; record deleted while lent, pin back -> created "
          f"anew, IDLE {figures['record_deleted_pin_back_to_idle']} s")


async def test_a_defunct_dynamic_record_is_deleted_or_reported(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image],
    tmp_path: Path,
) -> None:
    """dyn1 registered through sunkd's pod; the Node then leaves the Nodeset (its `pool`
    label removed) and an administrator deletes the pod, as when a host is retired: Slurm
    stops hearing dyn1 (NOT_RESPONDING, DOWN after SlurmdTimeout=5 s), and the record is
    defunct (docs/nodeset.md, "Defunct Dynamic records"). 24.11 and 26.05: sunkd deletes
    it through slurmrestd (figure: NOT_RESPONDING seen -> record gone). 22.05 (no REST
    node delete): the record stays, and sunkd's log gives `scontrol delete nodename=dyn1`."""
    cluster, image = generation
    install_nodeset_crd(plane)
    k8s = bed.names[0]
    plane.kubectl("label", "node", k8s, "--overwrite", f"pool={NODESET}",
                  f"{wk.LABEL_SLURM_NODE_NAME}={NODE}")
    plane.kubectl("annotate", "node", k8s, f"{wk.ANNOTATION_PIN}-")
    async with migrated_database() as database_url, \
            await KubeClient.connect(str(plane.kubeconfig)) as client:
        daemon = Daemon(_config(tmp_path / "sunkd.toml", database_url, cluster,
                                plane.kubeconfig), cluster)
        watch = Bed(client, cluster, bed, daemon)
        await daemon.start()
        try:
            plane.kubectl("apply", "-f", "-", input=json.dumps(_nodeset(image, cluster)))

            async def registered() -> bool:
                shown = await watch.show()
                return (_words(shown) == {"IDLE"} and bed.phase(POD) == "Running"
                        and NODESET in shown.get("ActiveFeatures", "").split(","))

            await watch.until("dyn1 registered by its Dynamic slurmd pod", registered, 180)

            async def adopted() -> bool:  # the adoption ended: nothing recreates the pod
                obj = await client.get(NODESETS, NODESET, "default")
                return ((obj.get("status") or {}).get("slurmd") or {}).get("registered") == 1

            await watch.until("status.slurmd.registered = 1", adopted, 60)
            plane.kubectl("label", "node", k8s, "pool-")
            await asyncio.sleep(3)  # sunkd sees the Node leave before the pod goes
            plane.kubectl("delete", "pod", POD, "--wait=true", "--timeout=60s")
            seen: dict[str, float] = {}

            async def not_responding() -> bool:
                if "NOT_RESPONDING" in _words(await watch.show()):
                    seen.setdefault("at", time.monotonic())
                return "at" in seen

            await watch.until("Slurm no longer hears dyn1", not_responding, 60)
            if (cluster.slurm_version or "").startswith("22."):
                await watch.until("dyn1 DOWN", lambda: "DOWN" in _words(_show(cluster)), 60)
                await watch.until(
                    "sunkd's log naming the scontrol line",
                    lambda: f"scontrol delete nodename={NODE}" in daemon.log.read_text(), 60)
                assert _show(cluster), "22.05: sunkd deleted the record without REST"
                await asyncio.to_thread(cluster.scontrol, "delete", f"nodename={NODE}")
                outcome = "reported (scontrol line in sunkd's log), record kept"
            else:

                async def deleted() -> bool:
                    shown = await watch.show()
                    if "DOWN" in _words(shown):
                        seen.setdefault("down", time.monotonic())
                    return shown == {}

                await watch.until("dyn1's record deleted by sunkd", deleted, 90)
                gone, lost = time.monotonic(), seen["at"]
                down = seen.get("down")
                to_down = "?" if down is None else f"{down - lost:.2f}"
                to_gone = "?" if down is None else f"{gone - down:.2f}"
                outcome = (f"NOT_RESPONDING -> deleted {gone - lost:.2f} s (-> DOWN "
                           f"{to_down} s, Slurm's; DOWN -> deleted {to_gone} s, sunkd's)")
                assert '"verb": "delete-node"' in daemon.log.read_text(), daemon.tail()
            assert wk.TAINT_HOLD not in await watch.taints(), daemon.tail()
            assert bed.phase(POD) is None, "a slurmd pod came back on the unselected Node"
        finally:
            await daemon.stop()
            delete_nodeset(plane, NODESET)  # sunkd's finalizer off: no sunkd runs now
            bed.wait("the Nodeset's pod gone", lambda: bed.phase(POD) is None)
    print(f"\nsunkd run, Dynamic Nodeset, Slurm {cluster.slurm_version}: Node unselected and "
          f"pod deleted -> dyn1 defunct: {outcome}")
