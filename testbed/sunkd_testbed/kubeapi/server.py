"""HTTP side of the Kubernetes API emulator (aiohttp) and its public `KubeAPIEmulator`.

An in-process aiohttp server that reproduces the wire protocol and the semantics sunkd
and kubectl depend on (see `docs/kubernetes.md`, "API emulator"). It is an emulator, not a
Kubernetes API server: no authn/authz, admission, managedFields, protobuf (a protobuf body
is an honest 415), or controllers beyond the few stand-ins documented there. The contract
suite runs against it and against the real kube-apiserver (sunkd_testbed.kubernetes); the
differences found are listed in docs/kubernetes.md, "Emulator vs the real API server".
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import yaml
from aiohttp import web

from . import discovery, errors
from .errors import KubeAPIError
from .resources import JSON, ResourceType
from .store import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Store,
    Watcher,
)
from .tables import build_table

log = logging.getLogger(__name__)

VERSION_INFO: JSON = {
    # kubectl on these machines is gcloud's dispatcher: it picks its binary by `minor`,
    # so this must say 32 to get the built-in kubectl 1.32 (docs/kubernetes.md, "API emulator").
    "major": "1", "minor": "32", "gitVersion": "v1.32.4-sunkd-emulator",
    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
    "buildDate": "2025-04-22T00:00:00Z", "goVersion": "go1.23.6", "compiler": "gc",
    "platform": "linux/amd64",
}
TABLE_CT = "application/json;as=Table;v=v1;g=meta.k8s.io"
# What a create/update body may be: JSON (also when no type is given, as the real server
# assumes) or YAML. Patches have their own types; the store checks those per resource.
BODY_TYPES = frozenset({"", "application/json", "application/yaml"})
PATCH_CONTENT_TYPES = frozenset({MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH, APPLY_PATCH})
# API groups compiled into kube-apiserver (v1.37) that the emulator does not serve: a 404
# under them is still a Status (a group the emulator does serve counts as built in too).
BUILTIN_GROUPS = frozenset({
    "admissionregistration.k8s.io", "apiregistration.k8s.io", "apps", "authentication.k8s.io",
    "authorization.k8s.io", "autoscaling", "batch", "certificates.k8s.io", "discovery.k8s.io",
    "events.k8s.io", "flowcontrol.apiserver.k8s.io", "networking.k8s.io", "node.k8s.io",
    "rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
    "storagemigration.k8s.io", "coordination.k8s.io", "policy", "apiextensions.k8s.io"})
PATCH_ALIASES = {"merge": MERGE_PATCH, "json": JSON_PATCH, "strategic": STRATEGIC_PATCH,
                 "apply": APPLY_PATCH}


def query_bool(value: str | None) -> bool:
    # runtime/conversion.go Convert_Slice_string_To_bool: anything but "0"/"false" is true.
    return value is not None and value.lower() not in ("0", "false")


_ORJSON_OPTIONS = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
                   | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _not_plain_json(obj: Any) -> Any:
    raise TypeError(f"not plain JSON: {type(obj).__name__}")


def dumps(obj: Any) -> bytes:
    """`obj` as compact JSON, decoding to what `json.dumps` would write.

    orjson first: the stdlib encoder was half of the emulator's time serving a
    100,000-Pod LIST (py-spy, bench/scale.py restart), and at scale the benchmarks share
    two cores with it. Whatever orjson would write differently goes to the stdlib: it
    raises on integers beyond 64 bits, non-string keys, lone surrogates and (with the
    passthrough options) datetimes, dataclasses and subclasses; and it writes NaN and
    Infinity as null, so any output with a null is written again by the stdlib."""
    try:
        out = orjson.dumps(obj, default=_not_plain_json, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        out = b"null"
    if b"null" in out:
        return json.dumps(obj, separators=(",", ":")).encode()
    return out


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Fault:
    remaining: int
    status: int
    retry_after: int | None
    method: str | None
    path_contains: str | None


@dataclass(eq=False)  # identity semantics: kept in sets
class _ActiveWatch:
    watcher: Watcher
    request: web.Request


@dataclass
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


class KubeAPIEmulator:
    """A protocol-faithful Kubernetes API emulator for tests, benchmarks and the demo.

    Use as `async with KubeAPIEmulator() as api:` or `await api.start()` / `api.stop()`.
    The in-process helpers (`create`, `get`, `list`, `update`, `patch`, `delete`, `evict`)
    go through the same store as HTTP requests, so they emit the same watch events.
    """

    def __init__(self, *, history_size: int = 1000, bookmark_interval: float = 1.0,
                 default_watch_timeout: float = 1800.0,
                 pod_removal_delay: float | None = 0.0,
                 request_log_size: int = 10_000) -> None:
        self.store = Store(history_size=history_size)
        self.store.pod_removal_delay = pod_removal_delay
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        # Bounded, so a long-running `sunkd sim kubeapi` does not grow without limit.
        self.requests: deque[RecordedRequest] = deque(maxlen=request_log_size)
        self.record_requests = True
        self._faults: builtins.list[_Fault] = []
        self._latency = 0.0
        self._force_410 = 0
        self._watches: set[_ActiveWatch] = set()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._url = f"http://{shown}:{bound}"

    async def stop(self) -> None:
        self.drop_watches(abrupt=False)
        await asyncio.sleep(0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeAPIEmulator:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("emulator not started")
        return self._url

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self.store.rv

    def kubeconfig(self, namespace: str = "default") -> JSON:
        return {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "sunkd-emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "sunkd-emulator", "user": {}}],
            "contexts": [{"name": "sunkd-emulator", "context": {
                "cluster": "sunkd-emulator", "user": "sunkd-emulator",
                "namespace": namespace}}],
            "current-context": "sunkd-emulator",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        return target

    # ------------------------------------------------------------------ in-process helpers

    def resource(self, resource: str, api_version: str | None = None) -> ResourceType:
        if api_version:
            group, _, version = api_version.rpartition("/")
            for rt in self.store.types.values():
                if rt.group == group and rt.version == version and rt.matches_name(resource):
                    return rt
        return self.store.find(resource)

    def create(self, obj: JSON, namespace: str | None = None, *,
               keep_status: bool = True) -> JSON:
        """Create as a privileged in-process writer: by default `.status` is kept, as if
        the kubelet or a controller had written it right after the create."""
        rt = self.store.find_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        return self.store.create(rt, obj, namespace, keep_status=keep_status)

    def get(self, resource: str, name: str, namespace: str | None = None) -> JSON:
        return self.store.get(self.resource(resource), namespace, name)

    def list(self, resource: str, namespace: str | None = None,
             label_selector: str | None = None,
             field_selector: str | None = None) -> builtins.list[JSON]:
        items, _, _, _ = self.store.list_objects(self.resource(resource), namespace, label_selector,
                                         field_selector)
        return items

    def update(self, obj: JSON, *, subresource: str | None = None) -> JSON:
        rt = self.store.find_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        meta = obj.get("metadata") or {}
        return self.store.update(rt, meta.get("namespace"), str(meta.get("name")), obj,
                                 subresource=subresource)

    def patch(self, resource: str, name: str, patch: Any, namespace: str | None = None, *,
              patch_type: str = "merge", subresource: str | None = None) -> JSON:
        content_type = PATCH_ALIASES.get(patch_type, patch_type)
        obj, _ = self.store.patch(self.resource(resource), namespace, name, content_type,
                                  patch, subresource=subresource, field_manager="sunkd-sim")
        return obj

    def delete(self, resource: str, name: str, namespace: str | None = None, *,
               grace_period_seconds: int | None = None) -> JSON:
        options: JSON = {}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        return self.store.delete(self.resource(resource), namespace, name, options).obj

    def evict(self, name: str, namespace: str = "default") -> JSON:
        return self.store.evict(namespace, name, {})

    def finish_pod_termination(self, namespace: str, name: str) -> bool:
        """Fake kubelet: remove a pod left terminating (pod_removal_delay=None)."""
        return self.store.finish_pod_termination(namespace, name)

    @property
    def pod_removal_delay(self) -> float | None:
        """Seconds the fake kubelet takes to remove a gracefully deleted, scheduled pod:
        0 removes it at once, None leaves it terminating until finish_pod_termination."""
        return self.store.pod_removal_delay

    @pod_removal_delay.setter
    def pod_removal_delay(self, value: float | None) -> None:
        self.store.pod_removal_delay = value

    def heartbeat_node(self, name: str) -> JSON:
        """Fake kubelet status write: bumps the node's Ready heartbeat (and its RV)."""
        from .store import now_rfc3339

        node = self.get("nodes", name)
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        stamp = now_rfc3339()
        cond = dict(ready or {"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "message": "kubelet is posting ready status",
                              "lastTransitionTime": stamp})
        cond["lastHeartbeatTime"] = stamp
        cond["message"] = f"kubelet is posting ready status (heartbeat {self.store.rv})"
        return self.patch("nodes", name, {"status": {"conditions": [cond]}},
                          patch_type="strategic", subresource="status")

    # ------------------------------------------------------------------ fault injection

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: int | None = None,
                  method: str | None = None, path_contains: str | None = None) -> None:
        """Make the next `n` resource requests (optionally only those matching `method`
        and `path_contains`) fail with a Status of `status` (e.g. 500, 503, 429, 409)."""
        self._faults.append(_Fault(n, status, retry_after, method.upper() if method else None,
                                   path_contains))

    def set_latency(self, seconds: float) -> None:
        """Delay every request by `seconds` before it is handled."""
        self._latency = max(0.0, seconds)

    def force_410(self, count: int = 1) -> None:
        """The next `count` watches that start from a resourceVersion get 410 Expired
        (HTTP 200 plus an ERROR event), as if their version had been compacted away."""
        self._force_410 += count

    def compact_history(self) -> None:
        """Forget the event history: watches and continue tokens from older resource
        versions now get 410 Expired."""
        self.store.compact()

    def drop_watches(self, abrupt: bool = True) -> int:
        """End every open watch. `abrupt=True` closes the TCP connection mid-stream (the
        client sees a payload error); `False` ends the chunked body cleanly."""
        count = 0
        for active in list(self._watches):
            count += 1
            if abrupt and active.request.transport is not None:
                active.request.transport.close()
            active.watcher.queue.put_nowait(None)
        return count

    def open_watch_count(self) -> int:
        return len(self._watches)

    # ------------------------------------------------------------------ HTTP plumbing

    @staticmethod
    def _json(obj: Any, status: int = 200, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> web.Response:
        hdrs = {"Content-Type": content_type, "Cache-Control": "no-cache, private"}
        hdrs.update(headers or {})
        return web.Response(status=status, body=dumps(obj), headers=hdrs)

    def _error(self, error: KubeAPIError) -> web.Response:
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after else None
        return self._json(error.status(), error.code, headers=headers)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read() if request.can_read_body else b""
        try:
            body: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:  # protobuf (kubectl's typed clients) or garbage
            body = None
        if self.record_requests:
            self.requests.append(RecordedRequest(
                request.method, request.path, dict(request.query),
                request.headers.get("Content-Type", ""),
                body if body is not None else raw.decode("utf-8", "replace"),
                {k: v for k, v in request.headers.items()}))
        if self._latency:
            await asyncio.sleep(self._latency)
        try:
            return await self._dispatch(request, body)
        except KubeAPIError as error:
            if error.code == 404 and self._outside_builtin_groups(request.path):
                # Past the built-in groups the real server's last handler is Go's mux: a
                # plain-text 404, not a Status (an absent CRD's path, an unknown group).
                return web.Response(status=404, text="404 page not found\n",
                                    headers={"X-Content-Type-Options": "nosniff"})
            return self._error(error)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug in the emulator: answer like the apiserver would
            log.exception("emulator error on %s %s", request.method, request.path)
            return self._error(errors.internal_error(f"emulator error: {exc!r}"))

    def _outside_builtin_groups(self, path: str) -> bool:
        """Does a 404 on `path` come from past kube-apiserver's built-in API groups (the
        CRD handler's and the aggregator's not-found: Go's plain-text mux 404)? Only
        "the server could not find the requested resource" routes count; a missing object
        in a served resource is a Status on every server."""
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] in ("api", "openapi"):
            return False
        if parts[0] != "apis":
            return parts[0] not in ("version", "healthz", "livez", "readyz")
        if len(parts) < 2:
            return False
        builtin = {t.group for t in self.store.types.values() if t.builtin}
        if parts[1] in builtin | BUILTIN_GROUPS:
            return False
        served = self.store.group_versions().get(parts[1]) or []
        # A served custom resource's missing object: a Status like any other.
        if len(parts) >= 4 and parts[2] in served:
            rest = parts[3:]
            if len(rest) >= 3 and rest[0] == "namespaces":
                rest = rest[2:]
            return not rest or (parts[1], parts[2], rest[0]) not in self.store.types
        return True

    def _take_fault(self, request: web.Request) -> KubeAPIError | None:
        for fault in self._faults:
            if fault.remaining <= 0:
                continue
            if fault.method and fault.method != request.method:
                continue
            if fault.path_contains and fault.path_contains not in request.path_qs:
                continue
            fault.remaining -= 1
            self._faults = [f for f in self._faults if f.remaining > 0]
            error = errors.from_injected(fault.status)
            error.retry_after = fault.retry_after
            return error
        return None

    async def _dispatch(self, request: web.Request, body: str | None) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        accept = request.headers.get("Accept", "")
        types = list(self.store.types.values())
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return self._json(VERSION_INFO)
        if parts[:1] == ["openapi"]:
            return self._openapi(parts, types)
        wants_aggregated = "as=APIGroupDiscoveryList" in accept
        if path == "/api":
            if wants_aggregated:
                return self._json(discovery.aggregated(types, core=True),
                                  content_type=discovery.AGGREGATED_CT)
            return self._json(discovery.api_versions())
        if path == "/apis":
            if wants_aggregated:
                return self._json(discovery.aggregated(types, core=False),
                                  content_type=discovery.AGGREGATED_CT)
            return self._json(discovery.api_group_list(types))
        if path == "/api/v1":
            return self._json(discovery.api_resource_list(
                "v1", [t for t in types if t.group == "" and t.version == "v1"]))
        if len(parts) == 2 and parts[0] == "apis":
            versions = self.store.group_versions().get(parts[1])
            if not versions:
                raise errors.path_not_found()
            return self._json(discovery.api_group(parts[1], versions))
        if len(parts) == 3 and parts[0] == "apis":
            gv_types = [t for t in types if t.group == parts[1] and t.version == parts[2]]
            if not gv_types:
                raise errors.path_not_found()
            return self._json(discovery.api_resource_list(f"{parts[1]}/{parts[2]}", gv_types))
        route = self._route(parts)
        fault = self._take_fault(request)
        if fault is not None:
            raise fault
        return await self._resource(request, route, body, accept)

    def _openapi(self, parts: builtins.list[str],
                 types: builtins.list[ResourceType]) -> web.Response:
        if parts[:2] != ["openapi", "v3"]:
            raise errors.path_not_found()
        docs = discovery.openapi_docs(types)
        if len(parts) == 2:
            return self._json(discovery.openapi_index(docs))
        doc = docs.get("/".join(parts[2:]))
        if doc is None:
            raise errors.path_not_found()
        return self._json(doc)

    def _route(self, parts: builtins.list[str]) -> _Route:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.path_not_found()
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and \
                (group, version, rest[2]) in self.store.types:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise errors.path_not_found()
        rt = self.store.types.get((group, version, rest[0]))
        if rt is None:
            raise errors.path_not_found()
        if namespace is not None and not rt.namespaced:
            raise errors.path_not_found()
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and not ((sub == "status" and rt.status_subresource)
                                    or sub in rt.extra_subresources):
            raise errors.path_not_found()
        return _Route(rt, namespace, name, sub)

    @staticmethod
    def _parse_body(request: web.Request, body: str | None) -> Any:
        content_type = request.headers.get("Content-Type", "")
        media = content_type.split(";")[0].strip().lower()
        if body is None or (media not in BODY_TYPES and media not in PATCH_CONTENT_TYPES):
            # The real server decodes protobuf for built-in types (kubectl's typed clients
            # send it: `kubectl create namespace`); the emulator cannot, and says so with
            # the status a server gives for a body format it does not accept.
            raise errors.unsupported_body(media or "no Content-Type")
        if not body.strip():
            return {}
        try:
            if "yaml" in content_type and "apply-patch" not in content_type:
                return yaml.safe_load(body)
            return json.loads(body)
        except (ValueError, yaml.YAMLError) as exc:
            if "apply-patch" in content_type:
                try:
                    return yaml.safe_load(body)
                except yaml.YAMLError:
                    pass
            raise errors.bad_request(f"the body of the request could not be decoded: "
                                     f"{exc}") from exc

    def _output(self, rt: ResourceType, obj: JSON) -> JSON:
        # Custom resources are stored once for all versions; present the requested one.
        if obj.get("apiVersion") != rt.api_version:
            obj = dict(obj)
            obj["apiVersion"] = rt.api_version
        return obj

    def _render(self, request: web.Request, rt: ResourceType, obj: JSON,
                status: int = 200) -> web.Response:
        if "as=Table" in request.headers.get("Accept", ""):
            table = build_table(rt, [obj], str(obj["metadata"].get("resourceVersion", "")),
                                request.query.get("includeObject", "Metadata"))
            return self._json(table, status, TABLE_CT)
        return self._json(self._output(rt, obj), status)

    async def _resource(self, request: web.Request, route: _Route, body: str | None,
                        accept: str) -> web.StreamResponse:
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.subresource
        q = request.query
        method = request.method
        dry_run = q.get("dryRun") == "All"
        strict = q.get("fieldValidation", "").lower() == "strict"
        if name is None:
            if method == "GET":
                if query_bool(q.get("watch")):
                    return await self._watch(request, rt, ns, accept)
                return self._list(request, rt, ns, accept)
            if method == "POST":
                obj = self._parse_body(request, body)
                created = self.store.create(rt, obj, ns, dry_run=dry_run, strict_fields=strict)
                return self._render(request, rt, created, 201)
            if method == "DELETE":
                items, _, _, _ = self.store.list_objects(rt, ns, q.get("labelSelector"),
                                                 q.get("fieldSelector"))
                options = self._parse_body(request, body)
                deleted = [self.store.delete(rt, ns, i["metadata"]["name"], options,
                                             dry_run=dry_run).obj for i in items]
                return self._json({"kind": rt.list_kind, "apiVersion": rt.api_version,
                                   "metadata": {"resourceVersion": str(self.store.rv)},
                                   "items": [self._output(rt, o) for o in deleted]})
            raise errors.method_not_allowed(method)
        if sub == "eviction":
            if method != "POST":
                raise errors.method_not_allowed(method)
            assert ns is not None
            outcome = self.store.evict(ns, name, self._parse_body(request, body) or {},
                                       dry_run=dry_run)
            return self._json(outcome, 201)
        if method == "GET":
            return self._render(request, rt, self.store.get(rt, ns, name))
        if method == "PUT":
            obj = self._parse_body(request, body)
            updated = self.store.update(rt, ns, name, obj, subresource=sub, dry_run=dry_run,
                                        strict_fields=strict)
            return self._render(request, rt, updated)
        if method == "PATCH":
            patch = self._parse_body(request, body)
            patched, was_created = self.store.patch(
                rt, ns, name, request.headers.get("Content-Type", ""), patch, subresource=sub,
                dry_run=dry_run, strict_fields=strict, field_manager=q.get("fieldManager"),
                force=query_bool(q.get("force")))
            return self._render(request, rt, patched, 201 if was_created else 200)
        if method == "DELETE" and sub is None:
            options = self._parse_body(request, body) or {}
            if "gracePeriodSeconds" in q:
                options["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
            deletion = self.store.delete(rt, ns, name, options, dry_run=dry_run)
            return self._render(request, rt, deletion.obj)
        raise errors.method_not_allowed(method)

    def _list(self, request: web.Request, rt: ResourceType, ns: str | None,
              accept: str) -> web.Response:
        q = request.query
        limit = int(q["limit"]) if q.get("limit", "").isdigit() and int(q["limit"]) > 0 else None
        items, list_rv, token, remaining = self.store.list_objects(
            rt, ns, q.get("labelSelector"), q.get("fieldSelector"), limit, q.get("continue"),
            q.get("resourceVersion"), exact=q.get("resourceVersionMatch") == "Exact",
            copies="as=Table" in accept)  # serialized below, before anything can change them
        items = [self._output(rt, o) for o in items]
        if "as=Table" in accept:
            return self._json(build_table(rt, items, str(list_rv),
                                          q.get("includeObject", "Metadata"), token),
                              content_type=TABLE_CT)
        meta: JSON = {"resourceVersion": str(list_rv)}
        if token:
            meta["continue"] = token
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        return self._json({"kind": rt.list_kind, "apiVersion": rt.api_version,
                           "metadata": meta, "items": items})

    # ------------------------------------------------------------------ watch

    async def _watch(self, request: web.Request, rt: ResourceType, ns: str | None,
                     accept: str) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion")
        bookmarks = query_bool(q.get("allowWatchBookmarks"))
        send_initial = query_bool(q.get("sendInitialEvents")) if "sendInitialEvents" in q \
            else None
        table = "as=Table" in accept
        include = q.get("includeObject", "Metadata")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds", "").isdigit() and \
            int(q["timeoutSeconds"]) > 0 else self.default_watch_timeout
        response = web.StreamResponse(status=200, headers={
            "Content-Type": TABLE_CT if table else "application/json",
            "Cache-Control": "no-cache, private"})
        response.enable_chunked_encoding()
        headers_sent = False

        async def send(kind: str, obj: JSON) -> None:
            nonlocal headers_sent
            if table and kind != "BOOKMARK" and kind != "ERROR":
                obj = build_table(rt, [obj], str(obj["metadata"].get("resourceVersion", "")),
                                  include, headers=not headers_sent)
                headers_sent = True
            elif kind not in ("BOOKMARK", "ERROR"):
                obj = self._output(rt, obj)
            await response.write(dumps({"type": kind, "object": obj}) + b"\n")

        try:
            if self._force_410 and rv not in (None, "", "0"):
                self._force_410 -= 1
                raise errors.expired(f"too old resource version: {rv} ({self.store.rv})")
            watcher, initial = self.store.open_watch(rt, ns, q.get("labelSelector"),
                                                     q.get("fieldSelector"), rv, send_initial)
        except KubeAPIError as error:
            if error.code != 410:
                raise
            # cacher.go: after the request is accepted, errors arrive as an ERROR event.
            await response.prepare(request)
            await send("ERROR", error.status())
            await response.write_eof()
            return response
        active = _ActiveWatch(watcher, request)
        self._watches.add(active)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await response.prepare(request)
            for kind, obj in initial:
                await send(kind, obj)
            if send_initial and bookmarks:
                await send("BOOKMARK", self._bookmark(rt, initial_end=True))
            next_bookmark = loop.time() + self.bookmark_interval
            last_bookmark = 0.0
            final_bookmark = bookmarks
            while True:
                now = loop.time()
                if now >= deadline:
                    # Events still queued are not flushed: the client resumes from the
                    # last version it saw. A bookmark would then skip them, so none.
                    final_bookmark = final_bookmark and watcher.queue.empty()
                    break
                if not watcher.queue.empty():
                    # Queued events go out before any bookmark: a bookmark must never
                    # carry a version newer than an event not yet sent.
                    event = watcher.queue.get_nowait()
                elif bookmarks and now >= next_bookmark:
                    await send("BOOKMARK", self._bookmark(rt))
                    last_bookmark = now
                    next_bookmark = now + self.bookmark_interval
                    continue
                else:
                    wait = deadline - now
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    try:
                        event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                    except TimeoutError:
                        continue
                if event is None:  # dropped by fault injection or shutdown
                    final_bookmark = False
                    break
                translated = watcher.translate(event)
                if translated is not None:
                    await send(translated[0], translated[1])
            # cache_watcher.go also bookmarks right before the deadline, so a client can
            # resume from the latest version after the server closes the stream.
            if final_bookmark and loop.time() - last_bookmark > self.bookmark_interval / 2:
                await send("BOOKMARK", self._bookmark(rt))
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.close_watch(watcher)
            self._watches.discard(active)
        return response

    def _bookmark(self, rt: ResourceType, initial_end: bool = False) -> JSON:
        meta: JSON = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    # ------------------------------------------------------------------ loading


def load_manifests(api: KubeAPIEmulator, paths: list[Path]) -> list[JSON]:
    """Create every object in the YAML files (CRDs first), like `kubectl create -f`."""
    docs: list[JSON] = []
    for path in paths:
        files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "List":
                    docs.extend(i for i in doc.get("items") or [] if isinstance(i, dict))
                elif isinstance(doc, dict):
                    docs.append(doc)
    docs.sort(key=lambda d: 0 if d.get("kind") == "CustomResourceDefinition" else
              1 if d.get("kind") == "Namespace" else 2)
    return [api.create(doc, keep_status=True) for doc in docs]


@contextlib.asynccontextmanager
async def running_emulator(**kwargs: Any) -> AsyncIterator[KubeAPIEmulator]:
    """`async with running_emulator() as api:` — started on a free port, stopped after."""
    api = KubeAPIEmulator(**kwargs)
    await api.start()
    try:
        yield api
    finally:
        await api.stop()
