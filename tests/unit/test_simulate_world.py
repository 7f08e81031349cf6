"""The world model without sunkd: packing, the pending queue, separate and ideal pools."""

from __future__ import annotations

from sunkd.simulate.arms import SimConfig, run_ideal, run_separate
from sunkd.simulate.pods import Capacity, PendingQueue, best_fit
from sunkd.simulate.workload import BatchJob, SimPod, Workload
from sunkd.simulate.world import World

HOUR = 3600.0


def pod(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000, create: float = 0.0,
        duration: float = HOUR) -> SimPod:
    return SimPod(name, create, duration, gpus, milli, cpu, 1024)


def test_whole_gpus_need_empty_gpus_and_shares_pack_the_fullest() -> None:
    node = Capacity.empty(2, 64_000, 65_536)
    assert node.take(pod("a", 1, 600)) == (0,)
    assert node.take(pod("b", 1, 300)) == (0,)  # the fuller GPU that still fits
    assert not node.fits(pod("c", 2, 1000))  # GPU 0 is shared now
    assert node.fits(pod("d", 1, 1000))
    assert not node.fits(pod("e", 1, 200, cpu=64_000))  # CPU is full enough
    node.give_back(pod("a", 1, 600), (0,))
    assert node.gpu_free == [700, 1000] and node.full_gpus == 1


def test_best_fit_prefers_the_fullest_node() -> None:
    empty = Capacity.empty(8, 128_000, 786_432)
    half = Capacity.empty(8, 128_000, 786_432)
    half.take(pod("x", 4))
    assert best_fit(pod("p"), [(0, empty), (1, half)]) == 1
    assert best_fit(pod("big", 8), [(0, empty), (1, half)]) == 0
    assert best_fit(pod("huge", 9), [(0, empty)]) is None


def test_pending_queue_offers_the_earliest_pod_that_fits() -> None:
    queue = PendingQueue()
    queue.view = lambda item: f"view of {item.name}"
    for item in (pod("big", 8), pod("small-1"), pod("small-2")):
        queue.push(item, item)
    partly = Capacity.empty(8, 128_000, 786_432)
    partly.take(pod("x", 2))
    first = queue.earliest_fitting(partly.fits, lambda item: item)
    assert first is not None and first.name == "small-1"  # big is earlier but does not fit
    assert list(queue.views.values()) == ["view of big", "view of small-2"]
    empty = Capacity.empty(8, 128_000, 786_432)
    assert queue.earliest_fitting(empty.fits, lambda item: item).name == "big"
    assert len(queue) == 1


def workload(jobs: tuple[BatchJob, ...], pods: tuple[SimPod, ...],
             hours: float = 10.0) -> Workload:
    return Workload("t", hours * HOUR, jobs, pods, 0, True, ())


def test_separate_clusters_never_share_a_node() -> None:
    jobs = tuple(BatchJob(i, i * 600.0, 3000.0, 2, 3000.0) for i in range(20))
    pods = tuple(pod(f"p{i}", 8, create=i * 300.0, duration=2000.0) for i in range(40))
    world = World(workload(jobs, pods), 4, 2)
    seen: set[tuple[str, str]] = set()

    def watch(w: World) -> None:
        for node in w.nodes:
            if node.job is not None:
                seen.add((node.name, "slurm"))
            if node.pods:
                seen.add((node.name, "kubernetes"))

    world.controller = watch
    world.run()
    assert world.violations == []
    assert seen == {("gpu-0001", "slurm"), ("gpu-0002", "slurm"),
                    ("gpu-0003", "kubernetes"), ("gpu-0004", "kubernetes")}


def test_ideal_pods_first_starve_a_wide_job_and_slurm_first_does_not() -> None:
    """Two nodes; a 2-node job waits while pods keep arriving. Pods first: the job waits
    for a moment without pods. Slurm first: pods do not take the node the job waits for."""
    jobs = (BatchJob(1, 0.0, HOUR, 1, HOUR), BatchJob(2, 60.0, HOUR, 2, HOUR))
    pods = tuple(pod(f"p{i}", 8, create=120.0 + i * 1800.0, duration=2400.0)
                 for i in range(8))
    load = workload(jobs, pods, hours=6.0)
    pods_first = run_ideal(load, 2, "Kubernetes", SimConfig())
    slurm_first = run_ideal(load, 2, "Slurm", SimConfig())
    assert pods_first.batch_wait_s["max"] > 4 * HOUR  # starved while the pods overlap
    assert slurm_first.batch_wait_s["max"] <= HOUR  # started when job 1 ended
    assert slurm_first.pod_pending_s["max"] > pods_first.pod_pending_s["max"]


def test_eviction_requeues_the_pod_with_the_rest_of_its_run() -> None:
    world = World(workload((), (pod("p", duration=HOUR),)), 2, 2)
    world.run_until = None  # type: ignore[attr-defined]
    world._step(0.0)
    node = next(n for n in world.nodes if n.pods)
    assert world.evict(node, {"p"}, 600.0, 30.0) == 1
    assert len(world.pending) == 1 and world.evictions == 1
    record = world.pods[0]
    assert record.ran == 600.0 and record.incarnation == 1
    assert node.pods["p"].terminating  # still there during its graceful termination


def test_separate_and_ideal_do_the_same_work_when_nothing_waits() -> None:
    jobs = tuple(BatchJob(i, i * 3600.0, 1800.0, 1, 1800.0) for i in range(8))
    pods = tuple(pod(f"p{i}", create=i * 1000.0, duration=900.0) for i in range(30))
    load = workload(jobs, pods)
    separate = run_separate(load, 2, 2, SimConfig())
    ideal = run_ideal(load, 4, "Slurm", SimConfig())
    assert separate.batch_node_hours == ideal.batch_node_hours == 4.0
    assert separate.utilization == ideal.utilization
    assert separate.meets_all and ideal.meets_all


def test_arrivals_after_the_horizon_never_come_and_the_run_ends() -> None:
    # A hand-built workload (build_workload never does this) listing a pod at the
    # horizon and one after it, while a batch job runs past the horizon: the run drains
    # the job and ends, instead of stepping forever at an arrival it never admits.
    jobs = (BatchJob(1, 0.0, 2 * HOUR, 1, 2 * HOUR), BatchJob(2, 3 * HOUR, 600.0, 1, 600.0))
    pods = (pod("at-horizon", create=HOUR), pod("late", create=1.5 * HOUR))
    report = run_separate(workload(jobs, pods, hours=1.0), 2, 1, SimConfig())
    assert report.jobs == 1 and report.pods == 0 and report.jobs_started == 1
    assert report.simulated_days == round(2 * HOUR / 86400, 2)
