"""A log shares the payloads it appended with its own readers (store/recent.py), on
SQLite and PostgreSQL, and only where the row decodes to an identical value."""

from __future__ import annotations

import pytest

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.store.eventlog import EventLog, StaleLeaderError


def node(name: str, partitions: tuple[str, ...] | list[str] = ("gpu",)) -> Event:
    return Event(subject=name, payload=SlurmNodeObserved(
        node=name, state="IDLE", cpus=64, partitions=partitions))  # type: ignore[arg-type]


async def test_a_read_back_shares_what_this_log_appended(database_url: str) -> None:
    writer = await EventLog.open(database_url, migrate=True)
    standby = await EventLog.open(database_url)
    try:
        lease = await writer.acquire("leader", 30.0)
        assert lease is not None
        batch = [node("n1"), node("n2"), node("n3", ["gpu"])]  # a list: not as it decodes
        seqs = await writer.append(batch, lease.epoch)
        read = {e.seq: e.payload for e in await writer.read(0, 100)}
        assert read[seqs[0]] is batch[0].payload and read[seqs[1]] is batch[1].payload
        # The list decodes as a tuple: equal by ==, yet the reader gets the decoded tuple,
        # exactly what a standby or a restart folds.
        assert read[seqs[2]] is not batch[2].payload
        assert type(read[seqs[2]].partitions) is tuple  # type: ignore[attr-defined]
        elsewhere = {e.seq: e.payload for e in await standby.read(0, 100)}
        assert elsewhere == read and elsewhere[seqs[0]] is not batch[0].payload
        again = {e.seq: e.payload for e in await writer.read(0, 100)}
        assert again == read and again[seqs[0]] is not batch[0].payload  # shared once
        assert len(writer.recent) == 0
    finally:
        await standby.close()
        await writer.close()


async def test_a_refused_append_is_not_remembered(database_url: str) -> None:
    writer = await EventLog.open(database_url, migrate=True)
    try:
        lease = await writer.acquire("leader", 30.0)
        assert lease is not None
        before = len(writer.recent)
        with pytest.raises(StaleLeaderError):
            await writer.append([node("n1")], lease.epoch + 1)
        assert len(writer.recent) == before
    finally:
        await writer.close()
