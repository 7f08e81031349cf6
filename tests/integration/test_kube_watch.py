"""The list-then-watch loop against the API emulator over HTTP, and its resilience.

The resilience test is the one that matters: after storms of 410s, abruptly dropped
connections and 500s, the cluster view rebuilt from the observation events sunkd appended to a
real event log must equal what the API server holds, and no observation may repeat."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.events import Payload
from sunkd.kubernetes.client import NODES, PODS, KubeClient
from sunkd.kubernetes.listwatch import (
    Backoff,
    ListWatch,
    Relisted,
    WatchEvent,
    WatchItem,
    WatchRecovered,
    WatchTrouble,
)
from sunkd.kubernetes.source import KubernetesSource
from sunkd.store.eventlog import EventLog

from .kube_helpers import (
    ListSink,
    duplicates,
    fold,
    install_crd,
    node_body,
    nodeset_body,
    pod_body,
    running_emulator,
)


@pytest.fixture
async def kube() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with running_emulator(bookmark_interval=0.2) as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            yield emulator, client
        finally:
            await client.close()


class Consumer:
    """Runs a ListWatch in a task and keeps every item."""

    def __init__(self, lw: ListWatch) -> None:
        self.lw = lw
        self.items: list[WatchItem] = []
        self._new = asyncio.Condition()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for item in self.lw.items():
            self.items.append(item)
            async with self._new:
                self._new.notify_all()

    async def wait(self, predicate: Any, within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            async with self._new:
                await self._new.wait_for(lambda: predicate(self.items))

    async def close(self) -> None:
        self.task.cancel()
        with_suppress = asyncio.gather(self.task, return_exceptions=True)
        await with_suppress


def fast(lw_client: KubeClient, **kwargs: Any) -> ListWatch:
    return ListWatch(lw_client, NODES, backoff=Backoff(initial=0.02, maximum=0.1), **kwargs)


async def test_list_then_watch_with_bookmarks_and_server_timeouts(
    kube: tuple[Any, KubeClient],
) -> None:
    emulator, client = kube
    for i in range(5):
        emulator.create(node_body(f"n{i}"))
    consumer = Consumer(fast(client, page_size=2, watch_timeout=1))
    try:
        await consumer.wait(lambda items: any(isinstance(i, Relisted) for i in items))
        first = consumer.items[0]
        assert isinstance(first, Relisted) and first.initial and first.objects == 5
        assert {e.key for e in first.events} == {f"n{i}" for i in range(5)}
        assert {e.type for e in first.events} == {"ADDED"}

        emulator.patch("nodes", "n1", {"metadata": {"labels": {"x": "1"}}})
        emulator.delete("nodes", "n2")
        emulator.create(node_body("n9"))
        await consumer.wait(lambda items: sum(isinstance(i, WatchEvent) for i in items) >= 3)
        events = [i for i in consumer.items if isinstance(i, WatchEvent)]
        assert [(e.type, e.key) for e in events] == [
            ("MODIFIED", "n1"), ("DELETED", "n2"), ("ADDED", "n9")]

        # Bookmarks advance the resourceVersion; the server ends each watch after
        # timeoutSeconds (1-2 s here) and the loop resumes without relisting.
        await asyncio.sleep(2.5)
        stats = consumer.lw.stats
        assert stats.bookmarks > 0
        assert stats.watches >= 2
        assert stats.lists == 1
        assert consumer.lw.resource_version == str(emulator.resource_version)
        assert not any(isinstance(i, WatchTrouble) for i in consumer.items)
    finally:
        await consumer.close()


async def test_410_relists_and_reports_deletions_missed(kube: tuple[Any, KubeClient]) -> None:
    emulator, client = kube
    for name in ("a", "b", "c"):
        emulator.create(node_body(name))
    consumer = Consumer(fast(client))
    try:
        await consumer.wait(lambda items: len(items) >= 1)
        await asyncio.sleep(0.1)  # the watch is open
        # While the connection is down, b is deleted and c changes; by the time the client
        # reconnects its resourceVersion has been compacted away.
        emulator.force_410()
        emulator.drop_watches()
        emulator.delete("nodes", "b")
        emulator.patch("nodes", "c", {"metadata": {"labels": {"x": "1"}}})
        await consumer.wait(lambda items: sum(isinstance(i, Relisted) for i in items) >= 2)
        relist = [i for i in consumer.items if isinstance(i, Relisted)][1]
        assert not relist.initial
        assert sorted((e.type, e.key) for e in relist.events) == [
            ("DELETED", "b"), ("MODIFIED", "c")]
        assert set(consumer.lw.cache) == {"a", "c"}
        assert consumer.lw.stats.gone == 1
        troubles = [i for i in consumer.items if isinstance(i, WatchTrouble)]
        assert [t.cause for t in troubles] == ["connection"]
        assert any(isinstance(i, WatchRecovered) for i in consumer.items)
    finally:
        await consumer.close()


async def test_http_410_on_list_continue_restarts_the_list(kube: tuple[Any, KubeClient]) -> None:
    emulator, client = kube
    for i in range(6):
        emulator.create(node_body(f"n{i}"))
    emulator.fail_next(1, 410, method="GET", path_contains="/api/v1/nodes")
    consumer = Consumer(fast(client, page_size=2))
    try:
        await consumer.wait(lambda items: any(isinstance(i, Relisted) for i in items))
        relisted = next(i for i in consumer.items if isinstance(i, Relisted))
        assert relisted.objects == 6
    finally:
        await consumer.close()


async def test_throttling_honours_retry_after(kube: tuple[Any, KubeClient]) -> None:
    emulator, client = kube
    emulator.create(node_body("n0"))
    emulator.fail_next(1, 429, retry_after=1)
    consumer = Consumer(fast(client))
    try:
        started = asyncio.get_running_loop().time()
        await consumer.wait(lambda items: any(isinstance(i, Relisted) for i in items))
        assert asyncio.get_running_loop().time() - started >= 0.9
        trouble = next(i for i in consumer.items if isinstance(i, WatchTrouble))
        assert trouble.cause == "throttled"
    finally:
        await consumer.close()


# ------------------------------------------------------------------------- resilience


async def test_state_survives_fault_storms(kube: tuple[Any, KubeClient], tmp_path: Path) -> None:
    emulator, client = kube
    rt = await install_crd(client)
    rng = random.Random(int(os.environ.get("SUNKD_STORM_SEED", "4")))
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    emulator.create(nodeset_body("ml", "pool", node_selector={"pool": "a"},
                                 workload_selector={"app": "w"}, group=rt.group,
                                 version=rt.version), "ml")
    nodes = [f"n{i:02d}" for i in range(20)]
    for i, name in enumerate(nodes):
        emulator.create(node_body(name, {"pool": "a" if i < 15 else "b"}))
    pods: list[str] = []
    for i in range(40):
        name = f"p{i:02d}"
        body = pod_body("ml", name, {"app": "w" if i % 3 else "x"},
                        node=nodes[i % 20] if i % 5 else None)
        body["status"] = {"phase": "Running" if i % 5 else "Pending"}
        emulator.create(body, "ml")
        pods.append(name)

    log = await EventLog.open(f"sqlite+aiosqlite:///{tmp_path / 'events.db'}")
    lease = await log.acquire("kube-storm-test", lease_seconds=600)
    assert lease is not None

    async def sink(batch: Any) -> None:
        await log.append(list(batch), epoch=lease.epoch)

    source = KubernetesSource(client, sink, nodeset_resource=rt, idle_timeout=5,
                              watch_timeout=2)
    for lw in source.watches.values():
        lw.backoff = Backoff(initial=0.02, maximum=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await source.wait_synced(10)

        def mutate() -> None:
            roll = rng.random()
            node = rng.choice(nodes)
            if roll < 0.2:
                emulator.patch("nodes", node, {"metadata": {"labels": {
                    "pool": rng.choice(["a", "b"])}}})
            elif roll < 0.35:
                taints = [{"key": f"example.com/t{rng.randint(0, 2)}", "effect": "NoSchedule"}]
                emulator.patch("nodes", node, {"spec": {"taints": rng.choice([taints, None])}})
            elif roll < 0.45:
                emulator.patch("nodes", node, {"spec": {"unschedulable": rng.random() < 0.5}})
            elif roll < 0.55:
                emulator.heartbeat_node(node)
            elif roll < 0.65 and len(nodes) > 10:
                nodes.remove(node)
                emulator.delete("nodes", node)
            elif roll < 0.72:
                name = f"n{rng.randint(20, 99)}"
                if name not in nodes:
                    nodes.append(name)
                    emulator.create(node_body(name, {"pool": "a"}))
            elif roll < 0.82 and pods:
                pod = rng.choice(pods)
                emulator.patch("pods", pod, {"status": {"phase": rng.choice(
                    ["Running", "Succeeded", "Failed"])}}, "ml", subresource="status")
            elif roll < 0.9 and pods:
                pod = pods.pop(rng.randrange(len(pods)))
                emulator.delete("pods", pod, "ml", grace_period_seconds=0)
            else:
                name = f"q{rng.randint(0, 10**6)}"
                body = pod_body("ml", name, {"app": "w"},
                                node=rng.choice(nodes) if rng.random() < 0.5 else None)
                body["status"] = {"phase": "Pending"}
                emulator.create(body, "ml")
                pods.append(name)

        for round_ in range(30):
            if round_ == 10:
                # A Nodeset change in the middle of the weather (it recomputes everything, so
                # it must not come last: that would mask a missed deletion).
                emulator.patch(rt.plural, "pool", {"spec": {"nodeSelector": {"pool": "b"}}},
                               "ml")
            for _ in range(rng.randint(1, 6)):
                mutate()
            fault = round_ % 3
            if fault == 0:
                emulator.force_410(rng.randint(1, 3))
                emulator.drop_watches()
            elif fault == 1:
                emulator.drop_watches(abrupt=True)
            else:
                emulator.fail_next(rng.randint(1, 4), rng.choice([500, 503]))
                emulator.drop_watches(abrupt=rng.random() < 0.5)
            for _ in range(rng.randint(0, 4)):
                mutate()
            await asyncio.sleep(rng.uniform(0.0, 0.08))

        stats = {name: lw.stats for name, lw in source.watches.items()}
        assert sum(s.gone for s in stats.values()) > 0
        assert sum(s.failures for s in stats.values()) > 0
        # Resuming from the last resourceVersion is exact: nothing was replayed to us.
        assert sum(s.duplicates for s in stats.values()) == 0

        # The truth: a fresh source listing the quiet cluster.
        async def truth() -> dict[tuple[str, str], Payload]:
            fresh_sink = ListSink()
            fresh = KubernetesSource(client, fresh_sink, nodeset_resource=rt)
            fresh_stop = asyncio.Event()
            fresh_task = asyncio.create_task(fresh.run(fresh_stop))
            try:
                await fresh.wait_synced(10)
                await fresh.wait_idle(10)
            finally:
                fresh_stop.set()
                await asyncio.wait_for(fresh_task, 10)
            return fold(fresh_sink.payloads())

        expected = await truth()
        observed: dict[tuple[str, str], Payload] = {}
        for attempt in range(200):
            recorded = await log.read(after_seq=0, limit=100_000)
            payloads = [r.payload for r in recorded if r.kind.startswith(("k8s.", "source."))]
            observed = fold(payloads)
            health_now = [r.payload for r in recorded if r.kind == "source.health"]
            if observed == expected and getattr(health_now[-1], "status", None) == "fresh":
                break
            if attempt % 20 == 19:
                # On a loaded machine the reference source itself may have been stale
                # when it was sampled: take the truth again.
                expected = await truth()
            await asyncio.sleep(0.1)
        assert observed == expected
        assert duplicates(payloads) == []
        # Independent of the normalizer: the nodes the log says exist are the API's nodes.
        api_nodes = {n["metadata"]["name"] for n in (await client.list(NODES))[0]}
        assert {key[1] for key in observed if key[0] == "node"} == api_nodes
        api_pods = {p["metadata"]["name"] for p in (await client.list(PODS))[0]}
        assert set(source.pods) == {f"ml/{name}" for name in api_pods}
        health = [r.payload for r in recorded if r.kind == "source.health"]
        assert health and getattr(health[-1], "status", None) == "fresh"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await log.close()
