"""Busy and idle node-hours of a period, read from the log (for `sunkd audit` and the
status page).

The measure itself is the pure fold `sunkd.domain.utilization`; this module only feeds
it the log. Who owns a node and whether it is busy at the start of a period depends on
everything before it, so the log is read from its first row, filtered on the few event
kinds the fold needs (`utilization.KINDS`, served by the `(kind, seq)` index; the
sources append observations only when they change), and reading stops at the first
event recorded at or after the period's end. A log whose oldest rows were archived
(`sunkd log archive`) starts from the snapshot just below its first live row (the
archive's base snapshot): nodes are seeded from that state, the ones not moving in the
pool that selects them. No SQL view: the measure needs per-node state across event
kinds, which a fold says in a few lines and SQL in many (and the schema is not changed
for it).

`RollingUtilization` serves the status page's "last 24 h" without re-reading the log on
every render: it reads the log once, then only what was appended since, and keeps hourly
buckets (`Utilization(bucket_seconds=...)`), so the window starts on the hour 24 hours
ago and is exact from there (bench/utilization.py measures both paths).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from datetime import UTC, datetime

import structlog
from sqlalchemy import func, select

from sunkd.domain.policy import PoolSpec, effective_pools, membership
from sunkd.domain.snapshot import state_from_json
from sunkd.domain.utilization import KINDS, Row, Utilization
from sunkd.store.eventlog import EventLog
from sunkd.store.models import events, snapshots

PAGE = 5000
# The status page folds inside the daemon's event loop: smaller pages keep each stretch
# of decoding short (tens of ms), so lease renewal and health checks are not delayed.
ROLLING_PAGE = 1000
log = structlog.get_logger(__name__)


async def _seeded(event_log: EventLog, pools: Sequence[PoolSpec], start: float | None,
                  end: float | None, bucket_seconds: float | None) -> tuple[Utilization, int]:
    """A fold ready to read the live log, and the seq to read after: empty from seq 0,
    or seeded from the snapshot below the first live row when older rows are gone."""
    empty = Utilization(start, end, bucket_seconds)
    async with event_log.engine.connect() as connection:
        first = (await connection.execute(select(func.min(events.c.seq)))).scalar()
        if first is None or int(first) <= 1:
            return empty, 0
        row = (await connection.execute(
            select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.seq < int(first))
            .order_by(snapshots.c.seq.desc()).limit(1))).first()
    if row is None:
        log.warning("utilization.no_base_snapshot", first_seq=int(first))
        return empty, 0
    try:
        state = state_from_json(dict(row.state))
    except (KeyError, ValueError, TypeError) as error:
        log.warning("utilization.base_snapshot_unreadable", seq=int(row.seq), error=str(error))
        return empty, 0
    at = state.last_recorded_at if state.last_recorded_at is not None else 0.0
    pools_of = membership(state, effective_pools(state, pools))
    return Utilization.from_state(state, at, pools_of, start, end, bucket_seconds), int(row.seq)


async def utilization(event_log: EventLog, since: datetime, until: datetime,
                      pools: Sequence[PoolSpec] = ()) -> Utilization:
    """The fold over [since, until), advanced to `until`. `pools` (config-file pools)
    only matter for seeding an archived log's base."""
    start, end = since.timestamp(), until.timestamp()
    fold, position = await _seeded(event_log, pools, start, end, None)
    while True:
        batch = await event_log.read(position, PAGE, kinds=KINDS)
        for event in batch:
            if event.recorded_at.timestamp() >= end:
                fold.advance(end)
                return fold
            fold.apply(event)
        if len(batch) < PAGE:
            break
        position = batch[-1].seq
    fold.advance(end)
    return fold


class RollingUtilization:
    """Busy/idle node-hours of the last `hours`, rounded down to the hour, kept current
    incrementally (one per event log; safe for concurrent callers)."""

    def __init__(self, event_log: EventLog, hours: float = 24.0, bucket_seconds: float = 3600.0
                 ) -> None:
        self.event_log = event_log
        self.hours = hours
        self.bucket_seconds = bucket_seconds
        self._fold: Utilization | None = None
        self._position = 0  # last seq read (of a relevant event, or the base snapshot)
        self._lock = asyncio.Lock()

    def window_start(self, now: datetime) -> datetime:
        moment = now.timestamp() - self.hours * 3600
        aligned = math.floor(moment / self.bucket_seconds) * self.bucket_seconds
        return datetime.fromtimestamp(aligned, tz=UTC)

    async def rows(self, now: datetime, pools: Sequence[PoolSpec] = ()
                   ) -> tuple[datetime, list[Row]]:
        """(start of the window, rows from it up to `now`)."""
        start = self.window_start(now)
        async with self._lock:
            if self._fold is None:
                self._fold, self._position = await _seeded(
                    self.event_log, pools, start.timestamp(), None, self.bucket_seconds)
            fold = self._fold
            while True:
                batch = await self.event_log.read(self._position, ROLLING_PAGE, kinds=KINDS)
                fold.apply_all(batch)
                if batch:
                    self._position = batch[-1].seq
                if len(batch) < ROLLING_PAGE:
                    break
            fold.advance(now.timestamp())
            fold.prune(start.timestamp())
            return start, fold.since(start.timestamp())
