"""The adversarial scenarios of docs/safety.md, one named test each, driven through the
real `decide()` on hand-built logs (helpers from test_domain_policy).

Each test is the scenario an adversary (an admin, an operator, a flaky control plane)
plays against sunkd, and the promise that must hold: a Slurm job and a pod never share a
node unnoticed, and sunkd never undoes what it did not do.
"""

from __future__ import annotations

import dataclasses

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodeObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    LeaderElected,
    PodRef,
    SourceHealth,
    Taint,
)
from sunkd.domain.ownership import assess
from sunkd.domain.policy import (
    REFUSED_RETRY_SECONDS,
    AbortTransition,
    CompleteTransition,
    Decision,
    RequestAction,
    StartTransition,
    decide,
    membership,
    retry_backoff,
)
from sunkd.domain.state import Phase
from tests.unit.domain_world import POOL, Log, k8s_obs, slurm_obs
from tests.unit.test_domain_policy import (
    LEND_DRAIN,
    T0,
    _actions,
    _cluster,
    _decide,
    _fail,
    _jobs,
    _only,
    _pods,
    _record,
    _succeed,
)

HOLD_TAINT = Taint(wk.TAINT_HOLD, wk.TAINT_OWNER_EFFECT, wk.OWNER_SLURM)


def _hold_tainted(node: str, **kwargs: object) -> K8sNodeObserved:
    """A Kubernetes node carrying sunkd's hold taint (its own "cordon")."""
    base = k8s_obs(node, **kwargs)  # type: ignore[arg-type]
    return dataclasses.replace(base, taints=(*base.taints, HOLD_TAINT))


# ----------------------------------------------------------- 1. admin DOWN overwritten


def test_s1_admin_down_is_never_overwritten_by_a_mirror_drain() -> None:
    """`scontrol update state=down reason="bad DIMM"`, then the kubelet goes NotReady:
    DOWN has no DRAIN flag, but the reason is an admin's. No mirror drain replaces it."""
    log = _cluster(1)
    log.add(slurm_obs("n1", "DOWN", reason="bad DIMM"), 5.0)
    log.add(k8s_obs("n1", ready=False), 5.0)
    decisions = _decide(log, T0)
    assert ("n1", "slurm", "drain") not in _actions(decisions)
    assert assess(log.state(), log.state().nodes["n1"], T0).held


def test_s1_no_mirror_drain_on_an_unhealthy_node_without_a_reason() -> None:
    """NOT_RESPONDING / FAIL / DOWN nodes are Slurm's to handle: no mirror drain."""
    for state, flags in (("DOWN", ()), ("IDLE", ("NOT_RESPONDING",)), ("IDLE", ("FAIL",))):
        log = _cluster(1)
        log.add(slurm_obs("n1", state, flags=flags), 5.0)
        log.add(k8s_obs("n1", ready=False), 5.0)
        assert ("n1", "slurm", "drain") not in _actions(_decide(log, T0)), (state, flags)


def test_s1_a_mirror_drain_is_not_removed_while_slurm_reports_the_node_unhealthy() -> None:
    """Our mirror drain on a node that has since gone DOWN: when the kubelet is Ready
    again, sunkd does not take the node back into service while Slurm says it is down."""
    log = _cluster(1)
    log.add(slurm_obs("n1", "DOWN", flags=("DRAIN",), reason="sunkd: k8s NotReady"), 5.0)
    log.add(k8s_obs("n1", ready=True), 6.0)
    verbs = {verb for _node, _side, verb in _actions(_decide(log, T0))}
    assert "resume" not in verbs and "undrain" not in verbs


# ------------------------------------------------------------ 2. operator cordon lifted


def test_s2_any_cordon_is_foreign_and_never_lifted() -> None:
    """`kubectl uncordon` leaves sunkd's old annotation behind; a later human `kubectl
    cordon` sets spec.unschedulable again. sunkd cannot prove that cordon is its own, so it
    is a hold, and sunkd never asks to lift it (its own hold is a taint, not a cordon)."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(k8s_obs("n1", tainted=False, unschedulable=True, cordoned_by_sunkd=True), 5.0)
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert "cordoned" in assessment.k8s_holds
    assert ("n1", "kubernetes", "uncordon") not in _actions(_decide(log, T0))


def test_s2_sunkd_removes_only_its_own_hold_taint() -> None:
    """A Slurm hold mirrored as sunkd's hold taint is removed when the hold clears."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(_hold_tainted("n1", tainted=False), 5.0)
    assert ("n1", "kubernetes", "uncordon") in _actions(_decide(log, T0))


def test_s2_a_slurm_hold_is_mirrored_with_the_hold_taint_even_when_cordoned() -> None:
    """An operator's cordon does not stop sunkd from adding its own hold: the cordon may
    be lifted by the operator at any time, the taint stays until the Slurm hold clears."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="admin: bad fan"), 5.0)
    log.add(k8s_obs("n1", tainted=False, unschedulable=True), 5.0)
    assert ("n1", "kubernetes", "cordon") in _actions(_decide(log, T0))


# -------------------------------------------------- 3. reclaim past the point of no return


def _reclaim_resumed(log: Log) -> None:
    """n1 lent; a reclaim runs until its resume succeeded and Slurm shows it undrained."""
    _jobs(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    lock = next(d for d in first if isinstance(d, RequestAction))
    assert lock.verb == "lock"
    _succeed(log, lock, T0 + 1)
    log.add(k8s_obs("n1", tainted=True), T0 + 1)
    second = _decide(log, T0 + 2)
    _record(log, second, T0 + 2)
    resume = next(d for d in second if isinstance(d, RequestAction))
    assert resume.side == "slurm"
    _succeed(log, resume, T0 + 3)
    log.add(slurm_obs("n1"), T0 + 3)


def test_s3_a_reclaim_resumed_in_slurm_finishes_to_slurm_when_the_node_object_vanishes() -> None:
    log = _cluster(1, kubernetes=("n1",))
    _reclaim_resumed(log)
    log.add(K8sNodeVanished(node="n1"), T0 + 4)
    decisions = _decide(log, T0 + 5)
    assert _only(decisions, AbortTransition) == []
    done = _only(decisions, CompleteTransition)
    assert len(done) == 1 and done[0].to_owner == "slurm"
    _record(log, decisions, T0 + 5)
    assert log.state().nodes["n1"].owner == "slurm"


# ----------------------------------------------------- 4. a job and a pod on one node


def test_s4_a_slurm_job_on_a_lent_node_with_pods_is_held_and_reported() -> None:
    """Someone resumes a lent node in Slurm; a job lands beside the pool pods."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL,
                                pods=(PodRef("serving", "p1", "Running"),)), 5.0)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 6.0)
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert assessment.phase == Phase.HELD
    assert any("conflict" in reason for reason in assessment.hold_reasons)
    verbs = [verb for node, _side, verb in _actions(_decide(log, T0)) if node == "n1"]
    assert "warn" in verbs  # an Event on the node (and the request is the audit record)
    assert "drain" in verbs  # and no more jobs land on it


def test_s4_pods_on_a_busy_slurm_node_are_a_conflict_too() -> None:
    log = _cluster(1)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 5.0)
    log.add(K8sWorkloadObserved(node="n1", pool="",
                                pods=(PodRef("other", "web", "Running", pool_pod=False),)), 6.0)
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert any("conflict" in reason for reason in assessment.hold_reasons)
    assert "warn" in [verb for _n, _s, verb in _actions(_decide(log, T0))]


# --------------------------------------------- 5. a re-created Node is schedulable at once


def test_s5_a_recreated_node_is_tainted_even_while_not_ready() -> None:
    log = _cluster(1)
    log.add(K8sNodeVanished(node="n1"), 5.0)
    log.add(k8s_obs("n1", ready=False, tainted=False), 6.0)
    assert ("n1", "kubernetes", "lock") in _actions(_decide(log, T0))


# -------------------------------------------- 6. freshness carried across leadership terms


def test_s6_a_new_leader_does_not_act_on_the_previous_terms_health() -> None:
    log = _cluster(2)
    _pods(log, 2)
    assert _decide(log, T0) != []  # the old term (epoch 1) could act
    log.add(LeaderElected(epoch=2, identity="b"), 10.0, subject="leader", epoch=2)
    assert _decide(log, T0) == []  # the new term has observed nothing yet
    for source in ("slurm", "kubernetes"):
        log.add(SourceHealth(source=source, status="fresh"), 11.0, subject=source, epoch=2)
    assert _decide(log, T0) != []


# ------------------------------------------------------- 9. non-pool pods and a reclaim


def test_s9_a_reclaim_waits_for_and_evicts_non_pool_pods_too() -> None:
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool="",
                                pods=(PodRef("other", "web", "Running", pool_pod=False),)), 5.0)
    _jobs(log, 1)
    first = _decide(log, T0)
    _record(log, first, T0)
    lock = next(d for d in first if isinstance(d, RequestAction))
    _succeed(log, lock, T0 + 1)
    log.add(k8s_obs("n1", tainted=True), T0 + 1)
    # The non-pool pod still runs: no resume yet; after reclaim_grace it is evicted.
    soon = _actions(_decide(log, T0 + 2))
    assert ("n1", "slurm", "resume") not in soon and ("n1", "slurm", "undrain") not in soon
    late = _decide(log, T0 + 10_000)
    evict = [d for d in late if isinstance(d, RequestAction) and d.verb == "evict"]
    assert evict and "other/web" in [a.value for a in evict[0].args if a.key == "pod"]


def test_s4_a_conflict_is_counted_in_the_metrics() -> None:
    from prometheus_client import generate_latest

    from sunkd.api.metrics import Metrics
    from tests.unit.domain_world import pool_spec

    log = _cluster(2, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL,
                                pods=(PodRef("serving", "p1", "Running"),)), 5.0)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 6.0)
    metrics = Metrics()
    metrics.set_state(log.state(), T0, [pool_spec()])
    text = generate_latest(metrics.registry).decode()
    assert f'sunkd_nodes_in_conflict{{pool="{POOL}"}} 1.0' in text


# ------------------------------------------- hostile input 12.2: a stolen node identity


def test_h2_two_nodes_claiming_one_slurm_name_are_held_and_nothing_acts() -> None:
    """A second Node labelled sunkd.io/slurm-node-name=n1 must not take over n1's identity:
    both claims are a conflict, the node is HELD, reported, and no action touches it."""
    log = _cluster(1)
    impostor = dataclasses.replace(k8s_obs("n1", tainted=False), node="impostor")
    log.add(impostor, 5.0)
    state = log.state()
    node = state.nodes["n1"]
    assert node.k8s_name == "n1"  # the first claimant keeps the identity ...
    assessment = assess(state, node, T0)
    assert assessment.held and any("identity" in r for r in assessment.hold_reasons)
    _jobs(log, 0)
    _pods(log, 3)  # demand that would otherwise lend n1
    verbs = [verb for node_name, _side, verb in _actions(_decide(log, T0))]
    assert verbs == ["warn"]  # ... and only a Warning goes out
    log.add(K8sNodeVanished(node="impostor"), 6.0)  # resolved: the impostor is deleted
    state = log.state()
    assert not assess(state, state.nodes["n1"], T0).held


# --------------------------------------------- hostile input 12.10: smaller domain holes


def test_h10_an_unknown_slurm_state_is_held_not_idle() -> None:
    log = _cluster(1)
    log.add(slurm_obs("n1", "BOGUS"), 5.0)
    _pods(log, 2)
    state = log.state()
    assert assess(state, state.nodes["n1"], T0).held
    assert _only(_decide(log, T0), StartTransition) == []


def test_h10_a_node_two_pools_select_is_a_reported_conflict_not_a_silent_takeover() -> None:
    """A Nodeset in another namespace selecting the same nodes: neither pool drives them."""
    from tests.unit.domain_world import pool_spec

    log = _cluster(1)
    _pods(log, 2)
    ours = pool_spec()
    theirs = dataclasses.replace(pool_spec(), name="other-team/gpu")
    decisions = decide(log.state(), [ours, theirs], T0)
    assert _only(decisions, StartTransition) == []
    warns = [d for d in decisions if isinstance(d, RequestAction) and d.verb == "warn"]
    assert len(warns) == 1 and "other-team/gpu" in warns[0].reason
    assert membership(log.state(), [ours, theirs]) == {}



# ------------------------------------------- a Warning Event the API server did not take


def _warns(decisions: list[Decision]) -> list[RequestAction]:
    return [d for d in decisions if isinstance(d, RequestAction) and d.verb == "warn"]


def test_a_conflict_warning_that_failed_is_retried_with_backoff_not_after_600s() -> None:
    """The Event saying "a job and a pod share this node" was refused (an outage, 429):
    the warning is asked again after the usual retry backoff, not a standing 600 s."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL,
                                pods=(PodRef("serving", "p1", "Running"),)), 5.0)
    log.add(slurm_obs("n1", "ALLOCATED", flags=("DRAIN",), reason=LEND_DRAIN,
                      alloc_cpus=8), 6.0)
    first = _decide(log, T0)
    _record(log, first, T0)
    [warn] = _warns(first)
    _fail(log, warn, T0 + 1, retryable=True)
    assert _warns(_decide(log, T0 + 1 + retry_backoff(1) - 0.5)) == []
    [again] = _warns(_decide(log, T0 + 1 + retry_backoff(1)))
    assert again.attempt == 2 and again.arg("event_reason") == wk.EVENT_CONFLICT
    # A refusal (403: sunkd may not post Events) is asked again after the long pause.
    _record(log, [again], T0 + 10)
    _fail(log, again, T0 + 11, retryable=False)
    assert _warns(_decide(log, T0 + 11 + retry_backoff(5))) == []
    assert len(_warns(_decide(log, T0 + 11 + REFUSED_RETRY_SECONDS))) == 1


def test_a_pool_conflict_warning_that_failed_is_retried_with_backoff() -> None:
    from tests.unit.domain_world import pool_spec

    log = _cluster(1)
    pools = [pool_spec(), dataclasses.replace(pool_spec(), name="other-team/gpu")]
    first = decide(log.state(), pools, T0)
    _record(log, first, T0)
    [warn] = _warns(first)
    _fail(log, warn, T0 + 1, retryable=True)
    [again] = _warns(decide(log.state(), pools, T0 + 1 + retry_backoff(1)))
    assert again.attempt == 2 and again.arg("event_reason") == wk.EVENT_POOL_CONFLICT


# --------------------------------------------------- bounded growth (issue 15, item 4)


def test_a_node_gone_from_both_sides_is_forgotten_after_a_grace() -> None:
    from sunkd.domain.events import SlurmNodeVanished
    from sunkd.domain.policy import FORGET_AFTER_SECONDS, ForgetNode

    log = _cluster(2)
    log.add(SlurmNodeVanished(node="n2"), 10.0)
    log.add(K8sNodeVanished(node="n2"), 11.0)
    assert _only(_decide(log, 11.0 + FORGET_AFTER_SECONDS - 1), ForgetNode) == []
    decisions = _decide(log, 11.0 + FORGET_AFTER_SECONDS)
    assert [d.node for d in _only(decisions, ForgetNode)] == ["n2"]
    _record(log, decisions, 11.0 + FORGET_AFTER_SECONDS)
    state = log.state()
    assert "n2" not in state.nodes and "n2" not in state.k8s_names
    assert "n1" in state.nodes
    # It may come back: a new sighting starts it afresh.
    log.add(k8s_obs("n2"), 20_000.0)
    assert log.state().nodes["n2"].owner == "none"
