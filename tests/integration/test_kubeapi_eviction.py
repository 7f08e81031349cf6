"""Kubernetes API emulator: policy/v1 PodDisruptionBudgets and the Eviction subresource.

disruptionsAllowed is computed from matching healthy pods against minAvailable /
maxUnavailable; an eviction is 201 and deletes the pod, or 429 TooManyRequests (no
Retry-After header) with a DisruptionBudget cause when the budget allows no disruption.
"""

from __future__ import annotations

from typing import Any

import pytest

from sunkd.testbed.kubeapi import KubeAPIEmulator, KubeAPIError
from tests.integration.kubeapi_support import Raw, pod


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


async def test_pdb_status_follows_pods(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pod("w2", "n2", {"app": "web"}))
    api.create(pod("w3", "n3", {"app": "web"}, ready=False))
    api.create(pod("other", "n1", {"app": "db"}))
    status, _ = await raw.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets",
                                     pdb("min1", minAvailable=1))
    assert status == 201
    _, got = await raw.get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/min1")
    st = got["status"]
    assert (st["expectedPods"], st["currentHealthy"], st["desiredHealthy"],
            st["disruptionsAllowed"]) == (3, 2, 1, 1)
    assert st["observedGeneration"] == 1
    api.patch("poddisruptionbudgets", "min1", {"spec": {"minAvailable": None,
                                                        "maxUnavailable": "50%"}}, "default")
    st = api.get("pdb", "min1", "default")["status"]
    # maxUnavailable 50% of 3 rounds up to 2: desired 1, healthy 2 → 1 allowed.
    assert (st["desiredHealthy"], st["disruptionsAllowed"]) == (1, 1)
    assert st["observedGeneration"] == 2
    api.delete("pods", "w1", "default")
    st = api.get("pdb", "min1", "default")["status"]
    assert (st["expectedPods"], st["currentHealthy"], st["disruptionsAllowed"]) == (2, 1, 0)


async def test_eviction_blocked_by_pdb_is_429_without_retry_after(api: KubeAPIEmulator,
                                                                  raw: Raw) -> None:
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pdb("keep1", minAvailable=1))
    async with raw.session.post(api.url + evict_path("w1"), json=eviction("w1")) as resp:
        body = await resp.json()
        assert resp.status == 429
        assert "Retry-After" not in resp.headers
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{
        "reason": "DisruptionBudget",
        "message": "The disruption budget keep1 needs 1 healthy pods and has 1 currently"}]
    assert (await raw.get("/api/v1/namespaces/default/pods/w1"))[0] == 200


async def test_eviction_allowed_deletes_pod_and_consumes_budget(api: KubeAPIEmulator,
                                                                raw: Raw) -> None:
    api.pod_removal_delay = None  # keep evicted pods terminating to see the budget consumed
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pod("w2", "n2", {"app": "web"}))
    api.create(pdb("keep1", minAvailable=1))
    status, body = await raw.post(evict_path("w1"), eviction("w1"))
    assert status == 201
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "code": 201}
    _, w1 = await raw.get("/api/v1/namespaces/default/pods/w1")
    assert w1["metadata"]["deletionTimestamp"]
    st = api.get("pdb", "keep1", "default")["status"]
    assert st["disruptionsAllowed"] == 0
    status, _ = await raw.post(evict_path("w2"), eviction("w2"))
    assert status == 429
    # Once w1 is gone and a replacement is healthy, the budget allows one again.
    assert api.finish_pod_termination("default", "w1")
    api.create(pod("w3", "n3", {"app": "web"}))
    status, _ = await raw.post(evict_path("w2"), eviction("w2"))
    assert status == 201


async def test_eviction_edge_cases(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(pod("pending", "", {"app": "web"}, phase="Pending"))
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pdb("keep1", minAvailable=1))
    # Pending pods are deleted without looking at PDBs.
    status, _ = await raw.post(evict_path("pending"), eviction("pending"))
    assert status == 201
    assert (await raw.get("/api/v1/namespaces/default/pods/pending"))[0] == 404
    status, body = await raw.post(evict_path("missing"), eviction("missing"))
    assert status == 404
    status, body = await raw.post(evict_path("w1"), eviction("other-name"))
    assert status == 400
    api.create(pdb("second", maxUnavailable=1))
    status, body = await raw.post(evict_path("w1"), eviction("w1"))
    assert status == 500 and "more than one PodDisruptionBudget" in body["message"]
    # No PDB matching: plain deletion.
    api.create(pod("free", "n1", {"app": "free"}))
    status, _ = await raw.post(evict_path("free"), eviction("free"))
    assert status == 201
    # dryRun=All checks but writes nothing.
    api.delete("pdb", "second", "default")
    api.create(pod("w2", "n2", {"app": "web"}))
    status, _ = await raw.request("POST", evict_path("w2"), eviction("w2"),
                                  params={"dryRun": "All"})
    assert status == 201
    assert (await raw.get("/api/v1/namespaces/default/pods/w2"))[0] == 200


async def test_in_process_evict_raises_the_same_error(api: KubeAPIEmulator) -> None:
    api.create(pod("w1", "n1", {"app": "web"}))
    api.create(pdb("keep1", minAvailable="100%"))
    with pytest.raises(KubeAPIError) as info:
        api.evict("w1")
    assert info.value.code == 429


async def test_discovery_advertises_eviction_for_drain(raw: Raw) -> None:
    _, resources = await raw.get("/api/v1")
    entry = next(r for r in resources["resources"] if r["name"] == "pods/eviction")
    assert (entry["group"], entry["version"], entry["kind"]) == ("policy", "v1", "Eviction")
