"""The Slurm source's side: a busy node's expected job end rides on its own
`slurm.node.observed` and is emitted only when it changes by more than the tolerance;
`slurm.demand.observed` carries partition counters only, so its size does not grow with
the number of busy nodes, and it is emitted only when a counter changes.

Against the FAKE slurmrestd of testbed/sunkd_testbed/slurmrestd.py (v0.0.42 JSON through the real
client and normalizer): it lets a test move a running job's end time by seconds, which
a real slurmctld does only in whole minutes (`scontrol update TimeLimit=`). The real
cluster's view of the same events is in test_slurm_source.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sunkd.domain.codec import payload_to_json
from sunkd.domain.events import Event, SlurmDemandObserved, SlurmNodeObserved
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.source import JOB_END_TOLERANCE_SECONDS, SlurmSource
from sunkd_testbed.slurmrestd import FakeSlurmrestd, fake_node

pytestmark = pytest.mark.timeout(120)

END = 1_900_000_000  # a running job's expected end (unix seconds)


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


def fake_job(job_id: int, node: str | None, end: int | None, *, state: str = "RUNNING",
             partition: str = "gpu") -> dict[str, Any]:
    """A v0.0.42 job (the fields `normalize_job` reads); `end` None = unlimited."""
    return {
        "job_id": job_id, "job_state": [state], "partition": partition,
        "state_reason": "None" if state == "RUNNING" else "Resources",
        "nodes": node or "", "node_count": _number(1),
        "start_time": _number(END - 3600) if state == "RUNNING" else _number(0),
        "end_time": {"set": True, "infinite": True, "number": 0} if end is None
        else _number(end),
        "time_limit": {"set": True, "infinite": end is None, "number": 120},
    }


class Sink:
    def __init__(self) -> None:
        self.batches: list[list[Event]] = []

    async def __call__(self, events: Sequence[Event]) -> None:
        self.batches.append(list(events))


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    nodes = [fake_node(f"gpu-{i:04d}", state=("ALLOCATED",), alloc_cpus=64) for i in range(3)]
    async with FakeSlurmrestd(nodes=nodes, jobs=[
            fake_job(1, "gpu-0000", END), fake_job(2, "gpu-0001", END + 600),
            fake_job(3, "gpu-0001", None, partition="other")]) as server:
        yield server


@pytest.fixture
async def client(fake: FakeSlurmrestd) -> AsyncIterator[SlurmRestClient]:
    c = SlurmRestClient(fake.url)
    try:
        yield c
    finally:
        await c.close()


def _nodes(events: Sequence[Event]) -> dict[str, SlurmNodeObserved]:
    return {e.subject: e.payload for e in events if isinstance(e.payload, SlurmNodeObserved)}


def _demand(events: Sequence[Event]) -> list[SlurmDemandObserved]:
    return [e.payload for e in events if isinstance(e.payload, SlurmDemandObserved)]


async def test_job_ends_are_per_node_and_change_only_beyond_the_tolerance(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    source = SlurmSource(client, Sink(), partitions=("gpu",))
    first = _nodes(await source.poll_once())
    assert {name: (n.jobs, n.job_end) for name, n in first.items()} == {
        "gpu-0000": (1, float(END)),
        # Two jobs, one of another partition and unlimited: the unlimited one dominates.
        "gpu-0001": (2, None),
        "gpu-0002": (0, None),
    }
    # slurmctld recomputes an end by a few seconds: not a change, nothing emitted.
    fake.jobs[0] = fake_job(1, "gpu-0000", END + int(JOB_END_TOLERANCE_SECONDS) - 1)
    assert await source.poll_once() == []
    # ... and drifting on never accumulates past the tolerance unseen.
    fake.jobs[0] = fake_job(1, "gpu-0000", END + int(JOB_END_TOLERANCE_SECONDS))
    moved = await source.poll_once()
    assert [(e.subject, e.payload.job_end) for e in moved] == [  # type: ignore[attr-defined]
        ("gpu-0000", float(END + JOB_END_TOLERANCE_SECONDS))]
    # A job ending is always a change, on that node only; the demand counter follows.
    del fake.jobs[0]
    ended = await source.poll_once()
    assert {name: (n.jobs, n.job_end) for name, n in _nodes(ended).items()} == {
        "gpu-0000": (0, None)}
    assert [d.running_jobs for d in _demand(ended)] == [1]

    # A daemon restarted from the fold's payloads re-emits nothing.
    seeded = SlurmSource(client, Sink(), partitions=("gpu",), initial_nodes=source.nodes,
                         initial_demand={"gpu": _demand(ended)[0]})
    assert [e.kind for e in await seeded.poll_once()] == ["source.health"]


async def test_demand_event_size_does_not_grow_with_busy_nodes(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    sizes = {}
    for busy in (10, 1000):
        fake.nodes = [fake_node(f"gpu-{i:04d}", state=("ALLOCATED",), alloc_cpus=64)
                      for i in range(busy)]
        # Counters of the same width, so only what grows with the busy set could differ.
        fake.jobs = [fake_job(i + 1, f"gpu-{i:04d}", END + i) for i in range(busy)]
        fake.jobs += [fake_job(5000 + k, None, None, state="PENDING") for k in range(10)]
        source = SlurmSource(client, Sink(), partitions=("gpu",))
        events = await source.poll_once()
        (demand,) = _demand(events)
        assert (demand.running_jobs, demand.pending_jobs) == (busy, 10)
        assert len(_nodes(events)) == busy
        sizes[busy] = len(payload_to_json(demand)) - len(str(busy))
        # Nothing changed: no demand event, no node event.
        assert await source.poll_once() == []
    assert sizes[10] == sizes[1000] < 200, sizes
