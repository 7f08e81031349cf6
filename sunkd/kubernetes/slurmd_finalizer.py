"""Put sunkd's finalizer on a Nodeset, or take it off: only its own name, and checked again.

The plan (`domain/policy/slurmdfinalizer.py`) decided on an observation that may be a watch
event old; each write here reads the Nodeset again and is conditional on what it read:

- the patch carries the Nodeset's `uid` (immutable: a Nodeset deleted and re-created under
  the name since is refused by the API server) and its `resourceVersion` (optimistic
  concurrency: 409 when anyone changed it since the read, and the action is retried);
- `metadata.finalizers` is a list that a merge patch replaces whole (RFC 7386), so the
  list written is the one read with only sunkd's name added or removed: another
  controller's finalizer is never dropped, nor one added since the read (409);
- **add** is refused on a Nodeset marked for deletion (the API server forbids a new
  finalizer then: `ValidateObjectMetaUpdate`, apimachinery/pkg/api/validation) or
  without `spec.slurmd` (nothing to protect);
- **remove** lists the Nodeset's slurmd pods (its label) right before and refuses while
  any pod whose controller owner is this Nodeset (by uid) is left, terminating or not:
  the garbage collector would delete it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.slurmdfinalizer import VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.kubernetes.client import JSON, PODS, KubeApiError, KubeClient, ResourceType
from sunkd.kubernetes.slurmd_actuator import TRANSIENT, action_error, get_or_none

log = structlog.get_logger(__name__)

VERBS = (VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE)


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(ref, Mapping) and ref.get("uid") == uid
               and ref.get("kind") == wk.NODESET_KIND for ref in refs)


class NodesetFinalizer:
    def __init__(self, client: KubeClient, nodesets: ResourceType,
                 check_leader: Callable[[str], None]) -> None:
        self.client = client
        self.nodesets = nodesets
        self.check_leader = check_leader

    async def _read(self, what: str, namespace: str, name: str, uid: str) -> JSON | None:
        obj = await get_or_none(self.client, self.nodesets, name, namespace, what)
        if obj is None:
            return None
        if str((obj.get("metadata") or {}).get("uid") or "") != uid:
            return None  # another Nodeset of the name: not the one decided on
        return obj

    async def pods_left(self, namespace: str, name: str, uid: str) -> list[str]:
        """The Nodeset's pods (its slurmd label, its uid as an owner), terminating ones too."""
        items, _ = await self.client.list(
            PODS, namespace=namespace, label_selector=f"{wk.LABEL_SLURMD_NODESET}={name}")
        return sorted(f"{namespace}/{(p.get('metadata') or {}).get('name')}"
                      for p in items if _owned_by(p, uid))

    async def act(self, verb: str, args: Mapping[str, str]) -> bool:
        """True when the finalizers changed; False when already so or the Nodeset is gone."""
        namespace, _, name = args.get("nodeset", "").partition("/")
        uid = args.get("nodeset_uid", "")
        if not (namespace and name and uid) or verb not in VERBS:
            raise RefusedError(f"{verb}: malformed arguments {sorted(args)}")
        adding = verb == VERB_FINALIZER_ADD
        what = (f"{'add' if adding else 'remove'} finalizer {wk.FINALIZER_SLURMD_PODS} "
                f"{'to' if adding else 'from'} Nodeset {namespace}/{name}")
        obj = await self._read(what, namespace, name, uid)
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        found = meta.get("finalizers") or []
        if not isinstance(found, list):
            raise RefusedError(f"{what}: metadata.finalizers is not a list")
        ours = wk.FINALIZER_SLURMD_PODS in found
        if adding:
            if ours:
                return False
            if meta.get("deletionTimestamp"):
                raise RefusedError(f"{what}: the Nodeset is being deleted (no new finalizer)")
            if not (obj.get("spec") or {}).get("slurmd"):
                raise RefusedError(f"{what}: the Nodeset has no spec.slurmd")
            wanted = [*found, wk.FINALIZER_SLURMD_PODS]
        else:
            if not ours:
                return False
            try:
                left = await self.pods_left(namespace, name, uid)
            except TRANSIENT as error:
                raise action_error(error, what) from error
            if left:
                raise ActionError(f"{what}: refused, its slurmd pods are left: "
                                  f"{', '.join(left[:5])}", retryable=True)
            wanted = [f for f in found if f != wk.FINALIZER_SLURMD_PODS]
        patch = {"metadata": {"uid": uid, "resourceVersion": meta.get("resourceVersion"),
                              "finalizers": wanted}}
        self.check_leader(what)
        try:
            await self.client.merge_patch(self.nodesets, name, patch, namespace)
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise action_error(error, what) from error  # 409: changed since the read: retried
        except TRANSIENT as error:
            raise action_error(error, what) from error
        log.info("slurmd.finalizer_added" if adding else "slurmd.finalizer_removed",
                 nodeset=f"{namespace}/{name}", finalizers=wanted)
        return True
