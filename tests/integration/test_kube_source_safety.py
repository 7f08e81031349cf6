"""Safety scenario 9 at the source: a reclaim must wait for (or evict) every pod on the
node that is not a DaemonSet or mirror pod, so the source reports them all, pool pods and
others alike, each with its uid (scenario 10 evicts by uid)."""

from __future__ import annotations

from typing import Any

from sunkd.domain.events import K8sWorkloadObserved, PodRef
from sunkd.kubernetes.client import PODS, KubeClient
from tests.integration.kube_helpers import (
    create_node,
    ensure_namespace,
    install_crd,
    nodeset_body,
    pod_body,
    running_emulator,
    running_source,
    set_pod_phase,
)


def _owned(body: dict[str, Any], kind: str) -> dict[str, Any]:
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": "apps/v1", "kind": kind, "name": f"{kind.lower()}-x",
        "uid": f"00000000-0000-4000-8000-{len(kind):012d}", "controller": True}]
    return body


async def test_s9_every_non_daemonset_pod_on_a_pool_node_is_reported() -> None:
    async with running_emulator() as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            rt = await install_crd(client)
            await ensure_namespace(client, "ml")
            await client.create(rt, nodeset_body(
                "ml", "gpu", node_selector={"pool": "gpu"}, workload_selector={"app": "serve"},
                partitions=["gpu"], group=rt.group, version=rt.version), "ml")
            await create_node(client, "k-gpu-1", {"pool": "gpu"})
            uids = {}
            bodies = {
                "serve-a": pod_body("ml", "serve-a", {"app": "serve"}, node="k-gpu-1"),
                "web": _owned(pod_body("ml", "web", {"app": "web"}, node="k-gpu-1"),
                              "ReplicaSet"),
                "node-exporter": _owned(pod_body("ml", "node-exporter", {"app": "ne"},
                                                 node="k-gpu-1"), "DaemonSet"),
                "static": pod_body("ml", "static", {"app": "static"}, node="k-gpu-1"),
            }
            bodies["static"]["metadata"]["annotations"] = {
                "kubernetes.io/config.mirror": "0123abcd"}  # a kubelet's mirror pod
            for name, body in bodies.items():
                created = await client.create(PODS, body, "ml")
                uids[name] = created["metadata"]["uid"]
                await set_pod_phase(client, "ml", name, "Running")
            async with running_source(client, rt) as (_source, sink):
                workloads = [p for p in sink.payloads(K8sWorkloadObserved)
                             if isinstance(p, K8sWorkloadObserved) and p.node == "k-gpu-1"]
                assert workloads[-1].pods == (
                    PodRef("ml", "serve-a", "Running", uid=uids["serve-a"], pool_pod=True),
                    PodRef("ml", "web", "Running", uid=uids["web"], pool_pod=False),
                )
        finally:
            await client.close()
