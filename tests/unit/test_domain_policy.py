"""The policy, rule by rule, on hand-built logs."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from sunkd.domain.codec import decode_payload, legacy_node_job_ends
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    K8sDemandObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    NodeJobEnd,
    OperatorPinned,
    OwnershipSpec,
    PendingPod,
    PodRef,
    SlurmDemandObserved,
    SourceHealth,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.policy import (
    AbortTransition,
    CompleteTransition,
    Decision,
    PoolSpec,
    RequestAction,
    StartTransition,
    decide,
    decision_to_event,
    effective_pools,
    membership,
    retry_backoff,
    stale_action,
)
from tests.unit.domain_world import (
    PARTITION,
    POOL,
    Log,
    k8s_obs,
    pool_spec,
    slurm_obs,
    sunkd_drained,
)

T0 = 100_000.0
D = TypeVar("D", StartTransition, CompleteTransition, AbortTransition, RequestAction)
LEND_DRAIN = "sunkd: lent to kubernetes [tx old]"


def _cluster(nodes: int = 3, kubernetes: tuple[str, ...] = ()) -> Log:
    """Fresh sources; nodes n1.. settled Slurm-owned (tainted, idle), or lent if listed."""
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    for i in range(1, nodes + 1):
        name = f"n{i}"
        lent = name in kubernetes
        if lent:
            sunkd_drained(log, name, LEND_DRAIN, 1.0)
            log.add(slurm_obs(name, flags=("DRAIN",), reason=LEND_DRAIN), 1.0)
        else:
            log.add(slurm_obs(name), 1.0)
        log.add(k8s_obs(name, tainted=not lent), 1.0)
        owner = "kubernetes" if lent else "slurm"
        log.add(TransitionStarted(transition_id=f"adopt-{name}", node=name, pool=POOL,
                                  from_owner="none", to_owner=owner), 2.0)
        log.add(TransitionCompleted(transition_id=f"adopt-{name}", node=name), 2.0)
    return log


def _pods(log: Log, count: int, now: float = 3.0, **request: int) -> None:
    pending = tuple(PendingPod("serving", f"p{i}", **request) for i in range(count))
    log.add(K8sDemandObserved(pool=POOL, pending=pending), now)


def _jobs(log: Log, nodes: int, now: float = 3.0, ends: tuple[NodeJobEnd, ...] = ()) -> None:
    if not ends:
        log.add(SlurmDemandObserved(partition=PARTITION, pending_jobs=nodes,
                                    pending_nodes=nodes), now)
        return
    # A row as sunkd wrote it before job ends moved into node observations: every busy
    # node's job end in the demand.
    legacy = decode_payload(SlurmDemandObserved.KIND, {
        "v": 1, "partition": PARTITION, "pending_jobs": nodes, "pending_nodes": nodes,
        "running_jobs": 0, "node_job_ends": [
            {"node": e.node, "expected_end": e.expected_end, "jobs": e.jobs} for e in ends]})
    assert legacy_node_job_ends(legacy) == ends  # type: ignore[arg-type]
    log.add(legacy, now)


def _decide(log: Log, now: float, pool: PoolSpec | None = None) -> list[Decision]:
    return decide(log.state(), [pool or pool_spec()], now)


def _record(log: Log, decisions: list[Decision], now: float) -> None:
    for decision in decisions:
        event = decision_to_event(decision)
        log.add(event.payload, now, event.subject)


def _succeed(log: Log, action: RequestAction, now: float) -> None:
    log.add(ActionSucceeded(action_id=action.action_id, transition_id=action.transition_id,
                            side=action.side, verb=action.verb, node=action.node,
                            attempt=action.attempt), now)


def _fail(log: Log, action: RequestAction, now: float, retryable: bool) -> None:
    log.add(ActionFailed(action_id=action.action_id, transition_id=action.transition_id,
                         side=action.side, verb=action.verb, node=action.node,
                         attempt=action.attempt, error="boom", retryable=retryable), now)


def _actions(decisions: list[Decision]) -> list[tuple[str, str, str]]:
    return [(d.node, d.side, d.verb) for d in decisions if isinstance(d, RequestAction)]


def _only(decisions: list[Decision], kind: type[D]) -> list[D]:
    return [d for d in decisions if isinstance(d, kind)]


# --------------------------------------------------------------------------- adoption


def test_adoption_locks_an_untainted_node_then_completes_when_tainted() -> None:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=4), 1.0)
    log.add(k8s_obs("n1", tainted=False), 1.0)
    decisions = _decide(log, 10.0)
    start = decisions[0]
    assert isinstance(start, StartTransition)
    assert (start.from_owner, start.to_owner) == ("none", "slurm")
    assert "adopt" in start.reason
    assert _actions(decisions) == [("n1", "kubernetes", "lock")]
    lock = decisions[1]
    assert isinstance(lock, RequestAction) and lock.arg("k8s_node") == "n1"
    _record(log, decisions, 10.0)
    assert _decide(log, 11.0) == []  # the lock is open: nothing new
    _succeed(log, lock, 12.0)
    log.add(k8s_obs("n1", tainted=True), 13.0)
    done = _decide(log, 14.0)
    assert [type(d) for d in done] == [CompleteTransition]
    _record(log, done, 14.0)
    node = log.state().nodes["n1"]
    assert node.owner == "slurm" and node.last_move_at is None


def test_adoption_of_a_tainted_node_starts_and_completes_at_once() -> None:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    log.add(slurm_obs("n1"), 1.0)
    log.add(k8s_obs("n1", tainted=True), 1.0)
    assert [type(d) for d in _decide(log, 2.0)] == [StartTransition, CompleteTransition]


def test_adoption_recognises_a_node_already_lent() -> None:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    sunkd_drained(log, "n1", LEND_DRAIN, 1.0)  # sunkd's, as its log proves
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=LEND_DRAIN), 1.0)
    log.add(k8s_obs("n1", tainted=False), 1.0)
    decisions = _decide(log, 2.0)
    assert [type(d) for d in decisions] == [StartTransition, CompleteTransition]
    assert decisions[0].to_owner == "kubernetes"  # type: ignore[union-attr]


def test_a_transition_whose_pool_disappeared_is_still_driven_to_its_end() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=drain.arg("reason")), T0 + 2)
    # The Nodeset is deleted: no pool matches the node any more, the lend goes on.
    assert _actions(decide(log.state(), [], T0 + 3)) == [("n1", "kubernetes", "unlock")]
    # Its demand gone too, a lend not yet handed over is aborted (default knobs).
    log.add(K8sDemandObserved(pool=POOL, pending=()), T0 + 4)
    ended = decide(log.state(), [], T0 + 5)
    assert isinstance(ended[0], AbortTransition)
    _record(log, ended, T0 + 5)
    assert log.state().nodes["n1"].transition is None


def test_nodes_outside_every_pool_get_nothing() -> None:
    log = _cluster(1)
    _pods(log, 3)
    other = PoolSpec(name="other", partitions=("cpu",))
    assert decide(log.state(), [other], T0) == []
    assert membership(log.state(), [other]) == {}


# ------------------------------------------------------------------------ no action


def test_nothing_is_decided_while_a_source_is_stale_or_a_side_unobserved() -> None:
    log = _cluster(2)
    _pods(log, 2)
    log.add(SourceHealth(source="slurm", status="stale", cause="timeout"), 5.0,
            subject="slurm")
    assert _decide(log, T0) == []
    log.add(SourceHealth(source="slurm", status="fresh"), 6.0, subject="slurm")
    assert _decide(log, T0) != []
    fresh = Log()
    fresh.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    fresh.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    fresh.add(slurm_obs("n1"), 1.0)  # never seen in Kubernetes
    assert decide(fresh.state(), [PoolSpec(name=POOL, partitions=(PARTITION,))], T0) == []


# ------------------------------------------------------------------------------ lend


def test_lend_drains_waits_for_drained_then_unlocks_and_completes() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    start, drain = first
    assert isinstance(start, StartTransition) and (start.from_owner, start.to_owner) == (
        "slurm", "kubernetes",
    )
    assert "kubernetes needs 1 node" in start.reason
    assert isinstance(drain, RequestAction) and drain.verb == "drain"
    assert drain.arg("reason") == f"sunkd: lent to kubernetes [tx {start.transition_id}]"
    _record(log, first, T0)
    _succeed(log, drain, T0 + 1)
    reason = drain.arg("reason")
    # Draining, still running or completing a job: never hand it over.
    for state, flags in (("ALLOCATED", ("DRAIN",)), ("MIXED", ("DRAIN",)),
                         ("IDLE", ("COMPLETING", "DRAIN"))):
        log.add(slurm_obs("n1", state, flags, reason), T0 + 2)
        assert _decide(log, T0 + 3) == []
    log.add(slurm_obs("n1", "IDLE", ("DRAIN",), reason), T0 + 4)
    unlock_round = _decide(log, T0 + 5)
    assert _actions(unlock_round) == [("n1", "kubernetes", "unlock")]
    _record(log, unlock_round, T0 + 5)
    unlock = unlock_round[0]
    assert isinstance(unlock, RequestAction)
    _succeed(log, unlock, T0 + 6)
    assert _decide(log, T0 + 7) == []  # waiting for the observation of the untaint
    log.add(k8s_obs("n1", tainted=False), T0 + 8)
    done = _decide(log, T0 + 9)
    assert [type(d) for d in done] == [CompleteTransition]
    _record(log, done, T0 + 9)
    node = log.state().nodes["n1"]
    assert node.owner == "kubernetes" and node.last_move_at == T0 + 9


def test_lend_aborts_after_drain_timeout_and_resumes_our_drain() -> None:
    log = _cluster(1)
    _pods(log, 1)
    spec = pool_spec(drain_timeout_seconds=600)
    first = _decide(log, T0, spec)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs("n1", "ALLOCATED", ("DRAIN",), drain.arg("reason")), T0 + 2)
    assert _decide(log, T0 + 599, spec) == []
    aborted = _decide(log, T0 + 600, spec)
    assert isinstance(aborted[0], AbortTransition)
    assert "drain_timeout" in aborted[0].reason
    resume = aborted[1]
    assert isinstance(resume, RequestAction) and resume.verb == "resume"
    assert resume.arg("expect_reason") == drain.arg("reason")
    assert _actions(aborted) == [("n1", "slurm", "resume")]  # the taint stays
    # The resume is asked after the lend ended, on its behalf: it belongs to no
    # transition, so the outbox runs it (an ended transition's own actions never run).
    _record(log, aborted, T0 + 600)
    node = log.state().nodes["n1"]
    assert resume.transition_id is None and drain.transition_id in resume.reason
    assert stale_action(node.open_actions[resume.action_id], node) is None


def test_lend_that_demand_no_longer_needs_is_aborted() -> None:
    log = _cluster(2)
    _pods(log, 2)
    first = _decide(log, T0, pool_spec(max_in_flight=2))
    assert len(_only(first, StartTransition)) == 2
    _record(log, first, T0)
    _pods(log, 1, now=T0 + 1)
    second = _decide(log, T0 + 2, pool_spec(max_in_flight=2))
    aborts = _only(second, AbortTransition)
    assert len(aborts) == 1 and "demand gone" in aborts[0].reason


def test_lend_order_idle_first_then_soonest_job_end() -> None:
    log = _cluster(4)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 3.0)
    log.add(slurm_obs("n2", "ALLOCATED", alloc_cpus=8), 3.0)
    log.add(slurm_obs("n3", "ALLOCATED", alloc_cpus=8), 3.0)
    _jobs(log, 0, ends=(NodeJobEnd("n1", None), NodeJobEnd("n2", T0 + 500),
                        NodeJobEnd("n3", T0 + 100)))
    _pods(log, 4)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=3)), StartTransition)
    assert [s.node for s in starts] == ["n4", "n3", "n2"]


def test_lend_order_reads_job_ends_from_node_observations() -> None:
    log = _cluster(4)
    for name, end in (("n1", None), ("n2", T0 + 500), ("n3", T0 + 100)):
        log.add(replace(slurm_obs(name, "ALLOCATED", alloc_cpus=8), jobs=1, job_end=end), 3.0)
    _jobs(log, 0)
    _pods(log, 4)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=3)), StartTransition)
    assert [s.node for s in starts] == ["n4", "n3", "n2"]
    # A later observation of the node moves it in the order (n3 now ends last).
    log.add(replace(slurm_obs("n3", "ALLOCATED", alloc_cpus=8), jobs=2, job_end=T0 + 900), 3.5)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=3)), StartTransition)
    assert [s.node for s in starts] == ["n4", "n2", "n3"]


def test_pending_pods_are_packed_by_requests() -> None:
    log = _cluster(4)
    # 6 pods x 20 cores on 64-core nodes: 120 cores -> 2 nodes, not 6.
    _pods(log, 6, cpu_millis=20_000)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=5)), StartTransition)
    assert len(starts) == 2


def test_a_node_whose_capacity_did_not_parse_is_not_packed_by_a_made_up_number() -> None:
    """A pool node whose allocatable cpu did not parse has unknown capacity: the pods
    are not packed (one node per pod, as for unknown requests), never by 0 or 2**63."""
    log = _cluster(4)
    log.add(replace(k8s_obs("n4"), cpu_millis=2**63 - 1, unparsed=("cpu",)), 2.5)
    _pods(log, 6, cpu_millis=20_000)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=5)), StartTransition)
    assert len(starts) == 4  # every node, not the 2 that 64-core packing says


# --------------------------------------------------------------------------- reclaim


def test_reclaim_taints_waits_grace_evicts_resumes_and_completes() -> None:
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=(PodRef("serving", "web-1",
                                                                   "Running"),)), 3.0)
    _jobs(log, 1)
    spec = pool_spec(reclaim_grace_seconds=120)
    first = _decide(log, T0, spec)
    start, lock = first
    assert isinstance(start, StartTransition) and start.to_owner == "slurm"
    assert "Slurm needs 1 node" in start.reason
    assert isinstance(lock, RequestAction) and lock.verb == "lock"
    _record(log, first, T0)
    _succeed(log, lock, T0 + 1)
    log.add(k8s_obs("n1", tainted=True), T0 + 2)
    # Pods get reclaim_grace to finish, counted from the taint (its lock at T0 + 1).
    assert _decide(log, T0 + 120, spec) == []
    evict_round = _decide(log, T0 + 121, spec)
    assert _actions(evict_round) == [("n1", "kubernetes", "evict")]
    evict = evict_round[0]
    assert isinstance(evict, RequestAction) and evict.arg("pod") == "serving/web-1"
    _record(log, evict_round, T0 + 121)
    _fail(log, evict, T0 + 121, retryable=True)  # PDB said 429
    assert _decide(log, T0 + 121 + retry_backoff(1) - 1, spec) == []
    retry = _decide(log, T0 + 121 + retry_backoff(1), spec)
    assert isinstance(retry[0], RequestAction) and retry[0].attempt == 2
    _record(log, retry, T0 + 130)
    _succeed(log, retry[0], T0 + 131)
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=()), T0 + 140)
    resume_round = _decide(log, T0 + 141, spec)
    assert _actions(resume_round) == [("n1", "slurm", "resume")]
    resume = resume_round[0]
    assert isinstance(resume, RequestAction) and resume.arg("expect_reason") == LEND_DRAIN
    _record(log, resume_round, T0 + 141)
    _succeed(log, resume, T0 + 142)
    log.add(slurm_obs("n1"), T0 + 143)
    done = _decide(log, T0 + 144, spec)
    assert [type(d) for d in done] == [CompleteTransition]


def test_reclaim_grace_counts_from_the_taint_not_the_start() -> None:
    """Pods that bound while the reclaim's taint was not on yet (the lock failed and was
    retried, or the daemon that started the reclaim died before it) were never told to
    go: they get the whole reclaim_grace from the taint, not what is left of it."""
    log = _cluster(1, kubernetes=("n1",))
    _jobs(log, 1)
    spec = pool_spec(reclaim_grace_seconds=120)
    first = _decide(log, T0, spec)
    _record(log, first, T0)
    lock = first[1]
    assert isinstance(lock, RequestAction) and lock.verb == "lock"
    _fail(log, lock, T0 + 1, retryable=True)
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=(PodRef("serving", "web-1",
                                                                   "Running"),)), T0 + 200)
    retry = _decide(log, T0 + 300, spec)
    assert _actions(retry) == [("n1", "kubernetes", "lock")]
    _record(log, retry, T0 + 300)
    assert isinstance(retry[0], RequestAction)
    _succeed(log, retry[0], T0 + 301)
    log.add(k8s_obs("n1", tainted=True), T0 + 302)
    assert _decide(log, T0 + 302, spec) == []  # 302 s after the start: not yet
    assert _decide(log, T0 + 301 + 119, spec) == []
    assert _actions(_decide(log, T0 + 301 + 120, spec)) == [("n1", "kubernetes", "evict")]


def test_reclaim_prefers_nodes_without_pool_pods() -> None:
    log = _cluster(3, kubernetes=("n1", "n2", "n3"))
    for name, pods in (("n1", 2), ("n2", 0), ("n3", 1)):
        log.add(K8sWorkloadObserved(node=name, pool=POOL, pods=tuple(
            PodRef("s", f"{name}-{i}", "Running") for i in range(pods))), 3.0)
    _jobs(log, 2)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=2)), StartTransition)
    assert [s.node for s in starts] == ["n2", "n3"]


# ---------------------------------------------------------------------- holds/mirrors


def test_foreign_drain_is_mirrored_as_a_cordon_and_never_resumed() -> None:
    log = _cluster(1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="admin: bad dimm"), 5.0)
    _jobs(log, 3)
    decisions = _decide(log, T0)
    assert _actions(decisions) == [("n1", "kubernetes", "cordon")]
    cordon = decisions[0]
    assert isinstance(cordon, RequestAction)
    assert cordon.arg("slurm_state") == "IDLE+DRAIN"
    assert cordon.arg("slurm_reason") == "admin: bad dimm"
    _record(log, decisions, T0)
    _succeed(log, cordon, T0 + 1)
    log.add(k8s_obs("n1", hold_tainted=True), T0 + 2)
    assert _decide(log, T0 + 3) == []
    log.add(slurm_obs("n1"), T0 + 4)  # the admin resumed it
    assert _actions(_decide(log, T0 + 5)) == [("n1", "kubernetes", "uncordon")]


def test_kubernetes_not_ready_is_mirrored_as_our_drain_and_undone() -> None:
    log = _cluster(1)
    log.add(k8s_obs("n1", ready=False), 5.0)
    decisions = _decide(log, T0)
    assert _actions(decisions) == [("n1", "slurm", "drain")]
    drain = decisions[0]
    assert isinstance(drain, RequestAction) and drain.arg("reason") == "sunkd: k8s NotReady"
    _record(log, decisions, T0)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="sunkd: k8s NotReady"), T0 + 2)
    assert _decide(log, T0 + 3) == []
    log.add(k8s_obs("n1", ready=True), T0 + 4)
    resumed = _decide(log, T0 + 5)
    assert _actions(resumed) == [("n1", "slurm", "resume")]


def test_foreign_cordon_is_never_uncordoned() -> None:
    log = _cluster(1)
    log.add(k8s_obs("n1", unschedulable=True), 5.0)  # someone ran kubectl cordon
    decisions = _decide(log, T0)
    assert _actions(decisions) == [("n1", "slurm", "drain")]
    assert all(d.verb != "uncordon" for d in decisions if isinstance(d, RequestAction))


def test_a_hold_aborts_an_open_transition_without_acting() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs("n1", "ALLOCATED", ("DRAIN",), "admin: replace"), T0 + 2)
    decisions = _decide(log, T0 + 3)
    assert isinstance(decisions[0], AbortTransition)
    assert decisions[0].reason.startswith("held: slurm drained")
    assert "resume" not in [verb for _, _, verb in _actions(decisions)]


def test_pool_pods_on_a_slurm_owned_node_are_evicted_before_resume() -> None:
    log = _cluster(1)
    sunkd_drained(log, "n1", LEND_DRAIN, 5.0)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=LEND_DRAIN), 5.0)  # an aborted lend
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=(PodRef("s", "web", "Running"),)),
            5.0)
    assert _actions(_decide(log, T0)) == [("n1", "kubernetes", "evict")]
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=()), 6.0)
    assert _actions(_decide(log, T0)) == [("n1", "slurm", "resume")]


def test_a_move_past_its_point_of_no_return_waits_out_a_hold() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=drain.arg("reason")), T0 + 2)
    unlock_round = _decide(log, T0 + 3)
    _record(log, unlock_round, T0 + 3)
    unlock = unlock_round[0]
    assert isinstance(unlock, RequestAction) and unlock.verb == "unlock"
    _succeed(log, unlock, T0 + 4)
    log.add(k8s_obs("n1", tainted=False, ready=False), T0 + 5)  # a kubelet blip
    assert _only(_decide(log, T0 + 6), AbortTransition) == []
    log.add(k8s_obs("n1", tainted=False, ready=True), T0 + 7)
    assert [type(d) for d in _decide(log, T0 + 8)] == [CompleteTransition]
    # A node that vanished from one side does end it.
    log.add(K8sNodeVanished(node="n1"), T0 + 9)
    gone = _decide(log, T0 + 10)
    assert isinstance(gone[0], AbortTransition)
    assert gone[0].reason == "held: missing in Kubernetes"


def test_lend_drain_removed_while_lent_is_put_back() -> None:
    log = _cluster(1, kubernetes=("n1",))
    log.add(slurm_obs("n1"), 5.0)  # someone resumed a lent node
    decisions = _decide(log, T0)
    assert _actions(decisions) == [("n1", "slurm", "drain")]


# ------------------------------------------------------------------------ pins, modes


def test_pin_to_the_other_side_moves_without_demand_or_dwell() -> None:
    log = _cluster(2)
    log.add(OperatorPinned(node="n2", to="kubernetes", who="alice", why="debug"), 5.0)
    starts = _only(_decide(log, 10.0, pool_spec(dwell_seconds=10**6)), StartTransition)
    assert [(s.node, s.reason) for s in starts] == [
        ("n2", "operator pinned the node to kubernetes"),
    ]


def test_pin_to_the_owner_keeps_the_node() -> None:
    log = _cluster(2)
    log.add(OperatorPinned(node="n1", to="slurm", who="alice"), 5.0)
    _pods(log, 2)
    starts = _only(_decide(log, T0, pool_spec(max_in_flight=2)), StartTransition)
    assert [s.node for s in starts] == ["n2"]


def test_pin_against_an_open_lend_aborts_it() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    log.add(OperatorPinned(node="n1", to="slurm", who="alice"), T0 + 1)
    aborted = _decide(log, T0 + 2)
    assert isinstance(aborted[0], AbortTransition) and "pinned" in aborted[0].reason


def test_pool_mode_pins_the_whole_pool() -> None:
    log = _cluster(3, kubernetes=("n3",))
    starts = _only(_decide(log, T0, pool_spec(mode="Kubernetes", max_in_flight=5)),
                   StartTransition)
    assert [(s.node, s.to_owner) for s in starts] == [("n1", "kubernetes"),
                                                       ("n2", "kubernetes")]
    back = _only(_decide(log, T0, pool_spec(mode="Slurm", max_in_flight=5)), StartTransition)
    assert [(s.node, s.to_owner) for s in back] == [("n3", "slurm")]


# ---------------------------------------------------------------------------- knobs


def test_max_in_flight_caps_open_moves() -> None:
    log = _cluster(5)
    _pods(log, 5)
    spec = pool_spec(max_in_flight=2)
    first = _decide(log, T0, spec)
    assert len(_only(first, StartTransition)) == 2
    _record(log, first, T0)
    assert _only(_decide(log, T0 + 1, spec), StartTransition) == []


def test_dwell_keeps_a_recently_moved_node_in_place() -> None:
    log = _cluster(2)
    log.add(TransitionStarted(transition_id="x", node="n1", pool=POOL, from_owner="kubernetes",
                              to_owner="slurm"), T0 - 100)
    log.add(TransitionCompleted(transition_id="x", node="n1"), T0 - 50)
    _pods(log, 2)
    spec = pool_spec(dwell_seconds=300, max_in_flight=2)
    assert [s.node for s in _only(_decide(log, T0, spec), StartTransition)] == ["n2"]
    later = _only(_decide(log, T0 + 250, spec), StartTransition)
    assert [s.node for s in later] == ["n1", "n2"]


def test_contested_demand_goes_to_the_preferred_side() -> None:
    log = _cluster(3, kubernetes=("n3",))
    # Beyond what each side's idle nodes absorb (n3 for one pod, n1+n2 for two job
    # nodes), each side still wants one more node.
    _pods(log, 2)
    _jobs(log, 3)
    slurm_first = _only(_decide(log, T0, pool_spec(prefer="Slurm")), StartTransition)
    assert [(s.node, s.to_owner) for s in slurm_first] == [("n3", "slurm")]
    k8s_first = _only(_decide(log, T0, pool_spec(prefer="Kubernetes")), StartTransition)
    assert [(s.node, s.to_owner) for s in k8s_first] == [("n1", "kubernetes")]


def test_min_and_max_kubernetes_and_min_slurm() -> None:
    log = _cluster(3)
    starts = _only(_decide(log, T0, pool_spec(min_kubernetes=1)), StartTransition)
    assert [s.reason for s in starts] == ["min_kubernetes is 1"]
    _pods(log, 3)
    capped = _decide(log, T0, pool_spec(min_slurm=2, max_in_flight=3))
    assert len(_only(capped, StartTransition)) == 1
    capped = _decide(log, T0, pool_spec(max_kubernetes=2, max_in_flight=3))
    assert len(_only(capped, StartTransition)) == 2
    lent = _cluster(3, kubernetes=("n1", "n2", "n3"))
    over = _only(_decide(lent, T0, pool_spec(max_kubernetes=1, max_in_flight=5)),
                 StartTransition)
    assert [s.reason for s in over] == ["max_kubernetes is 1"] * 2


def test_no_demand_no_moves() -> None:
    log = _cluster(3, kubernetes=("n3",))
    assert _decide(log, T0) == []


# ------------------------------------------------------------------------ retries


def test_open_actions_are_not_repeated_and_failures_back_off() -> None:
    log = _cluster(1)
    log.add(k8s_obs("n1", tainted=False), 5.0)  # repair: the owner taint went missing
    first = _decide(log, T0)
    assert _actions(first) == [("n1", "kubernetes", "lock")]
    _record(log, first, T0)
    assert _decide(log, T0 + 1000) == []  # open: never requested twice
    lock = first[0]
    assert isinstance(lock, RequestAction)
    _fail(log, lock, T0 + 1, retryable=True)
    assert _decide(log, T0 + 1 + retry_backoff(1) - 0.5) == []
    again = _decide(log, T0 + 1 + retry_backoff(1))
    assert isinstance(again[0], RequestAction) and again[0].attempt == 2


def test_non_retryable_failure_inside_a_transition_aborts_it() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _fail(log, drain, T0 + 1, retryable=False)
    decisions = _decide(log, T0 + 2)
    assert isinstance(decisions[0], AbortTransition)
    assert decisions[0].reason == "the Slurm drain failed"


def test_a_refusal_in_an_earlier_transition_does_not_block_a_new_one() -> None:
    log = _cluster(1)
    _pods(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = first[1]
    assert isinstance(drain, RequestAction)
    _fail(log, drain, T0 + 1, retryable=False)
    aborted = _decide(log, T0 + 2)
    _record(log, aborted, T0 + 2)
    assert isinstance(aborted[0], AbortTransition)
    again = _decide(log, T0 + 400)  # after dwell (300 s)
    assert [type(d) for d in again] == [StartTransition, RequestAction]
    retry = again[1]
    assert isinstance(retry, RequestAction) and retry.verb == "drain" and retry.attempt == 1


# ------------------------------------------------------------------- ids and events


def test_ids_derive_from_the_log_position_and_map_to_events() -> None:
    log = _cluster(2)
    _pods(log, 1)
    state = log.state()
    first = decide(state, [pool_spec()], T0)
    assert first == decide(state, [pool_spec()], T0)
    start = first[0]
    assert isinstance(start, StartTransition)
    assert start.transition_id == f"tx-{state.last_seq}-1"
    event = decision_to_event(first[1])
    assert isinstance(event.payload, ActionRequested) and event.subject == "n1"
    assert event.payload.transition_id == start.transition_id
    aborted = decision_to_event(AbortTransition("t", "n1", POOL, "slurm", "kubernetes", "why"))
    assert isinstance(aborted.payload, TransitionAborted) and aborted.payload.reason == "why"


def test_effective_pools_prefer_the_nodeset_over_config() -> None:
    log = _cluster(1)
    log.add(K8sNodesetObserved(pool=POOL, partitions=("gpu",),
                               ownership=OwnershipSpec(min_slurm=7)), 3.0)
    config = [PoolSpec(name=POOL, partitions=("x",)), PoolSpec(name="a/cfg")]
    pools = effective_pools(log.state(), config)
    assert [p.name for p in pools] == ["a/cfg", POOL]
    assert pools[1].ownership.min_slurm == 7 and pools[1].partitions == ("gpu",)


def test_demand_an_idle_node_already_covers_moves_nothing() -> None:
    """A pod still pending right after its node arrived (the scheduler has not run yet)
    must not pull a second node over; the same for a job and an idle Slurm node."""
    log = _cluster(3, kubernetes=("n3",))
    _pods(log, 1)
    assert _only(_decide(log, T0), StartTransition) == []
    _pods(log, 2)
    assert [s.node for s in _only(_decide(log, T0), StartTransition)] == ["n1"]
    log = _cluster(3, kubernetes=("n3",))
    _jobs(log, 2)
    assert _only(_decide(log, T0), StartTransition) == []


def test_a_pending_pod_already_seen_on_a_node_is_not_demand() -> None:
    """Workload (pod bound to n3) and the pool's pending list are separate observations;
    until the pending list is re-observed it still names the bound pod."""
    log = _cluster(3, kubernetes=("n3",))
    log.add(K8sWorkloadObserved(node="n3", pool=POOL, pods=(PodRef("serving", "p0", "Running"),)),
            3.0)
    _pods(log, 2)  # names p0 (bound on n3 already) and p1
    assert [s.node for s in _only(_decide(log, T0), StartTransition)] == ["n1"]
    _pods(log, 1)  # only p0: nothing is needed
    assert _only(_decide(log, T0), StartTransition) == []


def test_completing_a_lend_does_not_start_another_for_the_same_pod() -> None:
    """The round that completes a lend still sees the pod pending (it lands on the node
    only afterwards): that lend covers it, no second node moves."""
    log = _cluster(3)
    _pods(log, 1)
    first = _decide(log, T0)
    start, drain = first
    assert isinstance(start, StartTransition) and isinstance(drain, RequestAction)
    _record(log, first, T0)
    _succeed(log, drain, T0 + 1)
    log.add(slurm_obs(start.node, "IDLE", ("DRAIN",), drain.arg("reason")), T0 + 2)
    unlock_round = _decide(log, T0 + 3)
    _record(log, unlock_round, T0 + 3)
    unlock = unlock_round[0]
    assert isinstance(unlock, RequestAction) and unlock.verb == "unlock"
    _succeed(log, unlock, T0 + 4)
    log.add(k8s_obs(start.node, tainted=False), T0 + 5)
    completing = _decide(log, T0 + 6)
    assert [type(d) for d in completing] == [CompleteTransition]
