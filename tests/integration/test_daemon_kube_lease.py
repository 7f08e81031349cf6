"""The daemon's optional Kubernetes Lease (`kubernetes.lease = true`): held while it
leads, released on graceful stop. Against the API emulator and SQLite; no Slurm."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from sunkd.kubernetes.client import KubeClient
from sunkd.runtime.config import KubernetesSettings, Settings
from sunkd.runtime.daemon import Daemon
from sunkd.testbed.kubeapi import KubeAPIEmulator


async def test_daemon_holds_and_releases_the_kubernetes_lease(tmp_path: Path) -> None:
    emulator = KubeAPIEmulator()
    await emulator.start()
    client = KubeClient.for_url(emulator.url)
    try:
        emulator.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": "sunkd"}})
        settings = replace(
            Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}",
                     listen="127.0.0.1:0", identity="replica-a", lease_seconds=3),
            kubernetes=KubernetesSettings(namespace="sunkd", lease=True))
        daemon = Daemon(settings, kube_client=client)
        task = asyncio.create_task(daemon.run())
        deadline = time.monotonic() + 20
        holder = None
        while time.monotonic() < deadline and not task.done():
            try:
                lease = emulator.get("leases", "sunkd-leader", "sunkd")
                holder = lease["spec"].get("holderIdentity")
            except Exception:
                holder = None
            if holder == "replica-a" and daemon.may_act():
                break
            await asyncio.sleep(0.1)
        assert holder == "replica-a"
        assert daemon.may_act()
        daemon.stop_event.set()
        assert await asyncio.wait_for(task, 30) == 0
        released = emulator.get("leases", "sunkd-leader", "sunkd")
        assert not released["spec"].get("holderIdentity")
    finally:
        await client.close()
        await emulator.stop()
