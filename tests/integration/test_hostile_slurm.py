"""Hostile inputs, the Slurm side, against the FAKE slurmrestd of
testbed/sunkd_testbed/slurmrestd.py: every failure of a poll or of its append makes the Slurm
source stale with a cause (12.1), a duplicate node name invalidates the whole poll
(12.6), slurmrestd answers are size-capped (12.10), and strings from Slurm are
sanitised before they reach the log (12.1, NUL on PostgreSQL).

Each test first has the source fresh on a clean answer, then injects one fault, then
checks that the source went stale with the expected cause and emitted no observation,
and (where it matters) that a clean answer makes it fresh again."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from sunkd.domain.events import Event, SlurmNodeObserved, SourceHealth
from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.source import SlurmSource
from sunkd.store.eventlog import EventLog
from sunkd_testbed.slurmrestd import FakeSlurmrestd

pytestmark = pytest.mark.timeout(120)


class Sink:
    """Records every batch; `fail_observations` makes batches that carry anything but
    source.health fail, as an append refused by the database would."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self.fail_observations = False

    async def __call__(self, events: Sequence[Event]) -> None:
        if self.fail_observations and any(
                not isinstance(e.payload, SourceHealth) for e in events):
            raise RuntimeError("append failed: simulated database refusal")
        self.batches.append(list(events))

    @property
    def events(self) -> list[Event]:
        return [e for batch in self.batches for e in batch]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlurmrestd]:
    async with FakeSlurmrestd() as server:
        yield server


@pytest.fixture
async def client(fake: FakeSlurmrestd) -> AsyncIterator[SlurmRestClient]:
    c = SlurmRestClient(fake.url)
    try:
        yield c
    finally:
        await c.close()


async def _fresh_source(client: SlurmRestClient, sink: Sink) -> SlurmSource:
    source = SlurmSource(client, sink, poll_interval=0.2)
    first = await source.poll_once()
    assert source.health is not None and source.health.status == "fresh", first
    return source


async def _stale_after(fake: FakeSlurmrestd, source: SlurmSource, mode: str) -> SourceHealth:
    """Inject `mode`, poll once; the poll must not raise, must emit exactly one
    source.health (stale) and no observation."""
    fake.mode = mode
    events = await source.poll_once()
    assert [type(e.payload) for e in events] == [SourceHealth], events
    health = source.health
    assert health is not None and health.status == "stale", health
    assert health.cause and health.detail
    return health


async def _recovers(fake: FakeSlurmrestd, source: SlurmSource) -> None:
    fake.mode = "ok"
    await source.poll_once()
    assert source.health is not None and source.health.status == "fresh"


# ------------------------------------------------------------------ 12.1 failures


async def test_nan_in_json_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    source = await _fresh_source(client, Sink())
    health = await _stale_after(fake, source, "nan")
    assert health.cause == "bad_payload"
    assert "NaN" in (health.detail or "")
    await _recovers(fake, source)


async def test_truncated_body_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    source = await _fresh_source(client, Sink())
    health = await _stale_after(fake, source, "truncated")
    assert health.cause == "truncated"
    await _recovers(fake, source)


async def test_bad_status_line_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    source = await _fresh_source(client, Sink())
    health = await _stale_after(fake, source, "bad_status_line")
    assert health.cause == "bad_response"
    assert "status line" in (health.detail or "").lower()
    await _recovers(fake, source)


async def test_json_nested_100k_deep_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    source = await _fresh_source(client, Sink())
    health = await _stale_after(fake, source, "deep_nesting")
    assert health.cause == "bad_payload"
    assert "nested" in (health.detail or "")
    await _recovers(fake, source)


async def test_failed_append_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    sink = Sink()
    source = await _fresh_source(client, sink)
    fake.nodes[1]["state"] = ["ALLOCATED"]  # a change, so the next poll appends
    sink.fail_observations = True
    events = await source.poll_once()
    assert [type(e.payload) for e in events] == [SourceHealth]
    assert source.health is not None and source.health.status == "stale"
    assert source.health.cause == "append_failed"
    assert "simulated database refusal" in (source.health.detail or "")
    # The observation that failed is not taken as emitted: it comes again once the
    # log accepts appends.
    sink.fail_observations = False
    events = await source.poll_once()
    assert [e.subject for e in events if isinstance(e.payload, SlurmNodeObserved)] == ["gpu-a002"]
    assert source.health.status == "fresh"


async def test_unexpected_error_in_a_poll_makes_slurm_source_stale(
        fake: FakeSlurmrestd, client: SlurmRestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-all at the source boundary: a bug (here: an exception no layer below
    maps) still turns the source stale with the exception named."""
    source = await _fresh_source(client, Sink())

    async def broken() -> list[object]:
        raise KeyError("surprise")

    monkeypatch.setattr(client, "get_jobs", broken)
    events = await source.poll_once()
    assert [type(e.payload) for e in events] == [SourceHealth]
    assert source.health is not None and source.health.status == "stale"
    assert source.health.cause == "internal_error"
    assert "KeyError" in (source.health.detail or "")


async def test_nul_in_node_comment_is_sanitised_before_the_postgres_append(
        fake: FakeSlurmrestd, client: SlurmRestClient, postgres_url: str) -> None:
    """PostgreSQL's JSONB refuses \\u0000: before, the append failed on every poll while
    the source stayed fresh. Now NUL and control characters from Slurm are replaced
    (U+FFFD) before they reach the log, and the poll succeeds."""
    fake.mode = "nul"
    log = await EventLog.open(postgres_url, migrate=True)
    try:
        lease = await log.acquire("hostile-test", 60)
        assert lease is not None

        async def sink(events: Sequence[Event]) -> None:
            await log.append(events, lease.epoch)

        source = SlurmSource(client, sink)
        await source.poll_once()
        assert source.health is not None and source.health.status == "fresh", source.health
        observed = [e.payload for e in await log.read(kinds=["slurm.node.observed"])]
        first = next(p for p in observed
                     if isinstance(p, SlurmNodeObserved) and p.node == "gpu-a001")
        assert first.comment == "x\ufffdy"
        assert first.reason == "bad\ufffdreason \ufffd[31mred\ufffd[0m"
    finally:
        await log.close()


async def test_daemon_readyz_turns_503_when_slurm_answers_nan(
        fake: FakeSlurmrestd, tmp_path: Path) -> None:
    """The symptom of the fault run: `/readyz` stayed 200 and sunkd_source_fresh 1."""
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}",
                        listen="127.0.0.1:0", lease_seconds=3,
                        slurm=SlurmSettings(url=fake.url, poll_interval=0.2),
                        kubernetes=KubernetesSettings(enabled=False))
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.run())
    try:
        async with aiohttp.ClientSession() as http:
            async def readyz() -> int:
                async with http.get(f"http://127.0.0.1:{daemon.http_port}/readyz") as r:
                    return r.status

            async def slurm_fresh_metric() -> float:
                async with http.get(f"http://127.0.0.1:{daemon.http_port}/metrics") as r:
                    text = await r.text()
                for line in text.splitlines():
                    if line.startswith('sunkd_source_fresh{source="slurm"}'):
                        return float(line.split()[-1])
                return math.nan

            async def wait_for(status: int, fresh: float) -> None:
                deadline = time.monotonic() + 20
                last: tuple[int, float] = (0, math.nan)
                while time.monotonic() < deadline:
                    if daemon.http_port is not None:
                        last = (await readyz(), await slurm_fresh_metric())
                        if last == (status, fresh):
                            return
                    await asyncio.sleep(0.1)
                pytest.fail(f"expected /readyz {status} and sunkd_source_fresh {fresh}, "
                            f"still {last}")

            await wait_for(200, 1.0)
            fake.mode = "nan"
            await wait_for(503, 0.0)
            fake.mode = "ok"
            await wait_for(200, 1.0)
    finally:
        daemon.stop_event.set()
        await asyncio.wait_for(task, 30)


# ---------------------------------------------------------------- 12.6 duplicates


async def test_duplicate_node_names_make_the_whole_poll_invalid(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    """Before: a node listed twice with two states alternated every poll (7 drains in
    25 s in the fault run). Now the poll is invalid: stale, no observation."""
    sink = Sink()
    source = await _fresh_source(client, sink)
    before, emitted = dict(source.nodes), len(sink.events)
    health = await _stale_after(fake, source, "duplicates")
    assert health.cause == "duplicate_node"
    assert "duplicate node name 'gpu-a001'" in (health.detail or "")
    for _ in range(3):  # no flapping: nothing more is emitted while it lasts
        assert await source.poll_once() == []
    assert source.health is not None and source.health.status == "stale"
    assert dict(source.nodes) == before
    assert [type(e.payload) for e in sink.events[emitted:]] == [SourceHealth]
    await _recovers(fake, source)


# ------------------------------------------------------------- 12.10 size limit


async def test_huge_answer_is_cut_at_the_default_cap(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    """A 160 MiB answer (chunked, so no Content-Length to refuse up front) is read
    only up to the 64 MiB default cap, then the source is stale with `too_large`.
    Before: read whole (and parsed, and the source fresh)."""
    source = await _fresh_source(client, Sink())
    fake.huge_bytes = 160 * 2**20
    health = await _stale_after(fake, source, "huge")
    assert health.cause == "too_large"
    assert str(64 * 2**20) in (health.detail or "")
    # What the fake got written before it saw the hang-up: the cap plus socket buffers.
    assert fake.body_bytes_sent < 96 * 2**20, fake.body_bytes_sent
    await _recovers(fake, source)


async def test_huge_answer_with_content_length_is_refused_unread(
        fake: FakeSlurmrestd) -> None:
    """With a configured cap (slurm.max_response_bytes) and a Content-Length over it,
    the body is not read at all."""
    settings = SlurmSettings(url=fake.url, max_response_bytes=2**20)
    client = SlurmRestClient.from_settings(settings)
    try:
        source = await _fresh_source(client, Sink())
        fake.huge_bytes, fake.huge_content_length = 400 * 2**20, True
        health = await _stale_after(fake, source, "huge")
        assert health.cause == "too_large"
        assert fake.body_bytes_sent < 32 * 2**20, fake.body_bytes_sent
        await _recovers(fake, source)
    finally:
        await client.close()


# ------------------------------------------------------------ the fake's other mode


async def test_unknown_state_is_reported_as_slurm_gave_it(
        fake: FakeSlurmrestd, client: SlurmRestClient) -> None:
    """The source reports an unknown base state verbatim (the domain decides what an
    unknown state means for ownership)."""
    sink = Sink()
    source = await _fresh_source(client, sink)
    fake.mode = "unknown_state"
    events = await source.poll_once()
    assert [(e.subject, getattr(e.payload, "state", None)) for e in events] == [
        ("gpu-a001", "BOGUS")]
    assert source.health is not None and source.health.status == "fresh"
