"""`sunkd migrate` and `sunkd events`: the commands that work on the event log itself."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

from sunkd.cli.text import printable
from sunkd.runtime.config import Settings
from sunkd.runtime.logs import redact_text

# ---------------------------------------------------------------------- migrate


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from sunkd.store import migrations_api
    from sunkd.store.eventlog import create_engine

    async def run() -> str | None:
        engine = create_engine(settings.database_url)
        try:
            if args.downgrade:
                await migrations_api.downgrade(engine, args.downgrade)
            else:
                await migrations_api.upgrade(engine, args.revision)
            return await migrations_api.current_revision(engine)
        finally:
            await engine.dispose()

    revision = asyncio.run(run())
    print(f"database {redact_text(settings.database_url)} at revision {revision or 'base'}")
    return 0


# ----------------------------------------------------------------------- events


def _event_line(recorded: Any, as_json: bool) -> str:
    """One event, or one row that does not decode (`CorruptRow`: shown as corrupt, with
    its raw text, so the log can be inspected past it; issue 12)."""
    from sunkd.domain.events import encode_payload
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
    from sunkd.store.projections import read_tolerant

    kinds = args.kind or None
    out: TextIO = sys.stdout

    async def run() -> None:
        event_log = await EventLog.open(settings.database_url)
        try:
            position, remaining = args.after, args.limit
            while args.follow or remaining > 0:
                size = 1000 if args.follow else min(remaining, 1000)
                batch = await read_tolerant(event_log.engine, position, size, kinds=kinds,
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
