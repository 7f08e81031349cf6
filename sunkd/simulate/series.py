"""A run's time series, sampled cheaply with bounded memory, for `sunkd simulate --plot`.

Why: the table says how a run ended; a person choosing knobs also needs to see *when*
the pool moved, how long nodes sat in transit and when queues built up. Recording every
event would cost memory in proportion to the run; instead the world calls `sample` at
fixed virtual-time steps (default every 10 simulated minutes). When `max_points` is
reached, every other point is dropped and the step doubles, so a run of any length keeps
at most `max_points` samples (a 40-day run at 10 min is 5,760 points, ~0.5 MB).

Queue lengths are the *largest* seen at any instant within each sample's interval (the
world reports them after every instant, which costs two comparisons), so a queue that
builds and drains between two samples still shows; owners are the state at the sample.

Ownership per node, from what the schedulers may use:
- flags mode (separate clusters, sunkd's pool): Slurm if only the owner taint is set
  (Kubernetes may not use it), Kubernetes if only the DRAIN flag is set, in transit if
  both are (a move in progress: drained and tainted) or neither;
- ideal pool: Slurm while a job runs there, Kubernetes while pods do, else free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

FIELDS = ("t", "slurm", "kubernetes", "transit", "pending_jobs", "pending_pods",
          "moves", "evictions")


class Series:
    def __init__(self, step: float = 600.0, max_points: int = 8192) -> None:
        if step <= 0 or max_points < 2:
            raise ValueError("step must be > 0 and max_points >= 2")
        self.step = step
        self.max_points = max_points
        self.next_at = 0.0
        self.rows: list[tuple[float, int, int, int, int, int, int, int]] = []
        self.moves: Callable[[], int] | None = None  # cumulative moves (the arm's count)
        self.peak_jobs = 0  # the largest queues since the last sample
        self.peak_pods = 0

    def due(self, t: float) -> bool:
        return t >= self.next_at

    def observe(self, pending_jobs: int, pending_pods: int) -> None:
        """The queues after an instant: kept if they are the interval's largest."""
        if pending_jobs > self.peak_jobs:
            self.peak_jobs = pending_jobs
        if pending_pods > self.peak_pods:
            self.peak_pods = pending_pods

    def take_peaks(self, pending_jobs: int, pending_pods: int) -> tuple[int, int]:
        """The interval's largest queues (at least the current ones); the next interval
        starts from the current ones."""
        peaks = max(self.peak_jobs, pending_jobs), max(self.peak_pods, pending_pods)
        self.peak_jobs, self.peak_pods = pending_jobs, pending_pods
        return peaks

    def add(self, t: float, slurm: int, kubernetes: int, transit: int, pending_jobs: int,
            pending_pods: int, moves: int, evictions: int) -> None:
        self.rows.append((t, slurm, kubernetes, transit, pending_jobs, pending_pods, moves,
                          evictions))
        self.next_at = t + self.step
        if len(self.rows) >= self.max_points:
            self.rows = self.rows[::2]
            self.step *= 2
            self.next_at = self.rows[-1][0] + self.step

    def column(self, name: str) -> list[float]:
        index = FIELDS.index(name)
        return [row[index] for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"step_s": self.step, **{name: self.column(name) for name in FIELDS}}


def owners(nodes: Sequence[Any], ideal: bool) -> tuple[int, int, int]:
    """(Slurm, Kubernetes, in transit or free) node counts now; see the module doc."""
    slurm = kubernetes = 0
    if ideal:
        for node in nodes:
            if node.job is not None:
                slurm += 1
            elif node.pods:
                kubernetes += 1
    else:
        for node in nodes:
            if node.tainted and not node.drain:
                slurm += 1
            elif node.drain and not node.tainted:
                kubernetes += 1
    return slurm, kubernetes, len(nodes) - slurm - kubernetes
