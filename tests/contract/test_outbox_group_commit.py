"""The outbox appends the outcomes of actions that finish together in a few transactions,
not one each (sunkd/runtime/groupcommit.py says why), and every outcome still lands,
folds and frees its slot."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from sunkd.domain.events import ActionRequested, ActionSucceeded, Event, SourceHealth
from sunkd.domain.state import NodeState, OpenAction
from sunkd.runtime.reconciler import LeaderTerm, Reconciler
from sunkd.store.eventlog import EventLog

ACTIONS = 16  # the engine's default max_concurrent_actions


class Barrier:
    """Every action waits until all of them have started, then they finish at once."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.started: list[str] = []
        self.all_started = asyncio.Event()

    async def execute(self, action: OpenAction, node: NodeState | None) -> bool:
        self.started.append(action.action_id)
        if len(self.started) >= self.count:
            self.all_started.set()
        await self.all_started.wait()
        return True


def _fresh(source: str) -> Event:
    return Event(source, SourceHealth(source=source, status="fresh"))


async def test_outcomes_finishing_together_share_transactions(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    outcome_appends: list[int] = []
    last_outcome_seq = 0
    all_appended = asyncio.Event()
    append = log.append

    async def counting(events: Sequence[Event], epoch: int) -> list[int]:
        nonlocal last_outcome_seq
        outcomes = sum(isinstance(event.payload, ActionSucceeded) for event in events)
        seqs = await append(events, epoch)
        if outcomes:
            outcome_appends.append(outcomes)
            last_outcome_seq = max(last_outcome_seq, seqs[-1])
            if sum(outcome_appends) >= ACTIONS:
                all_appended.set()
        return seqs

    log.append = counting  # type: ignore[method-assign]
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        requested = [Event(f"n{i}", ActionRequested(
            action_id=f"a{i}", side="kubernetes", verb="lock", node=f"n{i}", reason="test"))
            for i in range(ACTIONS)]
        seqs = await log.append([_fresh("slurm"), _fresh("kubernetes"), *requested],
                                lease.epoch)
        executor = Barrier(ACTIONS)
        engine = Reconciler(log, tick_seconds=0.05,
                        max_concurrent_actions=ACTIONS)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(
            LeaderTerm(lease.epoch, lambda: True, executor=executor)))
        try:
            await engine.wait_folded(seqs[-1])
            await asyncio.wait_for(all_appended.wait(), 20)
            await engine.wait_folded(last_outcome_seq)
            assert engine.state.pending_actions() == []
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert sorted(executor.started) == sorted(f"a{i}" for i in range(ACTIONS))
        assert sum(outcome_appends) == ACTIONS
        # One transaction per outcome before group commit; now the first to finish goes
        # alone and the others wait for it and go together.
        assert len(outcome_appends) <= 4, outcome_appends
        succeeded = [recorded.payload.action_id
                     for recorded in await log.read(0, limit=1000, kinds=["action.succeeded"])
                     if isinstance(recorded.payload, ActionSucceeded)]
        assert sorted(succeeded) == sorted(f"a{i}" for i in range(ACTIONS))
    finally:
        await log.close()

