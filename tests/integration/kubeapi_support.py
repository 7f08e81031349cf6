"""Helpers for the Kubernetes API emulator tests: a thin raw-HTTP client and fixtures.

The tests talk plain HTTP (aiohttp) so they check the wire protocol itself, not a client
library's interpretation of it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from sunkd_testbed.kubeapi import KubeAPIEmulator

JSON = dict[str, Any]
MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"


class Raw:
    """Raw HTTP against the emulator (or a real API server); every call returns (status,
    decoded JSON body), or the text itself when the body is not JSON."""

    def __init__(self, base: str, session: aiohttp.ClientSession) -> None:
        self.base = base
        self.session = session

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/json",
                      headers: dict[str, str] | None = None,
                      params: dict[str, str] | None = None) -> tuple[int, Any]:
        hdrs = {"Accept": "application/json"}
        hdrs.update(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body)
            hdrs["Content-Type"] = content_type
        async with self.session.request(method, self.base + path, data=data, headers=hdrs,
                                        params=params) as resp:
            text = await resp.text()
            if not text:
                return resp.status, None
            try:
                return resp.status, json.loads(text)
            except ValueError:  # a plain-text answer ("404 page not found")
                return resp.status, text

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("POST", path, body)

    async def put(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("PUT", path, body)

    async def patch(self, path: str, body: Any, content_type: str = MERGE) -> tuple[int, Any]:
        return await self.request("PATCH", path, body, content_type)

    async def delete(self, path: str, body: Any = None) -> tuple[int, Any]:
        return await self.request("DELETE", path, body)

    async def watch(self, path: str, *, max_events: int = 100, wait: float = 5.0,
                    **params: str) -> list[JSON]:
        """Open a watch, collect events until the server ends it (or max/timeout)."""
        events: list[JSON] = []
        query = {"watch": "true", **params}
        async with self.session.get(self.base + path, params=query,
                                    headers={"Accept": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            try:
                async with asyncio.timeout(wait):
                    while len(events) < max_events:
                        line = await resp.content.readline()
                        if not line:
                            break
                        events.append(json.loads(line))
            except TimeoutError:
                pass
        return events


def node(name: str, labels: dict[str, str] | None = None, ready: bool = True) -> JSON:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "reason": "KubeletReady", "message": "ready"}]},
    }


def pod(name: str, node_name: str = "", labels: dict[str, str] | None = None,
        namespace: str = "default", ready: bool = True, phase: str = "Running") -> JSON:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def emulator(**kwargs: Any) -> AsyncIterator[KubeAPIEmulator]:
    async with KubeAPIEmulator(**kwargs) as api:
        yield api


async def raw_client(api: KubeAPIEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(api.url, session)
