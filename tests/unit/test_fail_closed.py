"""Fail closed on what sunkd cannot see: one named test per hole an adversarial review
found in the ownership model (pods per Kubernetes Node, unknown is not none, one Slurm
vocabulary), driven through the real fold and `decide()`.

The source side of the same holes (every Node's pods are reported, whatever pool
attributes it) is tests/integration/test_kube_source_fail_closed.py.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    K8sNodeObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    OperatorPinned,
    PodRef,
    SlurmNodeObserved,
    SourceHealth,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.ownership import assess, running_pods, slurm_drained
from sunkd.domain.policy import PoolSpec, RequestAction, decide
from sunkd.domain.ports import ActionError
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import OpenAction, Phase
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.model import SlurmNode
from tests.unit.domain_world import (
    PARTITION,
    POOL,
    Log,
    k8s_obs,
    pool_spec,
    slurm_obs,
    sunkd_drained,
)
from tests.unit.test_domain_policy import (
    LEND_DRAIN,
    T0,
    _actions,
    _cluster,
    _decide,
    _jobs,
    _pods,
    _record,
    _succeed,
)

POD = PodRef("serving", "p1", "Running", uid="u1")
LATE = PodRef("web", "late", "Running", uid="u2", pool_pod=False)  # bound by spec.nodeName
# A pool as a config file defines it, or a Nodeset with only slurm.partitions: no
# node selector, so no Nodeset selector attributes its Nodes.
PARTITION_POOL = PoolSpec(name=POOL, partitions=(PARTITION,))


def _lent_without_pod_report(log: Log, name: str = "n1") -> None:
    """A node lent to Kubernetes whose Node never had its pods reported."""
    sunkd_drained(log, name, LEND_DRAIN, 0.9)  # the log's proof that the drain is sunkd's
    log.add(slurm_obs(name, flags=("DRAIN",), reason=LEND_DRAIN), 1.0)
    log.add(k8s_obs(name, tainted=False), 1.0)
    log.add(TransitionStarted(transition_id=f"adopt-{name}", node=name, pool=POOL,
                              from_owner="none", to_owner="kubernetes"), 2.0)
    log.add(TransitionCompleted(transition_id=f"adopt-{name}", node=name), 2.0)


def _fresh_log() -> Log:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    return log


def _reclaim_until_tainted(log: Log, pool: PoolSpec | None = None) -> None:
    """Slurm demand starts a reclaim; its lock succeeds and the taint is observed."""
    _jobs(log, 1)
    first = decide(log.state(), [pool or PARTITION_POOL], T0)
    _record(log, first, T0)
    lock = next(d for d in first if isinstance(d, RequestAction) and d.verb == "lock")
    _succeed(log, lock, T0 + 1)
    log.add(k8s_obs("n1", tainted=True), T0 + 1)


def _resumes(log: Log, now: float, pool: PoolSpec | None = None) -> bool:
    decisions = decide(log.state(), [pool or PARTITION_POOL], now)
    return ("n1", "slurm", "resume") in _actions(decisions)


# ------------------------------------------ 1. a pool no Nodeset selector describes


def test_hole1_a_node_whose_pods_were_never_reported_is_unknown_and_never_resumed() -> None:
    """A config-file (or partition-only) pool: the Node's pods were never reported.
    Before, "no report" read as "no pods": a reclaim resumed Slurm beside the pod."""
    log = _fresh_log()
    log.auto_pods = False
    _lent_without_pod_report(log)
    _jobs(log, 1)
    state = log.state()
    assessment = assess(state, state.nodes["n1"], T0)
    assert assessment.phase == Phase.UNKNOWN
    assert any(r.startswith("pods unknown") for r in assessment.unknown_reasons)
    for now in (T0, T0 + 2, T0 + 10_000):
        decisions = decide(log.state(), [PARTITION_POOL], now)
        assert [d for d in decisions if getattr(d, "node", "") == "n1"] == [], decisions


def test_hole1_once_the_node_reports_its_pod_the_reclaim_waits_for_it() -> None:
    log = _fresh_log()
    log.auto_pods = False
    _lent_without_pod_report(log)
    log.add(K8sWorkloadObserved(node="n1", pods=(POD,)), 3.0)
    _reclaim_until_tainted(log)
    assert not _resumes(log, T0 + 2)
    late = decide(log.state(), [PARTITION_POOL], T0 + 10_000)
    assert ("n1", "kubernetes", "evict") in _actions(late)
    assert ("n1", "slurm", "resume") not in _actions(late)


# ------------------------------------------------- 2. membership changes mid-reclaim

ELSEWHERE = Label("sunkd.io/pool", "elsewhere")  # an edited selector: matches no Node


@pytest.mark.parametrize("change", ["relabelled", "nodeset deleted", "selector edited"])
def test_hole2_a_pod_bound_after_membership_changed_mid_reclaim_is_never_resumed_beside(
        change: str) -> None:
    """While a reclaim waits for its pool pod, the Node is relabelled out of its Nodeset,
    the Nodeset is deleted, or its selector edited; then a pod binds by spec.nodeName (no
    scheduler, tolerating the owner taint) and the pool pod ends. The node stays in its
    transition, the late pod's report counts, and Slurm never gets the node beside it.

    The hole itself was the source's (it stopped reporting the Node's pods once no
    selector matched: tests/integration/test_kube_source_fail_closed.py); this holds the
    domain's side of it, which kept the node and counted the report before too."""
    selector_pool = pool_spec(reclaim_grace_seconds=60.0)
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pods=(POD,)), 3.0)
    _reclaim_until_tainted(log, selector_pool)
    pools = [selector_pool]
    if change == "relabelled":
        log.add(dataclasses.replace(k8s_obs("n1", tainted=True), labels=()), T0 + 2)
    elif change == "nodeset deleted":
        pools = []
    else:
        pools = [dataclasses.replace(selector_pool, node_selector=(ELSEWHERE,))]
    log.add(K8sWorkloadObserved(node="n1", pods=(POD, LATE)), T0 + 3)
    log.add(K8sWorkloadObserved(node="n1", pods=(LATE,)), T0 + 4)  # the pool pod ended
    for now in (T0 + 5, T0 + 30, T0 + 10_000):
        decisions = decide(log.state(), pools, now)
        assert ("n1", "slurm", "resume") not in _actions(decisions), (change, now, decisions)
    assert ("n1", "kubernetes", "evict") in _actions(decide(log.state(), pools, T0 + 10_000))


# ------------------------------------------------------- 3. an identity rival


def test_hole3_a_rivals_empty_report_never_erases_the_real_nodes_pods() -> None:
    """A second Node labelled with n1's Slurm name (a copy-paste typo, fixed later):
    its empty pod report must not replace the pods running on the real n1."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pods=(POD,)), 3.0)
    rival = K8sNodeObserved(node="typo", slurm_node="n1", ready=True, labels=())
    log.add(rival, 4.0)
    log.add(K8sWorkloadObserved(node="typo", pods=()), 4.0)
    assert running_pods(log.state().nodes["n1"]) == ["serving/p1"]
    log.add(K8sNodeObserved(node="typo", slurm_node="typo", ready=True, labels=()), 5.0)
    assert running_pods(log.state().nodes["n1"]) == ["serving/p1"]
    _reclaim_until_tainted(log)
    assert not _resumes(log, T0 + 2)


def test_hole3_a_claim_changing_hands_is_unknown_until_the_successor_reports() -> None:
    """The real Node is deleted while a rival claims its name: the rival becomes the
    node's Kubernetes side, but what ran there is unknown until it reports again."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pods=(POD,)), 3.0)
    log.add(K8sNodeObserved(node="typo", slurm_node="n1", ready=True, labels=()), 4.0)
    log.add(K8sWorkloadObserved(node="typo", pods=()), 4.0)
    log.add(K8sNodeVanished(node="n1"), 5.0)
    node = log.state().nodes["n1"]
    assert node.k8s_name == "typo" and node.pods is None
    assessment = assess(log.state(), node, T0)
    assert assessment.phase == Phase.UNKNOWN
    assert decide(log.state(), [PARTITION_POOL], T0) == [] or all(
        getattr(d, "node", "") != "n1" for d in decide(log.state(), [PARTITION_POOL], T0))
    log.add(K8sWorkloadObserved(node="typo", pods=()), 6.0)  # the successor reports
    assert log.state().nodes["n1"].pods == ()


# --------------------------------------------- 4. a node moved from pool to pool


def test_hole4_a_report_replaces_the_nodes_whole_pod_list_whatever_pool_it_names() -> None:
    """Reports written before per-Node reports named the Node's pool: a node moved from
    one pool to another kept the old pool's pods for good (a reclaim evicted them for
    ever, a job beside them was a false conflict)."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=(POD,)), 3.0)
    log.add(K8sWorkloadObserved(node="n1", pool="default/other", pods=()), 4.0)
    state = log.state()
    assert running_pods(state.nodes["n1"]) == []
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 5.0)
    state = log.state()
    assert not assess(state, state.nodes["n1"], T0).conflicts
    # and the fold's pods survive a snapshot round trip
    assert state_from_json(state_to_json(state)) == state


# ----------------------------- 8. in contact: a slurmd that died keeps its job steps


def test_hole8_a_lend_never_unlocks_a_node_slurm_lost_contact_with() -> None:
    """Lending: the node is drained, but slurmd stopped answering (NOT_RESPONDING, or
    DOWN) a second ago, within the 30 s grace before it counts as held. Job steps may
    still run there: no unlock until Slurm is in contact again."""
    for state, flags in (("IDLE", ("DRAIN", "NOT_RESPONDING")), ("DOWN", ("DRAIN",)),
                         ("IDLE", ("DRAIN", "POWERING_DOWN"))):
        log = _cluster(1)
        _pods(log, 1)
        first = _decide(log, T0)
        _record(log, first, T0)
        drain = next(d for d in first if isinstance(d, RequestAction) and d.verb == "drain")
        _succeed(log, drain, T0 + 1)
        wrote = {a.key: a.value for a in drain.args}.get("reason") or drain.reason
        log.add(slurm_obs("n1", state, flags=flags, reason=wrote), T0 + 2)
        verbs = _actions(_decide(log, T0 + 5))
        assert ("n1", "kubernetes", "unlock") not in verbs, (state, flags, verbs)


# ------------------------------------------- one definition of "drained" everywhere

_STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN", "COMPLETING", "FUTURE",
                           "UNKNOWN", "ERROR", "PLANNED", "WEIRD"])
_FLAGS = st.frozensets(st.sampled_from(["DRAIN", "UNDRAIN", "COMPLETING", "NOT_RESPONDING",
                                        "FAIL", "POWERED_DOWN", "POWERING_UP",
                                        "MAINTENANCE", "RESERVED"]))


@given(state=_STATES, flags=_FLAGS, alloc=st.integers(0, 4), reason=st.sampled_from(
    [None, "sunkd: lend", "bad DIMM"]))
def test_the_executors_recheck_and_the_policy_agree_on_drained(
        state: str, flags: frozenset[str], alloc: int, reason: str | None) -> None:
    """The executor asks Slurm again right before a handover (`SlurmNode.is_drained`);
    the policy decided on `slurm_drained`. One definition: they never disagree, so the
    policy can never request an unlock the executor refuses for ever."""
    node = SlurmNode(name="n1", state=state, flags=flags, reason=reason, cpus=8,
                     alloc_cpus=alloc)
    observed = node.to_observed()
    assert isinstance(observed, SlurmNodeObserved)
    assert node.is_drained == slurm_drained(observed)


class _OneNodeSlurm:
    """What `GET /nodes` returns right before the handover: one node."""

    def __init__(self, node: SlurmNode) -> None:
        self.node = node

    async def get_nodes(self) -> list[SlurmNode]:
        return [self.node]


class _Unlocks:
    """The Kubernetes side of the handover: records the unlocks that went out."""

    def __init__(self) -> None:
        self.unlocked: list[str] = []

    async def unlock(self, node: str) -> bool:
        self.unlocked.append(node)
        return True


@settings(deadline=None)
@given(state=_STATES, flags=_FLAGS, alloc=st.integers(0, 4))
def test_the_executor_unlocks_exactly_when_the_policy_calls_the_node_drained(
        state: str, flags: frozenset[str], alloc: int) -> None:
    """The executor's re-check as it runs: handed a lend's unlock, it removes the owner
    taint exactly when the policy's `slurm_drained` holds for the same read of Slurm, and
    otherwise refuses with a retryable error (never for ever: the policy stops asking once
    it sees what the executor saw)."""
    node = SlurmNode(name="n1", state=state, flags=flags, reason=LEND_DRAIN, cpus=8,
                     alloc_cpus=alloc)
    kubernetes = _Unlocks()
    executor = ActuatorExecutor(None, kubernetes, _OneNodeSlurm(node))  # type: ignore[arg-type]
    action = OpenAction("a1", "tx-1", "kubernetes", "unlock", "n1", 1, "lend", (), 0.0, 1)
    try:
        asyncio.run(executor.execute(action, None))
    except ActionError as refused:
        assert refused.retryable and "not drained" in str(refused)
    assert (kubernetes.unlocked == ["n1"]) == slurm_drained(node.to_observed())


def test_drain_with_undrain_pending_is_not_drained() -> None:
    assert not slurm_drained(slurm_obs("n1", flags=("DRAIN", "UNDRAIN"), reason=LEND_DRAIN))
    assert not slurm_drained(slurm_obs("n1", flags=("DRAIN",), reason=LEND_DRAIN,
                                       alloc_cpus=2))
    assert slurm_drained(slurm_obs("n1", flags=("DRAIN",), reason=LEND_DRAIN))


def test_an_operator_pin_does_not_make_unknown_pods_known() -> None:
    """A pin moves nothing while the node's pods are unknown."""
    log = _fresh_log()
    log.auto_pods = False
    _lent_without_pod_report(log)
    log.add(OperatorPinned(node="n1", to="slurm", who="op", why="test"), 3.0)
    decisions = _decide(log, T0)
    assert all(getattr(d, "node", "") != "n1" for d in decisions), decisions


def test_a_report_the_source_could_not_record_makes_the_pods_unknown() -> None:
    """The log refused a Node's pod report: the source records them as unknown
    (`complete=False`), which must never leave the last list standing."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pods=()), 3.0)
    log.add(K8sWorkloadObserved(node="n1", complete=False), 4.0)
    state = log.state()
    assert state.nodes["n1"].pods is None and "n1" not in state.pod_reports
    assert assess(state, state.nodes["n1"], T0).phase == Phase.UNKNOWN
    assert state_from_json(state_to_json(state)) == state
    log.add(K8sWorkloadObserved(node="n1", pods=(POD,)), 5.0)
    assert running_pods(log.state().nodes["n1"]) == ["serving/p1"]
