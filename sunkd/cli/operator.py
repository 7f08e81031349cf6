"""Operator commands: `sunkd status`, `sunkd pin`, `sunkd replay`.

They read (and for `pin`, append to) the same event log the daemon uses, so they work
on any host that can reach the database, whether or not the daemon runs there.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sunkd.cli.text import printable, shortened
from sunkd.domain.events import Event, OperatorPinned, RecordedEvent
from sunkd.domain.fold import fold
from sunkd.domain.ownership import assess, explain, observed, slurm_state_text
from sunkd.domain.policy import effective_pools, membership, unpooled_marks
from sunkd.domain.slurmddefunct import defunct_records
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import EMPTY, ClusterState
from sunkd.runtime.config import Settings, pool_spec
from sunkd.runtime.reconciler import ArchivedLogError, load_state
from sunkd.store import archive
from sunkd.store.eventlog import EventLog
from sunkd.store.projections import CorruptRow


def _when(moment: float | None) -> str:
    if moment is None:
        return "-"
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S")


def status_rows(state: ClusterState, settings: Settings, now: float) -> list[dict[str, Any]]:
    pools = effective_pools(state, [pool_spec(pool) for pool in settings.pools])
    pool_of = membership(state, pools)
    nodes = dict(state.nodes)
    defunct = {record.node: record for record in defunct_records(state)}
    for name, record in state.unpooled.items():  # forgotten with a mark on (older logs)
        unpooled = record.expand(name)
        if unpooled_marks(unpooled) or name in defunct:
            nodes[name] = unpooled
    rows = []
    for name in sorted(nodes):
        node = nodes[name]
        if not observed(node):
            continue  # only pinned, never seen: see pending_pins
        assessment = assess(state, node, now)
        slurm = node.slurm
        k8s = node.k8s
        slurm_state = slurm_state_text(slurm)
        if k8s is None:
            k8s_state = "-"
        else:
            k8s_state = {True: "Ready", False: "NotReady", None: "Unknown"}[k8s.ready]
            if k8s.unschedulable:
                k8s_state += ",SchedulingDisabled"
        reasons = explain(node, assessment)
        if assessment.pin_problem is not None and node.pin is not None:
            reasons.append(f"{assessment.pin_problem} (set by {node.pin.who})")
        elif node.pin is not None:
            reasons.append(f"pinned to {node.pin.to} by {node.pin.who}: {node.pin.why}")
        marks = unpooled_marks(node) if name not in pool_of else []
        if marks:  # it left every pool (or never had one) and sunkd's marks are still on
            since = f" since {_when(node.unpooled_since)}" if node.unpooled_since else ""
            reasons.append(f"in no pool{since}, carries sunkd's " + "; ".join(marks))
        if name in defunct:
            reasons.append(
                f"{defunct[name].why}: sunkd deletes the record (Slurm 23.02+); with "
                f"Slurm 22.05 run `scontrol delete nodename={name}`")
        rows.append({
            "node": name,
            "pool": pool_of.get(name),
            "owner": node.owner,
            "phase": str(assessment.phase),
            "since": node.since,
            "slurm_state": slurm_state,
            "slurm_reason": slurm.reason if slurm is not None else None,
            "kubernetes_state": k8s_state,
            "transition_id": node.transition.transition_id if node.transition else None,
            "reason": "; ".join(reasons),
        })
    return rows


def pending_pins(state: ClusterState) -> list[dict[str, Any]]:
    """Pins of nodes never observed (`sunkd pin --force`): they apply once the node is."""
    return [{"node": name, "to": node.pin.to, "who": node.pin.who, "why": node.pin.why}
            for name, node in sorted(state.nodes.items())
            if node.pin is not None and not observed(node)]


def report_corrupt(rows: list[CorruptRow], command: str) -> None:
    for row in rows:
        print(printable(f"sunkd {command}: warning: {row.describe()}; it is skipped"),
              file=sys.stderr)
    if rows:
        print(f"sunkd {command}: find it with `sunkd events --after {rows[0].seq - 1} --json` "
              "(docs/operations.md, a row sunkd cannot decode)", file=sys.stderr)


def cmd_status(args: Any, settings: Settings) -> int:
    corrupt: list[CorruptRow] = []

    async def run() -> ClusterState:
        event_log = await EventLog.open(settings.database_url, access="read")
        try:
            return (await load_state(event_log, on_corrupt=corrupt.append))[0]
        finally:
            await event_log.close()

    state = asyncio.run(run())
    rows = status_rows(state, settings, time.time())
    waiting = pending_pins(state)
    report_corrupt(corrupt, "status")
    if args.json:
        print(json.dumps({"last_seq": state.last_seq, "nodes": rows,
                          "sources": {name: {"status": s.status, "cause": s.cause}
                                      for name, s in state.sources.items()},
                          "pending_pins": waiting,
                          "corrupt_rows": [row.to_json() for row in corrupt]}, indent=2))
        return 0
    header = ("NODE", "POOL", "OWNER", "PHASE", "SINCE", "SLURM", "KUBERNETES", "REASON")
    table = [header] + [
        tuple(printable(cell) for cell in (
            row["node"], row["pool"] or "-", row["owner"], row["phase"], _when(row["since"]),
            row["slurm_state"], row["kubernetes_state"], row["reason"] or "-"))
        for row in rows]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(header) - 1)]
    for line in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False))
              + "  " + str(line[-1]))
    sources = ", ".join(f"{name} {s.status}" for name, s in sorted(state.sources.items()))
    print(f"\n{len(rows)} nodes; sources: {sources or 'none yet'}; log at seq {state.last_seq}")
    for pin in waiting:
        print(printable(f"pin waiting for a node never observed: {pin['node']} to {pin['to']} "
                        f"by {pin['who']}: {pin['why']}"))
    return 0


def cmd_pin(args: Any, settings: Settings) -> int:
    who = args.who or getpass.getuser()

    async def run() -> int:
        event_log = await EventLog.open(settings.database_url, access="write")
        try:
            state, _ = await load_state(event_log, on_corrupt=lambda _row: None)
            known = state.nodes.get(state.k8s_names.get(args.node, args.node))
            if known is None or not observed(known):
                if not args.force:
                    name = shortened(args.node, quote="'")
                    print(f"sunkd pin: no node {name} has been "
                          "observed, by that Slurm or Kubernetes name; check the name with "
                          "`sunkd status`, or pin it anyway with --force (the pin then "
                          "applies once the node is observed)", file=sys.stderr)
                    return 2
                print(f"sunkd: warning: {shortened(args.node)} has not been observed yet; "
                      "the pin is recorded and applies once it is", file=sys.stderr)
            node = state.k8s_names.get(args.node, args.node)
            seqs = await event_log.append_unfenced([Event(subject=node, payload=OperatorPinned(
                node=node, to=args.to, who=who, why=args.reason))])
            print(f"pinned {node} to {args.to} (event {seqs[0]})")
            return 0
        finally:
            await event_log.close()

    return asyncio.run(run())


def compare_states(expected: ClusterState, actual: ClusterState) -> list[str]:
    """Differences between two states, as readable paths (empty when equal)."""
    differences: list[str] = []

    def walk(path: str, left: Any, right: Any) -> None:
        if len(differences) >= 50:
            return
        if isinstance(left, dict) and isinstance(right, dict):
            for key in sorted(set(left) | set(right), key=str):
                walk(f"{path}.{key}", left.get(key, "<missing>"), right.get(key, "<missing>"))
        elif left != right:
            differences.append(f"{path}: {left!r} != {right!r}")

    walk("state", state_to_json(expected), state_to_json(actual))
    return differences


async def replay_check(event_log: EventLog, *, archives: Sequence[Path] = (),
                       notes: list[str] | None = None) -> list[str]:
    """Rebuild from the whole log and compare: the snapshot with the replay up to its
    seq, the daemon's way of loading (snapshot + tail) with the full replay, and the read
    models with it. A row that does not decode is a problem, reported with its seq, kind
    and raw text; the check goes on without it.

    After `sunkd log archive` the database starts at the archive's end: the full replay
    then starts from the archive base snapshot, or, with `archives` (directories), from
    seq 1 through the archive files, which are verified first (checksums, counts, seq
    continuity up to the live log), and the fold through the archive must equal the
    base snapshot. `notes` receives what was checked or skipped, for people."""
    problems: list[str] = []
    corrupt: dict[int, CorruptRow] = {}
    said = notes if notes is not None else []

    def note(row: CorruptRow) -> None:
        corrupt.setdefault(row.seq, row)

    live = await event_log.live_range()
    live_first = live[0] if live is not None else 1
    base_seq = await event_log.archive_base_seq()
    start = EMPTY
    if archives:
        found, archive_problems = await archive.verify_against_log(event_log,
                                                                   list(archives))
        problems += [f"archive: {p}" for p in archive_problems]
        archived_upto = found[-1].upto_seq if found else 0
        if found and archived_upto + 1 != live_first:
            problems.append(f"archive ends at seq {archived_upto}, the live log starts at "
                            f"{live_first}: seqs are not continuous across the boundary")
        if not archive_problems:
            start = await asyncio.to_thread(_fold_archive, found)
            said.append(f"archive verified: seqs 1-{archived_upto} in {len(found)} "
                        "manifest(s), checksums match")
            if base_seq is not None and base_seq == archived_upto:
                base = await _snapshot_state(event_log, base_seq)
                if base is None:
                    problems.append(f"the archive base snapshot {base_seq} is missing")
                else:
                    problems += [f"archive fold vs base snapshot {base_seq}: {d}"
                                 for d in compare_states(start, base)]
    elif live_first > 1:
        if base_seq is None or base_seq != live_first - 1:
            problems.append(f"the log starts at seq {live_first} but no archive base snapshot "
                            f"is at {live_first - 1}: pass --archive DIR")
        else:
            base = await _snapshot_state(event_log, base_seq)
            if base is None:
                problems.append(f"the archive base snapshot {base_seq} is missing: pass "
                                "--archive DIR")
            else:
                start = base
                said.append(f"seqs 1-{base_seq} are archived: replayed from the archive "
                            f"base snapshot {base_seq} (pass --archive DIR to check them too)")
    if live_first > start.last_seq + 1:
        return problems  # nothing to replay from: said above
    snapshot = await event_log.latest_snapshot()
    full = start
    if snapshot is not None and snapshot[0] >= start.last_seq:
        # one pass, stopping by the snapshot's position on the way
        seq, body = snapshot
        full, _ = await load_state(event_log, from_snapshot=False, upto=seq, start=start,
                                   on_corrupt=note)
        problems += [f"snapshot {seq} vs replay to {seq}: {d}"
                     for d in compare_states(full, state_from_json(body))]
    full, _ = await load_state(event_log, from_snapshot=False, start=full, on_corrupt=note)
    try:
        incremental, _ = await load_state(event_log, from_snapshot=True, on_corrupt=note)
        problems += [f"snapshot+tail vs full replay: {d}"
                     for d in compare_states(full, incremental)]
    except ArchivedLogError as error:
        problems.append(f"the daemon could not load this log: {error}")
    first, _last, count = await archive.restored_range(event_log)
    covered = live_first == 1 or (first == 1 and count == live_first - 1)
    if covered:
        problems += [f"read models: {d}"
                     for d in await event_log.read_models.check_against_state(full)]
    else:
        said.append(f"read models not compared: they cover the live log (from seq "
                    f"{live_first}) and {count} restored events; `sunkd log restore` the "
                    "whole archive to compare them")
    return [row.describe() for _seq, row in sorted(corrupt.items())] + problems


def _fold_archive(found: Sequence[archive.Manifest]) -> ClusterState:
    state = EMPTY
    batch: list[RecordedEvent] = []
    for row in archive.read_rows(found):
        batch.append(row.recorded())
        if len(batch) >= 5000:
            state = fold(batch, state)
            batch = []
    return fold(batch, state)


async def _snapshot_state(event_log: EventLog, seq: int) -> ClusterState | None:
    body = await event_log.snapshot_at(seq)
    return None if body is None else state_from_json(body)


def cmd_replay(args: Any, settings: Settings) -> int:
    async def run() -> int:
        event_log = await EventLog.open(
            settings.database_url, access="write" if getattr(args, "rebuild", False) else "read")
        try:
            if getattr(args, "rebuild", False):
                await event_log.read_models.rebuild()
                print("read models rebuilt from the log")
            started = time.perf_counter()
            notes: list[str] = []
            problems = await replay_check(event_log, archives=args.archive or (),
                                          notes=notes)
            for line in notes:
                print(printable(line))
            seconds = time.perf_counter() - started
            latest = await event_log.latest_seq()
            if problems:
                for problem in problems:
                    print(printable(problem))
                print(f"replay check FAILED: {len(problems)} difference(s) over {latest} events")
                return 1
            print(f"replay check passed: {latest} events, state rebuilt in {seconds:.2f}s, "
                  "equal to the snapshot and the read models")
            return 0
        finally:
            await event_log.close()

    return asyncio.run(run())
