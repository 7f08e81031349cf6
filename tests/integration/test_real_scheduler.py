"""The real kube-scheduler with sunkd's extender, end to end: manifests/scheduler/
kube-scheduler-config.yaml as shipped (profiles default-scheduler and sunkd-scheduler, the
extender with nodeCacheCapable, ignorable: true), its urlPrefix pointed at sunkd's daemon,
which serves /scheduler/filter and /scheduler/prioritize from its HTTP server; a real Slurm
cluster, the real control plane, the harness kubelet (tests/integration/test_e2e_real_kube.py
has the wiring).

The pods here tolerate every taint, so sunkd's owner taint does not keep them anywhere:
only the extender does. What is checked:
- a pool pod binds only to a node Kubernetes owns and that is not moving;
- a pod of no pool is unaffected (through either profile it lands on a node of no pool;
  on a Slurm-owned node sunkd itself would evict it: only DaemonSet pods stay there);
- a node being reclaimed, and reclaimed, receives no new pool pod;
- with sunkd down the extender is skipped, as `ignorable: true` says (fail open), and with
  `ignorable: false` pods wait (fail closed).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sunkd.domain.state import Phase
from sunkd.kubernetes.client import NODES, PODS, KubeClient
from sunkd_testbed.demo import pod_object
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.slurm import SlurmCluster
from tests.integration import test_e2e_real_kube as e2e_real
from tests.integration.kube_backends import (
    SCHEDULER_CONFIG,
    free_port,
    install_sunkd,
    real_plane_or_skip,
)
from tests.integration.test_e2e import migrated_database, reset_slurm
from tests.integration.test_e2e_real_kube import NAMESPACE, World, running_sunkd

# The end-to-end module's fixtures (same wiring: a Slurm cluster, the harness kubelet).
slurm_cluster = e2e_real.slurm_cluster
world = e2e_real.world

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TOLERATE_ALL = [{"operator": "Exists"}]


@pytest.fixture(scope="module")
def extender_port() -> int:
    """sunkd's HTTP port in this module: the scheduler's extender urlPrefix points at it."""
    return free_port()


@pytest.fixture(scope="module")
def plane(extender_port: int) -> Iterator[KubeControlPlane]:
    control_plane = real_plane_or_skip(
        scheduler_config=SCHEDULER_CONFIG,
        extender_url=f"http://127.0.0.1:{extender_port}/scheduler",
        audit=True,
    )
    try:
        install_sunkd(control_plane)
        yield control_plane
    finally:
        control_plane.stop()


def pod(name: str, *, pool: bool = True, scheduler: str = "sunkd-scheduler",
        tolerate: bool = True) -> dict[str, Any]:
    body = pod_object(name)
    body.pop("status", None)
    body["spec"]["schedulerName"] = scheduler
    if tolerate:
        body["spec"]["tolerations"] = TOLERATE_ALL
    if not pool:
        body["metadata"]["labels"] = {"app": "batch-helper"}
    return body


async def create(admin: KubeClient, body: dict[str, Any]) -> str:
    await admin.create(PODS, body, NAMESPACE)
    return str(body["metadata"]["name"])


async def scheduled(admin: KubeClient, name: str) -> tuple[str | None, str]:
    """(node the pod is bound to, the scheduler's PodScheduled message)."""
    got = await admin.get(PODS, name, NAMESPACE)
    condition: dict[str, Any] = next((c for c in (got.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled"), {})
    return (got.get("spec") or {}).get("nodeName"), str(condition.get("message") or "")


async def bound(admin: KubeClient, name: str) -> str | None:
    return (await scheduled(admin, name))[0]


async def until(what: str, check: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def unschedulable(admin: KubeClient, name: str) -> str:
    """The scheduler's message once it has tried and refused the pod."""
    async def refused() -> str | None:
        node, message = await scheduled(admin, name)
        assert node is None, f"{name} was bound to {node}"
        return message or None

    message: str = await until(f"the scheduler refusing {name}", refused)
    return message


async def _untainted(admin: KubeClient, node: str) -> bool:
    return not (await admin.get(NODES, node))["spec"].get("taints")


async def poke(admin: KubeClient, node: str) -> None:
    """A label change on the Node: kube-scheduler retries the pods it parked as
    unschedulable (see test_lent_node_gets_its_pool_pod_without_another_node_event)."""
    await admin.merge_patch(NODES, node, {"metadata": {"labels": {
        "example.com/poke": str(random.randrange(10**6))}}})


async def test_pool_pods_only_on_nodes_kubernetes_owns(
    world: World, slurm_cluster: SlurmCluster, extender_port: int
) -> None:
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world,
                                 listen=f"127.0.0.1:{extender_port}") as sunkd:
            # Every pool node is Slurm's (tainted; the extender refuses them for pool pods).
            # One more node belongs to no pool: a pod of no pool lands there through either
            # profile, the extender passing it as it passes every pod of no pool.
            await world.kubelet.register_node("outside")
            await until("the outside node schedulable", lambda: _untainted(admin, "outside"))
            helper = await create(admin, pod("helper", pool=False, tolerate=False))
            assert await until("the helper bound", lambda: bound(admin, helper)) == "outside"
            plain = await create(admin, pod("plain", pool=False, tolerate=False,
                                            scheduler="default-scheduler"))
            assert await until("the plain pod bound", lambda: bound(admin, plain)) == "outside"
            # A pool pod that tolerates every taint is kept off every Slurm node and off the
            # node of no pool by the extender alone, with sunkd's reasons in the message.
            served = await create(admin, pod("served"))
            message = await unschedulable(admin, served)
            assert "sunkd:" in message, message
            # It is pool demand: sunkd lends a node for it...
            lent = await sunkd.until("a node lent", lambda: next(
                (n for n, s in sunkd.state().nodes.items()
                 if s.owner == "kubernetes" and s.transition is None), None), within=60)
            await poke(admin, lent)
            placed = await until("the pool pod bound", lambda: bound(admin, served))
            # ...and the pod binds there, only there.
            assert placed == lent
            phase = sunkd.state().nodes[lent].phase
            assert phase == Phase.KUBERNETES, phase


async def test_reclaimed_node_receives_no_new_pool_pods(
    world: World, slurm_cluster: SlurmCluster, extender_port: int
) -> None:
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world,
                                 listen=f"127.0.0.1:{extender_port}") as sunkd:
            first = await create(admin, pod("first"))
            lent = await sunkd.until("a node lent", lambda: next(
                (n for n, s in sunkd.state().nodes.items()
                 if s.owner == "kubernetes" and s.transition is None), None), within=60)
            await poke(admin, lent)
            assert await until("bound", lambda: bound(admin, first)) == lent
            # Slurm wants every node: jobs for all of them, long enough to outlast the test.
            for _ in slurm_cluster.node_names:
                slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 120", partition="gpu")
            await sunkd.until("the reclaim started", lambda: sunkd.state().nodes[lent].phase
                              not in (Phase.KUBERNETES,), within=30)
            # A new pool pod while the node is moving back, then after it is back: neither
            # the moving node nor the reclaimed one takes it.
            during = await create(admin, pod("during"))
            message = await unschedulable(admin, during)
            assert "sunkd:" in message, message
            await sunkd.until("the node is back in Slurm",
                              lambda: sunkd.owner(lent) == "slurm", within=90)
            after = await create(admin, pod("after"))
            message = await unschedulable(admin, after)
            assert "sunkd:" in message, message
            await poke(admin, lent)
            await asyncio.sleep(2)
            for name in (during, after):
                node, _ = await scheduled(admin, name)
                assert node is None, f"{name} bound to {node}"


async def test_extender_down_fails_open_as_ignorable_says(
    world: World, slurm_cluster: SlurmCluster, extender_port: int
) -> None:
    """`ignorable: true`: with sunkd down, kube-scheduler skips the extender; a pool pod
    that tolerates the owner taint then lands on a Slurm-owned node, and one that does not
    is still kept off by the taint alone (what the manifest's comment promises)."""
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world,
                                 listen=f"127.0.0.1:{extender_port}"):
            pass  # sunkd adopted (tainted) every node, then stopped: the extender is down
    for name in world.names:
        taints = (await admin.get(NODES, name))["spec"].get("taints") or []
        assert any(t["key"] == "sunkd.io/owner" for t in taints), name
    tolerant = await create(admin, pod("tolerant"))
    node = await until("the tolerant pod bound", lambda: bound(admin, tolerant))
    assert node in world.names
    plain = await create(admin, pod("untolerating", tolerate=False))
    message = await unschedulable(admin, plain)
    # (kube-scheduler 1.37 does not name the taint; every node carries sunkd's, above.)
    assert f"{len(world.names)} node(s) had untolerated taint(s)" in message, message
    log = world.plane.log_path("kube-scheduler").read_text()
    assert "Skipping extender as it returned error and has ignorable flag set" in log


async def test_extender_down_fails_closed_when_not_ignorable(tmp_path: Path) -> None:
    """The same configuration with `ignorable: false` and no sunkd: pods wait, with the
    extender's error as the reason (no Slurm needed: nothing answers the extender)."""
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    for extender in config["extenders"]:
        extender["ignorable"] = False
    path = tmp_path / "fail-closed.yaml"
    path.write_text(yaml.safe_dump(config))
    plane = real_plane_or_skip(scheduler_config=path,
                               extender_url=f"http://127.0.0.1:{free_port()}/scheduler")
    try:
        admin = await KubeClient.connect(str(plane.kubeconfig))
        try:
            from sunkd_testbed.kubernetes import HarnessKubelet

            async with HarnessKubelet(plane) as kubelet:
                await kubelet.register_node("lonely")
                name = await create(admin, pod("waiting", pool=False))
                message = await unschedulable(admin, name)
                assert "connection refused" in message or "extender" in message, message
                node, _ = await scheduled(admin, name)
                assert node is None
        finally:
            await admin.close()
    finally:
        plane.stop()


async def test_lent_node_gets_its_pool_pod_without_another_node_event(
    world: World, slurm_cluster: SlurmCluster, extender_port: int
) -> None:
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world,
                                 listen=f"127.0.0.1:{extender_port}") as sunkd:
            name = await create(admin, pod("prompt", tolerate=False))
            lent = await sunkd.until("a node lent", lambda: next(
                (n for n, s in sunkd.state().nodes.items()
                 if s.owner == "kubernetes" and s.transition is None), None), within=60)
            # No poke: the lend alone must get the pod placed (the emulator's stand-in binds
            # it at once; 10 s is five times the whole lend here).
            node = await until("the pod bound without a poke",
                               lambda: bound(admin, name), within=10)
            assert node == lent
