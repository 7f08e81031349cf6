"""The slurmd-pod actuator over HTTP, on both backends (the API emulator and the real
kube-apiserver; tests/integration/kube_backends.py): idempotent create and delete, a create
refused beside a foreign pod (an impostor wearing the labels too) or on a Node without
sunkd's owner taint, a name clash with a pod
that is not sunkd's refused, a delete of another pod (uid) skipped and of a pod that is not
sunkd's refused. No kubelet: the pods stay Pending, which is all these checks need."""

from __future__ import annotations

import copy

import pytest

from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmd import SlurmdNodeset, pod_name
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.kubernetes import slurmd_actuator as act
from sunkd.kubernetes.actuator import KubernetesActuator
from sunkd.kubernetes.client import PODS, KubeApiError, KubeClient
from sunkd.kubernetes.slurmd_pod import render

from .kube_backends import Kube
from .kube_helpers import create_node as create_bare_node
from .kube_helpers import install_crd, nodeset_body

SPEC = SlurmdSpec(image="localhost/sunkd-slurmd:22.05", image_pull_policy="Never",
                  termination_grace_seconds=5)


def allowed(what: str) -> None:
    """Leadership is held throughout (the daemon passes its lease check)."""


async def nodeset(client: KubeClient) -> SlurmdNodeset:
    """A real Nodeset, so the garbage collector of the real server sees the pods' owner."""
    rt = await install_crd(client)
    body = nodeset_body("default", "pods", node_selector={"pool": "pods"},
                        workload_selector={"app": "x"}, group=rt.group, version=rt.version)
    try:
        obj = await client.create(rt, body, "default")
    except KubeApiError as error:
        if error.status != 409:
            raise
        obj = await client.get(rt, "pods", "default")
    return SlurmdNodeset("pods", "default", obj["metadata"]["uid"], SPEC)


async def create_node(client: KubeClient, name: str) -> None:
    """A Node as a Slurm-owned one is: with sunkd's owner taint (its `lock`)."""
    await create_bare_node(client, name)
    await KubernetesActuator(client).lock(name)


async def create(client: KubeClient, ns: SlurmdNodeset, slurm_node: str, k8s: str) -> bool:
    return await act.SlurmdPods(client, allowed).create(
        nodeset=ns, spec=SPEC, slurm_node=slurm_node, k8s_node=k8s,
        name=pod_name(ns.name, slurm_node))


async def test_create_is_idempotent_and_refused_beside_a_foreign_pod(kube: Kube) -> None:
    client = kube.client
    ns = await nodeset(client)
    await create_node(client, "k1")
    await create_node(client, "k2")
    assert await create(client, ns, "node1", "k1") is True
    assert await create(client, ns, "node1", "k1") is False
    obj = await client.get(PODS, "pods-node1", "default")
    assert obj["spec"]["nodeName"] == "k1"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == ns.uid

    # An impostor on k2: the labels and annotation of sunkd's pod, another owner.
    impostor = copy.deepcopy(render(SPEC, nodeset="pods", namespace="default",
                                    nodeset_uid="someone-else", slurm_node="node2",
                                    k8s_node="k2", name="impostor"))
    impostor["metadata"].pop("ownerReferences")
    await client.create(PODS, impostor, "default")
    with pytest.raises(ActionError, match="foreign pods run there: default/impostor") as raised:
        await create(client, ns, "node2", "k2")
    assert raised.value.retryable
    names = {p["metadata"]["name"] for p in (await client.list(PODS, namespace="default"))[0]}
    assert "pods-node2" not in names


async def test_a_name_taken_by_a_pod_that_is_not_sunkds_is_refused(kube: Kube) -> None:
    client = kube.client
    ns = await nodeset(client)
    await create_node(client, "k3")
    await create_node(client, "k4")
    squatter = render(SPEC, nodeset="other", namespace="default", nodeset_uid="x",
                      slurm_node="node3", k8s_node="k4", name="pods-node3")
    squatter["metadata"].pop("ownerReferences")
    await client.create(PODS, squatter, "default")
    with pytest.raises(RefusedError, match="not sunkd's"):
        await create(client, ns, "node3", "k3")


async def test_delete_only_the_decided_pod_of_sunkd_with_a_grace(kube: Kube) -> None:
    client = kube.client
    ns = await nodeset(client)
    await create_node(client, "k5")
    await create(client, ns, "node5", "k5")
    uid = (await client.get(PODS, "pods-node5", "default"))["metadata"]["uid"]

    async def delete(name: str, pod_uid: str, slurm_node: str = "node5") -> bool:
        return await act.SlurmdPods(client, allowed).delete(
            nodeset=ns, slurm_node=slurm_node, k8s_node="k5", name=name, uid=pod_uid,
            grace_seconds=5)

    assert await delete("pods-node5", "another-uid") is False  # replaced since decided
    with pytest.raises(RefusedError, match="not sunkd's"):
        await delete("pods-node5", uid, slurm_node="node6")  # not the pod of this node
    assert await delete("pods-node5", uid) is True
    assert await delete("pods-node5", uid) is False  # terminating or gone
    try:
        obj = await client.get(PODS, "pods-node5", "default")
    except KubeApiError as error:
        assert error.status == 404  # the emulator removes it at once without a kubelet
    else:
        assert obj["metadata"]["deletionTimestamp"]
        assert obj["metadata"]["deletionGracePeriodSeconds"] == 5
    assert await delete("gone", "u") is False


async def test_create_is_refused_on_a_node_without_the_owner_taint(kube: Kube) -> None:
    """The plan decided on a Node that carried the taint; someone removed it since (or
    the decision is a watch event old): pool pods may land beside slurmd, so no create
    until the taint is back."""
    client = kube.client
    ns = await nodeset(client)
    await create_bare_node(client, "k7")
    with pytest.raises(ActionError, match="owner taint") as raised:
        await create(client, ns, "node7", "k7")
    assert raised.value.retryable
    names = {p["metadata"]["name"] for p in (await client.list(PODS, namespace="default"))[0]}
    assert "pods-node7" not in names
    await KubernetesActuator(client).lock("k7")
    assert await create(client, ns, "node7", "k7") is True
