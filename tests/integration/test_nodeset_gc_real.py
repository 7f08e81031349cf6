"""What Kubernetes' garbage collector does to a Nodeset's slurmd pods when the Nodeset is
deleted, on the real control plane (kube-apiserver, etcd, kube-controller-manager with its
garbage collector; no kubelet: a pod the collector deletes keeps a deletionTimestamp, the
moment a kubelet would send slurmd SIGTERM).

The pods are sunkd's own (`slurmd_pod.render`: the Nodeset as controller owner reference,
no `blockOwnerDeletion`). sunkd puts its finalizer (`sunkd.io/slurmd-pods`) on each Nodeset
with spec.slurmd (docs/nodeset.md, "Deleting a Nodeset"; the daemon's run of it is
test_slurmd_daemon_real.py); these are the facts it rests on, shown here with a finalizer
of the test's own (no sunkd runs here):

- background deletion (kubectl's default) without a finalizer: the pod is deleted at
  once, whatever runs in it (what happens today);
- background deletion with a finalizer on the Nodeset: the Nodeset stays (deletionTimestamp
  set) and the collector leaves the pod alone until the finalizer is removed, then
  deletes it: an owner that still exists and does not carry `foregroundDeletion` is a
  "solid" owner (`classifyReferences` in pkg/controller/garbagecollector);
- orphan deletion (`--cascade=orphan`) with a finalizer: the collector removes the owner
  reference from the pod and deletes nothing; the pod is then no longer sunkd's (its
  controller owner is gone) while the Nodeset waits on the finalizer;
- foreground deletion (`--cascade=foreground`) is not asserted: the API server adds
  `foregroundDeletion`, the collector queues the owner and its dependents at once, and
  with no `blockOwnerDeletion` on the pods it drops `foregroundDeletion` right away; a
  pod it reached before that is deleted, one it reached after is kept (a race between
  its workers). The test prints what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmdfinalizer import VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE
from sunkd.domain.ports import ActionError
from sunkd.kubernetes.client import NODESETS, PODS, KubeApiError, KubeClient
from sunkd.kubernetes.slurmd_finalizer import NodesetFinalizer
from sunkd.kubernetes.slurmd_pod import render
from sunkd_testbed.kubernetes import KubeControlPlane
from tests.integration.kube_backends import CRD_MANIFEST, real_plane_or_skip
from tests.integration.kube_helpers import create_node, ensure_namespace

pytestmark = pytest.mark.slow
NAMESPACE = "gc"
NODE = "gc-node"
FINALIZER = "sunkd.io/test-finalizer"  # the test's own: no sunkd runs here


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    control_plane = real_plane_or_skip(scheduler=False)
    try:
        control_plane.kubectl("apply", "-f", str(CRD_MANIFEST))
        control_plane.kubectl("wait", "--for=condition=Established",
                              "crd/nodesets.sunkd.io", "--timeout=60s")
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture
async def client(plane: KubeControlPlane) -> AsyncIterator[KubeClient]:
    admin = await KubeClient.connect(str(plane.kubeconfig))
    try:
        await ensure_namespace(admin, NAMESPACE)
        with contextlib.suppress(KubeApiError):  # 409: an earlier test made it
            await create_node(admin, NODE, {"pool": "gc"})
        yield admin
    finally:
        await admin.close()


async def nodeset_with_pod(client: KubeClient, name: str, *, finalizer: bool
                           ) -> tuple[dict[str, Any], str]:
    """A Nodeset with spec.slurmd (and `FINALIZER` if asked) and its slurmd pod as sunkd
    renders it; (the Nodeset, the pod's name)."""
    body: dict[str, Any] = {
        "apiVersion": wk.API_VERSION, "kind": "Nodeset",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     **({"finalizers": [FINALIZER]} if finalizer else {})},
        "spec": {"nodeSelector": {"pool": "gc"}, "slurm": {"partitions": ["gc"]},
                 "slurmd": {"image": "registry.example/slurmd:22.05"}},
    }  # fmt: skip
    nodeset = await client.create(NODESETS, body, NAMESPACE)
    pod = render(SlurmdSpec(image="registry.example/slurmd:22.05"), nodeset=name,
                 namespace=NAMESPACE, nodeset_uid=nodeset["metadata"]["uid"],
                 slurm_node=f"{name}-n1", k8s_node=NODE, name=f"{name}-n1")
    await client.create(PODS, pod, NAMESPACE)
    return nodeset, pod["metadata"]["name"]


async def pod_state(client: KubeClient, name: str) -> str:
    """"gone", "deleting" (the collector deleted it: a kubelet would stop slurmd),
    "orphaned" (no owner reference left) or "kept"."""
    try:
        meta = (await client.get(PODS, name, NAMESPACE))["metadata"]
    except KubeApiError as error:
        if error.status == 404:
            return "gone"
        raise
    if meta.get("deletionTimestamp"):
        return "deleting"
    return "kept" if meta.get("ownerReferences") else "orphaned"


async def until(what: str, check: Any, within: float = 90.0) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


async def delete_nodeset(client: KubeClient, name: str, propagation: str) -> None:
    await client.request("DELETE", NODESETS.object_path(name, NAMESPACE), body={
        "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation})


async def release(client: KubeClient, name: str) -> None:
    """Remove every finalizer of the Nodeset (as sunkd would remove its own)."""
    with contextlib.suppress(KubeApiError):
        await client.merge_patch(NODESETS, name, {"metadata": {"finalizers": None}},
                                 NAMESPACE)


async def terminating(client: KubeClient, name: str) -> bool:
    try:
        obj = await client.get(NODESETS, name, NAMESPACE)
    except KubeApiError as error:
        if error.status == 404:
            return False
        raise
    return bool(obj["metadata"].get("deletionTimestamp"))


async def test_a_finalizer_keeps_the_pods_under_background_deletion(client: KubeClient
                                                                    ) -> None:
    # Deleted together: the one without a finalizer is the control (the collector is
    # watching Nodesets and acts within the wait), the other must be left alone.
    await nodeset_with_pod(client, "plain", finalizer=False)
    await nodeset_with_pod(client, "held", finalizer=True)
    await delete_nodeset(client, "plain", "Background")
    await delete_nodeset(client, "held", "Background")

    async def plain_collected() -> bool:
        return await pod_state(client, "plain-n1") in ("deleting", "gone")

    # The collector learns a new CRD's resource at its next discovery sync (30 s).
    took = await until("the pod of the Nodeset without a finalizer deleted", plain_collected)
    await asyncio.sleep(3)
    assert await pod_state(client, "held-n1") == "kept"
    assert await terminating(client, "held")
    released = time.monotonic()
    await release(client, "held")

    async def held_collected() -> bool:
        return await pod_state(client, "held-n1") in ("deleting", "gone")

    await until("the pod deleted once the finalizer is removed", held_collected)
    print(f"\nbackground deletion: a Nodeset's slurmd pod deleted {took} s after the "
          f"Nodeset (no finalizer); with a finalizer kept until its removal, then deleted "
          f"{round(time.monotonic() - released, 2)} s after it")


async def test_orphan_deletion_strips_the_owner_reference(client: KubeClient) -> None:
    await nodeset_with_pod(client, "orphaning", finalizer=True)
    await delete_nodeset(client, "orphaning", "Orphan")

    async def orphaned() -> bool:
        return await pod_state(client, "orphaning-n1") == "orphaned"

    await until("the pod's owner reference removed", orphaned)
    assert await terminating(client, "orphaning")  # the finalizer still holds it
    await release(client, "orphaning")
    await until("the Nodeset gone", lambda: _not(terminating(client, "orphaning")))
    await asyncio.sleep(2)
    assert await pod_state(client, "orphaning-n1") == "orphaned"
    await client.delete(PODS, "orphaning-n1", NAMESPACE, grace_period_seconds=0)


async def test_foreground_deletion_is_a_race(client: KubeClient) -> None:
    """Observed, not asserted (the module's docstring): the Nodeset stays while the
    finalizer is on, and `foregroundDeletion` leaves it."""
    await nodeset_with_pod(client, "fore", finalizer=True)
    await delete_nodeset(client, "fore", "Foreground")

    async def foreground_done() -> bool:
        obj = await client.get(NODESETS, "fore", NAMESPACE)
        return "foregroundDeletion" not in (obj["metadata"].get("finalizers") or [])

    await until("foregroundDeletion removed", foreground_done)
    await asyncio.sleep(2)
    seen = await pod_state(client, "fore-n1")
    assert await terminating(client, "fore")
    print(f"\nforeground deletion with a finalizer on the Nodeset: its slurmd pod {seen}")
    await release(client, "fore")
    with contextlib.suppress(KubeApiError):
        await client.delete(PODS, "fore-n1", NAMESPACE, grace_period_seconds=0)


async def _not(value: Any) -> bool:
    return not await value


async def test_sunkds_finalizer_write_keeps_foreign_ones_and_waits_for_every_pod(
        client: KubeClient) -> None:
    """`NodesetFinalizer` (the actuator of sunkd's finalizer) on the real API server: put
    on beside another controller's finalizer (kept, in order); refused once the Nodeset is
    marked for deletion; taken off only once no pod the Nodeset owns is left: refused
    while the pod runs and while it terminates (no kubelet confirms it here), done once it
    is gone, and the other finalizer stays (the Nodeset with it)."""
    nodeset, pod = await nodeset_with_pod(client, "sunkdfin", finalizer=True)
    finalizer = NodesetFinalizer(client, NODESETS, lambda what: None)
    args = {"nodeset": f"{NAMESPACE}/sunkdfin", "nodeset_uid": nodeset["metadata"]["uid"]}

    async def finalizers() -> list[str]:
        return list((await client.get(NODESETS, "sunkdfin", NAMESPACE))["metadata"]
                    .get("finalizers") or [])

    try:
        assert await finalizer.act(VERB_FINALIZER_ADD, args) is True
        assert await finalizers() == [FINALIZER, wk.FINALIZER_SLURMD_PODS]
        assert await finalizer.act(VERB_FINALIZER_ADD, args) is False  # already so
        stranger = {**args, "nodeset_uid": "not-its-uid"}
        assert await finalizer.act(VERB_FINALIZER_REMOVE, stranger) is False
        await delete_nodeset(client, "sunkdfin", "Background")
        assert await terminating(client, "sunkdfin")
        with pytest.raises(ActionError, match="slurmd pods are left"):
            await finalizer.act(VERB_FINALIZER_REMOVE, args)
        await client.delete(PODS, pod, NAMESPACE, grace_period_seconds=30)
        assert await pod_state(client, pod) == "deleting"
        with pytest.raises(ActionError, match="slurmd pods are left"):
            await finalizer.act(VERB_FINALIZER_REMOVE, args)
        await client.delete(PODS, pod, NAMESPACE, grace_period_seconds=0)
        await until("the pod gone", lambda: _gone(client, pod))
        assert await finalizer.act(VERB_FINALIZER_REMOVE, args) is True
        assert await finalizers() == [FINALIZER]
        assert await terminating(client, "sunkdfin")  # the other finalizer holds it
    finally:
        await release(client, "sunkdfin")
        with contextlib.suppress(KubeApiError):
            await client.delete(PODS, pod, NAMESPACE, grace_period_seconds=0)


async def _gone(client: KubeClient, pod: str) -> bool:
    return await pod_state(client, pod) == "gone"
