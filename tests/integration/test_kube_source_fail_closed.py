"""Fail closed at the source: every Kubernetes Node's pods are reported, whatever pool
attributes the Node (a Nodeset selector, partitions, a config-file pool, a transition in
flight) or none, so the fold never reads "no report" as "no pods" (the domain side:
tests/unit/test_fail_closed.py). Against the API emulator; the same source runs against
the real control plane in test_e2e_real_kube.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sunkd.domain.events import K8sNodeObserved, K8sNodeVanished, K8sWorkloadObserved
from sunkd.kubernetes.client import NODES, PODS, KubeClient, ResourceType
from tests.integration.kube_helpers import (
    ListSink,
    create_node,
    ensure_namespace,
    install_crd,
    nodeset_body,
    pod_body,
    running_emulator,
    running_source,
    set_pod_phase,
)


def _reports(sink: ListSink, node: str) -> list[K8sWorkloadObserved]:
    return [p for p in sink.payloads(K8sWorkloadObserved)
            if isinstance(p, K8sWorkloadObserved) and p.node == node]


def _pods_of(sink: ListSink, node: str) -> list[str] | None:
    reports = _reports(sink, node)
    return None if not reports else [f"{p.namespace}/{p.name}" for p in reports[-1].pods]


@asynccontextmanager
async def _cluster() -> AsyncIterator[tuple[KubeClient, ResourceType]]:
    async with running_emulator() as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            rt = await install_crd(client)
            await ensure_namespace(client, "ml")
            await client.create(rt, nodeset_body(
                "ml", "gpu", node_selector={"pool": "gpu"}, workload_selector={"app": "serve"},
                partitions=["gpu"], group=rt.group, version=rt.version), "ml")
            yield client, rt
        finally:
            await client.close()


async def _bind(client: KubeClient, name: str, node: str, labels: dict[str, Any]) -> None:
    await client.create(PODS, pod_body("ml", name, labels, node=node), "ml")
    await set_pod_phase(client, "ml", name, "Running")


async def test_hole1_pods_on_a_node_no_nodeset_selects_are_reported() -> None:
    """A Node of a config-file or partition-only pool: no Nodeset selector matches it.
    Its pods were never reported before; now every Node's are (an empty list too)."""
    async with _cluster() as (client, rt):
        await create_node(client, "k-cfg-1", {"rack": "r1"})
        await create_node(client, "k-empty", {"rack": "r2"})
        await _bind(client, "web", "k-cfg-1", {"app": "web"})
        async with running_source(client, rt) as (_source, sink):
            assert _pods_of(sink, "k-cfg-1") == ["ml/web"]
            assert _pods_of(sink, "k-empty") == []  # known empty, not unknown


async def test_hole2_a_pod_bound_after_the_node_left_its_nodeset_is_reported() -> None:
    """Mid-reclaim, the node is relabelled out of its Nodeset, then the Nodeset is
    deleted; a pod bound afterwards by spec.nodeName (no scheduler, no taint check) is
    reported all the same."""
    async with _cluster() as (client, rt):
        await create_node(client, "k-gpu-1", {"pool": "gpu"})
        async with running_source(client, rt) as (_source, sink):
            assert _pods_of(sink, "k-gpu-1") == []
            await client.merge_patch(NODES, "k-gpu-1", {"metadata": {"labels": {"pool": None}}})
            await _bind(client, "late-1", "k-gpu-1", {"app": "serve"})
            await sink.wait_for(lambda s: _pods_of(s, "k-gpu-1") == ["ml/late-1"])
            await client.delete(rt, "gpu", "ml")
            await _bind(client, "late-2", "k-gpu-1", {"app": "other"})
            await sink.wait_for(lambda s: _pods_of(s, "k-gpu-1") == ["ml/late-1", "ml/late-2"])


async def test_hole3_a_released_claim_has_its_successor_report_again() -> None:
    """Two Nodes claim one Slurm name; the first is deleted. The fold makes the claim
    unknown until the successor reports after the hand-over, so the source reports the
    successor's pods again (after the vanish), although they did not change."""
    async with _cluster() as (client, rt):
        await create_node(client, "k-real", {"pool": "gpu", "sunkd.io/slurm-node-name": "n1"})
        await create_node(client, "k-typo", {"pool": "gpu", "sunkd.io/slurm-node-name": "n1"})
        async with running_source(client, rt) as (_source, sink):
            before = len(_reports(sink, "k-typo"))
            await client.delete(NODES, "k-real")
            await sink.wait_for(lambda s: len(_reports(s, "k-typo")) > before)
            order = [p for p in sink.payloads()
                     if isinstance(p, K8sNodeVanished | K8sWorkloadObserved | K8sNodeObserved)]
            vanish = next(i for i, p in enumerate(order)
                          if isinstance(p, K8sNodeVanished) and p.node == "k-real")
            assert any(isinstance(p, K8sWorkloadObserved) and p.node == "k-typo"
                       for p in order[vanish:])
