"""Safety scenario 7 (two clocks), in the store: every acquire and renew measures the
database clock against this host's wall clock, so the daemon can decide on the database's
time (event times are the database's) and refuse to act when the two disagree too much."""

from __future__ import annotations

import time

import pytest

from sunkd.store.eventlog import EventLog


@pytest.mark.parametrize("skew", [0.0, 300.0, -42.0])
async def test_acquire_and_renew_measure_the_database_clock_offset(
    database_url: str, skew: float
) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        log.wall_clock = lambda: time.time() + skew  # a host clock `skew` seconds fast
        lease = await log.acquire("d1", 15)
        assert lease is not None
        assert abs(lease.db_offset + skew) < 2.0, lease.db_offset
        renewed = await log.renew(lease)
        assert abs(renewed.db_offset + skew) < 2.0, renewed.db_offset
    finally:
        await log.close()
