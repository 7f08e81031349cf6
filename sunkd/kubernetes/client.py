"""Kubernetes API access for sunkd: configuration, bounded requests, and a list-then-watch loop.

Why not kubernetes-asyncio's typed APIs and `Watch` as they are (docs/kubernetes.md, "Watch loop"):
- `Watch` never re-lists on 410 Gone (it retries once with the same stale resourceVersion and
  raises), lets `ClientPayloadError` from a dropped stream escape, and without a client-side
  timeout hangs forever on a half-open connection. A watch loop that silently stops is the
  worst failure a controller can have: it keeps acting on a frozen view of the cluster.
- Typed model deserialisation of 50k pods costs seconds per relist; we only need a few fields.
- Custom-object PATCH with a dict body goes out as `application/json-patch+json` unless the
  content type is forced.

So this module issues requests itself on one aiohttp session, parsing JSON into plain dicts;
where the server is and how to authenticate (kubeconfig, exec plugins, the pod's service
account, TLS) comes from kubernetes-asyncio's loaders, through `kubeconfig.py`.

`ListWatch` (`listwatch.py`) is a small informer: list (paged, one consistent snapshot),
then watch from the list's
resourceVersion with bookmarks, resume from the last seen resourceVersion after a disconnect,
re-list on 410 Expired and diff the new list against its cache so objects deleted while we were
not watching come out as DELETED; every request is bounded both server-side (`timeoutSeconds`)
and client-side (aiohttp timeouts), and retries back off exponentially with full jitter.

Why one long module: every request sunkd makes goes through `KubeClient.request` and its
error mapping; the verbs (get, list, watch, patches, create, delete) are thin wrappers that
belong beside it. The informer is in `listwatch.py`; what is read of the objects (times,
quantities, checked identities, the JSON decoder) in `wire.py`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp
import structlog
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.http_exceptions import LineTooLong
from yarl import URL

from sunkd.domain import wellknown as wk
from sunkd.kubernetes.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    Credentials,
    Endpoint,
    find_kubeconfig,
    load_kubeconfig,
)
from sunkd.kubernetes.kubeconfig import in_cluster as in_cluster_endpoint
from sunkd.kubernetes.wire import gc_paused, loads

log = structlog.get_logger("sunkd.kube")

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


# --------------------------------------------------------------------------- resources


@dataclass(frozen=True, slots=True)
class ResourceType:
    """Where a kind lives in the REST layout (`/api/v1/...` or `/apis/<g>/<v>/...`)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        if self.namespaced and namespace:
            return f"{self.prefix}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{self.prefix}/{self.plural}"

    def object_path(
        self, name: str, namespace: str | None = None, subresource: str | None = None
    ) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self.plural} are namespaced: a namespace is required")
        path = f"{self.collection_path(namespace)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


NODES = ResourceType("", "v1", "nodes", "Node", namespaced=False)
PODS = ResourceType("", "v1", "pods", "Pod", namespaced=True)
EVENTS = ResourceType("", "v1", "events", "Event", namespaced=True)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
PDBS = ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)

NODESET_VERSION = "v1alpha1"


def nodesets(group: str = wk.GROUP, version: str = NODESET_VERSION) -> ResourceType:
    return ResourceType(group, version, "nodesets", "Nodeset", namespaced=True)


NODESETS = nodesets()


# ----------------------------------------------------------------------------- errors


class KubeApiError(Exception):
    """A non-2xx answer from the API server, with the Status body decoded.

    `reason` is the machine-readable Status reason (NotFound, Conflict, Expired,
    TooManyRequests, ...), not the HTTP reason phrase (k8s.io/apimachinery/pkg/apis/meta/v1
    types.go, StatusReason).
    """

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: Mapping[str, Any] = body or {}
        self.retry_after = retry_after

    @property
    def causes(self) -> list[Mapping[str, Any]]:
        details = self.body.get("details") or {}
        causes = details.get("causes") or []
        return [c for c in causes if isinstance(c, Mapping)]

    @property
    def retryable(self) -> bool:
        """Transient: server trouble, throttling, conflicts, timeouts."""
        return self.status in (409, 429, 500, 502, 503, 504) or self.status == 0

    @classmethod
    def from_body(cls, status: int, text: str, headers: Mapping[str, str]) -> KubeApiError:
        body: Mapping[str, Any] = {}
        with contextlib.suppress(ValueError):
            decoded = json.loads(text) if text else {}
            if isinstance(decoded, dict):
                body = decoded
        retry_after: float | None = None
        with contextlib.suppress(TypeError, ValueError):
            header = headers.get("Retry-After")
            if header is not None:
                retry_after = float(header)
        return cls(
            status,
            str(body.get("reason") or ""),
            str(body.get("message") or text[:200]),
            body,
            retry_after,
        )


Item = TypeVar("Item")


def _identity(item: Any) -> Any:
    return item


# ----------------------------------------------------------------------------- client


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Client-side bounds. Without them a request on a half-open TCP connection never returns
    (kubernetes-client/python#1148, #1402)."""

    connect: float = 10.0
    request: float = 30.0  # total, for ordinary requests
    list_page: float = 60.0  # total, per list page


# Parallel connections to the API server (kubernetes-asyncio's pool default was 100; sunkd
# has a few watches and at most max_concurrent_actions requests in flight).
CONNECTION_LIMIT = 100
# aiohttp's read buffer: a watch line may be one object of up to etcd's ~1.5 MiB.
READ_BUFFER_BYTES = 2**21


def env_proxy(server: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy HTTPS_PROXY / HTTP_PROXY / NO_PROXY name for `server`, read once per
    client: client-go uses Go's `http.ProxyFromEnvironment`, which also reads the
    environment once. The lookup is aiohttp's own (what `trust_env` does per request)."""
    try:
        return get_env_proxy_for_url(URL(server))
    except LookupError:  # no proxy for this scheme, or NO_PROXY names the host
        return None, None


class KubeClient:
    """Thin JSON layer over one aiohttp session; the endpoint (server, TLS, credentials)
    comes from kubeconfig.py."""

    def __init__(self, endpoint: Endpoint, *, timeouts: Timeouts | None = None) -> None:
        self.endpoint = endpoint
        self.timeouts = timeouts or Timeouts()
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None

    def _client_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that uses it.
        if self._session is None:
            self._proxy, self._proxy_auth = self.endpoint.proxy, None
            if self._proxy is None:
                self._proxy, self._proxy_auth = env_proxy(self.endpoint.server)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=CONNECTION_LIMIT,
                    ssl=self.endpoint.ssl_context if self.endpoint.ssl_context else True),
                # Not trust_env: it looks the proxy up in the environment and reads
                # ~/.netrc again for every request, in the executor's threads (at 10,000
                # nodes ~5 % of the daemon's samples, contending with decide for the
                # threads and the GIL). The proxy is looked up once, above.
                read_bufsize=READ_BUFFER_BYTES,
            )
        return self._session

    # -- construction --------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        in_cluster: bool | None = None,
        timeouts: Timeouts | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> KubeClient:
        """Build a client from a kubeconfig file or the pod's service account.

        `in_cluster=None` picks in-cluster when no kubeconfig is given, `$KUBECONFIG` is unset
        and `KUBERNETES_SERVICE_HOST` is set (what client-go's default loading rules do).
        Raises `KubeConfigError` (or `KubeConfigNotFound`) saying what to fix.
        """
        if in_cluster is None:
            in_cluster = (
                kubeconfig is None
                and not os.environ.get("KUBECONFIG")
                and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            )
        if not in_cluster:
            kubeconfig = find_kubeconfig(kubeconfig)
        if in_cluster:
            endpoint = await in_cluster_endpoint(service_account_dir)
        else:
            assert kubeconfig is not None
            endpoint = await load_kubeconfig(kubeconfig, context)
        return cls(endpoint, timeouts=timeouts)

    @classmethod
    def for_url(
        cls, url: str, *, token: str | None = None, timeouts: Timeouts | None = None
    ) -> KubeClient:
        """A client for a plain URL (tests, the emulator, `kubectl proxy`)."""
        return cls(Endpoint(url.rstrip("/"), credentials=Credentials(
                       bearer=token or None, source="token" if token else "none")),
                   timeouts=timeouts)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def host(self) -> str:
        return self.endpoint.server

    # -- raw requests --------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        bound: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        endpoint = self.endpoint
        url = endpoint.server + path
        if query:
            url += "?" + urlencode(list(query))
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body)
        credentials = endpoint.credentials

        async def send() -> aiohttp.ClientResponse:
            headers = {"Accept": "application/json", "Content-Type": content_type,
                       **await credentials.authorization()}
            return await self._client_session().request(
                method, url, headers=headers, data=data, timeout=bound,
                proxy=self._proxy, proxy_auth=self._proxy_auth,
                server_hostname=endpoint.server_hostname,
                # per request: an exec plugin may rotate the client certificate
                ssl=endpoint.ssl_context or True)

        response = await send()
        if response.status == 401 and credentials.refreshable:
            # An expired token: read the file or run the plugin again, once (client-go
            # does the same for exec credentials).
            response.release()
            credentials.expire()
            response = await send()
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        total_timeout: float | None = None,
    ) -> Any:
        """One bounded request; returns the decoded JSON body, raises `KubeApiError`."""
        bound = aiohttp.ClientTimeout(
            total=total_timeout or self.timeouts.request,
            connect=self.timeouts.connect,
            sock_connect=self.timeouts.connect,
        )
        response = await self._send(
            method, path, query=query, body=body, content_type=content_type, bound=bound
        )
        async with response:
            raw = await response.read()
            if not 200 <= response.status <= 299:
                raise KubeApiError.from_body(
                    response.status, raw.decode("utf-8", "replace"), response.headers
                )
        return loads(raw) if raw else None

    # -- typed helpers ------------------------------------------------------------

    async def get(
        self,
        rt: ResourceType,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        result = await self.request("GET", rt.object_path(name, namespace, subresource))
        assert isinstance(result, dict)
        return result

    async def create(
        self,
        rt: ResourceType,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        name: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """POST to the collection, or to `<name>/<subresource>` (e.g. pods/eviction)."""
        path = (
            rt.object_path(name, namespace, subresource)
            if name is not None and subresource
            else rt.collection_path(namespace)
        )
        result = await self.request("POST", path, body=dict(body))
        return result if isinstance(result, dict) else {}

    async def replace(
        self,
        rt: ResourceType,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """PUT; the body's metadata.resourceVersion is the optimistic-concurrency precondition."""
        result = await self.request(
            "PUT", rt.object_path(name, namespace, subresource), body=dict(body)
        )
        assert isinstance(result, dict)
        return result

    async def merge_patch(
        self,
        rt: ResourceType,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """RFC 7386 merge patch, content type forced (kubernetes-asyncio would otherwise send a
        dict as json-patch for custom objects, which a real server rejects with 400).
        A `metadata.resourceVersion` inside the patch makes it conditional (409 when stale)."""
        result = await self.request(
            "PATCH",
            rt.object_path(name, namespace, subresource),
            body=dict(patch),
            content_type=MERGE_PATCH,
        )
        assert isinstance(result, dict)
        return result

    async def delete(
        self,
        rt: ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> Any:
        """DELETE; `uid` is a precondition (409 when the object was replaced since)."""
        body: dict[str, Any] | None = None
        if grace_period_seconds is not None or uid:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if grace_period_seconds is not None:
                body["gracePeriodSeconds"] = grace_period_seconds
            if uid:
                body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", rt.object_path(name, namespace), body=body)

    async def list(
        self,
        rt: ResourceType,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[JSON], str]:
        """All items of a collection and the list's resourceVersion, paging with `continue`.

        Every page of one list carries the same resourceVersion (a consistent snapshot); an
        expired continue token is 410 and the caller must start over (Kubernetes API concepts,
        "Retrieving large results sets in chunks").
        """
        return await self.list_mapped(
            rt, _identity, namespace=namespace, label_selector=label_selector,
            field_selector=field_selector, page_size=page_size)

    async def list_mapped(
        self,
        rt: ResourceType,
        each: Callable[[Any], Item],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[builtins.list[Item], str]:
        """`list`, with `each` applied to every item as its page arrives: only one page of
        raw objects is alive at a time, however long the list (the items may be anything,
        `each` checks them), and the next page is asked for before this one is mapped, so
        the server builds it while `each` runs (at 100,000 pods both take seconds)."""
        items: builtins.list[Item] = []
        list_rv = ""
        bound = aiohttp.ClientTimeout(
            total=self.timeouts.list_page,
            connect=self.timeouts.connect,
            sock_connect=self.timeouts.connect,
        )

        async def fetch(token: str | None) -> bytes:
            query: list[tuple[str, str]] = [("limit", str(page_size))]
            if token:
                query.append(("continue", token))
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            response = await self._send(
                "GET", rt.collection_path(namespace), query=query, bound=bound
            )
            async with response:
                raw = await response.read()
                if response.status != 200:
                    raise KubeApiError.from_body(
                        response.status, raw.decode("utf-8", "replace"), response.headers
                    )
            return raw

        pending: asyncio.Task[bytes] = asyncio.create_task(fetch(None))
        try:
            while True:
                raw = await pending
                # Decoded and mapped with the collector paused: a page's tree (~40
                # objects a Pod) lives for milliseconds, but a young collection meanwhile
                # (the mapping allocates too) would promote it to the oldest generation,
                # and 200 promoted pages made a 100,000-Pod relist run ~20 full collections
                # of the whole heap (docs/performance.md, "Scale"). The one await inside
                # is a single turn of the loop, for the next page's request to go out
                # before this one is mapped.
                with gc_paused():
                    page = loads(raw)
                    del raw
                    if not isinstance(page, dict):
                        raise ValueError(f"list answer is not an object: {str(page)[:100]!r}")
                    page_items = page.get("items") or []
                    if not isinstance(page_items, list):
                        raise ValueError("list answer: items is not a list")
                    meta = page.get("metadata")
                    meta = meta if isinstance(meta, dict) else {}
                    if not list_rv:
                        list_rv = str(meta.get("resourceVersion") or "")
                    token = meta.get("continue") or None
                    del page
                    if token:
                        pending = asyncio.create_task(fetch(str(token)))
                        await asyncio.sleep(0)
                    items.extend(map(each, page_items))
                    del page_items
                if not token:
                    return items, list_rv
        finally:
            # The page asked for ahead is not wanted when mapping failed or we are cancelled
            # (cancel is a no-op on a finished task; its error, if any, was seen or is moot).
            pending.cancel()
            if pending.done() and not pending.cancelled():
                pending.exception()

    @contextlib.asynccontextmanager
    async def watch(
        self,
        rt: ResourceType,
        *,
        resource_version: str,
        timeout_seconds: int,
        idle_timeout: float,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncIterator[AsyncIterator[JSON]]:
        """Open a watch from `resource_version`; yields an iterator of decoded watch events.

        Bounded twice: the server closes after `timeoutSeconds`, and the client gives up when
        no byte arrives for `idle_timeout` (must exceed the ~60 s bookmark period of a real
        server) or the whole stream outlives `timeoutSeconds` by a margin.
        """
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        bound = aiohttp.ClientTimeout(
            total=timeout_seconds + max(idle_timeout, 10.0),
            connect=self.timeouts.connect,
            sock_connect=self.timeouts.connect,
            sock_read=idle_timeout,
        )
        response = await self._send("GET", rt.collection_path(namespace), query=query, bound=bound)
        async with response:
            if response.status != 200:
                # An HTTP-level error (e.g. 410 for an unparsable RV, 403, 500) instead of an
                # in-stream ERROR event (API concepts, "Efficient detection of changes").
                raw = await response.read()
                raise KubeApiError.from_body(
                    response.status, raw.decode("utf-8", "replace"), response.headers
                )
            yield _watch_lines(response)


# The longest watch line (one event) read before giving up on the stream. A real API server
# never sends one this long (etcd limits an object to ~1.5 MiB); kubernetes-asyncio's read
# buffer made it the effective limit already, but as an uncaught LineTooLong.
MAX_WATCH_LINE_BYTES = 4 * 1024 * 1024


class WatchLineTooLong(ValueError):
    """A watch event longer than `MAX_WATCH_LINE_BYTES`: the stream cannot be resumed past
    it (the rest of the line is unread), so the caller must list again."""


def _readline_takes_a_limit(content: Any) -> bool:
    try:
        return "max_line_length" in inspect.signature(content.readline).parameters
    except (TypeError, ValueError):
        return False


async def _watch_lines(response: aiohttp.ClientResponse,
                       max_line_bytes: int = MAX_WATCH_LINE_BYTES) -> AsyncIterator[JSON]:
    content = response.content
    limited = _readline_takes_a_limit(content)
    while True:
        try:
            if limited:
                line = await content.readline(max_line_length=max_line_bytes)
            else:  # aiohttp < 3.12: bounded by the read buffer's high-water mark
                line = await content.readline()
        except (LineTooLong, ValueError) as error:
            if isinstance(error, ValueError) and "too big" not in str(error).lower():
                raise
            raise WatchLineTooLong(
                f"a watch event longer than {max_line_bytes} bytes: {error}") from None
        if not line:
            return  # the server ended the chunked body: normal at timeoutSeconds
        line = line.strip()
        if not line:
            continue
        event = loads(line)
        if not isinstance(event, dict):
            raise ValueError(f"watch event is not an object: {line[:100]!r}")
        yield event
