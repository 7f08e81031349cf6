"""Busy and idle node-hours where operators see them: `/metrics` (the counter the
engine advances as it folds, seeded from the loaded state) and the status page, over a
real SQLite log seeded with the audit's history plus some work
(`tests.contract.test_audit_utilization.seed_with_work`)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from sunkd.api.app import api_pools, build_app
from sunkd.api.metrics import Metrics
from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.domain.fold import fold
from sunkd.runtime.reconciler import Reconciler
from sunkd.store.eventlog import EventLog
from sunkd.store.utilization import RollingUtilization, utilization
from tests.contract.test_audit_utilization import seed_with_work
from tests.integration.test_api import View
from tests.seeding import POOL, T0, all_events, open_clocked

HOUR = 3600.0


def samples(metrics: Metrics, name: str) -> dict[tuple[str, str, str], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                labels = sample.labels
                found[(labels["pool"], labels["owner"], labels["state"])] = sample.value
    return found


async def test_metrics_count_node_seconds_by_event_time(sqlite_url: str) -> None:
    await seed_with_work(sqlite_url)
    event_log = await EventLog.open(sqlite_url)
    try:
        events = await all_events(event_log)
    finally:
        await event_log.close()
    state = fold(events)
    metrics = Metrics()
    metrics.observe_events(events)
    six = (T0 + timedelta(hours=6)).timestamp()
    metrics.set_state(state, six, [p.spec for p in api_pools(state)])
    seconds = samples(metrics, "sunkd_node_seconds_total")
    # The only work in the history: n2's job (1 h, Slurm) and k-n1's pod (30 min).
    assert seconds[(POOL, "slurm", "busy")] == HOUR
    assert seconds[(POOL, "kubernetes", "busy")] == HOUR / 2
    # Six nodes (n1..n5, other-1) observed from T0 to T0+6h, nothing more or less.
    assert sum(seconds.values()) == 6 * 6 * HOUR
    assert seconds[("none", "none", "idle")] == 6 * HOUR + 5 * 60  # other-1; n1..n5 adopted at +1m
    assert samples(metrics, "sunkd_nodes_activity") == {
        (POOL, "kubernetes", "idle"): 3.0, (POOL, "slurm", "idle"): 2.0,
        ("none", "none", "idle"): 1.0}
    # A scrape moment before the clock adds nothing; the counter never goes back.
    metrics.set_state(state, six - HOUR, [p.spec for p in api_pools(state)])
    assert samples(metrics, "sunkd_node_seconds_total") == seconds


async def test_engine_seeds_the_counter_from_the_loaded_state(sqlite_url: str) -> None:
    await seed_with_work(sqlite_url)
    six = T0 + timedelta(hours=6)
    metrics = Metrics()
    log = await open_clocked(sqlite_url, six)
    engine = Reconciler(log, observer=metrics, clock=six.timestamp)
    try:
        await engine.load()
        pools = [p.spec for p in api_pools(engine.state)]
        metrics.set_state(engine.state, six.timestamp() + 600, pools)
        seconds = samples(metrics, "sunkd_node_seconds_total")
        # Counting starts at load: 10 minutes of six idle nodes, in the pools' names.
        assert seconds == {(POOL, "kubernetes", "idle"): 3 * 600.0,
                           (POOL, "slurm", "idle"): 2 * 600.0, ("none", "none", "idle"): 600.0}
        follow = asyncio.create_task(engine.follow())
        try:
            log.clock = six + timedelta(minutes=10)
            [seq] = await log.append([Event("n3", SlurmNodeObserved(
                node="n3", state="ALLOCATED", partitions=("gpu",), cpus=64, alloc_cpus=8))], 1)
            await engine.wait_folded(seq)
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        metrics.set_state(engine.state, six.timestamp() + 1500, pools)
        seconds = samples(metrics, "sunkd_node_seconds_total")
        assert seconds[(POOL, "slurm", "busy")] == 900.0
        assert seconds[(POOL, "slurm", "idle")] == 2 * 600.0 + 900.0
    finally:
        await log.close()


async def test_status_page_shows_the_last_24_hours(sqlite_url: str) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=6)
    await seed_with_work(sqlite_url, start)
    event_log = await EventLog.open(sqlite_url)
    try:
        view = View(fold(await all_events(event_log)), event_log)
        async with TestClient(TestServer(build_app(view))) as client:
            page = await (await client.get("/")).text()
    finally:
        await event_log.close()
    assert "<h2>Utilization (last 24 h)</h2>" in page
    block = page.split("<h2>Utilization (last 24 h)</h2>", 1)[1].split("</table>", 1)[0]
    assert f"<tr><td>{POOL}</td><td>slurm</td><td>1.00</td>" in block
    assert f"<tr><td>{POOL}</td><td>kubernetes</td><td>0.50</td>" in block
    assert "<td>none</td><td>none</td><td>0.00</td><td>6.08</td>"  # other-1, n1..n5 1 min in block


async def test_rolling_window_reads_incrementally_and_stays_exact(sqlite_url: str) -> None:
    """The status page's fold: after more events and a later `now`, its rows equal a
    fresh read of the whole log over the same (hour-aligned) window."""
    await seed_with_work(sqlite_url)
    log = await open_clocked(sqlite_url, T0 + timedelta(hours=6))
    try:
        rolling = RollingUtilization(log, hours=3)
        for now, more in ((T0 + timedelta(hours=6, minutes=30), False),
                          (T0 + timedelta(hours=7, minutes=45), True),
                          (T0 + timedelta(hours=9), False)):
            if more:
                log.clock = T0 + timedelta(hours=7)
                await log.append([Event("n3", SlurmNodeObserved(
                    node="n3", state="MIXED", partitions=("gpu",), cpus=64, alloc_cpus=8))], 1)
            start, rows = await rolling.rows(now)
            assert start == T0 + timedelta(hours=now.hour - T0.hour - 3)
            fresh = (await utilization(log, start, now)).rows()
            assert [(r.pool, r.owner, round(r.busy_s, 6), round(r.idle_s, 6)) for r in rows] \
                == [(r.pool, r.owner, round(r.busy_s, 6), round(r.idle_s, 6)) for r in fresh]
        # At T0+9h the window is T0+6h..: n3's job from T0+7h is 2 h of Slurm busy time.
        assert {(r.pool, r.owner): r.busy_s for r in rows}[(POOL, "slurm")] == 2 * HOUR
    finally:
        await log.close()
