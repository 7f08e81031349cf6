"""`sunkd simulate --plot`: the sampled time series (bounded) and the PNG it draws."""

from __future__ import annotations

import builtins
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from sunkd.cli.main import main
from sunkd.domain.events import OwnershipSpec
from sunkd.simulate.arms import SimConfig, run_sunkd
from sunkd.simulate.series import Series
from sunkd.simulate.workload import BatchJob, SimPod, Workload

HOUR = 3600.0
PNG = b"\x89PNG\r\n\x1a\n"


def test_the_series_keeps_at_most_max_points_and_doubles_its_step() -> None:
    series = Series(step=10.0, max_points=64)
    t = 0.0
    while t < 100_000.0:  # 10,000 steps' worth of samples offered
        if series.due(t):
            series.add(t, 1, 2, 0, 3, 4, 5, 6)
        t += 1.0
    assert len(series) < 64
    assert series.step >= 10.0 * 2 ** 7  # halved seven times
    times = series.column("t")
    assert times == sorted(times) and times[-1] >= 100_000.0 - 2 * series.step
    gaps = {round(b - a) for a, b in itertools.pairwise(times)}
    assert max(gaps) <= series.step


def small_workload(hours: float = 12.0) -> Workload:
    jobs = tuple(BatchJob(i, i * 1800.0, 3600.0, 3, 3600.0) for i in range(12))
    pods = tuple(SimPod(f"p{i}", 4 * HOUR + i * 120.0, 2 * HOUR, 8, 1000, 1000, 1024)
                 for i in range(10))
    return Workload("t", hours * HOUR, jobs, pods, 0, True, ())


def test_a_run_records_owners_and_queues_in_bounded_samples() -> None:

    workload = small_workload()
    report = run_sunkd(workload, 8, 2, OwnershipSpec(dwell_seconds=0), SimConfig())
    series = report.series
    assert series is not None
    # every 10 simulated minutes over the window (and the batch drain after it)
    assert workload.horizon / 600 <= len(series) <= series.max_points
    totals = {s + k + x for s, k, x in zip(series.column("slurm"), series.column("kubernetes"),
                                           series.column("transit"), strict=True)}
    assert totals == {8}
    # The pods' burst made sunkd lend nodes: Kubernetes owned more than its start share.
    assert max(series.column("kubernetes")) > 2 and report.lends > 0
    assert max(series.column("pending_pods")) > 0
    assert series.column("moves")[-1] <= report.moves
    assert "series" not in report.to_json()  # figures stay small; the series is for --plot


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.png"
    code = main(["simulate", "--no-progress", "--window-days", "1", "--pods-scale", "2",
                 "--sweep", "dwell=0,600", "--plot", str(out), "--json", str(tmp_path / "r.json")])
    capsys.readouterr()
    assert code == 0
    data = out.read_bytes()
    assert data.startswith(PNG)
    assert 20_000 < len(data) < 200_000  # four panels drawn, small enough for the docs
    assert json.loads((tmp_path / "r.json").read_text())["sweep"]


def test_plot_without_matplotlib_names_the_extra(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "run.png"
    code = main(["simulate", "--no-progress", "--window-days", "1", "--plot", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "sunkd[plot]" in err and "matplotlib" in err
    assert not out.exists()


def test_a_queue_that_builds_and_drains_between_samples_still_shows() -> None:

    # Two nodes: a 2-node job holds them for 2 min; three 1-node jobs queue behind it and
    # are all gone within 4 minutes, well inside one 10-minute sample interval.
    jobs = (BatchJob(1, 60.0, 120.0, 2, 120.0),
            *(BatchJob(i, 90.0, 60.0, 1, 60.0) for i in (2, 3, 4)))
    report = run_sunkd(Workload("t", 3 * HOUR, jobs, (), 0, True, ()), 2, 0,
                       OwnershipSpec(), SimConfig())
    series = report.series
    assert series is not None
    assert max(series.column("pending_jobs")) == 3
    assert series.column("pending_jobs")[-1] == 0


def test_size_search_and_sweep_add_their_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sunkd.cli.simulate_plot import plot
    from sunkd.simulate.arms import run_ideal, run_separate
    from sunkd.simulate.search import SizeSearch, Split

    workload = small_workload(4.0)
    config = SimConfig()
    arms = {"separate": run_separate(workload, 6, 2, config),
            "sunkd": run_sunkd(workload, 8, 2, OwnershipSpec(), config),
            "ideal": run_ideal(workload, 8, "Slurm", config)}
    sizes = SizeSearch(8, Split(6, 2), 7, 7, 16,
                       (("sunkd", 8, 3, 3), ("sunkd", 6, 1, 3), ("sunkd", 7, 3, 3),
                        ("ideal", 8, 3, 3), ("ideal", 7, 3, 3)))
    sweep = [("dwell=0", arms["sunkd"]), ("dwell=600", arms["sunkd"])]

    def height(path: Path) -> int:
        data = path.read_bytes()
        assert data.startswith(PNG)
        return int.from_bytes(data[20:24], "big")  # IHDR: width, then height

    plain, full = tmp_path / "plain.png", tmp_path / "full.png"
    plot(plain, "plain", workload.horizon, arms, Split(6, 2))
    plot(full, "full", workload.horizon, arms, Split(6, 2), sizes, sweep)
    assert height(full) == round(height(plain) * 5 / 3)  # 2.4 inches per panel
