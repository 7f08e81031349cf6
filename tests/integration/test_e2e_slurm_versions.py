"""End to end on the newer Slurm generations: the lend/reclaim cycle and a foreign drain
held, with sunkd's daemon against a real Slurm 24.11 and 26.05 (Debian roots), the
Kubernetes API emulator and PostgreSQL. The same scenarios as test_e2e.py, which runs
the whole end-to-end suite on the host's 22.05; here sunkd writes nodes over REST
(`POST node/{name}`) instead of scontrol, and on 24.11 the old `sunkd:` reason stays on
a node after its drain is lifted (docs/slurm.md, "Slurm generations").

sunkd talks JWT over TCP here, not rest_auth/local over the unix socket as test_e2e.py
does: 24.11+ slurmrestd runs as an unprivileged user (never root or SlurmUser) and with
rest_auth/local it updates nodes as that user, which slurmctld refuses ("Invalid user id",
errno 2010); on 22.05 node updates go through scontrol, so the socket is enough there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from sunkd.domain.events import SlurmNodeObserved
from sunkd.domain.ownership import has_hold_taint
from sunkd.kubernetes.client import KubeClient
from sunkd.runtime.config import SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed.kubeapi import KubeAPIEmulator
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster
from tests.integration.test_e2e import (
    Running,
    assert_log_safe,
    migrated_database,
    pending_pods,
    read_all,
    reset_slurm,
    settings_for,
    start_emulator,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

NODES = "ev[1-4]"
VERSIONS = [v for v in slurm_test_versions() if v != "22.05"]  # 22.05: test_e2e.py


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}") for v in VERSIONS])
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    yield from start_cluster(
        NODES, partitions={"gpu": NODES}, slurmd_timeout=5, version=request.param
    )


@contextlib.asynccontextmanager
async def running_sunkd(
    database_url: str, cluster: SlurmCluster, emulator: KubeAPIEmulator
) -> AsyncIterator[Running]:
    """test_e2e.running_sunkd, with JWT over TCP (see the module docstring)."""
    settings = settings_for(database_url, cluster)
    settings = replace(
        settings,
        slurm=SlurmSettings(
            url=cluster.rest_url, jwt_key_file=cluster.jwt_key_path, poll_interval=1.0
        ),
    )
    slurm_client = SlurmRestClient.from_settings(settings.slurm)
    kube_client = KubeClient.for_url(emulator.url)
    daemon = Daemon(
        settings, slurm_client=slurm_client, kube_client=kube_client, slurm_env=cluster.env
    )
    task = asyncio.create_task(daemon.run())
    running = Running(daemon, emulator, cluster, task)
    try:
        await running.until(
            "all nodes adopted by Slurm",
            lambda: (
                len(running.state().nodes) == len(cluster.node_names)
                and all(
                    n.owner == "slurm" and n.transition is None
                    for n in running.state().nodes.values()
                )
            ),
            within=40,
        )
        yield running
    finally:
        daemon.stop_event.set()
        try:
            async with asyncio.timeout(30):
                assert await task == 0
        finally:
            await slurm_client.close()
            await kube_client.close()


async def test_lend_and_reclaim_over_rest(slurm_cluster: SlurmCluster) -> None:
    cluster = slurm_cluster
    reset_slurm(cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(cluster)
        try:
            async with running_sunkd(database_url, cluster, emulator) as sunkd:
                # One pending pool pod: one node is drained in Slurm (over REST) and lent.
                [pod] = pending_pods(emulator, 1)
                await sunkd.until(
                    "the pod runs on a lent node",
                    lambda: bool(emulator.get("pods", pod, "default")["spec"].get("nodeName")),
                )
                lent = emulator.get("pods", pod, "default")["spec"]["nodeName"]
                await sunkd.until(
                    "the lend is recorded", lambda: sunkd.owner(lent) == "kubernetes", within=10
                )
                assert "DRAIN" in cluster.node_flags(lent).upper()
                assert "Reason=sunkd: " in cluster.scontrol("show", "node", lent)
                # Slurm wants every node back: the pod is evicted, the node resumed.
                for _ in cluster.node_names:
                    cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")
                await sunkd.until(
                    "the node is back in Slurm", lambda: sunkd.owner(lent) == "slurm", within=90
                )
                assert not [
                    p for p in emulator.list("pods", "default") if p["metadata"]["name"] == pod
                ]
                await sunkd.until(
                    "a job runs on the reclaimed node",
                    lambda: any(
                        s in cluster.node_states().get(lent, "").upper()
                        for s in ("ALLOCATED", "MIXED")
                    ),
                    within=30,
                )
                # The drain is gone (24.11 may still show its reason): sunkd reads no
                # drain of its own into it.
                observed = sunkd.state().nodes[lent].slurm
                assert observed is not None and "DRAIN" not in observed.flags
                await asyncio.sleep(3)  # several polls: no new drain of the reclaimed node
                assert sunkd.owner(lent) == "slurm"
                assert "DRAIN" not in cluster.node_flags(lent).upper()
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)
    kinds = [type(e.payload).__name__ for e in events]
    assert kinds.count("TransitionCompleted") >= 2  # lent, then reclaimed


async def test_foreign_drain_and_not_ready_are_held_and_mirrored(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = slurm_cluster
    reset_slurm(cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(cluster)
        try:
            async with running_sunkd(database_url, cluster, emulator) as sunkd:
                drained, not_ready = cluster.node_names[0], cluster.node_names[1]
                cluster.scontrol(
                    "update", f"nodename={drained}", "state=drain", "reason=admin: bad DIMM"
                )
                await sunkd.until(
                    "the foreign drain is mirrored as sunkd's hold taint",
                    lambda: (
                        (k := sunkd.state().nodes[drained].k8s) is not None
                        and has_hold_taint(k)
                        and not k.unschedulable
                    ),
                )
                node = emulator.get("nodes", drained)
                assert node["metadata"]["annotations"]["sunkd.io/slurm-reason"] == "admin: bad DIMM"
                # NotReady in Kubernetes: sunkd drains the node in Slurm, over REST.
                emulator.patch(
                    "nodes",
                    not_ready,
                    {"status": {"conditions": [
                        {"type": "Ready", "status": "False", "reason": "KubeletDown"}]}},
                    subresource="status",
                    patch_type="strategic",
                )  # fmt: skip
                await sunkd.until(
                    "NotReady mirrored as a sunkd drain in Slurm",
                    lambda: (
                        (s := sunkd.state().nodes[not_ready].slurm) is not None
                        and "DRAIN" in s.flags
                        and (s.reason or "").startswith("sunkd: k8s")
                    ),
                )
                assert "Reason=sunkd: k8s" in cluster.scontrol("show", "node", not_ready)
                # The admin's drain is never touched; lifting it lifts sunkd's hold.
                await asyncio.sleep(3)
                assert "bad DIMM" in cluster.scontrol("show", "node", drained)
                assert "DRAIN" in cluster.node_flags(drained).upper()
                cluster.scontrol("update", f"nodename={drained}", "state=resume")
                emulator.patch(
                    "nodes",
                    not_ready,
                    {"status": {"conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}},
                    subresource="status",
                    patch_type="strategic",
                )  # fmt: skip
                await sunkd.until(
                    "both holds cleared",
                    lambda: (
                        not has_hold_taint(sunkd.state().nodes[drained].k8s)
                        and "DRAIN"
                        not in (sunkd.state().nodes[not_ready].slurm or SlurmNodeObserved()).flags
                    ),
                    within=60,
                )
                # 24.11 keeps both old reasons on the undrained nodes: still no holds.
                await asyncio.sleep(3)
                assert not has_hold_taint(sunkd.state().nodes[drained].k8s)
                assert "DRAIN" not in cluster.node_flags(not_ready).upper()
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)
