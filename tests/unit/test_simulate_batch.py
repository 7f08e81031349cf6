"""The batch model: FIFO with EASY backfill, on hand-made queues and random ones."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.simulate.batch import Running, plan
from sunkd.simulate.workload import BatchJob


def job(job_id: int, nodes: int, runtime: float, estimate: float | None = None) -> BatchJob:
    return BatchJob(job_id, 0.0, runtime, nodes, estimate if estimate is not None else runtime)


def test_fifo_starts_the_head_while_it_fits() -> None:
    queue = [job(1, 2, 10), job(2, 2, 10), job(3, 1, 10)]
    assert plan(queue, 5, [], 0.0).starts == (0, 1, 2)
    assert plan(queue, 4, [], 0.0).starts == (0, 1)


def test_a_blocked_head_gets_a_reservation_and_short_jobs_backfill() -> None:
    # 4 nodes, 2 free; 2 busy until t=100. The head needs 4: shadow at 100, no extra.
    running = [Running(100.0, 2)]
    queue = [job(1, 4, 50), job(2, 2, 90), job(3, 2, 200)]
    result = plan(queue, 2, running, 0.0)
    assert result.shadow == 100.0 and result.extra == 0
    assert result.starts == (1,)  # ends at 90 <= 100; job 3 would delay the head


def test_long_jobs_backfill_on_the_nodes_the_head_does_not_need() -> None:
    # 6 nodes, 3 free, 3 busy until 100; head needs 4: at 100 there are 6, 2 spare.
    queue = [job(1, 4, 50), job(2, 2, 500), job(3, 1, 500)]
    result = plan(queue, 3, [Running(100.0, 3)], 0.0)
    assert result.shadow == 100.0
    assert result.starts == (1,)  # job 2 takes the 2 spare nodes; job 3 has no free node
    assert result.extra == 0


def test_no_reservation_when_the_nodes_are_not_coming_back() -> None:
    # The head needs 4 but only 3 nodes will ever be usable (one is drained away): Slurm's
    # backfill plans nothing for it and anything that fits runs (how wide jobs starve).
    queue = [job(1, 4, 50), job(2, 2, 10_000)]
    result = plan(queue, 2, [Running(100.0, 1)], 0.0)
    assert result.shadow is None and result.extra is None
    assert result.starts == (1,)


def test_backfill_plans_with_estimates_not_runtimes() -> None:
    queue = [job(1, 2, 50), job(2, 1, 10, estimate=1000)]
    result = plan(queue, 1, [Running(100.0, 1)], 0.0)
    assert result.starts == ()  # it would run 10 s, but its limit says 1000


def _simulate(nodes: int, jobs: list[tuple[float, int, float]]) -> dict[int, tuple[float, float]]:
    """A tiny event loop around `plan`: returns job -> (start, first shadow as head)."""
    queue: list[BatchJob] = []
    running: dict[int, tuple[float, int]] = {}
    ends: list[tuple[float, int]] = []
    arrivals = sorted((submit, i, n, run) for i, (submit, n, run) in enumerate(jobs))
    started: dict[int, float] = {}
    shadows: dict[int, float] = {}
    free = nodes
    a = 0
    while a < len(arrivals) or ends or queue:
        t = min(arrivals[a][0] if a < len(arrivals) else float("inf"),
                ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] <= t:
            _, ended = heapq.heappop(ends)
            free += running.pop(ended)[1]
        while a < len(arrivals) and arrivals[a][0] <= t:
            submit, i, n, run = arrivals[a]
            queue.append(BatchJob(i, submit, run, n, run))
            a += 1
        result = plan(queue, free, [Running(e, n) for e, n in running.values()], t)
        for index in result.starts:
            chosen = queue[index]
            free -= chosen.nodes
            assert free >= 0
            started[chosen.job_id] = t
            running[chosen.job_id] = (t + chosen.runtime, chosen.nodes)
            heapq.heappush(ends, (t + chosen.runtime, chosen.job_id))
        queue = [q for i, q in enumerate(queue) if i not in set(result.starts)]
        if queue and result.shadow is not None:
            shadows.setdefault(queue[0].job_id, result.shadow)
    return {i: (started[i], shadows.get(i, started[i])) for i in started}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500).map(float), st.integers(1, 8),
                          st.integers(1, 300).map(float)), min_size=1, max_size=25))
def test_easy_never_delays_the_head_past_its_reservation(
        jobs: list[tuple[float, int, float]]) -> None:
    """With exact estimates and a fixed set of nodes, a job that became the head with a
    reservation starts by then (backfill never delays it), every job runs, and nodes are
    never oversubscribed (asserted inside)."""
    outcome = _simulate(8, jobs)
    assert len(outcome) == len(jobs)
    for start, shadow in outcome.values():
        assert start <= shadow
