"""How often the leader decides (issue 15: at 10,000 nodes one decision takes ~0.7 s).

- While the fold catches up (a first sync or a restart hands it thousands of events at
  once), the engine does not decide on each intermediate state: those decisions would be
  stale by the next batch, and at scale they were most of the time to the first decision.
- With nothing new in the log it re-decides at a pace set by what deciding costs, not on
  every tick, so an idle big cluster does not keep a core busy.

Both use the real `decide` (wrapped to record the state it saw and, for the second, to take
the time a big cluster's decision takes)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sunkd.domain.events import Event, PoolsConfigured, SlurmNodeObserved
from sunkd.runtime import engine as engine_module
from sunkd.runtime.engine import CONFIG_SUBJECT, FOLLOW_BATCH, Engine, LeaderTerm
from sunkd.store.eventlog import EventLog


def _recording_decide(seen: list[int], cost: float = 0.0) -> Any:
    real = engine_module.decide

    def decide(state: Any, pools: Any, now: float) -> Any:
        seen.append(state.last_seq)
        if cost:
            time.sleep(cost)  # what deciding on a big cluster costs
        return real(state, pools, now)

    return decide


async def _eventually(done: Any, within: float = 30.0) -> None:
    """`decide` may run in a worker thread: poll what it recorded."""
    for _ in range(int(within / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within the time")


async def _leading(log: EventLog, engine: Engine) -> LeaderTerm:
    lease = await log.acquire("pacing-test", 30.0)
    assert lease is not None
    return LeaderTerm(epoch=lease.epoch, may_act=lambda: True)


async def test_no_decision_on_the_states_of_a_catch_up(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await EventLog.open(database_url, migrate=True)
    seen: list[int] = []
    monkeypatch.setattr(engine_module, "decide", _recording_decide(seen))
    try:
        # The config pools are in the log already (as after a term's start), so the
        # engine decides at once on what it has folded.
        await log.append_unfenced([Event(CONFIG_SUBJECT, PoolsConfigured(pools=()))])
        engine = Engine(log, tick_seconds=0.05)
        term = await _leading(log, engine)
        following = asyncio.create_task(engine.follow())
        leading = asyncio.create_task(engine.lead(term))
        await _eventually(lambda: bool(seen))
        before = max(seen)
        # A first sync's observations: thousands of events in one append.
        count = 3 * FOLLOW_BATCH + 10
        await log.append_unfenced([
            Event(f"n{i}", SlurmNodeObserved(node=f"n{i}", state="IDLE"))
            for i in range(count)])
        latest = await log.latest_seq()
        await _eventually(lambda: any(seq >= latest for seq in seen))
        leading.cancel()
        following.cancel()
        await asyncio.gather(leading, following, return_exceptions=True)
        # Decided before the catch-up and on its end; never on a full batch in between.
        assert [seq for seq in seen if before < seq < latest] == [], seen
    finally:
        await log.close()


async def test_an_unchanged_state_is_not_redecided_every_tick(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await EventLog.open(database_url, migrate=True)
    seen: list[int] = []
    monkeypatch.setattr(engine_module, "decide", _recording_decide(seen, cost=0.05))
    try:
        engine = Engine(log, tick_seconds=0.02)
        term = await _leading(log, engine)
        following = asyncio.create_task(engine.follow())
        leading = asyncio.create_task(engine.lead(term))
        await asyncio.sleep(2.0)
        leading.cancel()
        following.cancel()
        await asyncio.gather(leading, following, return_exceptions=True)
        # Every tick (20 ms) with a 50 ms decision would be ~28 decisions in 2 s; paced at
        # 10x the decision's cost (0.5 s) it is ~4, plus the first ones of the term.
        assert 1 <= len(seen) <= 10, len(seen)
    finally:
        await log.close()
