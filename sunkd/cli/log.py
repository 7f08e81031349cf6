"""`sunkd migrate` and `sunkd events`: the commands that work on the event log itself."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

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
    from sunkd.domain.events import encode_payload

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
    return f"{recorded.seq:>8} {stamp} {recorded.kind:<22} {recorded.subject:<16} {details}"


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    from sunkd.store.eventlog import EventLog

    kinds = args.kind or None
    out: TextIO = sys.stdout

    async def run() -> None:
        event_log = await EventLog.open(settings.database_url)
        try:
            if args.follow:
                async for recorded in event_log.subscribe(args.after, kinds=kinds):
                    if args.subject is None or recorded.subject == args.subject:
                        print(_event_line(recorded, args.json), file=out, flush=True)
                return
            position, remaining = args.after, args.limit
            while remaining > 0:
                batch = await event_log.read(position, min(remaining, 1000), kinds=kinds,
                                             subject=args.subject)
                if not batch:
                    break
                for recorded in batch:
                    print(_event_line(recorded, args.json), file=out)
                position, remaining = batch[-1].seq, remaining - len(batch)
        finally:
            await event_log.close()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0
