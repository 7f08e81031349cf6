"""What a run measured, per arm, and whether it met the service targets.

Percentiles are nearest-rank over every job (every pod) of the window. A job that never
started counts with the wait it had when the run ended (a lower bound: the truth is
worse), a pod never placed with its pending time up to the horizon; both are counted
separately too, so a tail is never hidden by a percentile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from sunkd.simulate.series import Series
from sunkd.simulate.world import World

HOUR = 3600.0
DAY = 86400.0
P95 = 95.0  # the percentile the pending targets read


@dataclass(frozen=True, slots=True)
class Targets:
    batch_wait_p95: float = HOUR  # seconds
    pod_pending_p95: float = 60.0
    max_wait: float | None = 24 * HOUR  # no batch job waits longer; None: no such target


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0-100) of `values`; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[rank(p, len(ordered)) - 1])


def rank(p: float, count: int) -> int:
    """The nearest rank (1-based) of percentile `p` among `count` values."""
    return max(math.ceil(p / 100 * count), 1)


def over_percentile(p: float, count: int) -> int:
    """How many of `count` values must exceed a bound for percentile `p` to exceed it."""
    return count - rank(p, count) + 1


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p95": percentile(values, P95),
            "p99": percentile(values, 99), "max": max(values, default=0.0)}


@dataclass(frozen=True, slots=True)
class ArmReport:
    arm: str  # separate | sunkd | ideal
    nodes: int
    slurm_nodes: int  # separate: Slurm's cluster; pools: Slurm's share at the start
    k8s_nodes: int
    jobs: int
    jobs_started: int
    never_started: int
    waited_over_max: int  # jobs waiting longer than targets.max_wait (started or not)
    batch_wait_s: dict[str, float]
    batch_node_hours: float  # batch work done within the window
    pods: int
    never_placed: int
    pod_pending_s: dict[str, float]
    evictions: int
    utilization: float  # busy node-seconds / node-seconds over the window
    gpu_utilization: float  # allocated GPU-seconds / GPU-seconds over the window
    transit_node_hours: float  # idle but usable by neither side (a move in progress)
    moves: int  # lends + reclaims completed (ideal: nodes changing side)
    moves_per_day: float
    aborted: int
    abort_reasons: dict[str, int]
    meets: dict[str, bool | None]  # per target; None: not applicable (backlog)
    lends: int = 0  # sunkd: completed moves to Kubernetes
    reclaims: int = 0  # and back to Slurm
    decide_calls: int = 0
    events: int = 0
    violations: int = 0  # world or safety-rule violations (always 0 unless a bug)
    digest: str = ""  # hash of sunkd's decisions: equal runs decide the same
    simulated_days: float = 0.0
    wall_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Sampled owners and queues over the run (for --plot); not part of the JSON figures.
    series: Series | None = field(default=None, compare=False, repr=False)

    @property
    def meets_all(self) -> bool:
        return all(value is not False for value in self.meets.values())

    def to_json(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "series"}
        body["batch_wait_s"] = dict(self.batch_wait_s)
        body["pod_pending_s"] = dict(self.pod_pending_s)
        body["abort_reasons"] = dict(self.abort_reasons)
        body["meets"] = dict(self.meets)
        body["meets_all"] = self.meets_all
        body["notes"] = list(self.notes)
        return body


def measure(world: World, arm: str, slurm_nodes: int, k8s_nodes: int, targets: Targets, *,
            moves: int, aborted: dict[str, int] | None = None, lends: int = 0,
            reclaims: int = 0, decide_calls: int = 0,
            events: int = 0, problems: int = 0, digest: str = "",
            wall_seconds: float = 0.0) -> ArmReport:
    end = world.now
    horizon = world.horizon
    waits = [(record.start if record.start is not None else max(end, record.submit))
             - record.submit for record in world.jobs.values()]
    never = sum(1 for record in world.jobs.values() if record.start is None)
    cap = targets.max_wait
    over = 0 if cap is None else sum(1 for wait in waits if wait > cap)
    pending = [record.pending for record in world.pods]
    nodes = len(world.nodes)
    capacity = nodes * horizon
    _idle, busy, transit = world.time_in
    backlog = world.workload.backlog_depth > 0
    batch_wait = _summary(waits)
    pod_pending = _summary(pending)
    meets: dict[str, bool | None] = {
        "batch_wait_p95": None if backlog or not waits else
        batch_wait["p95"] <= targets.batch_wait_p95,
        "pod_pending_p95": None if not pending else pod_pending["p95"] <= targets.pod_pending_p95,
    }
    if cap is not None:
        meets["max_wait"] = None if backlog or not waits else over == 0
    aborted = dict(sorted((aborted or {}).items()))
    return ArmReport(
        arm=arm, nodes=nodes, slurm_nodes=slurm_nodes, k8s_nodes=k8s_nodes,
        jobs=len(world.jobs), jobs_started=len(world.jobs) - never, never_started=never,
        waited_over_max=over, batch_wait_s=batch_wait,
        batch_node_hours=round(world.batch_node_seconds / HOUR, 1),
        pods=len(world.pods), never_placed=sum(1 for r in world.pods if not r.placed),
        pod_pending_s=pod_pending, evictions=world.evictions,
        utilization=round(busy / capacity, 4) if capacity else 0.0,
        gpu_utilization=round(world.gpu_seconds / (capacity * world.shape.gpus), 4)
        if capacity else 0.0,
        transit_node_hours=round(transit / HOUR, 1),
        moves=moves, moves_per_day=round(moves / (horizon / DAY), 2),
        aborted=sum(aborted.values()), abort_reasons=aborted, meets=meets,
        lends=lends, reclaims=reclaims, decide_calls=decide_calls, events=events,
        violations=len(world.violations) + problems, digest=digest,
        simulated_days=round(end / DAY, 2), wall_seconds=round(wall_seconds, 2),
        notes=tuple(world.violations[:5]), series=world.series)
