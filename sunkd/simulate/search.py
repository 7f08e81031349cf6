"""The questions an operator asks of the three arms.

- `compare`: the three arms on one pool size (by default the size separate clusters need).
- `size_search`: the smallest pool that meets the targets, per arm. Separate clusters are
  two independent searches (Slurm alone, Kubernetes alone); the pools are one search
  each. Bisection assumes more nodes never make a target fail (true of the model in the
  runs we made; a search states its bounds).
- `sweep`: sunkd's pool with several knob settings, on one size.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sunkd.domain.events import OwnershipSpec
from sunkd.simulate.arms import (
    SimConfig,
    k8s_only,
    pods_meet,
    run_ideal,
    run_separate,
    run_sunkd,
    slurm_only,
)
from sunkd.simulate.metrics import ArmReport
from sunkd.simulate.workload import Workload

# A progress bar factory: label -> callback(simulated seconds).
ProgressFactory = Callable[[str], Callable[[float], None] | None]


def _none(_label: str) -> None:
    return None


def _bisect(meets: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest n in [low, high] with meets(n), assuming monotony; None if not even
    `high` meets."""
    if not meets(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return high


@dataclass(frozen=True, slots=True)
class Split:
    slurm: int  # separate clusters: Slurm's nodes
    k8s: int  # and Kubernetes'


SplitCache = dict[tuple[object, ...], bool]


def minimal_split(workload: Workload, config: SimConfig,
                  progress: ProgressFactory = _none,
                  cache: SplitCache | None = None) -> tuple[Split | None, int, int | None]:
    """The smallest separate clusters meeting the targets: (split, Slurm's, Kubernetes').
    `cache` (any dict, shared across calls) remembers each cluster size's verdict by the
    side's own workload: scenarios sharing their pods (diurnal, diurnal+backlog) or
    their batch jobs search that side once."""
    batch = slurm_only(workload)
    pods = k8s_only(workload)
    memo: SplitCache = {} if cache is None else cache
    # Hashed once: a key holding the tuples would hash 10^5 records on every lookup.
    batch_key = (workload.horizon, workload.backlog_depth, hash(workload.jobs), config)
    pods_key = (workload.horizon, hash(workload.pods), config)

    def slurm_meets(n: int) -> bool:
        key = ("slurm", n, *batch_key)
        if key not in memo:
            report = run_separate(batch, n, 0, config, progress(f"separate: Slurm {n}"),
                                  series=False)
            memo[key] = report.meets["batch_wait_p95"] is not False and \
                report.meets.get("max_wait") is not False
        return memo[key]

    def k8s_meets(n: int) -> bool:
        key = ("k8s", n, *pods_key)
        if key not in memo:
            memo[key] = pods_meet(pods, n, config, progress(f"separate: Kubernetes {n}"))
        return memo[key]

    widest = max(workload.widest_job, 1)
    batch_load, pod_load = mean_load(workload, config.shape.gpus)
    low = max(widest, math.ceil(batch_load))
    slurm = _bisect(slurm_meets, low, 4 * low) if workload.jobs else 0
    k8s = _grow(k8s_meets, max(math.ceil(pod_load), 1)) if workload.pods else 0
    if slurm is None or k8s is None:
        return None, slurm or 0, k8s
    return Split(slurm, k8s), slurm, k8s


def mean_load(workload: Workload, gpus_per_node: int) -> tuple[float, float]:
    """Nodes busy on average over the window: (batch, pods by their GPUs). No pool
    smaller than their sum keeps up, so searches start there."""
    horizon = workload.horizon
    batch = sum(job.nodes * min(job.runtime, max(horizon - job.submit, 0.0))
                for job in workload.jobs) / horizon
    pods = sum(pod.gpus * min(pod.gpu_milli, 1000) / 1000 * pod.duration
               for pod in workload.pods) / horizon / max(gpus_per_node, 1)
    return batch, pods


def _grow(meets: Callable[[int], bool], start: int, limit: int = 4096) -> int | None:
    """The smallest n >= start with meets(n): doubling, then bisection."""
    low, high = start, start
    while not meets(high):
        if high >= limit:
            return None
        low, high = high + 1, high * 2
    return _bisect(meets, low, high) if low < high else high


def split_for(nodes: int, minimal: Split) -> Split:
    """A static split of `nodes` in proportion to the minimal clusters' sizes."""
    total = minimal.slurm + minimal.k8s
    k8s = round(nodes * minimal.k8s / total) if total else 0
    return Split(nodes - k8s, k8s)


@dataclass(frozen=True, slots=True)
class Comparison:
    nodes: int
    split: Split
    separate: ArmReport
    sunkd: ArmReport
    ideal: ArmReport

    @property
    def utilization_efficiency(self) -> float | None:
        """(U_sunkd - U_separate) / (U_ideal - U_separate); None when the ideal gains
        less than half a point (nothing to share)."""
        gain = self.ideal.utilization - self.separate.utilization
        if gain < 0.005:
            return None
        return round((self.sunkd.utilization - self.separate.utilization) / gain, 3)


def compare(workload: Workload, nodes: int, split: Split, ownership: OwnershipSpec,
            config: SimConfig, progress: ProgressFactory = _none) -> Comparison:
    separate = run_separate(workload, split.slurm, split.k8s, config,
                            progress(f"separate {split.slurm}+{split.k8s}"))
    sunkd = run_sunkd(workload, nodes, split.k8s, ownership, config,
                      progress(f"sunkd {nodes}"))
    ideal = run_ideal(workload, nodes, ownership.prefer, config, progress(f"ideal {nodes}"))
    return Comparison(nodes, split, separate, sunkd, ideal)


@dataclass(frozen=True, slots=True)
class SizeSearch:
    separate: int | None
    separate_split: Split | None
    sunkd: int | None
    ideal: int | None
    searched_up_to: int
    # Every pool size tried: (arm, nodes, targets met, targets that apply), in order.
    trials: tuple[tuple[str, int, int, int], ...] = ()

    @property
    def nodes_saved(self) -> float | None:
        if self.separate is None or self.sunkd is None:
            return None
        return round(1 - self.sunkd / self.separate, 4)

    @property
    def size_efficiency(self) -> float | None:
        """(N_separate - N_sunkd) / (N_separate - N_ideal); None when the ideal saves
        less than 5 % of the separate size (too small to mean anything)."""
        if self.separate is None or self.sunkd is None or self.ideal is None:
            return None
        saved = self.separate - self.ideal
        if saved < 0.05 * self.separate:
            return None
        return round((self.separate - self.sunkd) / saved, 3)

    def to_json(self) -> dict[str, Any]:
        return {"separate": self.separate, "sunkd": self.sunkd, "ideal": self.ideal,
                "separate_split": None if self.separate_split is None else
                {"slurm": self.separate_split.slurm, "kubernetes": self.separate_split.k8s},
                "searched_up_to": self.searched_up_to, "nodes_saved": self.nodes_saved,
                "trials": [list(trial) for trial in self.trials],
                "size_efficiency": self.size_efficiency}


def size_search(workload: Workload, ownership: OwnershipSpec, config: SimConfig,
                minimal: Split | None, progress: ProgressFactory = _none) -> SizeSearch:
    """Smallest pools meeting every target. The pools' searches start at the separate
    size (try it first, then bisect below or above it) and never go below the widest job
    or the mean load."""
    separate = None if minimal is None else minimal.slurm + minimal.k8s
    batch_load, pod_load = mean_load(workload, config.shape.gpus)
    low = max(workload.widest_job, math.ceil(batch_load + pod_load), 1)
    guess = max(separate or low, low)
    high = 2 * guess
    initial = minimal or Split(low, 0)
    trials: list[tuple[str, int, int, int]] = []

    def tried(arm: str, n: int, report: ArmReport) -> bool:
        known = [value for value in report.meets.values() if value is not None]
        trials.append((arm, n, sum(1 for value in known if value), len(known)))
        return report.meets_all

    def ideal_meets(n: int) -> bool:
        return tried("ideal", n, run_ideal(workload, n, ownership.prefer, config,
                                           progress(f"size search: ideal {n}")))

    def sunkd_meets(n: int) -> bool:
        share = split_for(n, initial)
        return tried("sunkd", n, run_sunkd(workload, n, share.k8s, ownership, config,
                                           progress(f"size search: sunkd {n}")))

    sunkd = _smallest(sunkd_meets, low, guess, high)
    ideal = _smallest(ideal_meets, low, guess, high)
    return SizeSearch(separate, minimal, sunkd, ideal, high, tuple(trials))


def _smallest(meets: Callable[[int], bool], low: int, guess: int, high: int) -> int | None:
    """The smallest n in [low, high] with meets(n), trying `guess` first. Each size is
    asked once (a whole simulated run): the bisection below the guess starts by asking
    its upper bound, the guess itself, again."""
    once = functools.cache(meets)
    if once(guess):
        return _bisect(once, low, guess) if low < guess else guess
    return _bisect(once, guess + 1, high) if guess < high else None


def sweep_settings(base: OwnershipSpec,
                   grid: Mapping[str, Sequence[Any]]) -> list[OwnershipSpec]:
    """Every combination of the grid's values over `base` (knob names as OwnershipSpec
    fields: dwell_seconds, max_in_flight, prefer, min_kubernetes, ...)."""
    names = sorted(grid)
    return [replace(base, **dict(zip(names, values, strict=True)))
            for values in itertools.product(*(grid[name] for name in names))]


def sweep(workload: Workload, nodes: int, split: Split, settings: Sequence[OwnershipSpec],
          config: SimConfig, progress: ProgressFactory = _none
          ) -> list[tuple[OwnershipSpec, ArmReport]]:
    return [(spec, run_sunkd(workload, nodes, split.k8s, spec, config,
                             progress(f"sweep {index + 1}/{len(settings)}")))
            for index, spec in enumerate(settings)]


def knob_text(spec: OwnershipSpec) -> str:
    fields = [f"prefer={spec.prefer}", f"dwell={spec.dwell_seconds:g}",
              f"maxInFlight={spec.max_in_flight}"]
    if spec.min_kubernetes:
        fields.append(f"minK8s={spec.min_kubernetes}")
    if spec.min_slurm:
        fields.append(f"minSlurm={spec.min_slurm}")
    if spec.max_kubernetes is not None:
        fields.append(f"maxK8s={spec.max_kubernetes}")
    if spec.drain_timeout_seconds != OwnershipSpec().drain_timeout_seconds:
        fields.append(f"drainTimeout={spec.drain_timeout_seconds:g}")
    if spec.reclaim_grace_seconds != OwnershipSpec().reclaim_grace_seconds:
        fields.append(f"reclaimGrace={spec.reclaim_grace_seconds:g}")
    if spec.forecast:
        fields.append(f"forecast=on horizon={spec.forecast_horizon_seconds:g} "
                      f"quantile={spec.headroom_quantile:g}")
        if spec.forecast_block_hours > 0:
            fields.append(f"blocks={spec.forecast_block_hours:g}h")
    return " ".join(fields)

