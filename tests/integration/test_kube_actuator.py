"""Kubernetes actuator over HTTP, on both backends (the API emulator and the real
kube-apiserver with its controllers; tests/integration/kube_backends.py): idempotency,
409 races on the atomic taints list, cordon ownership, eviction under a PodDisruptionBudget
whose status the (real or stand-in) disruption controller computes, Events on the Node.
Injected 409s are emulator-only."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.events import Label
from sunkd.domain.ports import ActionError
from sunkd.domain.state import OpenAction
from sunkd.kubernetes.actuator import API_CALLS, KubernetesActuator
from sunkd.kubernetes.client import EVENTS, NODES, PDBS, PODS, KubeApiError, KubeClient
from sunkd.runtime.executor import ActuatorExecutor

from ..conftest import require
from .kube_backends import Kube
from .kube_helpers import (
    create_node,
    create_pod,
    ensure_namespace,
    install_crd,
    nodeset_body,
    set_pod_phase,
)


def taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in (node.get("spec") or {}).get("taints") or []}


async def node_events(client: KubeClient, node: str) -> list[dict[str, Any]]:
    items, _ = await client.list(
        EVENTS, namespace="default", field_selector=f"involvedObject.name={node}"
    )
    return items


async def test_lock_unlock_idempotent_and_preserve_foreign_taints(kube: Kube) -> None:
    client = kube.client
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


async def test_missing_node_is_not_retryable(kube: Kube) -> None:
    client = kube.client
    with pytest.raises(ActionError) as caught:
        await KubernetesActuator(client).lock("nope")
    assert caught.value.retryable is False


async def test_concurrent_taint_writers_lose_nothing(kube: Kube) -> None:
    """Ten foreign controllers add their own taints with the same read-modify-write protocol
    while two sunkd actuators lock and unlock: every foreign taint survives and conflicts did
    happen (so the test exercised the 409 path)."""
    client = kube.client
    await create_node(client, "n1")
    if kube.emulator is not None:
        kube.emulator.set_latency(0.01)  # widen the read-modify-write window
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

    second_client = await kube.new_client()
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
        if kube.emulator is not None:
            kube.emulator.set_latency(0)


@pytest.mark.emulator_only("an injected 409 on the next PATCH")
async def test_injected_409_is_retried(kube: Kube) -> None:
    emulator, client = kube.faults, kube.client
    await create_node(client, "n1")
    actuator = KubernetesActuator(client, max_conflict_retries=3)
    emulator.fail_next(2, 409, method="PATCH", path_contains="/nodes/n1")
    assert await actuator.lock("n1") is True
    assert "sunkd.io/owner" in taint_keys(await client.get(NODES, "n1"))


@pytest.mark.emulator_only("injected 409s on the next PATCHes")
async def test_conflicts_exhausted_is_retryable(kube: Kube) -> None:
    emulator, client = kube.faults, kube.client
    await create_node(client, "n1")
    actuator = KubernetesActuator(client, max_conflict_retries=2)
    emulator.fail_next(3, 409, method="PATCH", path_contains="/nodes/n1")
    with pytest.raises(ActionError) as caught:
        await actuator.lock("n1")
    assert caught.value.retryable
    assert "sunkd.io/owner" not in taint_keys(await client.get(NODES, "n1"))
    assert await actuator.lock("n1") is True  # the outbox's retry later succeeds


async def test_cordon_ownership(kube: Kube) -> None:
    """sunkd's hold is its own taint; spec.unschedulable (a cordon) is never touched."""
    client = kube.client
    await create_node(client, "ours")
    await create_node(client, "theirs")
    actuator = KubernetesActuator(client)

    assert await actuator.hold("ours", "lent to kubernetes") is True
    assert await actuator.hold("ours", "lent to kubernetes") is False
    node = await client.get(NODES, "ours")
    assert not node["spec"].get("unschedulable")
    assert {"key": "sunkd.io/slurm-hold", "value": "slurm", "effect": "NoSchedule"} in [
        {k: t[k] for k in ("key", "value", "effect")} for t in node["spec"]["taints"]]
    assert node["metadata"]["annotations"]["sunkd.io/cordon-reason"] == "lent to kubernetes"
    assert await actuator.release("ours") is True
    assert await actuator.release("ours") is False
    node = await client.get(NODES, "ours")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == "sunkd.io/slurm-hold"]
    assert "sunkd.io/cordon-reason" not in (node["metadata"].get("annotations") or {})

    # A human ran `kubectl cordon theirs`: sunkd adds its hold beside it and, removing its
    # hold, leaves the cordon in place.
    await client.merge_patch(NODES, "theirs", {"spec": {"unschedulable": True}})
    assert await actuator.hold("theirs", "whatever") is True
    assert await actuator.release("theirs") is True
    assert (await client.get(NODES, "theirs"))["spec"]["unschedulable"] is True


async def test_s2_an_operator_cordon_after_uncordon_is_never_lifted(kube: Kube) -> None:
    """Safety scenario 2 on the API: older sunkd marked its cordons with an annotation that
    `kubectl uncordon` leaves behind; a later human cordon then looked like sunkd's. Now the
    annotation proves nothing and sunkd never sets or clears spec.unschedulable."""
    client = kube.client
    await create_node(client, "op")
    actuator = KubernetesActuator(client)
    await client.merge_patch(NODES, "op", {
        "metadata": {"annotations": {"sunkd.io/cordoned-by": "sunkd"}},  # left behind
        "spec": {"unschedulable": True}})  # `kubectl cordon op`
    await actuator.release("op")
    node = await client.get(NODES, "op")
    assert node["spec"]["unschedulable"] is True  # the operator's cordon stays
    assert "sunkd.io/cordoned-by" not in (node["metadata"].get("annotations") or {})


async def test_annotate(kube: Kube) -> None:
    client = kube.client
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


async def pdb_status(client: KubeClient, namespace: str, name: str, allowed: int,
                     within: float = 30.0) -> dict[str, Any]:
    """The PDB's status once the disruption controller (real, or the emulator's stand-in)
    has seen its current generation and allows `allowed` disruptions."""
    deadline = time.monotonic() + within
    while True:
        pdb = await client.get(PDBS, name, namespace)
        status = pdb.get("status") or {}
        if status.get("observedGeneration") == pdb["metadata"].get("generation") and \
                status.get("disruptionsAllowed") == allowed:
            return dict(status)
        assert time.monotonic() < deadline, f"PDB {name} status stays {status}"
        await asyncio.sleep(0.05)


async def test_evict_honours_pdb(kube: Kube) -> None:
    client = kube.client
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
    await client.create(PDBS, pdb, "ml")
    status = await pdb_status(client, "ml", "serve", allowed=0)
    assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"]) == (
        2, 2, 2)

    actuator = KubernetesActuator(client)
    with pytest.raises(ActionError) as caught:
        await actuator.evict("ml", "serve-0")
    assert caught.value.retryable
    assert "PDB" in str(caught.value)
    assert (await client.get(PODS, "serve-0", "ml"))["metadata"].get("deletionTimestamp") is None

    # The budget is relaxed; the disruption controller recomputes its status.
    await client.merge_patch(PDBS, "serve", {"spec": {"minAvailable": 1}}, "ml")
    await pdb_status(client, "ml", "serve", allowed=1)
    assert await actuator.evict("ml", "serve-0") is True
    assert await actuator.evict("ml", "serve-0") is False  # gone or terminating
    assert await actuator.evict("ml", "never-existed") is False
    reasons = [e["reason"] for e in await node_events(client, "n1")]
    assert "SunkdEvicted" in reasons


async def test_nodeset_status(kube: Kube) -> None:
    client = kube.client
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


async def test_not_leader_does_not_act(kube: Kube) -> None:
    client = kube.client
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


async def test_repeated_event_bumps_count(kube: Kube) -> None:
    client = kube.client
    await create_node(client, "n1")
    actuator = KubernetesActuator(client)
    assert await actuator.record_event("n1", "SunkdTest", "same words", "Warning")
    assert await actuator.record_event("n1", "SunkdTest", "same words", "Warning")
    events = [e for e in await node_events(client, "n1") if e["reason"] == "SunkdTest"]
    assert len(events) == 1
    assert events[0]["count"] == 2 and events[0]["type"] == "Warning"


@pytest.mark.kubectl
async def test_kubectl_describe_node_tells_the_story(kube: Kube, tmp_path: Path) -> None:
    """`kubectl describe node` (the system kubectl 1.32 on the emulator, the built one on
    the real server) shows sunkd's Events, its hold reason and its taint."""
    if kube.plane is not None:
        kubectl = str(kube.plane.binaries["kubectl"])
    else:
        found = shutil.which("kubectl")
        require(found is not None, "kubectl is not installed")
        kubectl = str(found)
    client = kube.client
    await create_node(client, "n1")
    actuator = KubernetesActuator(client)
    await actuator.lock("n1")
    await actuator.hold("n1", "lent to kubernetes [tx 42]")
    config = kube.write_kubeconfig(tmp_path / "kubeconfig")
    process = await asyncio.create_subprocess_exec(
        kubectl, "--kubeconfig", str(config), "describe", "node", "n1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECACHEDIR": str(tmp_path / "cache")},
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    text = out.decode()
    assert process.returncode == 0, err.decode()
    assert "SunkdLocked" in text and "SunkdCordoned" in text
    assert "lent to kubernetes [tx 42]" in text
    assert "sunkd.io/owner=slurm:NoSchedule" in text


def _warn_action(action_id: str) -> OpenAction:
    return OpenAction(
        action_id=action_id, transition_id=None, side="kubernetes", verb="warn", node="n1",
        attempt=1, reason="conflict: Slurm job beside pods",
        args=(Label("event_reason", "SunkdConflict"),
              Label("message", f"conflict: Slurm job beside pods ({action_id})")),
        requested_at=0.0, seq=1)


@pytest.mark.emulator_only("the API server refusing or failing the Event's POST")
@pytest.mark.parametrize(("status", "retryable"), [(403, False), (422, False),
                                                   (429, True), (503, True)])
async def test_a_warning_the_api_server_refused_fails_the_warn_action(
        kube: Kube, status: int, retryable: bool) -> None:
    """A `warn` is the policy's "say why": an Event that was never written is a failed
    action (retried as its error deserves), never a success that silences the warning."""
    emulator, client = kube.faults, kube.client
    await create_node(client, "n1")
    executor = ActuatorExecutor(None, KubernetesActuator(client))
    emulator.fail_next(1, status, method="POST", path_contains="/events")
    with pytest.raises(ActionError) as caught:
        await executor.execute(_warn_action("a1"), None)
    assert caught.value.retryable is retryable
    assert [e for e in await node_events(client, "n1") if e["reason"] == "SunkdConflict"] == []
    assert await executor.execute(_warn_action("a1"), None) is True  # the retry posts it
    [event] = [e for e in await node_events(client, "n1") if e["reason"] == "SunkdConflict"]
    assert event["type"] == "Warning" and "(a1)" in event["message"]


@pytest.mark.emulator_only("the API server failing the Event's PATCH")
async def test_a_repeated_warning_whose_count_bump_failed_fails_the_warn_action(
        kube: Kube) -> None:
    emulator, client = kube.faults, kube.client
    await create_node(client, "n1")
    executor = ActuatorExecutor(None, KubernetesActuator(client))
    assert await executor.execute(_warn_action("a1"), None) is True
    emulator.fail_next(1, 500, method="PATCH", path_contains="/events")
    with pytest.raises(ActionError) as caught:
        await executor.execute(_warn_action("a1"), None)
    assert caught.value.retryable
