"""The outbox never runs an action whose transition has ended before it ran (an operator
pin aborting a reclaim must stop its queued eviction too): the leader closes it in the log
with a non-retryable `action.failed` saying why, and runs what still belongs (actions of
open transitions, actions outside any transition). On a real store, through the engine."""

from __future__ import annotations

import asyncio
import contextlib

from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    Event,
    SourceHealth,
    TransitionAborted,
    TransitionStarted,
)
from sunkd.domain.state import NodeState, OpenAction
from sunkd.runtime.reconciler import LeaderTerm, Reconciler
from sunkd.store.eventlog import EventLog


class Recording:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def execute(self, action: OpenAction, node: NodeState | None) -> bool:
        self.ran.append(action.action_id)
        return True


def _request(action_id: str, node: str, verb: str, transition_id: str | None) -> Event:
    return Event(node, ActionRequested(action_id=action_id, transition_id=transition_id,
                                       side="kubernetes", verb=verb, node=node,
                                       reason="test"))


async def test_actions_of_an_ended_transition_are_closed_not_run(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await log.acquire("leader", lease_seconds=60)
        assert lease is not None
        reclaim = TransitionStarted(transition_id="tx-1", node="n1", pool="p",
                                    from_owner="kubernetes", to_owner="slurm")
        lend = TransitionStarted(transition_id="tx-2", node="n2", pool="p",
                                 from_owner="slurm", to_owner="kubernetes")
        await log.append([
            Event("n1", reclaim), _request("evict-1", "n1", "evict", "tx-1"),
            Event("n1", TransitionAborted(transition_id="tx-1", node="n1",
                                          reason="operator pinned the node to kubernetes")),
            Event("n2", lend), _request("unlock-2", "n2", "unlock", "tx-2"),
            _request("warn-3", "n3", "warn", None),
        ], lease.epoch)
        executor = Recording()
        engine = Reconciler(log, tick_seconds=0.05)
        await engine.load()
        follow = asyncio.create_task(engine.follow())
        lead = asyncio.create_task(engine.lead(
            LeaderTerm(lease.epoch, lambda: True, executor=executor)))
        try:
            await log.append([Event(s, SourceHealth(source=s, status="fresh"))
                              for s in ("slurm", "kubernetes")], lease.epoch)
            outcomes: dict[str, ActionFailed | ActionSucceeded] = {}
            async with asyncio.timeout(20):
                while len(outcomes) < 3:
                    await asyncio.sleep(0.05)
                    for event in await log.read(0, limit=1000):
                        if isinstance(event.payload, ActionFailed | ActionSucceeded):
                            outcomes[event.payload.action_id] = event.payload
        finally:
            for task in (lead, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert sorted(executor.ran) == ["unlock-2", "warn-3"]
        closed = outcomes["evict-1"]
        assert isinstance(closed, ActionFailed) and not closed.retryable
        assert "tx-1" in closed.error and "ended before it ran" in closed.error
        assert isinstance(outcomes["unlock-2"], ActionSucceeded)
    finally:
        await log.close()
