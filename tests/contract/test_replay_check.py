"""`sunkd replay --check` passes on a consistent log and catches a snapshot that does
not match the events before it."""

from __future__ import annotations

from sunkd.cli.operator import replay_check
from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.domain.fold import fold
from sunkd.domain.snapshot import state_to_json
from sunkd.store.eventlog import EventLog


async def test_replay_check_passes_then_catches_a_tampered_snapshot(database_url: str) -> None:
    event_log = await EventLog.open(database_url, migrate=True)
    try:
        lease = await event_log.acquire("replayer")
        assert lease is not None
        await event_log.append([Event("n1", SlurmNodeObserved(node="n1", state="IDLE")),
                                Event("n2", SlurmNodeObserved(node="n2", state="MIXED"))],
                               lease.epoch)
        state = fold([e async for batch in event_log.read_range() for e in batch])
        await event_log.save_snapshot(state.last_seq, state_to_json(state))
        await event_log.append([Event("n1", SlurmNodeObserved(node="n1", state="ALLOCATED"))],
                               lease.epoch)
        assert await replay_check(event_log) == []

        tampered = state_to_json(fold([e async for batch in event_log.read_range()
                                       for e in batch]))
        tampered["last_seq"] = tampered["last_seq"] + 1  # claims a later position...
        tampered_seq = int(tampered["last_seq"])
        await event_log.append([Event("n2", SlurmNodeObserved(node="n2", state="IDLE"))],
                               lease.epoch)
        await event_log.save_snapshot(tampered_seq, tampered)  # ...without that event
        problems = await replay_check(event_log)
        assert any(p.startswith(f"snapshot {tampered_seq} vs replay") for p in problems)
        assert any(p.startswith("snapshot+tail vs full replay") for p in problems)
    finally:
        await event_log.close()
