"""The list-then-watch loop never hangs on a dead connection.

A half-open TCP connection (peer gone, no FIN/RST) looks to the client like a server that
stopped sending. Without client-side timeouts kubernetes-asyncio waits forever
(kubernetes-client/python#1148, #1402). These servers reproduce both shapes over real sockets:
one that never answers the request, one that answers a watch with headers and then goes silent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sunkd.kubernetes.client import NODES, KubeClient, Timeouts
from sunkd.kubernetes.listwatch import (
    Backoff,
    ListWatch,
    Relisted,
    WatchItem,
    WatchRecovered,
    WatchTrouble,
)


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """Accepts connections, reads the request, never answers."""
    held: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.fixture
async def stalling_watch_server() -> AsyncIterator[tuple[str, list[str]]]:
    """Lists fine; every watch sends its headers and one event, then nothing, forever."""
    requests: list[str] = []

    async def nodes(request: web.Request) -> web.StreamResponse:
        requests.append(request.query_string)
        if request.query.get("watch") not in ("true", "1", "True"):
            return web.json_response(
                {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"},
                 "items": [{"metadata": {"name": "n1", "resourceVersion": "5"}}]}
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        event = {"type": "MODIFIED", "object": {"metadata": {"name": "n1",
                                                             "resourceVersion": "6"}}}
        await response.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(3600)
        return response

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        await runner.cleanup()


async def _collect(lw: ListWatch, count: int, within: float) -> list[WatchItem]:
    items: list[WatchItem] = []
    async with asyncio.timeout(within):
        async for item in lw.items():
            items.append(item)
            if len(items) >= count:
                break
    return items


async def test_list_against_silent_server_times_out_and_retries(silent_server: str) -> None:
    client = KubeClient.for_url(silent_server, timeouts=Timeouts(connect=0.5, list_page=0.5))
    try:
        lw = ListWatch(client, NODES, backoff=Backoff(initial=0.05, maximum=0.1))
        items = await _collect(lw, 2, within=5)
        assert all(isinstance(i, WatchTrouble) for i in items)
        assert [i.consecutive for i in items if isinstance(i, WatchTrouble)] == [1, 2]
        assert {i.cause for i in items if isinstance(i, WatchTrouble)} == {"timeout"}
    finally:
        await client.close()


async def test_stalled_watch_is_abandoned_and_resumed_from_last_rv(
    stalling_watch_server: tuple[str, list[str]],
) -> None:
    url, requests = stalling_watch_server
    client = KubeClient.for_url(url)
    try:
        lw = ListWatch(client, NODES, idle_timeout=0.5, watch_timeout=60,
                       backoff=Backoff(initial=0.05, maximum=0.1))
        items = await _collect(lw, 4, within=5)
        assert isinstance(items[0], Relisted)
        assert items[1].__class__.__name__ == "WatchEvent"
        trouble = items[2]
        assert isinstance(trouble, WatchTrouble) and trouble.cause == "timeout"
        assert isinstance(items[3], WatchRecovered)
        # The reconnect resumed from RV 6 (the last event seen), no relist in between.
        assert len(requests) == 3
        assert "resourceVersion=5" in requests[1] and "allowWatchBookmarks=true" in requests[1]
        assert "timeoutSeconds=" in requests[1]
        assert "resourceVersion=6" in requests[2] and "watch=true" in requests[2]
    finally:
        await client.close()
