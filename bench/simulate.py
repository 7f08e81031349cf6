"""Simulation benchmark: what sunkd's pool gives on the shipped traces, and how fast.

Why: `sunkd simulate` is how an operator sizes a pool and picks knobs before touching a
cluster; its answers must stay truthful as the policy changes, and it must stay fast
enough to run a size search or a sweep in minutes. Per scenario, with sunkd's default
knobs, on the separate clusters' minimal size (docs/evaluation.md):

- traces: the shipped NASA iPSC/860 batch log and OpenB pods x10, 40 days (--quick: 10);
- diurnal (synthetic): pods re-timed to a daily curve, 7 days (--quick: 2);
- diurnal+backlog (synthetic): the same, plus a batch queue that never empties, 7 days
  (--quick: 2); without --quick also with prefer=Kubernetes (informational).

Same-run baseline: the speed of the world model alone (the separate arm: same workload,
same event engine, no policy) against the sunkd arm, in simulated seconds per wall
second; their ratio (a figure, no target) is what sunkd's fold + decide cost the
simulation. Targets:
utilization efficiency >= 0.8 in the diurnal scenario; in every scenario
sunkd starves no more batch jobs than separate clusters and meets the pod pending p95
target wherever separate clusters do; the traces scenario in under 2 minutes (--quick:
under a minute for everything). Utilization efficiency is null when the ideal pool
gains under half a point over separate clusters (there is nothing to share: at fixed
work and no backlog every arm does the same work on the same nodes); it is then reported
as null, never invented, and the diurnal+backlog scenario's efficiency, where the pool
can do more work, is a second target. Then the pool's own targets (a pool that never
does worse than two clusters: pod p95 <= 60 s, batch +10 %, <= 50 moves a day and
utilization efficiency >= 0.8 with diurnal inference and a training backlog; <= 12
moves a day on the traces; <= 50 moves a day and <= 10 % of them aborted anywhere),
suffixed `_forecast_off` and `_forecast_on`. The forecast needs 2 days of an hour
before it predicts it: the 10- and 40-day traces and the full run's 7-day windows start
the forecast-on run cold; --quick's 2-day windows start it from the summary the
forecast-off run learned over the same 2 days (in-sample: what a warm forecast does,
not how soon it learns). Without --quick also the random-bursts scenarios (bursts at
random times, what no daily profile predicts), forecast off and on at their own minimal
split: the forecast may make them no worse than 2 % (pod p95, batch node-hours), and
the time series' cost to the world model (`series_overhead`), and the diurnal
nodes-needed target: the smallest pool meeting every target, sunkd's (forecast off and
on) against the ideal's (`search.size_search`, 7 days; null in --quick). Each
scenario's pair of runs, and each size search, is one job; `--workers` (default 2) run
at once, one process each. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sunkd.domain.events import OwnershipSpec
from sunkd.domain.forecast import DemandSummary
from sunkd.simulate import search, traces
from sunkd.simulate.arms import SimConfig, run_ideal, run_separate, run_sunkd
from sunkd.simulate.workload import Workload, WorkloadSpec, build_workload
from sunkd.simulate.world import World

SPLITS: search.SplitCache = {}  # separate clusters' verdicts, shared across scenarios


class Run:
    """One scenario's three arms, and what the sunkd arm's forecast learned."""

    def __init__(self, result: dict[str, Any], comparison: search.Comparison,
                 learned: dict[str, DemandSummary]) -> None:
        self.result, self.comparison, self.learned = result, comparison, learned


def shipped_workload(scenario: str, days: float) -> Workload:
    """A scenario's workload over `days`, built from the shipped traces."""
    swf = traces.load_swf(traces.shipped(traces.DEFAULT_SWF))
    openb = traces.load_openb(traces.shipped(traces.DEFAULT_OPENB))
    return build_workload(WorkloadSpec(scenario=scenario, days=days), swf, openb)


def run_arms(name: str, days: float, ownership: OwnershipSpec, config: SimConfig, *,
             reuse: search.Comparison | None = None,
             history: dict[str, DemandSummary] | None = None, label: str = "") -> Run:
    """The scenario at the separate clusters' minimal split; with `reuse` (a run of the
    same scenario and window) only the sunkd arm runs again, beside the same separate
    and ideal arms; `history`: the sunkd arm starts with that forecast."""
    workload = shipped_workload(name, days)
    started = time.perf_counter()
    learned: dict[str, DemandSummary] = {}
    if reuse is None:
        minimal, _, _ = search.minimal_split(workload, config, cache=SPLITS)
        assert minimal is not None, f"{name}: no separate split meets the targets"
        nodes = minimal.slurm + minimal.k8s
        separate = run_separate(workload, minimal.slurm, minimal.k8s, config)
        ideal = run_ideal(workload, nodes, ownership.prefer, config)
    else:
        minimal, nodes = reuse.split, reuse.nodes
        separate, ideal = reuse.separate, reuse.ideal
    sunkd = run_sunkd(workload, nodes, minimal.k8s, ownership, config, history=history,
                      learned=learned)
    comparison = search.Comparison(nodes, minimal, separate, sunkd, ideal)
    wall = time.perf_counter() - started
    arms = {"separate": comparison.separate, "sunkd": comparison.sunkd,
            "ideal": comparison.ideal}
    simulated = workload.horizon
    result = {
        "days": days, "nodes": nodes, "split": [minimal.slurm, minimal.k8s],
        "wall_seconds": round(wall, 1),
        "utilization": {arm: r.utilization for arm, r in arms.items()},
        "utilization_efficiency": comparison.utilization_efficiency,
        "batch_wait_p95_s": {arm: r.batch_wait_s["p95"] for arm, r in arms.items()},
        "batch_wait_max_s": {arm: r.batch_wait_s["max"] for arm, r in arms.items()},
        "jobs_starved": {arm: r.waited_over_max for arm, r in arms.items()},
        "batch_node_hours": {arm: r.batch_node_hours for arm, r in arms.items()},
        "pod_pending_p95_s": {arm: r.pod_pending_s["p95"] for arm, r in arms.items()},
        "pods_never_placed": {arm: r.never_placed for arm, r in arms.items()},
        "meets": {arm: r.meets_all for arm, r in arms.items()},
        "pod_target_met": {arm: r.meets["pod_pending_p95"] for arm, r in arms.items()},
        "moves_per_day": comparison.sunkd.moves_per_day,
        "aborted": comparison.sunkd.aborted,
        "evictions": comparison.sunkd.evictions,
        "decide_calls": comparison.sunkd.decide_calls,
        "violations": comparison.sunkd.violations,
        "sunkd_sim_seconds_per_wall_second": round(
            simulated / max(comparison.sunkd.wall_seconds, 1e-9)),
        "world_sim_seconds_per_wall_second": round(
            simulated / max(comparison.separate.wall_seconds, 1e-9)),
    }
    result["sunkd_speed_vs_world"] = round(
        result["sunkd_sim_seconds_per_wall_second"]
        / max(result["world_sim_seconds_per_wall_second"], 1), 3)
    print(f"{name}{label}: {json.dumps(result, sort_keys=True)}", file=sys.stderr)
    return Run(result, comparison, learned)


def series_overhead(days: float, repeats: int = 3) -> dict[str, Any]:
    """What recording the time series (--plot) costs the world model: the separate arm
    of the traces scenario with and without it, best of `repeats` each, interleaved."""
    workload = shipped_workload("traces", days)
    best = {"with": float("inf"), "without": float("inf")}
    samples = 0
    for _ in range(repeats):
        for label in ("without", "with"):
            world = World(workload, 179, 51)
            if label == "without":
                world.series = None
            started = time.perf_counter()
            world.run()
            best[label] = min(best[label], time.perf_counter() - started)
            if world.series is not None:
                samples = len(world.series)
    return {"days": days, "with_s": round(best["with"], 3),
            "without_s": round(best["without"], 3), "samples": samples,
            "ratio": round(best["with"] / max(best["without"], 1e-9), 3)}


def _target(value: Any, target: float, better: str) -> dict[str, Any]:
    return {"value": value, "target": target, "better": better}


def issue_targets(runs: dict[str, dict[str, Any]], arm: str,
                  needed: dict[str, Any] | None) -> dict[str, Any]:
    """The pool's targets (a pool that never does worse than two clusters), for one
    setting of the forecast; a scenario not run is null, and so is diurnal's nodes needed
    beyond the ideal pool's when its size search did not run (--quick) or a search found
    no size. Not measured here: the 40-day 320-node speed run (evaluation.md)."""
    excess = None
    if needed is not None and needed["sunkd"] is not None and needed["ideal"] is not None:
        excess = needed["sunkd"] - needed["ideal"]
    backlog = runs["diurnal+backlog"]
    gain = backlog["batch_node_hours"]["sunkd"] / max(
        backlog["batch_node_hours"]["separate"], 1e-9) - 1
    moves = {name: run["moves_per_day"] for name, run in runs.items()}
    aborted_share = max(run["aborted"] / max(run["moves_per_day"] * run["days"], 1)
                        for run in runs.values())
    return {
        f"diurnal+backlog_pod_p95_s_{arm}": _target(
            backlog["pod_pending_p95_s"]["sunkd"], 60, "lower"),
        f"diurnal+backlog_batch_gain_{arm}": _target(round(gain, 3), 0.10, "higher"),
        f"diurnal+backlog_moves_per_day_{arm}": _target(moves["diurnal+backlog"], 50, "lower"),
        f"diurnal+backlog_utilization_efficiency_{arm}": _target(
            backlog["utilization_efficiency"], 0.8, "higher"),
        f"traces_moves_per_day_{arm}": _target(moves.get("traces"), 12, "lower"),
        f"max_moves_per_day_{arm}": _target(max(moves.values()), 50, "lower"),
        f"aborted_share_of_moves_{arm}": _target(round(aborted_share, 3), 0.10, "lower"),
        f"diurnal_nodes_needed_vs_ideal_{arm}": _target(excess, 0, "lower"),
    }


def no_worse(off: dict[str, Any], on: dict[str, Any]) -> float:
    """How much worse the forecast made a scenario, as a share: the larger of the pod
    p95's rise (against the larger of the off run's p95 and the 60 s target, so a p95
    of 0 s is not divided by) and the batch node-hours' fall."""
    p95_off, p95_on = off["pod_pending_p95_s"]["sunkd"], on["pod_pending_p95_s"]["sunkd"]
    work_off, work_on = off["batch_node_hours"]["sunkd"], on["batch_node_hours"]["sunkd"]
    return round(max((p95_on - p95_off) / max(p95_off, 60.0),
                     (work_off - work_on) / max(work_off, 1e-9)), 4)


def scenario_pair(name: str, days: float, off_knobs: OwnershipSpec,
                  on_knobs: OwnershipSpec | None, config: SimConfig, warm: bool,
                  label: str = "") -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One scenario with `off_knobs` (the forecast off), then with `on_knobs` (on) beside
    the same separate and ideal arms (None: not run). `warm`: the second run starts from
    the summary the first one learned over the same window (in-sample: what the forecast
    does once warm, not how soon it learns); otherwise it starts cold, as a daemon's first
    day. A pair is one job of the process pool, so its two runs share one split search."""
    off = run_arms(name, days, off_knobs, config, label=label)
    if on_knobs is None:
        return off.result, None
    on = run_arms(name, days, on_knobs, config, reuse=off.comparison,
                  history=off.learned if warm else None,
                  label=label + (" forecast on (warm, in-sample)" if warm else " forecast on"))
    return off.result, on.result


def nodes_needed(name: str, days: float, knobs: OwnershipSpec,
                 config: SimConfig) -> dict[str, Any]:
    """The smallest pool meeting every target, per arm (`search.size_search`: sunkd's
    pool with `knobs`, and the ideal pool), beside the separate clusters' minimal size."""
    workload = shipped_workload(name, days)
    started = time.perf_counter()
    minimal, _, _ = search.minimal_split(workload, config, cache=SPLITS)
    found = search.size_search(workload, knobs, config, minimal)
    result = {"days": days, "separate": found.separate, "sunkd": found.sunkd,
              "ideal": found.ideal, "searched_up_to": found.searched_up_to,
              "trials": [list(trial) for trial in found.trials],
              "wall_seconds": round(time.perf_counter() - started, 1)}
    print(f"{name} nodes needed (forecast {'on' if knobs.forecast else 'off'}): "
          f"{json.dumps(result)}", file=sys.stderr)
    return result


Job = tuple[Callable[..., Any], tuple[Any, ...]]


def run_jobs(jobs: dict[str, Job], workers: int) -> dict[str, Any]:
    """Every job (a scenario's pair of runs, a size search), `workers` at a time in their
    own processes (each is single-threaded Python: on 2 cores two jobs take the time of
    the longest chain, not of their sum), longest first as listed. Each result is what
    the job would give run alone: the runs are deterministic and share nothing but the
    shipped traces."""
    if workers <= 1:
        return {key: function(*args) for key, (function, args) in jobs.items()}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(function, *args)
                   for key, (function, args) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (< 60 s)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="jobs run at once, one process each (default: "
                             "2, or 1 on one core)")
    args = parser.parse_args()
    started = time.perf_counter()
    config = SimConfig()
    defaults = OwnershipSpec()
    on = replace(defaults, forecast=True)
    short = 2.0 if args.quick else 7.0
    long = 10.0 if args.quick else 40.0
    # The forecast needs two days of an hour before it predicts it, so in a 2-day window
    # a cold start would only repeat the forecast-off run: --quick's 2-day scenarios run
    # warm (see scenario_pair); the 10-day traces and every full-run window start cold.
    jobs: dict[str, Job] = {}  # submitted in this order: the longest first
    if not args.quick:
        # Random bursts: what no daily profile predicts, the forecast off and on; the
        # diurnal nodes-needed target (two size searches, about 8 runs of each pool: too
        # long for --quick); prefer=Kubernetes (informational, the forecast off).
        for name in ("random-bursts+backlog", "random-bursts"):
            jobs[name] = (scenario_pair, (name, 7.0, defaults, on, config, False))
        for arm, knobs in (("on", on), ("off", defaults)):
            jobs[f"diurnal nodes needed {arm}"] = (
                nodes_needed, ("diurnal", 7.0, knobs, config))
        jobs["prefer=Kubernetes"] = (scenario_pair, (
            "diurnal+backlog", 7.0, replace(defaults, prefer="Kubernetes"), None, config,
            False, " prefer=Kubernetes"))
    jobs["diurnal+backlog"] = (scenario_pair, ("diurnal+backlog", short, defaults, on,
                                               config, args.quick))
    jobs["traces"] = (scenario_pair, ("traces", long, defaults, on, config, False))
    jobs["diurnal"] = (scenario_pair, ("diurnal", short, defaults, on, config, args.quick))
    pairs = run_jobs(jobs, args.workers)
    scenarios = {name: pairs[name][0] for name in ("traces", "diurnal", "diurnal+backlog")}
    forecast_on = {name: on_run for name in ("traces", "diurnal", "diurnal+backlog")
                   if (on_run := pairs[name][1]) is not None}
    serving_first = pairs["prefer=Kubernetes"][0] if "prefer=Kubernetes" in pairs else None
    bursts: dict[str, dict[str, Any]] = {}
    for name in ("random-bursts", "random-bursts+backlog"):
        if name in pairs:
            bursts[name], burst_on = pairs[name]
            assert burst_on is not None
            bursts[f"{name} forecast on"] = burst_on
    needed = {arm: pairs[f"diurnal nodes needed {arm}"] for arm in ("off", "on")
              if f"diurnal nodes needed {arm}" in pairs}
    overhead = None if args.quick else series_overhead(40.0, 3)
    total = time.perf_counter() - started
    starved_excess = max(s["jobs_starved"]["sunkd"] - s["jobs_starved"]["separate"]
                         for s in scenarios.values())
    pod_breaches = sum(1 for s in scenarios.values()
                       if s["pod_target_met"]["separate"] is not False
                       and s["pod_target_met"]["sunkd"] is False)
    figures = {"scenarios": scenarios, "diurnal+backlog prefer=Kubernetes": serving_first,
               "forecast_on": forecast_on, "random_bursts": bursts,
               "total_seconds": round(total, 1), "workers": args.workers,
               "series_overhead": overhead, "diurnal_nodes_needed": needed,
               "jobs_starved": {name: s["jobs_starved"] for name, s in scenarios.items()},
               "pod_target_met": {name: s["pod_target_met"] for name, s in scenarios.items()}}
    targets = {
        "utilization_efficiency_diurnal": {
            "value": scenarios["diurnal"]["utilization_efficiency"], "target": 0.8,
            "better": "higher"},
        "utilization_efficiency_diurnal+backlog": {
            "value": scenarios["diurnal+backlog"]["utilization_efficiency"], "target": 0.8,
            "better": "higher"},
        "jobs_starved_beyond_separate": {
            "value": starved_excess, "target": 0, "better": "lower"},
        "pod_p95_breaches_where_separate_meets": {
            "value": pod_breaches, "target": 0, "better": "lower"},
        "traces_wall_seconds": {
            "value": scenarios["traces"]["wall_seconds"], "target": 120, "better": "lower"},
    }
    targets.update(issue_targets(scenarios, "forecast_off", needed.get("off")))
    targets.update(issue_targets(forecast_on, "forecast_on", needed.get("on")))
    targets["random_bursts_forecast_on_worse_share"] = _target(
        max(no_worse(bursts[name], bursts[f"{name} forecast on"])
            for name in ("random-bursts", "random-bursts+backlog")) if bursts else None,
        0.02, "lower")
    if bursts:
        moves = [run["moves_per_day"] for run in bursts.values()]
        targets["random_bursts_max_moves_per_day"] = _target(max(moves), 50, "lower")
    if args.quick:
        targets["total_seconds"] = {"value": round(total, 1), "target": 60, "better": "lower"}
    print(json.dumps({"benchmark": "simulate", "figures": figures, "targets": targets},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
