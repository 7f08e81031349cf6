"""`sunkd history` and `sunkd audit`: the read models as answers people ask for.

`history NODE` lists the ownership intervals of one node with who decided each change
and why; `audit` summarizes a period: hours per pool and owner, busy and idle
node-hours per pool and owner (the figure the pool exists to raise), transitions by
direction and outcome, aborts, the slowest drains and failed actions. They read the SQL
read models (`EventLog.read_models`) and, for busy/idle, the log itself through the
utilization fold (`sunkd.store.utilization`), so they work on SQLite and PostgreSQL
alike and never need the daemon. Tables for people, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from sunkd.cli.text import printable
from sunkd.domain.policy import PoolSpec
from sunkd.runtime.config import Settings, pool_spec
from sunkd.store import projections
from sunkd.store.eventlog import EventLog
from sunkd.store.utilization import utilization

SLOWEST = 10


def _since(raw: str | None, now: datetime, default: str) -> datetime:
    from sunkd.api.app import parse_since

    moment = parse_since(raw or default, now)
    assert moment is not None
    return moment


def _fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "now"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else printable(c) for c in row]
                                            for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for index, row in enumerate(cells):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip(), file=out)
        if index == 0:
            print("  ".join("-" * width for width in widths), file=out)


# ----------------------------------------------------------------------- history


async def history(event_log: EventLog, node: str, since: datetime | None
                  ) -> list[projections.Interval]:
    return await event_log.read_models.intervals(node=node, since=since, limit=100_000)


def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd history NODE [--since 24h|ISO] [--json]`."""
    now = datetime.now(UTC)
    try:
        since = _since(args.since, now, "3650d") if args.since else None
    except ValueError as error:
        print(f"sunkd history: {error}", file=sys.stderr)
        return 2

    async def run() -> list[projections.Interval]:
        event_log = await EventLog.open(settings.database_url, access="read")
        try:
            return await history(event_log, args.node, since)
        finally:
            await event_log.close()

    intervals = asyncio.run(run())
    out = sys.stdout
    if args.json:
        json.dump({"node": args.node, "intervals": [i.to_json() for i in intervals]}, out,
                  indent=2)
        print(file=out)
        return 0
    if not intervals:
        print(f"no history for node {args.node!r}", file=out)
        return 1
    table(["from", "to", "duration", "owner", "phase", "pool", "transition", "by", "why"],
          [(_fmt_time(i.from_at), _fmt_time(i.to_at), _fmt_duration(i.duration_s), i.owner,
            i.phase, i.pool or "-", i.transition_id or "-", i.decided_by or "-",
            i.reason or "") for i in intervals], out)
    return 0


# ------------------------------------------------------------------------- audit


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 2)


async def node_hours(event_log: EventLog, since: datetime, until: datetime,
                     pools: Sequence[PoolSpec] = ()) -> list[dict[str, Any]]:
    """Busy and idle node-hours per pool and owner in [since, until) (`pools`: the
    config file's, for an archived log's base)."""
    fold = await utilization(event_log, since, until, pools)
    return [{"pool": row.pool, "owner": row.owner, "busy_hours": _hours(row.busy_s),
             "idle_hours": _hours(row.idle_s),
             "busy_share": None if row.busy_share is None else round(row.busy_share, 4)}
            for row in fold.rows()]


async def audit_report(event_log: EventLog, since: datetime, until: datetime,
                       pools: Sequence[PoolSpec] = ()) -> dict[str, Any]:
    """The audit of [since, until) as plain data (what `--json` prints)."""
    read_models = event_log.read_models
    hours: dict[tuple[str, str], float] = {}
    for interval in await read_models.intervals(since=since, until=until, limit=10_000_000):
        if interval.pool is None:
            continue
        begin = max(interval.from_at, since)
        end = min(interval.to_at or until, until)
        if end > begin:
            key = (interval.pool, interval.owner)
            hours[key] = hours.get(key, 0.0) + (end - begin).total_seconds() / 3600
    moves = await read_models.transitions(since, until)
    failed = await read_models.failed_actions(since, until)

    def clean(row: dict[str, Any]) -> dict[str, Any]:
        result = dict(row)
        for key in ("started_at", "ended_at", "requested_at"):
            if key in result:
                moment = result[key]
                result[key] = moment.isoformat() if moment else None
        if "retryable" in result and result["retryable"] is not None:
            result["retryable"] = bool(result["retryable"])
        return result

    counts: dict[tuple[str, str], int] = {}
    for move in moves:
        key = (move["direction"], move["outcome"])
        counts[key] = counts.get(key, 0) + 1
    drains = [m for m in moves if m["direction"] == "lend"
              and m["outcome"] in ("completed", "aborted") and m["duration_s"] is not None]
    drains.sort(key=lambda m: (-float(m["duration_s"]), m["transition_id"]))
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "utilization": [{"pool": pool, "owner": owner, "hours": round(value, 2)}
                        for (pool, owner), value in sorted(hours.items())],
        "node_hours": await node_hours(event_log, since, until, pools),
        "transitions": [{"direction": d, "outcome": o, "count": n}
                        for (d, o), n in sorted(counts.items())],
        "aborts": [clean(m) for m in moves if m["outcome"] == "aborted"],
        "slowest_drains": [clean(m) for m in drains[:SLOWEST]],
        "failed_actions": [clean(a) for a in failed],
    }


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd audit [--from 30d|ISO] [--to ISO|duration ago] [--json]` (`--since` is
    `--from`)."""
    now = datetime.now(UTC)
    try:
        since = _since(args.since, now, "30d")
        until = min(_since(args.to, now, "0s"), now)  # nothing is known about the future
    except ValueError as error:
        print(f"sunkd audit: {error}", file=sys.stderr)
        return 2
    if until <= since:
        print(f"sunkd audit: --to ({until.isoformat()}) is not after --from "
              f"({since.isoformat()})", file=sys.stderr)
        return 2

    async def run() -> dict[str, Any]:
        event_log = await EventLog.open(settings.database_url, access="read")
        try:
            return await audit_report(event_log, since, until,
                                      [pool_spec(pool) for pool in settings.pools])
        finally:
            await event_log.close()

    report = asyncio.run(run())
    out = sys.stdout
    if args.json:
        json.dump(report, out, indent=2)
        print(file=out)
        return 0
    print(f"sunkd audit {report['since']} .. {report['until']}\n", file=out)
    print("Hours per pool and owner", file=out)
    table(["pool", "owner", "hours"],
          [(u["pool"], u["owner"], f"{u['hours']:.2f}") for u in report["utilization"]], out)
    print("\nBusy and idle node-hours per pool and owner", file=out)
    table(["pool", "owner", "busy h", "idle h", "busy share"],
          [(u["pool"], u["owner"], f"{u['busy_hours']:.2f}", f"{u['idle_hours']:.2f}",
            "-" if u["busy_share"] is None else f"{100 * u['busy_share']:.1f} %")
           for u in report["node_hours"]], out)
    print("\nTransitions", file=out)
    table(["direction", "outcome", "count"],
          [(t["direction"], t["outcome"], t["count"]) for t in report["transitions"]], out)
    print("\nAborted transitions", file=out)
    table(["started", "node", "transition", "after", "why"],
          [(a["started_at"], a["node"], a["transition_id"], _fmt_duration(a["duration_s"]),
            a["abort_reason"]) for a in report["aborts"]], out)
    print("\nSlowest drains", file=out)
    table(["started", "node", "transition", "took", "outcome"],
          [(d["started_at"], d["node"], d["transition_id"], _fmt_duration(d["duration_s"]),
            d["outcome"]) for d in report["slowest_drains"]], out)
    print("\nFailed actions", file=out)
    table(["requested", "node", "action", "attempt", "error"],
          [(a["requested_at"], a["node"], f"{a['side']}/{a['verb']}", a["attempt"],
            a["error"]) for a in report["failed_actions"]], out)
    return 0
