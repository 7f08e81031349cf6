"""Event-log append and read throughput, against the driver's fastest raw path.

For each backend the same rows are written twice in the same run:
  * sunkd: typed `Event`s through `EventLog.append` in batches (encoding, fencing
    check under the leadership lock, explicit seq assignment, NOTIFY);
  * baseline: the already-encoded rows through the driver's fastest path into a
    table of the same shape (asyncpg `copy_records_to_table`; sqlite3 `executemany`
    with the same pragmas), one transaction per batch.
The ratio sunkd/baseline is the figure of merit (target on PostgreSQL: >= 0.5).
Then everything is read back through `EventLog.read` (decoded into typed payloads).

Usage: python bench/eventlog.py [--quick] [--events N] [--batch N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from sunkd.domain.codec import encode_payload
from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.store.eventlog import EventLog

PG_BASE = os.environ.get("SUNKD_TEST_DATABASE_URL",
                         "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
STATES = ("IDLE", "MIXED", "ALLOCATED", "IDLE", "DOWN")


def realistic_events(count: int) -> list[Event]:
    """Observation events as a 1,000-node cluster produces them: state churn."""
    out = []
    for index in range(count):
        node = f"gpu-a{index % 1000:04d}"
        state = STATES[(index // 1000) % len(STATES)]
        flags = ("DRAIN",) if index % 97 == 0 else ()
        out.append(Event(subject=node, payload=SlurmNodeObserved(
            node=node, state=state, flags=flags,
            reason="sunkd: lent to kubernetes [tx 42]" if flags else None,
            reason_set_by="slurm" if flags else None, reason_time=1.7e9 + index,
            cpus=128, alloc_cpus=(index * 7) % 128, gpus_total=8, gpus_used=index % 9,
            partitions=("gpu", "batch"), features=("a100", "ib"),
            boot_time=1.7e9, last_busy=1.7e9 + index)))
    return out


def encoded_rows(batch: list[Event], first_seq: int) -> list[tuple[object, ...]]:
    now = datetime.now(UTC)
    return [(first_seq + i, now, e.kind, e.subject, 1, None,
             json.dumps(encode_payload(e.payload), separators=(",", ":")))
            for i, e in enumerate(batch)]


def batches(items: list[Event], size: int) -> list[list[Event]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


async def timed_sunkd(url: str, items: list[Event], batch: int) -> tuple[float, float]:
    event_log = await EventLog.open(url, migrate=True)
    try:
        lease = await event_log.acquire("bench", 300)
        assert lease is not None
        started = time.perf_counter()
        for chunk in batches(items, batch):
            await event_log.append(chunk, lease.epoch)
        append_seconds = time.perf_counter() - started
        started = time.perf_counter()
        total = 0
        async for page in event_log.read_range():
            total += len(page)
        read_seconds = time.perf_counter() - started
        assert total == len(items) + 1, total  # + leader.elected
        return append_seconds, read_seconds
    finally:
        await event_log.close()


async def postgres(items: list[Event], batch: int) -> dict[str, float]:
    admin_dsn = PG_BASE.replace("postgresql+asyncpg://", "postgresql://")
    name = f"sunkd_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = PG_BASE.rsplit("/", 1)[0] + f"/{name}"
    try:
        append_seconds, read_seconds = await timed_sunkd(url, items, batch)
        # Baseline: same rows, pre-encoded, COPY into a same-shaped table.
        raw = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await raw.execute("CREATE TABLE events_baseline (LIKE events INCLUDING ALL)")
            prepared = [encoded_rows(chunk, i * batch + 1)
                        for i, chunk in enumerate(batches(items, batch))]
            started = time.perf_counter()
            for rows in prepared:
                async with raw.transaction():
                    await raw.copy_records_to_table(
                        "events_baseline", records=rows,
                        columns=("seq", "recorded_at", "kind", "subject", "epoch",
                                 "causation_seq", "payload"))
            baseline_seconds = time.perf_counter() - started
        finally:
            await raw.close()
    finally:
        admin = await asyncpg.connect(admin_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return figures("postgres", len(items), append_seconds, baseline_seconds, read_seconds)


async def sqlite(items: list[Event], batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'sunkd.db'}"
        append_seconds, read_seconds = await timed_sunkd(url, items, batch)
        connection = sqlite3.connect(Path(directory) / "baseline.db", isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, recorded_at TEXT, "
                           "kind TEXT, subject TEXT, epoch INTEGER, causation_seq INTEGER, "
                           "payload TEXT)")
        connection.execute("CREATE INDEX a ON events(subject, seq)")
        connection.execute("CREATE INDEX b ON events(kind, seq)")
        prepared = [[(seq, str(at), kind, subject, epoch, cause, payload)
                     for seq, at, kind, subject, epoch, cause, payload
                     in encoded_rows(chunk, i * batch + 1)]
                    for i, chunk in enumerate(batches(items, batch))]
        started = time.perf_counter()
        for rows in prepared:
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            connection.execute("COMMIT")
        baseline_seconds = time.perf_counter() - started
        connection.close()
    return figures("sqlite", len(items), append_seconds, baseline_seconds, read_seconds)


def figures(backend: str, count: int, append_seconds: float, baseline_seconds: float,
            read_seconds: float) -> dict[str, float]:
    return {
        f"{backend}_append_events_per_s": round(count / append_seconds),
        f"{backend}_baseline_events_per_s": round(count / baseline_seconds),
        f"{backend}_append_ratio": round(baseline_seconds / append_seconds, 3),
        f"{backend}_read_events_per_s": round(count / read_seconds),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 events")
    parser.add_argument("--events", type=int)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    count = args.events or (50_000 if args.quick else 200_000)
    items = realistic_events(count)
    result: dict[str, float] = {"events": count, "batch": args.batch}
    for backend in (postgres, sqlite):
        numbers = await backend(items, args.batch)
        result.update(numbers)
        for key, value in numbers.items():
            print(f"{key:36} {value}", file=sys.stderr)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python "
          f"{platform.python_version()}", file=sys.stderr)
    print(json.dumps({
        "benchmark": "eventlog",
        "figures": result,
        "targets": {
            "postgres_append_ratio": {"value": result["postgres_append_ratio"], "target": 0.5,
                                      "better": "higher"},
        },
    }))


if __name__ == "__main__":
    asyncio.run(main())
