"""The slurmd-pod actuator over HTTP, on both backends (the API emulator and the real
kube-apiserver; tests/integration/kube_backends.py): idempotent create and delete, a create
refused beside a foreign pod (an impostor wearing the labels too) or on a Node without
sunkd's owner taint, a name clash with a pod
that is not sunkd's refused, a delete of another pod (uid) skipped and of a pod that is not
sunkd's refused; the busy label under the Nodeset's PodDisruptionBudget (created, put back
when changed, a foreign one of that name refused) and an eviction of the labelled pod
refused (429, by the real disruption controller's status on the real server). No kubelet:
the pods stay Pending, or the test writes the status a kubelet would."""

from __future__ import annotations

import asyncio
import copy

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmd import SlurmdNodeset, pod_name
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.kubernetes import slurmd_actuator as act
from sunkd.kubernetes.actuator import KubernetesActuator
from sunkd.kubernetes.client import PDBS, PODS, KubeApiError, KubeClient
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


# ------------------------------------------------- the busy label and the Nodeset's PDB


async def label(client: KubeClient, ns: SlurmdNodeset, busy: bool, *, uid: str = "",
                slurm_node: str = "node8", k8s: str = "k8",
                name: str = "pods-node8") -> bool:
    """The action as the executor runs it: a retryable failure is asked again (the real
    disruption controller writes the PDB's status between sunkd's read and its
    resourceVersion-guarded put-back, and the API server answers 409)."""
    for _ in range(20):
        try:
            return await act.SlurmdPods(client, allowed).label(
                nodeset=ns, slurm_node=slurm_node, k8s_node=k8s, name=name, uid=uid,
                busy=busy)
        except ActionError as error:
            if not error.retryable or "409" not in str(error):
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("the label kept meeting 409 Conflict")


async def running(client: KubeClient, name: str) -> None:
    """What the kubelet would report: Running and Ready (an eviction ignores the PDBs of
    a Pending pod: `canIgnorePDB` in pkg/registry/core/pod/storage/eviction.go)."""
    await client.merge_patch(PODS, name, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        "default", subresource="status")


async def evict(client: KubeClient, name: str) -> int:
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"},
            "deleteOptions": {"dryRun": ["All"]}}
    try:
        await client.create(PODS, body, "default", name=name, subresource="eviction")
    except KubeApiError as error:
        return error.status
    return 201


async def pdb_settled(client: KubeClient, name: str, pods: int = 0) -> dict[str, object]:
    """The PDB's status once the disruption controller (the real one, or the emulator's
    stand-in) observed its current generation and counts `pods` selected pods (its pod
    informer can lag the generation it observed: the count comes in a later sync)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        obj = await client.get(PDBS, name, "default")
        status = obj.get("status") or {}
        if status.get("observedGeneration") == obj["metadata"].get("generation") \
                and min(int(status.get("expectedPods") or 0),
                        int(status.get("currentHealthy") or 0)) >= pods:
            return status
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.05)


async def test_busy_label_keeps_the_pdb_and_the_eviction_is_refused(kube: Kube) -> None:
    client = kube.client
    ns = await nodeset(client)
    await create_node(client, "k8")
    await create(client, ns, "node8", "k8")
    uid = (await client.get(PODS, "pods-node8", "default"))["metadata"]["uid"]
    await running(client, "pods-node8")
    assert await evict(client, "pods-node8") == 201  # no label: no budget (dry run)

    assert await label(client, ns, True, uid="another-uid") is False  # replaced since
    assert await label(client, ns, True, uid=uid) is True
    pod = await client.get(PODS, "pods-node8", "default")
    assert pod["metadata"]["labels"][wk.LABEL_SLURMD_BUSY] == wk.SLURMD_BUSY_VALUE
    pdb = await client.get(PDBS, act.pdb_name(ns), "default")
    assert pdb["spec"]["minAvailable"] == act.PDB_MIN_AVAILABLE
    assert "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"] == {"matchLabels": {
        wk.LABEL_SLURMD_NODESET: "pods", wk.LABEL_SLURMD_BUSY: wk.SLURMD_BUSY_VALUE}}
    (owner,) = pdb["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (wk.NODESET_KIND, ns.uid,
                                                                   True)
    status = await pdb_settled(client, act.pdb_name(ns), pods=1)
    # The real controller syncs it (no SyncFailed: no scale of the Nodeset needed).
    assert status.get("disruptionsAllowed", 0) == 0, status
    assert (status.get("expectedPods"), status.get("currentHealthy")) == (1, 1), status
    assert not [c for c in status.get("conditions") or []  # type: ignore[attr-defined]
                if c.get("reason") == "SyncFailed"], status
    assert await evict(client, "pods-node8") == 429  # kubectl drain's eviction: refused
    assert await label(client, ns, True, uid=uid) is False  # already so

    assert await label(client, ns, False, uid=uid) is True
    pod = await client.get(PODS, "pods-node8", "default")
    assert wk.LABEL_SLURMD_BUSY not in (pod["metadata"].get("labels") or {})
    assert await label(client, ns, False, uid=uid) is False
    assert await evict(client, "pods-node8") == 201  # idle: the drain would pass
    # Not sunkd's pod for that node: refused, never labelled.
    with pytest.raises(RefusedError, match="not sunkd's"):
        await label(client, ns, True, uid=uid, slurm_node="node9")


async def test_a_changed_pdb_is_put_back_and_a_foreign_one_is_refused(kube: Kube) -> None:
    client = kube.client
    ns = await nodeset(client)
    await create_node(client, "k8")
    await create(client, ns, "node8", "k8")
    assert await label(client, ns, True) is True
    name = act.pdb_name(ns)
    # Someone loosens sunkd's budget and widens its selector: put back at the next label.
    await client.merge_patch(PDBS, name, {"spec": {
        "minAvailable": None, "maxUnavailable": 1,
        "selector": {"matchLabels": {"extra": "x"}}}}, "default")
    assert await label(client, ns, True) is True  # the label was there; the PDB was not
    spec = (await client.get(PDBS, name, "default"))["spec"]
    assert spec["minAvailable"] == act.PDB_MIN_AVAILABLE and "maxUnavailable" not in spec
    assert spec["selector"] == act.pdb_body(ns)["spec"]["selector"]
    assert await label(client, ns, True) is False
    # A PDB of that name another owner controls: not overwritten, the pod not labelled.
    await client.delete(PDBS, name, "default")
    assert await label(client, ns, False) is True
    theirs = act.pdb_body(ns)
    theirs["metadata"].pop("ownerReferences")
    theirs["spec"]["minAvailable"] = 3
    await client.create(PDBS, theirs, "default")
    with pytest.raises(RefusedError, match="not sunkd's"):
        await label(client, ns, True)
    assert (await client.get(PDBS, name, "default"))["spec"]["minAvailable"] == 3
    pod = await client.get(PODS, "pods-node8", "default")
    assert wk.LABEL_SLURMD_BUSY not in (pod["metadata"].get("labels") or {})
