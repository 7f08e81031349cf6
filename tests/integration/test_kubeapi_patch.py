"""Kubernetes API emulator: the PATCH content types and their semantics.

Merge patch (lists replaced, null deletes), JSON patch (test op → 422, bad body → 400),
strategic merge patch (taints atomic; containers by name; conditions by type;
`$patch: delete`; `$retainKeys`; unknown directives refused), 415 for strategic merge on
custom resources and for unknown media types, server-side apply basics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.integration.kubeapi_support import (
    JSONPATCH,
    MERGE,
    SMP,
    Raw,
    node,
    pod,
)

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "nodeset.yaml"


def tainted_node() -> dict[str, object]:
    n = node("n1", {"a": "1", "b": "2"})
    n["spec"] = {"taints": [{"key": "node.kubernetes.io/unschedulable",
                             "effect": "NoSchedule"},
                            {"key": "other", "value": "x", "effect": "NoExecute"}]}
    return n


async def test_merge_patch_replaces_lists_and_null_deletes(api: KubeAPIEmulator,
                                                           raw: Raw) -> None:
    api.create(tainted_node())
    status, n = await raw.patch("/api/v1/nodes/n1", {
        "metadata": {"labels": {"a": None, "c": "3"}},
        "spec": {"taints": [{"key": "sunkd.io/owner", "value": "slurm",
                             "effect": "NoSchedule"}]}}, MERGE)
    assert status == 200
    assert n["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert [t["key"] for t in n["spec"]["taints"]] == ["sunkd.io/owner"]


async def test_strategic_merge_taints_are_atomic(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(tainted_node())
    # NodeSpec.Taints is +listType=atomic: SMP replaces the whole list (kubernetes.md 2.6).
    status, n = await raw.patch("/api/v1/nodes/n1", {"spec": {"taints": [
        {"key": "sunkd.io/owner", "value": "slurm", "effect": "NoSchedule"}]}}, SMP)
    assert status == 200
    assert [t["key"] for t in n["spec"]["taints"]] == ["sunkd.io/owner"]
    status, n = await raw.patch("/api/v1/nodes/n1", {"spec": {"taints": None}}, SMP)
    assert "taints" not in n["spec"]


async def test_strategic_merge_lists_with_merge_keys(api: KubeAPIEmulator, raw: Raw) -> None:
    p = pod("p1", "n1")
    p["spec"]["containers"] = [{"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                               {"name": "b", "image": "b:1"}]
    p["status"]["conditions"] = [{"type": "Ready", "status": "True"},
                                 {"type": "PodScheduled", "status": "True"}]
    api.create(p)
    status, got = await raw.patch("/api/v1/namespaces/default/pods/p1", {"spec": {
        "containers": [{"name": "b", "image": "b:2"},
                       {"name": "a", "env": [{"name": "Y", "value": "2"}]}]}}, SMP)
    assert status == 200, got
    containers = {c["name"]: c for c in got["spec"]["containers"]}
    assert [c["name"] for c in got["spec"]["containers"]] == ["a", "b"]  # merged, not replaced
    assert containers["a"]["image"] == "a:1" and containers["b"]["image"] == "b:2"
    assert [e["name"] for e in containers["a"]["env"]] == ["X", "Y"]
    # Conditions merge by type on the status subresource.
    status, got = await raw.patch("/api/v1/namespaces/default/pods/p1/status", {"status": {
        "conditions": [{"type": "Ready", "status": "False"}]}}, SMP)
    assert {c["type"]: c["status"] for c in got["status"]["conditions"]} == {
        "Ready": "False", "PodScheduled": "True"}
    # $patch: delete removes one element by key.
    status, got = await raw.patch("/api/v1/namespaces/default/pods/p1/status", {"status": {
        "conditions": [{"type": "PodScheduled", "$patch": "delete"}]}}, SMP)
    assert [c["type"] for c in got["status"]["conditions"]] == ["Ready"]
    # $setElementOrder reorders; $retainKeys drops unlisted keys.
    status, got = await raw.patch("/api/v1/namespaces/default/pods/p1", {"spec": {
        "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}, SMP)
    assert [c["name"] for c in got["spec"]["containers"]] == ["b", "a"]
    status, got = await raw.patch("/api/v1/namespaces/default/pods/p1", {"metadata": {
        "labels": {"$retainKeys": ["keep"], "keep": "1"}}}, SMP)
    assert got["metadata"]["labels"] == {"keep": "1"}
    status, _ = await raw.patch("/api/v1/namespaces/default/pods/p1",
                                {"spec": {"$bogus": 1}}, SMP)
    assert status == 400


async def test_finalizers_merge_as_a_set(api: KubeAPIEmulator, raw: Raw) -> None:
    n = node("n1")
    n["metadata"]["finalizers"] = ["a"]
    api.create(n)
    _, got = await raw.patch("/api/v1/nodes/n1", {"metadata": {"finalizers": ["b"]}}, SMP)
    assert got["metadata"]["finalizers"] == ["a", "b"]
    _, got = await raw.patch("/api/v1/nodes/n1", {"metadata": {
        "$deleteFromPrimitiveList/finalizers": ["a"]}}, SMP)
    assert got["metadata"]["finalizers"] == ["b"]


async def test_json_patch(api: KubeAPIEmulator, raw: Raw) -> None:
    created = api.create(tainted_node())
    rv = created["metadata"]["resourceVersion"]
    status, n = await raw.patch("/api/v1/nodes/n1", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "k", "effect": "NoSchedule"}},
        {"op": "remove", "path": "/spec/taints/0"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
        {"op": "copy", "from": "/metadata/labels/b", "path": "/metadata/labels/b2"},
        {"op": "move", "from": "/metadata/labels/b2", "path": "/metadata/labels/b3"},
    ], JSONPATCH)
    assert status == 200, n
    assert [t["key"] for t in n["spec"]["taints"]] == ["other", "k"]
    assert n["metadata"]["labels"] == {"a": "9", "b": "2", "b3": "2"}
    # A failed test op is 422 Invalid (patch.go applyJSPatch), stale RV guard included.
    status, body = await raw.patch("/api/v1/nodes/n1", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv}], JSONPATCH)
    assert status == 422 and body["reason"] == "Invalid"
    # A dict body is not a JSON patch: 400 (the kubernetes_asyncio custom-object pitfall).
    status, body = await raw.patch("/api/v1/nodes/n1", {"spec": {}}, JSONPATCH)
    assert status == 400 and body["reason"] == "BadRequest"


async def test_strategic_merge_on_custom_resource_is_415(api: KubeAPIEmulator,
                                                         raw: Raw) -> None:
    api.create(yaml.safe_load(CRD.read_text()))
    api.create({"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"slurm": {"partitions": ["x"]}}})
    path = "/apis/sunkd.io/v1alpha1/namespaces/default/nodesets/p"
    status, body = await raw.patch(path, {"spec": {"nodeSelector": {"a": "b"}}}, SMP)
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert "application/merge-patch+json" in body["message"]
    status, _ = await raw.patch(path + "/status", {"status": {}}, SMP)
    assert status == 415
    status, body = await raw.patch(path, {"spec": {}}, "text/plain")
    assert status == 415
    status, obj = await raw.patch(path, {"spec": {"nodeSelector": {"a": "b"}}}, MERGE)
    assert status == 200 and obj["spec"]["nodeSelector"] == {"a": "b"}


async def test_server_side_apply_basics(raw: Raw) -> None:
    lease: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l1", "namespace": "default"},
             "spec": {"holderIdentity": "a"}}
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l1"
    status, body = await raw.patch(path, lease, "application/apply-patch+yaml")
    assert status == 422 and "fieldManager" in body["message"]
    status, created = await raw.request("PATCH", path, lease, "application/apply-patch+yaml",
                                        params={"fieldManager": "test"})
    assert status == 201 and created["spec"]["holderIdentity"] == "a"
    lease["spec"]["holderIdentity"] = "b"
    status, updated = await raw.request("PATCH", path, lease, "application/apply-patch+yaml",
                                        params={"fieldManager": "test"})
    assert status == 200 and updated["spec"]["holderIdentity"] == "b"
