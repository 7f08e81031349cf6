"""What sunkd keeps of a Pod (`PodFacts`): the facts the source reads, label maps
shared between pods, and a bound on what each cached pod costs."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from sunkd.kubernetes.normalize import (
    pod_is_pending_unschedulable,
    pod_requests,
    slim_pod,
)


def api_pod(i: int, *, node: str | None = "n1") -> dict[str, Any]:
    """A Pod as an API server returns it (a Deployment's replica, with the fields sunkd
    drops: managedFields, container specs, conditions)."""
    app = f"serve-{i % 50}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{app}-7d9c5b-{i:06d}",
            "namespace": "ml",
            "uid": f"0a1b2c3d-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app": app, "pod-template-hash": "7d9c5b"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": f"{app}-7d9c5b", "uid": "x", "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.example/serve:1.2.3",
                            "resources": {"requests": {"cpu": "500m", "memory": "1Gi",
                                                       "nvidia.com/gpu": "1"}}}],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "True"}],
            "podIP": "10.0.0.1",
        },
    }


def test_facts_are_what_the_source_reads() -> None:
    raw = api_pod(7)
    pod = slim_pod(raw)
    assert (pod.namespace, pod.name, pod.node, pod.phase) == \
        ("ml", "serve-7-7d9c5b-000007", "n1", "Running")
    assert pod.uid == raw["metadata"]["uid"]
    assert pod.resource_version == "100007"
    assert pod.requests == pod_requests(raw) == (500, 2**30, 1)
    assert not pod.node_local and not pod.pending_unschedulable
    pending = slim_pod(api_pod(8, node=None) | {"status": {"phase": "Pending"}})
    assert pending.pending_unschedulable == pod_is_pending_unschedulable(
        api_pod(8, node=None) | {"status": {"phase": "Pending"}}) is True
    daemon = api_pod(9)
    daemon["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "controller": True}]
    assert slim_pod(daemon).node_local


def test_pods_with_the_same_labels_share_one_map_and_others_do_not() -> None:
    a, b, c = slim_pod(api_pod(1)), slim_pod(api_pod(51)), slim_pod(api_pod(2))
    assert a.labels is b.labels  # same Deployment: one map
    assert a.requests is b.requests is c.requests  # same requests: one tuple
    assert a.labels is not c.labels and c.labels["app"] == "serve-2"
    # A label value of another type (hostile input) is kept, unshared, and only fails to
    # match; an unhashable one does not break the sharing of the others.
    odd = api_pod(3)
    odd["metadata"]["labels"] = {"app": ["not", "a", "string"]}
    assert slim_pod(odd).labels == {"app": ["not", "a", "string"]}
    assert slim_pod(api_pod(1)).labels is a.labels


def test_a_cached_pod_costs_under_a_kilobyte() -> None:
    """The bound the 10,000-node memory target rests on (docs/performance.md, "Scale"):
    100,000 cached pods at ~8 KB each were ~800 MB of the daemon's RSS.

    Counted block by block, leaving out single blocks of 64 KiB or more: those are the
    process-wide tables that grow in steps (the interpreter's interned-string dict doubles
    when full, a ~2.5 MB block once in a while, and the test's own list). Whether one such
    step lands inside this measurement depends on every string interned before it, so
    with them the figure swung from 337 to 1,106 bytes a pod with the suite's order; no
    block a single pod owns comes near 64 KiB."""
    count = 5_000
    gc.collect()
    tracemalloc.start()
    try:
        kept = [slim_pod(api_pod(i)) for i in range(count)]  # each raw pod is dropped at once
        gc.collect()
        blocks = tracemalloc.take_snapshot().traces
    finally:
        tracemalloc.stop()
    per_pod = sum(b.size for b in blocks if b.size < 64 * 1024) / count
    assert len(kept) == count
    assert per_pod < 1024, f"{per_pod:.0f} bytes a pod"


def test_nodes_alike_share_their_maps() -> None:
    from sunkd.kubernetes.normalize import slim_node

    def node(n: int) -> dict[str, Any]:
        return {"metadata": {"name": f"node{n}", "labels": {"pool": "p1", "host": f"node{n}"}},
                "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    a, b = slim_node(node(1)), slim_node(node(2))
    assert a["status"]["allocatable"] is b["status"]["allocatable"]
    assert a["status"]["allocatable"] == {"cpu": "64", "nvidia.com/gpu": "8"}
    assert a["metadata"]["annotations"] is b["metadata"]["annotations"]
    assert a["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert a["metadata"]["labels"] == {"pool": "p1", "host": "node1"}
