"""Normalization of the three slurmrestd JSON families into SlurmNode / SlurmJob.

Real 22.05.8 captures and constructed v0.0.39 / v0.0.42 payloads live in
tests/fixtures/slurm (README.md there says where each comes from).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import hmac
import json
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sunkd.domain.events import Event, SlurmNodeObserved, SourceHealth
from sunkd.slurm.auth import jwt_expiry, mint_jwt
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmApiError, SlurmJob, SlurmPayloadError
from sunkd.slurm.normalize import gpu_count, normalize_jobs, normalize_nodes, slurm_release
from sunkd.slurm.source import SlurmSource, compute_demand, compute_node_jobs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def by_name(body: Any) -> dict[str, Any]:
    return {n.name: n for n in normalize_nodes(body)}


# ------------------------------------------------------------------ family A (real)


def test_v038_busy() -> None:
    nodes = by_name(load("v0.0.38_nodes_busy.json"))
    assert nodes["node1"].state == "MIXED" and nodes["node1"].alloc_cpus == 1
    assert nodes["node2"].state == "ALLOCATED" and nodes["node2"].alloc_cpus == 2
    node = nodes["node1"]
    assert node.flags == frozenset() and node.reason is None and node.reason_set_by is None
    assert node.reason_time is None  # reason_changed_at 0 = never
    assert node.partitions == ("debug",) and node.features == () and node.comment is None
    assert node.boot_time == 1795988082.0 and node.last_busy == 1795990016.0
    assert node.slurmd_start_time == 1795990016.0


def test_v038_draining_and_drained() -> None:
    draining = by_name(load("v0.0.38_nodes_draining.json"))
    assert draining["node1"].display_state == "draining"
    assert draining["node2"].display_state == "draining"
    assert draining["node2"].is_drain and not draining["node2"].is_drained
    assert draining["node1"].reason == "k8s: node cordoned"
    assert draining["node1"].reason_set_by == "root"
    assert draining["node3"].display_state == "allocated"
    drained = by_name(load("v0.0.38_nodes_drained.json"))
    assert drained["node1"].is_drained and drained["node1"].state == "IDLE"
    assert drained["node1"].display_state == "drained"


def test_v038_down_and_not_responding() -> None:
    nodes = by_name(load("v0.0.38_nodes_node4_down_not_responding.json"))
    # sinfo says drained; sunkd does not: DOWN is out of contact (slurmnode.in_contact)
    assert nodes["node3"].state == "DOWN" and nodes["node3"].is_drain
    assert not nodes["node3"].is_drained
    assert nodes["node4"].state == "DOWN"
    assert nodes["node4"].flags == frozenset({"NOT_RESPONDING"})
    assert nodes["node4"].reason == "Not responding" and nodes["node4"].reason_set_by == "slurm"
    assert nodes["node4"].display_state == "down*"
    resumed = by_name(load("v0.0.38_nodes_just_resumed.json"))
    assert resumed["node1"].display_state == "idle*"


def test_v038_single_node_endpoint() -> None:
    [node] = normalize_nodes(load("v0.0.38_node_node3_down_drain.json"))
    assert (node.name, node.state, node.flags) == ("node3", "DOWN", frozenset({"DRAIN"}))


def test_v036_nulls_are_tolerated() -> None:
    nodes = normalize_nodes(load("v0.0.36_nodes_idle.json"))
    assert nodes and all(n.state == "IDLE" and n.alloc_cpus == 0 for n in nodes)
    assert all(n.partitions == () for n in nodes)  # v0.0.36 has no partitions


def test_v038_jobs() -> None:
    jobs = normalize_jobs(load("v0.0.38_jobs_running.json"))
    assert [(j.job_id, j.state, j.nodes, j.node_count) for j in jobs] == [
        (1, "RUNNING", ("node1",), 1),
        (2, "RUNNING", ("node2",), 1),
        (3, "RUNNING", ("node3",), 1),
    ]
    job = jobs[0]
    assert job.time_limit is None  # null = UNLIMITED in v0.0.38
    assert job.partition == "debug" and job.state_reason == "None"
    assert job.start_time == 1795990019.0 and job.end_time == 1827526019.0
    cancelled = normalize_jobs(load("v0.0.38_jobs_after_cancel.json"))
    assert {j.state for j in cancelled} == {"CANCELLED"}


def test_release_from_meta() -> None:
    assert slurm_release(load("v0.0.38_nodes_busy.json")) == "22.05.8"
    assert slurm_release(load("v0.0.39_nodes_constructed.json")) == "23.02.8"
    assert slurm_release(load("v0.0.42_nodes_constructed.json")) == "24.11.5"


# ------------------------------------------------------------ families B and C


def test_v039_nodes() -> None:
    nodes = by_name(load("v0.0.39_nodes_constructed.json"))
    assert nodes["cn1"].state == "IDLE" and nodes["cn1"].reason_set_by is None  # "" = unset
    assert (nodes["cn2"].gpus_total, nodes["cn2"].gpus_used) == (4, 1)
    assert nodes["cn2"].features == ("gpu", "ib")
    assert nodes["cn3"].display_state == "draining" and nodes["cn3"].alloc_cpus == 64
    assert nodes["cn4"].is_drained and nodes["cn4"].reason_time == 1700000000.0
    assert nodes["cn5"].state == "DOWN" and "NOT_RESPONDING" in nodes["cn5"].flags
    assert nodes["cn6"].flags == frozenset({"PERFCTRS"})


def test_v042_nodes() -> None:
    nodes = by_name(load("v0.0.42_nodes_constructed.json"))
    cn2 = nodes["cn2"]
    assert (cn2.state, cn2.flags, cn2.alloc_cpus) == ("MIXED", frozenset({"DRAIN"}), 13)
    assert cn2.display_state == "draining"
    assert cn2.reason_time == 1762942786.0 and cn2.boot_time == 1758266697.0
    assert nodes["cn1"].reason_time is None  # {set: false} = unset
    assert nodes["cn3"].is_drained
    assert nodes["cn4"].state == "DOWN" and nodes["cn4"].reason == "CPU dead"
    assert nodes["cn5"].flags == frozenset({"PLANNED"})
    assert (nodes["cn6"].gpus_total, nodes["cn6"].gpus_used) == (6, 1)
    assert nodes["cn7"].flags == frozenset({"EXTERNAL", "BLOCKED"})  # v0.0.44 flags


def test_v042_and_v039_jobs() -> None:
    jobs = {j.job_id: j for j in normalize_jobs(load("v0.0.42_jobs_constructed.json"))}
    assert jobs[6360].state == "RUNNING" and jobs[6360].time_limit == 2.0
    assert jobs[6361].nodes == ("cn2", "cn3") and jobs[6361].time_limit is None
    assert jobs[6362].state == "PENDING" and jobs[6362].state_flags == ("REQUEUED",)
    assert jobs[6362].start_time is None and jobs[6362].node_count == 4
    jobs39 = {j.job_id: j for j in normalize_jobs(load("v0.0.39_jobs_constructed.json"))}
    assert jobs39[7].time_limit == 60.0 and jobs39[7].end_time == 1700003600.0
    assert jobs39[8].partitions == ("standard", "gpu") and jobs39[8].time_limit is None


def test_demand_from_jobs() -> None:
    jobs = normalize_jobs(load("v0.0.42_jobs_constructed.json"))
    demand = compute_demand(jobs, ("standard", "idle"))
    standard = demand["standard"]
    assert (standard.pending_jobs, standard.pending_nodes, standard.running_jobs) == (1, 4, 2)
    assert demand["idle"].pending_jobs == 0 and demand["idle"].running_jobs == 0
    # Job ends are per node now (they ride on slurm.node.observed), not in the demand.
    assert compute_node_jobs(jobs) == {
        "cn1": (1, 1762788891.0),
        "cn2": (1, 1762788891.0),
        "cn3": (1, 1762788891.0),
    }


def test_node_jobs_count_every_partition_and_unlimited_dominates() -> None:
    jobs = [
        SlurmJob(1, "RUNNING", partition="a", nodes=("n1", "n2"), end_time=100.0),
        SlurmJob(2, "RUNNING", partition="b", nodes=("n1",), end_time=300.0),
        SlurmJob(3, "CONFIGURING", partition="a", nodes=("n2",), end_time=None),
        SlurmJob(4, "PENDING", partition="a", node_count=2),
        SlurmJob(5, "COMPLETED", partition="a", nodes=("n3",), end_time=50.0),
    ]
    assert compute_node_jobs(jobs) == {"n1": (2, 300.0), "n2": (2, None)}


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("", 0),
        ("(null)", 0),
        ("gpu:4", 4),
        ("gpu:h100:2,gpu:h200:4", 6),
        ("gpu:1(IDX:0)", 1),
        ("gpu:2(IDX:0,2)", 2),
        ("gpu:h100:0(IDX:N/A),gpu:h200:0(IDX:N/A)", 0),
        ("gpu:4(S:0-1),nic:2", 4),
        ("shard:8", 0),
        ("gpu:a100", 1),
    ],
)
def test_gpu_count(gres: str, count: int) -> None:
    assert gpu_count(gres) == count


# ------------------------------------------------------------------------- errors


def test_errors_in_body_raise() -> None:
    body = load("v0.0.38_node_unknown.json")
    with pytest.raises(SlurmApiError) as info:
        normalize_nodes(body)
    assert 2018 in info.value.error_numbers


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["nodes"][1].__setitem__("state", 7), "nodes[1](node2).state"),
        (lambda b: b["nodes"][0].pop("name"), "nodes[0].name"),
        (lambda b: b["nodes"][2].__setitem__("alloc_cpus", "two"), "nodes[2](node3).alloc_cpus"),
        (lambda b: b["nodes"][0].__setitem__("partitions", 5), "nodes[0](node1).partitions"),
        (lambda b: b["nodes"][0].pop("cpus"), "nodes[0](node1).cpus"),
        (lambda b: b.pop("nodes"), "nodes"),
        (
            lambda b: b["nodes"][3].__setitem__("boot_time", {"set": True, "number": "x"}),
            "nodes[3](node4).boot_time.number",
        ),
    ],
)
def test_malformed_payload_names_the_field(mutate: Any, field: str) -> None:
    body = copy.deepcopy(load("v0.0.38_nodes_busy.json"))
    mutate(body)
    with pytest.raises(SlurmPayloadError) as info:
        normalize_nodes(body)
    assert info.value.field == field
    assert field in str(info.value)


def test_malformed_job_names_the_field() -> None:
    body = copy.deepcopy(load("v0.0.38_jobs_running.json"))
    body["jobs"][1]["nodes"] = "node[1-"
    with pytest.raises(SlurmPayloadError, match=r"jobs\[1\]\(2\)\.nodes"):
        normalize_jobs(body)


def test_observed_payload_is_sorted_and_complete() -> None:
    nodes = by_name(load("v0.0.42_nodes_constructed.json"))
    observed = nodes["cn7"].to_observed()
    assert isinstance(observed, SlurmNodeObserved)
    assert observed.flags == ("BLOCKED", "EXTERNAL") and observed.node == "cn7"
    assert observed.cpus == 64 and observed.partitions == ("standard",)


# ----------------------------------------------------------------------------- JWT


def test_mint_jwt_is_hs256_with_slurm_claims() -> None:
    key = b"k" * 32
    token = mint_jwt(key, "slurm", 900, now=1_000_000)
    header, payload, signature = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    assert json.loads(base64.urlsafe_b64decode(pad(header))) == {"alg": "HS256", "typ": "JWT"}
    claims = json.loads(base64.urlsafe_b64decode(pad(payload)))
    assert claims == {"exp": 1_000_900, "iat": 1_000_000, "sun": "slurm"}
    expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(pad(signature)) == expected
    assert jwt_expiry(token) == 1_000_900.0
    assert jwt_expiry("garbage") is None


def test_unwrap_infinite_time_limit() -> None:
    body = {
        "jobs": [
            {
                "job_id": 1,
                "job_state": ["RUNNING"],
                "time_limit": {"set": False, "infinite": True, "number": 0},
            }
        ]
    }
    assert normalize_jobs(body)[0].time_limit is None
    assert not math.isinf(normalize_jobs(body)[0].end_time or 0)


# ------------------------------------- the source on a replay of captured payloads


class Replay:
    """Serves captured slurmrestd answers (v0.0.38) so the source can be fed a
    malformed payload - something a real slurmctld cannot be made to produce."""

    def __init__(self) -> None:
        self.nodes: Any = load("v0.0.38_nodes_busy.json")
        self.jobs: Any = load("v0.0.38_jobs_running.json")

    def app(self) -> web.Application:
        app = web.Application()

        async def ping(request: web.Request) -> web.Response:
            if request.match_info["version"] != "v0.0.38":
                return web.Response(status=404, text="Unable find requested URL")
            return web.json_response({"meta": self.nodes["meta"], "errors": [], "pings": []})

        async def nodes(request: web.Request) -> web.Response:
            return web.json_response(self.nodes)

        async def jobs(request: web.Request) -> web.Response:
            return web.json_response(self.jobs)

        app.router.add_get("/slurm/{version}/ping", ping)
        app.router.add_get("/slurm/v0.0.38/nodes", nodes)
        app.router.add_get("/slurm/v0.0.38/jobs", jobs)
        return app


@pytest.fixture
async def replay(tmp_path: Path) -> AsyncIterator[tuple[Replay, str]]:
    server = Replay()
    runner = web.AppRunner(server.app())
    await runner.setup()
    socket_path = tmp_path / "replay.sock"
    site = web.UnixSite(runner, str(socket_path))
    await site.start()
    try:
        yield server, f"unix:{socket_path}"
    finally:
        await runner.cleanup()


async def test_source_survives_malformed_payload(replay: tuple[Replay, str]) -> None:
    server, url = replay
    batches: list[Sequence[Event]] = []

    async def sink(events: Sequence[Event]) -> None:
        batches.append(events)

    async with SlurmRestClient(url) as client:
        assert client.version == "v0.0.38"
        source = SlurmSource(client, sink)
        first = await source.poll_once()
        assert len([e for e in first if isinstance(e.payload, SlurmNodeObserved)]) == 4
        good = dict(source.nodes)
        server.nodes = copy.deepcopy(server.nodes)
        server.nodes["nodes"][2]["state_flags"] = "DRAIN"  # a string, not a list
        events = await source.poll_once()
        assert len(events) == 1
        health = events[0].payload
        assert isinstance(health, SourceHealth)
        assert (health.status, health.cause) == ("stale", "bad_payload")
        assert health.detail is not None and "nodes[2](node3).state_flags" in health.detail
        assert dict(source.nodes) == good  # last good state stands
        server.nodes = load("v0.0.38_nodes_busy.json")
        events = await source.poll_once()
        assert [e.payload for e in events] == [
            SourceHealth(source="slurm", status="fresh", cause=None, detail=None)
        ]


def test_demand_counts_jobs_the_scheduler_has_not_looked_at_yet() -> None:
    """A job right after submission pends with reason "None" until the scheduler runs;
    it waits for nodes all the same. A job held by its user does not."""
    jobs = normalize_jobs(load("v0.0.42_jobs_constructed.json"))
    pending = next(job for job in jobs if job.state == "PENDING")
    fresh = dataclasses.replace(pending, job_id=1, state_reason="None", node_count=2)
    held = dataclasses.replace(pending, job_id=2, state_reason="JobHeldUser", node_count=3)
    demand = compute_demand([fresh, held], ("standard",))["standard"]
    assert (demand.pending_jobs, demand.pending_nodes) == (2, 2)
