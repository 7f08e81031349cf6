"""Kubernetes API emulator: object bookkeeping over HTTP.

One global resourceVersion, no-op writes, 404/409/422 Status bodies, PUT preconditions,
status subresource rules, pod graceful deletion, selectors and paging.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.integration.kubeapi_support import Raw, node, pod


async def test_create_sets_bookkeeping_and_one_global_resource_version(raw: Raw) -> None:
    status, n = await raw.post("/api/v1/nodes", node("n1"))
    assert status == 201
    meta = n["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    status, lease = await raw.post(
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "l1"}, "spec": {"holderIdentity": "a"}})
    assert status == 201
    # One counter across types: the lease's RV is the next one after the node's.
    assert int(lease["metadata"]["resourceVersion"]) == int(meta["resourceVersion"]) + 1
    status, lst = await raw.get("/api/v1/nodes")
    assert lst["kind"] == "NodeList"
    assert lst["metadata"]["resourceVersion"] == lease["metadata"]["resourceVersion"]


async def test_not_found_and_already_exists_are_status_bodies(raw: Raw) -> None:
    status, body = await raw.get("/api/v1/nodes/nope")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'nodes "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "nodes"}
    status, body = await raw.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/x")
    assert body["message"] == 'leases.coordination.k8s.io "x" not found'
    assert body["details"]["group"] == "coordination.k8s.io"
    await raw.post("/api/v1/nodes", node("n1"))
    status, body = await raw.post("/api/v1/nodes", node("n1"))
    assert status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'nodes "n1" already exists'
    status, body = await raw.get("/api/v1/nosuchthing")
    assert status == 404 and body["message"] == (
        "the server could not find the requested resource")
    # Namespaced create into a namespace that does not exist.
    status, body = await raw.post("/api/v1/namespaces/ghost/pods", pod("p", namespace="ghost"))
    assert status == 404 and body["message"] == 'namespaces "ghost" not found'


async def test_noop_writes_change_nothing(api: KubeAPIEmulator, raw: Raw) -> None:
    _, n = await raw.post("/api/v1/nodes", node("n1", {"a": "1"}))
    rv = n["metadata"]["resourceVersion"]
    before = api.resource_version
    status, same = await raw.patch("/api/v1/nodes/n1", {"metadata": {"labels": {"a": "1"}}})
    assert status == 200 and same["metadata"]["resourceVersion"] == rv
    status, same = await raw.put("/api/v1/nodes/n1", same)
    assert status == 200 and same["metadata"]["resourceVersion"] == rv
    assert api.resource_version == before
    # ...and a watch from that RV sees nothing.
    events = await raw.watch("/api/v1/nodes", resourceVersion=rv, timeoutSeconds="1")
    assert events == []


async def test_put_with_stale_resource_version_is_conflict(raw: Raw) -> None:
    _, n = await raw.post("/api/v1/nodes", node("n1"))
    stale = dict(n)
    _, fresh = await raw.patch("/api/v1/nodes/n1", {"metadata": {"labels": {"x": "y"}}})
    status, body = await raw.put("/api/v1/nodes/n1", stale)
    assert status == 409 and body["reason"] == "Conflict"
    assert body["message"].startswith('Operation cannot be fulfilled on nodes "n1": the object '
                                      "has been modified")
    # The fresh RV works; a PUT without RV is allowed for nodes (unconditional update).
    fresh["metadata"]["labels"]["z"] = "1"
    status, _ = await raw.put("/api/v1/nodes/n1", fresh)
    assert status == 200
    fresh["metadata"].pop("resourceVersion")
    fresh["metadata"]["labels"]["z"] = "2"
    status, updated = await raw.put("/api/v1/nodes/n1", fresh)
    assert status == 200 and updated["metadata"]["labels"]["z"] == "2"
    status, _ = await raw.put("/api/v1/nodes/missing", node("missing"))
    assert status == 404


async def test_patch_with_resource_version_precondition(raw: Raw) -> None:
    _, n = await raw.post("/api/v1/nodes", node("n1"))
    rv = n["metadata"]["resourceVersion"]
    await raw.patch("/api/v1/nodes/n1", {"metadata": {"labels": {"bump": "1"}}})
    status, body = await raw.patch(
        "/api/v1/nodes/n1", {"metadata": {"resourceVersion": rv},
                             "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    assert status == 409 and body["reason"] == "Conflict"


async def test_status_subresource_for_nodes_and_pods(raw: Raw) -> None:
    _, n = await raw.post("/api/v1/nodes", node("n1"))
    # Main-resource writes keep the old status...
    n["status"] = {"conditions": []}
    n["spec"] = {"unschedulable": True}
    _, updated = await raw.put("/api/v1/nodes/n1", n)
    assert updated["status"]["conditions"][0]["type"] == "Ready"
    assert updated["spec"]["unschedulable"] is True
    # ...and /status writes keep everything but the status.
    status, st = await raw.patch("/api/v1/nodes/n1/status",
                                 {"spec": {"unschedulable": False},
                                  "status": {"phase": "Running"}})
    assert status == 200 and st["status"]["phase"] == "Running"
    assert st["spec"]["unschedulable"] is True
    # Pods: create resets status to Pending (pod strategy PrepareForCreate).
    _, p = await raw.post("/api/v1/namespaces/default/pods", pod("p1", "n1"))
    assert p["status"]["phase"] == "Pending"
    assert p["spec"]["terminationGracePeriodSeconds"] == 30
    status, got = await raw.get("/api/v1/namespaces/default/pods/p1/status")
    assert status == 200 and got["metadata"]["name"] == "p1"


async def test_pod_graceful_deletion_and_fake_kubelet(api: KubeAPIEmulator, raw: Raw) -> None:
    api.pod_removal_delay = None  # the fake kubelet never finishes on its own
    api.create(pod("unscheduled"))
    api.create(pod("running", "n1"))
    # Unscheduled pods go at once (grace 0 when spec.nodeName is empty).
    status, _ = await raw.delete("/api/v1/namespaces/default/pods/unscheduled")
    assert status == 200
    assert (await raw.get("/api/v1/namespaces/default/pods/unscheduled"))[0] == 404
    status, terminating = await raw.delete("/api/v1/namespaces/default/pods/running")
    assert status == 200 and terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert (await raw.get("/api/v1/namespaces/default/pods/running"))[0] == 200
    assert api.finish_pod_termination("default", "running")
    assert (await raw.get("/api/v1/namespaces/default/pods/running"))[0] == 404


async def test_finalizers_hold_deletion_until_removed(raw: Raw) -> None:
    n = node("n1")
    n["metadata"]["finalizers"] = ["example.com/hold"]
    await raw.post("/api/v1/nodes", n)
    status, held = await raw.delete("/api/v1/nodes/n1")
    assert status == 200 and held["metadata"]["deletionTimestamp"]
    assert (await raw.get("/api/v1/nodes/n1"))[0] == 200
    status, _ = await raw.patch("/api/v1/nodes/n1", {"metadata": {"finalizers": None}})
    assert status == 200
    assert (await raw.get("/api/v1/nodes/n1"))[0] == 404


async def test_label_selectors(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a", {"pool": "gpu", "tier": "1"}))
    api.create(node("b", {"pool": "cpu"}))
    api.create(node("c", {}))

    async def names(selector: str) -> list[str]:
        status, body = await raw.get("/api/v1/nodes", labelSelector=selector)
        assert status == 200, body
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("pool=gpu") == ["a"]
    assert await names("pool==gpu") == ["a"]
    assert await names("pool!=gpu") == ["b", "c"]  # absent key matches !=
    assert await names("pool in (gpu,cpu)") == ["a", "b"]
    assert await names("pool notin (gpu)") == ["b", "c"]
    assert await names("pool") == ["a", "b"]
    assert await names("!pool") == ["c"]
    assert await names("pool,!tier") == ["b"]
    assert await names("tier>0") == ["a"]
    status, body = await raw.get("/api/v1/nodes", labelSelector="pool in gpu")
    assert status == 400 and body["reason"] == "BadRequest"


async def test_field_selectors(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    api.create(pod("p1", "n1"))
    api.create(pod("p2", "n2", phase="Succeeded"))
    api.create(pod("p3", "n1", namespace="other"))

    async def names(path: str, selector: str) -> list[str]:
        status, body = await raw.get(path, fieldSelector=selector)
        assert status == 200, body
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("/api/v1/pods", "spec.nodeName=n1") == ["p1", "p3"]
    assert await names("/api/v1/pods",
                       "spec.nodeName=n1,metadata.namespace=default") == ["p1"]
    assert await names("/api/v1/pods", "status.phase!=Succeeded,status.phase!=Failed") == [
        "p1", "p3"]
    assert await names("/api/v1/namespaces/default/pods", "metadata.name=p2") == ["p2"]
    assert await names("/api/v1/pods", "spec.nodeName=") == []
    status, body = await raw.get("/api/v1/pods", fieldSelector="spec.bogus=1")
    assert status == 400 and body["message"] == "field label not supported: spec.bogus"
    # Events by involved object, as `kubectl describe node` asks.
    api.create({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e1", "namespace": "default"},
                "involvedObject": {"kind": "Node", "name": "n1", "uid": "n1"},
                "reason": "Lent", "message": "m", "type": "Normal"})
    assert await names("/api/v1/events", "involvedObject.kind=Node,involvedObject.uid=n1,"
                       "involvedObject.name=n1,involvedObject.namespace=") == ["e1"]
    assert await names("/api/v1/events", "involvedObject.name=n2") == []


async def test_limit_and_continue_is_a_consistent_snapshot(api: KubeAPIEmulator,
                                                           raw: Raw) -> None:
    for i in range(5):
        api.create(node(f"n{i}"))
    status, page1 = await raw.get("/api/v1/nodes", limit="2")
    assert [i["metadata"]["name"] for i in page1["items"]] == ["n0", "n1"]
    token = page1["metadata"]["continue"]
    assert page1["metadata"]["remainingItemCount"] == 3
    # Changes after the first page do not show up in later pages.
    api.delete("nodes", "n3")
    api.create(node("n9"))
    api.patch("nodes", "n2", {"metadata": {"labels": {"late": "1"}}})
    _, page2 = await raw.get("/api/v1/nodes", limit="2", **{"continue": token})
    assert [i["metadata"]["name"] for i in page2["items"]] == ["n2", "n3"]
    assert "late" not in page2["items"][0]["metadata"].get("labels", {})
    assert page2["metadata"]["resourceVersion"] == page1["metadata"]["resourceVersion"]
    _, page3 = await raw.get("/api/v1/nodes", limit="2",
                             **{"continue": page2["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in page3["items"]] == ["n4"]
    assert "continue" not in page3["metadata"]
    # Once history is compacted the token is expired: 410 reason Expired.
    api.compact_history()
    status, body = await raw.get("/api/v1/nodes", limit="2", **{"continue": token})
    assert status == 410 and body["reason"] == "Expired"


async def test_namespace_deletion_removes_contents(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tmp"}})
    api.create(pod("p", namespace="tmp"))
    status, _ = await raw.delete("/api/v1/namespaces/tmp")
    assert status == 200
    assert api.list("pods", "tmp") == []


async def test_lease_microtime_is_enforced(raw: Raw) -> None:
    lease: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l"},
             "spec": {"holderIdentity": "a", "renewTime": "2024-01-01T12:00:00+00:00"}}
    status, body = await raw.post("/apis/coordination.k8s.io/v1/namespaces/default/leases",
                                  lease)
    assert status == 400 and "2006-01-02T15:04:05.000000Z07:00" in body["message"]
    lease["spec"]["renewTime"] = "2024-01-01T12:00:00.000000Z"
    status, _ = await raw.post("/apis/coordination.k8s.io/v1/namespaces/default/leases", lease)
    assert status == 201


async def test_event_involved_object_namespace_must_match(raw: Raw) -> None:
    status, body = await raw.post("/api/v1/namespaces/default/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "kube-system"},
        "reason": "R", "message": "m"})
    assert status == 422 and body["reason"] == "Invalid"


async def test_fake_kubelet_removal_delay_and_heartbeat(api: KubeAPIEmulator,
                                                        raw: Raw) -> None:
    api.pod_removal_delay = 0.2
    api.create(pod("p", "n1"))
    status, terminating = await raw.delete("/api/v1/namespaces/default/pods/p")
    assert status == 200 and terminating["metadata"]["deletionTimestamp"]
    assert (await raw.get("/api/v1/namespaces/default/pods/p"))[0] == 200
    await asyncio.sleep(0.4)
    assert (await raw.get("/api/v1/namespaces/default/pods/p"))[0] == 404
    # Force deletion (grace 0) of a terminating pod is immediate.
    api.pod_removal_delay = None
    api.create(pod("q", "n1"))
    await raw.delete("/api/v1/namespaces/default/pods/q")
    status, _ = await raw.request("DELETE", "/api/v1/namespaces/default/pods/q",
                                  params={"gracePeriodSeconds": "0"})
    assert status == 200
    assert (await raw.get("/api/v1/namespaces/default/pods/q"))[0] == 404
    # Heartbeats bump the node's resourceVersion, so stale writers get 409.
    _, n = await raw.post("/api/v1/nodes", node("n1"))
    api.heartbeat_node("n1")
    status, _ = await raw.put("/api/v1/nodes/n1", n)
    assert status == 409
