"""The busy/idle fold: its cost per event beside the real fold, and the status page's
"utilization (last 24 h)" block (read the log's relevant kinds + fold) on SQLite.

`sunkd audit` and the status page read the log from its first row (the owner and the
activity at the period's start depend on everything before), so what matters is how
long a read of the observation and transition kinds plus the fold takes per event.
The log: N nodes in one pool, adopted, then observations flipping between IDLE and
ALLOCATED on Slurm and pool pods Running or gone on Kubernetes, one change per event
(the sources append only changes), a lend or a reclaim every 50 events; plus as many
events of kinds the fold skips (actions, demand), which the kind filter leaves out.
Measured in the same run:
  * fold: `Utilization.apply` per event, against `state.fold` over the same events
    (the daemon's own fold: the floor of anything that reads the log);
  * audit: `store.utilization.utilization(log, now - 24h, now)` on SQLite, the audit's
    path (read the whole log's relevant kinds + fold);
  * page: `RollingUtilization.rows(now)`, the status page's path: its first render reads
    as much as the audit, every later one only what was appended since (here: 100
    events).
Targets: a later status-page render under 50 ms; the full read under 5 s per 100,000
relevant events.

Usage: python bench/utilization.py [--quick] [--events N] [--nodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sunkd.domain.events import (
    ActionRequested,
    Event,
    K8sNodeObserved,
    K8sWorkloadObserved,
    Payload,
    PodRef,
    RecordedEvent,
    SlurmDemandObserved,
    SlurmNodeObserved,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.utilization import Utilization
from sunkd.store.eventlog import EventLog
from sunkd.store.utilization import RollingUtilization, utilization

POOL = "default/gpu"


def payloads(nodes: int, count: int) -> list[tuple[str, Payload]]:
    """`count` relevant events (and as many the fold skips) over `nodes` nodes."""
    out: list[tuple[str, Payload]] = []
    for index in range(nodes):
        name = f"n{index}"
        out.append((name, SlurmNodeObserved(node=name, state="IDLE", cpus=64)))
        out.append((f"k-{name}", K8sNodeObserved(node=f"k-{name}", slurm_node=name)))
        out.append((name, TransitionStarted(transition_id=f"a-{name}", node=name, pool=POOL,
                                            from_owner="none", to_owner="slurm")))
        out.append((name, TransitionCompleted(transition_id=f"a-{name}", node=name,
                                              pool=POOL, from_owner="none",
                                              to_owner="slurm")))
    owner = {f"n{i}": "slurm" for i in range(nodes)}
    step = 0
    while len(out) < 2 * count:
        name = f"n{step % nodes}"
        step += 1
        if step % 50 == 0:
            src = owner[name]
            dst = "kubernetes" if src == "slurm" else "slurm"
            tid = f"t{step}"
            out.append((name, TransitionStarted(transition_id=tid, node=name, pool=POOL,
                                                from_owner=src, to_owner=dst)))
            out.append((name, TransitionCompleted(transition_id=tid, node=name, pool=POOL,
                                                  from_owner=src, to_owner=dst)))
            owner[name] = dst
        elif owner[name] == "slurm":
            busy = step % 3 != 0
            out.append((name, SlurmNodeObserved(node=name, state="ALLOCATED" if busy else "IDLE",
                                                cpus=64, alloc_cpus=32 if busy else 0)))
        else:
            pods = (PodRef("fn", f"p{step}", phase="Running"),) if step % 3 else ()
            out.append((f"k-{name}", K8sWorkloadObserved(node=f"k-{name}", pool=POOL,
                                                         pods=pods)))
        # Something the fold does not read, as often as something it does.
        if step % 2:
            out.append((name, ActionRequested(action_id=f"x{step}", side="slurm",
                                              verb="drain", node=name)))
        else:
            out.append(("gpu", SlurmDemandObserved(partition="gpu", pending_jobs=step % 7)))
    return out


def recorded(items: list[tuple[str, Payload]], start: datetime, spacing: float
             ) -> list[RecordedEvent]:
    return [RecordedEvent(seq=i + 1, recorded_at=start + timedelta(seconds=i * spacing),
                          epoch=1, subject=subject, payload=payload)
            for i, (subject, payload) in enumerate(items)]


async def page_path(items: list[tuple[str, Payload]]) -> tuple[float, float, float, int]:
    """(audit read s, first page render s, later page render s, rows)."""
    with tempfile.TemporaryDirectory() as directory:
        event_log = await EventLog.open(f"sqlite+aiosqlite:///{directory}/bench.db",
                                        migrate=True)
        try:
            head, tail = items[:-100], items[-100:]
            for offset in range(0, len(head), 2000):
                chunk = head[offset:offset + 2000]
                await event_log.append_unfenced([Event(s, p) for s, p in chunk])
            now = datetime.now(UTC)  # the database stamps appends with its own clock
            started = time.perf_counter()
            folded = await utilization(event_log, now - timedelta(hours=24), now)
            audit_s = time.perf_counter() - started
            rolling = RollingUtilization(event_log)
            started = time.perf_counter()
            await rolling.rows(now)
            first_s = time.perf_counter() - started
            await event_log.append_unfenced([Event(s, p) for s, p in tail])
            started = time.perf_counter()
            await rolling.rows(now + timedelta(seconds=60))
            later_s = time.perf_counter() - started
            return audit_s, first_s, later_s, len(folded.rows())
        finally:
            await event_log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller log (< 60 s)")
    parser.add_argument("--events", type=int, help="relevant events (default 100k, quick 20k)")
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    count = args.events or (20_000 if args.quick else 100_000)
    items = payloads(args.nodes, count)
    relevant = sum(1 for _s, p in items
                   if not isinstance(p, ActionRequested | SlurmDemandObserved))
    now = datetime.now(UTC)
    start = now - timedelta(seconds=len(items))  # one event a second, up to now
    events = recorded(items, start, 1.0)

    started = time.perf_counter()
    fold_util = Utilization()
    fold_util.apply_all(events)
    fold_util.advance(events[-1].recorded_at.timestamp())
    util_s = time.perf_counter() - started
    started = time.perf_counter()
    fold(events)
    state_s = time.perf_counter() - started

    audit_s, first_s, later_s, rows = asyncio.run(page_path(items))
    per_100k = audit_s / relevant * 100_000
    figures = {
        "events": len(events),
        "relevant_events": relevant,
        "nodes": args.nodes,
        "utilization_fold_events_per_s": round(len(events) / util_s),
        "state_fold_events_per_s": round(len(events) / state_s),
        "utilization_over_state_fold_time": round(util_s / state_s, 2),
        "audit_read_fold_s": round(audit_s, 3),
        "audit_s_per_100k_relevant": round(per_100k, 3),
        "page_first_render_s": round(first_s, 3),
        "page_later_render_ms": round(later_s * 1000, 2),
        "rows": rows,
        "python": platform.python_version(),
    }
    print(f"utilization fold {figures['utilization_fold_events_per_s']} events/s "
          f"({figures['utilization_over_state_fold_time']}x the state fold's time); "
          f"audit read+fold of {relevant} relevant events on SQLite: "
          f"{audit_s:.2f} s ({per_100k:.2f} s per 100k); status page first render "
          f"{first_s:.2f} s, later {later_s * 1000:.1f} ms", file=sys.stderr)
    print(json.dumps({
        "benchmark": "utilization",
        "figures": figures,
        "targets": {
            "page_later_render_ms": {"value": figures["page_later_render_ms"], "target": 50,
                                     "better": "lower"},
            "audit_s_per_100k_relevant": {"value": figures["audit_s_per_100k_relevant"],
                                          "target": 5.0, "better": "lower"}},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
