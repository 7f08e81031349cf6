"""Kubernetes actuator against the API emulator over HTTP: idempotency, 409 races on the atomic
taints list, cordon ownership, eviction under a PodDisruptionBudget, Events on the Node."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.ports import ActionError
from sunkd.kubernetes.actuator import API_CALLS, KubernetesActuator
from sunkd.kubernetes.client import EVENTS, NODES, PDBS, PODS, KubeApiError, KubeClient

from ..conftest import require
from .kube_helpers import (
    create_node,
    create_pod,
    ensure_namespace,
    install_crd,
    nodeset_body,
    running_emulator,
    set_pod_phase,
)


@pytest.fixture
async def kube() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with running_emulator() as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            yield emulator, client
        finally:
            await client.close()


def taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in (node.get("spec") or {}).get("taints") or []}


async def node_events(client: KubeClient, node: str) -> list[dict[str, Any]]:
    items, _ = await client.list(
        EVENTS, namespace="default", field_selector=f"involvedObject.name={node}"
    )
    return items


async def test_lock_unlock_idempotent_and_preserve_foreign_taints(
    kube: tuple[Any, KubeClient],
) -> None:
    _, client = kube
    await create_node(client, "n1")
    await client.merge_patch(NODES, "n1", {"spec": {"taints": [
        {"key": "example.com/gpu-broken", "effect": "NoExecute"}]}})
    actuator = KubernetesActuator(client)

    assert await actuator.lock("n1") is True
    assert await actuator.lock("n1") is False
    node = await client.get(NODES, "n1")
    assert taint_keys(node) == {"example.com/gpu-broken", "sunkd.io/owner"}
    ours = next(t for t in node["spec"]["taints"] if t["key"] == "sunkd.io/owner")
    assert (ours["value"], ours["effect"]) == ("slurm", "NoSchedule")
    assert node["metadata"]["labels"]["sunkd.io/owner"] == "slurm"

    assert await actuator.unlock("n1") is True
    assert await actuator.unlock("n1") is False
    node = await client.get(NODES, "n1")
    assert taint_keys(node) == {"example.com/gpu-broken"}
    assert node["metadata"]["labels"]["sunkd.io/owner"] == "kubernetes"

    reasons = [e["reason"] for e in await node_events(client, "n1")]
    assert reasons.count("SunkdLocked") == 1 and reasons.count("SunkdUnlocked") == 1
    event = next(e for e in await node_events(client, "n1") if e["reason"] == "SunkdLocked")
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert event["source"]["component"] == "sunkd"
    assert event["reportingComponent"] == "sunkd.io/sunkd"


async def test_missing_node_is_not_retryable(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    with pytest.raises(ActionError) as caught:
        await KubernetesActuator(client).lock("nope")
    assert caught.value.retryable is False


async def test_concurrent_taint_writers_lose_nothing(kube: tuple[Any, KubeClient]) -> None:
    """Ten foreign controllers add their own taints with the same read-modify-write protocol
    while two sunkd actuators lock and unlock: every foreign taint survives and conflicts did
    happen (so the test exercised the 409 path)."""
    emulator, client = kube
    await create_node(client, "n1")
    emulator.set_latency(0.01)  # widen the read-modify-write window
    conflicts = 0

    async def foreign_writer(index: int) -> None:
        nonlocal conflicts
        while True:
            node = await client.get(NODES, "n1")
            taints = list(node["spec"].get("taints") or [])
            taints.append({"key": f"example.com/t{index}", "effect": "NoSchedule"})
            try:
                await client.merge_patch(NODES, "n1", {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"taints": taints}})
                return
            except KubeApiError as error:
                assert error.status == 409
                conflicts += 1

    second_client = KubeClient.for_url(emulator.url)
    try:
        a = KubernetesActuator(client, max_conflict_retries=50)
        b = KubernetesActuator(second_client, max_conflict_retries=50)
        await asyncio.gather(
            *(foreign_writer(i) for i in range(10)), a.lock("n1"), b.lock("n1")
        )
        node = await client.get(NODES, "n1")
        assert taint_keys(node) == {f"example.com/t{i}" for i in range(10)} | {"sunkd.io/owner"}
        assert [t["key"] for t in node["spec"]["taints"]].count("sunkd.io/owner") == 1
        await asyncio.gather(
            *(foreign_writer(i) for i in range(10, 15)), a.unlock("n1"), b.unlock("n1")
        )
        node = await client.get(NODES, "n1")
        assert taint_keys(node) == {f"example.com/t{i}" for i in range(15)}
        assert conflicts > 0
    finally:
        emulator.set_latency(0)
        await second_client.close()


async def test_injected_409_is_retried(kube: tuple[Any, KubeClient]) -> None:
    emulator, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client, max_conflict_retries=3)
    emulator.fail_next(2, 409, method="PATCH", path_contains="/nodes/n1")
    assert await actuator.lock("n1") is True
    assert "sunkd.io/owner" in taint_keys(await client.get(NODES, "n1"))


async def test_conflicts_exhausted_is_retryable(kube: tuple[Any, KubeClient]) -> None:
    emulator, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client, max_conflict_retries=2)
    emulator.fail_next(3, 409, method="PATCH", path_contains="/nodes/n1")
    with pytest.raises(ActionError) as caught:
        await actuator.lock("n1")
    assert caught.value.retryable
    assert "sunkd.io/owner" not in taint_keys(await client.get(NODES, "n1"))
    assert await actuator.lock("n1") is True  # the outbox's retry later succeeds


async def test_cordon_ownership(kube: tuple[Any, KubeClient]) -> None:
    """sunkd's hold is its own taint; spec.unschedulable (a cordon) is never touched."""
    _, client = kube
    await create_node(client, "ours")
    await create_node(client, "theirs")
    actuator = KubernetesActuator(client)

    assert await actuator.cordon("ours", "lent to kubernetes") is True
    assert await actuator.cordon("ours", "lent to kubernetes") is False
    node = await client.get(NODES, "ours")
    assert not node["spec"].get("unschedulable")
    assert {"key": "sunkd.io/slurm-hold", "value": "slurm", "effect": "NoSchedule"} in [
        {k: t[k] for k in ("key", "value", "effect")} for t in node["spec"]["taints"]]
    assert node["metadata"]["annotations"]["sunkd.io/cordon-reason"] == "lent to kubernetes"
    assert await actuator.uncordon("ours") is True
    assert await actuator.uncordon("ours") is False
    node = await client.get(NODES, "ours")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == "sunkd.io/slurm-hold"]
    assert "sunkd.io/cordon-reason" not in (node["metadata"].get("annotations") or {})

    # A human ran `kubectl cordon theirs`: sunkd adds its hold beside it and, removing its
    # hold, leaves the cordon in place.
    await client.merge_patch(NODES, "theirs", {"spec": {"unschedulable": True}})
    assert await actuator.cordon("theirs", "whatever") is True
    assert await actuator.uncordon("theirs") is True
    assert (await client.get(NODES, "theirs"))["spec"]["unschedulable"] is True


async def test_s2_an_operator_cordon_after_uncordon_is_never_lifted(
    kube: tuple[Any, KubeClient],
) -> None:
    """Safety scenario 2 on the API: older sunkd marked its cordons with an annotation that
    `kubectl uncordon` leaves behind; a later human cordon then looked like sunkd's. Now the
    annotation proves nothing and sunkd never sets or clears spec.unschedulable."""
    _, client = kube
    await create_node(client, "op")
    actuator = KubernetesActuator(client)
    await client.merge_patch(NODES, "op", {
        "metadata": {"annotations": {"sunkd.io/cordoned-by": "sunkd"}},  # left behind
        "spec": {"unschedulable": True}})  # `kubectl cordon op`
    await actuator.uncordon("op")
    node = await client.get(NODES, "op")
    assert node["spec"]["unschedulable"] is True  # the operator's cordon stays
    assert "sunkd.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def test_annotate(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client)
    values = {"sunkd.io/slurm-state": "IDLE", "sunkd.io/slurm-reason": "x"}
    assert await actuator.annotate("n1", values) is True
    assert await actuator.annotate("n1", values) is False
    assert await actuator.annotate("n1", {"sunkd.io/slurm-reason": None}) is True
    annotations = (await client.get(NODES, "n1"))["metadata"]["annotations"]
    assert annotations.get("sunkd.io/slurm-state") == "IDLE"
    assert "sunkd.io/slurm-reason" not in annotations
    with pytest.raises(ActionError):
        await actuator.annotate("n1", {"example.com/x": "y"})


async def test_evict_honours_pdb(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    await ensure_namespace(client, "ml")
    await create_node(client, "n1")
    ready = [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]
    for name in ("serve-0", "serve-1"):
        await create_pod(client, "ml", name, {"app": "serve"}, node="n1")
        await set_pod_phase(client, "ml", name, "Running", ready)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve", "namespace": "ml"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}},
    }
    created = await client.create(PDBS, pdb, "ml")
    status = {"observedGeneration": created["metadata"].get("generation", 1),
              "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2,
              "expectedPods": 2}
    await client.merge_patch(PDBS, "serve", {"status": status}, "ml", subresource="status")

    actuator = KubernetesActuator(client)
    with pytest.raises(ActionError) as caught:
        await actuator.evict("ml", "serve-0")
    assert caught.value.retryable
    assert "PDB" in str(caught.value)
    assert (await client.get(PODS, "serve-0", "ml"))["metadata"].get("deletionTimestamp") is None

    # The budget is relaxed; the emulator (like the disruption controller) recomputes status.
    await client.merge_patch(PDBS, "serve", {"spec": {"minAvailable": 1}}, "ml")
    await client.merge_patch(PDBS, "serve", {"status": {
        "observedGeneration": 2, "disruptionsAllowed": 1, "currentHealthy": 2,
        "desiredHealthy": 1, "expectedPods": 2}}, "ml", subresource="status")
    assert await actuator.evict("ml", "serve-0") is True
    assert await actuator.evict("ml", "serve-0") is False  # gone or terminating
    assert await actuator.evict("ml", "never-existed") is False
    reasons = [e["reason"] for e in await node_events(client, "n1")]
    assert "SunkdEvicted" in reasons


async def test_nodeset_status(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    rt = await install_crd(client)
    await ensure_namespace(client, "ml")
    await client.create(rt, nodeset_body("ml", "gpu", node_selector={"pool": "gpu"},
                                         workload_selector={"app": "serve"},
                                         group=rt.group, version=rt.version), "ml")
    actuator = KubernetesActuator(client, nodeset_resource=rt)
    status = {"observedGeneration": 1, "counts": {"nodes": 4, "slurm": 3, "kubernetes": 1}}
    assert await actuator.update_nodeset_status("ml", "gpu", status) is True
    assert await actuator.update_nodeset_status("ml", "gpu", status) is False
    obj = await client.get(rt, "gpu", "ml")
    assert obj["status"]["counts"]["slurm"] == 3
    assert await actuator.update_nodeset_status("ml", "gpu", {"counts": {"slurm": 2}}) is True
    obj = await client.get(rt, "gpu", "ml")
    assert obj["status"]["counts"] == {"nodes": 4, "slurm": 2, "kubernetes": 1}  # merged
    assert obj["metadata"].get("generation") == 1  # status writes never bump generation


async def test_not_leader_does_not_act(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client, may_act=lambda: False)
    with pytest.raises(ActionError):
        await actuator.lock("n1")
    assert "sunkd.io/owner" not in taint_keys(await client.get(NODES, "n1"))


def test_api_calls_cover_the_verbs_used() -> None:
    verbs = {(c.verb, c.resource) for c in API_CALLS}
    for needed in [("patch", "nodes"), ("create", "pods/eviction"), ("create", "events"),
                   ("watch", "pods"), ("patch", "nodesets/status"), ("update", "leases")]:
        assert needed in verbs


async def test_repeated_event_bumps_count(kube: tuple[Any, KubeClient]) -> None:
    _, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client)
    assert await actuator.record_event("n1", "SunkdTest", "same words", "Warning")
    assert await actuator.record_event("n1", "SunkdTest", "same words", "Warning")
    events = [e for e in await node_events(client, "n1") if e["reason"] == "SunkdTest"]
    assert len(events) == 1
    assert events[0]["count"] == 2 and events[0]["type"] == "Warning"


@pytest.mark.kubectl
async def test_kubectl_describe_node_tells_the_story(
    kube: tuple[Any, KubeClient], tmp_path: Path
) -> None:
    require(shutil.which("kubectl") is not None, "kubectl is not installed")
    emulator, client = kube
    await create_node(client, "n1")
    actuator = KubernetesActuator(client)
    await actuator.lock("n1")
    await actuator.cordon("n1", "lent to kubernetes [tx 42]")
    config = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    process = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(config), "describe", "node", "n1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    text = out.decode()
    assert process.returncode == 0, err.decode()
    assert "SunkdLocked" in text and "SunkdCordoned" in text
    assert "lent to kubernetes [tx 42]" in text
    assert "sunkd.io/owner=slurm:NoSchedule" in text
