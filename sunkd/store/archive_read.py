"""Reading an archive back (`sunkd log restore`, `sunkd replay --check --archive`), and
verifying it against what the log itself recorded.

Why the log and not the manifest: a manifest lies beside the files it describes, so
whoever can edit a file can recompute the manifest too. The `log.archived` event that
each `sunkd log archive` appends records the manifest's sha256 and every file's, range
and count, in the append-only log. So an archive is trusted only through those records:

* the live log's `log.archived` events vouch for the manifests they name;
* a run's `log.archived` event is appended after its range, so it is either live or
  inside a later archive: verifying the manifests newest first, the records found in
  the lines of a file that matched its recorded sha256 vouch for the earlier manifests
  (the chain of manifests back to seq 1).

Inside each file the seqs must run without gap, repeat or disorder from the file's
first seq to its last, and the files and manifests must chain from seq 1. Every problem
names the file (and the line, and the seqs missing), so a restore can say exactly what
it refuses and why.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from sunkd.domain.codec import decode_payload
from sunkd.domain.events import LogArchived, RecordedEvent
from sunkd.store.backend import as_utc
from sunkd.store.models import events

if TYPE_CHECKING:
    from sunkd.store.eventlog import EventLog

FORMAT = "sunkd-archive/1"
# Problems listed per file before the rest are counted only.
_MAX_PROBLEMS_PER_FILE = 10
# The longest line read (`sunkd log archive` refuses to write a longer one, so a longer
# line is not sunkd's): lines are read at most this many bytes at a time, so a hostile
# file cannot make a reader hold more. Events are far smaller (normalized, bounded fields).
MAX_LINE_BYTES = 16 * 1024 * 1024
# The largest manifest read (a manifest lists one file per 1,000,000 seqs: kilobytes).
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# The head of an archive line: sunkd writes `{"seq":1,` (orjson) or `{"seq" : 1, `
# (PostgreSQL's json_build_object).
_SEQ_HEAD = re.compile(rb'^\{\s*"seq"\s*:\s*(\d{1,19})\s*,')
_ARCHIVED_KIND = re.compile(rb'"kind"\s*:\s*"' + re.escape(LogArchived.KIND.encode()) + rb'"')


class ArchiveError(RuntimeError):
    """The archive cannot be written, read or trusted; nothing was removed."""


@dataclass(frozen=True)
class Manifest:
    path: Path
    body: dict[str, Any]

    @property
    def from_seq(self) -> int:
        return int(self.body["from_seq"])

    @property
    def upto_seq(self) -> int:
        return int(self.body["upto_seq"])

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.body["files"])


class LineTooLong(ArchiveError):
    """A line longer than MAX_LINE_BYTES."""


class LineReader(Protocol):
    def readline(self, size: int, /) -> bytes: ...


def lines(stream: LineReader, path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a binary stream, each read at most MAX_LINE_BYTES at a
    time; a longer line raises `LineTooLong` naming the file and the line."""
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise LineTooLong(f"{path.name}: line {number} is longer than {MAX_LINE_BYTES} "
                              "bytes: not a line sunkd writes")
        yield number, line


def confined(directory: Path, name: object, where: str) -> Path:
    """`directory / name` when `name` is a plain file name in it; else ArchiveError: a
    manifest names files beside it, never a path elsewhere (`../`, `/etc/...`)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\x00" in name):
        raise ArchiveError(f"{where}: file name {name!r} is outside the archive directory")
    return directory / name


_FILE_KEYS = {"name": str, "from_seq": int, "upto_seq": int, "events": int, "sha256": str}


def load_manifest(path: Path) -> Manifest:
    """One manifest, its shape checked; ArchiveError naming the file (and the line)."""
    name = path.name
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_MANIFEST_BYTES + 1)
    except OSError as error:
        raise ArchiveError(f"{name}: unreadable: {error}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ArchiveError(f"{name}: larger than {MAX_MANIFEST_BYTES} bytes: not a manifest")
    try:
        body = json.loads(data)
    except json.JSONDecodeError as error:
        raise ArchiveError(f"{name}: line {error.lineno}: not JSON: {error.msg}") from None
    except ValueError as error:  # bytes that are not UTF-8, an integer of 5,000 digits
        raise ArchiveError(f"{name}: not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ArchiveError(f"{name}: not a JSON object")
    if body.get("format") != FORMAT:
        raise ArchiveError(f"{name}: format {str(body.get('format'))[:40]!r}, not {FORMAT}")
    for key in ("from_seq", "upto_seq"):
        if type(body.get(key)) is not int:
            raise ArchiveError(f"{name}: {key} is not an integer")
    files = body.get("files")
    if not isinstance(files, list):
        raise ArchiveError(f"{name}: files is not a list")
    for index, entry in enumerate(files):
        if not isinstance(entry, dict) or any(
                type(entry.get(key)) is not kind for key, kind in _FILE_KEYS.items()):
            raise ArchiveError(f"{name}: files[{index}] is not an object with "
                               f"{', '.join(_FILE_KEYS)}")
        confined(path.parent, entry["name"], f"{name}: files[{index}]")
    return Manifest(path, body)


def manifests(directories: Sequence[Path]) -> tuple[list[Manifest], list[str]]:
    """Every manifest in the directories, by range, and the problems of those that
    could not be read."""
    found = []
    problems = []
    for directory in directories:
        for path in sorted(Path(directory).glob("manifest-*.json")):
            try:
                found.append(load_manifest(path))
            except ArchiveError as error:
                problems.append(str(error))
    return sorted(found, key=lambda m: m.from_seq), problems


# ------------------------------------------------------------------ the log's records


@dataclass(frozen=True)
class Record:
    """What one `log.archived` event recorded, and where it was found (for messages)."""

    payload: LogArchived
    where: str  # "the log.archived event at seq 812" [", archived in events-...gz"]


async def recorded_archives(engine: AsyncEngine) -> list[Record]:
    """The live log's `log.archived` events (the (kind, seq) index finds them)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(
            select(events.c.seq, events.c.payload).where(events.c.kind == LogArchived.KIND)
            .order_by(events.c.seq))).all()
    found = []
    for row in rows:
        body = row.payload if isinstance(row.payload, dict) else json.loads(row.payload)
        payload = decode_payload(LogArchived.KIND, body)
        if isinstance(payload, LogArchived):
            found.append(Record(payload, f"the log.archived event at seq {row.seq}"))
    return found


async def verify_against_log(event_log: EventLog, directories: Sequence[Path], *,
                             start: int | None = 1) -> tuple[list[Manifest], list[str]]:
    """`verify` with the records of `event_log`."""
    import asyncio

    records = await recorded_archives(event_log.engine)
    return await asyncio.to_thread(verify, directories, records, start=start)


# ------------------------------------------------------------------ verification


@dataclass
class _Scan:
    """One pass over one file: its sha256, and what its lines say."""

    sha256: str = ""
    lines: int = 0
    problems: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)


def _missing(seen: bytearray, first: int) -> list[tuple[int, int]]:
    """The runs of seqs (first-based offsets into `seen`) never seen, as (a, b) seqs."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for offset, flag in enumerate(seen):
        if not flag and start is None:
            start = offset
        elif flag and start is not None:
            runs.append((first + start, first + offset - 1))
            start = None
    if start is not None:
        runs.append((first + start, first + len(seen) - 1))
    return runs


def _seqs_text(a: int, b: int) -> str:
    return f"seq {a} is missing" if a == b else f"seqs {a}-{b} are missing"


def _scan(path: Path, first: int, last: int) -> _Scan:
    """Hash the file's bytes and walk its lines: every seq first..last exactly once, in
    order; the `log.archived` lines are kept (they vouch for earlier manifests)."""
    scan = _Scan()
    sha = hashlib.sha256()
    try:
        with path.open("rb") as raw:
            while chunk := raw.read(1 << 20):
                sha.update(chunk)
        scan.sha256 = sha.hexdigest()
        seen = bytearray(max(last - first + 1, 0))
        previous = first - 1
        noted = 0

        def note(problem: str) -> None:
            nonlocal noted
            noted += 1
            if noted <= _MAX_PROBLEMS_PER_FILE:
                scan.problems.append(f"{path.name}: {problem}")

        with gzip.open(path, "rb") as stream:
            for number, line in lines(stream, path):
                scan.lines = number
                match = _SEQ_HEAD.match(line)
                if match is None:
                    note(f"line {number}: not an archive line (no leading seq)")
                    continue
                seq = int(match.group(1))
                if not first <= seq <= last:
                    note(f"line {number}: seq {seq} is outside the file's range "
                         f"{first}-{last}")
                elif seen[seq - first]:
                    note(f"line {number}: seq {seq} appears again")
                else:
                    if seq != previous + 1:
                        note(f"line {number}: seq {seq} follows seq {previous}")
                    seen[seq - first] = 1
                    previous = seq
                if _ARCHIVED_KIND.search(line):
                    try:
                        payload = decode_payload(LogArchived.KIND, json.loads(line)["payload"])
                    except (ValueError, KeyError, TypeError) as error:
                        note(f"line {number}: a log.archived event that does not decode: "
                             f"{error}")
                        continue
                    if isinstance(payload, LogArchived):
                        scan.records.append(Record(
                            payload, f"the log.archived event at seq {seq}, archived in "
                                     f"{path.name}"))
        for a, b in _missing(seen, first):
            note(_seqs_text(a, b))
        if noted > _MAX_PROBLEMS_PER_FILE:
            scan.problems.append(f"{path.name}: {noted - _MAX_PROBLEMS_PER_FILE} more "
                                 "problem(s)")
    except LineTooLong as error:
        scan.problems.append(str(error))
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as error:
        scan.problems.append(f"{path.name}: unreadable: {error}")
    return scan


def _check_manifest(manifest: Manifest, record: Record) -> tuple[list[str], list[Record]]:
    """One manifest and its files against what `record` says; (problems, the records
    found in files that matched their recorded sha256)."""
    payload = record.payload
    name = manifest.path.name
    problems: list[str] = []
    vouched: list[Record] = []
    sha = hashlib.sha256(manifest.path.read_bytes()).hexdigest()
    if name != payload.manifest:
        problems.append(f"{name}: {record.where} names the manifest {payload.manifest}")
    if sha != payload.manifest_sha256:
        problems.append(f"{name}: sha256 {sha} is not the {payload.manifest_sha256} "
                        f"{record.where} recorded")
    listed = [(e.get("name"), e.get("from_seq"), e.get("upto_seq"), e.get("events"),
               e.get("sha256")) for e in manifest.files]
    recorded = [(f.name, f.from_seq, f.upto_seq, f.events, f.sha256) for f in payload.files]
    if listed != recorded:
        problems.append(f"{name}: its files are not the ones {record.where} recorded")
    position = payload.from_seq
    for entry in payload.files:  # the log's list, not the manifest's
        if entry.from_seq != position:
            problems.append(f"{entry.name}: starts at seq {entry.from_seq}, expected "
                            f"{position}: {_seqs_text(position, entry.from_seq - 1)}"
                            if entry.from_seq > position else
                            f"{entry.name}: starts at seq {entry.from_seq}, expected "
                            f"{position} (an overlap)")
        position = entry.upto_seq + 1
        try:
            path = confined(manifest.path.parent, entry.name, f"{name}: {record.where}")
        except ArchiveError as error:
            problems.append(str(error))
            continue
        if not path.is_file():
            problems.append(f"{entry.name}: missing: seqs {entry.from_seq}-{entry.upto_seq}"
                            " are not in the archive")
            continue
        scan = _scan(path, entry.from_seq, entry.upto_seq)
        problems += scan.problems
        if scan.sha256 and scan.sha256 != entry.sha256:
            problems.append(f"{entry.name}: sha256 {scan.sha256} is not the {entry.sha256} "
                            f"{record.where} recorded")
        elif scan.lines != entry.events and not scan.problems:
            problems.append(f"{entry.name}: {scan.lines} lines, {record.where} recorded "
                            f"{entry.events}")
        elif not scan.problems:
            vouched += scan.records
    if position != payload.upto_seq + 1:
        problems.append(f"{name}: the recorded files end at seq {position - 1}, the archive "
                        f"at {payload.upto_seq}")
    return problems, vouched


def verify(directories: Sequence[Path], records: Sequence[Record], *,
           start: int | None = 1) -> tuple[list[Manifest], list[str]]:
    """Check every manifest and file against the log's `records` (module docstring):
    sha256 of the manifest and of each file as recorded, every seq of each file once and
    in order, files and manifests chaining from seq `start` (None: from the first
    manifest's, for one directory of a chain spread over several). Returns (manifests,
    problems)."""
    found, problems = manifests(directories)
    trusted = {(r.payload.from_seq, r.payload.upto_seq): r for r in records}
    # Newest first: a run's record is live, or in the files of a later run.
    checked: dict[Path, list[str]] = {}
    for manifest in reversed(found):
        record = trusted.get((manifest.from_seq, manifest.upto_seq))
        if record is None:
            checked[manifest.path] = [
                f"{manifest.path.name}: no log.archived event of this log records seqs "
                f"{manifest.from_seq}-{manifest.upto_seq} (none is live, none is in a "
                "verified later archive): it cannot be trusted"]
            continue
        manifest_problems, vouched = _check_manifest(manifest, record)
        checked[manifest.path] = manifest_problems
        for found_record in vouched:
            key = (found_record.payload.from_seq, found_record.payload.upto_seq)
            trusted.setdefault(key, found_record)
    expected = start if start is not None else found[0].from_seq if found else 1
    for manifest in found:
        if manifest.from_seq > expected:
            problems.append(f"{manifest.path.name}: starts at seq {manifest.from_seq}, "
                            f"expected {expected}: {_seqs_text(expected, manifest.from_seq - 1)}"
                            " (a gap in the archive)")
        elif manifest.from_seq < expected:
            problems.append(f"{manifest.path.name}: starts at seq {manifest.from_seq}, "
                            f"expected {expected} (an overlap in the archive)")
        problems += checked[manifest.path]
        expected = manifest.upto_seq + 1
    if not found and not problems:
        problems.append("no archive manifest found")
    return found, problems


# ------------------------------------------------------------------ rows


@dataclass(frozen=True)
class ArchivedRow:
    """One line of an archive file, as stored."""

    seq: int
    recorded_at: datetime
    kind: str
    subject: str
    epoch: int
    causation_seq: int | None
    payload: dict[str, Any] | None  # None: not JSON (see raw)
    raw: str | None = None

    def recorded(self) -> RecordedEvent:
        if self.payload is None:
            raise ArchiveError(f"archived row seq {self.seq} ({self.kind}) has a payload "
                               f"that is not JSON: {self.raw!r}")
        return RecordedEvent(seq=self.seq, recorded_at=self.recorded_at, epoch=self.epoch,
                             subject=self.subject,
                             payload=decode_payload(self.kind, self.payload),
                             causation_seq=self.causation_seq)


def read_file(path: Path, after: int = 0, upto: int | None = None) -> Iterator[ArchivedRow]:
    """The rows of one archive file (after..upto); ArchiveError naming the file and the
    line for one that is not an archive line."""
    with gzip.open(path, "rb") as stream:
        for number, line in lines(stream, path):
            try:
                body = json.loads(line)
                seq = int(body["seq"])
                if seq <= after or (upto is not None and seq > upto):
                    continue
                row = ArchivedRow(seq, as_utc(datetime.fromisoformat(body["recorded_at"])),
                                  str(body["kind"]), str(body["subject"]), int(body["epoch"]),
                                  body["causation_seq"], body.get("payload"),
                                  body.get("payload_raw"))
            except (ValueError, KeyError, TypeError) as error:
                raise ArchiveError(f"{path.name}: line {number}: not an archive line: "
                                   f"{type(error).__name__}: {str(error)[:200]}") from None
            yield row


def read_rows(found: Sequence[Manifest], after: int = 0,
              upto: int | None = None) -> Iterator[ArchivedRow]:
    """The archived rows after..upto of the manifests, in seq order."""
    for manifest in found:
        for entry in manifest.files:
            if entry["upto_seq"] <= after or (upto is not None and entry["from_seq"] > upto):
                continue
            yield from read_file(confined(manifest.path.parent, entry["name"],
                                          manifest.path.name), after, upto)
