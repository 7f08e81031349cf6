"""The size search's early verdict (`arms.pods_meet`) against the full run's verdict."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.simulate import search
from sunkd.simulate.arms import SimConfig, pods_meet, run_separate
from sunkd.simulate.metrics import P95, over_percentile, percentile
from sunkd.simulate.workload import SimPod, Workload
from sunkd.simulate.world import World

HOUR = 3600.0

pods_strategy = st.lists(
    st.tuples(st.floats(0.0, 2 * HOUR), st.floats(30.0, HOUR), st.integers(1, 8),
              st.sampled_from([250, 500, 1000])),
    min_size=0, max_size=120)


def _workload(specs: list[tuple[float, float, int, int]]) -> Workload:
    pods = tuple(sorted((SimPod(f"p{i}", create, duration, gpus, milli, 1000, 1024)
                         for i, (create, duration, gpus, milli) in enumerate(specs)),
                        key=lambda pod: pod.create))
    return Workload("t", 2 * HOUR, (), pods, 0, True, ())


def test_over_percentile_is_where_the_percentile_crosses() -> None:
    for count in range(1, 60):
        late = over_percentile(P95, count)
        assert percentile([0.0] * (count - late) + [1.0] * late, P95) == 1.0
        assert percentile([0.0] * (count - late + 1) + [1.0] * (late - 1), P95) == 0.0


@settings(max_examples=40, deadline=None)
@given(pods_strategy, st.integers(1, 4))
def test_the_early_verdict_is_the_full_runs(specs: list[tuple[float, float, int, int]],
                                            nodes: int) -> None:
    workload = _workload(specs)
    full = run_separate(workload, 0, nodes, SimConfig()).meets["pod_pending_p95"]
    assert pods_meet(workload, nodes, SimConfig()) == (full is not False)


def test_an_undersized_cluster_stops_early() -> None:
    # 100 pods of a whole node each, arriving at once, on one node: the 6th waits past
    # 60 s, and 5 late pods already fail the p95 of 100 (over_percentile(95, 100) = 6).
    workload = _workload([(0.0, 600.0, 8, 1000)] * 100)
    world = World(workload, 1, 1)
    world.late_bound = 60.0
    world.late_limit = over_percentile(P95, 100)
    world.run()
    assert world.gave_up and world.now < workload.horizon
    assert not pods_meet(workload, 1, SimConfig())
    assert run_separate(workload, 0, 1, SimConfig()).meets["pod_pending_p95"] is False


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(0, 60), st.integers(0, 120), st.integers(0, 200))
def test_the_smallest_size_is_found_asking_each_size_once(low: int, guess_over: int,
                                                         high_over: int,
                                                         threshold: int) -> None:
    # Each question is a whole simulated run: asking a size twice doubles its cost.
    guess = low + guess_over
    high = guess + high_over
    asked: list[int] = []

    def meets(n: int) -> bool:
        asked.append(n)
        return n >= threshold

    found = search._smallest(meets, low, guess, high)
    expected = next((n for n in range(low, high + 1) if n >= threshold), None)
    assert found == expected
    assert len(asked) == len(set(asked)), asked
