"""`sunkd simulate --plot FILE.png`: the run's time series and trade-offs as one PNG.

Why a separate module: matplotlib is an optional dependency (the `plot` extra); the
daemon and the rest of the CLI never import it, and without it `--plot` fails before the
simulation starts with a message naming the extra. Panels (docs/evaluation.md shows
them): nodes per owner over time in sunkd's pool (with the separate split and what the
ideal pool gave Kubernetes), pending batch jobs and pending pods per arm, and, when
asked for, the size search's targets met against the pool size and the knob sweep's
moves per day against the worst batch wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXTRA_HINT = ("--plot needs matplotlib, an optional dependency: "
              "pip install 'sunkd[plot]' (or pip install matplotlib)")


class PlotUnavailable(RuntimeError):
    pass


def require() -> Any:
    """The pyplot module on the non-interactive Agg backend, or PlotUnavailable."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(EXTRA_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


ARM_STYLE = {"separate": ("tab:gray", "--"), "sunkd": ("tab:blue", "-"),
             "ideal": ("tab:green", ":")}


def _days(series: Any, horizon: float) -> tuple[list[float], int]:
    times = series.column("t")
    end = sum(1 for t in times if t <= horizon)
    return [t / 86400 for t in times[:end]], end


def plot(path: Path, title: str, horizon: float, arms: dict[str, Any], split: Any,
         sizes: Any = None, sweep: Sequence[tuple[Any, Any]] = (), dpi: int = 80) -> None:
    """Write the PNG. `arms`: arm name -> ArmReport (with its `series`)."""
    plt = require()
    panels = 3 + (1 if sizes is not None and sizes.trials else 0) + (1 if sweep else 0)
    figure, axes = plt.subplots(panels, 1, figsize=(10, 2.4 * panels), dpi=dpi,
                                squeeze=False)
    axes = [row[0] for row in axes]
    figure.suptitle(title, fontsize=10)
    owners = axes[0]
    sunkd = arms["sunkd"].series
    if sunkd is not None and len(sunkd):
        days, end = _days(sunkd, horizon)
        for column, label, color in (("slurm", "sunkd: Slurm-owned", "tab:orange"),
                                     ("kubernetes", "sunkd: Kubernetes-owned", "tab:blue"),
                                     ("transit", "sunkd: in transit", "tab:red")):
            owners.step(days, sunkd.column(column)[:end], where="post", color=color,
                        linewidth=1.0, label=label)
    owners.axhline(split.k8s, color="black", linestyle="--", linewidth=0.8,
                   label=f"separate: {split.k8s} Kubernetes nodes")
    ideal = arms["ideal"].series
    if ideal is not None and len(ideal):
        days, end = _days(ideal, horizon)
        owners.step(days, ideal.column("kubernetes")[:end], where="post", color="tab:green",
                    linestyle=":", linewidth=1.0, label="ideal: nodes running pods")
    owners.set_ylabel("nodes")
    owners.set_title(f"who owns the {arms['sunkd'].nodes} nodes", fontsize=9)
    for axis, column, label in ((axes[1], "pending_jobs", "pending batch jobs"),
                                (axes[2], "pending_pods", "pending pods")):
        for name, report in arms.items():
            series = report.series
            if series is None or not len(series):
                continue
            days, end = _days(series, horizon)
            color, style = ARM_STYLE.get(name, ("black", "-"))
            axis.step(days, series.column(column)[:end], where="post", color=color,
                      linestyle=style, linewidth=0.9, label=name)
        axis.set_ylabel(label)
    axes[2].set_xlabel("simulated day")
    for axis in axes[:3]:
        axis.set_xlim(0, horizon / 86400)
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    index = 3
    if sizes is not None and sizes.trials:
        axis = axes[index]
        index += 1
        for arm in ("sunkd", "ideal"):
            points = sorted((n, met / total if total else 1.0)
                            for name, n, met, total in sizes.trials if name == arm)
            if points:
                color, style = ARM_STYLE[arm]
                axis.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                          color=color, linestyle=style, label=arm)
        if sizes.separate is not None:
            axis.axvline(sizes.separate, color="tab:gray", linestyle="--",
                         label=f"separate: {sizes.separate}")
        axis.set_xlabel("pool size (nodes)")
        axis.set_ylabel("share of targets met")
        axis.set_ylim(-0.05, 1.05)
        axis.set_title("size search", fontsize=9)
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    if sweep:
        axis = axes[index]
        ranked = sorted(sweep, key=lambda item: (item[1].moves_per_day,
                                                 item[1].batch_wait_s["max"]))
        for number, (spec_label, report) in enumerate(ranked):
            met = report.meets_all
            point = (report.moves_per_day, report.batch_wait_s["max"] / 3600)
            axis.scatter(*point, marker="o" if met else "x",
                         color="tab:blue" if met else "tab:red")
            # Labels alternate above and below along x: close points stay readable.
            axis.annotate(spec_label, point, fontsize=6, textcoords="offset points",
                          xytext=(4, 4 if number % 2 == 0 else -9))
        axis.margins(x=0.15, y=0.2)
        axis.set_xlabel("node moves per day (o: every target met, x: missed)")
        axis.set_ylabel("worst batch wait (h)")
        axis.set_title("knob sweep: churn against the worst batch wait", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=dpi)
    plt.close(figure)
