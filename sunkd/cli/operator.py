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
from datetime import UTC, datetime
from typing import Any

from sunkd.domain.events import Event, OperatorPinned
from sunkd.domain.ownership import assess, explain, slurm_state_text
from sunkd.domain.policy import effective_pools, membership
from sunkd.domain.state import EMPTY, ClusterState, fold, state_from_json, state_to_json
from sunkd.runtime.config import Settings, pool_spec
from sunkd.runtime.engine import load_state
from sunkd.store import projections
from sunkd.store.eventlog import EventLog


def _when(moment: float | None) -> str:
    if moment is None:
        return "-"
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S")


def status_rows(state: ClusterState, settings: Settings, now: float) -> list[dict[str, Any]]:
    pools = effective_pools(state, [pool_spec(pool) for pool in settings.pools])
    pool_of = membership(state, pools)
    rows = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
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
        if node.pin is not None:
            reasons.append(f"pinned to {node.pin.to} by {node.pin.who}: {node.pin.why}")
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


def cmd_status(args: Any, settings: Settings) -> int:
    async def run() -> ClusterState:
        event_log = await EventLog.open(settings.database_url)
        try:
            return (await load_state(event_log))[0]
        finally:
            await event_log.close()

    state = asyncio.run(run())
    rows = status_rows(state, settings, time.time())
    if args.json:
        print(json.dumps({"last_seq": state.last_seq, "nodes": rows,
                          "sources": {name: {"status": s.status, "cause": s.cause}
                                      for name, s in state.sources.items()}}, indent=2))
        return 0
    header = ("NODE", "POOL", "OWNER", "PHASE", "SINCE", "SLURM", "KUBERNETES", "REASON")
    table = [header] + [
        (row["node"], row["pool"] or "-", row["owner"], row["phase"], _when(row["since"]),
         row["slurm_state"], row["kubernetes_state"], row["reason"] or "-")
        for row in rows]
    widths = [max(len(str(line[i])) for line in table) for i in range(len(header) - 1)]
    for line in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False))
              + "  " + str(line[-1]))
    sources = ", ".join(f"{name} {s.status}" for name, s in sorted(state.sources.items()))
    print(f"\n{len(rows)} nodes; sources: {sources or 'none yet'}; log at seq {state.last_seq}")
    return 0


def cmd_pin(args: Any, settings: Settings) -> int:
    who = args.who or getpass.getuser()

    async def run() -> int:
        event_log = await EventLog.open(settings.database_url)
        try:
            state, _ = await load_state(event_log)
            if args.node not in state.nodes and args.node not in state.k8s_names:
                print(f"sunkd: warning: {args.node} has not been observed yet; the pin is "
                      "recorded and applies once it is", file=sys.stderr)
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


async def replay_check(event_log: EventLog) -> list[str]:
    """Rebuild from the whole log (one pass, stopping by the latest snapshot's position
    on the way) and compare: the snapshot with the replay up to its seq, the daemon's way
    of loading (snapshot + tail) with the full replay, and the read models with it."""
    problems: list[str] = []
    snapshot = await event_log.latest_snapshot()
    full = EMPTY
    if snapshot is not None:
        seq, body = snapshot
        async for batch in event_log.read_range(0, upto=seq):
            full = fold(batch, full)
        problems += [f"snapshot {seq} vs replay to {seq}: {d}"
                     for d in compare_states(full, state_from_json(body))]
    async for batch in event_log.read_range(full.last_seq):
        full = fold(batch, full)
    incremental, _ = await load_state(event_log, from_snapshot=True)
    problems += [f"snapshot+tail vs full replay: {d}" for d in compare_states(full, incremental)]
    problems += [f"read models: {d}"
                 for d in await projections.check_against_state(event_log.engine, full)]
    return problems


def cmd_replay(args: Any, settings: Settings) -> int:
    async def run() -> int:
        event_log = await EventLog.open(settings.database_url)
        try:
            if getattr(args, "rebuild", False):
                from sunkd.store import projections

                await projections.rebuild(event_log.engine)
                print("read models rebuilt from the log")
            started = time.perf_counter()
            problems = await replay_check(event_log)
            seconds = time.perf_counter() - started
            latest = await event_log.latest_seq()
            if problems:
                for problem in problems:
                    print(problem)
                print(f"replay check FAILED: {len(problems)} difference(s) over {latest} events")
                return 1
            print(f"replay check passed: {latest} events, state rebuilt in {seconds:.2f}s, "
                  "equal to the snapshot and the read models")
            return 0
        finally:
            await event_log.close()

    return asyncio.run(run())
