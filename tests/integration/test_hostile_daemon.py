"""The daemon under hostile conditions: each test reproduces one defect of the
fault run against `sunkd run` (the `Daemon`), on SQLite or PostgreSQL.

- 12.5: HTTP load (big extender requests) no longer costs the leader its lease, a lost
  leadership is logged with its reason, and HTTPS is available (`--tls-cert/--tls-key`).
- 12.8: a corrupt row stops the daemon with `daemon.fatal` naming the row's seq, also
  when the payload is not JSON at all (it used to be a raw traceback at startup).
- 12.9: a database recreated under a running daemon stops it with a clear message
  (it used to stay "ready: leader" on a log it never folded again).
- 12.10: `/readyz` is 503 when the database is gone; 300 slowloris connections are
  closed by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from sqlalchemy import text

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.runtime.config import KubernetesSettings, PoolSettings, Settings
from sunkd.runtime.daemon import Daemon
from sunkd.store.eventlog import EventLog
from tests.conftest import _pg_admin, require


def settings_for(url: str, lease_seconds: float = 3.0) -> Settings:
    return replace(Settings(database_url=url, listen="127.0.0.1:0",
                            lease_seconds=lease_seconds),
                   kubernetes=KubernetesSettings(enabled=False))


@contextlib.asynccontextmanager
async def running(daemon: Daemon, *, lead: bool = True) -> AsyncIterator[asyncio.Task[int]]:
    task = asyncio.create_task(daemon.run())
    try:
        for _ in range(300):
            if daemon.http_port is not None and (daemon.is_leader() or not lead):
                break
            if task.done():
                break
            await asyncio.sleep(0.05)
        yield task
    finally:
        if not task.done():
            daemon.stop_event.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        if not task.done():
            task.cancel()


async def get(port: int, path: str, *, scheme: str = "http",
              ssl_context: ssl.SSLContext | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(
            f"{scheme}://127.0.0.1:{port}{path}", ssl=ssl_context,
            timeout=aiohttp.ClientTimeout(total=10)) as response:
        return response.status, await response.text()


# ------------------------------------------------------------------------------ 12.5


# The hostile client, in a process of its own as a real one is: built and sent from the
# daemon's process, the 84 MB of bodies cost the daemon's event loop as much as
# answering them did.
FLOOD = """
import asyncio, json, sys
import aiohttp

async def main(port):
    # A pool pod: every node fails, so the answer would carry 700,000 reasons (35 MB).
    body = json.dumps({"Pod": {"metadata": {"labels": {"app": "serve"}}},
                       "NodeNames": [f"n{i}" for i in range(700_000)]}).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def flood():
            async with session.post(f"http://127.0.0.1:{port}/scheduler/filter",
                                    data=body) as response:
                await response.read()
                return response.status
        print("sending", flush=True)
        print(json.dumps(await asyncio.gather(*(flood() for _ in range(12)))), flush=True)

asyncio.run(main(int(sys.argv[1])))
"""


async def test_http_load_does_not_cost_the_leader_its_lease(sqlite_url: str) -> None:
    """12.5: twelve concurrent 7 MB `POST /scheduler/filter` blocked the loop ~1.6 s
    each; `/healthz` took 8.8 s and the leader stepped down. The same load now leaves
    the leader leading and `/healthz` prompt.

    With a 6 s lease, not 3 s (sunkd's default is 15 s): on the 2026-12-02 machine a 3 s
    lease was lost under this load by every tree, this test's earlier version included,
    the renewal starting up to 1.2 s late and taking up to 1.4 s; not the cause there:
    aiohttp 3.14 (3.13.5 too), aiosqlite 0.22 (0.21.0 too), the client in the daemon's
    process (it is in its own now), the JSON decode alone (orjson failed too)."""
    pool = PoolSettings(name="gpu", partitions=("gpu",), workload_selector={"app": "serve"})
    daemon = Daemon(replace(settings_for(sqlite_url, lease_seconds=6.0), pools=(pool,)))
    async with running(daemon) as task:
        assert daemon.is_leader(), task
        port = daemon.http_port
        assert port is not None
        stepped_down = []

        async def watch_leadership() -> None:
            while True:
                if not daemon.is_leader():
                    stepped_down.append(time.monotonic())
                await asyncio.sleep(0.05)

        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FLOOD, str(port), stdout=asyncio.subprocess.PIPE)
        assert flood.stdout is not None
        assert await asyncio.wait_for(flood.stdout.readline(), 60) == b"sending\n"
        watcher = asyncio.create_task(watch_leadership())
        worst = 0.0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            answer = asyncio.create_task(flood.stdout.readline())
            while not answer.done():
                began = time.perf_counter()
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    assert response.status == 200
                worst = max(worst, time.perf_counter() - began)
                await asyncio.wait([answer], timeout=0.1)
        statuses = json.loads(answer.result())
        assert await asyncio.wait_for(flood.wait(), 30) == 0
        watcher.cancel()
        assert not stepped_down, "the leader stepped down under HTTP load"
        assert worst < 1.0, f"/healthz took {worst:.2f} s under load"
        assert statuses == [413] * 12
        assert daemon.is_leader()


async def test_stepped_down_says_why_leadership_was_lost(sqlite_url: str) -> None:
    """12.5: `daemon.stepped_down` had no reason, so a lost lease looked like nothing."""
    daemon = Daemon(settings_for(sqlite_url))
    with structlog.testing.capture_logs() as logs:
        async with running(daemon):
            assert daemon.is_leader()
            other = await EventLog.open(sqlite_url)
            try:
                # Another replica takes the lease over (as after a long stall).
                async with other.engine.begin() as connection:
                    await connection.execute(text(
                        "UPDATE leadership SET holder = 'usurper', epoch = epoch + 1, "
                        "renewed_at = CURRENT_TIMESTAMP, lease_seconds = 600"))
                for _ in range(200):
                    if any(entry["event"] == "daemon.stepped_down" for entry in logs):
                        break
                    await asyncio.sleep(0.05)
            finally:
                await other.close()
    (stepped,) = [entry for entry in logs if entry["event"] == "daemon.stepped_down"][:1]
    assert "deposed" in stepped.get("reason", ""), stepped
    assert "usurper" in stepped["reason"]
    # The cause is the label of sunkd_leader_terms_ended_total, counted once.
    assert stepped["cause"] == "deposed", stepped
    assert daemon.metrics.terms_ended.labels(cause="deposed")._value.get() == 1


async def test_tls_cert_and_key_serve_https(sqlite_url: str, tmp_path: Path) -> None:
    """12.5 (optional TLS for the extender and metrics): `sunkd run --tls-cert --tls-key`."""
    openssl = shutil.which("openssl")
    require(openssl is not None, "openssl is not installed")
    assert openssl is not None
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    process = await asyncio.create_subprocess_exec(
        openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    daemon = Daemon(settings_for(sqlite_url), tls_cert=cert, tls_key=key)
    async with running(daemon):
        assert daemon.http_port is not None
        trusting = ssl.create_default_context(cafile=str(cert))
        status, body = await get(daemon.http_port, "/healthz", scheme="https",
                                 ssl_context=trusting)
        assert (status, body) == (200, "ok\n")
        with pytest.raises(aiohttp.ClientError):
            await get(daemon.http_port, "/healthz")  # plain HTTP is not served


def test_tls_flags_are_checked_before_starting(tmp_path: Path) -> None:
    from sunkd.cli.main import main

    assert main(["run", "--tls-cert", str(tmp_path / "missing.crt")]) == 2
    assert main(["run", "--tls-cert", str(tmp_path / "missing.crt"),
                 "--tls-key", str(tmp_path / "missing.key")]) == 2


# ------------------------------------------------------------------------------ 12.8


async def insert_raw(url: str, payload: str, kind: str = "slurm.node.observed") -> int:
    event_log = await EventLog.open(url)
    try:
        seq = await event_log.latest_seq() + 1
        async with event_log.engine.begin() as connection:
            await connection.execute(text(
                "INSERT INTO events (seq, recorded_at, kind, subject, epoch, payload) VALUES "
                "(:seq, CURRENT_TIMESTAMP, :kind, 'n1', 0, :payload)"),
                {"seq": seq, "kind": kind, "payload": payload})
        return seq
    finally:
        await event_log.close()


async def test_daemon_fatal_names_the_seq_of_a_corrupt_row(sqlite_url: str) -> None:
    """12.8: the fatal message said "following the event log failed after seq N" (the
    last good one), not which row."""
    daemon = Daemon(settings_for(sqlite_url))
    with structlog.testing.capture_logs() as logs:
        async with running(daemon) as task:
            assert daemon.is_leader()
            bad = await insert_raw(sqlite_url, '{"v": 1, "node": "n1", "cpus": "many"}')
            assert await asyncio.wait_for(task, 30) == 1
    assert daemon.fatal_error is not None
    assert f"row seq {bad}" in daemon.fatal_error and "cpus" in daemon.fatal_error
    fatal = next(entry for entry in logs if entry["event"] == "daemon.fatal")
    assert fatal["seq"] == bad
    assert f"--after {bad - 1} --json" in fatal["hint"]


async def test_a_payload_that_is_not_json_is_daemon_fatal_not_a_traceback(
        sqlite_url: str) -> None:
    """12.8: at startup, a payload that is not JSON raised JSONDecodeError out of
    `Daemon.run()` (a raw traceback) instead of `daemon.fatal`; while running, the fatal
    message did not name the row."""
    event_log = await EventLog.open(sqlite_url)
    try:
        await event_log.append_unfenced([Event("n1", SlurmNodeObserved(node="n1"))])
    finally:
        await event_log.close()
    bad = await insert_raw(sqlite_url, "{this is not json")
    daemon = Daemon(settings_for(sqlite_url))
    assert await asyncio.wait_for(daemon.run(), 30) == 1
    assert daemon.fatal_error is not None and f"row seq {bad}" in daemon.fatal_error
    assert "raw payload" in daemon.fatal_error and "this is not json" in daemon.fatal_error


# ------------------------------------------------------------------------------ 12.9


async def test_a_database_recreated_under_the_daemon_stops_it(postgres_url: str) -> None:
    """12.9: after DROP DATABASE + CREATE + migrate under a running daemon, it said "ready:
    leader" of the new log but never folded seqs at or below its old position. Now it
    stops with exit 1 and says the log went backwards."""
    event_log = await EventLog.open(postgres_url, migrate=True)
    try:
        await event_log.append_unfenced([Event(f"n{i}", SlurmNodeObserved(node=f"n{i}"))
                                         for i in range(20)])
    finally:
        await event_log.close()
    daemon = Daemon(settings_for(postgres_url))
    daemon.log_check_interval = 0.3
    async with running(daemon) as task:
        assert daemon.is_leader()
        # Leading comes first; the fold of its leader.elected (seq 21) may lag under load.
        for _ in range(200):
            if daemon.state().last_seq > 20:
                break
            await asyncio.sleep(0.05)
        assert daemon.state().last_seq > 20
        name = postgres_url.rsplit("/", 1)[1]
        await _pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')
        await _pg_admin(f'CREATE DATABASE "{name}"')
        fresh = await EventLog.open(postgres_url, migrate=True)
        await fresh.close()
        assert await asyncio.wait_for(task, 60) == 1
    assert daemon.fatal_error is not None
    assert "went backwards" in daemon.fatal_error or "replaced" in daemon.fatal_error


# ----------------------------------------------------------------------------- 12.10


async def test_readyz_is_503_when_the_database_is_gone(postgres_url: str) -> None:
    """12.10: with the database gone, `/readyz` still answered 200 "ready: standby"
    (docs/operations.md says 503)."""
    await (await EventLog.open(postgres_url, migrate=True)).close()
    daemon = Daemon(settings_for(postgres_url))
    daemon.log_check_interval = 0.3
    async with running(daemon):
        assert daemon.http_port is not None
        assert (await get(daemon.http_port, "/readyz"))[0] == 200
        name = postgres_url.rsplit("/", 1)[1]
        await _pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)')
        seen: list[tuple[int, str]] = []
        for _ in range(150):
            seen.append(await get(daemon.http_port, "/readyz"))
            if seen[-1][0] == 503:
                break
            await asyncio.sleep(0.1)
        assert seen[-1][0] == 503, seen[-5:]
        assert "event log unreachable" in seen[-1][1]
        assert (await get(daemon.http_port, "/healthz"))[0] == 200  # alive, not ready


async def test_slowloris_connections_are_closed(sqlite_url: str) -> None:
    """12.10: 300 connections sending their headers a byte at a time were never timed
    out (aiohttp's default keep-alive timeout is an hour)."""
    daemon = Daemon(settings_for(sqlite_url))
    daemon.http_idle_timeout = 1.0
    async with running(daemon, lead=False):
        port = daemon.http_port
        assert port is not None
        connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for _ in range(300):
            connections.append(await asyncio.open_connection("127.0.0.1", port))
        for _reader, writer in connections:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                          ) -> float:
            began = time.monotonic()
            with contextlib.suppress(ConnectionError, OSError):
                while time.monotonic() - began < 20:
                    writer.write(b"X")  # one more byte of a header that never ends
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        if await asyncio.wait_for(reader.read(1024), 0.5) == b"":
                            break  # closed by the server
            return time.monotonic() - began

        try:
            lasted = await asyncio.gather(*[trickle(r, w) for r, w in connections])
            assert max(lasted) < 10, f"a slow connection lasted {max(lasted):.1f} s"
            status, _ = await get(port, "/healthz")  # and the server still serves
            assert status == 200
        finally:
            for _reader, writer in connections:
                writer.close()


async def test_no_kubeconfig_stops_the_daemon_with_where_it_looked(
        sqlite_url: str, tmp_path: Path, monkeypatch: Any) -> None:
    """A daemon with Kubernetes enabled and no kubeconfig anywhere says so and exits 1
    (it used to fail every leadership term with kubernetes-asyncio's message)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = replace(settings_for(sqlite_url), kubernetes=KubernetesSettings(enabled=True))
    daemon = Daemon(settings)
    assert await asyncio.wait_for(daemon.run(), 60) == 1
    assert daemon.fatal_error is not None and "no kubeconfig found" in daemon.fatal_error


async def test_an_exec_plugin_failing_at_start_is_retried_not_fatal(
        sqlite_url: str, tmp_path: Path) -> None:
    """kubernetes-asyncio runs a kubeconfig's exec plugin when the client is built: a plugin
    failing then (its identity provider unreachable) is not a configuration to fix. The
    daemon keeps running and builds the client once the plugin answers."""
    from sunkd_testbed.kubeapi import KubeAPIEmulator
    from tests.integration.kube_helpers import token_plugin, write_exec_kubeconfig

    down = tmp_path / "provider-down"
    down.touch()
    plugin = token_plugin(tmp_path / "plugin.py", "late", fail_while=down)
    async with KubeAPIEmulator() as emulator:
        kubeconfig = write_exec_kubeconfig(emulator, tmp_path / "kubeconfig", plugin)
        settings = replace(settings_for(sqlite_url), kubernetes=KubernetesSettings(
            enabled=True, kubeconfig=kubeconfig))
        daemon = Daemon(settings)
        async with running(daemon) as task:
            await asyncio.sleep(4)  # more than a term's retry (lease_seconds=3)
            assert not task.done(), daemon.fatal_error
            assert daemon.fatal_error is None
            down.unlink()
            for _ in range(200):
                if any(r.headers.get("Authorization") == "Bearer late"
                       for r in emulator.requests):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the daemon never reached the API server")
            assert not task.done()
