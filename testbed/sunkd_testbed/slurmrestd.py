"""A FAKE slurmrestd for tests: an aiohttp server that answers like slurmrestd (v0.0.42
JSON shapes, as in tests/fixtures/slurm/v0.0.42_*_constructed.json) and injects chosen
faults. It is not Slurm and not a stand-in for the real-cluster tests
(tests/integration/test_slurm_*.py run against a real slurmctld); it exists to produce
answers a real slurmrestd produces only when something is badly wrong (a proxy that cuts
bodies, a broken HTTP stack, a hostile or buggy peer).

`GET /slurm/<version>/ping` always answers normally (the client's `negotiate()` probes
ping newest first; every other version is a 404), so a fault hits the data calls.
Faults apply to the paths in `fault_paths` (default: `nodes` only; `jobs` is clean).

Fault modes (`fake.mode = ...`, switchable between polls):

* `ok`               a clean answer
* `nan`              `"cpus": NaN` in one node (Python's json accepts it; JSON does not)
* `truncated`        Content-Length promises more than is sent, then the socket closes
* `bad_status_line`  `HTTP/1.1 OK\\r\\n`: no status code
* `deep_nesting`     a field nested `nesting_depth` (100,000) arrays deep
* `duplicates`       the first node listed twice, the copy with another state
* `huge`             a valid answer `huge_bytes` long (one node's comment is padding),
                     streamed chunked, or with Content-Length if `huge_content_length`
* `unknown_state`    the first node's state is `["BOGUS"]`
* `nul`              the first node's comment and reason carry `\\u0000` (and an ESC)
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
from collections.abc import Sequence
from typing import Any

from aiohttp import web

MODES = ("ok", "nan", "truncated", "bad_status_line", "deep_nesting", "duplicates", "huge",
         "unknown_state", "nul")
RELEASES = {"v0.0.42": "24.11.5", "v0.0.41": "24.05.4", "v0.0.40": "23.11.10"}


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


def fake_node(name: str, *, state: Sequence[str] = ("IDLE",), partitions: Sequence[str] = ("gpu",),
              alloc_cpus: int = 0, comment: str = "", reason: str = "") -> dict[str, Any]:
    """One node in v0.0.42 shape (the fields `normalize` reads, plus a few it ignores)."""
    return {
        "architecture": "x86_64", "boot_time": _number(1758266697), "cores": 32, "cpus": 64,
        "features": [], "active_features": [], "gres": "gpu:8", "gres_drained": "N/A",
        "gres_used": "gpu:0", "last_busy": _number(1762788947), "name": name,
        "address": name, "hostname": name, "state": list(state), "partitions": list(partitions),
        "real_memory": 131072, "comment": comment, "reason": reason,
        "reason_changed_at": {"set": False, "infinite": False, "number": 0},
        "reason_set_by_user": "",
        "alloc_memory": 0, "alloc_cpus": alloc_cpus, "alloc_idle_cpus": 64 - alloc_cpus,
        "version": "24.11.5",
    }


def default_nodes() -> list[dict[str, Any]]:
    return [fake_node("gpu-a001", state=("ALLOCATED",), alloc_cpus=64),
            fake_node("gpu-a002"), fake_node("gpu-a003")]


class FakeSlurmrestd:
    """Usage: `async with FakeSlurmrestd() as fake: SlurmRestClient(fake.url)`."""

    def __init__(self, *, version: str = "v0.0.42", nodes: list[dict[str, Any]] | None = None,
                 jobs: list[dict[str, Any]] | None = None, mode: str = "ok",
                 fault_paths: Sequence[str] = ("nodes",), huge_bytes: int = 80 * 2**20,
                 huge_content_length: bool = False, nesting_depth: int = 100_000) -> None:
        self.version = version
        self.release = RELEASES.get(version, "24.11.5")
        self.nodes = nodes if nodes is not None else default_nodes()
        self.jobs = jobs if jobs is not None else []
        self.mode = mode
        self.fault_paths = tuple(fault_paths)
        self.huge_bytes = huge_bytes
        self.huge_content_length = huge_content_length
        self.nesting_depth = nesting_depth
        self.requests: list[str] = []  # "GET /slurm/v0.0.42/nodes", in order
        self.body_bytes_sent = 0  # body bytes of `huge` answers actually written
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlurmrestd:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- answers

    def _meta(self) -> dict[str, Any]:
        major, minor, micro = self.release.split(".")
        return {"plugin": {"type": "openapi/slurmctld", "name": "FAKE slurmrestd (tests)",
                           "data_parser": f"data_parser/{self.version}"},
                "slurm": {"version": {"major": major, "minor": minor, "micro": micro},
                          "release": self.release, "cluster": "fake"}}

    def _body(self, key: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: items, "meta": self._meta(), "errors": [], "warnings": []}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        prefix = f"/slurm/{self.version}/"
        if not request.path.startswith(prefix):
            return web.json_response({"errors": [{"error": "Unknown path"}]}, status=404)
        tail = request.path[len(prefix):]
        if tail == "ping":
            return web.json_response({"pings": [{"hostname": "fake", "pinged": "UP",
                                                 "latency": 100, "mode": "primary"}],
                                      "meta": self._meta(), "errors": [], "warnings": []})
        if tail == "nodes" or tail.startswith("node/"):
            nodes = self.nodes
            if tail.startswith("node/"):
                nodes = [n for n in nodes if n["name"] == tail[len("node/"):]]
            body = self._body("nodes", copy.deepcopy(nodes))
        elif tail == "jobs":
            body = self._body("jobs", copy.deepcopy(self.jobs))
        else:
            return web.json_response({"errors": [{"error": "Unknown path"}]}, status=404)
        path = "nodes" if tail.startswith("node") else tail
        if self.mode == "ok" or path not in self.fault_paths:
            return web.json_response(body)
        return await self._fault(request, path, body)

    async def _fault(self, request: web.Request, path: str,
                     body: dict[str, Any]) -> web.StreamResponse:
        mode = self.mode
        items: list[dict[str, Any]] = body[path]
        if mode == "nan":
            items[0]["cpus"] = float("nan")
            return _json_text(json.dumps(body))  # allow_nan: the literal NaN
        if mode == "duplicates":
            twin = copy.deepcopy(items[0])
            twin["state"] = ["IDLE"] if twin["state"] != ["IDLE"] else ["ALLOCATED"]
            items.append(twin)
            return web.json_response(body)
        if mode == "unknown_state":
            items[0]["state"] = ["BOGUS"]
            return web.json_response(body)
        if mode == "nul":
            items[0]["comment"] = "x\u0000y"
            items[0]["reason"] = "bad\u0000reason \u001b[31mred\u001b[0m"
            return web.json_response(body)  # json.dumps writes \u0000 and \u001b escapes
        if mode == "deep_nesting":
            depth = self.nesting_depth
            text = json.dumps(body)
            nested = '"extra": ' + "[" * depth + "]" * depth + ", "
            return _json_text(text.replace('"name": ', nested + '"name": ', 1))
        if mode == "truncated":
            raw = json.dumps(body).encode()
            return await self._raw(request, b"HTTP/1.1 200 OK\r\nContent-Type: application/json"
                                   b"\r\nContent-Length: %d\r\n\r\n" % (len(raw) + 5000)
                                   + raw[: len(raw) // 2])
        if mode == "bad_status_line":
            return await self._raw(request, b"HTTP/1.1 OK\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 2\r\n\r\n{}")
        if mode == "huge":
            return await self._huge(request, body)
        raise ValueError(f"unknown fault mode {mode!r} (one of {MODES})")

    async def _raw(self, request: web.Request, data: bytes) -> web.StreamResponse:
        """Write bytes straight to the socket and close it (what aiohttp would never
        produce itself)."""
        transport = request.transport
        assert transport is not None
        transport.write(data)
        await asyncio.sleep(0.05)
        transport.close()
        # aiohttp sees the closed transport and gives up on this response.
        raise asyncio.CancelledError

    async def _huge(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        marker = "@@PADDING@@"
        body[path_key(body)][0]["comment"] = marker
        head, tail = (part.encode() for part in json.dumps(body).split(marker, 1))
        padding = max(0, self.huge_bytes - len(head) - len(tail))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.huge_content_length:
            response.content_length = len(head) + padding + len(tail)
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            await response.write(head)
            self.body_bytes_sent += len(head)
            left = padding
            while left > 0:
                piece = chunk if left >= len(chunk) else chunk[:left]
                await response.write(piece)
                self.body_bytes_sent += len(piece)
                left -= len(piece)
            await response.write(tail)
            self.body_bytes_sent += len(tail)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client hung up, which is what a size cap should do
        return response


def path_key(body: dict[str, Any]) -> str:
    return "nodes" if "nodes" in body else "jobs"


def _json_text(text: str) -> web.Response:
    return web.Response(text=text, content_type="application/json")
