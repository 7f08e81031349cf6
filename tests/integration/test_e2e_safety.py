"""Safety scenarios 1-3 end to end (docs/safety.md): a real Slurm cluster, the Kubernetes
API emulator, a real PostgreSQL and `sunkd`'s daemon, with an administrator and an
operator doing what they do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sunkd.domain.events import ActionRequested, TransitionAborted, TransitionCompleted
from sunkd.domain.ownership import assess
from tests.conftest import require
from tests.integration.test_e2e import (
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

    nodes = "saf[1-3]"
    cluster = SlurmCluster(nodes, partitions={"gpu": nodes}, slurmd_timeout=5)
    try:
        cluster.start()
    except Exception as error:
        require(False, f"cannot start a real Slurm cluster: {error}")
    yield cluster
    cluster.stop()


def _not_ready(emulator: Any, node: str, ready: bool) -> None:
    emulator.patch("nodes", node, {"status": {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False",
         "reason": "KubeletReady" if ready else "KubeletDown"}]}},
        subresource="status", patch_type="strategic")


async def test_s1_an_admin_down_survives_a_kubelet_outage(slurm_cluster: Any) -> None:
    reset_slurm(slurm_cluster)
    node = slurm_cluster.node_names[0]
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                slurm_cluster.scontrol("update", f"nodename={node}", "state=down",
                                       "reason=bad DIMM")
                await sunkd.until("sunkd sees the admin's DOWN", lambda: (
                    s := sunkd.state().nodes[node].slurm) is not None and s.state == "DOWN")
                _not_ready(emulator, node, False)  # then the kubelet goes NotReady
                await sunkd.until("sunkd sees the kubelet NotReady", lambda: (
                    k := sunkd.state().nodes[node].k8s) is not None and k.ready is False)
                await asyncio.sleep(4)  # several decision rounds
                shown = slurm_cluster.scontrol("show", "node", node)
                assert "bad DIMM" in shown and "DOWN" in shown.upper(), shown
                _not_ready(emulator, node, True)  # the kubelet is back
                await sunkd.until("sunkd sees the kubelet Ready", lambda: (
                    k := sunkd.state().nodes[node].k8s) is not None and k.ready is True)
                await asyncio.sleep(4)
                shown = slurm_cluster.scontrol("show", "node", node)
                assert "bad DIMM" in shown and "DOWN" in shown.upper(), shown  # not resumed
        finally:
            await emulator.stop()
            slurm_cluster.scontrol("update", f"nodename={node}", "state=resume", check=False)
        events = await read_all(database_url)
    assert_log_safe(events)
    touched = [e.payload for e in events if isinstance(e.payload, ActionRequested)
               and e.payload.node == node and e.payload.side == "slurm"]
    assert touched == [], touched  # sunkd never wrote to the admin's node


async def test_s2_an_operator_cordon_with_a_left_behind_annotation_is_never_lifted(
    slurm_cluster: Any,
) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                [pod] = pending_pods(emulator, 1)
                await sunkd.until("a node is lent", lambda: any(
                    n.owner == "kubernetes" for n in sunkd.state().nodes.values()), within=60)
                lent = next(n for n, s in sunkd.state().nodes.items() if s.owner == "kubernetes")
                # `kubectl uncordon` left an old sunkd annotation; now a human cordons.
                emulator.patch("nodes", lent, {
                    "metadata": {"annotations": {"sunkd.io/cordoned-by": "sunkd"}},
                    "spec": {"unschedulable": True}})
                await sunkd.until("the cordon is a hold", lambda: "cordoned" in assess(
                    sunkd.state(), sunkd.state().nodes[lent], time.time()).k8s_holds)
                await asyncio.sleep(4)
                assert emulator.get("nodes", lent)["spec"].get("unschedulable") is True
                assert pod
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)
    uncordons = [e.payload for e in events if isinstance(e.payload, ActionRequested)
                 and e.payload.verb == "uncordon"]
    assert uncordons == [], uncordons


async def test_s3_a_resumed_reclaim_finishes_to_slurm_when_the_node_object_vanishes(
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
                for _ in slurm_cluster.node_names:  # Slurm wants every node back
                    slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")

                def resumed() -> bool:
                    node = sunkd.state().nodes[lent]
                    outcome = node.outcomes.get("slurm/resume")
                    return (node.transition is not None and outcome is not None
                            and outcome.succeeded
                            and outcome.transition_id == node.transition.transition_id)

                await sunkd.until("the reclaim resumed the node in Slurm", lambda: resumed()
                                  or sunkd.owner(lent) == "slurm", within=90)
                emulator.delete("nodes", lent)  # the Node object vanishes
                await sunkd.until("the node belongs to Slurm", lambda:
                                  sunkd.owner(lent) == "slurm"
                                  and sunkd.state().nodes[lent].transition is None, within=30)
        finally:
            await emulator.stop()
            slurm_cluster.run("scancel", "--partition=gpu", check=False)
        events = await read_all(database_url)
    assert_log_safe(events)
    reclaims = {e.payload.transition_id for e in events
                if type(e.payload).__name__ == "TransitionStarted"
                and e.payload.node == lent and e.payload.to_owner == "slurm"}
    aborted = [e.payload for e in events if isinstance(e.payload, TransitionAborted)
               and e.payload.transition_id in reclaims]
    completed = [e.payload for e in events if isinstance(e.payload, TransitionCompleted)
                 and e.payload.transition_id in reclaims]
    assert aborted == [] and completed, (aborted, completed)
