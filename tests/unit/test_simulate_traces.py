"""Trace loaders and workload construction: good files, malformed lines, the shipped copies."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from sunkd.simulate.traces import (
    DEFAULT_OPENB,
    DEFAULT_SWF,
    TraceError,
    load_openb,
    load_swf,
    shipped,
)
from sunkd.simulate.workload import DAY, WorkloadSpec, build_workload, diurnal_retime

SWF_HEADER = "; Version: 2.2\n; MaxNodes: 4\n; MaxProcs: 8\n"
OPENB_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                "creation_time,deletion_time,scheduled_time\n")


def swf_line(job: int, submit: int, run: int, procs: int, requested: int = -1) -> str:
    fields = [job, submit, -1, run, procs, -1, -1, procs, requested, -1, 1, 1, 1, -1, 1, -1,
              -1, -1]
    return " ".join(str(f) for f in fields) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_swf_jobs_nodes_from_the_header_and_requested_times(tmp_path: Path) -> None:
    path = write(tmp_path, "a.swf", SWF_HEADER + swf_line(2, 100, 50, 3, 60)
                 + "\n; a comment\n" + swf_line(1, 0, 10, 8) + swf_line(3, 5, -1, 2))
    trace = load_swf(path)
    assert [(j.job_id, j.submit, j.runtime, j.nodes, j.requested_time) for j in trace.jobs] == [
        (1, 0.0, 10.0, 4, None), (2, 100.0, 50.0, 2, 60.0)]  # 2 procs per node, sorted
    assert trace.max_nodes == 4
    assert any("1 jobs without a run time" in note for note in trace.notes)
    assert load_swf(path, procs_per_node=1).jobs[0].nodes == 8


def test_swf_gzip_reads_the_same(tmp_path: Path) -> None:
    text = SWF_HEADER + swf_line(1, 0, 10, 8)
    plain = load_swf(write(tmp_path, "a.swf", text))
    packed = tmp_path / "a.swf.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert load_swf(packed).jobs == plain.jobs


@pytest.mark.parametrize(("line", "message"), [
    ("1 2 3\n", "a.swf:4: expected 18 whitespace-separated fields (SWF), got 3"),
    (swf_line(1, 0, 10, 8).replace(" 10 ", " ten ", 1), "a.swf:4: field 4 is not a number"),
    (swf_line(1, -5, 10, 8), "a.swf:4: field 2 (submit time) is negative"),
    (swf_line(1, 0, 10, 8).replace(" 10 ", " nan ", 1), "a.swf:4: field 4 is not finite"),
])
def test_swf_malformed_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "a.swf", SWF_HEADER + line)
    with pytest.raises(TraceError) as caught:
        load_swf(path)
    assert message in str(caught.value)


def test_swf_without_jobs_or_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no job"):
        load_swf(write(tmp_path, "a.swf", SWF_HEADER))
    with pytest.raises(TraceError, match="cannot open"):
        load_swf(tmp_path / "missing.swf")
    with pytest.raises(TraceError, match="header MaxNodes is not an integer"):
        load_swf(write(tmp_path, "b.swf", "; MaxNodes: many\n" + swf_line(1, 0, 1, 1)))
    bad = tmp_path / "c.swf.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read"):
        load_swf(bad)


def test_openb_keeps_gpu_pods_that_ran(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", OPENB_HEADER
                 + "p1,12000,16384,1,460,,LS,Running,100,500,120\n"
                 + "p0,6000,1024,2,1000,,BE,Failed,0,50,0\n"
                 + "cpu,1000,1024,0,0,,BE,Running,0,50,0\n"
                 + "never,1000,1024,1,1000,,BE,Pending,10,50,\n")
    trace = load_openb(path)
    assert [(p.name, p.create, p.start, p.end, p.gpus, p.gpu_milli) for p in trace.pods] == [
        ("p0", 0.0, 0.0, 50.0, 2, 1000), ("p1", 100.0, 120.0, 500.0, 1, 460)]
    assert "1 CPU-only pods skipped" in trace.notes
    assert "1 pods never scheduled in production skipped" in trace.notes


@pytest.mark.parametrize(("body", "message"), [
    ("p1,12000,16384,1\n", "p.csv:2: expected 11 fields, got 4"),
    ("p1,lots,16384,1,460,,LS,Running,100,500,120\n", "p.csv:2: cpu_milli is not a number"),
    ("p1,1,16384,1,460,,LS,Running,1.5,500,120\n", "p.csv:2: creation_time must be a whole"),
    ("p1,1,16384,1,0,,LS,Running,100,500,120\n", "p.csv:2: gpu_milli must be 1-1000"),
    ("p1,1,16384,1,500,,LS,Running,100,90,100\n", "p.csv:2: deletion_time 90 is not after"),
])
def test_openb_malformed_rows_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        load_openb(write(tmp_path, "p.csv", OPENB_HEADER + body))
    assert message in str(caught.value)


def test_openb_header_must_have_the_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"missing column.*num_gpu"):
        load_openb(write(tmp_path, "p.csv", "name,cpu_milli,memory_mib\n"))
    with pytest.raises(TraceError, match="empty file"):
        load_openb(write(tmp_path, "e.csv", ""))


def test_shipped_traces_are_the_published_files() -> None:
    """The copies in sunkd/simulate/traces/ are byte-for-byte the ones traces/README.md
    cites (sha256 there), and load to the counts docs/evaluation.md quotes."""
    readme = shipped("README.md").read_text()
    for name in (DEFAULT_SWF, DEFAULT_OPENB):
        digest = hashlib.sha256(shipped(name).read_bytes()).hexdigest()
        assert digest in readme, name
    assert len(load_swf(shipped(DEFAULT_SWF)).jobs) == 18066
    assert len(load_openb(shipped(DEFAULT_OPENB)).pods) == 6203


def test_window_and_scaling_keep_the_load(tmp_path: Path) -> None:
    swf = load_swf(write(tmp_path, "a.swf", SWF_HEADER + swf_line(1, 0, 100, 2)
                         + swf_line(2, DAY * 2, 100, 2)))
    openb = load_openb(write(tmp_path, "p.csv", OPENB_HEADER
                             + "long,1,1,1,1000,,LS,Running,0,864000,0\n"
                             + "late,1,1,1,1000,,LS,Running,90000,90600,90000\n"))
    one = build_workload(WorkloadSpec(days=1.5, pods_start_day=0.5, pods_scale=1), swf, openb)
    assert [job.job_id for job in one.jobs] == [1]  # job 2 is after the window
    # The long pod runs when the window opens: present at 0 for the rest of the window.
    assert [(p.name, p.create, p.duration) for p in one.pods] == [
        ("long", 0.0, 1.5 * DAY), ("late", 90000 - DAY / 2, 600.0)]
    three = build_workload(WorkloadSpec(days=1.5, pods_start_day=0.5, pods_scale=3, seed=4),
                           swf, openb)
    pod_seconds = sum(p.duration for p in three.pods)
    assert pod_seconds == pytest.approx(3 * sum(p.duration for p in one.pods))
    again = build_workload(WorkloadSpec(days=1.5, pods_start_day=0.5, pods_scale=3, seed=4),
                           swf, openb)
    assert again == three  # seeded


def test_diurnal_retiming_follows_the_curve() -> None:
    from sunkd.simulate.workload import SimPod

    pods = [SimPod(f"p{i}", float(i * 60 + 1), 60.0, 1, 1000, 1, 1) for i in range(1440 * 4)]
    timed = diurnal_retime(pods, 4 * DAY)
    by_hour = [0] * 24
    for pod in timed:
        by_hour[int(pod.create % DAY // 3600)] += 1
    assert max(by_hour) / min(by_hour) == pytest.approx(1 / 0.4, rel=0.1)
    assert by_hour.index(max(by_hour)) in (13, 14)
    assert len(timed) == len(pods)


def test_random_bursts_come_at_random_times_with_the_diurnal_load() -> None:
    """The scenario the forecast cannot predict: the diurnal scenario's pods (same pods,
    same GPU-hours), re-timed into bursts at random times (seeded). The busiest hours
    move from day to day (no daily profile to learn), arrivals bunch (a burst hour has
    several times a quiet hour's), and `random-bursts+backlog` adds the batch backlog."""
    from sunkd.simulate import workload as wl

    assert "random-bursts" in wl.SCENARIOS and "random-bursts+backlog" in wl.SCENARIOS
    swf = load_swf(shipped(DEFAULT_SWF))
    openb = load_openb(shipped(DEFAULT_OPENB))
    diurnal = build_workload(WorkloadSpec(scenario="diurnal", days=4), swf, openb)
    bursts = build_workload(WorkloadSpec(scenario="random-bursts", days=4), swf, openb)
    assert sorted(p.name for p in bursts.pods) == sorted(p.name for p in diurnal.pods)
    assert wl.gpu_seconds(list(bursts.pods)) == pytest.approx(
        wl.gpu_seconds(list(diurnal.pods)), rel=1e-6)
    assert bursts.synthetic and bursts.backlog_depth == 0
    assert any("random" in note for note in bursts.notes)
    hours = [[0] * 24 for _ in range(4)]
    for pod in bursts.pods:
        hours[int(pod.create // DAY)][int(pod.create % DAY // 3600)] += 1
    busiest = {day.index(max(day)) for day in hours}
    assert len(busiest) >= 3  # not the same hour every day
    flat = [n for day in hours for n in day]
    assert max(flat) >= 4 * max(min(flat), 1)
    again = build_workload(WorkloadSpec(scenario="random-bursts", days=4), swf, openb)
    other = build_workload(WorkloadSpec(scenario="random-bursts", days=4, seed=2), swf, openb)
    assert again == bursts and other.pods != bursts.pods
    backlog = build_workload(WorkloadSpec(scenario="random-bursts+backlog", days=4), swf,
                             openb)
    assert backlog.pods == bursts.pods and backlog.backlog_depth > 0
