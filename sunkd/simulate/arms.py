"""The three arms, each on the same workload: separate clusters, sunkd's pool, the ideal.

- separate: `slurm_nodes` for Slurm and `k8s_nodes` for Kubernetes, never moving.
- sunkd: one pool of `nodes`, `k8s_nodes` of them lent to Kubernetes at the start (the
  split two clusters merged into one pool would bring), sunkd's real policy moving them.
- ideal: one pool of `nodes` where every idle node is instantly free for either side:
  no move costs, no dwell, no in-flight limit, no preemption (an upper bound on what
  moving whole nodes can give, for the same `prefer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sunkd.domain.events import OwnershipSpec
from sunkd.domain.forecast import DemandSummary
from sunkd.simulate.bridge import Latencies, SunkdController
from sunkd.simulate.metrics import P95, ArmReport, Targets, measure, over_percentile
from sunkd.simulate.records import NodeShape
from sunkd.simulate.workload import Workload
from sunkd.simulate.world import World

Progress = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class SimConfig:
    shape: NodeShape = field(default_factory=NodeShape)
    latencies: Latencies = field(default_factory=Latencies)
    targets: Targets = field(default_factory=Targets)
    drain_limit_days: float = 30.0
    check: bool = False  # check sunkd's safety rules on every round (slower)


def _world(workload: Workload, nodes: int, k8s_nodes: int, config: SimConfig, *,
           ideal: bool = False, prefer_k8s: bool = False) -> World:
    return World(workload, nodes, min(k8s_nodes, nodes), shape=config.shape, ideal=ideal,
                 prefer_k8s=prefer_k8s, drain_limit=config.drain_limit_days * 86400.0)


def run_separate(workload: Workload, slurm_nodes: int, k8s_nodes: int,
                 config: SimConfig = SimConfig(), progress: Progress | None = None, *,
                 series: bool = True) -> ArmReport:
    """`series=False`: no time series (a size search reads only the verdict; recording
    costs the world model about a fifth of its time)."""
    started = time.perf_counter()
    world = _world(workload, slurm_nodes + k8s_nodes, k8s_nodes, config)
    if not series:
        world.series = None
    world.run(progress)
    return measure(world, "separate", slurm_nodes, k8s_nodes, config.targets, moves=0,
                   wall_seconds=time.perf_counter() - started)


def pods_meet(workload: Workload, k8s_nodes: int, config: SimConfig = SimConfig(),
              progress: Progress | None = None) -> bool:
    """Whether a separate Kubernetes cluster of `k8s_nodes` meets the pod pending p95
    target: `run_separate(...).meets["pod_pending_p95"] is not False`, but the run stops
    as soon as enough pods waited past the bound that the p95 cannot meet it (pending
    time only grows), and records no series. A size search's failing sizes are its
    slowest runs (their queues grow), so it mostly reads this early verdict."""
    world = _world(workload, k8s_nodes, k8s_nodes, config)
    world.series = None
    arrived = sum(1 for pod in workload.pods if pod.create < workload.horizon)
    world.late_bound = config.targets.pod_pending_p95
    world.late_limit = over_percentile(P95, arrived) if arrived else None
    world.run(progress)
    if world.gave_up:
        return False
    report = measure(world, "separate", 0, k8s_nodes, config.targets, moves=0)
    return report.meets["pod_pending_p95"] is not False


def run_ideal(workload: Workload, nodes: int, prefer: str = "Slurm",
              config: SimConfig = SimConfig(), progress: Progress | None = None) -> ArmReport:
    started = time.perf_counter()
    world = _world(workload, nodes, 0, config, ideal=True, prefer_k8s=prefer == "Kubernetes")
    world.run(progress)
    return measure(world, "ideal", nodes, 0, config.targets, moves=world.flips,
                   wall_seconds=time.perf_counter() - started)


def run_sunkd(workload: Workload, nodes: int, k8s_nodes: int, ownership: OwnershipSpec,
              config: SimConfig = SimConfig(), progress: Progress | None = None, *,
              history: Mapping[str, DemandSummary] | None = None,
              learned: dict[str, DemandSummary] | None = None) -> ArmReport:
    """`history`: the demand summaries the controller starts with (a forecast learned
    before the window, as a daemon that ran with the forecast off has it in its log);
    `learned`: filled with the summaries it ends with."""
    started = time.perf_counter()
    world = _world(workload, nodes, k8s_nodes, config)
    controller = SunkdController(world, ownership, config.latencies, check=config.check)
    if history:
        controller.state = replace(controller.state, demand_history=dict(history))
    stats = controller.stats
    if world.series is not None:
        world.series.moves = lambda: stats.lends + stats.reclaims
    world.run(progress)
    if learned is not None:
        learned.update(controller.state.demand_history)
    return measure(world, "sunkd", nodes - min(k8s_nodes, nodes), min(k8s_nodes, nodes),
                   config.targets, moves=stats.lends + stats.reclaims,
                   aborted=dict(stats.aborted), lends=stats.lends, reclaims=stats.reclaims,
                   decide_calls=stats.decide_calls,
                   events=stats.events, problems=len(stats.problems),
                   digest=controller.digest(), wall_seconds=time.perf_counter() - started)


def slurm_only(workload: Workload) -> Workload:
    return replace(workload, pods=())


def k8s_only(workload: Workload) -> Workload:
    return replace(workload, jobs=(), backlog_depth=0)
