"""sunkd's HTTP surface: metrics, health, the read API, the status page, the extender.

One aiohttp application serves everything an operator, Prometheus, the kubelet probes
and kube-scheduler need from a running daemon (docs/architecture.md). It only
*reads*: the live `ClusterState` through `DaemonView`, and the SQL read models
(`EventLog.read_models`) for history. Nothing here appends to the log.

The daemon (and the demo) implement `DaemonView`; keep it small.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import math
import ssl
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from sunkd.api.extender import ApiPool, BadRequest, Extender, TooLarge
from sunkd.api.hooks import HookEndpoint
from sunkd.api.metrics import CONTENT_TYPE, NO_POOL, Metrics
from sunkd.domain.events import Label
from sunkd.domain.ownership import assess, observed
from sunkd.domain.policy import PoolSpec, effective_pools, membership, unpooled_marks
from sunkd.domain.state import ClusterState, NodeState
from sunkd.runtime.config import PoolSettings, pool_spec
from sunkd.store.eventlog import EventLog

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024  # extender requests carry node lists: bounded
DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
MAX_OFFSET = 2**62  # beyond what any table holds; SQL integers end at 2**63 - 1
VIEW_KEY = web.AppKey("sunkd_view", object)
EXTENDER_KEY = web.AppKey("sunkd_extender", Extender)
WORKER_KEY = web.AppKey("sunkd_extender_worker", ThreadPoolExecutor)
SLOTS_KEY = web.AppKey("sunkd_extender_slots", asyncio.Semaphore)

# Every route is reachable without authentication, so the HTTP server bounds
# what one client can hold: an idle or slowly-sending connection is closed after
# `HTTP_IDLE_TIMEOUT` seconds (aiohttp's keep-alive timer also runs while the request
# line and headers trickle in), a body must arrive within `BODY_TIMEOUT`, and at most
# `EXTENDER_SLOTS` extender calls wait for the extender's worker thread at once.
HTTP_IDLE_TIMEOUT = 15.0
BODY_TIMEOUT = 10.0
EXTENDER_SLOTS = 16


class DaemonView(Protocol):
    """What the HTTP API needs from the daemon. Every member is read on each request,
    so returning the latest values is enough; none of them may block."""

    @property
    def metrics(self) -> Metrics:
        """The daemon's metrics: it feeds `observe_event` with every folded event;
        `/metrics` refreshes the state gauges (`set_state`) at each scrape."""
        ...

    @property
    def event_log(self) -> EventLog | None:
        """The log, for history from the SQL read models (None: history answers 503)."""
        ...

    def state(self) -> ClusterState:
        """The latest folded state (an immutable value; cheap to return)."""
        ...

    def pools(self) -> Sequence[ApiPool]:
        """Effective pools with their workload selectors (see `api_pools`)."""
        ...

    def is_leader(self) -> bool:
        """True while this process holds the leadership lease."""
        ...

    def is_ready(self) -> tuple[bool, str]:
        """(ready, reason) for `/readyz`: ready as leader, or as a standby whose fold
        keeps up and whose sources are fresh; the reason is shown either way."""
        ...


# ------------------------------------------------------------------------- pools


def api_pools(state: ClusterState, config_pools: Sequence[PoolSettings] = ()
              ) -> tuple[ApiPool, ...]:
    """Pools from Nodesets in the state plus config-file pools (a Nodeset wins a name
    clash, as in `policy.effective_pools`), each with its workload selector."""
    selectors: dict[str, tuple[Label, ...]] = {
        pool.name: tuple(Label(k, v) for k, v in sorted(pool.workload_selector.items()))
        for pool in config_pools}
    for nodeset in state.nodesets.values():
        selectors[nodeset.pool] = nodeset.workload_selector
    specs = effective_pools(state, [pool_spec(p) for p in config_pools])
    return tuple(ApiPool(spec, selectors.get(spec.name, ())) for spec in specs)


# ----------------------------------------------------------------------- helpers


def _view(request: web.Request) -> DaemonView:
    view: DaemonView = request.app[VIEW_KEY]  # type: ignore[assignment]
    return view


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"limit must be an integer, got {raw!r}") from None
    if value < 1:
        raise web.HTTPBadRequest(text="limit must be at least 1")
    return min(value, MAX_LIMIT)


def _offset(request: web.Request) -> int:
    raw = request.query.get("offset", "0")
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"offset must be an integer, got {raw[:50]!r}") from None
    if value < 0:
        raise web.HTTPBadRequest(text="offset must be >= 0")
    if value > MAX_OFFSET:
        raise web.HTTPBadRequest(text=f"offset must be at most {MAX_OFFSET}")
    return value


def _encode_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode_token(token: str) -> str:
    try:
        padded = token + "=" * (-len(token) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise web.HTTPBadRequest(text="invalid continue token") from None


def parse_since(raw: str | None, now: datetime) -> datetime | None:
    """`24h`, `30m`, `7d`, `90s` before `now`, or an ISO time (UTC if naive)."""
    if raw is None or raw == "":
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if raw[-1:] in units:
        try:
            amount = float(raw[:-1])
        except ValueError:
            amount = None
        if amount is not None:
            if not math.isfinite(amount) or amount < 0:
                raise ValueError(f"not a finite, non-negative duration: {raw!r}")
            try:
                return now - timedelta(seconds=amount * units[raw[-1]])
            except OverflowError:
                # Longer ago than datetime reaches: everything (sunkd is younger than 1970).
                return datetime(1970, 1, 1, tzinfo=UTC)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"not a duration (24h, 7d) or an ISO time: {raw!r}") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def node_json(state: ClusterState, node: NodeState, pool: str | None, now: float
              ) -> dict[str, Any]:
    """The API's view of one node: owner, effective phase and why, both sides."""
    assessment = assess(state, node, now)
    transition = node.transition
    slurm = node.slurm
    k8s = node.k8s
    return {
        "name": node.name,
        "kubernetesName": node.k8s_name,
        "pool": pool,
        "owner": node.owner,
        "phase": assessment.phase.value,
        "machinePhase": node.phase.value,
        "since": _iso(node.since),
        "holdReasons": list(assessment.hold_reasons),
        "unknownReasons": list(assessment.unknown_reasons),
        "pin": None if node.pin is None else {
            "to": node.pin.to, "who": node.pin.who, "why": node.pin.why,
            "at": _iso(node.pin.at), "source": node.pin.source,
            "valid": assessment.invalid_pin is None, "problem": assessment.pin_problem},
        "transition": None if transition is None else {
            "id": transition.transition_id, "pool": transition.pool,
            "from": transition.from_owner, "to": transition.to_owner,
            "direction": transition.direction, "startedAt": _iso(transition.started_at),
            "reason": transition.reason, "done": list(transition.done_verbs)},
        "slurm": None if slurm is None else {
            "state": slurm.state, "flags": list(slurm.flags), "reason": slurm.reason,
            "partitions": list(slurm.partitions), "cpus": slurm.cpus,
            "allocCpus": slurm.alloc_cpus},
        "kubernetes": None if k8s is None else {
            "ready": k8s.ready, "unschedulable": k8s.unschedulable,
            "unparsedAllocatable": list(k8s.unparsed),
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in k8s.taints]},
        # In no pool: the drains and taints sunkd made that are still on it, and their fate.
        "sunkdMarks": unpooled_marks(node) if pool is None else [],
        "openActions": [
            {"id": a.action_id, "side": a.side, "verb": a.verb, "attempt": a.attempt,
             "requestedAt": _iso(a.requested_at)}
            for a in sorted(node.open_actions.values(), key=lambda a: a.seq)],
    }


def visible_nodes(state: ClusterState) -> list[str]:
    """Names of the nodes the API lists, sorted: not the phantoms a pin of a name never
    observed creates (`ownership.observed`); `GET /api/v1/nodes/{name}` still shows one,
    with its pending pin."""
    return sorted(name for name, node in state.nodes.items() if observed(node))


def _find_node(state: ClusterState, name: str) -> NodeState | None:
    node = state.nodes.get(name)
    if node is None and name in state.k8s_names:
        node = state.nodes.get(state.k8s_names[name])
    return node


@dataclass(frozen=True, slots=True)
class PoolSummary:
    name: str
    counts: dict[str, int]
    owners: dict[str, int]
    slurm_pending_nodes: int
    k8s_pending_pods: int
    spec: PoolSpec | None


def pool_summaries(state: ClusterState, pools: Sequence[ApiPool], now: float
                   ) -> list[PoolSummary]:
    members = membership(state, [p.spec for p in pools]) if pools else {}
    by_pool: dict[str, PoolSummary] = {}
    for pool in pools:
        slurm_pending = sum(
            max(state.slurm_demand[p].pending_nodes, 0)
            for p in pool.spec.partitions if p in state.slurm_demand)
        demand = state.k8s_demand.get(pool.name)
        by_pool[pool.name] = PoolSummary(pool.name, {}, {}, slurm_pending,
                                         len(demand.pending) if demand else 0, pool.spec)
    for name, node in state.nodes.items():
        if not observed(node):
            continue
        pool_name = members.get(name, NO_POOL)
        summary = by_pool.get(pool_name)
        if summary is None:
            summary = by_pool[pool_name] = PoolSummary(pool_name, {}, {}, 0, 0, None)
        phase = assess(state, node, now).phase.value
        summary.counts[phase] = summary.counts.get(phase, 0) + 1
        summary.owners[node.owner] = summary.owners.get(node.owner, 0) + 1
    return [by_pool[name] for name in sorted(by_pool)]


# ------------------------------------------------------------------------ routes


async def metrics_handler(request: web.Request) -> web.Response:
    view = _view(request)
    metrics = view.metrics
    metrics.set_state(view.state(), time.time(), [p.spec for p in view.pools()])
    response = web.Response(body=metrics.render())
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    ready, reason = _view(request).is_ready()
    return web.Response(text=f"{'ready' if ready else 'not ready'}: {reason}\n",
                        status=200 if ready else 503)


async def list_nodes(request: web.Request) -> web.Response:
    view = _view(request)
    state = view.state()
    limit = _limit(request)
    token = request.query.get("continue")
    after = _decode_token(token) if token else None
    names = visible_nodes(state)
    if after is not None:
        names = names[bisect.bisect_right(names, after):]
    page = names[:limit]
    members = membership(state, [p.spec for p in view.pools()])
    now = time.time()
    items = [node_json(state, state.nodes[name], members.get(name), now) for name in page]
    more = len(names) > limit
    return web.json_response({
        "items": items,
        "continue": _encode_token(page[-1]) if more and page else None,
        "total": len(visible_nodes(state)),
    })


async def get_node(request: web.Request) -> web.Response:
    view = _view(request)
    state = view.state()
    node = _find_node(state, request.match_info["name"])
    if node is None:
        raise web.HTTPNotFound(text=f"no node {request.match_info['name']!r}")
    members = membership(state, [p.spec for p in view.pools()])
    return web.json_response(node_json(state, node, members.get(node.name), time.time()))


async def node_history(request: web.Request) -> web.Response:
    view = _view(request)
    event_log = view.event_log
    if event_log is None:
        raise web.HTTPServiceUnavailable(text="history needs the event log")
    name = request.match_info["name"]
    node = _find_node(view.state(), name)
    if node is not None:
        name = node.name
    limit, offset = _limit(request), _offset(request)
    try:
        since = parse_since(request.query.get("since"), datetime.now(UTC))
    except ValueError as error:
        raise web.HTTPBadRequest(text=str(error)) from None
    rows = await event_log.read_models.intervals(node=name, since=since, limit=limit + 1,
                                                 offset=offset)
    more = len(rows) > limit
    return web.json_response({
        "node": name,
        "items": [row.to_json() for row in rows[:limit]],
        "nextOffset": offset + limit if more else None,
    })


async def list_pools(request: web.Request) -> web.Response:
    view = _view(request)
    state = view.state()
    items = []
    for summary in pool_summaries(state, view.pools(), time.time()):
        spec = summary.spec
        items.append({
            "name": summary.name,
            "nodesByPhase": summary.counts,
            "nodesByOwner": summary.owners,
            "slurmPendingNodes": summary.slurm_pending_nodes,
            "kubernetesPendingPods": summary.k8s_pending_pods,
            "partitions": list(spec.partitions) if spec else [],
            "ownership": None if spec is None else {
                "mode": spec.ownership.mode, "minSlurm": spec.ownership.min_slurm,
                "minKubernetes": spec.ownership.min_kubernetes,
                "maxKubernetes": spec.ownership.max_kubernetes,
                "prefer": spec.ownership.prefer,
                "drainTimeoutSeconds": spec.ownership.drain_timeout_seconds},
        })
    return web.json_response({"items": items})


async def _extender_call(request: web.Request, verb: str) -> web.Response:
    view = _view(request)
    app = request.app
    extender = app[EXTENDER_KEY]
    started = time.perf_counter()

    def refuse(status: int, result: str, error: str) -> web.Response:
        view.metrics.observe_extender(verb, result, time.perf_counter() - started)
        log.info("extender.refused", verb=verb, status=status, error=error[:300])
        return web.json_response({"Error": error}, status=status)

    slots = app[SLOTS_KEY]
    if slots.locked():
        return refuse(503, "busy", f"sunkd: more than {EXTENDER_SLOTS} extender calls "
                                   "waiting; retry later")
    async with slots:
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                body = await request.read()  # aiohttp answers 413 beyond client_max_size
        except TimeoutError:
            return refuse(408, "bad_request", f"body not received within {BODY_TIMEOUT:g} s")
        except (web.RequestPayloadError, BadHttpMessage) as error:
            # e.g. `Content-Encoding: gzip` on a body that is not gzip
            encoding = request.headers.get("Content-Encoding", "none")[:40]
            reason = error.message if isinstance(error, BadHttpMessage) else \
                str(error).split("message:", 1)[-1].strip()
            response = refuse(400, "bad_request", f"body cannot be read (Content-Encoding "
                                                  f"{encoding}): {reason[:200]}")
            response.force_close()  # the rest of this connection's bytes cannot be parsed
            return response
        work = extender.filter_bytes if verb == "filter" else extender.prioritize_bytes
        try:
            # Off the event loop: a big answer must not delay health checks, metrics or
            # the lease renewal. One thread, so calls never run concurrently.
            payload = await asyncio.get_running_loop().run_in_executor(
                app[WORKER_KEY], work, body)
        except TooLarge as error:
            return refuse(413, "too_large", str(error))
        except BadRequest as error:
            return refuse(400, "bad_request", str(error))
    response = web.Response(body=payload, content_type="application/json")
    view.metrics.observe_extender(verb, "ok", time.perf_counter() - started)
    return response


async def scheduler_filter(request: web.Request) -> web.Response:
    return await _extender_call(request, "filter")


async def scheduler_prioritize(request: web.Request) -> web.Response:
    return await _extender_call(request, "prioritize")


async def status_page(request: web.Request) -> web.Response:
    from sunkd.api.status_page import render_status

    view = _view(request)
    try:
        hours = float(request.query.get("hours", "6"))
    except ValueError:
        raise web.HTTPBadRequest(text="hours must be a number") from None
    if not math.isfinite(hours):
        raise web.HTTPBadRequest(text="hours must be a finite number")
    hours = min(max(hours, 0.1), 24 * 14)
    html = await render_status(view, hours=hours, offset=_offset(request))
    return web.Response(text=html, content_type="text/html", charset="utf-8")


def build_app(view: DaemonView, *, max_body_bytes: int = MAX_BODY_BYTES,
              hooks: HookEndpoint | None = None) -> web.Application:
    """The application; serve it with `start_http` (the daemon does), which bounds idle
    and slow connections, or any `web.AppRunner`/`web.TCPSite`."""
    app = web.Application(client_max_size=max_body_bytes)
    app[VIEW_KEY] = view
    app[EXTENDER_KEY] = Extender(view.state, view.pools)
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sunkd-extender")
    app[WORKER_KEY] = worker
    app[SLOTS_KEY] = asyncio.Semaphore(EXTENDER_SLOTS)

    async def stop_worker(_app: web.Application) -> None:
        worker.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(stop_worker)
    app.router.add_get("/", status_page)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/nodes", list_nodes)
    app.router.add_get("/api/v1/nodes/{name}", get_node)
    app.router.add_get("/api/v1/nodes/{name}/history", node_history)
    app.router.add_get("/api/v1/pools", list_pools)
    app.router.add_post("/scheduler/filter", scheduler_filter)
    app.router.add_post("/scheduler/prioritize", scheduler_prioritize)
    if hooks is not None:  # the one route that makes sunkd act (api/hooks.py)
        app.router.add_post("/api/v1/slurm/hook", hooks.handle)
    return app



async def start_http(app: web.Application, host: str, port: int, *,
                     ssl_context: ssl.SSLContext | None = None,
                     idle_timeout: float = HTTP_IDLE_TIMEOUT) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (HTTPS with `ssl_context`); returns the runner (call its
    `cleanup()`) and the bound port. Connections idle, or sending their request slower
    than `idle_timeout` allows, are closed (slowloris)."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    return runner, sockets[0].getsockname()[1] if sockets else port


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server TLS context from a PEM certificate (chain) and key; TLS 1.2 at least."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
