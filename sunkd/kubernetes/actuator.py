"""Kubernetes actuator: the side effects sunkd has on the cluster, each idempotent.

Every method returns whether it changed anything and raises `ActionError` / `RefusedError`
(sunkd.domain.ports). The outbox may re-run any of them after a crash, so "already done" is a
normal outcome (`False`), never an error.

Concurrency rules, with the Kubernetes behaviour they guard against:
- `spec.taints` is an *atomic* list (k/api core/v1 types.go `+listType=atomic`): any patch that
  sets it replaces the whole list. Adding our taint by patching `{"spec":{"taints":[ours]}}`
  would delete taints other controllers own (node.kubernetes.io/unschedulable, not-ready, ...).
  So taint edits are read-modify-write with `metadata.resourceVersion` in the merge patch as a
  precondition; a concurrent writer makes the server answer 409 and we re-read and retry.
- Cordon state is shared with humans and other tools (`kubectl cordon`, autoscalers), so sunkd
  never touches it: its hold is its own taint, and the policy lifts that taint only where
  sunkd's log proves it wrote it (`sunkd.domain.authorship`): a copy under the same key is an
  operator's. Taint writes carry a resourceVersion precondition (above).
- Eviction goes through policy/v1 Eviction, never DELETE, so PodDisruptionBudgets hold; a 429
  from a PDB is a retryable failure, not something to force.

Every mutating action also records a core/v1 Event on the Node so `kubectl describe node`
tells the story. Those Event writes are best effort: a failed Event never fails the action.
The one exception is `post_event`, the `warn` action itself: the Event *is* its effect,
so an Event the API server refused or never got fails the action.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.ports import ActionError
from sunkd.kubernetes import slurmd_actuator, slurmd_finalizer
from sunkd.kubernetes.client import (
    EVENTS,
    JSON,
    NODES,
    NODESETS,
    PODS,
    KubeApiError,
    KubeClient,
    ResourceType,
)
from sunkd.kubernetes.wire import format_time, utcnow

log = structlog.get_logger("sunkd.kubernetes.actuator")

OWNER_TAINT = {"key": wk.TAINT_OWNER, "value": wk.OWNER_SLURM,
               "effect": wk.TAINT_OWNER_EFFECT}
HOLD_TAINT = {"key": wk.TAINT_HOLD, "value": wk.OWNER_SLURM, "effect": wk.TAINT_OWNER_EFFECT}


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One verb on one resource that sunkd issues; the ClusterRole must grant each."""

    verb: str
    group: str  # "" = core
    resource: str  # plural, with "/subresource" where applicable
    why: str


API_CALLS: tuple[ApiCall, ...] = (
    ApiCall("list", "", "nodes", "source: list-then-watch Nodes"),
    ApiCall("watch", "", "nodes", "source: list-then-watch Nodes"),
    ApiCall("get", "", "nodes", "actuator: read-modify-write of taints, labels, cordon"),
    ApiCall("patch", "", "nodes", "actuator: taint/label/cordon/annotate (merge patch)"),
    ApiCall("list", "", "pods", "source: list-then-watch Pods (workload, demand)"),
    ApiCall("watch", "", "pods", "source: list-then-watch Pods"),
    ApiCall("get", "", "pods", "actuator: evict (is the pod already gone/terminating?)"),
    ApiCall("create", "", "pods/eviction", "actuator: evict through the Eviction API"),
    ApiCall("create", "", "events", "actuator: record_event on Nodes"),
    ApiCall("patch", "", "events", "actuator: count repeats of the same Event"),
    ApiCall("list", NODESETS.group, "nodesets", "source: list-then-watch Nodesets"),
    ApiCall("watch", NODESETS.group, "nodesets", "source: list-then-watch Nodesets"),
    ApiCall("get", NODESETS.group, "nodesets", "actuator: status idempotency check"),
    ApiCall("patch", NODESETS.group, "nodesets/status", "actuator: update_nodeset_status"),
    ApiCall("get", "coordination.k8s.io", "leases", "leader election"),
    ApiCall("create", "coordination.k8s.io", "leases", "leader election"),
    ApiCall("update", "coordination.k8s.io", "leases", "leader election (renew, release)"),
)
# Only where a site runs slurmd pods (Nodeset spec.slurmd, docs/nodeset.md): creating pods
# is a right an operator grants on purpose (the chart's `rbac.slurmdPods`), so it is not
# in API_CALLS, which every installation grants.
SLURMD_API_CALLS: tuple[ApiCall, ...] = (
    ApiCall("create", "", "pods", "actuator: a Nodeset's slurmd pod (spec.slurmd)"),
    ApiCall("delete", "", "pods", "actuator: a Nodeset's slurmd pod, once Slurm drained it"),
    ApiCall("patch", "", "pods", "actuator: the busy label on a Nodeset's slurmd pod"),
    ApiCall("get", "policy", "poddisruptionbudgets",
            "actuator: the Nodeset's PDB over its busy slurmd pods"),
    ApiCall("create", "policy", "poddisruptionbudgets",
            "actuator: the Nodeset's PDB over its busy slurmd pods"),
    ApiCall("patch", "policy", "poddisruptionbudgets",
            "actuator: the Nodeset's PDB put back when someone changed it"),
    ApiCall("patch", NODESETS.group, "nodesets",
            "actuator: sunkd's finalizer on a Nodeset with spec.slurmd (put on, taken off)"),
)


def _translate(error: Exception, what: str) -> ActionError:
    """Map a transport or API failure to the actuator contract."""
    if isinstance(error, KubeApiError):
        if error.status == 404:
            return ActionError(f"{what}: not found ({error.message})", retryable=False)
        if error.status in (401, 403):
            return ActionError(f"{what}: permission denied ({error.message})", retryable=False)
        if error.status in (400, 415, 422):
            return ActionError(f"{what}: rejected by the API server ({error})", retryable=False)
        return ActionError(f"{what}: {error}", retryable=error.retryable)
    return ActionError(f"{what}: {type(error).__name__}: {error}", retryable=True)


_TRANSIENT = (KubeApiError, aiohttp.ClientError, TimeoutError, OSError)


class KubernetesActuator:
    """Idempotent Kubernetes side effects.

    `may_act` is checked before every write (e.g. `LeaseElector.holds_lease`): a deposed
    leader must stop acting at once (client-go tools/leaderelection: a leader that cannot renew
    stops).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        event_namespace: str = "default",
        nodeset_resource: ResourceType = NODESETS,
        instance: str = "",
        max_conflict_retries: int = 5,
        may_act: Callable[[], bool] | None = None,
    ) -> None:
        self.client = client
        self.event_namespace = event_namespace
        self.nodeset_resource = nodeset_resource
        self.instance = instance or f"sunkd-{secrets.token_hex(4)}"
        self.max_conflict_retries = max_conflict_retries
        self.may_act = may_act
        # (node, reason, message) -> (event name, count): repeats bump count, like the kubelet's
        # event correlator, instead of piling up identical Events.
        self._recent_events: dict[tuple[str, str, str], tuple[str, int]] = {}

    # -- helpers ----------------------------------------------------------------------

    def _check_leader(self, what: str) -> None:
        if self.may_act is not None and not self.may_act():
            raise ActionError(f"{what}: not the leader (lease not held)", retryable=True)

    async def _get_node(self, node: str) -> JSON:
        try:
            return await self.client.get(NODES, node)
        except _TRANSIENT as error:
            raise _translate(error, f"get node {node}") from error

    async def _modify_node(
        self,
        node: str,
        what: str,
        mutate: Callable[[JSON], dict[str, Any] | None],
    ) -> tuple[bool, JSON]:
        """Read, compute a merge patch, write it under the read resourceVersion; on 409 re-read
        and recompute. `mutate` returns None when the node already is as wanted."""
        for attempt in range(self.max_conflict_retries + 1):
            current = await self._get_node(node)
            patch = mutate(current)
            if patch is None:
                return False, current
            rv = (current.get("metadata") or {}).get("resourceVersion")
            patch.setdefault("metadata", {})["resourceVersion"] = rv
            self._check_leader(what)
            try:
                updated = await self.client.merge_patch(NODES, node, patch)
                return True, updated
            except KubeApiError as error:
                if error.status == 409:
                    log.info("conflict, re-reading node", node=node, action=what, attempt=attempt)
                    await asyncio.sleep(0.01 * (attempt + 1))
                    continue
                raise _translate(error, f"{what} {node}") from error
            except _TRANSIENT as error:
                raise _translate(error, f"{what} {node}") from error
        raise ActionError(
            f"{what} {node}: still conflicting after {self.max_conflict_retries} retries "
            "(another controller keeps writing the node)",
            retryable=True,
        )

    # -- ownership taint and label -------------------------------------------------------

    async def lock(self, node: str) -> bool:
        """Give the node to Slurm on the Kubernetes side: taint `sunkd.io/owner=slurm:NoSchedule`
        and label `sunkd.io/owner=slurm`. Other taints are preserved."""

        def mutate(obj: JSON) -> dict[str, Any] | None:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            labels = (obj.get("metadata") or {}).get("labels") or {}
            ours = [t for t in taints if t.get("key") == wk.LABEL_OWNER]
            has_taint = len(ours) == 1 and _same_taint(ours[0], OWNER_TAINT)
            if has_taint and labels.get(wk.LABEL_OWNER) == "slurm":
                return None
            kept = [t for t in taints if t.get("key") != wk.LABEL_OWNER]
            return {
                "metadata": {"labels": {wk.LABEL_OWNER: "slurm"}},
                "spec": {"taints": [*kept, dict(OWNER_TAINT)]},
            }

        changed, obj = await self._modify_node(node, "lock", mutate)
        if changed:
            await self._record(
                node,
                wk.EVENT_LOCKED,
                "sunkd gave the node to Slurm: tainted sunkd.io/owner=slurm",
                uid=_uid(obj),
            )
        return changed

    async def unlock(self, node: str) -> bool:
        """Give the node to Kubernetes: remove our taint, label `sunkd.io/owner=kubernetes`."""

        def mutate(obj: JSON) -> dict[str, Any] | None:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            labels = (obj.get("metadata") or {}).get("labels") or {}
            kept = [t for t in taints if t.get("key") != wk.LABEL_OWNER]
            if len(kept) == len(taints) and labels.get(wk.LABEL_OWNER) == "kubernetes":
                return None
            patch: dict[str, Any] = {"metadata": {"labels": {wk.LABEL_OWNER: "kubernetes"}}}
            if len(kept) != len(taints):
                # Merge patch replaces lists wholesale; an empty list would be stored as [],
                # so write null to drop the field when nothing remains.
                patch["spec"] = {"taints": kept or None}
            return patch

        changed, obj = await self._modify_node(node, "unlock", mutate)
        if changed:
            await self._record(
                node,
                wk.EVENT_UNLOCKED,
                "sunkd gave the node to Kubernetes: removed owner taint",
                uid=_uid(obj),
            )
        return changed

    # -- hold ----------------------------------------------------------------------------

    async def hold(self, node: str, reason: str) -> bool:
        """Keep new pods off the node while Slurm holds it: add sunkd's own NoSchedule taint
        `sunkd.io/slurm-hold=slurm` (and the reason as an annotation for `kubectl describe`).

        sunkd never touches spec.unschedulable: `kubectl uncordon` would leave behind any
        annotation sunkd used to mark "its" cordon, and a later human cordon would then look
        like sunkd's. A taint under sunkd's key is unambiguous, and every cordon stays the
        operator's (docs/safety.md, invariant I2)."""

        def mutate(obj: JSON) -> dict[str, Any] | None:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            ours = [t for t in taints if t.get("key") == wk.TAINT_HOLD]
            has_taint = len(ours) == 1 and _same_taint(ours[0], HOLD_TAINT)
            if has_taint and annotations.get(wk.ANNOTATION_HOLD_REASON) == reason:
                return None
            patch: dict[str, Any] = {
                "metadata": {"annotations": {wk.ANNOTATION_HOLD_REASON: reason}}}
            if not has_taint:
                kept = [t for t in taints if t.get("key") != wk.TAINT_HOLD]
                patch["spec"] = {"taints": [*kept, dict(HOLD_TAINT)]}
            return patch

        changed, obj = await self._modify_node(node, "hold", mutate)
        if changed:
            await self._record(
                node, wk.EVENT_HELD,
                f"sunkd tainted the node {wk.TAINT_HOLD} (Slurm holds it): {reason}",
                uid=_uid(obj),
            )
        return changed

    async def release(self, node: str) -> bool:
        """Remove sunkd's hold taint (and its annotations). Never changes spec.unschedulable:
        a cordon on the node is someone else's and stays."""

        def mutate(obj: JSON) -> dict[str, Any] | None:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            kept = [t for t in taints if t.get("key") != wk.TAINT_HOLD]
            stale = [key for key in (wk.ANNOTATION_LEGACY_CORDONED_BY, wk.ANNOTATION_HOLD_REASON)
                     if key in annotations]
            if len(kept) == len(taints) and not stale:
                return None
            patch: dict[str, Any] = {}
            if stale:
                patch["metadata"] = {"annotations": {key: None for key in stale}}
            if len(kept) != len(taints):
                patch["spec"] = {"taints": kept or None}
            return patch

        changed, obj = await self._modify_node(node, "release", mutate)
        if changed:
            await self._record(
                node, wk.EVENT_RELEASED, f"sunkd removed its {wk.TAINT_HOLD} taint",
                uid=_uid(obj))
        return changed

    # -- annotations ----------------------------------------------------------------------

    async def annotate(self, node: str, values: Mapping[str, str | None]) -> bool:
        """Set (or with None remove) sunkd.io/ annotations, e.g. sunkd.io/slurm-state."""
        foreign = [key for key in values if not key.startswith(wk.PREFIX)]
        if foreign:
            raise ActionError(
                f"annotate {node}: refusing to write annotations outside {wk.PREFIX}: "
                f"{sorted(foreign)}",
                retryable=False,
            )

        def mutate(obj: JSON) -> dict[str, Any] | None:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            delta = {k: v for k, v in values.items() if annotations.get(k) != v}
            if not delta:
                return None
            return {"metadata": {"annotations": delta}}

        # Annotations are a map: merge patch merges keys, no lost-update risk for other keys,
        # but the precondition costs nothing and keeps one code path.
        changed, obj = await self._modify_node(node, "annotate", mutate)
        if changed:
            summary = ", ".join(
                f"{k}={v if v is not None else '<removed>'}" for k, v in values.items()
            )
            await self._record(node, wk.EVENT_ANNOTATED, f"sunkd set {summary}", uid=_uid(obj))
        return changed

    # -- eviction -------------------------------------------------------------------------

    async def evict(
        self, namespace: str, pod: str, *, uid: str | None = None, node: str | None = None
    ) -> bool:
        """Evict through policy/v1 Eviction so PodDisruptionBudgets are honoured.

        False when the pod is already gone or terminating, or is not the pod decided on: a
        different uid (re-created under the same name, as a StatefulSet does) or no longer
        on `node`. The eviction carries `deleteOptions.preconditions.uid` of the pod whose
        node was checked, so the API server refuses it (409) if the pod was replaced in
        between. A PDB answering 429 is a retryable ActionError whose message names the
        PDB (API docs, "API-initiated eviction": 429 while a PDB forbids it)."""
        what = f"evict {namespace}/{pod}"
        try:
            current = await self.client.get(PODS, pod, namespace)
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise _translate(error, what) from error
        except _TRANSIENT as error:
            raise _translate(error, what) from error
        meta = current.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return False
        current_uid = meta.get("uid")
        on_node = (current.get("spec") or {}).get("nodeName")
        if uid and current_uid != uid:
            log.info("evict.skipped", pod=f"{namespace}/{pod}", why="a different pod (uid)",
                     decided_uid=uid, current_uid=current_uid)
            return False
        if node is not None and on_node != node:
            log.info("evict.skipped", pod=f"{namespace}/{pod}", why="not on the node",
                     node=node, on_node=on_node)
            return False
        node = on_node
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        if current_uid:
            body["deleteOptions"] = {"preconditions": {"uid": current_uid}}
        self._check_leader(what)
        try:
            await self.client.create(PODS, body, namespace, name=pod, subresource="eviction")
        except KubeApiError as error:
            replaced = error.status == 409 and "precondition" in error.message.lower()
            if error.status == 404 or replaced:
                return False  # gone, or replaced since we looked (the uid precondition)
            if error.status == 429:
                causes = "; ".join(str(c.get("message") or "") for c in error.causes)
                raise ActionError(
                    f"{what}: blocked by a PodDisruptionBudget (PDB): {error.message}"
                    + (f" ({causes})" if causes else ""),
                    retryable=True,
                ) from error
            raise _translate(error, what) from error
        except _TRANSIENT as error:
            raise _translate(error, what) from error
        if node:
            await self.record_event(
                str(node),
                wk.EVENT_EVICTED,
                f"sunkd evicted pod {namespace}/{pod} to reclaim the node",
            )
        return True

    async def slurmd(self, verb: str, slurm_node: str, k8s_node: str,
                     args: Mapping[str, str]) -> bool:
        """Create or delete a Nodeset's slurmd pod (`kubernetes/slurmd_actuator.py`)."""
        if verb in slurmd_finalizer.VERBS:
            finalizer = slurmd_finalizer.NodesetFinalizer(
                self.client, self.nodeset_resource, self._check_leader)
            return await finalizer.act(verb, args)
        pods = slurmd_actuator.SlurmdPods(self.client, self._check_leader)
        return await pods.act(verb, slurm_node, k8s_node, args)

    # -- Nodeset status -------------------------------------------------------------------

    async def update_nodeset_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge `status` into the Nodeset's status through the status subresource.

        No Event: status is itself the record, and it changes with every reconcile."""
        what = f"update status of nodeset {namespace}/{name}"
        rt = self.nodeset_resource
        try:
            current = await self.client.get(rt, name, namespace)
        except _TRANSIENT as error:
            raise _translate(error, what) from error
        existing = current.get("status") or {}
        if _merge_preview(existing, status) == existing:
            return False
        self._check_leader(what)
        try:
            await self.client.merge_patch(
                rt, name, {"status": dict(status)}, namespace, subresource="status"
            )
        except _TRANSIENT as error:
            raise _translate(error, what) from error
        return True

    # -- Events ---------------------------------------------------------------------------

    async def record_event(
        self, node: str, reason: str, message: str, type: str = "Normal"
    ) -> bool:
        """A core/v1 Event on the Node (best effort; returns False when it could not be written).

        Node events live in the `default` namespace with an empty involvedObject.namespace;
        `kubectl describe node` finds them by involvedObject kind/name/uid (kubectl's describe.go,
        DescribeEvents), so the uid is the node's real uid when we can read it, else its name
        (what the
        kubelet uses)."""
        return await self._record(node, reason, message, type)

    async def post_event(
        self, node: str, reason: str, message: str, type: str = "Warning"
    ) -> bool:
        """The `warn` action: an Event on the Node that must be written. Raises
        `ActionError` when it was not (403/422: not retryable; an outage, 5xx, 429:
        retryable), so the outbox records a failure and the policy asks again."""
        what = f"post {type} Event {reason} on node {node}"
        self._check_leader(what)
        try:
            await self._write_event(node, reason, message, type)
        except _TRANSIENT as error:
            raise _translate(error, what) from error
        return True

    async def _record(
        self, node: str, reason: str, message: str, type: str = "Normal", *, uid: str | None = None
    ) -> bool:
        try:
            await self._write_event(node, reason, message, type, uid=uid)
        except _TRANSIENT as error:
            log.warning("could not record event", node=node, reason=reason, error=str(error))
            return False
        return True

    async def _write_event(
        self, node: str, reason: str, message: str, type: str, *, uid: str | None = None
    ) -> None:
        now = format_time(utcnow())
        correlation = (node, reason, message)
        previous = self._recent_events.get(correlation)
        if previous is not None:
            name, count = previous
            try:
                await self.client.merge_patch(
                    EVENTS,
                    name,
                    {"count": count + 1, "lastTimestamp": now},
                    self.event_namespace,
                )
                self._recent_events[correlation] = (name, count + 1)
                return
            except KubeApiError as error:
                if error.status != 404:
                    raise
        if not uid:
            uid = node
            try:
                uid = _uid(await self.client.get(NODES, node)) or node
            except KubeApiError:
                pass
        name = f"{node}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self.event_namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": uid,
                "namespace": "",
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": wk.EVENT_COMPONENT},
            "reportingComponent": wk.EVENT_REPORTING_COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.client.create(EVENTS, body, self.event_namespace)
        if len(self._recent_events) > 4096:
            self._recent_events.clear()
        self._recent_events[correlation] = (name, 1)


def _uid(obj: Mapping[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("key"), a.get("value") or "", a.get("effect")) == (
        b.get("key"),
        b.get("value") or "",
        b.get("effect"),
    )


def _merge_preview(target: Any, patch: Any) -> Any:
    """RFC 7386 applied locally, to tell whether a status patch would change anything."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_preview(result.get(key), value)
    return result
