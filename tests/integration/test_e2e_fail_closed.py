"""Fail closed end to end: a real Slurm cluster, the Kubernetes API emulator, a real
PostgreSQL and `sunkd`'s daemon. A pod sunkd could once not see (on a Node that left its
Nodeset mid-reclaim, bound by spec.nodeName; on a node an identity rival claimed) must
be evicted before Slurm gets the node back, never resumed beside.

The unit and source-level tests of the same holes: tests/unit/test_fail_closed.py,
tests/integration/test_kube_source_fail_closed.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sunkd.domain import wellknown as wk
from sunkd.domain.events import ActionRequested, RecordedEvent
from sunkd.domain.ownership import running_pods
from sunkd.runtime.config import PoolSettings
from sunkd_testbed.demo import MANIFESTS, POOL_LABEL, node_object
from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.conftest import require
from tests.integration.test_e2e import (
    Running,
    assert_log_safe,
    migrated_database,
    pending_pods,
    read_all,
    reset_slurm,
    running_sunkd,
    start_emulator,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[Any]:
    from sunkd_testbed.slurm import SlurmCluster

    nodes = "fc[1-2]"
    cluster = SlurmCluster(nodes, partitions={"gpu": nodes}, slurmd_timeout=5)
    try:
        cluster.start()
    except Exception as error:
        require(False, f"cannot start a real Slurm cluster: {error}")
    yield cluster
    cluster.stop()


def _bound_pod(name: str, node: str) -> dict[str, Any]:
    """A pod bound by spec.nodeName (no scheduler, so no taint check), tolerating all."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "web", "image": "web:1"}]},
        "status": {"phase": "Running"},
    }


def _evicted_before_resumed(events: list[RecordedEvent], node: str, pod: str,
                            after_seq: int) -> None:
    """Every resume of `node` requested after `after_seq` comes after an eviction of
    `pod` (namespace/name) on it: Slurm never got the node back beside the pod."""
    evicted = False
    for event in events:
        payload = event.payload
        if event.seq <= after_seq or not isinstance(payload, ActionRequested):
            continue
        if payload.node != node:
            continue
        if payload.verb == "evict" and any(a.key == "pod" and a.value == pod
                                           for a in payload.args):
            evicted = True
        if payload.verb == "resume":
            assert evicted, f"seq {event.seq}: {node} resumed in Slurm beside {pod}"


async def _back_in_slurm(sunkd: Running, node: str) -> None:
    await sunkd.until("Slurm has the node back", lambda: sunkd.owner(node) == "slurm"
                      and sunkd.state().nodes[node].transition is None, within=90)


def _reclaim_everything(cluster: Any) -> None:
    for _ in cluster.node_names:  # Slurm wants every node back
        cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")


async def test_hole2_a_pod_bound_after_the_node_left_its_nodeset_mid_reclaim_is_evicted_first(
    slurm_cluster: Any,
) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                pending_pods(emulator, 1)
                await sunkd.until("a node is lent", lambda: any(
                    n.owner == "kubernetes" for n in sunkd.state().nodes.values()), within=60)
                lent = next(n for n, s in sunkd.state().nodes.items() if s.owner == "kubernetes")
                _reclaim_everything(slurm_cluster)

                def reclaiming() -> bool:
                    node = sunkd.state().nodes[lent]
                    return node.transition is not None and node.transition.to_owner == "slurm"

                await sunkd.until("a reclaim starts", reclaiming, within=60)
                mark = sunkd.state().last_seq
                # Mid-reclaim the Node leaves the Nodeset, then a pod binds by nodeName.
                emulator.patch("nodes", lent, {"metadata": {"labels": {POOL_LABEL: None}}})
                emulator.create(_bound_pod("late", lent), "default")
                await _back_in_slurm(sunkd, lent)
        finally:
            await emulator.stop()
            slurm_cluster.run("scancel", "--partition=gpu", check=False)
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, lent, "default/late", mark)


async def test_hole3_a_rival_claim_fixed_later_never_erases_the_real_nodes_pod(
    slurm_cluster: Any,
) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                [pod] = pending_pods(emulator, 1)
                await sunkd.until("the pod runs on a lent node", lambda: bool(
                    emulator.get("pods", pod, "default")["spec"].get("nodeName")), within=60)
                lent = emulator.get("pods", pod, "default")["spec"]["nodeName"]
                await sunkd.until("the lend is recorded",
                                  lambda: sunkd.owner(lent) == "kubernetes", within=30)
                mark = sunkd.state().last_seq
                # A copy-paste typo: a second Node claims the lent node's Slurm name ...
                rival = node_object("typo")
                rival["metadata"]["labels"][wk.LABEL_SLURM_NODE_NAME] = lent
                emulator.create(rival)
                await sunkd.until("the identity conflict is seen", lambda:
                                  "typo" in sunkd.state().nodes[lent].k8s_rivals, within=30)
                await asyncio.sleep(2)
                # ... fixed a moment later.
                emulator.patch("nodes", "typo", {
                    "metadata": {"labels": {wk.LABEL_SLURM_NODE_NAME: "typo"}}})
                await sunkd.until("the rival is gone", lambda:
                                  not sunkd.state().nodes[lent].k8s_rivals, within=30)
                assert running_pods(sunkd.state().nodes[lent]) == [f"default/{pod}"]
                _reclaim_everything(slurm_cluster)
                await _back_in_slurm(sunkd, lent)
        finally:
            await emulator.stop()
            slurm_cluster.run("scancel", "--partition=gpu", check=False)
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, lent, f"default/{pod}", mark)


def _config_pool() -> PoolSettings:
    """A pool from the config file (`[[pools]]`, partitions only): no Nodeset, so no
    selector attributes its Nodes."""
    return PoolSettings(name="cfg", partitions=("gpu",), dwell_seconds=1.0, max_in_flight=2,
                        drain_timeout_seconds=120.0, reclaim_grace_seconds=2.0)


def _pin(emulator: KubeAPIEmulator, node: str, to: str) -> None:
    emulator.patch("nodes", node, {"metadata": {"annotations": {wk.ANNOTATION_PIN: to}}})


async def test_hole1_a_config_file_pools_lent_node_is_not_resumed_beside_its_pod(
    slurm_cluster: Any,
) -> None:
    """A `[[pools]]` pool: before, pods on its Nodes were never reported, and a reclaim
    resumed Slurm at once beside a running pod."""
    reset_slurm(slurm_cluster)
    node = slurm_cluster.node_names[0]
    async with migrated_database() as database_url:
        emulator = KubeAPIEmulator()
        await emulator.start()
        try:
            emulator.create({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": "sunkd"}})
            emulator.create(yaml.safe_load((MANIFESTS / "crds" / "nodeset.yaml").read_text()))
            for name in slurm_cluster.node_names:
                emulator.create(node_object(name))
            async with running_sunkd(database_url, slurm_cluster, emulator,
                                     pools=(_config_pool(),)) as sunkd:
                _pin(emulator, node, "kubernetes")
                await sunkd.until("the pinned node is lent", lambda:
                                  sunkd.owner(node) == "kubernetes"
                                  and sunkd.state().nodes[node].transition is None, within=60)
                emulator.create(_bound_pod("web", node), "default")
                await sunkd.until("sunkd sees the pod", lambda: running_pods(
                    sunkd.state().nodes[node]) == ["default/web"], within=30)
                mark = sunkd.state().last_seq
                _pin(emulator, node, "slurm")
                await _back_in_slurm(sunkd, node)
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, node, "default/web", mark)
