"""Retention of the event log: archive an old range to files, restore one for audit,
read an archive back, keep PostgreSQL's partitions ahead of the append point, and the
database roles that keep the daemon from ever removing history.

Why a module of its own: everything here is maintenance, run by `sunkd log ...` under
the maintenance role, never by the daemon (which only reads the EventLog's
`archive_base_seq` and `origin`). The order of `archive` is the safety argument, so it is
spelled out there: nothing leaves the database before the files holding it are written,
fsynced, re-read and found equal to what was meant to be written, the `log.archived`
event is recorded and the new base snapshot saved. Its functions take the EventLog, whose
database engine stays inside sunkd/store.

The archive format, `sunkd-archive/1` (docs/operations.md, "Archive format"), readable
with `zcat` and `jq`, no sunkd needed:

* `events-<from>-<upto>.jsonl.gz`: gzip (RFC 1952), one JSON object per line and per
  event in seq order: `seq`, `recorded_at` (ISO 8601, UTC), `kind`, `subject`, `epoch`,
  `causation_seq`, `payload` (the stored JSON object, as stored); a row whose payload is
  not JSON has `payload_raw` (its text) instead. One file per PARTITION_SIZE seqs.
* `manifest-<from>-<upto>.json`: one per archive run: format, range, counts, the
  base snapshot's seq, the log's origin, and per file its range, count, size, `sha256`
  of the file's bytes and `content_sha256` of the decompressed lines.

Successive archives may share a directory: their manifests chain from seq 1. Reading an
archive back verifies it against the checksums the log recorded in its `log.archived`
events, not against the manifest beside the files (sunkd/store/archive_read.py).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import orjson
import structlog
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sunkd.domain.events import (
    ArchiveFile,
    Event,
    LogArchived,
)
from sunkd.domain.fold import fold
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import EMPTY, ClusterState
from sunkd.store.archive_read import (
    FORMAT,
    ArchivedRow,
    ArchiveError,
    Manifest,
    lines,
    manifests,
    read_file,
    read_rows,
    recorded_archives,
    verify,
    verify_against_log,
)
from sunkd.store.backend import as_utc
from sunkd.store.eventlog import SNAPSHOTS_KEPT, EventLog
from sunkd.store.models import events, snapshots

__all__ = [  # reading and verifying live in archive_read; callers find them here too
    "FORMAT", "ArchiveError", "ArchivedRow", "Manifest", "manifests", "read_file", "read_rows",
    "recorded_archives", "verify", "verify_against_log",
]

log = structlog.get_logger(__name__)

# Seqs per PostgreSQL partition (the default of `sunkd_partitioning`, migration 0003)
# and per SQLite archive file.
PARTITION_SIZE = 1_000_000
PARTITIONS_AHEAD = 4
PAGE = 20_000
# gzip level 3: as small as 6 on log lines (measured: within 1 %), twice as fast.
COMPRESSLEVEL = 3
LINE_FIELDS = ("seq", "recorded_at", "kind", "subject", "epoch", "causation_seq", "payload")


@dataclass(frozen=True)
class Partition:
    name: str
    lower: int  # first seq
    upper: int  # last seq + 1


@dataclass
class ArchiveResult:
    from_seq: int
    upto_seq: int
    events: int
    manifest: Path
    files: list[dict[str, Any]]
    bytes: int
    removed: int  # rows removed from the database
    partitions_dropped: list[str] = field(default_factory=list)
    event_seq: int = 0  # the seq of the log.archived event
    # Where the time went: writing + verifying the files, folding the base state,
    # removing the range.
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"from_seq": self.from_seq, "upto_seq": self.upto_seq, "events": self.events,
                "manifest": str(self.manifest), "files": self.files, "bytes": self.bytes,
                "removed": self.removed, "partitions_dropped": self.partitions_dropped,
                "event_seq": self.event_seq,
                "seconds": {key: round(value, 3) for key, value in self.seconds.items()}}


# ------------------------------------------------------------------ small queries


async def cutoff_seq(event_log: EventLog, older_than: timedelta) -> int:
    """The last seq recorded more than `older_than` ago (0: none), by the database's
    clock on PostgreSQL (event times are the database's)."""
    engine = event_log.engine
    async with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            now = as_utc((await connection.execute(text("SELECT clock_timestamp()")))
                         .scalar_one())
            bound: Any = now - older_than
        else:
            bound = (datetime.now(UTC) - older_than).strftime("%Y-%m-%d %H:%M:%S.%f")
        value = (await connection.execute(
            select(func.max(events.c.seq)).where(events.c.recorded_at < bound))).scalar()
    return int(value or 0)


# ------------------------------------------------------------------ partitions

_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


async def partitions(event_log: EventLog) -> list[Partition]:
    """The range partitions of `events` (PostgreSQL), lowest first; [] on SQLite."""
    engine = event_log.engine
    if engine.dialect.name != "postgresql":
        return []
    async with engine.connect() as connection:
        rows = (await connection.execute(text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'events'::regclass"))).all()
    found = []
    for name, bound in rows:
        match = _BOUND.search(str(bound))
        if match is not None:
            found.append(Partition(str(name), int(match.group(1)), int(match.group(2))))
    return sorted(found, key=lambda part: part.lower)


async def extend_partitions(event_log: EventLog, ahead: int = PARTITIONS_AHEAD) -> int:
    """Create the partitions up to `ahead` partitions beyond the last seq, and move rows
    that landed in the DEFAULT partition into theirs (`sunkd_events_extend`, migration
    0003). Returns how many partitions were created; 0 on SQLite. Needs the
    maintenance role (DDL)."""
    engine = event_log.engine
    if engine.dialect.name != "postgresql":
        return 0
    async with engine.begin() as connection:
        last = (await connection.execute(
            select(func.coalesce(func.max(events.c.seq), 0)))).scalar_one()
        size = (await connection.execute(
            text("SELECT partition_size FROM sunkd_partitioning"))).scalar_one()
        created = (await connection.execute(
            text("SELECT sunkd_events_extend(:through)"),
            {"through": int(last) + max(ahead, 1) * int(size)})).scalar_one()
    return int(created)


# ------------------------------------------------------------------ writing files


class _HashingWriter:
    """A binary file wrapper that hashes what goes through it (the compressed bytes)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _iso(value: Any) -> str:
    if not isinstance(value, datetime):
        # SQLite: SQLAlchemy's naive-UTC text "YYYY-MM-DD HH:MM:SS.ffffff"
        value = datetime.fromisoformat(str(value))
    return as_utc(value).isoformat(timespec="microseconds")


def _line(row: Sequence[Any]) -> bytes:
    seq, recorded_at, kind, subject, epoch, causation_seq, raw = row
    head = orjson.dumps({"seq": seq, "recorded_at": _iso(recorded_at), "kind": kind,
                         "subject": subject, "epoch": epoch, "causation_seq": causation_seq})
    body = raw.encode() if isinstance(raw, str) else bytes(raw)
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            json.loads(body)  # integers beyond 64 bits: still JSON, kept as written
        except ValueError:
            return head[:-1] + b',"payload_raw":' + orjson.dumps(body.decode(
                errors="replace")) + b"}\n"
    return head[:-1] + b',"payload":' + body + b"}\n"


# PostgreSQL writes the lines itself (json_build_object keeps the key order and embeds the
# jsonb payload as JSON), which is ~3x faster than building them here from rows.
_PG_LINES = """
SELECT seq, json_build_object(
  'seq', seq,
  'recorded_at', to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
  'kind', kind, 'subject', subject, 'epoch', epoch, 'causation_seq', causation_seq,
  'payload', payload)::text
FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3"""


async def _lines(engine: AsyncEngine, after: int, upto: int
                 ) -> AsyncIterator[tuple[int, int, int, bytes]]:
    """The rows after..upto as archive lines, page by page: (first seq, last seq,
    count, the lines)."""
    position = after
    postgres = engine.dialect.name == "postgresql"
    query = text("SELECT seq, recorded_at, kind, subject, epoch, causation_seq, payload "
                 "FROM events WHERE seq > :after AND seq <= :upto ORDER BY seq LIMIT :limit")
    while position < upto:
        async with engine.connect() as connection:
            if postgres:
                raw = await connection.get_raw_connection()
                driver: Any = raw.driver_connection
                records = await driver.fetch(_PG_LINES, position, upto, PAGE)
                if not records:
                    return
                block = "\n".join(record[1] for record in records).encode() + b"\n"
                seqs = (int(records[0][0]), int(records[-1][0]), len(records))
            else:
                page = (await connection.execute(
                    query, {"after": position, "upto": upto, "limit": PAGE})).all()
                if not page:
                    return
                block = b"".join(_line(tuple(row)) for row in page)
                seqs = (int(page[0][0]), int(page[-1][0]), len(page))
        yield seqs[0], seqs[1], seqs[2], block
        position = seqs[1]


def _file_name(first: int, last: int) -> str:
    return f"events-{first:012d}-{last:012d}.jsonl.gz"


def _manifest_name(first: int, last: int) -> str:
    return f"manifest-{first:012d}-{last:012d}.json"


def _verify_file(path: Path, entry: dict[str, Any]) -> list[str]:
    """Re-read one archive file: its bytes' sha256, its decompressed lines' sha256, its
    line count and first and last seq, against the manifest entry."""
    problems = []
    sha = hashlib.sha256()
    content = hashlib.sha256()
    count = 0
    first: bytes | None = None
    last = b""
    try:
        with path.open("rb") as raw:
            while chunk := raw.read(1 << 20):
                sha.update(chunk)
        with gzip.open(path, "rb") as stream:
            for _number, line in lines(stream, path):
                content.update(line)
                count += 1
                if first is None:
                    first = line
                last = line
    except ArchiveError as error:  # a line longer than MAX_LINE_BYTES
        return [str(error)]
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        return [f"{path.name}: unreadable: {error}"]
    if sha.hexdigest() != entry["sha256"]:
        problems.append(f"{path.name}: sha256 {sha.hexdigest()} != manifest {entry['sha256']}")
    if content.hexdigest() != entry["content_sha256"]:
        problems.append(f"{path.name}: content sha256 differs from the manifest")
    if count != entry["events"]:
        problems.append(f"{path.name}: {count} lines, the manifest says {entry['events']}")
    if first is not None and (json.loads(first)["seq"] != entry["from_seq"]
                              or json.loads(last)["seq"] != entry["upto_seq"]):
        problems.append(f"{path.name}: seqs {json.loads(first)['seq']}.."
                        f"{json.loads(last)['seq']}, the manifest says "
                        f"{entry['from_seq']}..{entry['upto_seq']}")
    return problems


def _chunks(first: int, last: int) -> list[tuple[int, int]]:
    """first..last cut at multiples of PARTITION_SIZE (SQLite's files)."""
    chunks = []
    start = first
    while start <= last:
        end = min(last, ((start - 1) // PARTITION_SIZE + 1) * PARTITION_SIZE)
        chunks.append((start, end))
        start = end + 1
    return chunks


async def _write_files(engine: AsyncEngine, directory: Path, chunks: Sequence[tuple[int, int]]
                       ) -> list[dict[str, Any]]:
    """Write each (first, last) chunk as one file; each file is fsynced, re-read and
    compared before the next one is written."""
    written: list[dict[str, Any]] = []
    for start, end in chunks:
        name = _file_name(start, end)
        path = directory / name
        partial = directory / (name + ".partial")
        content = hashlib.sha256()
        count = 0
        seen_first = seen_last = None
        with partial.open("wb") as raw:
            hashing = _HashingWriter(raw)
            # mtime=0: the same events always make the same bytes (and checksum).
            with gzip.GzipFile(fileobj=hashing, mode="wb", compresslevel=COMPRESSLEVEL,
                               mtime=0) as stream:
                async for page_first, page_last, page_count, block in _lines(
                        engine, start - 1, end):
                    content.update(block)
                    stream.write(block)
                    count += page_count
                    seen_first = page_first if seen_first is None else seen_first
                    seen_last = page_last
            raw.flush()
            os.fsync(raw.fileno())
        if count != end - start + 1 or seen_first != start or seen_last != end:
            partial.unlink()
            raise ArchiveError(f"seqs {start}..{end} are not all in the log (read {count} "
                               f"rows, {seen_first}..{seen_last}): nothing was removed")
        entry = {"name": name, "from_seq": start, "upto_seq": end, "events": count,
                 "bytes": hashing.size, "sha256": hashing.sha.hexdigest(),
                 "content_sha256": content.hexdigest()}
        os.replace(partial, path)
        _fsync_dir(directory)
        problems = await asyncio.to_thread(_verify_file, path, entry)
        if problems:
            raise ArchiveError(f"re-reading {path} failed, nothing was removed: "
                               + "; ".join(problems))
        written.append(entry)
    return written


def _write_json_durably(path: Path, body: dict[str, Any]) -> str:
    data = json.dumps(body, indent=2, sort_keys=True).encode() + b"\n"
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
    _fsync_dir(path.parent)
    if path.read_bytes() != data:
        raise ArchiveError(f"re-reading {path} gave other bytes than written")
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ base state


async def state_at(event_log: EventLog, seq: int) -> ClusterState:
    """The folded state at exactly `seq`, from the newest readable snapshot at or
    before it (or the empty state when the log still starts at seq 1)."""
    async with event_log.engine.connect() as connection:
        rows = (await connection.execute(
            select(snapshots.c.seq, snapshots.c.state).where(snapshots.c.seq <= seq)
            .order_by(snapshots.c.seq.desc()))).all()
    start: ClusterState | None = None
    for row in rows:
        try:
            start = state_from_json(dict(row.state))
            break
        except (KeyError, ValueError, TypeError) as error:
            log.warning("archive.snapshot_unreadable", seq=int(row.seq), error=str(error))
    live = await event_log.live_range()
    if start is None:
        if live is not None and live[0] > 1:
            raise ArchiveError(f"no readable snapshot at or before seq {seq}, and the log "
                               f"starts at {live[0]}: the state there cannot be rebuilt")
        start = EMPTY
    state = start
    async for batch in event_log.read_range(state.last_seq, seq):
        state = fold(batch, state)
    if state.last_seq != seq:
        raise ArchiveError(f"folding up to seq {seq} stopped at {state.last_seq}")
    return state


# ------------------------------------------------------------------ archive


async def archive(event_log: EventLog, directory: Path, *, upto_seq: int,
                  keep_snapshots: int = SNAPSHOTS_KEPT) -> ArchiveResult | None:
    """Archive the live log's oldest events up to `upto_seq` into `directory`, then
    remove them from the database. None when there is nothing to archive.

    On PostgreSQL only whole partitions are removed, so the range is cut back to the
    last partition boundary at or below `upto_seq`. The steps, in this order:
    1. (PostgreSQL) make sure partitions exist ahead and none of the range is in the
       DEFAULT partition (`extend_partitions`);
    2. write the files and the manifest, each fsynced, re-read and compared;
    3. append `log.archived` (range, files, checksums, the base seq, the log's origin);
    4. save the snapshot at the range's end: the new base, never pruned while it is;
    5. remove the range: DETACH + DROP of its partitions (PostgreSQL), or a DELETE the
       trigger allows through `sunkd_maintenance` (SQLite), after checking that the
       database still holds exactly the rows archived.
    """
    engine = event_log.engine
    postgres = engine.dialect.name == "postgresql"
    if postgres:
        await extend_partitions(event_log)
    live = await event_log.live_range()
    if live is None:
        return None
    first, last_live = live
    # Never the whole log: the newest event stays live (and the log.archived event
    # follows it), so seq continuity never depends on the archive alone.
    last = min(upto_seq, last_live - 1)
    dropped: list[Partition] = []
    if postgres:
        dropped = [part for part in await partitions(event_log)
                   if part.lower >= first and part.upper - 1 <= last]
        if not dropped:
            return None
        last = dropped[-1].upper - 1
        first = max(first, dropped[0].lower)
    if last < first:
        return None
    await _check_chain(event_log, directory, first)
    directory.mkdir(parents=True, exist_ok=True)
    origin = await event_log.origin()
    clock = time.perf_counter()
    seconds: dict[str, float] = {}
    # One file per dropped partition (PostgreSQL), per PARTITION_SIZE seqs (SQLite).
    chunks = ([(max(part.lower, first), part.upper - 1) for part in dropped] if postgres
              else _chunks(first, last))
    files = await _write_files(engine, directory, chunks)
    count = sum(entry["events"] for entry in files)
    manifest_name = _manifest_name(first, last)
    manifest = {
        "format": FORMAT, "from_seq": first, "upto_seq": last, "events": count,
        "base_seq": last, "created_at": datetime.now(UTC).isoformat(),
        "database": engine.dialect.name,
        "origin": None if origin is None else
        {"recorded_at": origin[0], "kind": origin[1], "subject": origin[2]},
        "line_fields": list(LINE_FIELDS), "files": files,
    }
    manifest_sha = await asyncio.to_thread(_write_json_durably, directory / manifest_name,
                                           manifest)
    seconds["write"] = time.perf_counter() - clock
    clock = time.perf_counter()
    base = await state_at(event_log, last)
    seconds["base"] = time.perf_counter() - clock
    clock = time.perf_counter()
    payload = LogArchived(
        from_seq=first, upto_seq=last, events=count, base_seq=last,
        location=str(directory.resolve()), manifest=manifest_name,
        manifest_sha256=manifest_sha,
        files=tuple(ArchiveFile(e["name"], e["from_seq"], e["upto_seq"], e["events"],
                                e["sha256"]) for e in files),
        origin_recorded_at=origin[0] if origin else "",
        origin_kind=origin[1] if origin else "", origin_subject=origin[2] if origin else "")
    [event_seq] = await event_log.append_unfenced([Event(subject="log", payload=payload)])
    await event_log.save_snapshot(last, state_to_json(base), keep=keep_snapshots)
    seconds["record"] = time.perf_counter() - clock
    clock = time.perf_counter()
    removed = await _remove(engine, first, last, count, dropped)
    seconds["remove"] = time.perf_counter() - clock
    log.info("archive.done", from_seq=first, upto_seq=last, events=count,
             directory=str(directory), removed=removed)
    return ArchiveResult(first, last, count, directory / manifest_name, files,
                         sum(entry["bytes"] for entry in files), removed,
                         [part.name for part in dropped], event_seq, seconds)


async def _check_chain(event_log: EventLog, directory: Path, first: int) -> None:
    """An archive already in `directory` must verify against this log and end right
    before `first`, or this run would extend a chain that cannot be trusted or has a
    gap: ArchiveError, before anything is written."""
    if not directory.is_dir() or not any(directory.glob("manifest-*.json")):
        return
    found, problems = await verify_against_log(event_log, [directory], start=None)
    if problems:
        raise ArchiveError(f"the archive already in {directory} does not verify, nothing was "
                           "archived: " + "; ".join(problems[:10])
                           + (f"; and {len(problems) - 10} more" if len(problems) > 10 else ""))
    end = found[-1].upto_seq
    if end + 1 != first:
        raise ArchiveError(
            f"the archive in {directory} ends at seq {end}, this run starts at seq {first}, "
            "nothing was archived: archive into the directory that holds the seqs in "
            "between, or into a new one")


async def _remove(engine: AsyncEngine, first: int, last: int, expected: int,
                  dropped: Sequence[Partition]) -> int:
    count_query = select(func.count()).select_from(events).where(
        events.c.seq >= first, events.c.seq <= last)
    if engine.dialect.name == "postgresql":
        async with engine.begin() as connection:
            await connection.execute(text("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE"))
            present = int((await connection.execute(count_query)).scalar_one())
            if present != expected:
                raise ArchiveError(f"the database holds {present} rows in {first}..{last}, "
                                   f"{expected} were archived: nothing was removed")
            for part in dropped:
                # DETACH + DROP: no row or TRUNCATE trigger fires; only the owner may.
                await connection.execute(text(f'ALTER TABLE events DETACH PARTITION "{part.name}"'))
                await connection.execute(text(f'DROP TABLE "{part.name}"'))
        return present
    async with engine.connect() as connection:
        await connection.execution_options(sqlite_begin="IMMEDIATE")
        async with connection.begin():
            present = int((await connection.execute(count_query)).scalar_one())
            if present != expected:
                raise ArchiveError(f"the database holds {present} rows in {first}..{last}, "
                                   f"{expected} were archived: nothing was removed")
            # The trigger's permission, visible to this transaction only.
            await connection.execute(text(
                "INSERT INTO sunkd_maintenance (operation, upto_seq) VALUES ('archive', :u)"),
                {"u": last})
            await connection.execute(events.delete().where(events.c.seq >= first,
                                                           events.c.seq <= last))
            await connection.execute(text("DELETE FROM sunkd_maintenance"))
    return present


# ------------------------------------------------------------------ restore


@dataclass
class RestoreResult:
    from_seq: int
    upto_seq: int
    restored: int  # rows inserted now
    present: int  # rows of the range already restored
    skipped_live: int  # rows still in `events` (never duplicated)
    not_json: int  # rows whose payload is not JSON (PostgreSQL jsonb cannot hold them)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def restore(event_log: EventLog, directories: Sequence[Path], *,
                  from_seq: int = 1, upto_seq: int | None = None) -> RestoreResult:
    """Copy archived events from_seq..upto_seq into `events_restored`, where the audit
    views (through `sunkd_event_history`) read them and the fold never does. Every file
    is verified first, against the checksums this log recorded (archive_read.py); rows
    still live in `events` are not copied."""
    engine = event_log.engine
    found, problems = await verify_against_log(event_log, directories)
    if problems:
        raise ArchiveError("the archive does not verify, nothing restored: "
                           + "; ".join(problems[:20])
                           + (f"; and {len(problems) - 20} more" if len(problems) > 20 else ""))
    live = await event_log.live_range()
    live_first = live[0] if live is not None else None
    postgres = engine.dialect.name == "postgresql"
    if postgres:
        insert = text("INSERT INTO events_restored (seq, recorded_at, kind, subject, epoch, "
                      "causation_seq, payload) VALUES (:seq, :recorded_at, :kind, :subject, "
                      ":epoch, :causation_seq, CAST(:payload AS jsonb)) "
                      "ON CONFLICT (seq) DO NOTHING")
    else:
        insert = text("INSERT OR IGNORE INTO events_restored (seq, recorded_at, kind, "
                      "subject, epoch, causation_seq, payload) VALUES (:seq, :recorded_at, "
                      ":kind, :subject, :epoch, :causation_seq, :payload)")
    result = RestoreResult(from_seq, upto_seq or 0, 0, 0, 0, 0)
    batch: list[dict[str, Any]] = []

    async def flush() -> None:
        if not batch:
            return
        # Counted over the batch's seqs (the primary key), before and after the insert.
        count = text("SELECT count(*) FROM events_restored WHERE seq >= :a AND seq <= :b")
        bounds = {"a": batch[0]["seq"], "b": batch[-1]["seq"]}
        async with engine.begin() as connection:
            before = (await connection.execute(count, bounds)).scalar_one()
            await connection.execute(insert, batch)
            after = (await connection.execute(count, bounds)).scalar_one()
        result.restored += int(after) - int(before)
        result.present += len(batch) - (int(after) - int(before))
        batch.clear()

    last_seen = 0
    for row in read_rows(found, from_seq - 1, upto_seq):
        last_seen = row.seq
        if live_first is not None and row.seq >= live_first:
            result.skipped_live += 1
            continue
        if row.payload is None and postgres:
            result.not_json += 1
            continue
        payload = row.raw if row.payload is None else orjson.dumps(row.payload).decode() \
            if _fits_orjson(row.payload) else json.dumps(row.payload)
        batch.append({"seq": row.seq,
                      "recorded_at": row.recorded_at if postgres else
                      row.recorded_at.strftime("%Y-%m-%d %H:%M:%S.%f"),
                      "kind": row.kind, "subject": row.subject, "epoch": row.epoch,
                      "causation_seq": row.causation_seq, "payload": payload})
        if len(batch) >= 5000:
            await flush()
    await flush()
    result.upto_seq = upto_seq if upto_seq is not None else last_seen
    return result


def _fits_orjson(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


async def restored_range(event_log: EventLog) -> tuple[int, int, int]:
    """(first, last, count) of `events_restored` ((0, 0, 0) when empty)."""
    async with event_log.engine.connect() as connection:
        row = (await connection.execute(text(
            "SELECT min(seq), max(seq), count(*) FROM events_restored"))).one()
    return (0, 0, 0) if row[0] is None else (int(row[0]), int(row[1]), int(row[2]))


# ------------------------------------------------------------------ roles

DAEMON_ROLE = "sunkd"
MAINTENANCE_ROLE = "sunkd_maintenance"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _identifier(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain lower-case SQL identifier")
    return name


def grants_sql(database: str, daemon: str = DAEMON_ROLE,
               maintenance: str = MAINTENANCE_ROLE) -> tuple[str, str]:
    """The SQL of the two database roles (docs/operations.md, "Database roles"), as
    (setup, after_migrate). `setup` runs once as a superuser, before the first `sunkd
    migrate`; `after_migrate` runs as the maintenance role after every migration (it
    owns the tables, so it may grant on them). The daemon can only SELECT and INSERT on
    `events`: no UPDATE, DELETE, TRUNCATE, and as it owns nothing, no DDL (DETACH, DROP).
    What else it needs, and why:
      leadership  SELECT, UPDATE   acquire/renew/release, and `FOR UPDATE` (which the
                                   PostgreSQL manual, SELECT "The Locking Clause",
                                   says needs UPDATE) to serialize appends
      snapshots   SELECT, INSERT, DELETE   save snapshots and prune old ones (a cache of
                                   the fold; the archive base is kept by the pruning)
      everything else              SELECT (alembic_version for the schema check, the
                                   read-model views, events_restored)"""
    database, daemon, maintenance = (_identifier(database), _identifier(daemon),
                                     _identifier(maintenance))
    setup = f"""\
-- as a superuser, once: the roles (set their passwords with \\password, or use
-- certificate or peer authentication in pg_hba.conf)
CREATE ROLE {maintenance} LOGIN;
CREATE ROLE {daemon} LOGIN;
GRANT CONNECT ON DATABASE {database} TO {maintenance}, {daemon};
-- the maintenance role runs `sunkd migrate`, so it owns the tables and can archive
GRANT USAGE, CREATE ON SCHEMA public TO {maintenance};
GRANT USAGE ON SCHEMA public TO {daemon};
"""
    after = f"""\
-- as {maintenance}, after `sunkd migrate` (again after each one)
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {daemon};
GRANT SELECT ON ALL TABLES IN SCHEMA public TO {daemon};
ALTER DEFAULT PRIVILEGES FOR ROLE {maintenance} IN SCHEMA public
  GRANT SELECT ON TABLES TO {daemon};
GRANT INSERT ON events TO {daemon};
GRANT UPDATE ON leadership TO {daemon};
GRANT INSERT, DELETE ON snapshots TO {daemon};
"""
    return setup, after
