"""Shadow replay (`sunkd simulate --from-log`): a log read through the fold, replayed.

The log here is a real one: the events sunkd's fold and policy produced while the
simulator ran a small workload (the bridge's log, captured), so the reconstruction can
be checked against the workload that made it and the recorded moves against the run's
own counts.
"""

from __future__ import annotations

from dataclasses import replace

from sunkd.domain.events import OwnershipSpec, Payload, RecordedEvent
from sunkd.simulate.arms import SimConfig, run_sunkd
from sunkd.simulate.bridge import POOL, SunkdController
from sunkd.simulate.records import NodeShape
from sunkd.simulate.series import Series
from sunkd.simulate.shadow import moves_per_day_from_series, read_log
from sunkd.simulate.workload import BatchJob, SimPod, Workload
from sunkd.simulate.world import World

HOUR = 3600.0


class Recording(SunkdController):
    """The bridge, keeping every event it appends (the log a daemon would have written)."""

    log: list[RecordedEvent]

    def _append(self, payload: Payload, subject: str, t: float) -> None:
        super()._append(payload, subject, t)
        if not hasattr(self, "log"):
            self.log = []
        self.log.append(self.new[-1])


def workload() -> Workload:
    # Batch: 3-node jobs every 40 min for 10 h; pods: a burst of whole-node pods at 3 h,
    # so sunkd lends nodes to Kubernetes and reclaims them for the queued jobs after.
    jobs = tuple(BatchJob(i + 1, i * 2400.0, 3000.0, 3, 3000.0) for i in range(15))
    pods = tuple(SimPod(f"p{i}", 3 * HOUR + i * 60.0, 2 * HOUR, 8, 1000, 8000, 4096)
                 for i in range(5))
    return Workload("t", 14 * HOUR, jobs, pods, 0, True, ())


def recorded_run(spec: OwnershipSpec) -> tuple[Recording, World]:
    world = World(workload(), 8, 2)
    controller = Recording(world, spec)
    world.run()
    return controller, world


def test_the_log_of_a_run_reconstructs_its_workload_and_its_moves() -> None:
    spec = OwnershipSpec(dwell_seconds=0)
    controller, world = recorded_run(spec)
    stats = controller.stats
    assert stats.lends > 0 and stats.reclaims > 0  # the scenario moves nodes both ways
    [pool] = read_log(controller.log)
    assert pool.pool == POOL and len(pool.nodes) == 8 and pool.k8s_at_start == 2
    assert pool.shape == NodeShape()  # from the Kubernetes allocatable in the log
    # Recorded moves: exactly what the bridge counted.
    assert (pool.recorded.lends, pool.recorded.reclaims) == (stats.lends, stats.reclaims)
    assert sum(stats.aborted.values()) == pool.recorded.aborted
    assert pool.recorded.evictions == world.evictions
    assert pool.recorded.transit_seconds > 0
    assert sorted(pool.recorded.per_day(1)) == [stats.lends + stats.reclaims]
    # Batch jobs: every job of the run, with its width and run time (observed at the
    # 5 s poll, so start and end are rounded up to it).
    jobs = pool.workload.jobs
    assert len(jobs) == len(world.jobs)
    assert {job.nodes for job in jobs} == {3}
    assert all(abs(job.runtime - 3000.0) <= 5.0 for job in jobs)
    # Submit times: the pending count's rises, matched first-in first-out: a job that
    # waited in the run was submitted before it started in the reconstruction too.
    waited = sorted(round(r.start - r.submit) for r in world.jobs.values()
                    if r.start is not None and r.start - r.submit > 10)
    rebuilt = sorted(round(job.submit) for job in jobs)
    assert waited, "the scenario makes some jobs wait"
    assert rebuilt[0] <= 5.0 and len(set(rebuilt)) == len(rebuilt)
    # Pods: every pod (replacements after evictions too), its run time, its requests
    # from its pending record, or, placed at once, the share of its node (alone there).
    pods = {pod.name.split("/")[-1]: pod for pod in pool.workload.pods}
    originals = {p.pod.name: p for p in world.pods}
    assert {name.split("-")[0] for name in pods} == set(originals)
    assert any(record.pending > 0 for record in originals.values())
    for name, record in originals.items():
        pod = pods[name]
        assert pod.gpus == 8
        if record.pending > 0:
            assert (pod.cpu_milli, pod.memory_mib) == (8000, 4096)
            assert pod.create == record.pod.create
        else:
            assert (pod.cpu_milli, pod.memory_mib) == (128_000, 786_432)
    # Run time: 2 h per pod; an evicted pod runs on through its 30 s termination.
    ran = sum(p.duration for p in pool.workload.pods)
    assert 0 <= ran - 5 * 2 * HOUR - 30 * world.evictions <= 10.0


def test_replaying_the_recorded_knobs_reproduces_the_record_and_candidates_differ() -> None:
    spec = OwnershipSpec(dwell_seconds=0)
    controller, _world = recorded_run(spec)
    [pool] = read_log(controller.log)
    config = replace(SimConfig(), shape=pool.shape)
    again = run_sunkd(pool.workload, len(pool.nodes), pool.k8s_at_start, spec, config)
    recorded = pool.recorded
    # The model replays its own log closely (observation delays shift a few seconds).
    assert abs(again.lends - recorded.lends) <= 1
    assert abs(again.reclaims - recorded.reclaims) <= 1
    assert again.violations == 0
    # A candidate that may not lend anything moves nothing: the replay reacts to knobs.
    frozen = run_sunkd(pool.workload, len(pool.nodes), pool.k8s_at_start,
                       replace(spec, max_kubernetes=pool.k8s_at_start), config)
    assert frozen.lends == 0 and frozen.moves < again.moves
    assert frozen.pod_pending_s["max"] > again.pod_pending_s["max"]
    by_day = moves_per_day_from_series(again.series, pool.workload.horizon, again.moves)
    assert sum(by_day) == again.moves


def test_moves_per_day_from_the_sampled_count() -> None:
    series = Series(step=600.0)
    for index, moves in enumerate([0, 0, 2, 3, 3, 7]):
        series.add(index * 43200.0, 0, 0, 0, 0, 0, moves, 0)
    # samples at 0, 12 h, 24 h, 36 h, 48 h, 60 h; the run's total is 8
    assert moves_per_day_from_series(series, 2.5 * 86400, 8) == [2, 1, 5]
