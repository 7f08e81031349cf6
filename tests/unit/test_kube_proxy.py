"""The Kubernetes client honours HTTP_PROXY / NO_PROXY as client-go does, reading the
environment once per client (not per request, which cost a thread hop and a ~/.netrc read
for every request). The "proxy" here is a real HTTP server that answers what it is asked
to forward: the API server's host does not resolve, so only a proxied request gets an
answer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from sunkd.kubernetes.client import NODES, KubeClient

API = "http://api-server.invalid:6443"


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def forward(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.url}")  # absolute-form request target
        return web.json_response({"kind": "Node", "metadata": {"name": "n1"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_http_proxy_from_the_environment_is_used_and_read_once(
        proxy: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = proxy
    _clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", url)
    async with KubeClient.for_url(API) as client:
        node = await client.get(NODES, "n1")
        assert node["metadata"]["name"] == "n1"
        assert seen == [f"GET {API}/api/v1/nodes/n1"]
        # Changed after the first request: this client keeps what it read (client-go's
        # http.ProxyFromEnvironment reads the environment once, too).
        monkeypatch.setenv("NO_PROXY", "api-server.invalid")
        await client.get(NODES, "n1")
        assert len(seen) == 2


async def test_no_proxy_sends_the_request_directly(
        proxy: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = proxy
    _clear_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", url)
    monkeypatch.setenv("NO_PROXY", "api-server.invalid")
    async with KubeClient.for_url(API) as client:
        with pytest.raises(aiohttp.ClientError):  # direct: the host does not resolve
            await client.get(NODES, "n1")
    assert seen == []
