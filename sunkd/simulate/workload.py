"""What the simulated pool is asked to run: a window of each trace, scaled, per scenario.

Times are seconds from the window's start. Construction (docs/evaluation.md states it):

- window: `days` of each trace. The batch window starts at `slurm_start_day` (default 0);
  the pod window by default ends at the pod trace's last creation (OpenB's pods are
  nearly all created in its last ~35 of 149 days). Pods already running when the window
  opens are present at t=0 with what is left of their run; pods still running when it
  closes stop there (the trace says nothing beyond).
- scale: a factor K replicates a side's trace: replica 0 as is, replicas 1.. rotated in
  time by a random shift (seeded), so the load's shape is kept and its level multiplied;
  a fractional part keeps each element of one more replica with that probability.
  A rotated pod that wraps past the window's end continues from t=0 (its run is split).
- scenarios: `traces` as given; `diurnal` (synthetic): pod arrivals re-timed, in order,
  so their rate follows a daily cosine with its trough at 40 % of its peak, their runs
  capped (default 4 h: inference replicas an autoscaler adds and removes) so the demand
  follows the curve, and replicated to keep the GPU-hours of the `traces` scenario (the
  level of Kubernetes' load is kept, its shape changed); `backlog`
  (synthetic): the batch queue never empties, the job list is resubmitted (in trace
  order, cyclically) whenever fewer than `backlog_depth` jobs wait; `diurnal+backlog`
  both at once (anti-correlated demand: inference by day, training soaks up the night);
  `random-bursts` (synthetic): the diurnal scenario's pods re-timed to bursts at random
  times (no daily profile: what a forecast cannot predict, to show what it costs
  there), `random-bursts+backlog` with the backlog.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

from sunkd.simulate.traces import PodTrace, SwfTrace

DAY = 86400.0
SCENARIOS = ("traces", "diurnal", "backlog", "diurnal+backlog", "random-bursts",
             "random-bursts+backlog")
DIURNAL_TROUGH = 0.4  # trough / peak of the re-timed arrival rate
DIURNAL_PEAK_HOUR = 14.0  # hour of day of the peak (serving traffic peaks in the afternoon)
# Random bursts (what no daily profile predicts): the arrival rate's base, against 1 more
# during each burst (overlapping bursts add up), bursts a day, and a burst's length.
BURST_BASE = 0.4
BURSTS_PER_DAY = 3.0
BURST_HOURS = (1.0, 4.0)


@dataclass(frozen=True, slots=True)
class BatchJob:
    job_id: int
    submit: float
    runtime: float
    nodes: int
    estimate: float  # the time limit EASY backfill plans with


@dataclass(frozen=True, slots=True)
class SimPod:
    name: str
    create: float
    duration: float  # run time once bound
    gpus: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Workload:
    scenario: str
    horizon: float  # arrivals happen in [0, horizon); figures are measured over it
    jobs: tuple[BatchJob, ...]
    pods: tuple[SimPod, ...]
    backlog_depth: int  # > 0: keep this many batch jobs waiting (resubmitting `jobs`)
    synthetic: bool
    notes: tuple[str, ...]

    @property
    def widest_job(self) -> int:
        return max((job.nodes for job in self.jobs), default=0)


def _window_jobs(trace: SwfTrace, start: float, horizon: float) -> list[BatchJob]:
    jobs = []
    for job in trace.jobs:
        submit = job.submit - start
        end = submit + job.runtime
        if submit >= horizon or end <= 0:
            continue
        runtime = job.runtime if submit >= 0 else end  # running at the window's start
        estimate = max(job.requested_time or runtime, runtime)
        jobs.append(BatchJob(job.job_id, max(submit, 0.0), runtime, job.nodes, estimate))
    return jobs


def _window_pods(trace: PodTrace, start: float, horizon: float) -> list[SimPod]:
    pods = []
    for pod in trace.pods:
        create, begin, end = pod.create - start, pod.start - start, pod.end - start
        if create >= horizon or end <= 0:
            continue
        if begin < 0:  # running when the window opens: present at 0 with the rest of its run
            create, duration = 0.0, end
        else:
            create, duration = max(create, 0.0), end - begin
        duration = min(duration, horizon - create)
        if duration > 0:
            pods.append(SimPod(pod.name, create, duration, pod.gpus, pod.gpu_milli,
                               pod.cpu_milli, pod.memory_mib))
    return pods


def _replicas(scale: float, rng: random.Random) -> list[tuple[int, float | None]]:
    """(replica number, keep probability or None for all) for a scale factor."""
    if scale <= 0:
        return []
    whole = math.floor(scale)
    plan: list[tuple[int, float | None]] = [(r, None) for r in range(whole)]
    if scale - whole > 1e-9:
        plan.append((whole, scale - whole))
    return plan


def scale_jobs(jobs: list[BatchJob], scale: float, horizon: float,
               rng: random.Random) -> list[BatchJob]:
    out: list[BatchJob] = []
    next_id = max((job.job_id for job in jobs), default=0) + 1
    for replica, keep in _replicas(scale, rng):
        shift = 0.0 if replica == 0 else float(rng.randrange(max(int(horizon), 1)))
        for job in jobs:
            if keep is not None and rng.random() >= keep:
                continue
            if replica == 0:
                out.append(job)
                continue
            out.append(BatchJob(next_id, (job.submit + shift) % horizon, job.runtime,
                                job.nodes, job.estimate))
            next_id += 1
    out.sort(key=lambda job: (job.submit, job.job_id))
    return out


def scale_pods(pods: list[SimPod], scale: float, horizon: float,
               rng: random.Random) -> list[SimPod]:
    out: list[SimPod] = []
    for replica, keep in _replicas(scale, rng):
        shift = 0.0 if replica == 0 else float(rng.randrange(max(int(horizon), 1)))
        for pod in pods:
            if keep is not None and rng.random() >= keep:
                continue
            if replica == 0:
                out.append(pod)
                continue
            name = f"{pod.name}-r{replica}"
            create = (pod.create + shift) % horizon
            first = min(pod.duration, horizon - create)
            out.append(SimPod(name, create, first, pod.gpus, pod.gpu_milli, pod.cpu_milli,
                              pod.memory_mib))
            if pod.duration > first:  # wrapped: the rest of its run from the window's start
                out.append(SimPod(f"{name}-w", 0.0, min(pod.duration - first, horizon),
                                  pod.gpus, pod.gpu_milli, pod.cpu_milli, pod.memory_mib))
    out.sort(key=lambda pod: (pod.create, pod.name))
    return out


def _diurnal_cumulative(t: float) -> float:
    """Integral of the arrival rate 1 + a*cos(2*pi*(t - peak)/DAY) with a set so that
    trough / peak = DIURNAL_TROUGH, from 0 to t."""
    a = (1 - DIURNAL_TROUGH) / (1 + DIURNAL_TROUGH)
    phase = DIURNAL_PEAK_HOUR * 3600.0
    w = 2 * math.pi / DAY
    return t + a / w * (math.sin(w * (t - phase)) - math.sin(-w * phase))


def diurnal_retime(pods: list[SimPod], horizon: float,
                   max_duration: float | None = None) -> list[SimPod]:
    """Re-time every pod (those running when the window opens too) so that the k-th of n
    arrives where the diurnal cumulative rate reaches (k + 0.5) / n of its total; order and
    sizes are kept, durations too, capped at `max_duration` when given (replicas an
    autoscaler adds and removes with the traffic: the demand then follows the curve)."""
    step = 60.0  # the cumulative rate, tabled each minute and interpolated
    grid = [_diurnal_cumulative(min(i * step, horizon))
            for i in range(math.ceil(horizon / step) + 1)]
    return _retime(pods, horizon, grid, step, max_duration)


def _retime(pods: list[SimPod], horizon: float, grid: list[float], step: float,
            max_duration: float | None) -> list[SimPod]:
    """The k-th of n pods (in creation order) where the cumulative rate `grid` (tabled
    every `step` seconds from 0) reaches (k + 0.5) / n of its total."""
    ordered = sorted(pods, key=lambda pod: (pod.create, pod.name))
    total = grid[-1]
    out = []
    count = len(ordered)
    for k, pod in enumerate(ordered):
        target = (k + 0.5) / count * total
        i = max(bisect.bisect_left(grid, target), 1)
        low, high = grid[i - 1], grid[i]
        at = ((i - 1) + (target - low) / (high - low if high > low else 1.0)) * step
        create = float(min(round(at), math.floor(horizon) - 1))
        duration = pod.duration if max_duration is None else min(pod.duration, max_duration)
        out.append(SimPod(pod.name, create, min(duration, horizon - create), pod.gpus,
                          pod.gpu_milli, pod.cpu_milli, pod.memory_mib))
    out.sort(key=lambda pod: (pod.create, pod.name))
    return out


def burst_rate(horizon: float, rng: random.Random) -> tuple[list[float], float,
                                                            list[tuple[float, float]]]:
    """A random-bursts arrival rate, tabled as a cumulative each minute: a base of
    BURST_BASE plus 1 during each of about BURSTS_PER_DAY bursts a day, each starting at
    a uniformly random time and lasting a uniformly random BURST_HOURS. Returns the
    table, its step and the bursts (start, end)."""
    count = max(round(BURSTS_PER_DAY * horizon / DAY), 1)
    bursts = []
    for _ in range(count):
        start = rng.uniform(0.0, horizon)
        bursts.append((start, min(start + rng.uniform(*BURST_HOURS) * 3600.0, horizon)))
    step = 60.0
    slots = math.ceil(horizon / step)
    rate = [BURST_BASE] * slots
    for start, end in bursts:
        for i in range(int(start // step), min(math.ceil(end / step), slots)):
            rate[i] += 1.0
    grid = [0.0]
    for i in range(slots):
        grid.append(grid[-1] + rate[i] * (min((i + 1) * step, horizon) - i * step))
    return grid, step, sorted(bursts)


def gpu_seconds(pods: list[SimPod]) -> float:
    return sum(pod.gpus * min(pod.gpu_milli, 1000) / 1000 * pod.duration for pod in pods)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """How to cut and shape the traces into a workload."""

    scenario: str = "traces"
    days: float = 40.0
    slurm_start_day: float = 0.0
    pods_start_day: float | None = None  # None: the window ends at the last pod creation
    slurm_scale: float = 1.0
    pods_scale: float = 10.0
    backlog_depth: int = 16
    diurnal_pod_hours: float | None = 4.0  # diurnal: re-timed pods run at most this long
    seed: int = 1


def build_workload(spec: WorkloadSpec, swf: SwfTrace, openb: PodTrace) -> Workload:
    if spec.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {spec.scenario!r}; one of {', '.join(SCENARIOS)}")
    if not spec.days > 0:
        raise ValueError("the window must be longer than 0 days")
    horizon = spec.days * DAY
    rng = random.Random(spec.seed)
    slurm_start = spec.slurm_start_day * DAY
    if spec.pods_start_day is None:
        last = max(pod.create for pod in openb.pods)
        pods_start = max(math.floor(last - horizon) + 1.0, 0.0)
    else:
        pods_start = spec.pods_start_day * DAY
    jobs = scale_jobs(_window_jobs(swf, slurm_start, horizon), spec.slurm_scale, horizon, rng)
    window_pods = _window_pods(openb, pods_start, horizon)
    pods = scale_pods(window_pods, spec.pods_scale, horizon, rng)
    notes = [f"batch trace {swf.path}: {'; '.join(swf.notes)}",
             f"pod trace {openb.path}: {'; '.join(openb.notes)}",
             f"window {spec.days:g} days: batch from day {slurm_start / DAY:.2f}, pods from "
             f"day {pods_start / DAY:.2f}; batch x{spec.slurm_scale:g}, pods "
             f"x{spec.pods_scale:g} (seed {spec.seed})"]
    if "diurnal" in spec.scenario or "bursts" in spec.scenario:
        cap = spec.diurnal_pod_hours * 3600.0 if spec.diurnal_pod_hours else None
        capped = [pod if cap is None or pod.duration <= cap else
                  SimPod(pod.name, pod.create, cap, pod.gpus, pod.gpu_milli, pod.cpu_milli,
                         pod.memory_mib) for pod in window_pods]
        # Keep the Kubernetes load of the traces scenario (GPU-hours), change its shape.
        factor = gpu_seconds(pods) / max(gpu_seconds(capped), 1.0)
        replicas = scale_pods(capped, factor, horizon, rng)
        runs = (f", runs capped at {spec.diurnal_pod_hours:g} h" if cap else "") + \
            f", {factor:.1f} replicas to keep the GPU-hours of x{spec.pods_scale:g}"
        if "diurnal" in spec.scenario:
            pods = diurnal_retime(replicas, horizon)
            notes.append(f"SYNTHETIC: pods re-timed to a daily curve (arrival rate's trough "
                         f"{DIURNAL_TROUGH:.0%} of its peak, peak at "
                         f"{DIURNAL_PEAK_HOUR:g}:00)" + runs)
        else:
            # The same pods as `diurnal` (same replicas, same seed), re-timed to bursts
            # drawn after them from the same generator.
            grid, step, bursts = burst_rate(horizon, rng)
            pods = _retime(replicas, horizon, grid, step, None)
            notes.append(f"SYNTHETIC: pods re-timed to {len(bursts)} bursts at random times "
                         f"({BURST_HOURS[0]:g}-{BURST_HOURS[1]:g} h each, rate between "
                         f"bursts {BURST_BASE:.0%} of a burst's)" + runs)
    depth = 0
    if "backlog" in spec.scenario:
        depth = max(spec.backlog_depth, 1)
        notes.append(f"SYNTHETIC: batch queue kept at >= {depth} waiting jobs by resubmitting "
                     "the window's jobs in order; batch waits measure queue depth, not service")
    return Workload(spec.scenario, horizon, tuple(jobs), tuple(pods), depth,
                    spec.scenario != "traces", tuple(notes))
