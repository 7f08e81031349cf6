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
    SlurmNodeObserved,
    SourceHealth,
    Taint,
)
from sunkd.domain.ownership import assess
from sunkd.domain.policy import (
    REFUSED_RETRY_SECONDS,
    AbortTransition,
    CompleteTransition,
    Decision,
    PoolSpec,
    RequestAction,
    StartTransition,
    decide,
    membership,
    retry_backoff,
)
from sunkd.domain.state import Phase
from tests.unit.domain_world import POOL, Log, k8s_obs, slurm_obs, sunkd_held
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
    log.add(k8s_obs("n1", tainted=False, unschedulable=True, held_by_sunkd=True), 5.0)
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert "cordoned" in assessment.k8s_holds
    assert ("n1", "kubernetes", "uncordon") not in _actions(_decide(log, T0))


def test_s2_sunkd_removes_only_its_own_hold_taint() -> None:
    """A Slurm hold mirrored as sunkd's hold taint is removed when the hold clears."""
    log = _cluster(1, kubernetes=("n1",))
    sunkd_held(log, "n1", 5.0)
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


# --------------------------------------------------- bounded growth (item 4)


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


# ------------------------------------- fail closed on what sunkd cannot see: bad pins


def test_h6_a_pin_spelled_like_the_pool_mode_is_invalid_and_keeps_the_node() -> None:
    """`sunkd.io/pin: Slurm` (the pool mode's spelling) is no pin sunkd knows: only
    slurm|kubernetes|auto are. It must not read as "no pin" (the node would be lent while
    status says "pinned to Slurm"): it is an invalid pin, reported, shown, and the node
    stays where it is."""
    from sunkd.api.app import node_json
    from sunkd.cli.operator import status_rows
    from sunkd.runtime.config import Settings

    log = _cluster(1)
    log.add(k8s_obs("n1", pin="Slurm"), 5.0)
    _pods(log, 2)  # demand that would otherwise lend n1
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert assessment.invalid_pin == "Slurm"
    decisions = _decide(log, T0)
    assert _only(decisions, StartTransition) == []
    warns = [d for d in decisions if isinstance(d, RequestAction) and d.verb == "warn"]
    assert len(warns) == 1 and warns[0].arg("event_reason") == "SunkdInvalidPin"
    assert "'Slurm'" in (warns[0].arg("message") or "")
    row = status_rows(state, Settings(), T0)[0]
    assert "invalid pin 'Slurm'" in row["reason"] and "pinned to Slurm" not in row["reason"]
    shown = node_json(state, state.nodes["n1"], POOL, T0)
    assert shown["pin"]["valid"] is False and "invalid pin" in shown["pin"]["problem"]
    from prometheus_client import generate_latest

    from sunkd.api.metrics import Metrics
    from tests.unit.domain_world import pool_spec

    metrics = Metrics()
    metrics.set_state(state, T0, [pool_spec()])
    assert f'sunkd_nodes_invalid_pin{{pool="{POOL}"}} 1.0' in generate_latest(
        metrics.registry).decode()


def test_a_node_whose_quantities_did_not_parse_is_warned_and_counted() -> None:
    """A pool Node whose allocatable does not parse (`cpu: NaN`) has unknown capacity:
    besides the source's log line, it is said on the node (a `SunkdUnparsedQuantity`
    Warning naming the resource, again every 10 minutes while it lasts) and counted
    (`sunkd_nodes_quantity_unparsed`), as every other thing sunkd cannot trust is."""
    from prometheus_client import generate_latest

    from sunkd.api.metrics import Metrics
    from tests.unit.domain_world import pool_spec

    log = _cluster(2)
    log.add(dataclasses.replace(k8s_obs("n1"), cpu_millis=0, unparsed=("cpu", "memory")),
            5.0)
    decisions = _decide(log, T0)
    warns = [d for d in decisions if isinstance(d, RequestAction) and d.verb == "warn"]
    assert [(w.node, w.arg("event_reason")) for w in warns] == [
        ("n1", "SunkdUnparsedQuantity")]
    message = warns[0].arg("message") or ""
    assert "cpu" in message and "memory" in message and "unknown" in message, message
    _record(log, decisions, T0)
    _succeed(log, warns[0], T0 + 1)

    def warned(now: float) -> list[str]:
        return [d.node for d in _decide(log, now)
                if isinstance(d, RequestAction) and d.verb == "warn"]

    assert warned(T0 + 60) == []  # said: not again within the period
    assert warned(T0 + 700) == ["n1"]  # and again after it, while it lasts
    metrics = Metrics()
    metrics.set_state(log.state(), T0, [pool_spec()])
    exported = generate_latest(metrics.registry).decode()
    assert f'sunkd_nodes_quantity_unparsed{{pool="{POOL}"}} 1.0' in exported, exported


def test_h6_an_invalid_pin_aborts_a_move_away_like_a_pin_to_the_current_owner() -> None:
    """A lend not yet past its point of no return stops when an invalid pin appears (as
    for `sunkd.io/pin: slurm`); the node is not handed over."""
    log = _cluster(1)
    _pods(log, 2)
    first = _decide(log, T0)
    assert _only(first, StartTransition)
    _record(log, first, T0)
    log.add(k8s_obs("n1", pin="kubernetes "), T0 + 1)  # a stray blank is no valid pin
    later = _decide(log, T0 + 2)
    aborted = _only(later, AbortTransition)
    assert len(aborted) == 1 and "invalid pin" in aborted[0].reason
    assert _only(later, CompleteTransition) == []


def test_h6_an_operator_pinned_event_with_a_bad_target_is_an_invalid_pin() -> None:
    """`operator.pinned` rows come from `sunkd pin` (argparse allows slurm|kubernetes|auto
    only), but the log may hold one written otherwise: the fold keeps it, it pins nothing
    and moves nothing."""
    from sunkd.domain.events import OperatorPinned

    log = _cluster(1, kubernetes=("n1",))
    log.add(OperatorPinned(node="n1", to="SLURM", who="op", why="typo"), 5.0)
    _jobs(log, 1)  # demand that would otherwise reclaim n1
    state = log.state()
    assert assess(state, state.nodes["n1"], T0).invalid_pin == "SLURM"
    assert _only(_decide(log, T0), StartTransition) == []


def test_h6_sunkd_pin_accepts_only_the_valid_targets() -> None:
    import pytest

    from sunkd.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["pin", "n1", "--to", "slurm", "--reason", "x"]).to == "slurm"
    with pytest.raises(SystemExit):
        parser.parse_args(["pin", "n1", "--to", "Slurm", "--reason", "x"])


# ------------------------- fail closed on what sunkd cannot see: a stale admin reason


def test_h7_a_stale_admin_reason_on_a_healthy_node_does_not_block_the_mirror_drain() -> None:
    """Slurm 24.11 keeps an admin's reason after `scontrol update state=resume`: the node is
    IDLE, undrained, healthy, and the old text ("bad DIMM") protects nothing any more
    (`ownership.foreign_word`, the actuator's test). A later NotReady or cordon must still
    be mirrored as a Slurm drain, or Slurm keeps scheduling onto a node Kubernetes holds."""
    for k8s in (k8s_obs("n1", ready=False), k8s_obs("n1", unschedulable=True)):
        log = _cluster(1)
        log.add(slurm_obs("n1", "IDLE", reason="bad DIMM"), 5.0)
        log.add(k8s, 6.0)
        state = log.state()
        assert assess(state, state.nodes["n1"], T0).k8s_holds
        drains = [d for d in _decide(log, T0)
                  if isinstance(d, RequestAction) and d.verb == "drain"]
        assert len(drains) == 1, k8s
        assert (drains[0].arg("reason") or "").startswith(wk.REASON_MIRROR)


def test_h7_an_admin_reason_that_still_means_something_is_never_drained_over() -> None:
    """The same reason on a drained or unhealthy node is the admin's word: no mirror."""
    for slurm in (slurm_obs("n1", "IDLE", flags=("DRAIN",), reason="bad DIMM"),
                  slurm_obs("n1", "DOWN", reason="bad DIMM")):
        log = _cluster(1)
        log.add(slurm, 5.0)
        log.add(k8s_obs("n1", ready=False), 6.0)
        assert ("n1", "slurm", "drain") not in _actions(_decide(log, T0)), slurm


# ------------------- fail closed on what sunkd cannot see: a conflict on a node in no pool


def _two_pools() -> list[PoolSpec]:
    from tests.unit.domain_world import pool_spec

    return [pool_spec(), dataclasses.replace(pool_spec(), name="other-team/gpu")]


def test_h9_a_conflict_on_a_node_two_pools_select_is_warned_and_repaired() -> None:
    """A node two Nodesets select belongs to neither, but a Slurm job beside a pod there is
    still the one thing sunkd exists to prevent: a `SunkdConflict` Warning (naming the pool
    conflict too), and the repair the node's owner calls for: a lent node is drained again
    in Slurm so no more jobs land."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL,
                                pods=(PodRef("serving", "p1", "Running"),)), 5.0)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 6.0)  # resumed by someone; a job
    decisions = decide(log.state(), _two_pools(), T0)
    warns = [d for d in decisions if isinstance(d, RequestAction) and d.verb == "warn"]
    assert len(warns) == 1 and warns[0].arg("event_reason") == wk.EVENT_CONFLICT
    assert "other-team/gpu" in (warns[0].arg("message") or "")
    assert ("n1", "slurm", "drain") in _actions(decisions)
    assert _only(decisions, StartTransition) == []


def test_h9_pods_on_a_busy_slurm_owned_node_two_pools_select_are_evicted() -> None:
    """The same on a Slurm-owned node: the Warning first, then its pods are evicted (the
    node's owner decides, as for a node of one pool)."""
    log = _cluster(1)
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 5.0)
    log.add(K8sWorkloadObserved(node="n1", pool=POOL,
                                pods=(PodRef("serving", "p1", "Running"),)), 6.0)
    first = decide(log.state(), _two_pools(), T0)
    warn = next(d for d in first if isinstance(d, RequestAction) and d.verb == "warn")
    assert warn.arg("event_reason") == wk.EVENT_CONFLICT
    _record(log, first, T0)
    _succeed(log, warn, T0 + 1)
    evicts = [d for d in decide(log.state(), _two_pools(), T0 + 2)
              if isinstance(d, RequestAction) and d.verb == "evict"]
    assert evicts and "serving/p1" in [a.value for a in evicts[0].args if a.key == "pod"]


# ------------ fail closed on what sunkd cannot see: a node that left every pool, marked


def _adopted_in_a_pool(slurm: SlurmNodeObserved, k8s: K8sNodeObserved) -> Log:
    """A pool-aware log (a Nodeset, fresh sources) with n1 observed so and adopted."""
    from tests.unit.domain_world import sunkd_drained, sunkd_held
    from tests.unit.test_domain_bounded import _adopted, _aware, _fresh, _nodeset

    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    # sunkd's own marks come with the log's proof that sunkd wrote them (authorship).
    if "DRAIN" in slurm.flags and (slurm.reason or "").startswith("sunkd:"):
        sunkd_drained(log, "n1", slurm.reason or "", 0.9)
    if any(t.key == wk.TAINT_HOLD for t in k8s.taints):
        sunkd_held(log, "n1", 0.9)
    log.add(slurm, 1.0)
    log.add(k8s, 1.0)
    _adopted(log, "n1", 2.0)
    return log


def test_h13_a_node_that_left_every_pool_keeps_sunkds_marks_in_view_and_is_not_forgotten(
) -> None:
    """sunkd mirrored a NotReady as a `sunkd:` drain; then the node left every pool. It
    must not be forgotten (nor vanish from `sunkd status`) while it carries a mark sunkd
    made: Slurm would have lost the node to a drain no view shows. sunkd removes its drain
    once nothing of its own needs it (the kubelet is back), and says what stays."""
    from sunkd.cli.operator import status_rows
    from sunkd.domain.policy import FORGET_AFTER_SECONDS, ForgetNode
    from sunkd.runtime.config import Settings
    from tests.unit.domain_world import pool_spec
    from tests.unit.test_domain_bounded import OTHER

    mirror = "sunkd: k8s NotReady"
    log = _adopted_in_a_pool(slurm_obs("n1", flags=("DRAIN",), reason=mirror),
                             k8s_obs("n1", ready=False))
    log.add(dataclasses.replace(k8s_obs("n1", ready=False), labels=(OTHER,)), T0)  # no pool
    later = T0 + 2 * FORGET_AFTER_SECONDS
    decisions = decide(log.state(), [pool_spec()], later)
    assert _only(decisions, ForgetNode) == []
    assert ("n1", "slurm", "resume") not in _actions(decisions)  # NotReady: still needed
    rows = {row["node"]: row for row in status_rows(log.state(), Settings(), later)}
    assert rows["n1"]["pool"] is None
    assert "in no pool" in rows["n1"]["reason"] and mirror in rows["n1"]["reason"]

    log.add(dataclasses.replace(k8s_obs("n1"), labels=(OTHER,)), later)  # kubelet back
    resumes = [d for d in decide(log.state(), [pool_spec()], later + 1)
               if isinstance(d, RequestAction) and d.verb == "resume"]
    assert len(resumes) == 1 and resumes[0].arg("expect_reason") == mirror
    log.add(slurm_obs("n1"), later + 2)  # undrained
    # The owner taint stays (Slurm may run jobs there: pods must stay off), so the node
    # is still not forgotten, and status says why.
    final = later + 3 + FORGET_AFTER_SECONDS
    assert _only(decide(log.state(), [pool_spec()], final), ForgetNode) == []
    rows = {row["node"]: row for row in status_rows(log.state(), Settings(), final)}
    assert wk.TAINT_OWNER in rows["n1"]["reason"] and "kept" in rows["n1"]["reason"]


def test_h13_sunkds_hold_taint_on_a_node_that_left_every_pool_goes_once_the_hold_clears(
) -> None:
    from sunkd.domain.policy import FORGET_AFTER_SECONDS, ForgetNode
    from tests.unit.domain_world import pool_spec
    from tests.unit.test_domain_bounded import OTHER

    log = _adopted_in_a_pool(slurm_obs("n1"), k8s_obs("n1", tainted=False, hold_tainted=True))
    log.add(dataclasses.replace(k8s_obs("n1", tainted=False, hold_tainted=True),
                                labels=(OTHER,)), T0)
    decisions = decide(log.state(), [pool_spec()], T0 + 2 * FORGET_AFTER_SECONDS)
    assert _only(decisions, ForgetNode) == []
    assert ("n1", "kubernetes", "uncordon") in _actions(decisions)


def test_h13_a_node_an_older_sunkd_forgot_with_its_drain_on_is_still_shown() -> None:
    """A log where the node was forgotten with sunkd's mirror drain on (before this rule):
    it is a compact record now, but `sunkd status` still lists it with the mark."""
    from sunkd.cli.operator import status_rows
    from sunkd.domain.events import NodeForgotten
    from sunkd.runtime.config import Settings
    from tests.unit.test_domain_bounded import OTHER

    mirror = "sunkd: k8s NotReady"
    log = _adopted_in_a_pool(slurm_obs("n1", flags=("DRAIN",), reason=mirror),
                             dataclasses.replace(k8s_obs("n1", tainted=False), labels=(OTHER,)))
    log.add(NodeForgotten(node="n1", reason="in no pool for 3600 s"), T0)
    state = log.state()
    assert "n1" in state.unpooled
    rows = {row["node"]: row for row in status_rows(state, Settings(), T0)}
    assert "n1" in rows and mirror in rows["n1"]["reason"]


# ----------------- found by the adversaries: no resume while Slurm reports the node unhealthy


def test_an_aborted_lend_does_not_resume_a_node_slurm_reports_unhealthy() -> None:
    """A lend has drained the node; Slurm then reports it DOWN+FAIL (still within the
    unhealthy grace, so not yet HELD) and the operator pins it to slurm. The lend is
    aborted, but sunkd's drain stays until Slurm reports the node healthy: a node Slurm
    says is broken is Slurm's to handle (as for the mirror drain). Then it is resumed."""
    log = _cluster(1)
    _pods(log, 2)
    first = _decide(log, T0)
    _record(log, first, T0)
    drain = next(d for d in first if isinstance(d, RequestAction) and d.verb == "drain")
    _succeed(log, drain, T0 + 1)
    reason = drain.arg("reason")
    log.add(slurm_obs("n1", "DOWN", flags=("DRAIN", "FAIL"), reason=reason), T0 + 2)
    log.add(k8s_obs("n1", pin="slurm"), T0 + 2)
    decisions = _decide(log, T0 + 3)
    assert len(_only(decisions, AbortTransition)) == 1
    assert ("n1", "slurm", "resume") not in _actions(decisions)
    _record(log, decisions, T0 + 3)
    assert ("n1", "slurm", "resume") not in _actions(_decide(log, T0 + 4))
    log.add(slurm_obs("n1", "IDLE", flags=("DRAIN",), reason=reason), T0 + 5)  # healthy
    assert ("n1", "slurm", "resume") in _actions(_decide(log, T0 + 6))
