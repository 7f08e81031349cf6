"""The list-then-watch loop over HTTP and its resilience, on both backends (the API
emulator and the real kube-apiserver; tests/integration/kube_backends.py).

The resilience test is the one that matters: after storms of 410s, abruptly dropped
connections (and, on the emulator, 500s), the cluster view rebuilt from the observation
events sunkd appended to a real event log must equal what the API server holds, and no
observation may repeat. On the real server the faults are real: a TCP proxy that cuts
every connection, and kube-apiserver restarted (its new watch cache answers the client's
old resourceVersion with 410 Expired)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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

from .kube_backends import CuttingProxy, Kube, proxied_client
from .kube_helpers import (
    create_node,
    duplicates,
    ensure_namespace,
    fold,
    install_crd,
    node_body,
    nodeset_body,
    pod_body,
    retrying,
    running_source,
)

EMULATOR_OPTIONS = {"bookmark_interval": 0.2}


@pytest.fixture
async def watched(kube: Kube, tmp_path: Path) -> AsyncIterator[tuple[Kube, KubeClient,
                                                                     CuttingProxy | None]]:
    """(backend, the client under test, the proxy in front of the real server or None).
    On the real server the client goes through a CuttingProxy, so a test can cut it."""
    if kube.emulator is not None:
        yield kube, kube.client, None
        return
    async with proxied_client(kube, tmp_path) as (proxy, client):
        yield kube, client, proxy


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


def rv_of(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


async def test_list_then_watch_with_bookmarks_and_server_timeouts(
    watched: tuple[Kube, KubeClient, CuttingProxy | None],
) -> None:
    kube, client, _ = watched
    admin = kube.client
    for i in range(5):
        await create_node(admin, f"n{i}")
    # A real server sends a watch's bookmark 2 s before its deadline (cacher's
    # nextBookmarkTime), so its watches must last longer than that; the emulator
    # bookmarks every 0.2 s here.
    timeout = 1 if kube.emulator is not None else 3
    consumer = Consumer(fast(client, page_size=2, watch_timeout=timeout))
    try:
        await consumer.wait(lambda items: any(isinstance(i, Relisted) for i in items))
        first = consumer.items[0]
        assert isinstance(first, Relisted) and first.initial and first.objects == 5
        assert {e.key for e in first.events} == {f"n{i}" for i in range(5)}
        assert {e.type for e in first.events} == {"ADDED"}

        await admin.merge_patch(NODES, "n1", {"metadata": {"labels": {"x": "1"}}})
        await admin.delete(NODES, "n2")
        created = await create_node(admin, "n9")
        await consumer.wait(lambda items: sum(isinstance(i, WatchEvent) for i in items) >= 3)
        events = [i for i in consumer.items if isinstance(i, WatchEvent)]
        assert [(e.type, e.key) for e in events][:3] == [
            ("MODIFIED", "n1"), ("DELETED", "n2"), ("ADDED", "n9")]

        # Bookmarks advance the resourceVersion; the server ends each watch after
        # timeoutSeconds and the loop resumes without relisting.
        stats = consumer.lw.stats
        deadline = time.monotonic() + 4 * timeout + 5
        while not (stats.bookmarks > 0 and stats.watches >= 2):
            assert time.monotonic() < deadline, f"no bookmark and resumed watch: {stats}"
            await asyncio.sleep(0.1)
        assert stats.lists == 1
        # At least as new as the last change (the real server's bookmarks carry its
        # watch cache's revision, which other writers move on; the emulator's is its own).
        assert int(consumer.lw.resource_version) >= rv_of(created)
        if kube.emulator is not None:
            assert consumer.lw.resource_version == str(kube.emulator.resource_version)
        assert not any(isinstance(i, WatchTrouble) for i in consumer.items)
    finally:
        await consumer.close()


async def test_410_relists_and_reports_deletions_missed(
    watched: tuple[Kube, KubeClient, CuttingProxy | None],
) -> None:
    """While the client is cut off, b is deleted and c changes; by the time it reconnects
    its resourceVersion is gone (the emulator: a forced 410; the real server: restarted, so
    its new watch cache starts after that version). The relist reports both."""
    kube, client, proxy = watched
    admin = kube.client
    for name in ("a", "b", "c"):
        await create_node(admin, name)
    # On the real server the client is refused for the ~2 s of the restart: without this,
    # five failures in a row would make it relist of its own accord, before any 410.
    consumer = Consumer(fast(client, relist_after_failures=10**6))
    try:
        await consumer.wait(lambda items: len(items) >= 1)
        await asyncio.sleep(0.1)  # the watch is open
        if kube.emulator is not None:
            kube.emulator.force_410()
            kube.emulator.drop_watches()
        else:
            assert proxy is not None and kube.plane is not None
            proxy.cut(refuse=True)
        await admin.delete(NODES, "b")
        await admin.merge_patch(NODES, "c", {"metadata": {"labels": {"x": "1"}}})
        if proxy is not None and kube.plane is not None:
            await asyncio.to_thread(kube.plane.restart_apiserver)
            proxy.resume()
        await consumer.wait(lambda items: sum(isinstance(i, Relisted) for i in items) >= 2,
                            within=30)
        relist = [i for i in consumer.items if isinstance(i, Relisted)][1]
        assert not relist.initial
        assert sorted((e.type, e.key) for e in relist.events) == [
            ("DELETED", "b"), ("MODIFIED", "c")]
        assert set(consumer.lw.cache) == {"a", "c"}
        assert consumer.lw.stats.gone == 1
        troubles = [i for i in consumer.items if isinstance(i, WatchTrouble)]
        assert troubles and {t.cause for t in troubles} == {"connection"}
        assert any(isinstance(i, WatchRecovered) for i in consumer.items)
        if kube.emulator is not None:
            assert len(troubles) == 1
    finally:
        await consumer.close()


async def test_cut_watch_resumes_exactly(
    watched: tuple[Kube, KubeClient, CuttingProxy | None],
) -> None:
    """A watch cut mid-stream (the emulator drops it; on the real server a proxy closes the
    TCP connection) resumes from the last resourceVersion: what changed meanwhile arrives
    as watch events, once each, without a relist."""
    kube, client, proxy = watched
    admin = kube.client
    for name in ("a", "b", "c"):
        await create_node(admin, name)
    # Refused reconnects must not add up to the failure count that relists by itself.
    consumer = Consumer(fast(client, relist_after_failures=10**6))
    try:
        await consumer.wait(lambda items: len(items) >= 1)
        await asyncio.sleep(0.1)
        if kube.emulator is not None:
            kube.emulator.drop_watches(abrupt=True)
        else:
            assert proxy is not None
            proxy.cut(refuse=True)
        await admin.delete(NODES, "b")
        await admin.merge_patch(NODES, "c", {"metadata": {"labels": {"x": "1"}}})
        if proxy is not None:
            await asyncio.sleep(0.3)  # a reconnect attempt or two is refused
            proxy.resume()
        await consumer.wait(lambda items: sum(isinstance(i, WatchEvent) for i in items) >= 2)
        events = [(i.type, i.key) for i in consumer.items if isinstance(i, WatchEvent)]
        assert events == [("DELETED", "b"), ("MODIFIED", "c")]
        stats = consumer.lw.stats
        assert (stats.lists, stats.gone, stats.duplicates) == (1, 0, 0)
        assert stats.failures >= 1
    finally:
        await consumer.close()


@pytest.mark.emulator_only("an injected 410 on a LIST continuation")
async def test_http_410_on_list_continue_restarts_the_list(kube: Kube) -> None:
    emulator, client = kube.faults, kube.client
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


@pytest.mark.emulator_only("an injected 429 with Retry-After")
async def test_throttling_honours_retry_after(kube: Kube) -> None:
    emulator, client = kube.faults, kube.client
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


async def test_state_survives_fault_storms(
    watched: tuple[Kube, KubeClient, CuttingProxy | None], tmp_path: Path
) -> None:
    kube, client, proxy = watched
    admin = kube.client
    rt = await install_crd(admin)
    rng = random.Random(int(os.environ.get("SUNKD_STORM_SEED", "4")))
    await ensure_namespace(admin, "ml")
    await admin.create(rt, nodeset_body("ml", "pool", node_selector={"pool": "a"},
                                        workload_selector={"app": "w"}, group=rt.group,
                                        version=rt.version), "ml")
    nodes = [f"n{i:02d}" for i in range(20)]
    await asyncio.gather(*(create_node(admin, name, {"pool": "a" if i < 15 else "b"})
                           for i, name in enumerate(nodes)))

    async def create_pod(name: str, labels: dict[str, str], node: str | None,
                         phase: str) -> None:
        body = pod_body("ml", name, labels, node=node)
        await retrying(lambda: admin.create(PODS, body, "ml"))
        # Creation resets a pod's status: write it the way the kubelet does.
        status = {"status": {"phase": phase}}
        await retrying(lambda: admin.merge_patch(PODS, name, status, "ml",
                                                 subresource="status"))

    pods: list[str] = [f"p{i:02d}" for i in range(40)]
    await asyncio.gather(*(
        create_pod(name, {"app": "w" if i % 3 else "x"}, nodes[i % 20] if i % 5 else None,
                   "Running" if i % 5 else "Pending") for i, name in enumerate(pods)))

    log = await EventLog.open(f"sqlite+aiosqlite:///{tmp_path / 'events.db'}")
    lease = await log.acquire("kube-storm-test", lease_seconds=600)
    assert lease is not None

    async def sink(batch: Any) -> None:
        await log.append(list(batch), epoch=lease.epoch)

    source = KubernetesSource(client, sink, nodeset_resource=rt, idle_timeout=5,
                              watch_timeout=2)
    for lw in source.watches.values():
        lw.backoff = Backoff(initial=0.02, maximum=0.2)
        if proxy is not None:
            # Through a restart the watch must resume (and meet the 410), not relist early
            # because the refused reconnects added up.
            lw.relist_after_failures = 10**6
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await source.wait_synced(10)

        async def mutate() -> None:
            # Through HTTP on both backends, so the emulator's injected failures hit these
            # writes too: `retrying` retries 5xx and 429 (an injected failure changes nothing).
            roll = rng.random()
            node = rng.choice(nodes)
            if roll < 0.2:
                labels = {"metadata": {"labels": {"pool": rng.choice(["a", "b"])}}}
                await retrying(lambda: admin.merge_patch(NODES, node, labels))
            elif roll < 0.35:
                taints = [{"key": f"example.com/t{rng.randint(0, 2)}", "effect": "NoSchedule"}]
                spec = {"spec": {"taints": rng.choice([taints, None])}}
                await retrying(lambda: admin.merge_patch(NODES, node, spec))
            elif roll < 0.45:
                cordon = {"spec": {"unschedulable": rng.random() < 0.5}}
                await retrying(lambda: admin.merge_patch(NODES, node, cordon))
            elif roll < 0.55:  # a kubelet heartbeat: a new resourceVersion, nothing else
                beat = {"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": f"2026-01-01T00:{rng.randint(0, 59):02d}:00Z"}]}}
                await retrying(lambda: admin.merge_patch(NODES, node, beat,
                                                         subresource="status"))
            elif roll < 0.65 and len(nodes) > 10:
                nodes.remove(node)
                await retrying(lambda: admin.delete(NODES, node))
            elif roll < 0.72:
                name = f"n{rng.randint(20, 99)}"
                if name not in nodes:
                    nodes.append(name)
                    body = node_body(name, {"pool": "a"})
                    await retrying(lambda: admin.create(NODES, body))
            elif roll < 0.82 and pods:
                pod = rng.choice(pods)
                phase = {"status": {"phase": rng.choice(["Running", "Succeeded", "Failed"])}}
                await retrying(lambda: admin.merge_patch(PODS, pod, phase, "ml",
                                                         subresource="status"))
            elif roll < 0.9 and pods:
                pod = pods.pop(rng.randrange(len(pods)))
                await retrying(lambda: admin.delete(PODS, pod, "ml", grace_period_seconds=0))
            else:
                name = f"q{rng.randint(0, 10**6)}"
                await create_pod(name, {"app": "w"},
                                 rng.choice(nodes) if rng.random() < 0.5 else None, "Pending")
                pods.append(name)

        fault: Callable[[int], Awaitable[None]]
        restarts: tuple[int, ...]
        if kube.emulator is not None:
            emulator = kube.emulator

            async def emulator_fault(round_: int) -> None:
                kind = round_ % 3
                if kind == 0:
                    emulator.force_410(rng.randint(1, 3))
                    emulator.drop_watches()
                elif kind == 1:
                    emulator.drop_watches(abrupt=True)
                else:
                    emulator.fail_next(rng.randint(1, 4), rng.choice([500, 503]))
                    emulator.drop_watches(abrupt=rng.random() < 0.5)

            fault, rounds, restarts = emulator_fault, 30, ()
        else:
            assert proxy is not None
            cutter = proxy

            async def real_fault(round_: int) -> None:
                # Every connection cut; some rounds keep the client out a moment longer.
                cutter.cut(refuse=round_ % 2 == 1)

            fault, rounds, restarts = real_fault, 16, (5, 11)

        for round_ in range(rounds):
            if round_ == rounds // 3:
                # A Nodeset change in the middle of the weather (it recomputes everything, so
                # it must not come last: that would mask a missed deletion).
                await admin.merge_patch(rt, "pool", {"spec": {"nodeSelector": {"pool": "b"}}},
                                        "ml")
            for _ in range(rng.randint(1, 6)):
                await mutate()
            await fault(round_)
            for _ in range(rng.randint(0, 4)):
                await mutate()
            if round_ in restarts:
                # While the client is cut off the server restarts: the resourceVersion it
                # resumes from is older than the new watch cache (410 Expired, a relist).
                assert kube.plane is not None and proxy is not None
                proxy.cut(refuse=True)
                await mutate()
                await asyncio.to_thread(kube.plane.restart_apiserver)
            if proxy is not None:
                await asyncio.sleep(rng.uniform(0.0, 0.08))
                proxy.resume()
            await asyncio.sleep(rng.uniform(0.0, 0.08))

        stats = {name: lw.stats for name, lw in source.watches.items()}
        assert sum(s.gone for s in stats.values()) > 0
        assert sum(s.failures for s in stats.values()) > 0
        # Resuming from the last resourceVersion is exact: nothing was replayed to us.
        assert sum(s.duplicates for s in stats.values()) == 0

        # The truth: a fresh source listing the quiet cluster.
        async def truth() -> dict[tuple[str, str], Payload]:
            async with running_source(admin, rt) as (_fresh, fresh_sink):
                pass  # synced and idle: it has listed everything
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
                # when it was sampled (or, on the real server, a controller still writing):
                # take the truth again.
                expected = await truth()
            await asyncio.sleep(0.1)
        assert observed == expected
        assert duplicates(payloads) == []
        # Independent of the normalizer: the nodes the log says exist are the API's nodes.
        api_nodes = {n["metadata"]["name"] for n in (await admin.list(NODES))[0]}
        assert {key[1] for key in observed if key[0] == "node"} == api_nodes
        api_pods = {p["metadata"]["name"] for p in (await admin.list(PODS, namespace="ml"))[0]}
        assert set(source.pods) == {f"ml/{name}" for name in api_pods}
        health = [r.payload for r in recorded if r.kind == "source.health"]
        assert health and getattr(health[-1], "status", None) == "fresh"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await log.close()


async def test_the_watch_keeps_no_list_once_handed_over(kube: Kube) -> None:
    """The informer's frame lives as long as its watch: it must not keep the list it
    handed over (at 100,000 pods the list and its events were ~20 MB kept for
    the watch's lifetime). Only the cache holds the objects."""
    import gc

    client = kube.client
    for i in range(4):
        await create_node(client, f"n{i}")
    lw = fast(client, watch_timeout=30)
    stream = lw.items()
    try:
        first = await anext(stream)
        assert isinstance(first, Relisted) and first.objects == 4
        del first
        # The generator resumes into the watch and waits there for an event.
        pending = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.3)
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, Relisted)]
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
    finally:
        await stream.aclose()


async def test_list_pages_are_mapped_with_the_collector_paused(kube: Kube) -> None:
    """A page's decoded tree must be gone before a young collection can promote it
    (200 promoted pages of a 100,000-Pod relist cost ~20 full collections);
    mapping runs inside the pause, and the collector is back on afterwards."""
    import gc

    client = kube.client
    for i in range(5):
        await create_node(client, f"gc{i}")
    enabled_while_mapping: list[bool] = []

    def each(item: Any) -> str:
        enabled_while_mapping.append(gc.isenabled())
        return str(item["metadata"]["name"])

    assert gc.isenabled()
    names, list_rv = await client.list_mapped(NODES, each, page_size=2)
    assert {f"gc{i}" for i in range(5)} <= set(names) and list_rv
    assert len(enabled_while_mapping) == len(names) >= 5
    assert not any(enabled_while_mapping)
    assert gc.isenabled()
