"""Kubernetes source: Nodes, Pods and Nodesets in, normalized observation events out.

Three list-then-watch loops (`sunkd.kubernetes.listwatch.ListWatch`) keep caches of stripped-down
objects; after every change the source recomputes the payloads that can depend on it and hands
the ones whose normalized content changed to the `EventSink` (the changes that arrive while
one append runs go together in the next: `_flusher`). Comparing normalized payloads
(not resourceVersions) is what keeps the log quiet: a kubelet heartbeat bumps a Node's
resourceVersion every 10 s but changes nothing sunkd cares about.

Nothing is emitted before all three resources have been listed once: a node observed before its
Nodesets are known would carry the wrong pool labels and Slurm name and be corrected a moment
later, and a previously seen node missing from an incomplete view would be reported vanished.
After that first sync, anything the seed (payloads from the fold) knows but the cluster no
longer has is reported gone: `K8sNodeVanished`, a Nodeset with `deleted=True`, an empty
workload or demand.

Failures: nothing that comes from the cluster or the log ends `run()`, except the
errors the owner names fatal (`fatal_errors`: the daemon passes StaleLeaderError, whose
term is over). A failed append makes the source stale with cause `append_failed` (recorded
as soon as the log takes an event again), everything is recomputed and retried with
backoff; when the log takes other events but refuses one observation, that observation is
rejected with its cause (`rejected_observations()`, retried when it changes or after
`REJECTED_RETRY_SECONDS`) and the rest goes on. Every string is cleaned of control
characters before it is emitted (`normalize.clean_payload`).

Why one long module: the three caches, the dirty-set flush and the append/rejection
path share one lock-free state machine; split, each half would need the other's
internals. The pure parts already live in `normalize.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    Event,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    Payload,
    PendingPod,
    PodRef,
    SourceHealth,
    Taint,
)
from sunkd.domain.gres import expected_gres
from sunkd.domain.ports import EventSink
from sunkd.kubernetes.client import JSON, NODES, NODESETS, PODS, KubeClient, ResourceType
from sunkd.kubernetes.listwatch import (
    ListWatch,
    Relisted,
    WatchEvent,
    WatchRecovered,
    WatchTrouble,
)
from sunkd.kubernetes.normalize import (
    GPU_RESOURCE,
    PodFacts,
    _matches,
    clean_payload,
    clean_text,
    node_quantity,
    parse_nodeset,
    pod_version,
    slim_node,
    slim_nodeset,
    slim_pod,
    workload_selector_matches,
)
from sunkd.kubernetes.wire import MalformedObject, resource_version

log = structlog.get_logger("sunkd.kubernetes.source")

SOURCE = "kubernetes"
RETRY_MAX_SECONDS = 30.0
REJECTED_RETRY_SECONDS = 60.0
INBOX_MAX = 10_000  # changes waiting for a flush; a watch that has more waits
SLOW_FLUSH_S = 1.0  # a flush that took this long is logged with its cost
ANNOTATION_LEGACY_CORDONED_BY = wk.ANNOTATION_LEGACY_CORDONED_BY
ANNOTATION_PIN = wk.ANNOTATION_PIN
LABEL_SLURM_NODE_NAME = wk.LABEL_SLURM_NODE_NAME
SUNKD_PREFIX = wk.PREFIX


# --------------------------------------------------------------------------- source


def _family(payload: Payload) -> tuple[str, str] | None:
    """(family, subject) under which the last emitted payload is remembered."""
    if isinstance(payload, K8sNodeObserved | K8sNodeVanished):
        return ("node", payload.node)
    if isinstance(payload, K8sWorkloadObserved):
        return ("workload", payload.node)
    if isinstance(payload, K8sDemandObserved):
        return ("demand", payload.pool)
    if isinstance(payload, K8sNodesetObserved):
        return ("nodeset", payload.pool)
    if isinstance(payload, SourceHealth) and payload.source == SOURCE:
        return ("health", SOURCE)
    return None


def _subject(payload: Payload) -> str:
    family = _family(payload)
    assert family is not None
    return family[1]


class _SinkDown(Exception):
    """The sink refused even a lone health event: the log itself is unavailable."""


@dataclass(slots=True)
class _Dirty:
    nodes: set[str] = field(default_factory=set)
    pools: set[str] = field(default_factory=set)
    everything: bool = False

    def clear(self) -> None:
        self.nodes.clear()
        self.pools.clear()
        self.everything = False


class KubernetesSource:
    """Watches the cluster and emits observation events to `sink`.

    `previous` are the last observation payloads sunkd knows (from the fold); only changes
    against them are emitted. Call `run(stop_event)`; tests await `wait_synced()`, then
    `wait_idle()` to know every change received so far has reached the sink.

    A sink error listed in `fatal_errors` (the event log refusing a stale leader's epoch) ends
    `run()` with that error; any other makes the source stale and is retried (module
    docstring). Payloads are remembered as emitted only once the sink accepted them, so a
    retry, or a new source seeded from the log's fold, picks up exactly where the log is.
    """

    def __init__(
        self,
        client: KubeClient,
        sink: EventSink,
        *,
        previous: Iterable[Payload] = (),
        nodeset_resource: ResourceType = NODESETS,
        nodeset_namespace: str | None = None,
        watch_timeout: int = 300,
        idle_timeout: float = 90.0,
        page_size: int = 500,
        stale_after_failures: int = 2,
        lost_after: float = 60.0,
        fatal_errors: tuple[type[BaseException], ...] = (),
        gres_type_map: Mapping[str, str] | None = None,
    ) -> None:
        # Not None: every Node's observation carries the GRES Slurm must report for it
        # (`[gres] check`; the map turns GPU product labels into Slurm's type names).
        self._gres_type_map = dict(gres_type_map) if gres_type_map is not None else None
        self.client = client
        self.sink = sink
        self.stale_after_failures = stale_after_failures
        self.lost_after = lost_after
        self.fatal_errors = fatal_errors
        self._last: dict[tuple[str, str], Payload] = {}
        for payload in previous:
            family = _family(payload)
            if family is not None:
                self._last[family] = payload

        def make(rt: ResourceType, namespace: str | None, transform: Any,
                 version: Any = resource_version) -> ListWatch[Any]:
            return ListWatch(
                client,
                rt,
                namespace=namespace,
                watch_timeout=watch_timeout,
                idle_timeout=idle_timeout,
                page_size=page_size,
                transform=transform,
                version=version,
            )

        self.watches: dict[str, ListWatch[Any]] = {
            "nodes": make(NODES, None, slim_node),
            "pods": make(PODS, None, slim_pod, pod_version),
            "nodesets": make(nodeset_resource, nodeset_namespace, slim_nodeset),
        }
        self._synced_once: set[str] = set()
        self._synced = asyncio.Event()
        self._trouble: dict[str, WatchTrouble] = {}
        # Failures of our own side (appends, internal errors), by kind.
        self._sync_trouble: dict[str, WatchTrouble] = {}
        self._retry_at: float | None = None
        self._retry_delay = 1.0
        # Observations the log refused on their own: family -> (payload, retry after).
        self._rejected: dict[tuple[str, str], tuple[Payload, float]] = {}
        self._unhealthy_since: float | None = None
        self._dirty = _Dirty()
        # Indexes over the ListWatch caches. A node's pods are a list, not a set: ~10-110
        # keys a node, and at 100,000 pods the sets were 7 MB (docs/performance.md). The
        # node a pod is indexed under is the cached object's (`WatchEvent.previous`).
        self._pods_by_node: dict[str, list[str]] = {}
        self._pending: set[str] = set()
        self._lock = asyncio.Lock()
        self._nodeset_cache: dict[str, K8sNodesetObserved] | None = None
        self._memo: _FlushMemo | None = None  # only while a flush builds its payloads
        self.full_flushes = 0  # flushes that rebuilt every payload (first sync, Nodesets)
        self._workload_selectors: dict[str, Any] = {}
        self._received = 0  # watch items pulled
        self._handled = 0  # ... and handled (indexes updated, dirty marked)
        self._flushed = 0  # ... and covered by a flush since
        self._flush_wanted = asyncio.Event()
        # Changes pulled from the watches, in arrival order, not yet noted: the watches
        # go on reading while a flush's append runs (`_flusher` says why).
        self._inbox: list[tuple[str, WatchEvent]] = []
        self._inbox_room = asyncio.Event()
        self._inbox_room.set()
        self._idle = asyncio.Condition()
        self.emitted = 0

    # -- views ----------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, JSON]:
        return self.watches["nodes"].cache

    @property
    def pods(self) -> dict[str, PodFacts]:
        return self.watches["pods"].cache

    @property
    def nodeset_objects(self) -> dict[str, JSON]:
        return self.watches["nodesets"].cache

    def last_payloads(self) -> list[Payload]:
        """What the source believes the log says (the seed plus everything it emitted)."""
        return list(self._last.values())

    def rejected_observations(self) -> list[str]:
        """Subjects whose current observation the log refused (see the module docstring)."""
        return sorted({family[1] for family in self._rejected})

    # -- running --------------------------------------------------------------------

    async def run(self, stop_event: asyncio.Event) -> None:
        """Until `stop_event` is set; raises only one of `fatal_errors` (unwrapped from the
        task group, so the owner can tell a deposed leader from anything else)."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._consume(name, lw))
                    for name, lw in self.watches.items()
                ]
                tasks.append(group.create_task(self._health_ticker()))
                tasks.append(group.create_task(self._flusher()))
                await stop_event.wait()
                for task in tasks:
                    task.cancel()
        except BaseExceptionGroup as failed:
            if len(failed.exceptions) == 1:
                raise failed.exceptions[0] from None
            raise

    async def wait_synced(self, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            await self._synced.wait()

    async def wait_idle(self, within: float = 30.0) -> None:
        """Until every watch item received so far has been processed and flushed."""
        async with asyncio.timeout(within):
            async with self._idle:
                await self._idle.wait_for(lambda: self._flushed >= self._received)

    async def _consume(self, name: str, lw: ListWatch[Any]) -> None:
        while True:
            try:
                async for item in lw.items():
                    self._received += 1
                    if isinstance(item, WatchEvent):
                        # A change: noted by the next flush, without the lock a flush
                        # holds through its append.
                        self._inbox.append((name, item))
                        self._flush_wanted.set()
                        if len(self._inbox) >= INBOX_MAX:  # bounded: wait for a flush
                            self._inbox_room.clear()
                            await self._inbox_room.wait()
                        continue
                    try:
                        async with self._lock:
                            try:
                                await self._drain()  # the changes before it go first
                                await self._handle(name, item)
                            except self.fatal_errors:
                                raise
                            except Exception as error:
                                await self._failed("internal", "internal_error", error)
                    finally:
                        self._handled += 1
                        self._flush_wanted.set()
            except self.fatal_errors:
                raise
            except Exception as error:  # the informer itself; it catches all it knows
                log.exception("kubernetes.watch_crashed", resource=name)
                async with self._lock:
                    await self._failed("internal", "internal_error", error)
                await asyncio.sleep(self._retry_delay)

    async def _flusher(self) -> None:
        """Note the changes in the inbox and flush them: one append for all of them.
        While an append runs (on SQLite a commit is an fsync, ~40 ms) the watches go on
        reading into the inbox, and what arrived goes in the next append, instead of
        each change making a transaction of its own: at 2,000 nodes that held the
        source to ~25 Node changes a second (docs/performance.md, "Scale")."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            async with self._lock:
                covered = self._handled + len(self._inbox)  # all of it, once drained
                try:
                    await self._flush()  # drains first
                except self.fatal_errors:
                    raise
                except Exception as error:
                    await self._failed("internal", "internal_error", error)
            self._flushed = max(self._flushed, covered)
            async with self._idle:
                self._idle.notify_all()

    async def _health_ticker(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            async with self._lock:
                now = time.monotonic()
                if self._retry_at is None:
                    retry = self._dirty.everything  # a recomputation is still owed
                else:
                    retry = now >= self._retry_at
                if retry:
                    try:
                        await self._flush()
                    except self.fatal_errors:
                        raise
                    except Exception as error:
                        await self._failed("internal", "internal_error", error)
                if not self._sync_trouble:
                    await self._retry_rejected(now)
                await self._emit_health()

    async def _retry_rejected(self, now: float) -> None:
        """Offer each refused observation again, alone, once its retry time has come (no
        probe, so a permanently refused one does not make the source blink stale)."""
        for family, (payload, until) in list(self._rejected.items()):
            if until > now:
                continue
            try:
                await self.sink([Event(subject=_subject(payload), payload=payload)])
            except self.fatal_errors:
                raise
            except Exception as error:
                self._rejected[family] = (payload, now + REJECTED_RETRY_SECONDS)
                log.warning("kubernetes.observation_rejected", kind=payload.kind,
                            subject=clean_text(_subject(payload)),
                            cause=clean_text(f"{type(error).__name__}: {error}")[:300],
                            retry_in=REJECTED_RETRY_SECONDS)
                continue
            del self._rejected[family]
            self._last[family] = payload
            self.emitted += 1

    async def _failed(self, what: str, cause: str, error: Exception) -> None:
        """Our side failed (`what`: append | internal): stale at once with `cause`, recompute
        everything on the next try, retry with backoff."""
        previous = self._sync_trouble.get(what)
        detail = clean_text(f"{type(error).__name__}: {error}")[:300]
        self._sync_trouble[what] = WatchTrouble(
            cause, detail, (previous.consecutive if previous else 0) + 1, immediate=True)
        if self._unhealthy_since is None:
            self._unhealthy_since = time.monotonic()
        self._dirty.everything = True
        self._retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_SECONDS)
        log.warning("kubernetes.sync_failed", what=what, cause=cause, error=detail,
                    retry_in=round(self._retry_at - time.monotonic(), 1))
        if what != "append":
            with contextlib.suppress(_SinkDown):
                await self._emit_health()

    def _recovered(self, what: str) -> bool:
        if self._sync_trouble.pop(what, None) is None:
            return False
        log.info("kubernetes.sync_recovered", what=what)
        if not self._sync_trouble:
            self._retry_at = None
            self._retry_delay = 1.0
        if not self._trouble and not self._sync_trouble:
            self._unhealthy_since = None
        return True

    # -- handling --------------------------------------------------------------------

    async def _handle(self, name: str, item: Relisted | WatchTrouble | WatchRecovered) -> None:
        """A watch item that is not a change (changes go through the inbox)."""
        if isinstance(item, WatchTrouble):
            self._trouble[name] = item
            if self._unhealthy_since is None:
                self._unhealthy_since = time.monotonic()
            await self._emit_health()
            return
        if isinstance(item, WatchRecovered):
            self._trouble.pop(name, None)
            if not self._trouble:
                self._unhealthy_since = None
            await self._emit_health()
            return
        if isinstance(item, Relisted):
            self._trouble.pop(name, None)
            if not self._trouble:
                self._unhealthy_since = None
            for event in item.events:
                self._note(name, event)
            if name not in self._synced_once:
                self._synced_once.add(name)
                if len(self._synced_once) == len(self.watches):
                    self._dirty.everything = True
            await self._flush()
            if len(self._synced_once) == len(self.watches):
                await self._emit_health()
                self._synced.set()

    def _note(self, name: str, event: WatchEvent) -> None:
        """Update indexes and mark what the change can affect."""
        if name == "nodesets":
            # sunkd itself writes every Nodeset's status every few seconds: a MODIFIED
            # event that changes nothing the payloads read. Rebuild them only when the
            # parsed Nodesets or their workload selectors changed (at 10,000 nodes a
            # rebuild is ~1 s of the event loop).
            before = (self._nodeset_cache, self._workload_selectors)
            self._nodeset_cache = None
            if before[0] is None or before != (self._nodesets(), self._workload_selectors):
                self._dirty.everything = True
            return
        if name == "nodes":
            self._dirty.nodes.add(event.key)
            return
        key = event.key
        replaced: PodFacts | None = event.previous
        old_node = replaced.node if replaced is not None else None
        if old_node is not None:
            members = self._pods_by_node.get(old_node, [])
            with contextlib.suppress(ValueError):  # not indexed there: nothing to undo
                members.remove(key)
            if not members:
                self._pods_by_node.pop(old_node, None)
            self._dirty.nodes.add(old_node)
        was_pending = key in self._pending
        self._pending.discard(key)
        pod: PodFacts = event.object
        if event.type != "DELETED":
            node = pod.node
            if node:
                members = self._pods_by_node.setdefault(node, [])
                if key not in members:
                    members.append(key)
                self._dirty.nodes.add(node)
            if pod.pending_unschedulable:
                self._pending.add(key)
        if was_pending or key in self._pending:
            for pool in self._nodesets():
                if self._workload_match(pool, pod.labels):
                    self._dirty.pools.add(pool)

    def _nodesets(self) -> dict[str, K8sNodesetObserved]:
        """Parsed Nodesets by pool, cached until a Nodeset changes."""
        if self._nodeset_cache is None:
            parsed: dict[str, K8sNodesetObserved] = {}
            selectors: dict[str, Any] = {}
            for obj in self.nodeset_objects.values():
                try:  # slim_nodeset already refused what does not parse
                    nodeset = parse_nodeset(obj)
                except (ValueError, TypeError, ArithmeticError, AttributeError) as error:
                    log.warning("kubernetes.nodeset_rejected", error=str(error)[:300])
                    continue
                parsed[nodeset.pool] = nodeset
                selectors[nodeset.pool] = (obj.get("spec") or {}).get("workloadSelector")
            self._nodeset_cache = parsed
            self._workload_selectors = selectors
        return self._nodeset_cache

    def _workload_match(self, pool: str, labels: Mapping[str, Any]) -> bool:
        self._nodesets()
        memo = self._memo
        if memo is None:
            return workload_selector_matches(self._workload_selectors.get(pool), labels)
        key = (pool, id(labels))
        hit = memo.pods.get(key)
        if hit is None or hit[0] is not labels:
            hit = (labels, workload_selector_matches(self._workload_selectors.get(pool), labels))
            memo.pods[key] = hit
        return hit[1]

    # -- payloads ----------------------------------------------------------------------

    def _pool_of(
        self, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sNodesetObserved | None:
        # A node matched by several Nodesets belongs to the first by name: deterministic,
        # and the overlap is a configuration error the Nodeset status should report.
        memo = self._memo
        if memo is None or memo.nodesets is not nodesets:
            return _first_match(labels, [nodesets[pool] for pool in sorted(nodesets)])
        hit = memo.pools.get(id(labels))
        if hit is None or hit[0] is not labels:
            hit = (labels, _first_match(labels, memo.ordered))
            memo.pools[id(labels)] = hit
        return hit[1]

    def _node_payload(
        self,
        node: JSON,
        nodesets: Mapping[str, K8sNodesetObserved],
        relevant_keys: frozenset[str],
    ) -> K8sNodeObserved:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        name = str(meta.get("name") or "")
        labels: dict[str, Any] = meta.get("labels") or {}
        annotations: dict[str, Any] = meta.get("annotations") or {}
        ready: bool | None = None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Ready":
                ready = {"True": True, "False": False}.get(str(condition.get("status")))
        pool = self._pool_of(labels, nodesets)
        slurm_node = ""
        if pool is not None and pool.node_name_label:
            slurm_node = str(labels.get(pool.node_name_label) or "")
        slurm_node = slurm_node or str(labels.get(LABEL_SLURM_NODE_NAME) or "") or name
        allocatable = status.get("allocatable") or {}
        taints = tuple(
            sorted(
                (
                    Taint(
                        str(t.get("key") or ""),
                        str(t.get("effect") or ""),
                        str(t.get("value") or ""),
                    )
                    for t in spec.get("taints") or []
                ),
                key=lambda t: (t.key, t.effect, t.value),
            )
        )
        pin = annotations.get(ANNOTATION_PIN)
        quantities = {key: node_quantity(allocatable, key, scale) for key, scale in
                      (("cpu", 1000), ("memory", 1), (GPU_RESOURCE, 1))}
        unparsed = tuple(key for key, value in quantities.items() if value is None)
        if unparsed:
            log.warning("kubernetes.node_quantity_unparsed", node=clean_text(name),
                        resources=list(unparsed), values=[
                            clean_text(repr(allocatable.get(key)))[:100] for key in unparsed],
                        treated_as="unknown capacity")
        return K8sNodeObserved(
            node=name,
            slurm_node=slurm_node,
            ready=ready,
            unschedulable=bool(spec.get("unschedulable")),
            # sunkd's own hold is its taint; the annotation proves nothing (see events.py).
            held_by_sunkd=any(t.key == wk.TAINT_HOLD for t in taints),
            taints=taints,
            labels=tuple(
                Label(k, str(v))
                for k, v in sorted(labels.items())
                if k in relevant_keys or k.startswith(SUNKD_PREFIX)
            ),
            pin=str(pin) if pin else None,
            cpu_millis=quantities["cpu"] or 0,
            memory_bytes=quantities["memory"] or 0,
            gpus=quantities[GPU_RESOURCE] or 0,
            unparsed=unparsed,
            gres=(None if self._gres_type_map is None
                  else expected_gres(node, self._gres_type_map)),
        )

    def _workload_payload(
        self, node: str, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sWorkloadObserved:
        """Every Node's whole pod list, whatever attributes the Node to a pool (a Nodeset
        selector, partitions, a config-file pool, a transition in flight) or none: the
        fold treats a Node without a report as unknown, never as empty, so every Node
        is reported. `pool_pod` tells the pods of the Nodeset that selects the Node."""
        pool = self._pool_of(labels, nodesets)
        refs = []
        for key in self._pods_by_node.get(node, ()):
            pod = self.pods.get(key)
            if pod is None or pod.node != node:
                continue
            if pod.node_local:
                continue  # DaemonSet and mirror pods stay with the node, whoever owns it
            slurmd = _slurmd_node(pod, nodesets)
            refs.append(
                PodRef(
                    pod.namespace,
                    pod.name,
                    pod.phase,
                    uid=pod.uid or "",
                    pool_pod=not slurmd and pool is not None
                    and self._workload_match(pool.pool, pod.labels),
                    slurmd=slurmd,
                )
            )
        return K8sWorkloadObserved(
            node=node, pool="", pods=tuple(sorted(refs, key=lambda r: (r.namespace, r.name)))
        )

    def _report_claimants(self, out: list[Payload], released: set[str],
                          claims: Mapping[str, str],
                          nodesets: Mapping[str, K8sNodesetObserved]) -> None:
        """A Node stopped claiming a Slurm name (deleted, relabelled): report the pods of
        every other Node still claiming it again, after that change. The fold makes a
        claim that changes hands unknown until the successor's report arrives, and an
        unchanged report would otherwise never be sent again."""
        claimants = []
        for (family, name), last in self._last.items():
            if family != "node" or not isinstance(last, K8sNodeObserved):
                continue
            claim = claims.get(name, last.slurm_node)  # what it claims after this flush
            if claim in released and self.nodes.get(name) is not None:
                claimants.append(name)
        if not claimants:
            return
        again = set(claimants)
        # Their report goes after the release (an earlier copy in this flush is dropped).
        out[:] = [p for p in out if not (isinstance(p, K8sWorkloadObserved) and p.node in again)]
        for name in sorted(claimants):
            node = self.nodes[name]
            labels = (node.get("metadata") or {}).get("labels") or {}
            self._last.pop(("workload", name), None)
            out.append(self._workload_payload(name, labels, nodesets))

    def _demand_payload(self, nodeset: K8sNodesetObserved) -> K8sDemandObserved:
        pending = []
        for key in self._pending:
            pod = self.pods.get(key)
            if pod is None:
                continue
            if self._workload_match(nodeset.pool, pod.labels):
                cpu, memory, gpus = pod.requests
                pending.append(
                    PendingPod(
                        pod.namespace,
                        pod.name,
                        cpu,
                        memory,
                        gpus,
                    )
                )
        return K8sDemandObserved(
            pool=nodeset.pool, pending=tuple(sorted(pending, key=lambda p: (p.namespace, p.name)))
        )

    async def _drain(self) -> None:
        """Note the inbox's changes in arrival order (under the lock)."""
        inbox, self._inbox = self._inbox, []
        self._inbox_room.set()
        for name, event in inbox:
            try:
                self._note(name, event)
            except Exception as error:
                await self._failed("internal", "internal_error", error)
        self._handled += len(inbox)

    async def _flush(self) -> None:
        await self._drain()  # a flush never builds from indexes behind the caches
        if len(self._synced_once) < len(self.watches):
            return  # no partial views: see the module docstring
        nodesets = self._nodesets()
        relevant = frozenset(label.key for ns in nodesets.values() for label in ns.node_selector)
        out: list[Payload] = []
        dirty = self._dirty
        self._memo = _FlushMemo(nodesets)
        started = time.monotonic()
        try:
            self._build_payloads(out, dirty, nodesets, relevant)
        finally:
            self._memo = None
        dirty.clear()
        built = time.monotonic()
        await self._emit(out)
        if time.monotonic() - started >= SLOW_FLUSH_S:  # a first sync, a relist: its cost
            log.info("kubernetes.flushed", payloads=len(out), build_s=round(built - started, 3),
                     emit_s=round(time.monotonic() - built, 3))
        if self._recovered("internal"):
            await self._emit_health()

    def _build_payloads(self, out: list[Payload], dirty: _Dirty,
                        nodesets: Mapping[str, K8sNodesetObserved],
                        relevant: frozenset[str]) -> None:
        if dirty.everything:
            self.full_flushes += 1
            node_names: set[str] = set(self.nodes) | {
                s for (f, s) in self._last if f in ("node", "workload")
            }
            pools: set[str] = set(nodesets) | {
                s for (f, s) in self._last if f in ("demand", "nodeset")
            }
            for pool in sorted(pools):
                if pool in nodesets:
                    out.append(nodesets[pool])
                else:
                    last = self._last.get(("nodeset", pool))
                    if isinstance(last, K8sNodesetObserved) and not last.deleted:
                        out.append(_replace_deleted(last))
        else:
            node_names = set(dirty.nodes)
            pools = set(dirty.pools)
        released: set[str] = set()  # Slurm names a Node stopped claiming
        claims: dict[str, str] = {}  # Node -> the Slurm name it claims now (this flush)
        for name in sorted(node_names):
            node = self.nodes.get(name)
            last_node = self._last.get(("node", name))
            if node is None:
                out.append(K8sNodeVanished(node=name))  # its pod report goes with it
                if isinstance(last_node, K8sNodeObserved):
                    released.add(last_node.slurm_node)
                continue
            try:
                payload = self._node_payload(node, nodesets, relevant)
                labels = (node.get("metadata") or {}).get("labels") or {}
                workload = self._workload_payload(name, labels, nodesets)
            except Exception as error:  # the transforms should have refused it already
                log.warning("kubernetes.object_rejected", key=name, field="object",
                            cause=f"{type(error).__name__}: {error}"[:300])
                continue
            out.append(payload)
            out.append(workload)
            claims[name] = payload.slurm_node
            if isinstance(last_node, K8sNodeObserved) and (
                    last_node.slurm_node != payload.slurm_node):
                released.add(last_node.slurm_node)
        if released:
            self._report_claimants(out, released, claims, nodesets)
        for pool in sorted(pools):
            nodeset = nodesets.get(pool)
            if nodeset is not None:
                out.append(self._demand_payload(nodeset))
            else:
                last_demand = self._last.get(("demand", pool))
                if isinstance(last_demand, K8sDemandObserved) and last_demand.pending:
                    out.append(K8sDemandObserved(pool=pool, pending=()))

    async def _emit(self, payloads: list[Payload]) -> None:
        events: list[Event] = []
        now = time.monotonic()
        for payload in payloads:
            try:
                payload = clean_payload(payload)
            except MalformedObject as error:
                log.warning("kubernetes.observation_rejected", kind=payload.kind,
                            subject=clean_text(_subject(payload)), field=error.field,
                            cause=error.why)
                continue
            family = _family(payload)
            assert family is not None
            last = self._last.get(family)
            if isinstance(payload, K8sNodeVanished) and not isinstance(last, K8sNodeObserved):
                # Never seen, or already reported gone; a report the seed held for it is
                # no proof for a Node that appears under the name later.
                self._last.pop(("workload", family[1]), None)
                continue
            if last == payload:
                self._rejected.pop(family, None)
                continue
            refused = self._rejected.get(family)
            if refused is not None and refused[0] == payload and now < refused[1]:
                continue  # the log refused exactly this; wait for a change or the retry
            events.append(Event(subject=_subject(payload), payload=payload))
        if not events:
            return
        trouble = self._sync_trouble.get("append")
        last_health = self._last.get(("health", SOURCE))
        if trouble is not None and not (isinstance(last_health, SourceHealth)
                                        and last_health.cause == trouble.cause):
            # The log was down: what it missed starts with the source having been stale.
            events.insert(0, Event(subject=SOURCE, payload=SourceHealth(
                source=SOURCE, status="stale", cause=trouble.cause, detail=trouble.detail)))
        try:
            accepted = await self._append(events)
        except _SinkDown as down:
            cause = down.__cause__
            await self._failed("append", "append_failed",
                               cause if isinstance(cause, Exception) else down)
            return
        # Remember only what the sink accepted: what it did not is retried (recomputed) on
        # the next flush instead of being believed to be in the log.
        for event in accepted:
            family = _family(event.payload)
            assert family is not None
            payload = event.payload
            if not (isinstance(payload, K8sWorkloadObserved) and not payload.complete):
                self._rejected.pop(family, None)  # the refused report waits for its retry
            if isinstance(event.payload, K8sNodeVanished) and family[1] not in self.nodes:
                # Reported gone, and its pod report with it (the fold drops both): nothing
                # left to compare with, so forget both (memory follows the live cluster),
                # and a Node re-created under the name is reported afresh.
                self._last.pop(family, None)
                self._last.pop(("workload", family[1]), None)
                continue
            self._last[family] = event.payload
        self.emitted += len(accepted)
        if self._recovered("append"):
            await self._emit_health()

    async def _append(self, events: list[Event]) -> list[Event]:
        """Append `events`; returns those the log took. Raises `_SinkDown` when the log
        takes nothing at all."""
        try:
            await self.sink(events)
            return events
        except self.fatal_errors:
            raise
        except Exception as error:
            first_error = error
        # Does the log take anything? Try to record that this source is stale: if even
        # that fails, the log is down (nothing is lost: everything is retried later).
        detail = clean_text(f"{type(first_error).__name__}: {first_error}")[:300]
        probe = SourceHealth(source=SOURCE, status="stale", cause="append_failed",
                             detail=detail)
        try:
            await self.sink([Event(subject=SOURCE, payload=probe)])
        except self.fatal_errors:
            raise
        except Exception as error:
            raise _SinkDown(str(error)) from first_error
        self._last[("health", SOURCE)] = probe
        log.warning("kubernetes.append_failed", events=len(events), error=detail,
                    next="isolating the observations the log refuses")
        accepted: list[Event] = []
        await self._append_halves(events, accepted)
        return accepted

    async def _mark_unknown(self, node: str, accepted: list[Event]) -> None:
        """The log refused a Node's pod report: what the fold holds for the Node is stale,
        so say its pods are unknown (a small report the log takes) rather than leave the
        old list standing as if it were current."""
        marker = Event(subject=node, payload=K8sWorkloadObserved(node=node, complete=False))
        try:
            await self.sink([marker])
        except self.fatal_errors:
            raise
        except Exception as error:
            log.error("kubernetes.pods_unknown_unrecorded", subject=clean_text(node),
                      cause=clean_text(f"{type(error).__name__}: {error}")[:300])
            return
        accepted.append(marker)

    async def _append_halves(self, events: list[Event], accepted: list[Event]) -> None:
        """Bisect a refused batch: O(k log n) appends find the k events the log refuses."""
        if len(events) == 1:
            event = events[0]
            try:
                await self.sink(events)
            except self.fatal_errors:
                raise
            except Exception as error:
                family = _family(event.payload)
                assert family is not None
                self._rejected[family] = (event.payload,
                                          time.monotonic() + REJECTED_RETRY_SECONDS)
                log.error("kubernetes.observation_rejected", kind=event.kind,
                          subject=clean_text(event.subject),
                          cause=clean_text(f"{type(error).__name__}: {error}")[:300],
                          retry_in=REJECTED_RETRY_SECONDS)
                payload = event.payload
                if isinstance(payload, K8sWorkloadObserved) and payload.complete:
                    await self._mark_unknown(payload.node, accepted)
                return
            accepted.append(event)
            return
        middle = len(events) // 2
        for half in (events[:middle], events[middle:]):
            try:
                await self.sink(half)
            except self.fatal_errors:
                raise
            except Exception:
                await self._append_halves(half, accepted)
            else:
                accepted.extend(half)

    async def _emit_health(self) -> None:
        troubles = [*self._trouble.values(), *self._sync_trouble.values()]
        if troubles:
            worst = max(troubles, key=lambda t: (t.immediate, t.consecutive))
            if self._unhealthy_since is None:
                self._unhealthy_since = time.monotonic()
            since = self._unhealthy_since
            if time.monotonic() - since >= self.lost_after:
                status = "lost"
            elif worst.immediate or worst.consecutive >= self.stale_after_failures:
                status = "stale"
            else:
                return  # a single blip: the loop is already retrying
            health = SourceHealth(
                source=SOURCE, status=status, cause=worst.cause, detail=worst.detail[:300]
            )
        elif len(self._synced_once) == len(self.watches):
            health = SourceHealth(source=SOURCE, status="fresh")
        else:
            return
        if health.status == "fresh" and (self._dirty.everything or self._retry_at is not None):
            return  # a recomputation is pending: fresh only once it went through
        last = self._last.get(("health", SOURCE))
        # Detail text varies from retry to retry; only status and cause make a new event.
        if isinstance(last, SourceHealth) and (last.status, last.cause) == (
            health.status,
            health.cause,
        ):
            return
        await self._emit([health])


class _FlushMemo:
    """Selector answers for one flush, keyed by the identity of a label map. Pods (and
    nodes) with equal labels share one map (`PodFacts`, `shared_labels`), so a flush at
    100,000 pods evaluates each selector once per distinct map, not once per pod. Each
    entry holds its map, so an id cannot be reused while the memo lives; the memo lives
    only while `_build_payloads` runs, which never yields, so no map changes under it."""

    __slots__ = ("nodesets", "ordered", "pods", "pools")

    def __init__(self, nodesets: Mapping[str, K8sNodesetObserved]) -> None:
        self.nodesets = nodesets
        self.ordered = [nodesets[pool] for pool in sorted(nodesets)]
        self.pods: dict[tuple[str, int], tuple[Mapping[str, Any], bool]] = {}
        self.pools: dict[int, tuple[Mapping[str, Any], K8sNodesetObserved | None]] = {}


def _first_match(labels: Mapping[str, Any],
                 ordered: list[K8sNodesetObserved]) -> K8sNodesetObserved | None:
    for nodeset in ordered:
        if _matches(nodeset.node_selector, labels):
            return nodeset
    return None


def _replace_deleted(last: K8sNodesetObserved) -> K8sNodesetObserved:
    return replace(last, deleted=True)


def _slurmd_node(pod: PodFacts, nodesets: Mapping[str, K8sNodesetObserved]) -> str:
    """The Slurm node `pod` is sunkd's slurmd pod for: its claim names a Nodeset of its own
    namespace that the source knows, by that Nodeset's uid. "" otherwise (impostors too)."""
    claim = pod.slurmd_claim
    if claim is None:
        return ""
    uid, name, node = claim
    nodeset = nodesets.get(f"{pod.namespace}/{name}")
    return node if nodeset is not None and nodeset.uid and nodeset.uid == uid else ""
