"""The leader spends at most DECIDE_SHARE of its time in `decide`: after a decide that
took d seconds the next one waits 2d (sunkd/runtime/reconciler.py says why), except the
first decide on a view with both sources fresh. Gaps are asserted from below; the one
bound from above (the unpaced decide) has a margin of seconds against a 5 s pacing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import pytest

from sunkd.domain.events import Event, SourceHealth
from sunkd.runtime import reconciler as reconciler_module
from sunkd.runtime.reconciler import DECIDE_SHARE, LeaderTerm, Reconciler
from sunkd.store.eventlog import EventLog

DECIDE_S = 0.05


def _fresh(source: str) -> Event:
    return Event(source, SourceHealth(source=source, status="fresh"))


async def test_decides_are_spaced_by_their_cost(database_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float]] = []
    real_decide = reconciler_module.decide

    def slow_decide(*args: Any) -> Any:
        started = time.monotonic()
        time.sleep(DECIDE_S)  # a decide that costs what 10,000 nodes cost
        result = real_decide(*args)
        calls.append((started, time.monotonic()))
        return result

    monkeypatch.setattr(reconciler_module, "decide", slow_decide)
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        engine = Reconciler(log, tick_seconds=0.02)
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
        assert len(calls) >= 4
        wait = 1 / DECIDE_SHARE - 1
        # The first decide on both sources fresh is not paced (the next test): it is
        # calls[0] or calls[1], so every gap from calls[1] on is.
        for (_, ended), (started, _) in itertools.pairwise(calls[1:]):
            cost = DECIDE_S  # at least
            assert started - ended >= cost * wait * 0.95, (started - ended, calls)
    finally:
        await log.close()


async def test_the_first_decide_on_fresh_sources_is_not_paced(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decides before both sources are fresh cannot act; pacing on their cost must not
    put off the first one that can (a restart's first decision waited up to 2d)."""
    calls: list[tuple[float, float]] = []
    real_decide = reconciler_module.decide

    def slow_decide(*args: Any) -> Any:
        started = time.monotonic()
        time.sleep(DECIDE_S)
        result = real_decide(*args)
        calls.append((started, time.monotonic()))
        return result

    monkeypatch.setattr(reconciler_module, "decide", slow_decide)
    # Pacing of 100 decides' cost (5 s) after each: unmistakable if it applies.
    monkeypatch.setattr(reconciler_module, "DECIDE_SHARE", 1 / 101)
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        engine = Reconciler(log, tick_seconds=0.02)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(LeaderTerm(lease.epoch, lambda: True)))
        try:
            await log.append([_fresh("kubernetes")], lease.epoch)
            for _ in range(400):
                if calls:
                    break
                await asyncio.sleep(0.01)
            assert calls, "no decide on a view with one source fresh"
            fresh_at = time.monotonic()
            await log.append([_fresh("slurm")], lease.epoch)
            for _ in range(800):
                if len(calls) >= 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert len(calls) >= 2, calls
        assert calls[1][0] - fresh_at < 2.5, (calls, fresh_at)
        if len(calls) >= 3:  # decides after it are paced again
            assert calls[2][0] - calls[1][1] >= 4.5, calls
    finally:
        await log.close()
