"""`sunkd simulate`: separate clusters vs sunkd's pool vs an ideal pool, on workload traces.

Imports nothing heavy at module level: `main.build_parser` calls `add_arguments`, and the
simulator itself is imported only when the command runs. docs/evaluation.md explains the
model and the figures (docs/evaluation.md); `--plot` lives in `simulate_plot` (optional
matplotlib), `--from-log` in `simulate_shadow`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

# Nodeset-style knob names (spec.ownership) -> OwnershipSpec fields, plus short forms.
KNOBS = {
    "mode": "mode", "prefer": "prefer",
    "dwell": "dwell_seconds", "dwellSeconds": "dwell_seconds",
    "maxInFlight": "max_in_flight", "minSlurm": "min_slurm",
    "minKubernetes": "min_kubernetes", "maxKubernetes": "max_kubernetes",
    "drainTimeout": "drain_timeout_seconds", "drainTimeoutSeconds": "drain_timeout_seconds",
    "reclaimGrace": "reclaim_grace_seconds", "reclaimGraceSeconds": "reclaim_grace_seconds",
    "forecast": "forecast",
    "forecastHorizon": "forecast_horizon_seconds",
    "forecastHorizonSeconds": "forecast_horizon_seconds",
    "headroomQuantile": "headroom_quantile",
    "forecastBlockHours": "forecast_block_hours",
}
_FLOATS = {"dwell_seconds", "drain_timeout_seconds", "reclaim_grace_seconds",
           "forecast_horizon_seconds", "headroom_quantile", "forecast_block_hours"}
_CHOICES = {"mode": ("Auto", "Slurm", "Kubernetes"), "prefer": ("Slurm", "Kubernetes")}
_SWITCHES = {"forecast"}


class UsageError(ValueError):
    pass


def add_arguments(sub: argparse.ArgumentParser) -> None:
    traces = sub.add_argument_group("workload")
    traces.add_argument("--slurm-trace", type=Path, metavar="FILE.swf[.gz]",
                        help="batch jobs, Standard Workload Format (default: the shipped "
                             "NASA iPSC/860 log)")
    traces.add_argument("--k8s-trace", "--pods-trace", dest="k8s_trace", type=Path,
                        metavar="FILE.csv", help="pods, Alibaba OpenB pod list (default: "
                        "the shipped openb_pod_list_default.csv)")
    traces.add_argument("--scenario", default="traces",
                        choices=["traces", "diurnal", "backlog", "diurnal+backlog",
                                 "random-bursts", "random-bursts+backlog"],
                        help="traces as given, or a labelled synthetic variant")
    traces.add_argument("--window-days", type=float, default=40.0)
    traces.add_argument("--slurm-start-day", type=float, default=0.0)
    traces.add_argument("--pods-start-day", type=float,
                        help="default: the window ends at the pod trace's last creation")
    traces.add_argument("--slurm-scale", type=float, default=1.0,
                        help="replicate batch jobs K times, time-shifted (default 1)")
    traces.add_argument("--pods-scale", type=float, default=10.0,
                        help="replicate pods K times, time-shifted (default 10)")
    traces.add_argument("--backlog-depth", type=int, default=16,
                        help="backlog scenarios: batch jobs kept waiting (default 16)")
    traces.add_argument("--diurnal-pod-hours", type=float, default=4.0,
                        help="diurnal scenarios: re-timed pods run at most this long "
                             "(0: as in the trace; default 4)")
    traces.add_argument("--procs-per-node", type=int,
                        help="SWF processors per node (default: header MaxProcs/MaxNodes)")
    traces.add_argument("--seed", type=int, default=1)
    pool = sub.add_argument_group("pool")
    pool.add_argument("--nodes", type=int, help="pool size (default: what separate clusters "
                      "need to meet the targets)")
    pool.add_argument("--split", metavar="SLURM,K8S",
                      help="separate clusters' sizes (default: the smallest meeting the "
                           "targets, scaled to --nodes)")
    pool.add_argument("--gpus-per-node", type=int, default=8)
    pool.add_argument("--node-cpus", type=int, default=128)
    pool.add_argument("--node-memory-gib", type=int, default=768)
    pool.add_argument("--knobs", action="append", default=[], metavar="KEY=VALUE,...",
                      help="sunkd's knobs: prefer, dwell, maxInFlight, minSlurm, "
                           "minKubernetes, maxKubernetes, drainTimeout, reclaimGrace, mode, "
                                "forecast (on/off), forecastHorizon, headroomQuantile, "
                                "forecastBlockHours")
    pool.add_argument("--poll-interval", type=float, default=5.0, help="Slurm poll (s)")
    pool.add_argument("--move-cost", type=float, default=0.0,
                      help="extra seconds on the last step of every move")
    pool.add_argument("--pod-termination", type=float, default=30.0,
                      help="an evicted pod's graceful termination (s)")
    asks = sub.add_argument_group("questions")
    asks.add_argument("--size-search", action="store_true",
                      help="also find the smallest pool meeting the targets, per arm")
    asks.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                      help="run sunkd with every combination (repeatable), e.g. "
                           "--sweep dwell=0,300 --sweep prefer=Slurm,Kubernetes")
    asks.add_argument("--from-log", metavar="DB_URL",
                      help="shadow replay: the demand recorded in this sunkd event log "
                           "(postgresql+asyncpg://... or sqlite+aiosqlite:///...) "
                           "replayed with the log's knobs, --knobs and --sweep; no "
                           "traces are read")
    asks.add_argument("--batch-wait-p95", type=float, default=3600.0, metavar="SECONDS")
    asks.add_argument("--pod-pending-p95", type=float, default=60.0, metavar="SECONDS")
    asks.add_argument("--max-wait-hours", type=float, default=24.0,
                      help="no batch job may wait longer (0: no such target)")
    asks.add_argument("--drain-days", type=float, default=30.0,
                      help="after the window, let waiting batch jobs run this long")
    asks.add_argument("--check", action="store_true",
                      help="check sunkd's safety rules on every round (slower)")
    out = sub.add_argument_group("output")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE",
                     help="one JSON object, to FILE or (without FILE) stdout instead of "
                          "the table")
    out.add_argument("--plot", type=Path, metavar="FILE.png",
                     help="nodes per owner over time, queue lengths, size-search and sweep "
                          "curves as a PNG (needs the optional extra: sunkd[plot])")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _value(field: str, text: str) -> Any:
    if field in _SWITCHES:
        if text.lower() in ("on", "true", "1", "yes"):
            return True
        if text.lower() in ("off", "false", "0", "no"):
            return False
        raise UsageError(f"{field}: on or off, got {text!r}")
    if field == "headroom_quantile":
        try:
            quantile = float(text)
        except ValueError:
            raise UsageError(f"{field}: not a number: {text!r}") from None
        if not 0.5 <= quantile < 1:
            raise UsageError(f"{field}: must be in [0.5, 1), got {text!r}")
        return quantile
    if field in _CHOICES:
        for choice in _CHOICES[field]:
            if text.lower() == choice.lower():
                return choice
        raise UsageError(f"{field}: one of {', '.join(_CHOICES[field])}, got {text!r}")
    try:
        number = float(text) if field in _FLOATS else int(text)
    except ValueError:
        raise UsageError(f"{field}: not a number: {text!r}") from None
    if number < 0 or number != number:
        raise UsageError(f"{field}: must be >= 0, got {text!r}")
    return number


def _pairs(items: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in KNOBS:
                raise UsageError(f"unknown knob {part!r}; known: {', '.join(sorted(KNOBS))}")
            pairs.append((KNOBS[key.strip()], value.strip()))
    return pairs


def _sweep_grid(items: list[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or key.strip() not in KNOBS:
            raise UsageError(f"--sweep {item!r}: KEY=V1,V2 with KEY one of "
                             f"{', '.join(sorted(KNOBS))}")
        field = KNOBS[key.strip()]
        grid[field] = [_value(field, v.strip()) for v in values.split(",") if v.strip()]
    return grid


class ProgressBar:
    """One line on stderr per run, redrawn at most five times a second."""

    def __init__(self, stream: TextIO, total: float, enabled: bool) -> None:
        self.stream, self.total, self.enabled = stream, total, enabled
        self.last = 0.0

    def __call__(self, label: str) -> Callable[[float], None] | None:
        if not self.enabled:
            return None

        def update(t: float) -> None:
            wall = time.monotonic()
            if wall - self.last < 0.2:
                return
            self.last = wall
            done = min(t / self.total, 1.0) if self.total else 1.0
            bar = "#" * int(done * 30)
            self.stream.write(f"\r{label[:36]:<36} [{bar:<30}] day {t / 86400:5.1f}\x1b[K")
            self.stream.flush()

        return update

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def cmd_simulate(args: argparse.Namespace, settings: object) -> int:
    try:
        return _run(args)
    except UsageError as error:
        print(f"sunkd simulate: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sunkd.domain.events import OwnershipSpec
    from sunkd.simulate import report, search, traces
    from sunkd.simulate.arms import SimConfig
    from sunkd.simulate.bridge import Latencies
    from sunkd.simulate.metrics import Targets
    from sunkd.simulate.records import NodeShape
    from sunkd.simulate.search import knob_text
    from sunkd.simulate.workload import WorkloadSpec, build_workload

    started = time.perf_counter()
    knobs = {field: _value(field, text) for field, text in _pairs(args.knobs)}
    ownership = replace(OwnershipSpec(), **knobs)
    if ownership.max_in_flight < 1:
        raise UsageError("maxInFlight must be at least 1")
    grid = _sweep_grid(args.sweep)
    if args.plot is not None:
        from sunkd.cli.simulate_plot import PlotUnavailable, require

        if args.from_log:
            raise UsageError("--plot is not available with --from-log (use --json)")
        try:
            require()
        except PlotUnavailable as error:
            raise UsageError(str(error)) from None
    config = SimConfig(
        shape=NodeShape(args.gpus_per_node, args.node_cpus * 1000, args.node_memory_gib * 1024),
        latencies=Latencies(poll=args.poll_interval, move_cost=args.move_cost,
                            pod_termination=args.pod_termination),
        targets=Targets(args.batch_wait_p95, args.pod_pending_p95,
                        args.max_wait_hours * 3600 if args.max_wait_hours > 0 else None),
        drain_limit_days=args.drain_days, check=args.check)
    if args.from_log:
        return _shadow(args, knobs, grid, config, args.json == "-")
    if not args.window_days > 0 or args.pods_scale < 0 or args.slurm_scale < 0:
        raise UsageError("--window-days must be > 0 and the scales >= 0")
    try:
        swf = traces.load_swf(args.slurm_trace or traces.shipped(traces.DEFAULT_SWF),
                              args.procs_per_node)
        openb = traces.load_openb(args.k8s_trace or traces.shipped(traces.DEFAULT_OPENB))
        workload = build_workload(WorkloadSpec(
            scenario=args.scenario, days=args.window_days, slurm_start_day=args.slurm_start_day,
            pods_start_day=args.pods_start_day, slurm_scale=args.slurm_scale,
            pods_scale=args.pods_scale, backlog_depth=args.backlog_depth,
            diurnal_pod_hours=args.diurnal_pod_hours or None, seed=args.seed),
            swf, openb)
    except (traces.TraceError, ValueError) as error:
        raise UsageError(str(error)) from None
    if not workload.jobs and not workload.pods:
        raise UsageError("the window holds neither batch jobs nor pods")
    to_stdout = args.json == "-"
    bar = ProgressBar(sys.stderr, workload.horizon,
                      not args.no_progress and sys.stderr.isatty())
    minimal = None
    if args.split is None or args.size_search:
        minimal, _, _ = search.minimal_split(workload, config, bar)
    split = _split(args.split, args.nodes, minimal, workload.widest_job)
    nodes = args.nodes or split.slurm + split.k8s
    if nodes < 1:
        raise UsageError("the pool needs at least one node")
    comparison = search.compare(workload, nodes, split, ownership, config, bar)
    sizes = search.size_search(workload, ownership, config, minimal, bar) \
        if args.size_search else None
    swept = search.sweep(workload, nodes, split, search.sweep_settings(ownership, grid),
                         config, bar) if grid else []
    bar.clear()
    wall = time.perf_counter() - started
    body = report.to_json(workload, comparison, ownership, config.targets, sizes, swept, wall)
    if args.json is not None:
        text = json.dumps(body, sort_keys=True)
        if to_stdout:
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if args.plot is not None:
        from sunkd.cli.simulate_plot import plot

        title = (f"sunkd simulate --scenario {workload.scenario}"
                 f"{' (SYNTHETIC)' if workload.synthetic else ''}: "
                 f"{workload.horizon / 86400:g} days, {nodes} nodes, {knob_text(ownership)}")
        plot(args.plot, title, workload.horizon,
             {"separate": comparison.separate, "sunkd": comparison.sunkd,
              "ideal": comparison.ideal}, split, sizes,
             [(_short_label(spec, grid), result) for spec, result in swept])
    if not to_stdout:
        print(report.text(workload, comparison, ownership, config.targets, sizes, swept))
        print(f"\n({wall:.1f} s wall, {comparison.sunkd.decide_calls} decide calls in the "
              f"sunkd arm, {comparison.sunkd.violations} safety violations)")
    return 1 if comparison.sunkd.violations else 0


def _short_label(spec: Any, grid: dict[str, list[Any]]) -> str:
    """The swept knobs only, for a plot's annotations."""
    names: dict[str, str] = {}
    for key, field in KNOBS.items():
        names.setdefault(field, key)  # the short form: dwell, reclaimGrace, ...
    return " ".join(f"{names.get(field, field)}={getattr(spec, field):g}"
                    if isinstance(getattr(spec, field), float) else
                    f"{names.get(field, field)}={getattr(spec, field)}" for field in sorted(grid))


def _shadow(args: argparse.Namespace, knobs: dict[str, Any], grid: dict[str, list[Any]],
            config: Any, to_stdout: bool) -> int:
    from sunkd.cli import simulate_shadow as shadow

    started = time.perf_counter()
    try:
        pools = shadow.load(args.from_log)
    except Exception as error:  # a bad URL, no such database, a schema not at head
        # The message may quote the URL, password and all: never print it.
        detail = (str(error).replace(args.from_log, "DB_URL").splitlines() or [""])[0]
        raise UsageError(f"--from-log: cannot read the event log: "
                         f"{type(error).__name__}: {detail[:200]}") from None
    results = [(pool, shadow.replay(pool, shadow.settings_for(pool, knobs, grid), config))
               for pool in pools]
    body = shadow.to_json(results)
    body["wall_seconds"] = round(time.perf_counter() - started, 2)
    if args.json is not None:
        text = json.dumps(body, sort_keys=True)
        if to_stdout:
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if not to_stdout:
        print(shadow.text(results))
    violations = sum(report.violations for _, runs in results for _, _, report in runs)
    return 1 if violations else 0


def _split(text: str | None, nodes: int | None, minimal: Any, widest: int) -> Any:
    from sunkd.simulate.search import Split, split_for

    if text:
        try:
            slurm, k8s = (int(part) for part in text.split(","))
        except ValueError:
            raise UsageError(f"--split SLURM,K8S: two integers, got {text!r}") from None
        if slurm < 0 or k8s < 0:
            raise UsageError("--split: sizes must be >= 0")
        return Split(slurm, k8s)
    if minimal is None:
        raise UsageError("no separate split meets the targets (searched up to 4x the widest "
                         "job and 4096 Kubernetes nodes); give --split and --nodes")
    return minimal if nodes is None else split_for(nodes, minimal)
