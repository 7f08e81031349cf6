"""Reading workload traces: the only module of `sunkd.simulate` that touches files.

Two formats, each turned into plain records (times in seconds from the trace's start):

- the Standard Workload Format of the Parallel Workloads Archive (`.swf`, optionally
  gzipped): one batch job per line, 18 whitespace-separated numbers, `;` comments (the
  header's `MaxProcs`/`MaxNodes` give the processors per node);
- the Alibaba OpenB 2023 pod list (`openb_pod_list_default.csv`): one Kubernetes pod per
  row with its requests and its creation, scheduling and deletion times.

A malformed line is an error naming the file, the line and what is wrong with it; nothing
is skipped silently. What is skipped on purpose (jobs that never ran, CPU-only pods, pods
that were never scheduled in production) is counted in the returned `notes`.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SWF_FIELDS = 18
OPENB_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos",
                 "pod_phase", "creation_time", "deletion_time", "scheduled_time")
# The shipped copies (see traces/README.md for sources, citations and licences).
DEFAULT_SWF = "NASA-iPSC-1993-3.1-cln.swf.gz"
DEFAULT_OPENB = "openb_pod_list_default.csv"


class TraceError(ValueError):
    """A trace file cannot be read: the message names the file, line and problem."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One batch job of an SWF log (whole nodes)."""

    job_id: int
    submit: float
    runtime: float
    nodes: int
    requested_time: float | None  # the user's limit, when the log has it


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of the OpenB list. `start` is when production scheduled it."""

    name: str
    create: float
    start: float
    end: float
    gpus: int
    gpu_milli: int  # per GPU: 1000 = whole GPUs, less = a share of one GPU
    cpu_milli: int
    memory_mib: int
    qos: str


@dataclass(frozen=True, slots=True)
class SwfTrace:
    path: str
    jobs: tuple[TraceJob, ...]
    max_nodes: int | None  # header MaxNodes
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodTrace:
    path: str
    pods: tuple[TracePod, ...]
    notes: tuple[str, ...]


def shipped(name: str) -> Path:
    """The path of a trace shipped with sunkd (`sunkd/simulate/traces/NAME`)."""
    return Path(str(resources.files("sunkd.simulate").joinpath("traces", name)))


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        return open(path, encoding="utf-8", newline="")
    except OSError as error:
        raise TraceError(f"{path}: cannot open: {error.strerror or error}") from error


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    stream = _open_text(path)
    try:
        yield from enumerate(stream, 1)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: cannot read: {error}") from error
    finally:
        stream.close()


def _number(text: str, where: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {what} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: {what} is not finite: {text!r}")
    return value


def load_swf(path: Path | str, procs_per_node: int | None = None) -> SwfTrace:
    """Jobs of an SWF log. Nodes per job = allocated (else requested) processors divided
    by `procs_per_node` (default: the header's MaxProcs / MaxNodes, else 1), rounded up."""
    path = Path(path)
    header: dict[str, str] = {}
    raw: list[tuple[int, list[float]]] = []
    for number, line in _lines(path):
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            key, sep, value = text[1:].partition(":")
            if sep:
                header[key.strip()] = value.strip()
            continue
        where = f"{path}:{number}"
        fields = text.split()
        if len(fields) != SWF_FIELDS:
            raise TraceError(f"{where}: expected {SWF_FIELDS} whitespace-separated fields "
                             f"(SWF), got {len(fields)}: {text[:80]!r}")
        raw.append((number, [_number(f, where, f"field {i + 1}") for i, f in
                             enumerate(fields)]))
    max_nodes = _header_int(header, "MaxNodes", path)
    max_procs = _header_int(header, "MaxProcs", path)
    if procs_per_node is None:
        procs_per_node = max(max_procs // max_nodes, 1) if max_nodes and max_procs else 1
    jobs: list[TraceJob] = []
    no_run = 0
    for number, f in raw:
        where = f"{path}:{number}"
        procs = f[4] if f[4] > 0 else f[7]
        runtime = f[3]
        if f[1] < 0:
            raise TraceError(f"{where}: field 2 (submit time) is negative: {f[1]:g}")
        if runtime <= 0 or procs <= 0:
            no_run += 1  # never ran (cancelled before start) or carries no size
            continue
        jobs.append(TraceJob(job_id=int(f[0]), submit=f[1], runtime=runtime,
                             nodes=math.ceil(procs / procs_per_node),
                             requested_time=f[8] if f[8] > 0 else None))
    if not jobs:
        raise TraceError(f"{path}: no job with a run time and a size")
    jobs.sort(key=lambda job: (job.submit, job.job_id))
    notes = [f"{len(jobs)} jobs; {procs_per_node} processor(s) per node"]
    if no_run:
        notes.append(f"{no_run} jobs without a run time or size skipped")
    return SwfTrace(str(path), tuple(jobs), max_nodes, tuple(notes))


def _header_int(header: dict[str, str], key: str, path: Path) -> int | None:
    value = header.get(key)
    if value is None:
        return None
    try:
        number = int(value.split()[0])
    except (ValueError, IndexError):
        raise TraceError(f"{path}: header {key} is not an integer: {value!r}") from None
    return number if number > 0 else None


def load_openb(path: Path | str) -> PodTrace:
    """GPU pods of an OpenB pod list that ran in production.

    Skipped and counted: CPU-only pods (num_gpu 0: they run on the cluster's CPU nodes,
    not on a shared GPU pool) and pods never scheduled there (pod_phase Pending: the
    trace does not say how long they would have run)."""
    path = Path(path)
    lines = _lines(path)
    try:
        _, first = next(lines)
    except StopIteration:
        raise TraceError(f"{path}: empty file, expected a CSV header") from None
    header = next(csv.reader([first]))
    missing = [column for column in OPENB_COLUMNS if column not in header]
    if missing:
        raise TraceError(f"{path}:1: not an OpenB pod list: missing column(s) "
                         f"{', '.join(missing)}")
    index = {column: header.index(column) for column in OPENB_COLUMNS}
    pods: list[TracePod] = []
    cpu_only = never_scheduled = 0
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = next(csv.reader([line]))
        except csv.Error as error:
            raise TraceError(f"{where}: not CSV: {error}") from None
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")

        def integer(column: str, row: list[str] = row, where: str = where) -> int:
            text = row[index[column]].strip()
            if text == "" and column == "scheduled_time":
                return 0
            value = _number(text, where, column)
            if value < 0 or value != int(value):
                raise TraceError(f"{where}: {column} must be a whole number >= 0: {text!r}")
            return int(value)

        gpus, phase = integer("num_gpu"), row[index["pod_phase"]].strip()
        create, end = integer("creation_time"), integer("deletion_time")
        scheduled = integer("scheduled_time")
        milli, cpu, memory = integer("gpu_milli"), integer("cpu_milli"), integer("memory_mib")
        if gpus == 0:
            cpu_only += 1
            continue
        if phase == "Pending":
            never_scheduled += 1
            continue
        if not 0 < milli <= 1000:
            raise TraceError(f"{where}: gpu_milli must be 1-1000 for a GPU pod: {milli}")
        start = max(scheduled, create)
        if end <= start:
            raise TraceError(f"{where}: deletion_time {end} is not after the start {start}")
        pods.append(TracePod(row[index["name"]].strip(), float(create), float(start),
                             float(end), gpus, milli, cpu, memory, row[index["qos"]].strip()))
    if not pods:
        raise TraceError(f"{path}: no GPU pod that ran")
    pods.sort(key=lambda pod: (pod.create, pod.name))
    notes = (f"{len(pods)} GPU pods", f"{cpu_only} CPU-only pods skipped",
             f"{never_scheduled} pods never scheduled in production skipped")
    return PodTrace(str(path), tuple(pods), notes)
