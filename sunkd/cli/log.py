"""`sunkd migrate`, `sunkd events` and `sunkd log ...` (archive, restore, partitions,
grants): the commands that work on the event log itself."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from datetime import timedelta
from typing import Any, TextIO

from sunkd.cli.text import printable
from sunkd.runtime.config import Settings
from sunkd.runtime.logs import redact_text

# ---------------------------------------------------------------------- migrate


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from sunkd.store import migrations_api

    revision = asyncio.run(migrations_api.migrate(
        settings.database_url, revision=args.revision, downgrade_to=args.downgrade))
    print(f"database {redact_text(settings.database_url)} at revision {revision or 'base'}")
    return 0


# ----------------------------------------------------------------------- events


def _event_line(recorded: Any, as_json: bool) -> str:
    """One event, or one row that does not decode (`CorruptRow`: shown as corrupt, with
    its raw text, so the log can be inspected past it)."""
    from sunkd.domain.codec import encode_payload
    from sunkd.store.projections import CorruptRow

    if isinstance(recorded, CorruptRow):
        if as_json:
            return json.dumps(recorded.to_json(), separators=(",", ":"), sort_keys=True)
        stamp = recorded.recorded_at.strftime("%Y-%m-%d %H:%M:%S") \
            if recorded.recorded_at else "-"
        return printable(f"{recorded.seq:>8} {stamp} {recorded.kind:<22} "
                         f"{recorded.subject:<16} CORRUPT ({recorded.error}) "
                         f"raw={recorded.raw}")
    body = encode_payload(recorded.payload)
    if as_json:
        return json.dumps({
            "seq": recorded.seq, "recorded_at": recorded.recorded_at.isoformat(),
            "kind": recorded.kind, "subject": recorded.subject, "epoch": recorded.epoch,
            "causation_seq": recorded.causation_seq, "payload": body,
        }, separators=(",", ":"), sort_keys=True)
    shown = {k: v for k, v in body.items() if k != "v" and v not in (None, [], "", {})}
    details = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in shown.items())
    stamp = recorded.recorded_at.strftime("%Y-%m-%d %H:%M:%S")
    return printable(f"{recorded.seq:>8} {stamp} {recorded.kind:<22} {recorded.subject:<16} "
                     f"{details}")


FOLLOW_POLL_SECONDS = 0.5


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd events [--after SEQ] [--follow] [--json] ...`. Reads row by row, tolerantly:
    a row that does not decode is printed as corrupt and the listing goes on."""
    from sunkd.store.eventlog import EventLog

    kinds = args.kind or None
    out: TextIO = sys.stdout

    async def run() -> None:
        event_log = await EventLog.open(settings.database_url, access="read")
        try:
            position, remaining = args.after, args.limit
            while args.follow or remaining > 0:
                size = 1000 if args.follow else min(remaining, 1000)
                batch = await event_log.read_tolerant(position, size, kinds=kinds,
                                                      subject=args.subject)
                for recorded in batch:
                    print(_event_line(recorded, args.json), file=out, flush=args.follow)
                if batch:
                    position, remaining = batch[-1].seq, remaining - len(batch)
                elif args.follow:
                    await asyncio.sleep(FOLLOW_POLL_SECONDS)
                else:
                    break
        finally:
            await event_log.close()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


# ------------------------------------------------------- log archive / restore / roles

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(value: str) -> timedelta:
    """An argparse type: `30d`, `12h`, `90m`, `3600s`, `2w`."""
    match = _DURATION.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration like 30d or 12h: {value!r}")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def seq_range(value: str) -> tuple[int, int]:
    """An argparse type: `A-B`, both seqs, A <= B."""
    match = re.match(r"^\s*(\d+)\s*-\s*(\d+)\s*$", value)
    if match is None or int(match.group(1)) > int(match.group(2)) or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"not a seq range like 1-5000: {value!r}")
    return int(match.group(1)), int(match.group(2))


def cmd_log_archive(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd log archive (--older-than 30d | --upto-seq N) --to DIR`."""
    from sunkd.store import archive
    from sunkd.store.eventlog import EventLog

    async def run() -> tuple[archive.ArchiveResult | None, int]:
        event_log = await EventLog.open(settings.database_url, access="write")
        try:
            upto = args.upto_seq if args.upto_seq is not None else \
                await archive.cutoff_seq(event_log, args.older_than)
            return await archive.archive(event_log, args.to, upto_seq=upto), upto
        finally:
            await event_log.close()

    try:
        result, upto = asyncio.run(run())
    except archive_error() as error:
        print(f"sunkd log archive: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"archived": result.to_json() if result else None,
                          "requested_upto_seq": upto}, indent=2))
        return 0
    if result is None:
        print(f"nothing to archive up to seq {upto} (on PostgreSQL only whole partitions of "
              "1,000,000 seqs are archived, and the newest event always stays)")
        return 0
    print(f"archived seqs {result.from_seq}-{result.upto_seq} ({result.events} events, "
          f"{len(result.files)} file(s), {result.bytes / 1e6:.1f} MB) to {result.manifest}")
    print(f"recorded as log.archived (seq {result.event_seq}); base snapshot at seq "
          f"{result.upto_seq}; removed {result.removed} rows from the database"
          + (f" (partitions {', '.join(result.partitions_dropped)})"
             if result.partitions_dropped else ""))
    return 0


def archive_error() -> type[Exception]:
    from sunkd.store.archive import ArchiveError

    return ArchiveError


def cmd_log_restore(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd log restore --from DIR [--range A-B]`: into `events_restored`."""
    from sunkd.store import archive
    from sunkd.store.eventlog import EventLog

    first, last = args.range if args.range else (1, None)

    async def run() -> archive.RestoreResult:
        event_log = await EventLog.open(settings.database_url, access="write")
        try:
            return await archive.restore(event_log, args.source, from_seq=first,
                                         upto_seq=last)
        finally:
            await event_log.close()

    try:
        result = asyncio.run(run())
    except archive_error() as error:
        print(f"sunkd log restore: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    print(f"restored {result.restored} events of seqs {result.from_seq}-{result.upto_seq} "
          f"into events_restored ({result.present} were already there, "
          f"{result.skipped_live} are still live"
          + (f", {result.not_json} not JSON, skipped" if result.not_json else "") + ")")
    print("the audit views (transitions, ownership_intervals, ...) now include them; "
          "`DELETE FROM events_restored` when the audit is done")
    return 0


def cmd_log_partitions(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd log partitions [--ahead N]`: create partitions ahead (PostgreSQL)."""
    from sunkd.store import archive
    from sunkd.store.eventlog import EventLog

    async def run() -> tuple[int, list[archive.Partition], tuple[int, int] | None]:
        event_log = await EventLog.open(settings.database_url, access="write")
        try:
            created = await archive.extend_partitions(event_log, args.ahead)
            return (created, await archive.partitions(event_log), await event_log.live_range())
        finally:
            await event_log.close()

    created, parts, live = asyncio.run(run())
    if args.json:
        print(json.dumps({"created": created, "live": live, "partitions": [
            {"name": p.name, "from_seq": p.lower, "upto_seq": p.upper - 1} for p in parts]},
            indent=2))
        return 0
    if not parts:
        print("no partitions: this database (SQLite) keeps events in one table")
        return 0
    print(f"{created} partition(s) created; log at seqs "
          f"{'-'.join(map(str, live)) if live else 'empty'}")
    for part in parts:
        print(f"  {part.name:<16} {part.lower:>14} - {part.upper - 1}")
    return 0


def cmd_log_grants(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd log grants`: the SQL of the daemon and maintenance roles."""
    from sunkd.store.archive import grants_sql
    from sunkd.store.eventlog import database_name

    database = args.database or database_name(settings.database_url) or "sunkd"
    try:
        setup, after = grants_sql(database, args.daemon_role, args.maintenance_role)
    except ValueError as error:
        print(f"sunkd log grants: {error}", file=sys.stderr)
        return 2
    print(setup)
    print(after, end="")
    return 0
