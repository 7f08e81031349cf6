"""Create and delete a Nodeset's slurmd pod: idempotent, and each checks again right before
it writes what the plan decided on an observation that may be a watch event old.

- create: the Node still carries sunkd's owner taint (without it a pool pod may land
  beside slurmd, and a lend may have untainted it since the decision), and runs no
  foreign pod (a pod of another owner, impostors too); a pod of the same name that is
  sunkd's is "already so"; one that is not is refused.
- delete: only the pod decided on (its uid, a precondition the API server enforces), only
  while it is sunkd's and on the node, with a grace period (slurmd gets SIGTERM and
  `terminationGracePeriodSeconds` before SIGKILL). That Slurm reports the node drained is
  checked by the executor against Slurm right before (`runtime/executor.py`).
- label: set or remove the busy label (`policy/slurmdbusy.py`) on the pod decided on
  (its uid), only while it is sunkd's and on the node. Before setting it, the Nodeset's
  PodDisruptionBudget is made to exist as sunkd writes it (no disruption of the
  Nodeset's busy slurmd pods, `pdb_body`; owned by the Nodeset): created when missing, its spec put
  back when someone changed it, and one of that name that is not sunkd's (another
  controller owner) refused, never overwritten. sunkd's own deletes of its pods are
  DELETEs, not evictions, so the PDB never stops them; they come only once Slurm
  reports nothing allocated on the node, when the label is off anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmd import (
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    SeenPod,
    SlurmdNodeset,
    foreign_pods,
    is_own,
    spec_from_json,
)
from sunkd.domain.policy.slurmdbusy import BUSY_ARG, VERB_SLURMD_LABEL
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.kubernetes.client import (
    JSON,
    NODES,
    PDBS,
    PODS,
    KubeApiError,
    KubeClient,
    ResourceType,
)
from sunkd.kubernetes.normalize import node_local
from sunkd.kubernetes.slurmd_pod import render, seen_pod

log = structlog.get_logger(__name__)

TRANSIENT = (KubeApiError, aiohttp.ClientError, TimeoutError, OSError)


def action_error(error: Exception, what: str) -> ActionError:
    """A failed API call as the action's error (a Kubernetes answer keeps its retryability)."""
    if isinstance(error, KubeApiError):
        return ActionError(f"{what}: {error}", retryable=error.retryable)
    return ActionError(f"{what}: {type(error).__name__}: {error}", retryable=True)


async def get_or_none(client: KubeClient, resource: ResourceType, name: str,
                      namespace: str, what: str) -> JSON | None:
    """The object as the API server has it now; None when it is gone (404). Any other
    failure is the action's error (`_error`): unknown is never "gone"."""
    try:
        return await client.get(resource, name, namespace)
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise action_error(error, what) from error
    except TRANSIENT as error:
        raise action_error(error, what) from error


class SlurmdPods:
    """The two verbs on one API client; `check_leader` raises when sunkd may not act."""

    def __init__(self, client: KubeClient, check_leader: Callable[[str], None]) -> None:
        self.client = client
        self.check_leader = check_leader

    async def _pods_on(self, k8s_node: str) -> list[Mapping[str, Any]]:
        items, _ = await self.client.list(PODS, field_selector=f"spec.nodeName={k8s_node}")
        # DaemonSet and mirror pods stay with the node, whoever owns it (as the source).
        return [item for item in items if not node_local(item.get("metadata") or {})]

    async def create(self, *, nodeset: SlurmdNodeset, spec: SlurmdSpec, slurm_node: str,
                     k8s_node: str, name: str) -> bool:
        """True when created; False when sunkd's pod is there already. Raises ActionError."""
        what = f"create slurmd pod {nodeset.namespace}/{name} on {k8s_node}"
        try:
            node = await self.client.get(NODES, k8s_node)
        except TRANSIENT as error:
            raise action_error(error, what) from error
        taints = (node.get("spec") or {}).get("taints") or []
        if not any(isinstance(t, Mapping) and t.get("key") == wk.TAINT_OWNER
                   and t.get("value") == wk.OWNER_SLURM
                   and t.get("effect") == wk.TAINT_OWNER_EFFECT for t in taints):
            raise ActionError(f"{what}: refused, the Node does not carry sunkd's owner taint "
                              f"{wk.TAINT_OWNER}={wk.OWNER_SLURM}:{wk.TAINT_OWNER_EFFECT}",
                              retryable=True)
        try:
            present = [seen_pod(p) for p in await self._pods_on(k8s_node)]
        except TRANSIENT as error:
            raise action_error(error, what) from error
        if [p for p in present if is_own(p, nodeset, slurm_node) and not p.deleting]:
            return False
        foreign = foreign_pods(present, nodeset, slurm_node)
        if foreign:
            raise ActionError(f"{what}: refused, foreign pods run there: "
                              f"{', '.join(foreign[:5])}", retryable=True)
        body = render(spec, nodeset=nodeset.name, namespace=nodeset.namespace,
                      nodeset_uid=nodeset.uid, slurm_node=slurm_node, k8s_node=k8s_node,
                      name=name)
        self.check_leader(what)
        try:
            await self.client.create(PODS, body, nodeset.namespace)
        except KubeApiError as error:
            if error.status != 409:
                raise action_error(error, what) from error
            return await self._existing(what, nodeset, slurm_node, name)
        except TRANSIENT as error:
            raise action_error(error, what) from error
        log.info("slurmd.pod_created", pod=f"{nodeset.namespace}/{name}", node=k8s_node,
                 slurm_node=slurm_node)
        return True

    async def _existing(self, what: str, nodeset: SlurmdNodeset, slurm_node: str,
                        name: str) -> bool:
        """A pod of that name exists: sunkd's (already so), terminating (retry), another's."""
        try:
            pod = seen_pod(await self.client.get(PODS, name, nodeset.namespace))
        except TRANSIENT as error:
            raise action_error(error, what) from error
        if not is_own(pod, nodeset, slurm_node):
            raise RefusedError(f"{what}: a pod of that name exists and is not sunkd's")
        if pod.deleting:
            raise ActionError(f"{what}: the previous pod is still terminating", retryable=True)
        return False

    async def _decided_pod(self, what: str, skipped: str, *, nodeset: SlurmdNodeset,
                           slurm_node: str, k8s_node: str, name: str,
                           uid: str) -> SeenPod | None:
        """The pod an action decided on, read now: None when it is gone, terminating,
        replaced (another uid) or on another node (nothing to do); refused when it is
        not sunkd's."""
        obj = await get_or_none(self.client, PODS, name, nodeset.namespace, what)
        if obj is None:
            return None
        pod = seen_pod(obj)
        if pod.deleting or (uid and pod.uid != uid) \
                or (obj.get("spec") or {}).get("nodeName") != k8s_node:
            log.info(skipped, pod=f"{nodeset.namespace}/{name}", uid=uid,
                     current_uid=pod.uid, deleting=pod.deleting)
            return None
        if not is_own(pod, nodeset, slurm_node):
            raise RefusedError(f"{what}: not sunkd's slurmd pod for {slurm_node} "
                               "(owner or labels)")
        return pod

    async def delete(self, *, nodeset: SlurmdNodeset, slurm_node: str, k8s_node: str,
                     name: str, uid: str, grace_seconds: int) -> bool:
        """True when the deletion was sent; False when that pod is gone, terminating,
        replaced (another uid) or on another node. A pod that is not sunkd's is refused."""
        what = f"delete slurmd pod {nodeset.namespace}/{name}"
        pod = await self._decided_pod(what, "slurmd.delete_skipped", nodeset=nodeset,
                                      slurm_node=slurm_node, k8s_node=k8s_node, name=name,
                                      uid=uid)
        if pod is None:
            return False
        self.check_leader(what)
        try:
            await self.client.delete(PODS, name, nodeset.namespace,
                                     grace_period_seconds=grace_seconds, uid=pod.uid)
        except KubeApiError as error:
            if error.status == 404 or (error.status == 409 and "precondition" in
                                       error.message.lower()):
                return False
            raise action_error(error, what) from error
        except TRANSIENT as error:
            raise action_error(error, what) from error
        log.info("slurmd.pod_deleted", pod=f"{nodeset.namespace}/{name}", node=k8s_node,
                 grace_seconds=grace_seconds)
        return True

    async def label(self, *, nodeset: SlurmdNodeset, slurm_node: str, k8s_node: str,
                    name: str, uid: str, busy: bool) -> bool:
        """Set (`busy`) or remove the busy label on sunkd's slurmd pod; before setting
        it, keep the Nodeset's PDB (`ensure_pdb`). True when anything changed; False
        when the pod is gone, terminating, replaced (another uid) or on another node, or
        already so. A pod that is not sunkd's is refused."""
        what = f"{'label' if busy else 'unlabel'} slurmd pod {nodeset.namespace}/{name} busy"
        pod = await self._decided_pod(what, "slurmd.label_skipped", nodeset=nodeset,
                                      slurm_node=slurm_node, k8s_node=k8s_node, name=name,
                                      uid=uid)
        if pod is None:
            return False
        changed = await self.ensure_pdb(nodeset) if busy else False
        if pod.busy == busy:
            return changed
        # The uid in the patch: the API server refuses to change it (metadata.uid is
        # immutable), so a pod replaced under the same name since the read is not
        # labelled.
        patch = {"metadata": {"uid": pod.uid, "labels": {
            wk.LABEL_SLURMD_BUSY: wk.SLURMD_BUSY_VALUE if busy else None}}}
        self.check_leader(what)
        try:
            await self.client.merge_patch(PODS, name, patch, nodeset.namespace)
        except KubeApiError as error:
            if error.status in (404, 409, 422) and await self._replaced(nodeset, name, uid):
                return changed
            raise action_error(error, what) from error
        except TRANSIENT as error:
            raise action_error(error, what) from error
        log.info("slurmd.pod_labelled", pod=f"{nodeset.namespace}/{name}", node=k8s_node,
                 busy=busy)
        return True

    async def _replaced(self, nodeset: SlurmdNodeset, name: str, uid: str) -> bool:
        try:
            obj = await self.client.get(PODS, name, nodeset.namespace)
        except KubeApiError as error:
            return error.status == 404
        except TRANSIENT:
            return False
        return bool(uid) and str((obj.get("metadata") or {}).get("uid") or "") != uid

    async def ensure_pdb(self, nodeset: SlurmdNodeset) -> bool:
        """The Nodeset's PDB exists as sunkd writes it (`pdb_body`). True when created or
        put back. Its spec changed by someone (another budget, another selector) is put
        back: the busy pods are protected only by exactly that budget; a PDB of that name
        another owner controls is refused (not sunkd's to overwrite)."""
        name = pdb_name(nodeset)
        what = f"keep PodDisruptionBudget {nodeset.namespace}/{name}"
        body = pdb_body(nodeset)
        current = await get_or_none(self.client, PDBS, name, nodeset.namespace, what)
        if current is None:
            self.check_leader(what)
            try:
                await self.client.create(PDBS, body, nodeset.namespace)
            except KubeApiError as error:
                if error.status == 409:  # created since the read: checked next time
                    raise ActionError(f"{what}: created concurrently", retryable=True) \
                        from error
                raise action_error(error, what) from error
            except TRANSIENT as error:
                raise action_error(error, what) from error
            log.info("slurmd.pdb_created", pdb=f"{nodeset.namespace}/{name}")
            return True
        meta = current.get("metadata") or {}
        controller = next((o for o in meta.get("ownerReferences") or []
                           if isinstance(o, Mapping) and o.get("controller") is True), None)
        if controller is None or controller.get("kind") != wk.NODESET_KIND \
                or controller.get("uid") != nodeset.uid:
            raise RefusedError(f"{what}: a PodDisruptionBudget of that name exists and is "
                               "not sunkd's (controller owner); sunkd does not overwrite it")
        if meta.get("deletionTimestamp"):
            raise ActionError(f"{what}: it is being deleted", retryable=True)
        patch = _spec_patch(current.get("spec") or {}, body["spec"])
        if patch is None:
            return False
        self.check_leader(what)
        try:
            await self.client.merge_patch(PDBS, name, {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "spec": patch}, nodeset.namespace)
        except TRANSIENT as error:  # 409: changed again since the read; next time
            raise action_error(error, what) from error
        log.warning("slurmd.pdb_restored", pdb=f"{nodeset.namespace}/{name}",
                    found=current.get("spec"))
        return True

    async def act(self, verb: str, slurm_node: str, k8s_node: str,
                  args: Mapping[str, str]) -> bool:
        """An `action.requested` of VERB_SLURMD_CREATE/DELETE, from its args
        (`policy.slurmd.slurmd_args`)."""
        namespace, _, name = args.get("nodeset", "").partition("/")
        pod_namespace, _, pod = args.get("pod", "").partition("/")
        if not (name and pod and args.get("nodeset_uid")) or pod_namespace != namespace:
            raise RefusedError(f"{verb} {slurm_node}: malformed arguments {sorted(args)}")
        if verb == VERB_SLURMD_CREATE:
            spec = spec_from_json(args["spec"])
            nodeset = SlurmdNodeset(name, namespace, args["nodeset_uid"], spec)
            return await self.create(nodeset=nodeset, spec=spec, slurm_node=slurm_node,
                                     k8s_node=k8s_node, name=pod)
        if verb == VERB_SLURMD_DELETE:
            nodeset = SlurmdNodeset(name, namespace, args["nodeset_uid"], SlurmdSpec())
            return await self.delete(nodeset=nodeset, slurm_node=slurm_node,
                                     k8s_node=k8s_node, name=pod,
                                     uid=args.get("pod_uid", ""),
                                     grace_seconds=int(args["grace_seconds"]))
        if verb == VERB_SLURMD_LABEL:
            nodeset = SlurmdNodeset(name, namespace, args["nodeset_uid"], SlurmdSpec())
            return await self.label(nodeset=nodeset, slurm_node=slurm_node,
                                    k8s_node=k8s_node, name=pod,
                                    uid=args.get("pod_uid", ""),
                                    busy=args.get(BUSY_ARG) == "1")
        raise RefusedError(f"unknown slurmd verb {verb!r}")


def pdb_name(nodeset: SlurmdNodeset) -> str:
    return f"{nodeset.name}{wk.PDB_SLURMD_BUSY_SUFFIX}"


# The budget: every selected pod must stay. Not `maxUnavailable: 0`: with
# `maxUnavailable` (or a percentage) the disruption controller counts the expected pods
# from the scale of each pod's controller (`getExpectedScale` in
# pkg/controller/disruption/disruption.go), and a Nodeset has no scale subresource, so
# the real controller reports SyncFailed ("no matches for kind"/"does not implement the
# scale subresource") and refuses only by its fail-safe; a scale reading 0 would even
# allow every eviction. An integer `minAvailable` counts the selected pods themselves
# (expected = the pods, desired = minAvailable): with the largest int32 no selected pod
# can ever be disrupted, and the status syncs.
PDB_MIN_AVAILABLE = 2**31 - 1


def pdb_body(nodeset: SlurmdNodeset) -> JSON:
    """The Nodeset's policy/v1 PodDisruptionBudget: no eviction of its slurmd pods that
    carry the busy label (`PDB_MIN_AVAILABLE`). `unhealthyPodEvictionPolicy` is left at
    its default (IfHealthyBudget): a busy pod that is not Ready is not evicted either,
    since the budget's health never reaches its desired health."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": pdb_name(nodeset),
            "namespace": nodeset.namespace,
            "labels": {wk.LABEL_SLURMD_NODESET: nodeset.name},
            "ownerReferences": [{"apiVersion": wk.API_VERSION, "kind": wk.NODESET_KIND,
                                 "name": nodeset.name, "uid": nodeset.uid,
                                 "controller": True}],
        },
        "spec": {
            "minAvailable": PDB_MIN_AVAILABLE,
            "selector": {"matchLabels": {wk.LABEL_SLURMD_NODESET: nodeset.name,
                                         wk.LABEL_SLURMD_BUSY: wk.SLURMD_BUSY_VALUE}},
        },
    }


def _spec_patch(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> JSON | None:
    """A merge patch that makes `found` (a PDB spec) `wanted`'s budget and selector, or
    None when it is already: another budget (`maxUnavailable`), other selector terms
    (labels, expressions) are removed."""
    selector = found.get("selector") or {}
    want_labels = wanted["selector"]["matchLabels"]
    if (found.get("minAvailable") == wanted["minAvailable"]
            and found.get("maxUnavailable") is None
            and (selector.get("matchLabels") or {}) == want_labels
            and not selector.get("matchExpressions")):
        return None
    labels: dict[str, Any] = {key: None for key in selector.get("matchLabels") or {}}
    labels.update(want_labels)
    return {"minAvailable": wanted["minAvailable"], "maxUnavailable": None,
            "selector": {"matchLabels": labels, "matchExpressions": None}}
