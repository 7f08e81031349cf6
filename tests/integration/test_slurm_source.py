"""The Slurm poller against a real cluster: change-only events, seeding, demand,
health (auth, controller down and recovery), the resume flap. Once per Slurm generation
(`slurm_version`, tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

from sunkd.domain.events import (
    Event,
    SlurmDemandObserved,
    SlurmNodeObserved,
    SlurmNodeVanished,
    SourceHealth,
)
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.auth import mint_jwt
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.source import SlurmSource
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import (
    jwt_client,
    start_cluster,
    wait_node,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(slurm_version: str) -> Iterator[SlurmCluster]:
    yield from start_cluster(
        "ss[1-3]",
        partitions={"batch": "ss[1-2]", "other": "ss3"},
        slurmd_timeout=5,
        version=slurm_version,
    )


@pytest.fixture
async def client(cluster: SlurmCluster) -> AsyncIterator[SlurmRestClient]:
    async with jwt_client(cluster) as c:
        yield c


class Sink:
    """A real EventSink: records every batch it is handed."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []

    async def __call__(self, events: Sequence[Event]) -> None:
        self.batches.append(list(events))

    @property
    def events(self) -> list[Event]:
        return [e for batch in self.batches for e in batch]


def _kinds(events: Sequence[Event]) -> list[tuple[str, str]]:
    return [(e.kind, e.subject) for e in events]


async def test_first_poll_emits_everything_then_only_changes(
    cluster: SlurmCluster, client: SlurmRestClient
) -> None:
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch",))
    first = await source.poll_once()
    assert _kinds(first) == [
        ("slurm.node.observed", "ss1"),
        ("slurm.node.observed", "ss2"),  # ss3 is not in a managed partition
        ("slurm.demand.observed", "batch"),
        ("source.health", "slurm"),
    ]
    assert sink.batches == [first]
    node = first[0].payload
    assert isinstance(node, SlurmNodeObserved)
    assert (node.state, node.flags, node.cpus, node.partitions) == ("IDLE", (), 2, ("batch",))
    health = first[-1].payload
    assert isinstance(health, SourceHealth) and health.status == "fresh"
    assert await source.poll_once() == []
    assert len(sink.batches) == 1  # nothing handed to the sink when nothing changed

    # A restarted daemon seeded from the fold re-emits nothing.
    seeded = SlurmSource(
        client,
        Sink(),
        partitions=("batch",),
        initial_nodes=dict(source.nodes),
        initial_demand={"batch": first[2].payload},  # type: ignore[dict-item]
        initial_health=source.health,
    )
    assert await seeded.poll_once() == []

    # One node changes: exactly one event.
    cluster.scontrol("update", "nodename=ss1", "state=drain", "reason=admin: test")
    try:
        await wait_node(client, "ss1", lambda n: n.is_drain)
        changed = await source.poll_once()
        assert _kinds(changed) == [("slurm.node.observed", "ss1")]
        payload = changed[0].payload
        assert isinstance(payload, SlurmNodeObserved)
        assert payload.flags == ("DRAIN",) and payload.reason == "admin: test"
        assert payload.reason_set_by == "root"
    finally:
        cluster.scontrol("update", "nodename=ss1", "state=resume")
    await wait_node(client, "ss1", lambda n: not n.is_drain and not n.flags)


async def test_node_that_disappeared_is_reported_vanished(client: SlurmRestClient) -> None:
    ghost = SlurmNodeObserved(node="ghost1", state="IDLE", cpus=2)
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch",), initial_nodes={"ghost1": ghost})
    events = await source.poll_once()
    vanished = [e for e in events if isinstance(e.payload, SlurmNodeVanished)]
    assert [(e.subject, e.payload.node) for e in vanished] == [("ghost1", "ghost1")]  # type: ignore[attr-defined]
    assert "ghost1" not in source.nodes
    assert not [e for e in await source.poll_once() if isinstance(e.payload, SlurmNodeVanished)]


async def test_demand_per_partition(cluster: SlurmCluster, client: SlurmRestClient) -> None:
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch", "other"))
    first = await source.poll_once()
    assert ("slurm.demand.observed", "other") in _kinds(first)
    running = cluster.sbatch("--nodes=2", "--exclusive", partition="batch")
    pending = cluster.sbatch("--nodes=1", partition="batch")
    try:
        deadline = time.monotonic() + 20
        demand: SlurmDemandObserved | None = None
        while time.monotonic() < deadline:
            for event in await source.poll_once():
                if isinstance(event.payload, SlurmDemandObserved) and event.subject == "batch":
                    demand = event.payload
            if demand and demand.running_jobs == 1 and demand.pending_nodes == 1:
                break
            await asyncio.sleep(0.2)
        assert demand is not None
        assert (demand.pending_jobs, demand.pending_nodes, demand.running_jobs) == (1, 1, 1)
        assert not demand.extra  # counters only: no per-node job ends
        # The running job's end rides on each of its nodes' own observation.
        nodes = {name: source.nodes[name] for name in ("ss1", "ss2")}
        assert {name: node.jobs for name, node in nodes.items()} == {"ss1": 1, "ss2": 1}
        assert all(n.job_end is not None and n.job_end > time.time() for n in nodes.values())
        assert source.nodes["ss3"].jobs == 0 and source.nodes["ss3"].job_end is None
        # The other partition saw no change, so no demand event for it.
        assert not [
            e
            for e in sink.events[len(first) :]
            if e.subject == "other" and e.kind == "slurm.demand.observed"
        ]
    finally:
        cluster.scancel(running, pending)
    deadline = time.monotonic() + 20
    last = None
    while time.monotonic() < deadline:
        for event in await source.poll_once():
            if isinstance(event.payload, SlurmDemandObserved) and event.subject == "batch":
                last = event.payload
        if last is not None and last.running_jobs == 0 and last.pending_jobs == 0:
            break
        await asyncio.sleep(0.2)
    assert last is not None and (last.pending_jobs, last.running_jobs) == (0, 0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(source.nodes[n].jobs for n in ("ss1", "ss2")):
        await source.poll_once()
        await asyncio.sleep(0.2)
    assert [(source.nodes[n].jobs, source.nodes[n].job_end) for n in ("ss1", "ss2")] == [
        (0, None), (0, None)]


async def test_resume_flap_is_not_reported(cluster: SlurmCluster, client: SlurmRestClient) -> None:
    actuator = SlurmActuator(client, scontrol_env=cluster.env)
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch",), not_responding_grace=10)
    assert await actuator.drain("ss2", "flap test")
    await wait_node(client, "ss2", lambda n: n.is_drain)
    await source.poll_once()
    assert await actuator.resume("ss2")
    raw_flap = False
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        nodes = {n.name: n for n in await client.get_nodes()}
        raw_flap = raw_flap or "NOT_RESPONDING" in nodes["ss2"].flags
        await source.poll_once()
        await asyncio.sleep(0.1)
    reported = [
        e.payload
        for e in sink.events
        if isinstance(e.payload, SlurmNodeObserved) and e.subject == "ss2"
    ]
    assert not any("NOT_RESPONDING" in p.flags for p in reported), (raw_flap, reported)
    assert reported[-1].flags == () and reported[-1].state == "IDLE"


async def test_auth_failure_is_stale_then_lost(
    cluster: SlurmCluster
) -> None:
    bad = SlurmRestClient(cluster.rest_url, token=mint_jwt(os.urandom(32), "root"))
    try:
        sink = Sink()
        source = SlurmSource(bad, sink, lost_after=3600)
        events = await source.poll_once()
        health = events[0].payload
        assert isinstance(health, SourceHealth)
        assert (health.status, health.cause) == ("stale", "auth")
        assert "rejected" in (health.detail or "")
        assert await source.poll_once() == []  # same status: not re-emitted
        lost = SlurmSource(bad, sink, lost_after=0)
        health = (await lost.poll_once())[0].payload
        assert isinstance(health, SourceHealth) and health.status == "lost"
    finally:
        await bad.close()


async def test_controller_down_goes_stale_and_recovers(
    cluster: SlurmCluster,
    client: SlurmRestClient,
    slurm_version: str,
) -> None:
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch",))
    await source.poll_once()
    before = dict(source.nodes)
    cluster.stop_slurmctld()
    try:
        started = time.monotonic()
        events = await source.poll_once()  # slurmrestd blocks ~9 s, then 500 (24.11+: 502)
        # 26.05.5 doubles its 502 answer, which aiohttp refuses: the client asks once more
        # and reads only the first answer (slurm/firstanswer.py), so it waits twice.
        asks = 2 if slurm_version == "26.05" else 1
        assert time.monotonic() - started < 20 * asks
        assert len(events) == 1
        health = events[0].payload
        assert isinstance(health, SourceHealth)
        assert health.status == "stale", health
        assert health.cause == "controller_down", health
        assert dict(source.nodes) == before  # last good state stands
    finally:
        await asyncio.to_thread(cluster.start_slurmctld)
    deadline = time.monotonic() + 30
    fresh = None
    while time.monotonic() < deadline and fresh is None:
        for event in await source.poll_once():
            if isinstance(event.payload, SourceHealth) and event.payload.status == "fresh":
                fresh = event.payload
        await asyncio.sleep(0.2)
    assert fresh is not None and fresh.cause is None


async def test_run_loop_stops(client: SlurmRestClient) -> None:
    sink = Sink()
    source = SlurmSource(client, sink, partitions=("batch",), poll_interval=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    await asyncio.sleep(0.7)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert sink.batches and sink.batches[0][-1].kind == "source.health"
