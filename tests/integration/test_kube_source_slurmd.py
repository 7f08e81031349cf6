"""The Kubernetes source tells sunkd's own slurmd pods from the others, on both backends:
a pod is reported as the slurmd pod of Slurm node X (`PodRef.slurmd`) only when its
controller owner reference is a Nodeset the source knows, by uid, and its labels name that
Nodeset; an impostor wearing the labels is reported as any other pod. The fold then never
counts sunkd's own pod as a pod beside Slurm (`ownership.running_pods`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sWorkloadObserved, SlurmdSpec
from sunkd.kubernetes.client import PODS, KubeClient, ResourceType
from sunkd.kubernetes.slurmd_pod import render

from .kube_backends import Kube
from .kube_helpers import create_node, ensure_namespace, install_crd, nodeset_body, running_source

SPEC = SlurmdSpec(image="localhost/sunkd-slurmd:22.05", image_pull_policy="Never")


@pytest.fixture
async def client(kube: Kube) -> AsyncIterator[tuple[KubeClient, ResourceType]]:
    yield kube.client, await install_crd(kube.client)


async def test_own_slurmd_pods_are_told_from_impostors(
    client: tuple[KubeClient, ResourceType]
) -> None:
    api, rt = client
    await ensure_namespace(api, "hpc")
    body = nodeset_body("hpc", "gpu", node_selector={"pool": "gpu"},
                        workload_selector={"app": "serve"}, partitions=["gpu"],
                        group=rt.group, version=rt.version)
    body["spec"]["slurmd"] = {"image": SPEC.image}
    uid = (await api.create(rt, body, "hpc"))["metadata"]["uid"]
    await create_node(api, "gpu1", {"pool": "gpu"})

    def pod(name: str, slurm_node: str = "gpu1", owner: bool = True) -> dict[str, object]:
        obj = render(SPEC, nodeset="gpu", namespace="hpc", nodeset_uid=uid,
                     slurm_node=slurm_node, k8s_node="gpu1", name=name)
        if not owner:
            obj["metadata"].pop("ownerReferences")  # type: ignore[attr-defined]
        return obj

    await api.create(PODS, pod("gpu-gpu1"), "hpc")
    await api.create(PODS, pod("impostor", owner=False), "hpc")
    await api.create(PODS, pod("for-another-node", slurm_node="gpu9"), "hpc")
    async with running_source(api, rt) as (_source, sink):
        (workload,) = [p for p in sink.payloads(K8sWorkloadObserved)
                       if isinstance(p, K8sWorkloadObserved) and p.node == "gpu1"]
        got = {ref.name: (ref.slurmd, ref.slurmd_nodeset, ref.pool_pod, ref.deleting)
               for ref in workload.pods}
        assert got == {"gpu-gpu1": ("gpu1", uid, False, False),
                       "impostor": ("", "", False, False),
                       "for-another-node": ("gpu9", uid, False, False)}


async def test_the_busy_label_of_sunkds_own_pod_is_reported_and_followed(
    client: tuple[KubeClient, ResourceType]
) -> None:
    """`PodRef.slurmd_busy` is the busy label of sunkd's own pod (never an impostor's),
    and a label change alone makes the source report the Node's pods again."""
    api, rt = client
    await ensure_namespace(api, "hpc")
    body = nodeset_body("hpc", "gpu", node_selector={"pool": "gpu"},
                        workload_selector={"app": "serve"}, partitions=["gpu"],
                        group=rt.group, version=rt.version)
    body["spec"]["slurmd"] = {"image": SPEC.image}
    uid = (await api.create(rt, body, "hpc"))["metadata"]["uid"]
    await create_node(api, "gpu2", {"pool": "gpu"})
    busy = {wk.LABEL_SLURMD_BUSY: wk.SLURMD_BUSY_VALUE}
    for name, owner in (("gpu-gpu2", True), ("impostor2", False)):
        obj = render(SPEC, nodeset="gpu", namespace="hpc", nodeset_uid=uid,
                     slurm_node="gpu2", k8s_node="gpu2", name=name)
        obj["metadata"]["labels"].update(busy)  # type: ignore[index]
        if not owner:
            obj["metadata"].pop("ownerReferences")  # type: ignore[attr-defined]
        await api.create(PODS, obj, "hpc")

    def reported(sink: object) -> dict[str, bool]:
        found = [p for p in sink.payloads(K8sWorkloadObserved)  # type: ignore[attr-defined]
                 if isinstance(p, K8sWorkloadObserved) and p.node == "gpu2"]
        return {ref.name: ref.slurmd_busy for ref in found[-1].pods} if found else {}

    async with running_source(api, rt) as (_source, sink):
        assert reported(sink) == {"gpu-gpu2": True, "impostor2": False}
        await api.merge_patch(PODS, "gpu-gpu2", {"metadata": {"labels": {
            wk.LABEL_SLURMD_BUSY: None}}}, "hpc")
        await sink.wait_for(
            lambda s: reported(s) == {"gpu-gpu2": False, "impostor2": False})
