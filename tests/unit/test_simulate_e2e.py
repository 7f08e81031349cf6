"""`sunkd simulate` end to end on a slice of the shipped traces (seconds, not minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sunkd.cli.main import main


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_day_of_the_shipped_traces_three_arms_and_the_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate(capsys, "--window-days", "1", "--pods-scale", "3",
                            "--check", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["scenario"] == "traces" and body["synthetic"] is False
    for key in ("utilization", "slurm_wait_p95_s", "slurm_max_wait_s", "jobs_starved",
                "pod_pending_p95_s", "moves_per_day"):
        assert set(body[key]) == {"separate", "sunkd", "ideal"}, key
    assert body["nodes"] == body["split"]["slurm"] + body["split"]["kubernetes"]
    assert body["split"]["slurm"] >= 128  # the NASA log has 128-node jobs
    sunkd = body["arms"]["sunkd"]
    assert sunkd["violations"] == 0 and sunkd["decide_calls"] > 0
    # Separate clusters are the minimal split meeting the targets: they meet them.
    assert body["meets"]["separate"] is True
    # Every arm ran the same work.
    assert len({arm["jobs"] for arm in body["arms"].values()}) == 1
    assert len({arm["pods"] for arm in body["arms"].values()}) == 1


def test_table_sweep_and_size_search_on_a_synthetic_scenario(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "r.json"
    code, out, _ = simulate(
        capsys, "--scenario", "diurnal+backlog", "--window-days", "0.5", "--pods-scale", "2",
        "--backlog-depth", "4", "--sweep", "dwell=0,600", "--knobs", "maxInFlight=2",
        "--size-search", "--json", str(out_file))
    assert code == 0
    assert "scenario diurnal+backlog (SYNTHETIC)" in out
    assert "knob sweep" in out and "dwell=600" in out
    assert "nodes needed to meet every target" in out
    body = json.loads(out_file.read_text())
    assert body["knobs"]["max_in_flight"] == 2
    assert len(body["sweep"]) == 2
    assert set(body["size"]) == {"separate", "sunkd", "ideal"}
    # Backlog: the batch targets do not apply (the queue is kept full on purpose).
    assert body["arms"]["sunkd"]["meets"]["batch_wait_p95"] is None


def test_usage_errors_exit_2_with_a_sentence(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    code, _, err = simulate(capsys, "--knobs", "dwel=3")
    assert code == 2 and "unknown knob 'dwel=3'" in err
    code, _, err = simulate(capsys, "--knobs", "prefer=Nobody")
    assert code == 2 and "prefer: one of Slurm, Kubernetes" in err
    bad = tmp_path / "bad.swf"
    bad.write_text("1 2 3\n")
    code, _, err = simulate(capsys, "--slurm-trace", str(bad))
    assert code == 2 and f"{bad}:1: expected 18" in err
    code, _, err = simulate(capsys, "--sweep", "maxInFlight")
    assert code == 2 and "--sweep" in err


def test_progress_bar_draws_on_a_terminal_only() -> None:
    import io

    from sunkd.cli.simulate import ProgressBar

    stream = io.StringIO()
    update = ProgressBar(stream, 86400.0 * 10, enabled=True)("sunkd 179")
    assert update is not None
    update(86400.0 * 5)
    assert "sunkd 179" in stream.getvalue() and "#" * 15 in stream.getvalue()
    assert "day   5.0" in stream.getvalue()
    assert ProgressBar(io.StringIO(), 1.0, enabled=False)("x") is None
