"""The lease code never trusts the leadership row's numbers blindly. A
NaN/inf/absurd `lease_seconds` in the shared row (written by a daemon that accepted
`SUNKD_LEASE_SECONDS=nan`) used to make every replica fail `leadership.acquire_failed`
forever (`timedelta(seconds=nan)` raises)."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import pytest
from sqlalchemy import text

from sunkd.store.eventlog import EventLog


async def _poison(log: EventLog, value: float, *, age_seconds: float) -> None:
    """Write `value` as the row's lease_seconds, held by a dead daemon that renewed
    `age_seconds` ago (SQLite stores NaN as NULL, so it gets the text 'nan')."""
    stored: object = value
    if log.dialect == "sqlite" and math.isnan(value):
        stored = "nan"
    async with log.engine.begin() as connection:
        now = await log._db_now(connection)
        await connection.execute(text(
            "UPDATE leadership SET holder = 'dead-daemon', lease_seconds = :value, "
            "renewed_at = :renewed, epoch = epoch + 1"),
            {"value": stored,
             "renewed": log._backend.recorded_at(now - timedelta(seconds=age_seconds))})


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300, -5.0])
async def test_poisoned_lease_row_does_not_wedge_acquisition(database_url: str,
                                                             value: float) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        await _poison(log, value, age_seconds=60)
        lease = await log.acquire("survivor", 15)
        assert lease is not None
        info = await log.leader()
        assert info.holder == "survivor" and info.lease_seconds == 15
    finally:
        await log.close()


async def test_poisoned_row_of_a_live_holder_counts_with_our_lease_length(
        database_url: str) -> None:
    """A just-renewed holder with an infinite lease is not taken over at once (that
    would be two leaders acting), nor never: the row's number is replaced by ours."""
    log = await EventLog.open(database_url, migrate=True)
    try:
        await _poison(log, math.inf, age_seconds=0)
        assert await log.acquire("candidate", 0.5) is None
        await asyncio.sleep(0.7)
        assert await log.acquire("candidate", 0.5) is not None
    finally:
        await log.close()


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0, 1e300])
async def test_acquire_refuses_to_write_a_hostile_lease_length(database_url: str,
                                                               value: float) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        before = await log.leader()
        with pytest.raises(ValueError, match="lease_seconds"):
            await log.acquire("careless", value)
        after = await log.leader()
        assert (after.holder, after.epoch) == (before.holder, before.epoch)
    finally:
        await log.close()
