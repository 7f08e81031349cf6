"""`sunkd simulate --from-log DB_URL`: shadow replay of a real event log.

Why here: reading the log is I/O (the store), which `sunkd.simulate` may not do; this
module reads the events, hands them to `sunkd.simulate.shadow` (pure), runs the replays
and prints what the recorded sunkd did next to what each candidate setting would have
done. docs/evaluation.md ("Shadow replay") states what can and cannot be replayed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sunkd.domain.events import OwnershipSpec, RecordedEvent
from sunkd.simulate.arms import SimConfig, run_sunkd
from sunkd.simulate.metrics import ArmReport
from sunkd.simulate.report import duration
from sunkd.simulate.search import knob_text, sweep_settings
from sunkd.simulate.shadow import (
    DAY,
    RecordedMoves,
    ReplayPool,
    days_of,
    moves_per_day_from_series,
    read_log,
)


async def read_events(url: str, page: int = 5000) -> list[RecordedEvent]:
    """Every event of the log at `url`, in seq order (the schema must be at head)."""
    from sunkd.store.eventlog import EventLog, sqlite_path

    path = sqlite_path(url)
    if path is not None and not Path(path).is_file():  # said before opening it
        raise FileNotFoundError(f"no SQLite event log at {path}")
    log = await EventLog.open(url, access="read")  # never creates, migrates or changes it
    try:
        events: list[RecordedEvent] = []
        after = 0
        while True:
            batch = await log.read(after_seq=after, limit=page)
            if not batch:
                return events
            events.extend(batch)
            after = batch[-1].seq
    finally:
        await log.close()


def load(url: str) -> list[ReplayPool]:
    return read_log(asyncio.run(read_events(url)))


def settings_for(pool: ReplayPool, knobs: dict[str, Any],
                 grid: dict[str, list[Any]]) -> list[tuple[str, OwnershipSpec]]:
    """(label, spec) to replay: the recorded settings first, then the candidates (the
    recorded settings with --knobs applied, times the --sweep grid)."""
    recorded = pool.ownership or OwnershipSpec()
    label = "replayed, recorded knobs" if pool.ownership is not None else \
        "replayed, default knobs (no Nodeset in the log)"
    out = [(label, recorded)]
    base = replace(recorded, **knobs)
    candidates = sweep_settings(base, grid) if grid else ([base] if knobs else [])
    out += [(f"candidate {knob_text(spec)}", spec) for spec in candidates if spec != recorded]
    return out


def replay(pool: ReplayPool, settings: Sequence[tuple[str, OwnershipSpec]],
           config: SimConfig) -> list[tuple[str, OwnershipSpec, ArmReport]]:
    config = replace(config, shape=pool.shape)
    nodes = len(pool.nodes)
    return [(label, spec, run_sunkd(pool.workload, nodes, pool.k8s_at_start, spec, config))
            for label, spec in settings]


def _recorded_json(moves: RecordedMoves, horizon: float) -> dict[str, Any]:
    days = horizon / DAY
    return {"lends": moves.lends, "reclaims": moves.reclaims,
            "lends_per_day": round(moves.lends / days, 2),
            "reclaims_per_day": round(moves.reclaims / days, 2),
            "moves_by_day": moves.per_day(days_of(horizon)),
            "aborted": moves.aborted, "evictions": moves.evictions,
            "transit_node_hours": round(moves.transit_seconds / 3600, 2),
            "moves": [{"t_s": round(t, 1), "node": node, "direction": direction}
                      for t, node, direction in moves.moves]}


def _replay_json(label: str, spec: OwnershipSpec, report: ArmReport,
                 horizon: float) -> dict[str, Any]:
    days = horizon / DAY
    by_day = [] if report.series is None else \
        moves_per_day_from_series(report.series, horizon, report.moves)
    return {"label": label, "knobs": asdict(spec), "lends": report.lends,
            "reclaims": report.reclaims, "lends_per_day": round(report.lends / days, 2),
            "reclaims_per_day": round(report.reclaims / days, 2), "moves_by_day": by_day,
            "aborted": report.aborted, "evictions": report.evictions,
            "transit_node_hours": report.transit_node_hours,
            "batch_wait_s": report.batch_wait_s, "pod_pending_s": report.pod_pending_s,
            "jobs_starved": report.waited_over_max, "meets": report.meets,
            "violations": report.violations}


def to_json(results: Sequence[tuple[ReplayPool, list[tuple[str, OwnershipSpec, ArmReport]]]]
            ) -> dict[str, Any]:
    pools = []
    for pool, runs in results:
        horizon = pool.workload.horizon
        pools.append({
            "pool": pool.pool, "nodes": len(pool.nodes), "days": round(horizon / DAY, 3),
            "kubernetes_at_start": pool.k8s_at_start,
            "shape": asdict(pool.shape), "jobs": len(pool.workload.jobs),
            "pods": len(pool.workload.pods), "not_replayed": dict(pool.skipped),
            "recorded": _recorded_json(pool.recorded, horizon),
            "replays": [_replay_json(label, spec, report, horizon)
                        for label, spec, report in runs]})
    return {"shadow": True, "pools": pools}


def text(results: Sequence[tuple[ReplayPool, list[tuple[str, OwnershipSpec, ArmReport]]]]
         ) -> str:
    if not results:
        return "sunkd simulate --from-log: the log holds no pool with nodes"
    lines: list[str] = []
    for pool, runs in results:
        horizon = pool.workload.horizon
        days = horizon / DAY
        moves = pool.recorded
        lines += [f"shadow replay of pool {pool.pool}: {len(pool.nodes)} nodes, "
                  f"{days:.2f} days of log, {pool.k8s_at_start} owned by Kubernetes at "
                  f"the start; reconstructed {len(pool.workload.jobs)} batch jobs, "
                  f"{len(pool.workload.pods)} pods"]
        lines += [f"  not replayed: {count} {what}" for what, count in pool.skipped.items()]
        header = ["", "recorded", *(label for label, _, _ in runs)]
        recorded_days = moves.per_day(days_of(horizon))
        rows: list[list[str]] = [
            ["lends per day", f"{moves.lends / days:.1f}",
             *(f"{r.lends / days:.1f}" for _, _, r in runs)],
            ["reclaims per day", f"{moves.reclaims / days:.1f}",
             *(f"{r.reclaims / days:.1f}" for _, _, r in runs)],
            ["busiest day (moves)", str(max(recorded_days)),
             *(str(max(moves_per_day_from_series(r.series, horizon, r.moves)))
               if r.series is not None else "-" for _, _, r in runs)],
            ["aborted moves", str(moves.aborted), *(str(r.aborted) for _, _, r in runs)],
            ["pod evictions", str(moves.evictions), *(str(r.evictions) for _, _, r in runs)],
            ["node-hours in transit", f"{moves.transit_seconds / 3600:.1f}",
             *(f"{r.transit_node_hours:.1f}" for _, _, r in runs)],
            ["batch wait p95/max (model)", "-",
             *(f"{duration(r.batch_wait_s['p95'])}/{duration(r.batch_wait_s['max'])}"
               for _, _, r in runs)],
            ["pod pending p95/max (model)", "-",
             *(f"{duration(r.pod_pending_s['p95'])}/{duration(r.pod_pending_s['max'])}"
               for _, _, r in runs)],
            ["targets met (model)", "-",
             *("yes" if r.meets_all else "NO" for _, _, r in runs)],
        ]
        widths = [max(len(str(row[i])) for row in [header, *rows])
                  for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row))
                         .rstrip())
        lines.append("")
    lines.append("recorded: what sunkd did (from the log's transitions and actions); "
                 "replayed: the log's demand simulated with those knobs (the model's "
                 "error is the gap between the two); candidate: with yours. Waits are "
                 "the model's, on the recorded arrivals and run times (docs/evaluation.md).")
    return "\n".join(lines)
