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
    SlurmdNodeset,
    foreign_pods,
    is_own,
    spec_from_json,
)
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.kubernetes.client import NODES, PODS, KubeApiError, KubeClient
from sunkd.kubernetes.normalize import node_local
from sunkd.kubernetes.slurmd_pod import render, seen_pod

log = structlog.get_logger(__name__)

_TRANSIENT = (KubeApiError, aiohttp.ClientError, TimeoutError, OSError)


def _error(error: Exception, what: str) -> ActionError:
    if isinstance(error, KubeApiError):
        return ActionError(f"{what}: {error}", retryable=error.retryable)
    return ActionError(f"{what}: {type(error).__name__}: {error}", retryable=True)


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
        except _TRANSIENT as error:
            raise _error(error, what) from error
        taints = (node.get("spec") or {}).get("taints") or []
        if not any(isinstance(t, Mapping) and t.get("key") == wk.TAINT_OWNER
                   and t.get("value") == wk.OWNER_SLURM
                   and t.get("effect") == wk.TAINT_OWNER_EFFECT for t in taints):
            raise ActionError(f"{what}: refused, the Node does not carry sunkd's owner taint "
                              f"{wk.TAINT_OWNER}={wk.OWNER_SLURM}:{wk.TAINT_OWNER_EFFECT}",
                              retryable=True)
        try:
            present = [seen_pod(p) for p in await self._pods_on(k8s_node)]
        except _TRANSIENT as error:
            raise _error(error, what) from error
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
                raise _error(error, what) from error
            return await self._existing(what, nodeset, slurm_node, name)
        except _TRANSIENT as error:
            raise _error(error, what) from error
        log.info("slurmd.pod_created", pod=f"{nodeset.namespace}/{name}", node=k8s_node,
                 slurm_node=slurm_node)
        return True

    async def _existing(self, what: str, nodeset: SlurmdNodeset, slurm_node: str,
                        name: str) -> bool:
        """A pod of that name exists: sunkd's (already so), terminating (retry), another's."""
        try:
            pod = seen_pod(await self.client.get(PODS, name, nodeset.namespace))
        except _TRANSIENT as error:
            raise _error(error, what) from error
        if not is_own(pod, nodeset, slurm_node):
            raise RefusedError(f"{what}: a pod of that name exists and is not sunkd's")
        if pod.deleting:
            raise ActionError(f"{what}: the previous pod is still terminating", retryable=True)
        return False

    async def delete(self, *, nodeset: SlurmdNodeset, slurm_node: str, k8s_node: str,
                     name: str, uid: str, grace_seconds: int) -> bool:
        """True when the deletion was sent; False when that pod is gone, terminating,
        replaced (another uid) or on another node. A pod that is not sunkd's is refused."""
        what = f"delete slurmd pod {nodeset.namespace}/{name}"
        try:
            obj = await self.client.get(PODS, name, nodeset.namespace)
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise _error(error, what) from error
        except _TRANSIENT as error:
            raise _error(error, what) from error
        pod = seen_pod(obj)
        if pod.deleting or (uid and pod.uid != uid) \
                or (obj.get("spec") or {}).get("nodeName") != k8s_node:
            log.info("slurmd.delete_skipped", pod=f"{nodeset.namespace}/{name}", uid=uid,
                     current_uid=pod.uid, deleting=pod.deleting)
            return False
        if not is_own(pod, nodeset, slurm_node):
            raise RefusedError(f"{what}: not sunkd's slurmd pod for {slurm_node} "
                               "(owner or labels)")
        self.check_leader(what)
        try:
            await self.client.delete(PODS, name, nodeset.namespace,
                                     grace_period_seconds=grace_seconds, uid=pod.uid)
        except KubeApiError as error:
            if error.status == 404 or (error.status == 409 and "precondition" in
                                       error.message.lower()):
                return False
            raise _error(error, what) from error
        except _TRANSIENT as error:
            raise _error(error, what) from error
        log.info("slurmd.pod_deleted", pod=f"{nodeset.namespace}/{name}", node=k8s_node,
                 grace_seconds=grace_seconds)
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
        raise RefusedError(f"unknown slurmd verb {verb!r}")
