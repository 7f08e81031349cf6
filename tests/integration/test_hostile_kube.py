"""Hostile input to the Kubernetes source: each test reproduces one defect of the
fault run against the API emulator, and checks that the source survives it.

- 12.1: an append failure (or one object whose observation the log refuses) never ends the
  source; the source reports itself stale with a cause and recovers by itself.
- 12.3: a NUL or other control character in a Node annotation or label never reaches the
  log (PostgreSQL's JSONB refuses `\\u0000`); strings are sanitised per field.
- 12.10: a watch event without `metadata.name` is rejected (no node "" or pool "/"), and a
  watch line over 4 MiB makes the source stale with a cause and relist, instead of killing it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sunkd.domain.events import (
    Event,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Payload,
    SourceHealth,
)
from sunkd.kubernetes.client import NODES, PODS, KubeClient, ResourceType
from sunkd.kubernetes.source import KubernetesSource
from sunkd.store.eventlog import EventLog, StaleLeaderError
from sunkd_testbed.kubeapi import KubeAPIEmulator
from sunkd_testbed.kubeapi.store import HistoryEvent

from .kube_helpers import (
    ListSink,
    create_node,
    ensure_namespace,
    install_crd,
    nodeset_body,
    pod_body,
    running_emulator,
)


@pytest.fixture
async def kube() -> AsyncIterator[tuple[KubeAPIEmulator, KubeClient, ResourceType]]:
    async with running_emulator(bookmark_interval=0.2) as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            rt = await install_crd(client)
            await ensure_namespace(client, "ml")
            await client.create(rt, nodeset_body(
                "ml", "gpu", node_selector={"pool": "gpu"}, workload_selector={"app": "serve"},
                group=rt.group, version=rt.version), "ml")
            await create_node(client, "k1", {"pool": "gpu"})
            yield emulator, client, rt
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def running_source(client: KubeClient, rt: ResourceType, sink: Any,
                         **kwargs: Any) -> AsyncIterator[tuple[KubernetesSource,
                                                               asyncio.Task[None]]]:
    source = KubernetesSource(client, sink, nodeset_resource=rt, watch_timeout=30, **kwargs)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        yield source, task
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        if not task.done():
            task.cancel()


async def eventually(predicate: Any, within: float = 15.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def observed(payloads: Sequence[Payload], node: str) -> list[K8sNodeObserved]:
    return [p for p in payloads if isinstance(p, K8sNodeObserved) and p.node == node]


def health(payloads: Sequence[Payload]) -> list[SourceHealth]:
    return [p for p in payloads if isinstance(p, SourceHealth)]


# ------------------------------------------------------------------------------ 12.3


def _has_control(value: Any) -> bool:
    if isinstance(value, str):
        return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
                   for c in value)
    if isinstance(value, dict):
        return any(_has_control(k) or _has_control(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_control(v) for v in value)
    return False


async def test_nul_in_node_annotation_never_reaches_the_log_on_postgres(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType], postgres_url: str) -> None:
    """12.3: `sunkd.io/pin: "x\\u0000"` used to make the JSONB append fail and kill the
    source task (the leader then stepped down and was re-elected every 15 s)."""
    _emulator, client, rt = kube
    await client.merge_patch(NODES, "k1", {
        "metadata": {"annotations": {"sunkd.io/pin": "x\u0000"},
                     "labels": {"sunkd.io/note": "a\u0000b\u001b[31m\ud800"}},
        "spec": {"taints": [{"key": "t", "value": "v\u0000", "effect": "NoSchedule"}]}})
    event_log = await EventLog.open(postgres_url, migrate=True)
    try:
        lease = await event_log.acquire("hostile-kube")
        assert lease is not None

        async def sink(events: Sequence[Event]) -> object:
            return await event_log.append(events, lease.epoch)

        async with running_source(client, rt, sink) as (source, task):
            await source.wait_synced(15)
            await source.wait_idle(10)
            await create_node(client, "k2", {"pool": "gpu"})  # later changes still flow

            async def logged() -> list[Payload]:
                return [e.payload async for batch in event_log.read_range() for e in batch]

            for _ in range(200):
                if observed(await logged(), "k2"):
                    break
                await asyncio.sleep(0.05)
            assert not task.done(), task.exception() if task.done() else None
            payloads = await logged()
            (k1,) = observed(payloads, "k1")
            assert k1.pin == "x\ufffd"  # sanitised, still visible as a (meaningless) pin
            assert observed(payloads, "k2")
        # Nothing with a control character reached the log, whatever the field.
        async with event_log.engine.connect() as connection:
            from sqlalchemy import text
            rows = (await connection.execute(text(
                "SELECT payload::text FROM events WHERE kind LIKE 'k8s.%'"))).scalars().all()
        import json
        assert rows and not any(_has_control(json.loads(row)) for row in rows)
    finally:
        await event_log.close()


# ------------------------------------------------------------------------------ 12.1


class FlakySink(ListSink):
    """A ListSink that fails every batch while `down` is set, and any batch containing an
    observation of one of `poison` (a node whose observation the log always refuses)."""

    def __init__(self, poison: Sequence[str] = ()) -> None:
        super().__init__()
        self.down = False
        self.poison = set(poison)
        self.failures = 0

    async def __call__(self, batch: Sequence[Event]) -> None:
        if self.down or any(isinstance(e.payload, K8sNodeObserved)
                            and e.payload.node in self.poison for e in batch):
            self.failures += 1
            raise RuntimeError("append refused: simulated database error")
        await super().__call__(batch)


async def test_append_failure_makes_kube_source_stale_and_it_recovers(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """12.1: a failed append used to end `KubernetesSource.run()` (and the leadership term).
    Now the source keeps running, reports `stale` with cause `append_failed` as soon as the
    log takes an event again, and catches up with everything it could not append."""
    _emulator, client, rt = kube
    sink = FlakySink()
    async with running_source(client, rt, sink) as (source, task):
        await source.wait_synced(15)
        await source.wait_idle(10)
        sink.down = True
        await create_node(client, "k2", {"pool": "gpu"})
        await eventually(lambda: sink.failures >= 1, what="a failed append")
        await asyncio.sleep(1.5)  # retries fail too
        assert not task.done(), task.exception() if task.done() else None
        sink.down = False
        await eventually(lambda: observed(sink.payloads(), "k2"), what="k2 after recovery")
        await eventually(lambda: health(sink.payloads())[-1].status == "fresh",
                         what="fresh again")
        # The log was told that the source had been stale, and why, before the catch-up.
        assert any(h.status == "stale" and h.cause == "append_failed"
                   for h in health(sink.payloads()))
        assert not task.done()


async def test_one_unappendable_observation_never_stops_the_kube_source(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """12.1: one object whose observation the log refuses must not stop the source (it used
    to end `run()` on the first flush): it is rejected with a cause and everything else
    is observed; the source stays fresh."""
    _emulator, client, rt = kube
    await create_node(client, "poison", {"pool": "gpu"})
    sink = FlakySink(poison=["poison"])
    async with running_source(client, rt, sink) as (source, task):
        await source.wait_synced(15)
        await source.wait_idle(10)
        await create_node(client, "k3", {"pool": "gpu"})
        await eventually(lambda: observed(sink.payloads(), "k3"), what="k3")
        assert observed(sink.payloads(), "k1")
        assert not observed(sink.payloads(), "poison")
        assert not task.done()
        assert source.rejected_observations() == ["poison"]
        assert health(sink.payloads())[-1].status == "fresh"


class PodRefusingSink(ListSink):
    """A log that refuses any pod report naming one pod (its text, say, is too long)."""

    def __init__(self, pod: str) -> None:
        super().__init__()
        self.pod = pod

    async def __call__(self, batch: Sequence[Event]) -> None:
        if any(isinstance(e.payload, K8sWorkloadObserved)
               and any(p.name == self.pod for p in e.payload.pods) for e in batch):
            raise RuntimeError("append refused: simulated database error")
        await super().__call__(batch)


async def test_a_refused_pod_report_makes_the_nodes_pods_unknown_not_stale(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """Unknown is not none: when the log refuses a Node's pod report, the Node's last
    recorded list (empty here) must not stand as current; the source records the pods
    as unknown (a report with `complete=False`), which the fold reads as UNKNOWN."""
    _emulator, client, rt = kube
    sink = PodRefusingSink("refused")
    async with running_source(client, rt, sink) as (source, task):
        await source.wait_synced(15)
        await source.wait_idle(10)
        await client.create(PODS, pod_body("ml", "refused", {"app": "serve"}, node="k1"), "ml")

        def reports() -> list[K8sWorkloadObserved]:
            return [p for p in sink.payloads(K8sWorkloadObserved)
                    if isinstance(p, K8sWorkloadObserved) and p.node == "k1"]

        await eventually(lambda: not reports()[-1].complete, what="pods unknown on k1")
        assert reports()[0].complete and reports()[0].pods == ()
        await asyncio.sleep(1.0)  # the refused report waits for its retry: no churn
        assert sum(1 for r in reports() if not r.complete) == 1
        assert not task.done()


async def test_a_fenced_append_still_ends_the_kube_source(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """The one failure that must end the source: the log refusing a deposed leader's epoch
    (the term is over, the next leader's source takes over from the log)."""
    _emulator, client, rt = kube

    async def fenced(_batch: Sequence[Event]) -> None:
        raise StaleLeaderError("append with epoch 1 refused: the current epoch is 2")

    async with running_source(client, rt, fenced, fatal_errors=(StaleLeaderError,)) as (
            _source, task):
        with pytest.raises(StaleLeaderError):
            await asyncio.wait_for(task, 15)


# ----------------------------------------------------------------------------- 12.10


def inject(emulator: KubeAPIEmulator, plural: str, kind: str, obj: dict[str, Any]) -> int:
    """Put a raw event on every open watch of `plural`, as a broken or hostile API server
    (or proxy) would send it: the emulator's own validation never sees it."""
    count = 0
    for active in list(emulator._watches):
        watcher = active.watcher
        if watcher.rt.plural == plural:
            watcher.queue.put_nowait(HistoryEvent(emulator.store.rv, watcher.rt.key, kind,
                                                  obj, None))
            count += 1
    return count


async def test_watch_event_without_metadata_name_is_rejected(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """12.10: a watch event without `metadata.name` used to be recorded as node "" (and a
    Nodeset without name and namespace as pool "/")."""
    emulator, client, rt = kube
    sink = ListSink()
    async with running_source(client, rt, sink) as (source, task):
        await source.wait_synced(15)
        await source.wait_idle(10)
        await eventually(lambda: emulator.open_watch_count() >= 3, what="three watches")
        rv = str(emulator.store.rv + 1)
        assert inject(emulator, "nodes", "ADDED", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"resourceVersion": rv, "labels": {"pool": "gpu"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        # Named, but with fields of the wrong shape (a real server's schema forbids them).
        assert inject(emulator, "nodes", "ADDED", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "weird", "resourceVersion": rv, "labels": {"pool": "gpu"}},
            "spec": {"taints": "oops"}, "status": {"conditions": {"type": "Ready"}}})
        assert inject(emulator, rt.plural, "ADDED", {
            "apiVersion": rt.api_version, "kind": "Nodeset",
            "metadata": {"resourceVersion": rv},
            "spec": {"nodeSelector": {"pool": "gpu"}}})
        await create_node(client, "k2", {"pool": "gpu"})  # the stream goes on after them
        await eventually(lambda: observed(sink.payloads(), "k2"), what="k2")
        await source.wait_idle(10)
        assert not observed(sink.payloads(), "")
        assert not observed(sink.payloads(), "weird")
        pools = {p.pool for p in sink.payloads() if isinstance(p, K8sNodesetObserved)}
        assert pools == {"ml/gpu"}
        assert not task.done()
        assert source.watches["nodes"].stats.rejected >= 2
        assert source.watches["nodesets"].stats.rejected >= 1


async def test_watch_line_over_4_mib_makes_kube_source_stale_and_relist(
        kube: tuple[KubeAPIEmulator, KubeClient, ResourceType]) -> None:
    """12.10: a watch line over 4 MiB used to raise aiohttp's LineTooLong out of the watch
    loop and end the source. Now the line is bounded: the source reports stale with cause
    `too_large`, relists (the list has no line limit), and is fresh again."""
    _emulator, client, rt = kube
    sink = ListSink()
    async with running_source(client, rt, sink) as (source, task):
        await source.wait_synced(15)
        await source.wait_idle(10)
        huge = "x" * (5 * 1024 * 1024)
        await client.merge_patch(NODES, "k1", {"metadata": {"annotations": {
            "sunkd.io/pin": huge}}})
        await eventually(lambda: any(h.cause == "too_large" for h in health(sink.payloads())),
                         what="stale with cause too_large")
        await eventually(lambda: health(sink.payloads())[-1].status == "fresh",
                         what="fresh after the relist")
        assert not task.done(), task.exception() if task.done() else None
        pins = [p.pin for p in observed(sink.payloads(), "k1") if p.pin]
        # The relist saw the new object; its 5 MiB annotation is bounded before the log.
        assert pins and all(len(pin) <= 1024 for pin in pins)
