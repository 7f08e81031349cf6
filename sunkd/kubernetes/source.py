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

The source composes the objects that own the rest: `PodIndex` (pods by Node, pending
pods), `NodesetView` (parsed Nodesets and the selector questions, memoized per flush),
`Payloads` (what the caches say, as payloads) and `Troubles` (what is wrong, the
health it means and the retry clock); the pure parts live in
`normalize.py`. What stays here is the one state machine the watches, the dirty-set
flush and the append/rejection path share under one lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from sunkd.domain.events import (
    Event,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Payload,
    SourceHealth,
)
from sunkd.domain.ports import EventSink
from sunkd.kubernetes.client import JSON, NODES, NODESETS, PODS, KubeClient, ResourceType
from sunkd.kubernetes.listwatch import (
    ListWatch,
    Relisted,
    WatchEvent,
    WatchRecovered,
    WatchTrouble,
)
from sunkd.kubernetes.nodesetview import NodesetView
from sunkd.kubernetes.normalize import (
    PodFacts,
    clean_payload,
    clean_text,
    pod_version,
    slim_node,
    slim_nodeset,
    slim_pod,
)
from sunkd.kubernetes.payloads import Payloads
from sunkd.kubernetes.podindex import PodIndex
from sunkd.kubernetes.troubles import Troubles
from sunkd.kubernetes.wire import MalformedObject, resource_version

log = structlog.get_logger("sunkd.kubernetes.source")

SOURCE = "kubernetes"
REJECTED_RETRY_SECONDS = 60.0
INBOX_MAX = 10_000  # changes waiting for a flush; a watch that has more waits
SLOW_FLUSH_S = 1.0  # a flush that took this long is logged with its cost


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
        # `[gres] check`: the Node payloads carry the GRES Slurm must report (payloads.py).
        self._gres_type_map = dict(gres_type_map) if gres_type_map is not None else None
        self.client = client
        self.sink = sink
        self.troubles = Troubles(stale_after_failures=stale_after_failures,
                                 lost_after=lost_after)
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
        # Observations the log refused on their own: family -> (payload, retry after).
        self._rejected: dict[tuple[str, str], tuple[Payload, float]] = {}
        self._dirty = _Dirty()
        # What the payloads read besides the watches' caches: an index over the pods
        # and the parsed Nodesets.
        self.pod_index = PodIndex()
        self.nodeset_view = NodesetView(self.watches["nodesets"])
        self._payloads = Payloads(self.watches["pods"], self.pod_index, self.nodeset_view,
                                  self._gres_type_map)
        self._lock = asyncio.Lock()
        self.full_flushes = 0  # flushes that rebuilt every payload (first sync, Nodesets)
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
    def synced(self) -> bool:
        """Every watch has listed once (the caches hold the cluster, not a first page)."""
        return self._synced.is_set()

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
                await asyncio.sleep(self.troubles.retry_delay)

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
                retry_at = self.troubles.retry_at
                if retry_at is None:
                    retry = self._dirty.everything  # a recomputation is still owed
                else:
                    retry = now >= retry_at
                if retry:
                    try:
                        await self._flush()
                    except self.fatal_errors:
                        raise
                    except Exception as error:
                        await self._failed("internal", "internal_error", error)
                if not self.troubles.own:
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
        detail = self.troubles.failed(what, cause, error)
        self._dirty.everything = True
        retry_at = self.troubles.retry_at
        assert retry_at is not None
        log.warning("kubernetes.sync_failed", what=what, cause=cause, error=detail,
                    retry_in=round(retry_at - time.monotonic(), 1))
        if what != "append":
            with contextlib.suppress(_SinkDown):
                await self._emit_health()

    def _recovered(self, what: str) -> bool:
        if not self.troubles.recovered(what):
            return False
        log.info("kubernetes.sync_recovered", what=what)
        return True

    # -- handling --------------------------------------------------------------------

    async def _handle(self, name: str, item: Relisted | WatchTrouble | WatchRecovered) -> None:
        """A watch item that is not a change (changes go through the inbox)."""
        if isinstance(item, WatchTrouble):
            self.troubles.watch_failing(name, item)
            await self._emit_health()
            return
        if isinstance(item, WatchRecovered):
            self.troubles.watch_ok(name)
            await self._emit_health()
            return
        if isinstance(item, Relisted):
            self.troubles.watch_ok(name)
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
            if self.nodeset_view.changed():
                self._dirty.everything = True
            return
        if name == "nodes":
            self._dirty.nodes.add(event.key)
            return
        if self.pod_index.note(event, self._dirty.nodes):
            pod: PodFacts = event.object
            for pool in self.nodeset_view.parsed():
                if self.nodeset_view.workload_match(pool, pod.labels):
                    self._dirty.pools.add(pool)

    # -- payloads ----------------------------------------------------------------------

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
            out.append(self._payloads.workload(name, labels, nodesets))

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
        nodesets = self.nodeset_view.parsed()
        relevant = frozenset(label.key for ns in nodesets.values() for label in ns.node_selector)
        out: list[Payload] = []
        dirty = self._dirty
        started = time.monotonic()
        with self.nodeset_view.flush_memo(nodesets):
            self._build_payloads(out, dirty, nodesets, relevant)
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
                payload = self._payloads.node(node, nodesets, relevant)
                labels = (node.get("metadata") or {}).get("labels") or {}
                workload = self._payloads.workload(name, labels, nodesets)
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
                out.append(self._payloads.demand(nodeset))
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
        trouble = self.troubles.own.get("append")
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
        if self.troubles.any():
            verdict = self.troubles.verdict()
            if verdict is None:
                return  # a single blip: the loop is already retrying
            status, worst = verdict
            health = SourceHealth(
                source=SOURCE, status=status, cause=worst.cause, detail=worst.detail[:300]
            )
        elif len(self._synced_once) == len(self.watches):
            health = SourceHealth(source=SOURCE, status="fresh")
        else:
            return
        if health.status == "fresh" and (self._dirty.everything
                                        or self.troubles.retry_at is not None):
            return  # a recomputation is pending: fresh only once it went through
        last = self._last.get(("health", SOURCE))
        # Detail text varies from retry to retry; only status and cause make a new event.
        if isinstance(last, SourceHealth) and (last.status, last.cause) == (
            health.status,
            health.cause,
        ):
            return
        await self._emit([health])


def _replace_deleted(last: K8sNodesetObserved) -> K8sNodesetObserved:
    return replace(last, deleted=True)

