"""The leader stays leader under load, on SQLite and on PostgreSQL.

At 10,000 nodes on SQLite the lone daemon lost its lease about a minute after winning it
and never got it back (docs/operations.md, "Leadership under load"). Here one `sunkd run`
(the real Daemon, in process) follows a fake slurmrestd with thousands of nodes in ten
partitions whose states churn between polls, while as many concurrent writers as the
executor runs (16) append observations with the leader's epoch and a snapshot is taken
every couple of thousand events. The daemon must keep ONE term for the whole run: one
`leader.elected` in the log, the same epoch, acting the whole time after the first poll,
`/readyz` ready as leader, no term ended.

The load is larger than what the daemon's own sources produce at this size, so that the
run is short (about a minute per backend); the lease is 5 s, which leaves the renewal a
third of that (the old bound of an attempt) before acting stops.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.runtime import reconciler as reconciler_module
from sunkd.runtime.config import KubernetesSettings, PoolSettings, Settings, SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.store.eventlog import EventLog
from sunkd_testbed.slurmrestd import FakeSlurmrestd, fake_node

NODES = 4000
PARTITIONS = 10
RUN_SECONDS = 50.0
WRITERS = 16  # the executor's max_concurrent_actions
LEASE_SECONDS = 5.0

pytestmark = pytest.mark.timeout(240)


def _name(i: int) -> str:
    return f"node{i:05d}"


def _nodes() -> list[dict[str, Any]]:
    return [fake_node(_name(i), partitions=(f"part{i % PARTITIONS}",)) for i in range(NODES)]


async def _churn(fake: FakeSlurmrestd, stop: asyncio.Event, rng: random.Random) -> None:
    """A busy cluster: every half second a few hundred nodes start or finish jobs."""
    while not stop.is_set():
        for i in rng.sample(range(NODES), 300):
            busy = rng.random() < 0.5
            fake.nodes[i] = fake_node(
                _name(i), partitions=(f"part{i % PARTITIONS}",),
                state=("ALLOCATED",) if busy else ("IDLE",), alloc_cpus=64 if busy else 0)
        await asyncio.sleep(0.5)


async def _writer(daemon: Daemon, epoch: int, stop: asyncio.Event, rng: random.Random,
                  appended: list[int]) -> None:
    """One of the leader's concurrent writers (an action outcome, a source's batch):
    mostly single events, now and then a batch of a few hundred."""
    assert daemon.event_log is not None
    while not stop.is_set():
        size = 300 if rng.random() < 0.05 else 1
        batch = []
        for _ in range(size):
            i = rng.randrange(NODES)
            batch.append(Event(subject=_name(i), payload=SlurmNodeObserved(
                node=_name(i), state=rng.choice(("IDLE", "ALLOCATED", "MIXED")), cpus=64,
                partitions=(f"part{i % PARTITIONS}",))))
        await daemon.event_log.append(batch, epoch)
        appended[0] += size
        await asyncio.sleep(0)


async def _elected(url: str) -> list[int]:
    log = await EventLog.open(url)
    try:
        return [event.payload.epoch for event in await log.read(0, 100_000,  # type: ignore[attr-defined]
                                                                 kinds=["leader.elected"])]
    finally:
        await log.close()


async def test_one_leader_term_for_the_whole_run_under_load(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Snapshots are part of the load: every `snapshot_every` events, not the engine's
    # production cadence of 10 events a node (runtime/reconciler.py, 40,000 events here).
    monkeypatch.setattr(reconciler_module, "SNAPSHOT_EVENTS_PER_NODE", 0)
    log = await EventLog.open(database_url, migrate=True)
    await log.close()
    rng = random.Random(15)
    async with FakeSlurmrestd(nodes=_nodes()) as fake:
        settings = Settings(
            database_url=database_url, listen="127.0.0.1:0", lease_seconds=LEASE_SECONDS,
            snapshot_every=2000, kubernetes=KubernetesSettings(enabled=False),
            slurm=SlurmSettings(url=fake.url, token="x", poll_interval=1.0),
            pools=tuple(PoolSettings(name=f"pool{p}", partitions=(f"part{p}",), mode="Slurm")
                        for p in range(PARTITIONS)))
        daemon = Daemon(settings)
        task = asyncio.create_task(daemon.run())
        stop = asyncio.Event()
        load: list[asyncio.Task[None]] = []
        try:
            deadline = time.monotonic() + 60
            while daemon.is_ready() != (True, "leader"):
                assert time.monotonic() < deadline and not task.done(), \
                    f"never became a ready leader: {daemon.is_ready()}"
                await asyncio.sleep(0.1)
            leadership, reconciler = daemon.leadership, daemon.reconciler
            assert leadership is not None and leadership.lease is not None
            epoch = leadership.lease.epoch
            assert reconciler is not None
            snapshot_before = reconciler._last_snapshot_seq
            appended = [0]
            load.append(asyncio.create_task(_churn(fake, stop, rng)))
            load.extend(asyncio.create_task(_writer(daemon, epoch, stop, rng, appended))
                        for _ in range(WRITERS))
            not_acting = 0.0
            started = time.monotonic()
            while time.monotonic() - started < RUN_SECONDS:
                await asyncio.sleep(0.25)
                assert not task.done(), "the daemon stopped"
                for writer in load:
                    if writer.done():
                        writer.result()  # a StaleLeaderError here: the term ended
                lease = leadership.lease
                assert lease is not None and lease.epoch == epoch, \
                    f"the term ended: lease {lease}, renew error {leadership.last_renew_error}"
                if not leadership.may_act():
                    not_acting += 0.25
            stop.set()
            await asyncio.gather(*load)
            assert daemon.is_ready() == (True, "leader")
            terms_ended = sum(sample.value for metric in daemon.metrics.terms_ended.collect()
                              for sample in metric.samples if sample.name.endswith("_total"))
            assert terms_ended == 0
            assert daemon.metrics.acquire_failures._value.get() == 0
            assert appended[0] > 2000  # load happened, snapshots with it
            assert reconciler._last_snapshot_seq > snapshot_before
            # Renewals were never late enough to stop acting for long.
            assert not_acting <= 2.0, f"not acting for {not_acting} s of {RUN_SECONDS}"
        finally:
            stop.set()
            for writer in load:
                writer.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            daemon.stop_event.set()
            assert await asyncio.wait_for(task, 60) == 0
    assert await _elected(database_url) == [epoch]
