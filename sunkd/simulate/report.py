"""The results for people (a table) and for scripts (one JSON object)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from sunkd.domain.events import OwnershipSpec
from sunkd.simulate.metrics import ArmReport, Targets
from sunkd.simulate.search import Comparison, SizeSearch, knob_text
from sunkd.simulate.workload import Workload

ARMS = ("separate", "sunkd", "ideal")


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _tail(values: dict[str, float]) -> str:
    return "/".join(duration(values[key]) for key in ("p50", "p95", "p99"))


def _met(report: ArmReport) -> str:
    words = []
    for name, label in (("batch_wait_p95", "batch"), ("pod_pending_p95", "pods"),
                        ("max_wait", "cap")):
        if name in report.meets and report.meets[name] is not None:
            words.append(f"{label}{'+' if report.meets[name] else '-'}")
    return ("yes " if report.meets_all else "NO ") + " ".join(words)


def _rows(reports: Sequence[ArmReport]) -> list[tuple[str, list[str]]]:
    return [
        ("batch wait p50/p95/p99", [_tail(r.batch_wait_s) for r in reports]),
        ("batch wait max", [duration(r.batch_wait_s["max"]) for r in reports]),
        ("jobs never started", [str(r.never_started) for r in reports]),
        ("jobs over the wait cap", [str(r.waited_over_max) if "max_wait" in r.meets else "-"
                                    for r in reports]),
        ("batch node-hours done", [f"{r.batch_node_hours:.0f}" for r in reports]),
        ("pod pending p50/p95/p99", [_tail(r.pod_pending_s) for r in reports]),
        ("pod pending max", [duration(r.pod_pending_s["max"]) for r in reports]),
        ("pods never placed", [str(r.never_placed) for r in reports]),
        ("pod evictions", [str(r.evictions) for r in reports]),
        ("utilization (nodes)", [f"{r.utilization:.3f}" for r in reports]),
        ("utilization (GPUs)", [f"{r.gpu_utilization:.3f}" for r in reports]),
        ("moves per day", [f"{r.moves_per_day:.1f}" for r in reports]),
        ("aborted moves", [str(r.aborted) for r in reports]),
        ("node-hours in transit", [f"{r.transit_node_hours:.1f}" for r in reports]),
        ("targets met", [_met(r) for r in reports]),
    ]


def _table(header: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    widths = [max(len(header[0]), *(len(label) for label, _ in rows))]
    for column in range(1, len(header)):
        widths.append(max(len(header[column]), *(len(cells[column - 1]) for _, cells in rows)))
    lines = ["  ".join(text.ljust(widths[i]) for i, text in enumerate(header)).rstrip()]
    for label, cells in rows:
        lines.append("  ".join(text.ljust(widths[i])
                               for i, text in enumerate([label, *cells])).rstrip())
    return lines


def text(workload: Workload, comparison: Comparison, ownership: OwnershipSpec,
         targets: Targets, search: SizeSearch | None = None,
         sweep: Sequence[tuple[OwnershipSpec, ArmReport]] = ()) -> str:
    c = comparison
    lines = [f"sunkd simulate: scenario {workload.scenario}"
             f"{' (SYNTHETIC)' if workload.synthetic else ''}, {workload.horizon / 86400:g} "
             f"days, {len(workload.jobs)} batch jobs, {len(workload.pods)} pods",
             *(f"  {note}" for note in workload.notes),
             f"knobs: {knob_text(ownership)}",
             f"targets: batch wait p95 <= {duration(targets.batch_wait_p95)}, pod pending "
             f"p95 <= {duration(targets.pod_pending_p95)}"
             + (f", no batch job waits > {duration(targets.max_wait)}"
                if targets.max_wait is not None else ""), ""]
    header = ["", f"separate {c.split.slurm}+{c.split.k8s}", f"sunkd {c.nodes}",
              f"ideal {c.nodes}"]
    lines += _table(header, _rows([c.separate, c.sunkd, c.ideal]))
    efficiency = c.utilization_efficiency
    lines.append("")
    lines.append("utilization efficiency (sunkd - separate) / (ideal - separate): "
                 + ("n/a (the ideal pool gains under half a point)" if efficiency is None
                    else f"{efficiency:.2f}"))
    if search is not None:
        lines.append("")
        lines.append("nodes needed to meet every target (bisection up to "
                     f"{search.searched_up_to}):")
        split = search.separate_split
        sep = "not met" if search.separate is None or split is None else \
            f"{search.separate} ({split.slurm} Slurm + {split.k8s} Kubernetes)"
        lines.append(f"  separate {sep}")
        lines.append(f"  sunkd    {search.sunkd if search.sunkd is not None else 'not met'}")
        lines.append(f"  ideal    {search.ideal if search.ideal is not None else 'not met'}")
        saved = search.nodes_saved
        eff = search.size_efficiency
        lines.append(f"  nodes saved by sunkd: {'n/a' if saved is None else f'{saved:.1%}'}; "
                     f"size efficiency: {'n/a' if eff is None else f'{eff:.2f}'}")
    if sweep:
        lines.append("")
        lines.append(f"knob sweep (sunkd, {c.nodes} nodes):")
        rows = [(knob_text(spec), [_tail(r.batch_wait_s), duration(r.batch_wait_s["max"]),
                                   _tail(r.pod_pending_s), f"{r.utilization:.3f}",
                                   f"{r.moves_per_day:.1f}", str(r.aborted), str(r.evictions),
                                   _met(r)])
                for spec, r in sweep]
        lines += _table(["knobs", "batch p50/95/99", "batch max", "pods p50/95/99", "util",
                         "moves/d", "aborts", "evict", "targets"], rows)
    return "\n".join(lines)


def to_json(workload: Workload, comparison: Comparison, ownership: OwnershipSpec,
            targets: Targets, search: SizeSearch | None = None,
            sweep: Sequence[tuple[OwnershipSpec, ArmReport]] = (),
            wall_seconds: float = 0.0) -> dict[str, Any]:
    c = comparison
    arms = {"separate": c.separate, "sunkd": c.sunkd, "ideal": c.ideal}
    body: dict[str, Any] = {
        "scenario": workload.scenario, "synthetic": workload.synthetic,
        "workload": {"days": workload.horizon / 86400, "jobs": len(workload.jobs),
                     "pods": len(workload.pods), "notes": list(workload.notes)},
        "nodes": c.nodes, "split": {"slurm": c.split.slurm, "kubernetes": c.split.k8s},
        "knobs": asdict(ownership), "targets": asdict(targets),
        "utilization": {name: arm.utilization for name, arm in arms.items()},
        "utilization_efficiency": c.utilization_efficiency,
        "slurm_wait_p95_s": {name: arm.batch_wait_s["p95"] for name, arm in arms.items()},
        "slurm_max_wait_s": {name: arm.batch_wait_s["max"] for name, arm in arms.items()},
        "jobs_starved": {name: arm.waited_over_max for name, arm in arms.items()},
        "jobs_never_started": {name: arm.never_started for name, arm in arms.items()},
        "pod_pending_p95_s": {name: arm.pod_pending_s["p95"] for name, arm in arms.items()},
        "moves_per_day": {name: arm.moves_per_day for name, arm in arms.items()},
        "aborted": c.sunkd.aborted,
        "meets": {name: arm.meets_all for name, arm in arms.items()},
        "simulated_days": c.sunkd.simulated_days,
        "wall_seconds": round(wall_seconds, 2),
        "arms": {name: arm.to_json() for name, arm in arms.items()},
    }
    if search is not None:
        body["size"] = {"separate": search.separate, "sunkd": search.sunkd,
                        "ideal": search.ideal}
        body["nodes_saved"] = search.nodes_saved
        body["size_efficiency"] = search.size_efficiency
        body["size_search"] = search.to_json()
    if sweep:
        body["sweep"] = [{"knobs": asdict(spec), "label": knob_text(spec),
                          "report": report.to_json()} for spec, report in sweep]
    return body
