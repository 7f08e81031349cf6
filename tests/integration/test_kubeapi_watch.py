"""Kubernetes API emulator: WATCH semantics over HTTP.

Synthetic ADDED for RV unset/0, exact replay from a resourceVersion, selector transitions
(ADDED/DELETED when an object starts/stops matching), bookmarks, timeoutSeconds, and
410 Expired delivered as HTTP 200 plus an ERROR event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.integration.kubeapi_support import Raw, emulator, node, pod


@pytest.fixture
async def api() -> AsyncIterator[KubeAPIEmulator]:
    async for emu in emulator(bookmark_interval=0.3, history_size=50):
        yield emu


async def test_watch_without_version_sends_synthetic_added(api: KubeAPIEmulator,
                                                           raw: Raw) -> None:
    api.create(node("a"))
    api.create(node("b"))
    events = await raw.watch("/api/v1/nodes", resourceVersion="0", timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"), ("ADDED", "b")]
    events = await raw.watch("/api/v1/nodes", timeoutSeconds="1")
    assert len(events) == 2


async def test_watch_replays_exactly_after_version(api: KubeAPIEmulator, raw: Raw) -> None:
    created = api.create(node("a"))
    rv = created["metadata"]["resourceVersion"]
    api.patch("nodes", "a", {"metadata": {"labels": {"x": "1"}}})
    api.create(node("b"))
    api.delete("nodes", "a")
    events = await raw.watch("/api/v1/nodes", resourceVersion=rv, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    # DELETED carries the last state with the deletion's own RV.
    assert events[2]["object"]["metadata"]["labels"] == {"x": "1"}
    assert rvs[2] == api.resource_version


async def test_live_events_and_selector_transitions(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a", {"pool": "gpu"}))
    start = str(api.resource_version)

    async def mutate() -> None:
        await asyncio.sleep(0.2)
        api.patch("nodes", "a", {"metadata": {"labels": {"pool": "cpu"}}})  # leaves
        api.patch("nodes", "a", {"metadata": {"labels": {"pool": "gpu"}}})  # re-enters
        api.patch("nodes", "a", {"metadata": {"labels": {"other": "1"}}})   # stays
        api.create(node("b", {"pool": "cpu"}))  # never matches

    task = asyncio.create_task(mutate())
    events = await raw.watch("/api/v1/nodes", resourceVersion=start, timeoutSeconds="2",
                             labelSelector="pool=gpu", max_events=3)
    await task
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED"]
    assert events[0]["object"]["metadata"]["labels"]["pool"] == "gpu"  # previous content


async def test_namespaced_watch_with_field_selector(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    api.create(pod("p1", "n1"))
    api.create(pod("p2", "n2"))
    api.create(pod("p3", "n1", namespace="other"))
    events = await raw.watch("/api/v1/namespaces/default/pods", timeoutSeconds="1",
                             fieldSelector="spec.nodeName=n1")
    assert [e["object"]["metadata"]["name"] for e in events] == ["p1"]


async def test_bookmarks_and_timeout(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a"))
    started = time.monotonic()
    events = await raw.watch("/api/v1/nodes", resourceVersion=str(api.resource_version),
                             timeoutSeconds="1", allowWatchBookmarks="true")
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 3.0  # the server ended the stream at timeoutSeconds
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks and len(bookmarks) == len(events)
    assert bookmarks[-1]["object"] == {"kind": "Node", "apiVersion": "v1",
                                       "metadata": {"resourceVersion": str(api.resource_version)}}
    # Without allowWatchBookmarks there are none.
    events = await raw.watch("/api/v1/nodes", resourceVersion=str(api.resource_version),
                             timeoutSeconds="1")
    assert events == []


async def test_send_initial_events_ends_with_annotated_bookmark(api: KubeAPIEmulator,
                                                                raw: Raw) -> None:
    api.create(node("a"))
    events = await raw.watch("/api/v1/nodes", sendInitialEvents="true",
                             resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true",
                             timeoutSeconds="1", max_events=2)
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"}


async def test_too_old_version_is_410_error_event(api: KubeAPIEmulator, raw: Raw) -> None:
    first = api.create(node("a"))["metadata"]["resourceVersion"]
    for i in range(60):  # history_size=50: the first versions fall out of the window
        api.patch("nodes", "a", {"metadata": {"labels": {"i": str(i)}}})
    events = await raw.watch("/api/v1/nodes", resourceVersion=first, timeoutSeconds="5")
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410
    assert status["reason"] == "Expired"
    assert status["message"].startswith(f"too old resource version: {first} (")
    # A recent version still works.
    recent = str(api.resource_version - 5)
    events = await raw.watch("/api/v1/nodes", resourceVersion=recent, timeoutSeconds="1")
    assert len(events) == 5


async def test_force_410_and_drop_watches(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a"))
    api.force_410()
    events = await raw.watch("/api/v1/nodes", resourceVersion=str(api.resource_version),
                             timeoutSeconds="5")
    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410
    # Abrupt drop: the client sees the payload error that kubernetes_asyncio surfaces.
    async with aiohttp.ClientSession() as session:
        async with session.get(api.url + "/api/v1/nodes",
                               params={"watch": "1", "resourceVersion": "0"}) as resp:
            line = await resp.content.readline()
            assert json.loads(line)["type"] == "ADDED"
            for _ in range(50):
                if api.open_watch_count():
                    break
                await asyncio.sleep(0.01)
            assert api.drop_watches() == 1
            with pytest.raises(aiohttp.ClientPayloadError):
                while await resp.content.readline():
                    pass
    # Compaction: every version before now is too old.
    old = str(api.resource_version)
    api.patch("nodes", "a", {"metadata": {"labels": {"x": "1"}}})
    api.compact_history()
    events = await raw.watch("/api/v1/nodes", resourceVersion=old, timeoutSeconds="5")
    assert events[0]["type"] == "ERROR"


async def test_watch_table_output_for_kubectl(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a"))

    async def change() -> None:
        await asyncio.sleep(0.2)
        api.patch("nodes", "a", {"spec": {"unschedulable": True}})

    task = asyncio.create_task(change())
    async with raw.session.get(
            api.url + "/api/v1/nodes",
            params={"watch": "true", "resourceVersion": "0", "timeoutSeconds": "2"},
            headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,"
                     "application/json"}) as resp:
        lines = [json.loads(x) for x in (await resp.text()).splitlines()]
    await task
    assert [e["type"] for e in lines] == ["ADDED", "MODIFIED"]
    assert lines[0]["object"]["kind"] == "Table"
    assert lines[0]["object"]["columnDefinitions"][1]["name"] == "Status"
    assert lines[1]["object"]["rows"][0]["cells"][1] == "Ready,SchedulingDisabled"


async def test_bookmarks_never_overtake_events() -> None:
    # A tiny bookmark period while writes arrive in bursts: every BOOKMARK's version must
    # be >= every event sent before it and <= every event sent after it.
    async with KubeAPIEmulator(bookmark_interval=0.001) as emu, \
            aiohttp.ClientSession() as session:
        raw = Raw(emu.url, session)
        emu.create(node("a"))
        start = str(emu.resource_version)

        async def writer() -> None:
            for i in range(40):
                for j in range(5):
                    emu.patch("nodes", "a", {"metadata": {"labels": {"i": f"{i}-{j}"}}})
                await asyncio.sleep(0.005)

        task = asyncio.create_task(writer())
        events = await raw.watch("/api/v1/nodes", resourceVersion=start,
                                 allowWatchBookmarks="true", timeoutSeconds="1",
                                 max_events=10000)
        await task
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert rvs == sorted(rvs)
        assert sum(1 for e in events if e["type"] == "MODIFIED") == 200
        assert any(e["type"] == "BOOKMARK" for e in events)


async def test_list_exact_resource_version(api: KubeAPIEmulator, raw: Raw) -> None:
    api.create(node("a"))
    rv = str(api.resource_version)
    api.create(node("b"))
    _, exact = await raw.get("/api/v1/nodes", resourceVersion=rv, resourceVersionMatch="Exact")
    assert [i["metadata"]["name"] for i in exact["items"]] == ["a"]
    assert exact["metadata"]["resourceVersion"] == rv
    _, latest = await raw.get("/api/v1/nodes", resourceVersion=rv)
    assert len(latest["items"]) == 2  # NotOlderThan: the current state
    status, body = await raw.get("/api/v1/nodes", resourceVersion="999999")
    assert status == 504 and body["reason"] == "Timeout"
