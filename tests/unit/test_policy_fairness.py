"""`prefer` decides contested nodes, but never starves the other side (policy/fairness.py).

Each test is one of the problems `sunkd simulate` found (docs/simulation.md, "What the
runs say about sunkd's policy"), reduced to a handful of nodes, and fails on the policy
that read `prefer` literally.
"""

from __future__ import annotations

from dataclasses import replace

from sunkd.domain.events import (
    K8sDemandObserved,
    K8sWorkloadObserved,
    PendingPod,
    PodRef,
    SlurmDemandObserved,
)
from sunkd.domain.policy import (
    KUBERNETES_WAIT_BOUND_SECONDS,
    SLURM_HEAD_WAIT_BOUND_SECONDS,
    STARVATION_HOLD_SECONDS,
    AbortTransition,
    PoolSpec,
    StartTransition,
    decide,
)
from sunkd.domain.snapshot import state_from_json, state_to_json
from tests.unit.domain_world import PARTITION, POOL, Log, pool_spec, slurm_obs
from tests.unit.test_domain_policy import _cluster, _jobs, _record

T0 = 100_000.0


def _starts(log: Log, now: float, pool: PoolSpec) -> list[tuple[str, str]]:
    return [(d.node, d.to_owner) for d in decide(log.state(), [pool], now)
            if isinstance(d, StartTransition)]


def _running(log: Log, node: str, pods: int, now: float = 3.0) -> None:
    log.add(K8sWorkloadObserved(node=node, pool=POOL, pods=tuple(
        PodRef("serving", f"{node}-{i}", "Running") for i in range(pods))), now)


def _busy(log: Log, node: str, now: float = 3.0) -> None:
    log.add(slurm_obs(node, state="ALLOCATED"), now)


def _pending(log: Log, count: int, now: float) -> None:
    pods = tuple(PendingPod("serving", f"p{i}", gpus=8) for i in range(count))
    log.add(K8sDemandObserved(pool=POOL, pending=pods), now)


# ------------------------------------------------- 1. prefer: Kubernetes does not churn


def test_slurm_demand_does_not_evict_pods_the_pool_prefers() -> None:
    """A permanent Slurm backlog used to reclaim Kubernetes nodes running pods (and evict
    them after reclaim_grace): their replacements lent a node straight back."""
    log = _cluster(3, kubernetes=("n2", "n3"))
    _running(log, "n2", 1)
    _running(log, "n3", 3)
    _jobs(log, 10)  # more than n1 (idle, Slurm's) covers
    spec = pool_spec(prefer="Kubernetes", max_in_flight=2)
    assert _starts(log, T0, spec) == []


def test_slurm_demand_still_takes_an_empty_kubernetes_node_under_prefer_kubernetes() -> None:
    log = _cluster(3, kubernetes=("n2", "n3"))
    _running(log, "n2", 1)
    _jobs(log, 10)
    assert _starts(log, T0, pool_spec(prefer="Kubernetes", max_in_flight=2)) == [
        ("n3", "slurm")]


def test_min_slurm_still_reclaims_a_node_running_pods() -> None:
    """The floors are the operator's orders, not demand: they may still evict."""
    log = _cluster(3, kubernetes=("n1", "n2", "n3"))
    for name in ("n1", "n2", "n3"):
        _running(log, name, 1)
    _jobs(log, 5)
    spec = pool_spec(prefer="Kubernetes", min_slurm=1)
    assert _starts(log, T0, spec) == [("n1", "slurm")]


# ------------------------------------------------- 2. prefer: Slurm does not starve pods


def _queue(log: Log, pending_nodes: int, head: int, now: float = 3.0, job: int = 7) -> None:
    """A Slurm queue: `pending_nodes` wanted in all, `head` by job `job`, scheduled next."""
    log.add(SlurmDemandObserved(partition=PARTITION, pending_jobs=pending_nodes,
                                pending_nodes=pending_nodes, head_nodes=head,
                                head_job=job if head else 0), now)


def test_pods_waiting_past_the_bound_win_a_node_against_a_slurm_backlog() -> None:
    """A never-empty Slurm queue used to keep every pending pod waiting for ever."""
    log = _cluster(4)
    _queue(log, 40, head=1)  # the backlog: far more than the pool
    _pending(log, 1, now=T0)
    spec = pool_spec(prefer="Slurm")
    assert _starts(log, T0 + 1, spec) == []  # within the bound, prefer decides
    assert _starts(log, T0 + KUBERNETES_WAIT_BOUND_SECONDS - 1, spec) == []
    assert _starts(log, T0 + KUBERNETES_WAIT_BOUND_SECONDS, spec) == [("n1", "kubernetes")]


def test_without_the_head_job_prefer_slurm_stays_literal() -> None:
    log = _cluster(4)
    _queue(log, 40, head=0)  # an older source: the head job's width is not reported
    _pending(log, 1, now=T0)
    assert _starts(log, T0 + 10 * KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == []


def test_the_starvation_bound_never_takes_nodes_slurm_s_next_job_needs() -> None:
    log = _cluster(4)
    _queue(log, 40, head=4)  # a full-width job is next: Slurm gathers for it
    _pending(log, 1, now=T0)
    assert _starts(log, T0 + 10 * KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == []
    _queue(log, 40, head=3, now=T0 + 1)  # one node to spare
    assert _starts(log, T0 + 10 * KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == [
        ("n1", "kubernetes")]


def test_the_starvation_bound_stops_at_the_fair_share() -> None:
    log = _cluster(4, kubernetes=("n3", "n4"))
    _running(log, "n3", 1)
    _running(log, "n4", 1)
    _queue(log, 40, head=1)
    _pending(log, 3, now=T0)
    # Kubernetes holds 2 of 4, its fair share: prefer: Slurm holds, and Slurm's next job
    # fits on its own nodes, so its demand may not evict pods either.
    assert _starts(log, T0 + 10 * KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == []


def test_the_pending_clock_restarts_when_the_pending_list_empties() -> None:
    log = _cluster(4)
    _queue(log, 40, head=1)
    _pending(log, 1, now=T0)
    _pending(log, 2, now=T0 + 50)  # still pending: the clock keeps running
    assert log.state().k8s_pending_since == {POOL: T0}
    _pending(log, 0, now=T0 + 100)
    assert log.state().k8s_pending_since == {}
    _pending(log, 1, now=T0 + 110)
    assert _starts(log, T0 + KUBERNETES_WAIT_BOUND_SECONDS + 20, pool_spec()) == []
    assert _starts(log, T0 + 110 + KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == [
        ("n1", "kubernetes")]


def test_prefer_slurm_reclaims_a_node_running_pods_for_a_waiting_job() -> None:
    """What the knob says: with no pod waiting, Slurm's pending job takes a Kubernetes
    node back even if pods run there (they are evicted after reclaim_grace)."""
    log = _cluster(3, kubernetes=("n3",))
    _running(log, "n3", 1)
    _queue(log, 3, head=1)  # n1, n2 are busy with Slurm jobs; one more job waits
    for name in ("n1", "n2"):
        _busy(log, name)
    assert _starts(log, T0, pool_spec()) == [("n3", "slurm")]


def test_a_starved_kubernetes_keeps_its_running_pods_unless_slurm_s_next_job_needs_them(
) -> None:
    """Under prefer: Slurm a backlog used to reclaim (and evict) every Kubernetes node,
    whose pods' replacements then starved."""
    log = _cluster(4, kubernetes=("n3", "n4"))
    _running(log, "n3", 1)
    _running(log, "n4", 2)
    _pending(log, 1, now=T0)  # Kubernetes waits past the bound at its fair share
    _queue(log, 40, head=2)  # the next job fits on n1+n2, Slurm's own
    later = T0 + KUBERNETES_WAIT_BOUND_SECONDS
    assert _starts(log, later, pool_spec()) == []
    _queue(log, 40, head=3, now=T0)  # it needs one of Kubernetes' nodes: prefer: Slurm
    assert _starts(log, later + 1, pool_spec()) == [("n3", "slurm")]


def test_above_its_fair_share_kubernetes_yields_to_prefer_slurm() -> None:
    log = _cluster(4, kubernetes=("n2", "n3", "n4"))
    for name in ("n2", "n3", "n4"):
        _running(log, name, 1)
    _queue(log, 40, head=1)
    _pending(log, 1, now=T0)
    assert _starts(log, T0 + 10 * KUBERNETES_WAIT_BOUND_SECONDS, pool_spec()) == [
        ("n2", "slurm")]


def test_the_pending_clock_survives_a_snapshot() -> None:
    log = _cluster(2)
    _pending(log, 1, now=T0)
    state = log.state()
    assert state_from_json(state_to_json(state)) == state
    assert state_from_json(state_to_json(state)).k8s_pending_since == {POOL: T0}


# ------------------------------------------- the same, end to end in the simulated world


def _backlog_run(prefer: str) -> tuple[int, int]:
    """A never-empty batch queue and a pod stream on 6 nodes (2 Kubernetes at the start):
    (pods never placed, pods)."""
    from sunkd.simulate.metrics import Targets, measure
    from tests.unit.test_simulate_bridge import KNOBS, run, small_workload

    workload = small_workload(1, hours=8, backlog=6)
    world, controller, watched = run(workload, replace(KNOBS, prefer=prefer), nodes=6, k8s=2)
    assert watched.broken == [] and controller.stats.problems == []
    report = measure(world, "sunkd", 4, 2, Targets(),
                     moves=controller.stats.lends + controller.stats.reclaims)
    return report.never_placed, report.pods


def test_a_slurm_backlog_under_prefer_slurm_no_longer_starves_every_pod() -> None:
    never_placed, pods = _backlog_run("Slurm")
    assert never_placed < pods // 4  # literal `prefer`: all 96 of 96 never placed


def test_a_lend_the_starvation_bound_started_is_not_surplus_the_round_after() -> None:
    """The lend in flight is what Kubernetes won; counting it as Kubernetes' already made
    it surplus in the next round (aborted, started again: 6,622 aborts in 40 days)."""
    log = _cluster(4)
    _queue(log, 40, head=3)  # one Slurm node to spare
    _pending(log, 1, now=T0)
    now = T0 + KUBERNETES_WAIT_BOUND_SECONDS
    first = decide(log.state(), [pool_spec()], now)
    assert [(d.node, d.to_owner) for d in first if isinstance(d, StartTransition)] == [
        ("n1", "kubernetes")]
    _record(log, first, now)
    later = decide(log.state(), [pool_spec()], now + 1)
    assert not [d for d in later if isinstance(d, AbortTransition)]


def test_the_slurm_source_reports_the_job_waiting_on_resources_as_the_head() -> None:
    """Slurm gives reason `Resources` to the job it schedules next and `Priority` to the
    ones behind it (squeue(1), JOB REASON CODES)."""
    from sunkd.slurm.model import SlurmJob
    from sunkd.slurm.source import compute_demand

    jobs = [
        SlurmJob(1, "PENDING", partition=PARTITION, node_count=8, state_reason="Priority"),
        SlurmJob(2, "PENDING", partition=PARTITION, node_count=4, state_reason="Resources"),
        SlurmJob(3, "RUNNING", partition=PARTITION, nodes=("n1",), node_count=1),
    ]
    demand = compute_demand(jobs, [PARTITION])[PARTITION]
    assert (demand.pending_nodes, demand.head_nodes) == (12, 4)
    only_priority = compute_demand(jobs[:1], [PARTITION])[PARTITION]
    assert only_priority.head_nodes == 0  # not reported: the claim is every pending node


# ------------------------------------------------ 3. a wide head job gets its reservation


def test_a_head_job_waiting_past_the_bound_reserves_nodes_under_prefer_kubernetes() -> None:
    """With pods first a job wider than Slurm's nodes used to wait until pods happened to
    leave enough nodes (every 128-node job > 24 h at 151 nodes)."""
    log = _cluster(4, kubernetes=("n3", "n4"))
    _running(log, "n3", 1)
    _running(log, "n4", 2)
    _queue(log, 3, head=3, now=T0)  # needs one of Kubernetes' nodes
    _pending(log, 2, now=T0)  # and pods wait too: contested, pods preferred
    spec = pool_spec(prefer="Kubernetes")
    # Within the bound pods win: the idle Slurm node n1 is lent, nothing reclaimed.
    assert _starts(log, T0 + SLURM_HEAD_WAIT_BOUND_SECONDS - 1, spec) == [
        ("n1", "kubernetes")]
    # Past it, lending stops and the head job gets the node it lacks (n3: fewest pods).
    assert _starts(log, T0 + SLURM_HEAD_WAIT_BOUND_SECONDS, spec) == [("n3", "slurm")]
    # Another job at the head (the first one started or left): the partition has still
    # waited without a break, so the reservation holds.
    _queue(log, 3, head=3, now=T0 + 10, job=8)
    assert _starts(log, T0 + SLURM_HEAD_WAIT_BOUND_SECONDS, spec) == [("n3", "slurm")]


def test_a_head_job_changing_every_hour_still_gets_the_reservation() -> None:
    """Under `prefer: Kubernetes`, a partition whose head job changes more often than
    the bound (each wide job starts on what it gathered, the next one becomes head) used
    to wait forever: the clock restarted with every job. It counts how long something
    has waited for nodes without a break."""
    log = _cluster(4, kubernetes=("n3", "n4"))
    _running(log, "n3", 1)
    _running(log, "n4", 2)
    _pending(log, 2, now=T0)
    spec = pool_spec(prefer="Kubernetes")
    for hour in range(5):  # a new head job every hour, 4 h in all
        now = T0 + hour * 3600.0
        _queue(log, 3, head=3, now=now, job=100 + hour)
        waited = hour * 3600.0 >= SLURM_HEAD_WAIT_BOUND_SECONDS
        assert _starts(log, now + 1, spec) == (
            [("n3", "slurm")] if waited else [("n1", "kubernetes")]), hour
    # A moment where no head job is reported but jobs still wait for nodes (the next one
    # not yet marked Resources) does not restart the clock ...
    log.add(SlurmDemandObserved(partition=PARTITION, pending_jobs=3, pending_nodes=3),
            T0 + 4 * 3600.0 + 10)
    _queue(log, 3, head=3, now=T0 + 4 * 3600.0 + 20, job=200)
    assert _starts(log, T0 + 4 * 3600.0 + 21, spec) == [("n3", "slurm")]
    # ... nothing waiting for nodes does: the next head job waits its own bound.
    log.add(SlurmDemandObserved(partition=PARTITION), T0 + 5 * 3600.0)
    _queue(log, 3, head=3, now=T0 + 5 * 3600.0 + 10, job=300)
    later = T0 + 5 * 3600.0 + 10 + SLURM_HEAD_WAIT_BOUND_SECONDS
    assert _starts(log, later - 1, spec) == [("n1", "kubernetes")]
    assert _starts(log, later, spec) == [("n3", "slurm")]


def test_a_reservation_reclaims_only_what_the_head_job_lacks() -> None:
    log = _cluster(4, kubernetes=("n3", "n4"))
    _running(log, "n3", 1)
    _running(log, "n4", 2)
    _queue(log, 30, head=2, now=T0)  # fits on n1 + n2: a long wait, but not for nodes
    spec = pool_spec(prefer="Kubernetes", max_in_flight=2)
    assert _starts(log, T0 + 10 * SLURM_HEAD_WAIT_BOUND_SECONDS, spec) == []


# ------------------------------------------ damped starvation: hysteresis on the bound


def _starved_then_placed(log: Log, waited: float) -> float:
    """Kubernetes holds n3, n4 (pods running), a Slurm backlog whose next job fits on
    Slurm's own nodes, and a pending run of `waited` seconds that just ended; returns
    when it ended."""
    _running(log, "n3", 1)
    _running(log, "n4", 2)
    _queue(log, 40, head=1)
    _pending(log, 1, now=T0)
    _pending(log, 0, now=T0 + waited)
    return T0 + waited


def test_a_node_starved_pods_won_is_not_taken_back_by_eviction_within_the_hold() -> None:
    """Under prefer: Slurm the nodes starved pods won were reclaimed (pods evicted) the
    moment the pods ran; the replacements starved again: 555 moves a day."""
    log = _cluster(4, kubernetes=("n3", "n4"))
    ended = _starved_then_placed(log, KUBERNETES_WAIT_BOUND_SECONDS + 30)
    assert log.state().k8s_pending_last == {POOL: (T0, ended)}
    assert _starts(log, ended + 1, pool_spec()) == []
    assert _starts(log, ended + STARVATION_HOLD_SECONDS - 1, pool_spec()) == []
    assert _starts(log, ended + STARVATION_HOLD_SECONDS, pool_spec()) == [("n3", "slurm")]


def test_a_wait_shorter_than_the_bound_holds_nothing() -> None:
    log = _cluster(4, kubernetes=("n3", "n4"))
    ended = _starved_then_placed(log, KUBERNETES_WAIT_BOUND_SECONDS - 1)
    assert _starts(log, ended + 1, pool_spec()) == [("n3", "slurm")]


def test_the_hold_never_keeps_nodes_slurm_s_next_job_needs() -> None:
    log = _cluster(4, kubernetes=("n3", "n4"))
    ended = _starved_then_placed(log, KUBERNETES_WAIT_BOUND_SECONDS + 30)
    _queue(log, 40, head=3, now=ended)  # the next job needs one of Kubernetes' nodes
    assert _starts(log, ended + 1, pool_spec()) == [("n3", "slurm")]


def test_the_hold_keeps_an_idle_kubernetes_node_too() -> None:
    """A node that sat idle between two pods was reclaimed, and the next pods starved."""
    log = _cluster(4, kubernetes=("n3", "n4"))
    ended = _starved_then_placed(log, KUBERNETES_WAIT_BOUND_SECONDS + 30)
    _running(log, "n4", 0, now=ended)  # n4's pods ended: no eviction needed
    assert _starts(log, ended + 1, pool_spec()) == []
    assert _starts(log, ended + STARVATION_HOLD_SECONDS, pool_spec()) == [("n4", "slurm")]


def test_the_hold_survives_a_snapshot_and_older_snapshots_still_load() -> None:
    log = _cluster(4, kubernetes=("n3", "n4"))
    ended = _starved_then_placed(log, KUBERNETES_WAIT_BOUND_SECONDS + 30)
    state = log.state()
    raw = state_to_json(state)
    assert state_from_json(raw) == state
    raw.pop("k8s_pending_last")  # written before the hysteresis existed
    assert state_from_json(raw).k8s_pending_last == {}
    assert decide(state_from_json(state_to_json(state)), [pool_spec()], ended + 1) == \
        decide(state, [pool_spec()], ended + 1)
