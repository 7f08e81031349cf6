"""Normalization against answers captured live from Slurm 24.11.5 (REST v0.0.42) and
26.05.5 (v0.0.43, v0.0.44, v0.0.45), and the client against their raw error answers.

The fixtures come from scripts/capture-slurm-fixtures.py on the test harness's private
clusters (tests/fixtures/slurm/README.md, captures-<release>.json). Nodes cap1..cap4 go
through: idle, busy (cap1 mixed, cap2 allocated, a job pending), draining, drained,
cap1 RESUMEd / cap2 UNDRAINed, cap3 admin DOWN, cap4 DOWN + NOT_RESPONDING.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.ownership import is_ours, slurm_drained
from sunkd.slurm.client import SUPPORTED_VERSIONS, SlurmRestClient
from sunkd.slurm.model import (
    SlurmApiError,
    SlurmAuthError,
    SlurmNode,
    SlurmUnavailableError,
)
from sunkd.slurm.normalize import _checked_node, normalize_jobs, normalize_nodes, slurm_release

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RELEASE = {"v0.0.42": "24.11.5", "v0.0.43": "26.05.5", "v0.0.44": "26.05.5", "v0.0.45": "26.05.5"}
LINGERS = {"v0.0.42"}  # 24.11: the old reason stays after RESUME/UNDRAIN
LIVE_NODE_FILES = sorted(
    p.name
    for p in FIXTURES.glob("v0.0.4*_node*.json")
    if "constructed" not in p.name and "unknown" not in p.name
)
SUNKD_REASON = "sunkd: lent to kubernetes [tx {}]"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def nodes(name: str) -> dict[str, SlurmNode]:
    return {n.name: n for n in normalize_nodes(load(name))}


def test_the_captures_are_there() -> None:
    assert len(LIVE_NODE_FILES) >= 17, LIVE_NODE_FILES
    for release in ("24.11.5", "26.05.5"):
        manifest = json.loads((FIXTURES / f"captures-{release}.json").read_text())
        assert manifest["slurm"] == release
        files = {entry["file"] for entry in manifest["files"]}
        assert all((FIXTURES / name).is_file() for name in files)


def test_every_served_version_is_known_newest_first() -> None:
    for version in RELEASE:
        assert version in SUPPORTED_VERSIONS
    assert SUPPORTED_VERSIONS[0] == "v0.0.45"
    assert list(SUPPORTED_VERSIONS) == sorted(
        SUPPORTED_VERSIONS, key=lambda v: [int(x) for x in v[1:].split(".")], reverse=True
    )


@pytest.mark.parametrize("name", LIVE_NODE_FILES)
def test_fast_and_checked_paths_agree_on_live_nodes(name: str) -> None:
    body = load(name)
    fast = normalize_nodes(body)
    checked = [_checked_node(raw, f"nodes[{i}]") for i, raw in enumerate(body["nodes"])]
    assert fast == checked
    assert slurm_release(body) == RELEASE[name.split("_", 1)[0]]


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_idle(version: str) -> None:
    found = nodes(f"{version}_nodes_idle.json")
    assert sorted(found) == ["cap1", "cap2", "cap3", "cap4"]
    for node in found.values():
        assert (node.state, node.flags, node.display_state) == ("IDLE", frozenset(), "idle")
        assert (node.cpus, node.alloc_cpus, node.partitions) == (2, 0, ("debug",))
        # 24.11 says reason_set_by_user "root" with an empty reason: no setter then.
        assert node.reason is None and node.reason_set_by is None and node.reason_time is None
        assert node.boot_time is not None and node.last_busy is not None
        assert node.slurmd_start_time is not None
        assert node.to_observed().slurmd_start_time == node.slurmd_start_time
        assert (node.gpus_total, node.gpus_used, node.features, node.comment) == (0, 0, (), None)


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_busy(version: str) -> None:
    found = nodes(f"{version}_nodes_busy.json")
    assert (found["cap1"].state, found["cap1"].alloc_cpus) == ("MIXED", 1)
    assert (found["cap2"].state, found["cap2"].alloc_cpus) == ("ALLOCATED", 2)
    assert found["cap1"].is_busy and found["cap2"].is_busy and not found["cap3"].is_busy


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"])
def test_draining(version: str) -> None:
    found = nodes(f"{version}_nodes_draining.json")
    for name, state in (("cap1", "MIXED"), ("cap2", "ALLOCATED")):
        node = found[name]
        assert (node.state, node.flags, node.display_state) == (state, {"DRAIN"}, "draining")
        assert node.is_drain and not node.is_drained
        assert (node.reason, node.reason_set_by) == (SUNKD_REASON.format(name), "root")
        assert node.reason_time is not None
    assert found["cap3"].flags == frozenset() and found["cap3"].reason_set_by is None


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_drained(version: str) -> None:
    found = nodes(f"{version}_nodes_drained.json")
    for name in ("cap1", "cap2"):
        node = found[name]
        assert node.is_drained and node.display_state == "drained" and node.alloc_cpus == 0
        assert slurm_drained(node.to_observed())
        assert is_ours(node.reason)


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_just_resumed_and_undrained(version: str) -> None:
    resumed = nodes(f"{version}_nodes_just_resumed.json")
    cap1 = resumed["cap1"]
    # RESUME: DRAIN gone at once, NOT_RESPONDING for about a second (docs/slurm.md).
    assert cap1.flags == {"NOT_RESPONDING"} and cap1.display_state == "idle*"
    assert resumed["cap2"].is_drained  # not resumed yet
    undrained = nodes(f"{version}_nodes_undrained.json")
    for node in (cap1, undrained["cap1"], undrained["cap2"]):
        assert not node.is_drain
        if version in LINGERS:
            # 24.11 keeps the text of the drain that is gone ...
            assert node.reason is not None and node.reason.startswith("sunkd: lent")
            assert node.reason_set_by == "root"
        else:
            assert node.reason is None and node.reason_set_by is None
        # ... which is never a drain, ours or anyone's.
        observed = node.to_observed()
        assert "DRAIN" not in observed.flags and not slurm_drained(observed)
    assert undrained["cap2"].flags == frozenset()


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"])
def test_down_and_not_responding(version: str) -> None:
    found = nodes(f"{version}_nodes_down_not_responding.json")
    cap3, cap4 = found["cap3"], found["cap4"]
    assert (cap3.state, cap3.flags, cap3.display_state) == ("DOWN", frozenset(), "down")
    assert (cap3.reason, cap3.reason_set_by) == ("admin: cable", "root")
    assert (cap4.state, cap4.flags, cap4.display_state) == ("DOWN", {"NOT_RESPONDING"}, "down*")
    assert (cap4.reason, cap4.reason_set_by) == ("Not responding", "slurm")
    assert not cap3.is_drain and not cap4.is_drain
    # The lingering 24.11 reasons on cap1/cap2 (resumed earlier) are still no drains.
    assert not found["cap1"].is_drain and not found["cap2"].is_drain


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_single_node_endpoint(version: str) -> None:
    [node] = normalize_nodes(load(f"{version}_node_cap3_down.json"))
    assert (node.name, node.state, node.reason) == ("cap3", "DOWN", "admin: cable")


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"])
def test_unknown_node_is_200_with_errors(version: str) -> None:
    with pytest.raises(SlurmApiError, match="Failure to query node nosuchnode"):
        normalize_nodes(load(f"{version}_node_unknown.json"))


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"])
def test_jobs(version: str) -> None:
    jobs = {j.job_id: j for j in normalize_jobs(load(f"{version}_jobs_running.json"))}
    assert [(j.state, j.nodes, j.node_count) for j in jobs.values()] == [
        ("RUNNING", ("cap1",), 1),
        ("RUNNING", ("cap2",), 1),
        ("PENDING", (), 1),
    ]
    assert jobs[3].state_reason == "Resources"
    assert all(j.partition == "debug" and j.time_limit is None for j in jobs.values())
    assert jobs[1].start_time is not None and jobs[1].end_time is not None


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_jobs_after_cancel(version: str) -> None:
    jobs = normalize_jobs(load(f"{version}_jobs_after_cancel.json"))
    assert {j.state for j in jobs} == {"CANCELLED"} and len(jobs) == 3


# ------------------------------------------------------------- raw error answers


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of every HTTP answer in `raw`, framed by Content-Length."""
    out: list[tuple[int, bytes]] = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length")
        )
        out.append((status, rest[:length]))
        raw = rest[length:]
    return out


ERROR_ANSWERS = {
    "nodes_bad_token": 511,
    "nodes_expired_token": 511,
    "nodes_no_token": 401,
    "nodes_controller_down": 502,
}


@pytest.mark.parametrize("what", sorted(ERROR_ANSWERS))
@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.45"])
def test_raw_error_answers(version: str, what: str) -> None:
    got = answers((FIXTURES / f"{version}_{what}_raw.http").read_bytes())
    status = ERROR_ANSWERS[what]
    if version == "v0.0.42":
        assert [s for s, _ in got] == [status]  # 24.11: one answer
    else:
        # 26.05.5 sends a second, text/plain answer after the first (see the client tests).
        assert [s for s, _ in got] == [status, status]
    if status != 401:
        assert json.loads(got[0][1])["errors"]


def test_refused_token_ping_is_200() -> None:
    """24.11+ answer /ping with a refused token 200 + responding false."""
    for version in ("v0.0.42", "v0.0.45"):
        [(status, body)] = answers((FIXTURES / f"{version}_ping_bad_token_raw.http").read_bytes())
        ping = json.loads(body)["pings"][0]
        assert status == 200 and ping["responding"] is False


class RawReplay:
    """A TCP server answering /ping with the live ping and /nodes with captured raw bytes,
    exactly as slurmrestd sent them (then it closes the connection)."""

    def __init__(self, version: str, what: str) -> None:
        self.ping = (FIXTURES / f"{version}_ping.json").read_bytes()
        self.raw = (FIXTURES / f"{version}_{what}_raw.http").read_bytes()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path.endswith(b"/ping"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(self.ping)}\r\n\r\n".encode()
                        + self.ping
                    )
                    await writer.drain()
                    continue
                writer.write(self.raw)
                await writer.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def replay(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    version, what = request.param
    server = await asyncio.start_server(RawReplay(version, what).handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


EXPECTED = {
    "nodes_bad_token": SlurmAuthError,
    "nodes_expired_token": SlurmAuthError,
    "nodes_no_token": SlurmAuthError,
    "nodes_controller_down": SlurmUnavailableError,
}
@pytest.mark.parametrize(
    "replay",
    [
        # v0.0.45: slurmrestd 26.05.5 doubles these answers (sunkd/slurm/firstanswer.py).
        pytest.param((version, what), id=f"{version}-{what}")
        for version in ("v0.0.42", "v0.0.45")
        for what in sorted(EXPECTED)
    ],
    indirect=True,
)
async def test_client_maps_the_live_error_answers(
    replay: str, request: pytest.FixtureRequest
) -> None:
    version, what = request.node.callspec.params["replay"]
    token = None if what == "nodes_no_token" else "x.y.z"
    client = SlurmRestClient(replay, token=token, versions=(version,), timeout=5)
    try:
        assert await client.negotiate() == version
        with pytest.raises(EXPECTED[what]):
            await client.get_nodes()
    finally:
        await client.close()
