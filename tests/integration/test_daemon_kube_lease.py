"""The daemon's optional Kubernetes Lease (`kubernetes.lease = true`): held while it
leads, released on graceful stop. On both backends (the API emulator and the real
kube-apiserver; tests/integration/kube_backends.py) and SQLite; no Slurm."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from sunkd.kubernetes.client import LEASES, KubeApiError
from sunkd.runtime.config import KubernetesSettings, Settings
from sunkd.runtime.daemon import Daemon

from .kube_backends import Kube
from .kube_helpers import create_node, ensure_namespace


async def test_daemon_holds_and_releases_the_kubernetes_lease(kube: Kube, tmp_path: Path) -> None:
    client = kube.client
    await ensure_namespace(client, "sunkd")
    settings = replace(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}",
                 listen="127.0.0.1:0", identity="replica-a", lease_seconds=3),
        kubernetes=KubernetesSettings(namespace="sunkd", lease=True))
    daemon = Daemon(settings, kube_client=await kube.new_client())
    task = asyncio.create_task(daemon.run())
    deadline = time.monotonic() + 20
    holder = None
    while time.monotonic() < deadline and not task.done():
        try:
            lease = await client.get(LEASES, "sunkd-leader", "sunkd")
            holder = lease["spec"].get("holderIdentity")
        except KubeApiError:
            holder = None
        if holder == "replica-a" and daemon.is_leader():
            break
        await asyncio.sleep(0.1)
    assert holder == "replica-a"
    assert daemon.is_leader()
    daemon.stop_event.set()
    assert await asyncio.wait_for(task, 30) == 0
    released = await client.get(LEASES, "sunkd-leader", "sunkd")
    assert not released["spec"].get("holderIdentity")


async def test_daemon_node_events_are_accepted(kube: Kube, tmp_path: Path) -> None:
    """The Events the daemon's actuator writes about a Node are accepted (on both backends:
    the emulator validates the Event namespace as the real server does)."""
    client = kube.client
    await ensure_namespace(client, "sunkd")
    await create_node(client, "n1")
    settings = replace(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}",
                 listen="127.0.0.1:0", identity="replica-a", lease_seconds=3),
        kubernetes=KubernetesSettings(namespace="sunkd"))
    daemon = Daemon(settings, kube_client=await kube.new_client())
    task = asyncio.create_task(daemon.run())
    try:
        deadline = time.monotonic() + 20
        while (daemon.term is None or daemon.term.kube_actuator is None) \
                and time.monotonic() < deadline:
            assert not task.done(), task
            await asyncio.sleep(0.05)
        actuator = daemon.term.kube_actuator if daemon.term is not None else None
        assert actuator is not None, "the daemon never built its Kubernetes actuator"
        assert await actuator.record_event("n1", "SunkdProbe", "a probe") is True
    finally:
        daemon.stop_event.set()
        assert await asyncio.wait_for(task, 30) == 0
