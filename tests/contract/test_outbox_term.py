"""I3 for the outbox: actions requested in an earlier term run in a new term only once
both sources have reported fresh in it. Those actions were decided on what the previous
leader saw, which may be a whole outage old; they wait for this term's view, as new
decisions do (docs/safety.md, I3)."""

from __future__ import annotations

import asyncio
import contextlib

from sunkd.domain.events import ActionRequested, Event, SourceHealth
from sunkd.domain.state import NodeState, OpenAction
from sunkd.runtime.reconciler import LeaderTerm, Reconciler
from sunkd.store.eventlog import EventLog


class Recording:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.called = asyncio.Event()

    async def execute(self, action: OpenAction, node: NodeState | None) -> bool:
        self.ran.append(action.action_id)
        self.called.set()
        return True


def _fresh(source: str) -> Event:
    return Event(source, SourceHealth(source=source, status="fresh"))


async def test_inherited_actions_wait_for_both_sources_in_the_new_term(
        database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        old = await log.acquire("old", lease_seconds=0.3)
        assert old is not None
        await log.append([_fresh("slurm"), _fresh("kubernetes"), Event("n1", ActionRequested(
            action_id="a1", side="kubernetes", verb="lock", node="n1", reason="inherited"))],
            old.epoch)
        await asyncio.sleep(0.5)  # the old leader dies: its lease runs out
        new = await log.acquire("new", lease_seconds=60)
        assert new is not None
        executor = Recording()
        engine = Reconciler(log, tick_seconds=0.05)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(
            LeaderTerm(new.epoch, lambda: True, executor=executor)))
        try:
            await asyncio.sleep(1.0)
            assert executor.ran == []  # both sources' fresh reports are the old term's
            [seq] = await log.append([_fresh("slurm")], new.epoch)
            await engine.wait_folded(seq)
            await asyncio.sleep(0.5)
            assert executor.ran == []  # Kubernetes has not reported in this term
            [seq] = await log.append([_fresh("kubernetes")], new.epoch)
            await engine.wait_folded(seq)
            await asyncio.wait_for(executor.called.wait(), 10)
            assert executor.ran == ["a1"]
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await log.close()
