"""The leader spends at most DECIDE_SHARE of its time in `decide`: after a decide that
took d seconds the next one waits 2d (sunkd/runtime/engine.py says why). Asserted from
below only: a slow machine makes the gaps longer, never shorter."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import pytest

from sunkd.domain.events import Event, SourceHealth
from sunkd.runtime import engine as engine_module
from sunkd.runtime.engine import DECIDE_SHARE, Engine, LeaderTerm
from sunkd.store.eventlog import EventLog

DECIDE_S = 0.05


def _fresh(source: str) -> Event:
    return Event(source, SourceHealth(source=source, status="fresh"))


async def test_decides_are_spaced_by_their_cost(database_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float]] = []
    real_decide = engine_module.decide

    def slow_decide(*args: Any) -> Any:
        started = time.monotonic()
        time.sleep(DECIDE_S)  # a decide that costs what 10,000 nodes cost
        result = real_decide(*args)
        calls.append((started, time.monotonic()))
        return result

    monkeypatch.setattr(engine_module, "decide", slow_decide)
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        engine = Engine(log, tick_seconds=0.02)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(LeaderTerm(lease.epoch, lambda: True)))
        try:
            # A stream of changes, each one a reason to decide again.
            for i in range(40):
                await log.append([_fresh("slurm" if i % 2 else "kubernetes")], lease.epoch)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert len(calls) >= 3
        wait = 1 / DECIDE_SHARE - 1
        for (_, ended), (started, _) in itertools.pairwise(calls):
            cost = DECIDE_S  # at least
            assert started - ended >= cost * wait * 0.95, (started - ended, calls)
    finally:
        await log.close()
