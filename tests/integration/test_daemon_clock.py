"""Safety scenario 7 (two clocks) in the daemon: event times are the database's, so the
policy's `now` is too (this host's clock plus the offset measured at every lease renewal),
and a skew beyond `max_clock_skew_seconds` stops acting, with a metric and a log line.
Runs on PostgreSQL (a clock the daemon does not share) and on SQLite."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from sunkd.kubernetes.client import KubeClient
from sunkd.runtime.config import KubernetesSettings, Settings
from sunkd.runtime.daemon import Daemon
from sunkd.runtime.leadership import Leadership
from sunkd.store.eventlog import EventLog
from sunkd_testbed.demo import nodeset_object, populate
from sunkd_testbed.kubeapi import KubeAPIEmulator


async def _leading(database_url: str, skew: float) -> tuple[Daemon, asyncio.Task[int]]:
    log = await EventLog.open(database_url, migrate=True)
    await log.close()
    settings = Settings(database_url=database_url, listen="127.0.0.1:0", lease_seconds=3,
                        kubernetes=KubernetesSettings(enabled=False))
    daemon = Daemon(settings, wall_clock=lambda: time.time() + skew)
    task = asyncio.create_task(daemon.run())
    deadline = time.monotonic() + 20
    while daemon.leadership is None or daemon.leadership.lease is None:
        assert time.monotonic() < deadline and not task.done(), "never became leader"
        await asyncio.sleep(0.05)
    return daemon, task


def _leadership(daemon: Daemon) -> Leadership:
    assert daemon.leadership is not None
    return daemon.leadership


async def _stop(daemon: Daemon, task: asyncio.Task[int]) -> None:
    daemon.stop_event.set()
    assert await asyncio.wait_for(task, 30) == 0


async def test_s7_the_policy_decides_on_the_database_clock(database_url: str) -> None:
    daemon, task = await _leading(database_url, skew=4.0)  # this host runs 4 s fast
    try:
        assert abs(_leadership(daemon).clock() - time.time()) < 1.0  # the database's time, not ours
        assert _leadership(daemon).may_act()
        assert abs(daemon.metrics.clock_offset._value.get() + 4.0) < 1.0
    finally:
        await _stop(daemon, task)


async def test_s7_a_clock_skew_beyond_the_bound_stops_acting(database_url: str) -> None:
    daemon, task = await _leading(database_url, skew=300.0)  # a host 300 s fast
    try:
        assert abs(_leadership(daemon).clock() - time.time()) < 1.0  # grace periods stay right ...
        assert not _leadership(daemon).may_act()  # ... but sunkd takes no action, and says why
        assert daemon.metrics.clock_offset._value.get() < -299
    finally:
        await _stop(daemon, task)


async def test_s7_the_nodeset_status_is_stamped_with_the_database_clock(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host 5 s fast (every `time.time()` of the process): the Nodeset conditions'
    `lastTransitionTime` is the database's time, as the policy's `now` is, not the host's."""
    real = time.time
    started = real()
    emulator = KubeAPIEmulator()
    await emulator.start()
    client = KubeClient.for_url(emulator.url)
    try:
        populate(emulator, ["n1"], nodeset_object("pool"))
        log = await EventLog.open(database_url, migrate=True)
        await log.close()
        settings = Settings(database_url=database_url, listen="127.0.0.1:0", lease_seconds=3,
                            kubernetes=KubernetesSettings(namespace="sunkd"))
        monkeypatch.setattr(time, "time", lambda: real() + 5.0)
        daemon = Daemon(settings, kube_client=client, wall_clock=lambda: time.time())
        task = asyncio.create_task(daemon.run())
        try:
            deadline = real() + 30
            conditions: list[dict[str, str]] = []
            while not conditions:
                assert real() < deadline and not task.done(), "no Nodeset status written"
                await asyncio.sleep(0.1)
                status = emulator.get("nodesets", "pool", "sunkd").get("status") or {}
                conditions = status.get("conditions") or []
            read_at = real()
            for condition in conditions:
                stamped = datetime.strptime(condition["lastTransitionTime"],
                                            "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                assert started - 1 <= stamped.timestamp() <= read_at + 1.5, \
                    (condition, started, read_at)
        finally:
            daemon.stop_event.set()
            assert await asyncio.wait_for(task, 30) == 0
    finally:
        await client.close()
        await emulator.stop()
