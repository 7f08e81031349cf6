"""policy/v1 PodDisruptionBudgets and the Eviction subresource, on both backends (the API
emulator and the real kube-apiserver with the real disruption controller;
tests/integration/kube_backends.py), over raw HTTP.

disruptionsAllowed is computed from matching healthy pods against minAvailable /
maxUnavailable; an eviction is 201 and deletes the pod, or 429 TooManyRequests (no
Retry-After header) with a DisruptionBudget cause when the budget allows no disruption.
The real controller computes PDB status asynchronously, so the tests wait for the status
of the PDB's current generation before they evict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sunkd_testbed.kubeapi import KubeAPIEmulator, KubeAPIError
from tests.integration.kube_backends import Kube
from tests.integration.kubeapi_support import MERGE, Raw, pod

PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


@pytest.fixture
async def raw(kube: Kube) -> AsyncIterator[Raw]:
    async with kube.raw() as client:
        yield client


def pdb(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}}
    body.update(spec)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"}, "spec": body}


def eviction(name: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"}, "deleteOptions": {}}


def evict_path(name: str) -> str:
    return f"/api/v1/namespaces/default/pods/{name}/eviction"


async def create_pod(raw: Raw, name: str, node: str, labels: dict[str, str], *,
                     ready: bool = True, phase: str = "Running") -> None:
    """A pod as a kubelet would report it: created, then its status written."""
    body = pod(name, node, labels, ready=ready, phase=phase)
    status = body.pop("status")
    code, created = await raw.post("/api/v1/namespaces/default/pods", body)
    assert code == 201, created
    code, patched = await raw.patch(f"/api/v1/namespaces/default/pods/{name}/status",
                                    {"status": status}, MERGE)
    assert code == 200, patched


async def create_pdb(raw: Raw, body: dict[str, Any]) -> None:
    code, created = await raw.post(PDBS, body)
    assert code == 201, created


async def pdb_status(raw: Raw, name: str, *, within: float = 30.0,
                     **expected: int) -> dict[str, Any]:
    """The PDB's status once the disruption controller (the real one, or the emulator's
    stand-in) has observed its current generation and shows the `expected` values."""
    deadline = time.monotonic() + within
    while True:
        _, got = await raw.get(f"{PDBS}/{name}")
        status: dict[str, Any] = got.get("status") or {}
        if status.get("observedGeneration") == got["metadata"].get("generation") and all(
                status.get(key) == value for key, value in expected.items()):
            return status
        assert time.monotonic() < deadline, f"PDB {name}: status stays {status}"
        await asyncio.sleep(0.05)


async def test_pdb_status_follows_pods(kube: Kube, raw: Raw) -> None:
    await create_pod(raw, "w1", "n1", {"app": "web"})
    await create_pod(raw, "w2", "n2", {"app": "web"})
    await create_pod(raw, "w3", "n3", {"app": "web"}, ready=False)
    await create_pod(raw, "other", "n1", {"app": "db"})
    await create_pdb(raw, pdb("min1", minAvailable=1))
    st = await pdb_status(raw, "min1", expectedPods=3, currentHealthy=2, desiredHealthy=1,
                          disruptionsAllowed=1)
    assert st["observedGeneration"] == 1
    code, _ = await raw.patch(f"{PDBS}/min1", {"spec": {"minAvailable": None,
                                                        "maxUnavailable": "50%"}}, MERGE)
    assert code == 200
    if kube.real:
        # The real controller counts a percentage (or maxUnavailable) against the pods'
        # controllers' scale; these pods have no controller, so nothing is expected and
        # nothing may be disrupted (it warns "UnmanagedPods"). The emulator counts them:
        # docs/kubernetes.md, "Emulator vs the real API server".
        st = await pdb_status(raw, "min1", expectedPods=0, desiredHealthy=0,
                              disruptionsAllowed=0)
    else:
        # maxUnavailable 50% of 3 rounds up to 2: desired 1, healthy 2 → 1 allowed.
        st = await pdb_status(raw, "min1", desiredHealthy=1, disruptionsAllowed=1)
    assert st["observedGeneration"] == 2
    code, _ = await raw.patch(f"{PDBS}/min1", {"spec": {"minAvailable": 1,
                                                        "maxUnavailable": None}}, MERGE)
    assert code == 200
    await pdb_status(raw, "min1", expectedPods=3, disruptionsAllowed=1)
    code, _ = await raw.request("DELETE", "/api/v1/namespaces/default/pods/w1",
                                params={"gracePeriodSeconds": "0"})
    assert code == 200
    await pdb_status(raw, "min1", expectedPods=2, currentHealthy=1, disruptionsAllowed=0)


async def test_eviction_blocked_by_pdb_is_429_without_retry_after(kube: Kube,
                                                                  raw: Raw) -> None:
    await create_pod(raw, "w1", "n1", {"app": "web"})
    await create_pdb(raw, pdb("keep1", minAvailable=1))
    await pdb_status(raw, "keep1", currentHealthy=1, disruptionsAllowed=0)
    async with raw.session.post(kube.url + evict_path("w1"), json=eviction("w1")) as resp:
        body = await resp.json()
        assert resp.status == 429
        assert "Retry-After" not in resp.headers
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{
        "reason": "DisruptionBudget",
        "message": "The disruption budget keep1 needs 1 healthy pods and has 1 currently"}]
    assert (await raw.get("/api/v1/namespaces/default/pods/w1"))[0] == 200


async def test_eviction_allowed_deletes_pod_and_consumes_budget(kube: Kube, raw: Raw) -> None:
    if kube.emulator is not None:
        # Keep evicted pods terminating to see the budget consumed (the real server has no
        # kubelet here to finish them).
        kube.emulator.pod_removal_delay = None
    await create_pod(raw, "w1", "n1", {"app": "web"})
    await create_pod(raw, "w2", "n2", {"app": "web"})
    await create_pdb(raw, pdb("keep1", minAvailable=1))
    await pdb_status(raw, "keep1", currentHealthy=2, disruptionsAllowed=1)
    status, body = await raw.post(evict_path("w1"), eviction("w1"))
    assert status == 201
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "code": 201}
    _, w1 = await raw.get("/api/v1/namespaces/default/pods/w1")
    assert w1["metadata"]["deletionTimestamp"]
    # w1 is disrupted (status.disruptedPods, until the controller sees it terminating) and
    # then terminating: no healthy pod to spare either way.
    await pdb_status(raw, "keep1", currentHealthy=1, disruptionsAllowed=0)
    status, _ = await raw.post(evict_path("w2"), eviction("w2"))
    assert status == 429
    # Once w1 is gone and a replacement is healthy, the budget allows one again.
    code, _ = await raw.request("DELETE", "/api/v1/namespaces/default/pods/w1",
                                params={"gracePeriodSeconds": "0"})
    assert code == 200
    await create_pod(raw, "w3", "n3", {"app": "web"})
    await pdb_status(raw, "keep1", currentHealthy=2, disruptionsAllowed=1)
    status, _ = await raw.post(evict_path("w2"), eviction("w2"))
    assert status == 201


async def test_eviction_edge_cases(raw: Raw) -> None:
    await create_pod(raw, "pending", "", {"app": "web"}, ready=False, phase="Pending")
    await create_pod(raw, "w1", "n1", {"app": "web"})
    await create_pdb(raw, pdb("keep1", minAvailable=1))
    await pdb_status(raw, "keep1", currentHealthy=1)
    # Pending pods are deleted without looking at PDBs.
    status, _ = await raw.post(evict_path("pending"), eviction("pending"))
    assert status == 201
    assert (await raw.get("/api/v1/namespaces/default/pods/pending"))[0] == 404
    status, body = await raw.post(evict_path("missing"), eviction("missing"))
    assert status == 404
    status, body = await raw.post(evict_path("w1"), eviction("other-name"))
    assert status == 400
    await create_pdb(raw, pdb("second", maxUnavailable=1))
    status, body = await raw.post(evict_path("w1"), eviction("w1"))
    assert status == 500 and "more than one PodDisruptionBudget" in body["message"]
    # No PDB matching: plain deletion.
    await create_pod(raw, "free", "n1", {"app": "free"})
    status, _ = await raw.post(evict_path("free"), eviction("free"))
    assert status == 201
    # dryRun=All checks but writes nothing.
    assert (await raw.delete(f"{PDBS}/second"))[0] == 200
    await create_pod(raw, "w2", "n2", {"app": "web"})
    await pdb_status(raw, "keep1", currentHealthy=2, disruptionsAllowed=1)
    status, _ = await raw.request("POST", evict_path("w2"), eviction("w2"),
                                  params={"dryRun": "All"})
    assert status == 201
    _, w2 = await raw.get("/api/v1/namespaces/default/pods/w2")
    assert not w2["metadata"].get("deletionTimestamp")


async def test_in_process_evict_raises_the_same_error(api: KubeAPIEmulator) -> None:
    """The emulator's in-process helper (no HTTP; nothing to compare on a real server)."""
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pdb("keep1", minAvailable="100%"))
    with pytest.raises(KubeAPIError) as info:
        api.evict("w1")
    assert info.value.code == 429


async def test_discovery_advertises_eviction_for_drain(raw: Raw) -> None:
    _, resources = await raw.get("/api/v1")
    entry = next(r for r in resources["resources"] if r["name"] == "pods/eviction")
    assert (entry["group"], entry["version"], entry["kind"]) == ("policy", "v1", "Eviction")
