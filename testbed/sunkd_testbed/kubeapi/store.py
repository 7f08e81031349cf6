"""The emulator's object store: one global resourceVersion, history, watchers, strategies.

Everything the HTTP layer does goes through here, and so do the in-process helpers, so
both see the same semantics (`kubernetes.md` section 2 of the design notes):

* one integer resourceVersion across all types, bumped on every write (etcd revision);
* no-op writes (identical stored JSON) bump nothing and emit nothing (etcd3 store
  `GuaranteedUpdate` short-circuit);
* 409 Conflict on a stale resourceVersion (generic `registry/store.go` Update), 404,
  409 AlreadyExists, 422 for CR updates without resourceVersion
  (`customresource/strategy.go` AllowUnconditionalUpdate=false);
* status subresource rules (`customresource/status_strategy.go`): main writes keep the
  old status, `/status` writes keep everything but the status; generation bumps only on
  spec changes;
* a bounded history of events used to replay watches from a resourceVersion, to serve
  consistent `continue` pages, and to answer 410 Expired when a version is too old
  (`storage/cacher/watch_cache.go`);
* pod graceful deletion (`pkg/registry/core/pod/strategy.go` CheckGracefulDelete), the
  Eviction subresource (`pkg/registry/core/pod/storage/eviction.go`) and an inline
  stand-in for the disruption controller that keeps PDB status current.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import copy
import json
import math
import re
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import errors
from .builtin import make_builtins
from .errors import KubeAPIError
from .patch import json_patch, merge_patch, strategic_merge_patch
from .resources import JSON, ResourceType
from .schema import apply_defaults, prune, validate
from .selectors import FieldSelector, LabelSelector, label_selector_matches
from .tables import crd_column

ObjKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH, APPLY_PATCH)

MICROTIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), exact and ~5x faster than
    `copy.deepcopy`, whose memo bookkeeping made a 100,000-pod LIST spend seconds copying
    (bench/scale.py). Anything else is left to `copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


@dataclass
class HistoryEvent:
    rv: int
    rt_key: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: JSON  # the new state; for DELETED the last state carrying the deletion's RV
    prev: JSON | None


@dataclass(eq=False)  # identity semantics: kept in sets
class Watcher:
    rt: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[HistoryEvent | None] = field(default_factory=asyncio.Queue)

    def _matches(self, obj: JSON | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(
            self.rt.fields(obj))

    def translate(self, event: HistoryEvent) -> tuple[str, JSON] | None:
        """Selector transitions as in cacher/cache_watcher.go convertToWatchEvent."""
        now = self._matches(event.obj)
        before = self._matches(event.prev)
        if event.type == "DELETED":
            return ("DELETED", event.obj) if now else None
        if now and before:
            return "MODIFIED", event.obj
        if now:
            return "ADDED", event.obj
        if before and event.prev is not None:
            gone = copy.deepcopy(event.prev)
            _meta(gone)["resourceVersion"] = str(event.rv)
            return "DELETED", gone
        return None


@dataclass
class DeleteResult:
    obj: JSON
    deleted: bool  # False while graceful deletion or finalizers are pending


class Store:
    """In-memory state plus all write semantics. Synchronous: asyncio gives atomicity."""

    def __init__(self, history_size: int = 1000) -> None:
        self.rv = 1
        self.history: deque[HistoryEvent] = deque()
        self.history_size = history_size
        # A watch or continue token from version N is valid while N >= floor.
        self.floor = 1
        self.objects: dict[str, dict[ObjKey, JSON]] = {}
        # The sorted keys of a type as of a list's resourceVersion: every page of a paged
        # LIST is served at that version, so its pages share one sort (the newest two kept).
        self._sorted_keys: dict[tuple[str, int], list[ObjKey]] = {}
        self.types: dict[tuple[str, str, str], ResourceType] = {}  # (group, version, plural)
        self.watchers: set[Watcher] = set()
        self.pod_removal_delay: float | None = 0.0
        self.on_change: list[Callable[[HistoryEvent], None]] = []
        self._pdb_sync = True
        for rt in make_builtins():
            self.register(rt)
        for name in DEFAULT_NAMESPACES:
            self.create(self.lookup("", "v1", "namespaces"),
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ------------------------------------------------------------------ type registry

    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self.objects.setdefault(rt.key, {})

    def unregister_group_resource(self, group: str, plural: str) -> None:
        for key in [k for k in self.types if k[0] == group and k[2] == plural]:
            del self.types[key]

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise errors.path_not_found()
        return rt

    def find(self, word: str) -> ResourceType:
        """Resolve `nodes`, `Node`, `no`, `nodesets.sunkd.io` (first served version)."""
        for rt in self.types.values():
            if rt.matches_name(word):
                return rt
        raise errors.path_not_found()

    def find_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rt in self.types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise errors.bad_request(f"no kind \"{kind}\" is registered for version "
                                 f"\"{api_version}\"")

    def group_versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for group, version, _ in self.types:
            versions = out.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return out

    # ------------------------------------------------------------------ reads

    def _bucket(self, rt: ResourceType) -> dict[ObjKey, JSON]:
        return self.objects.setdefault(rt.key, {})

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> ObjKey:
        return ((namespace or "") if rt.namespaced else "", name)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._bucket(rt).get(self._key(rt, namespace, name))
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return copy.deepcopy(obj)

    def snapshot(self, rt: ResourceType, at_rv: int | None) -> dict[ObjKey, JSON]:
        """The objects of a type as they were at `at_rv` (rolled back through history)."""
        current = dict(self._bucket(rt))
        if at_rv is None or at_rv >= self.rv:
            return current
        if at_rv < self.floor:
            raise errors.expired(EXPIRED_CONTINUE)
        for event in reversed(self.history):
            if event.rv <= at_rv:
                break
            if event.rt_key != rt.key:
                continue
            meta = event.obj.get("metadata") or {}
            key = (str(meta.get("namespace", "")) if rt.namespaced else "",
                   str(meta.get("name")))
            if event.prev is None:
                current.pop(key, None)
            else:
                current[key] = event.prev
        return current

    def list_objects(self, rt: ResourceType, namespace: str | None = None,
             label_selector: str | None = None, field_selector: str | None = None,
             limit: int | None = None, continue_token: str | None = None,
             resource_version: str | None = None,
             exact: bool = False, copies: bool = True) -> tuple[list[JSON], int, str, int | None]:
        """Returns (items, list RV, continue token, remainingItemCount). `copies=False`
        hands out the stored objects themselves, for a caller that only serializes them
        before it yields (the HTTP list: copying was most of a 100,000-pod LIST's time)."""
        labels = LabelSelector(label_selector)
        fields = FieldSelector(field_selector, set(rt.field_names))
        at_rv: int | None = None
        start_after: list[str] | None = None
        if continue_token:
            try:
                token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                at_rv = int(token["rv"])
                start_after = list(token["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise errors.bad_request(f"continue key is not valid: {exc}") from exc
        elif resource_version not in (None, "", "0"):
            wanted = self.parse_rv(resource_version)
            if wanted > self.rv:
                raise KubeAPIError(504, "Timeout", f"Too large resource version: {wanted}, "
                                   f"current: {self.rv}",
                                   {"causes": [{"reason": "ResourceVersionTooLarge",
                                                "message": "Too large resource version"}],
                                    "retryAfterSeconds": 1})
            if limit or exact:
                at_rv = wanted  # Exact: paged lists, or resourceVersionMatch=Exact
        list_rv = at_rv if at_rv is not None else self.rv
        snap = self.snapshot(rt, at_rv)
        keys = self._keys_at(rt, list_rv, snap)
        first = 0
        if start_after is not None:
            first = bisect.bisect_right(keys, tuple(str(part) for part in start_after))
        selective = bool(labels.requirements or fields.terms)
        matched = []
        position = first
        for position in range(first, len(keys)):
            key = keys[position]
            if namespace and rt.namespaced and key[0] != namespace:
                continue
            obj = snap[key]
            if not labels.matches((obj.get("metadata") or {}).get("labels")):
                continue
            if not fields.matches(rt.fields(obj)):
                continue
            matched.append((key, obj))
            if limit and len(matched) > limit:
                break  # one beyond the page: there is a next page
        token = ""
        remaining: int | None = None
        if limit and len(matched) > limit:
            last_key = matched[limit - 1][0]
            token = base64.urlsafe_b64encode(
                json.dumps({"rv": list_rv, "start": list(last_key)}).encode()).decode()
            if not selective:
                # remainingItemCount: the objects after this page (counted by key alone).
                rest = keys[position:]
                remaining = (sum(1 for k in rest if k[0] == namespace)
                             if namespace and rt.namespaced else len(rest))
            matched = matched[:limit]
        return ([copy_json(o) for _, o in matched] if copies else [o for _, o in matched],
                list_rv, token, remaining)

    def _keys_at(self, rt: ResourceType, rv: int, snap: dict[ObjKey, JSON]) -> list[ObjKey]:
        cached = self._sorted_keys.get((rt.key, rv))
        if cached is None or len(cached) != len(snap):
            cached = sorted(snap)
            self._sorted_keys[(rt.key, rv)] = cached
            while len(self._sorted_keys) > 2:
                del self._sorted_keys[next(iter(self._sorted_keys))]
        return cached

    @staticmethod
    def parse_rv(text: str | None) -> int:
        try:
            return int(text or "0")
        except ValueError as exc:
            raise errors.bad_request(f'invalid resource version "{text}"') from exc

    # ------------------------------------------------------------------ watch plumbing

    def open_watch(self, rt: ResourceType, namespace: str | None, label_selector: str | None,
                   field_selector: str | None, resource_version: str | None,
                   send_initial: bool | None) -> tuple[Watcher, list[tuple[str, JSON]]]:
        """Register a watcher; return the events to send before live ones.

        Unset/"0" RV: synthetic ADDED for current objects. RV=N: history after N, or 410.
        """
        watcher = Watcher(rt, namespace, LabelSelector(label_selector),
                          FieldSelector(field_selector, set(rt.field_names)))
        initial: list[tuple[str, JSON]] = []
        if resource_version in (None, "", "0") or send_initial:
            for _, obj in sorted(self._bucket(rt).items()):
                if watcher._matches(obj):
                    initial.append(("ADDED", copy.deepcopy(obj)))
        else:
            since = self.parse_rv(resource_version)
            if since < self.floor:
                raise errors.expired(f"too old resource version: {since} ({self.floor + 1})")
            for event in self.history:
                if event.rv > since and event.rt_key == rt.key:
                    translated = watcher.translate(event)
                    if translated:
                        initial.append((translated[0], copy.deepcopy(translated[1])))
        self.watchers.add(watcher)
        return watcher, initial

    def close_watch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def compact(self) -> None:
        """Forget all history: older watches and continue tokens now get 410 Expired."""
        self.history.clear()
        self.floor = self.rv

    # ------------------------------------------------------------------ commit

    def _commit(self, rt: ResourceType, key: ObjKey, new: JSON | None, prev: JSON | None,
                kind: str) -> JSON:
        self.rv += 1
        bucket = self._bucket(rt)
        if new is None:
            assert prev is not None
            obj = copy.deepcopy(prev)
            bucket.pop(key, None)
        else:
            obj = new
            bucket[key] = obj
        _meta(obj)["resourceVersion"] = str(self.rv)
        event = HistoryEvent(self.rv, rt.key, kind, copy.deepcopy(obj),
                             copy.deepcopy(prev) if prev is not None else None)
        self.history.append(event)
        while len(self.history) > self.history_size:
            dropped = self.history.popleft()
            self.floor = dropped.rv
        for watcher in list(self.watchers):
            if watcher.rt.key == rt.key:
                watcher.queue.put_nowait(event)
        for hook in self.on_change:
            hook(event)
        self._after_commit(rt, event)
        return copy.deepcopy(obj)

    def _after_commit(self, rt: ResourceType, event: HistoryEvent) -> None:
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            if event.type == "DELETED":
                self._crd_removed(event.obj)
            else:
                self._crd_changed(event.obj)
        if rt.key in ("pods", "poddisruptionbudgets.policy") and self._pdb_sync:
            namespace = str((event.obj.get("metadata") or {}).get("namespace", ""))
            self.sync_pdbs(namespace)

    # ------------------------------------------------------------------ create

    def create(self, rt: ResourceType, body: JSON, namespace: str | None = None, *,
               keep_status: bool = False, dry_run: bool = False,
               strict_fields: bool = False) -> JSON:
        obj = copy.deepcopy(body)
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        meta = _meta(obj)
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise errors.bad_request("the namespace of the provided object does not "
                                         "match the namespace sent on the request")
            namespace = namespace or body_ns or "default"
            meta["namespace"] = namespace
            ns_rt = self.lookup("", "v1", "namespaces")
            if self._bucket(ns_rt).get(("", namespace)) is None:
                raise errors.not_found("namespaces", "", namespace)
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + secrets.token_hex(3)[:5]
        name = str(meta.get("name") or "")
        if not name:
            raise errors.invalid(rt.kind, rt.group, "", [
                ("FieldValueRequired", "metadata.name", "Required value: name or "
                 "generateName is required")])
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        key = self._key(rt, namespace, name)
        if key in self._bucket(rt):
            raise errors.already_exists(rt.plural, rt.group, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                          "managedFields", "selfLink"):
            meta.pop(transient, None)
        if rt.tracks_generation:
            meta["generation"] = 1
        if rt.status_reset_on_create and not keep_status:
            obj.pop("status", None)
        self._prepare(rt, obj, None, strict_fields)
        self._validate(rt, obj)
        if dry_run:
            meta["resourceVersion"] = ""
            return obj
        created = self._commit(rt, key, obj, None, "ADDED")
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            # Stand-in for the apiextensions controllers: names accepted, Established.
            self._write_status(rt, key, self._crd_status(created))
            created = self.get(rt, None, name)
        return created

    # ------------------------------------------------------------------ strategies

    def _prepare(self, rt: ResourceType, obj: JSON, old: JSON | None,
                 strict_fields: bool) -> None:
        """Type-specific defaulting (the registry strategies and defaulters)."""
        meta = _meta(obj)
        if rt.key == "namespaces":
            labels = meta.setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            if old is None:
                obj["status"] = {"phase": "Active"}
        elif rt.key == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("securityContext", {})
            for container in spec.get("containers") or []:
                if isinstance(container, dict):
                    container.setdefault("terminationMessagePath", "/dev/termination-log")
                    container.setdefault("terminationMessagePolicy", "File")
                    container.setdefault("imagePullPolicy", "IfNotPresent")
                    container.setdefault("resources", {})
            if old is None and "status" not in obj:
                obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rt.key == "poddisruptionbudgets.policy" and "status" not in obj:
            obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0,
                             "desiredHealthy": 0, "expectedPods": 0}
        elif rt.key == "events" and old is None:
            obj.setdefault("count", 1)
            obj.setdefault("firstTimestamp", obj.get("lastTimestamp") or now_rfc3339())
            obj.setdefault("lastTimestamp", obj["firstTimestamp"])
            obj.setdefault("reportingComponent", "")
            obj.setdefault("reportingInstance", "")
        elif rt.schema is not None:
            unknown = prune(rt.schema, obj)
            if unknown and strict_fields:
                raise errors.bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    "strict decoding error: " + ", ".join(
                        f'unknown field "{path}"' for path in unknown))
            apply_defaults(rt.schema, obj)

    def _validate(self, rt: ResourceType, obj: JSON) -> None:
        meta = obj["metadata"]
        name = str(meta.get("name", ""))
        causes: list[tuple[str, str, str]] = []
        if rt.key not in ("events",) and not DNS_SUBDOMAIN_RE.match(name):
            causes.append(("FieldValueInvalid", "metadata.name",
                           f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must '
                           f"consist of lower case alphanumeric characters, '-' or '.', and "
                           f"must start and end with an alphanumeric character"))
        if rt.key == "pods" and not (obj.get("spec") or {}).get("containers"):
            causes.append(("FieldValueRequired", "spec.containers", "Required value"))
        if rt.key == "leases.coordination.k8s.io":
            for field_name in ("acquireTime", "renewTime"):
                value = (obj.get("spec") or {}).get(field_name)
                if value is not None and not MICROTIME_RE.match(str(value)):
                    # A real server fails to decode such a body with 400 (k/k#89156).
                    raise errors.bad_request(
                        f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00": '
                        f"cannot parse")
        if rt.key == "events":
            # pkg/apis/core/validation/events.go legacyValidateEvent: an Event about a
            # cluster-scoped object (no involvedObject.namespace) lives in `default` (or,
            # with an eventTime, also kube-system); any other must match its object's.
            inv = obj.get("involvedObject") or {}
            inv_ns = str(inv.get("namespace") or "")
            event_ns = str(meta.get("namespace") or "")
            allowed = ("", "default") if not obj.get("eventTime") else ("default", "kube-system")
            if (inv_ns and inv_ns != event_ns) or (not inv_ns and event_ns not in allowed):
                causes.append(("FieldValueInvalid", "involvedObject.namespace",
                               f'Invalid value: "{inv_ns}": does not match event.namespace'))
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            causes += self._validate_crd(obj)
        if rt.schema is not None:
            causes += validate(rt.schema, obj)
        if causes:
            raise errors.invalid(rt.kind, rt.group, name, causes)

    # ------------------------------------------------------------------ update / patch

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: JSON, *,
               subresource: str | None = None, dry_run: bool = False,
               strict_fields: bool = False, require_rv: bool = True) -> JSON:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        key = self._key(rt, namespace, name)
        old = self._bucket(rt).get(key)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, name)
        body_meta = body.get("metadata") or {}
        if body_meta.get("name") not in (None, name):
            raise errors.bad_request("the name of the object "
                                     f"({body_meta.get('name')}) does not match the name on "
                                     f"the URL ({name})")
        sent_rv = str(body_meta.get("resourceVersion") or "")
        if require_rv:
            if not sent_rv and not rt.unconditional_update:
                raise errors.invalid(rt.kind, rt.group, name, [
                    ("FieldValueInvalid", "metadata.resourceVersion",
                     "Invalid value: 0: must be specified for an update")],
                    qualified_as=errors.qualified(rt.plural, rt.group))
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, rt.group, name)
        new = self._merge_for_update(rt, old, body, subresource)
        self._prepare(rt, new, old, strict_fields)
        self._validate(rt, new)
        if canonical(new) == canonical(old):
            return copy.deepcopy(old)  # no-op: no RV bump, no event
        if dry_run:
            return new
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and int(meta.get("deletionGracePeriodSeconds") or 0) == 0:
            # store.go: the last finalizer removed from a deleting object deletes it.
            return self._commit(rt, key, None, old, "DELETED")
        return self._commit(rt, key, new, old, "MODIFIED")

    def _merge_for_update(self, rt: ResourceType, old: JSON, body: JSON,
                          subresource: str | None) -> JSON:
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
            return new
        new = copy.deepcopy(body)
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        meta = _meta(new)
        old_meta = old["metadata"]
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion",
                      "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if fixed in old_meta:
                meta[fixed] = copy.deepcopy(old_meta[fixed])
            else:
                meta.pop(fixed, None)
        if rt.status_subresource:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        if rt.tracks_generation:
            def spec_part(o: JSON) -> str:
                return canonical({k: v for k, v in o.items()
                                  if k not in ("metadata", "status", "apiVersion", "kind")})
            if spec_part(new) != spec_part(old):
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
        return new

    def patch(self, rt: ResourceType, namespace: str | None, name: str, content_type: str,
              body: Any, *, subresource: str | None = None, dry_run: bool = False,
              strict_fields: bool = False, field_manager: str | None = None,
              force: bool = False) -> tuple[JSON, bool]:
        """Returns (object, created). Creation happens only for server-side apply."""
        content_type = content_type.split(";")[0].strip().lower()
        if content_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(content_type)
        if content_type == STRATEGIC_PATCH and not rt.builtin:
            raise errors.unsupported_media_type(content_type)
        if content_type == APPLY_PATCH:
            if not field_manager:
                raise KubeAPIError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: '
                                   "fieldManager: Required value: is required for apply patch",
                                   {"kind": "PatchOptions", "group": "meta.k8s.io"})
            if not isinstance(body, dict):
                raise errors.bad_request("apply patch body must be an object")
            if self._bucket(rt).get(self._key(rt, namespace, name)) is None:
                if subresource:
                    raise errors.not_found(rt.plural, rt.group, name)
                body = copy.deepcopy(body)
                _meta(body).setdefault("name", name)
                return self.create(rt, body, namespace, dry_run=dry_run,
                                   strict_fields=strict_fields), True
        current = self.get(rt, namespace, name)
        if content_type == MERGE_PATCH or content_type == APPLY_PATCH:
            if not isinstance(body, dict):
                raise errors.bad_request("merge patch body must be a JSON object")
            patched = merge_patch(current, body)
        elif content_type == JSON_PATCH:
            patched = json_patch(current, body)
        else:
            patched = strategic_merge_patch(current, body, rt.merge_keys)
        if not isinstance(patched, dict):
            raise errors.bad_request("patch result is not an object")
        # A resourceVersion in the patched result acts as a precondition (store.go Update).
        meta = _meta(patched)
        patched_rv = meta.get("resourceVersion")
        if patched_rv and str(patched_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(rt, namespace, name, patched, subresource=subresource,
                           dry_run=dry_run, strict_fields=strict_fields), False

    def _write_status(self, rt: ResourceType, key: ObjKey, status: JSON) -> None:
        """Internal status write (controllers), with no-op detection."""
        old = self._bucket(rt).get(key)
        if old is None:
            return
        new = copy.deepcopy(old)
        new["status"] = status
        if canonical(new) != canonical(old):
            self._commit(rt, key, new, old, "MODIFIED")

    # ------------------------------------------------------------------ delete

    def delete(self, rt: ResourceType, namespace: str | None, name: str,
               options: JSON | None = None, *, dry_run: bool = False) -> DeleteResult:
        options = options or {}
        key = self._key(rt, namespace, name)
        old = self._bucket(rt).get(key)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
            raise errors.conflict(rt.plural, rt.group, name,
                                  f"Precondition failed: UID in precondition: {pre['uid']}, "
                                  f"UID in object meta: {old['metadata'].get('uid')}")
        if pre.get("resourceVersion") and \
                pre["resourceVersion"] != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.plural, rt.group, name,
                                  f"Precondition failed: ResourceVersion in precondition: "
                                  f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                  f"{old['metadata'].get('resourceVersion')}")
        if dry_run:
            return DeleteResult(copy.deepcopy(old), True)
        grace = self._grace_period(rt, old, options)
        finalizers = old["metadata"].get("finalizers")
        if grace > 0 or finalizers:
            if not old["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                obj = self._commit(rt, key, new, old, "MODIFIED")
                old = self._bucket(rt)[key]
            else:
                obj = copy.deepcopy(old)
            if finalizers or self.pod_removal_delay is None:
                return DeleteResult(obj, False)
            if self.pod_removal_delay > 0:
                self._schedule_pod_removal(rt, key, obj["metadata"]["uid"])
                return DeleteResult(obj, False)
        if rt.key == "namespaces":
            self._delete_namespace_contents(name)
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            self._delete_crs(old)
        obj = self._commit(rt, key, None, old, "DELETED")
        return DeleteResult(obj, True)

    def _grace_period(self, rt: ResourceType, obj: JSON, options: JSON) -> int:
        if rt.key != "pods":
            return 0
        spec = obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return max(0, int(grace))

    def _schedule_pod_removal(self, rt: ResourceType, key: ObjKey, uid: str) -> None:
        assert self.pod_removal_delay is not None

        def remove() -> None:
            current = self._bucket(rt).get(key)
            if current is not None and current["metadata"].get("uid") == uid:
                self._commit(rt, key, None, current, "DELETED")

        asyncio.get_running_loop().call_later(self.pod_removal_delay, remove)

    def finish_pod_termination(self, namespace: str, name: str) -> bool:
        """Fake kubelet: remove a terminating pod now. Returns whether one was removed."""
        rt = self.lookup("", "v1", "pods")
        key = (namespace, name)
        current = self._bucket(rt).get(key)
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return False
        self._commit(rt, key, None, current, "DELETED")
        return True

    def _delete_namespace_contents(self, namespace: str) -> None:
        # Simplification: the namespace controller's cleanup happens synchronously.
        seen: set[str] = set()
        for rt in list(self.types.values()):
            if not rt.namespaced or rt.key in seen:
                continue
            seen.add(rt.key)
            for key, obj in sorted(self._bucket(rt).items()):
                if key[0] == namespace:
                    self._commit(rt, key, None, obj, "DELETED")

    # ------------------------------------------------------------------ CRDs

    def _validate_crd(self, obj: JSON) -> list[tuple[str, str, str]]:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        causes: list[tuple[str, str, str]] = []
        for path, value in (("spec.group", spec.get("group")),
                            ("spec.names.plural", names.get("plural")),
                            ("spec.names.kind", names.get("kind")),
                            ("spec.scope", spec.get("scope"))):
            if not value:
                causes.append(("FieldValueRequired", path, "Required value"))
        if spec.get("scope") not in (None, "Namespaced", "Cluster"):
            causes.append(("FieldValueNotSupported", "spec.scope",
                           f'Unsupported value: "{spec.get("scope")}": supported values: '
                           f'"Cluster", "Namespaced"'))
        versions = spec.get("versions") or []
        if not versions:
            causes.append(("FieldValueRequired", "spec.versions", "Required value"))
        if sum(1 for v in versions if v.get("storage")) != 1 and versions:
            causes.append(("FieldValueInvalid", "spec.versions",
                           "Invalid value: must have exactly one version marked as storage "
                           "version"))
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if obj["metadata"].get("name") != expected:
            causes.append(("FieldValueInvalid", "metadata.name",
                           f'Invalid value: "{obj["metadata"].get("name")}": must be spec.names'
                           f".plural+\".\"+spec.group"))
        return causes

    def _crd_status(self, obj: JSON) -> JSON:
        spec = obj["spec"]
        now = now_rfc3339()
        accepted = {k: v for k, v in spec["names"].items()}
        accepted.setdefault("singular", str(spec["names"]["kind"]).lower())
        accepted.setdefault("listKind", spec["names"]["kind"] + "List")
        return {
            "acceptedNames": accepted,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
        }

    def _crd_changed(self, obj: JSON) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        group, plural = str(spec.get("group")), str(names.get("plural"))
        self.unregister_group_resource(group, plural)
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            rt = ResourceType(
                group=group, version=str(version["name"]), plural=plural,
                kind=str(names.get("kind")), namespaced=spec.get("scope") == "Namespaced",
                singular=str(names.get("singular") or str(names.get("kind")).lower()),
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                status_subresource="status" in subresources, builtin=False,
                tracks_generation=True, unconditional_update=False,
                status_reset_on_create="status" in subresources,
                columns=[crd_column(c) for c in version.get("additionalPrinterColumns") or []],
                schema=schema if isinstance(schema, dict) else None,
                crd_name=str(obj["metadata"]["name"]),
            )
            self.register(rt)

    def _crd_removed(self, obj: JSON) -> None:
        spec = obj.get("spec") or {}
        self.unregister_group_resource(str(spec.get("group")),
                                       str((spec.get("names") or {}).get("plural")))

    def _delete_crs(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        group, plural = str(spec.get("group")), str((spec.get("names") or {}).get("plural"))
        for rt in list(self.types.values()):
            if rt.group == group and rt.plural == plural:
                for key, obj in sorted(self._bucket(rt).items()):
                    self._commit(rt, key, None, obj, "DELETED")
                break

    # ------------------------------------------------------------------ PDBs and eviction

    @staticmethod
    def pod_ready(pod: JSON) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    def _pdb_pods(self, pdb: JSON) -> list[JSON]:
        selector = (pdb.get("spec") or {}).get("selector")
        if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            return []  # eviction.go: an empty or nil selector matches nothing
        namespace = pdb["metadata"]["namespace"]
        pods = self._bucket(self.lookup("", "v1", "pods"))
        return [p for (ns, _), p in sorted(pods.items()) if ns == namespace
                and label_selector_matches(selector, p["metadata"].get("labels") or {})]

    def sync_pdbs(self, namespace: str) -> None:
        """Stand-in for the disruption controller (pkg/controller/disruption)."""
        pdb_rt = self.lookup("policy", "v1", "poddisruptionbudgets")
        self._pdb_sync = False
        try:
            for key, pdb in sorted(self._bucket(pdb_rt).items()):
                if key[0] == namespace:
                    self._write_status(pdb_rt, key, self._pdb_status(pdb))
        finally:
            self._pdb_sync = True

    def _pdb_status(self, pdb: JSON) -> JSON:
        spec = pdb.get("spec") or {}
        old_status = pdb.get("status") or {}
        # expectedPods counts terminating pods too (disruption.go: every pod the selector
        # matches); they are never healthy (countHealthyPods skips a deletionTimestamp).
        matching = self._pdb_pods(pdb)
        pods = [p for p in matching if not p["metadata"].get("deletionTimestamp")]
        names = {p["metadata"]["name"] for p in pods}
        disrupted = {k: v for k, v in (old_status.get("disruptedPods") or {}).items()
                     if k in names}
        expected = len(matching)
        healthy = sum(1 for p in pods if self.pod_ready(p)
                      and p["metadata"]["name"] not in disrupted)

        def scaled(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return math.ceil(expected * int(value[:-1]) / 100)
            return int(value)

        if spec.get("minAvailable") is not None:
            desired = scaled(spec["minAvailable"])
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - scaled(spec["maxUnavailable"]))
        else:
            desired = expected  # policy/v1 with neither: minAvailable 100%... approximated
        allowed = max(0, healthy - desired)
        old_cond = next((c for c in old_status.get("conditions") or []
                         if c.get("type") == "DisruptionAllowed"), None)
        cond_status = "True" if allowed > 0 else "False"
        condition = {
            "type": "DisruptionAllowed", "status": cond_status,
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
            "message": "",
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "lastTransitionTime": old_cond["lastTransitionTime"]
            if old_cond and old_cond.get("status") == cond_status else now_rfc3339(),
        }
        status: JSON = {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "disruptionsAllowed": allowed, "currentHealthy": healthy,
            "desiredHealthy": desired, "expectedPods": expected,
            "conditions": [condition],
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        return status

    def evict(self, namespace: str, name: str, body: JSON, *, dry_run: bool = False) -> JSON:
        """policy/v1 Eviction, after pkg/registry/core/pod/storage/eviction.go."""
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        pod_rt = self.lookup("", "v1", "pods")
        pod = self.get(pod_rt, namespace, name)
        options = body.get("deleteOptions") or {}
        # A dry run asked in the Eviction's deleteOptions counts as one asked in the query
        # (`propagateDryRun` in pkg/registry/core/pod/storage/eviction.go).
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        success: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Success", "code": 201}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            if not dry_run:
                self.delete(pod_rt, namespace, name, options)
            return success
        pdb_rt = self.lookup("policy", "v1", "poddisruptionbudgets")
        labels = pod["metadata"].get("labels") or {}
        pdbs = []
        for (ns, _), pdb in sorted(self._bucket(pdb_rt).items()):
            selector = (pdb.get("spec") or {}).get("selector")
            if ns != namespace or not selector or not (
                    selector.get("matchLabels") or selector.get("matchExpressions")):
                continue
            if label_selector_matches(selector, labels):
                pdbs.append(pdb)
        if len(pdbs) > 1:
            raise errors.internal_error("This pod has more than one PodDisruptionBudget, which "
                                        "the eviction subresource does not support.")
        if pdbs:
            pdb = pdbs[0]
            status = pdb.get("status") or {}
            pdb_name = pdb["metadata"]["name"]
            unhealthy_ok = not self.pod_ready(pod) and (
                (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                or int(status.get("currentHealthy", 0)) >= int(status.get("desiredHealthy", 0))
                > 0)
            if not unhealthy_ok:
                if int(status.get("observedGeneration", 0)) < int(
                        pdb["metadata"].get("generation", 1)):
                    raise errors.too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        [{"reason": "DisruptionBudget", "message": f"The disruption budget "
                          f"{pdb_name} is still being processed by the server."}],
                        retry_after=10)
                allowed = int(status.get("disruptionsAllowed", 0))
                if allowed < 0:
                    raise errors.forbidden("pdb disruptions allowed is negative")
                if allowed == 0:
                    raise errors.too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        [{"reason": "DisruptionBudget", "message": f"The disruption budget "
                          f"{pdb_name} needs {status.get('desiredHealthy', 0)} healthy pods "
                          f"and has {status.get('currentHealthy', 0)} currently"}])
                if not dry_run:
                    new_status = copy.deepcopy(status)
                    new_status["disruptionsAllowed"] = allowed - 1
                    new_status.setdefault("disruptedPods", {})[name] = now_rfc3339()
                    self._pdb_sync = False
                    try:
                        self._write_status(pdb_rt, (namespace, pdb_name), new_status)
                    finally:
                        self._pdb_sync = True
        if not dry_run:
            self.delete(pod_rt, namespace, name, options)
        return success
