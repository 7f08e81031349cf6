"""The daemon's policy runs the slurmd-pod plan for a pool whose Nodeset has spec.slurmd.

A lend: drain -> Slurm reports drained, idle and in contact -> delete sunkd's slurmd pod ->
the pod is gone (Slurm then stops hearing the node) -> remove the owner taint -> lent. A
lent node without its slurmd pod, out of contact in Slurm, is the expected state, not a
Slurm hold. A reclaim: taint -> no foreign pod left -> create the pod -> the new slurmd
registered -> undrain. Adversaries: a pod gone that sunkd did not delete, a job still
allocated, a drain that is not sunkd's, unknown pods, another Nodeset's pod, a pod that
never registers. Property: over arbitrary worlds, never an unlock while Slurm shows an
allocation or any slurmd pod is on the node, never a delete unless Slurm reports the node
drained, idle and in contact.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sunkd.domain.authorship import drain_shows
from sunkd.domain.events import (
    ActionFailed,
    ActionSucceeded,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    PodRef,
    SlurmdSpec,
)
from sunkd.domain.ownership import assess, foreign_word, has_owner_taint, our_drain
from sunkd.domain.policy import (
    VERB_DRAIN,
    VERB_HOLD,
    VERB_LOCK,
    VERB_RESUME,
    VERB_UNLOCK,
    CompleteTransition,
    Decision,
    RequestAction,
    StartTransition,
    decide,
    decision_to_event,
    effective_pools,
)
from sunkd.domain.policy.slurmd import (
    REGISTER_BOUND_SECONDS,
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
)
from sunkd.domain.policy.slurmdrepair import slurms_own_down, trouble
from sunkd.domain.ports import ActionError
from sunkd.domain.slurmdgone import expected_out_of_contact, slurmd_gone
from sunkd.domain.slurmnode import drain_requested, in_contact, slurm_busy, slurm_drained
from sunkd.domain.state import OpenAction, Phase
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.model import SlurmNode
from tests.unit.domain_world import POOL, POOL_LABEL, Log, k8s_obs, slurm_obs
from tests.unit.test_domain_policy import _cluster

UID = "U"


def own(phase: str = "Running", **kw: object) -> PodRef:
    return PodRef("default", "gpu-n1", phase, uid="p1", pool_pod=False, slurmd="n1",
                  slurmd_nodeset=UID, **kw)  # type: ignore[arg-type]


def world(*, slurmd: bool = True) -> Log:
    log = _cluster(1)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               slurmd_finalizer=slurmd,
                               partitions=("gpu",),
                               slurmd=SlurmdSpec(image="i") if slurmd else None), 2.0)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=2.0),)), 2.0)
    return log


def step(log: Log, now: float) -> list[Decision]:
    state = log.state()
    decisions = decide(state, effective_pools(state), now)
    for decision in decisions:
        event = decision_to_event(decision)
        log.add(event.payload, now, event.subject)
    return decisions


def requests(decisions: list[Decision]) -> list[RequestAction]:
    return [d for d in decisions if isinstance(d, RequestAction)]


def verbs(decisions: list[Decision]) -> list[str]:
    return [d.verb for d in requests(decisions)]


def succeed(log: Log, decisions: list[Decision], now: float) -> None:
    for action in requests(decisions):
        log.add(ActionSucceeded(action_id=action.action_id, transition_id=action.transition_id,
                                side=action.side, verb=action.verb, node=action.node,
                                attempt=action.attempt), now)


def settle_adversely(log: Log, decisions: list[Decision], now: float,
                     draw: st.DrawFn) -> None:
    """Each requested action succeeds (three times in four) or fails, retryable or not,
    as an adversary draws."""
    for action in requests(decisions):
        if draw(st.integers(0, 3)):
            log.add(ActionSucceeded(action_id=action.action_id,
                                    transition_id=action.transition_id, side=action.side,
                                    verb=action.verb, node=action.node,
                                    attempt=action.attempt), now)
        else:
            log.add(ActionFailed(action_id=action.action_id,
                                 transition_id=action.transition_id, side=action.side,
                                 verb=action.verb, node=action.node,
                                 attempt=action.attempt, error="adversary",
                                 retryable=draw(st.booleans())), now)


def lend_until_drained(log: Log) -> str:
    """Pin n1 to Kubernetes, drain it; Slurm reports it drained: the drain's reason."""
    log.add(k8s_obs("n1", pin="kubernetes"), 3.0)
    started = step(log, 3.0)
    (drain,) = requests(started)
    assert drain.verb == VERB_DRAIN
    reason = next(label.value for label in drain.args if label.key == "reason")
    succeed(log, started, 3.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 3.2)
    return reason


def lent(log: Log) -> str:
    """The whole lend, as the daemon runs it; returns the drain reason."""
    reason = lend_until_drained(log)
    delete = step(log, 4.0)
    assert verbs(delete) == [VERB_SLURMD_DELETE], delete
    succeed(log, delete, 4.1)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 5.0)
    log.add(slurm_obs("n1", flags=("DRAIN", "NOT_RESPONDING"), reason=reason), 6.0)
    unlock = step(log, 6.0)
    assert verbs(unlock) == [VERB_UNLOCK], unlock
    succeed(log, unlock, 6.1)
    log.add(k8s_obs("n1", pin="kubernetes", tainted=False), 6.2)
    assert any(isinstance(d, CompleteTransition) for d in step(log, 6.3))
    return reason


# ------------------------------------------------------------------------------ the lend


def test_a_lend_deletes_the_pod_after_the_drain_and_untaints_only_once_it_is_gone() -> None:
    log = world()
    reason = lend_until_drained(log)
    delete = step(log, 4.0)
    assert verbs(delete) == [VERB_SLURMD_DELETE], delete  # not the unlock: the pod first
    (action,) = requests(delete)
    assert action.transition_id is not None  # an aborted lend's queued delete never runs
    succeed(log, delete, 4.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(deleting=True),)), 4.2)
    assert verbs(step(log, 5.0)) == []  # terminating: still there
    log.add(K8sWorkloadObserved(node="n1", pods=()), 5.5)
    log.add(slurm_obs("n1", flags=("DRAIN", "NOT_RESPONDING"), reason=reason), 6.0)
    unlock = step(log, 6.0)
    assert verbs(unlock) == [VERB_UNLOCK], unlock
    (action,) = requests(unlock)
    assert ("slurmd_gone", "1") in [(label.key, label.value) for label in action.args]


def test_without_spec_slurmd_the_lend_untaints_as_before() -> None:
    log = world(slurmd=False)
    lend_until_drained(log)
    assert verbs(step(log, 4.0)) == [VERB_UNLOCK]


def test_a_lent_node_without_its_slurmd_pod_is_not_held() -> None:
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    state = log.state()
    assert assess(state, state.nodes["n1"], 500.0).phase == Phase.KUBERNETES
    assert VERB_HOLD not in verbs(step(log, 500.0))


def test_a_lent_node_is_held_when_its_drain_is_not_sunkds_or_a_job_is_allocated() -> None:
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"),
                      reason="bad DIMM"), 100.0)
    state = log.state()
    assert assess(state, state.nodes["n1"], 500.0).phase == Phase.HELD
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="MIXED", flags=("DRAIN", "NOT_RESPONDING"), reason=reason,
                      alloc_cpus=4), 100.0)
    state = log.state()
    assert assess(state, state.nodes["n1"], 500.0).phase == Phase.HELD


def test_a_pod_gone_without_sunkds_delete_keeps_the_lend_waiting() -> None:
    """Someone else deleted the pod (or the node lost it) while the drain finished: Slurm
    is out of contact for a reason sunkd did not make, so no unlock on that word."""
    log = world()
    reason = lend_until_drained(log)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 3.5)
    log.add(slurm_obs("n1", flags=("DRAIN", "NOT_RESPONDING"), reason=reason), 3.6)
    assert VERB_UNLOCK not in verbs(step(log, 4.0))


def test_another_nodesets_pod_on_the_node_keeps_the_unlock_waiting() -> None:
    log = world()
    reason = lend_until_drained(log)
    delete = step(log, 4.0)
    succeed(log, delete, 4.1)
    theirs = PodRef("default", "cpu-n1", "Running", uid="p9", pool_pod=False, slurmd="n1",
                    slurmd_nodeset="OTHER")
    log.add(K8sWorkloadObserved(node="n1", pods=(theirs,)), 5.0)
    log.add(slurm_obs("n1", flags=("DRAIN", "NOT_RESPONDING"), reason=reason), 6.0)
    assert VERB_UNLOCK not in verbs(step(log, 6.0))


# --------------------------------------------------------------------------- the reclaim


def test_a_reclaim_taints_creates_the_pod_and_undrains_once_slurmd_registered() -> None:
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    lock = step(log, 200.0)
    assert verbs(lock) == [VERB_LOCK], lock
    succeed(log, lock, 200.1)
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    create = step(log, 201.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own("Pending"),)), 201.2)
    assert verbs(step(log, 202.0)) == []  # not registered: no undrain, and not held
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=203.0),)), 203.0)
    assert verbs(step(log, 204.0)) == []  # Slurm still does not hear it
    state = log.state()
    assert assess(state, state.nodes["n1"], 204.0).phase == Phase.TO_SLURM
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 205.0)  # ReturnToService=1
    resume = step(log, 205.0)
    assert verbs(resume) == [VERB_RESUME], resume
    succeed(log, resume, 205.1)
    log.add(slurm_obs("n1"), 205.2)
    assert any(isinstance(d, CompleteTransition) for d in step(log, 206.0))


def test_a_reclaim_undrains_only_once_slurm_hears_the_new_pods_slurmd() -> None:
    """Slurm in contact with a slurmd older than the reclaimed pod's (slurmctld has not
    pinged it since) is not that pod registering: no undrain until a slurmd that started
    with the pod registers."""
    log = world()
    reason = lent(log)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    succeed(log, step(log, 200.0), 200.1)
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    succeed(log, step(log, 201.0), 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=203.0),)), 203.0)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason, slurmd_start_time=150.0), 203.5)
    assert verbs(step(log, 204.0)) == []
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason, slurmd_start_time=203.0), 205.0)
    assert verbs(step(log, 205.5)) == [VERB_RESUME]


def test_a_reclaimed_pod_that_never_registers_is_held_past_the_bound() -> None:
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    succeed(log, step(log, 200.0), 200.1)
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    succeed(log, step(log, 201.0), 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=203.0),)), 203.0)
    state = log.state()
    assert assess(state, state.nodes["n1"], 205.0).phase == Phase.TO_SLURM
    late = 201.1 + REGISTER_BOUND_SECONDS + 1
    assert assess(state, state.nodes["n1"], late).phase == Phase.HELD
    assert VERB_RESUME not in verbs(step(log, late))


# ------------------------------------------------------------------- against adversaries

STATES = ("IDLE", "MIXED", "ALLOCATED", "DOWN", "UNKNOWN", "COMPLETING")
FLAGS = ("DRAIN", "NOT_RESPONDING", "COMPLETING", "UNDRAIN")


@st.composite
def pods_seen(draw: st.DrawFn) -> tuple[PodRef, ...]:
    pods = []
    for i in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(("own", "other-nodeset", "impostor", "pool", "other-node")))
        slurmd = {"own": "n1", "other-nodeset": "n1", "other-node": "n2"}.get(kind, "")
        nodeset = {"own": UID, "other-nodeset": "OTHER", "other-node": UID}.get(kind, "")
        pods.append(PodRef("default", f"p{i}", draw(st.sampled_from(
            ("Pending", "Running", "Succeeded", "Failed"))), uid=f"u{i}",
            pool_pod=kind == "pool", slurmd=slurmd, slurmd_nodeset=nodeset,
            deleting=draw(st.booleans())))
    return tuple(pods)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=st.sampled_from(("IDLE", "IDLE", "DOWN", *STATES)),
       flags=st.sets(st.sampled_from(FLAGS)).map(lambda f: f | {"DRAIN"})
       | st.sets(st.sampled_from(FLAGS)),
       alloc=st.sampled_from((0, 0, 0, 4)), pods=st.just(()) | pods_seen(),
       deleted=st.sampled_from((True, True, False)),
       ours=st.sampled_from((True, True, True, False)), later=st.floats(0, 400))
def test_never_an_unlock_beside_slurmd_or_an_allocation_nor_a_delete_undrained(
    state: str, flags: set[str], alloc: int, pods: tuple[PodRef, ...], deleted: bool,
    ours: bool, later: float,
) -> None:
    log = world()
    reason = lend_until_drained(log)
    now = 4.0
    if deleted:
        delete = step(log, now)
        succeed(log, delete, now + 0.1)
        now += 1.0
    observation = slurm_obs("n1", state=state, flags=tuple(sorted(flags)),
                            reason=reason if ours else "sunkd: copied by hand",
                            alloc_cpus=alloc)
    log.add(observation, now)
    log.add(K8sWorkloadObserved(node="n1", pods=pods), now)
    now += later
    made = requests(step(log, now))
    event(f"verbs={sorted(a.verb for a in made)}")
    for action in made:
        if action.verb == VERB_UNLOCK:
            assert not slurm_busy(observation) and "DRAIN" in observation.flags
            assert not any(p.slurmd == "n1" for p in pods)
            assert in_contact(observation) or deleted
        if action.verb == VERB_SLURMD_DELETE:
            assert slurm_drained(observation)
        assert action.verb != VERB_SLURMD_CREATE


# --------------------------------------------------- the executor's Slurm re-check stays


class Slurm:
    """What slurmrestd answers right before the unlock (the executor's SlurmReader)."""

    def __init__(self, node: SlurmNode) -> None:
        self.node = node

    async def get_nodes(self) -> list[SlurmNode]:
        return [self.node]


class Kube:
    def __init__(self) -> None:
        self.unlocked: list[str] = []

    async def unlock(self, node: str) -> bool:
        self.unlocked.append(node)
        return True


async def test_the_unlock_after_the_pod_is_gone_accepts_out_of_contact_never_an_allocation(
) -> None:
    gone = OpenAction("a1", "tx", "kubernetes", VERB_UNLOCK, "n1", 1, "lend",
                      (Label("slurmd_gone", "1"),), 0.0, 1)
    plain = gone._replace(args=())
    out = SlurmNode("n1", "IDLE", frozenset({"DRAIN", "NOT_RESPONDING"}), reason="sunkd: x")
    kube = Kube()
    assert await ActuatorExecutor(None, kube, Slurm(out)).execute(gone, None)  # type: ignore[arg-type]
    assert kube.unlocked == ["n1"]
    with pytest.raises(ActionError, match="not drained"):  # without the policy's word
        await ActuatorExecutor(None, kube, Slurm(out)).execute(plain, None)  # type: ignore[arg-type]
    for busy in (out._replace(state="MIXED", alloc_cpus=4), out._replace(alloc_cpus=1),
                 out._replace(flags=frozenset({"DRAIN", "NOT_RESPONDING", "COMPLETING"})),
                 out._replace(flags=frozenset({"NOT_RESPONDING"})),
                 out._replace(flags=frozenset({"DRAIN", "UNDRAIN", "NOT_RESPONDING"}))):
        with pytest.raises(ActionError, match="refusing to unlock"):
            await ActuatorExecutor(None, kube, Slurm(busy)).execute(gone, None)  # type: ignore[arg-type]
    assert kube.unlocked == ["n1"]


def test_a_reclaimed_node_left_down_after_its_slurmd_registered_is_returned_to_service(
) -> None:
    """slurmctld returns a DOWN node to service on registration (ReturnToService=1) only
    when its reason is "Not responding"; under sunkd's drain reason it stays DOWN+DRAIN
    once the new slurmd registered (seen on 22.05). The resume says so, for the actuator
    to return exactly that DOWN to service; while Slurm does not hear it, no resume."""
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    succeed(log, step(log, 200.0), 200.1)
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    succeed(log, step(log, 201.0), 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=203.0),)), 203.0)
    assert verbs(step(log, 204.0)) == []
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN",), reason=reason), 205.0)
    resume = step(log, 205.0)
    assert verbs(resume) == [VERB_RESUME], resume
    (action,) = requests(resume)
    assert ("return_to_service", "1") in [(a.key, a.value) for a in action.args]
    succeed(log, resume, 205.1)
    # Polled before the RESUME, appended after its success: still DOWN+DRAIN, sunkd's
    # drain on its way out; no hold mirrored for it (seen on 22.05).
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN",), reason=reason), 205.2)
    state = log.state()
    assert assess(state, state.nodes["n1"], 205.3).phase == Phase.TO_SLURM
    assert VERB_HOLD not in verbs(step(log, 205.3))
    log.add(slurm_obs("n1"), 206.0)
    assert any(isinstance(d, CompleteTransition) for d in step(log, 206.0))


# ------------------------------------------------- slurmdgone against arbitrary nodes


@st.composite
def nodes_out_there(draw: st.DrawFn) -> tuple[Log, float]:
    """A lent node of the slurmd pool after any mix of: sunkd's delete (or not, or a
    create after it), any Slurm state, flags, allocation and reason, any pods."""
    log = world()
    reason = lent(log) if draw(st.booleans()) else lend_until_drained(log)
    now = 10.0
    if draw(st.integers(0, 3)) == 0:  # a later create by sunkd (a reclaim's), succeeded
        log.add(k8s_obs("n1", pin="slurm"), now)
        for _ in range(3):
            succeed(log, step(log, now), now + 0.1)
            now += 1.0
    # Biased towards the interesting corner (sunkd's drain, out of contact, idle, no pod),
    # with every adversary still drawn.
    text = draw(st.sampled_from((reason, reason, f"{reason} : Not responding", "bad DIMM",
                                 "sunkd: copied by hand", None)))
    flags = set(draw(st.sets(st.sampled_from(FLAGS))))
    if draw(st.integers(0, 3)):
        flags |= {"DRAIN", "NOT_RESPONDING"}
    log.add(slurm_obs("n1", state=draw(st.sampled_from(("IDLE", "DOWN", *STATES))),
                      flags=tuple(sorted(flags)), reason=text,
                      alloc_cpus=draw(st.sampled_from((0, 0, 0, 4)))), now)
    pods = draw(pods_seen()) if draw(st.booleans()) else ()
    log.add(K8sWorkloadObserved(node="n1", pods=pods), now)
    return log, now + draw(st.floats(0, 400))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_and_time=nodes_out_there())
def test_out_of_contact_is_sunkds_doing_only_without_allocation_or_foreign_word(
    world_and_time: tuple[Log, float],
) -> None:
    log, now = world_and_time
    state = log.state()
    node = state.nodes["n1"]
    slurm = node.slurm
    assert slurm is not None
    event(f"gone={slurmd_gone(node)} expected={expected_out_of_contact(state, node, now)}")
    if slurmd_gone(node):
        assert not slurm_busy(slurm) and not in_contact(slurm) and "DRAIN" in slurm.flags
        assert slurm.reason is not None and slurm.reason.startswith("sunkd: lent")
        assert node.pods is not None and not any(p.slurmd == "n1" for p in node.pods)
    if expected_out_of_contact(state, node, now):
        assert not slurm_busy(slurm)
        assert "DRAIN" not in slurm.flags or (
            slurm.reason is not None and slurm.reason.startswith("sunkd: lent"))
    if slurm.reason is not None and slurm.reason.endswith(" : Not responding") \
            and in_contact(slurm):
        assert node.drain_mark is None or not drain_shows(node.drain_mark, slurm)


# ------------------------------------- the repair of a Slurm-owned node's slurmd pod


def slurm_owned_with_pod() -> Log:
    """n1 Slurm-owned; sunkd created its slurmd pod and the pod runs."""
    log = _cluster(1)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=SlurmdSpec(image="i")), 2.0)
    create = step(log, 3.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 3.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=4.0),)), 4.0)
    return log


REPAIR_PODS = st.sampled_from((
    (), (), (own("Failed"),), (own(started_at=4.0),), (own(deleting=True),),
    (own("Pending"),)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_repair_never_writes_over_a_word_nor_touches_a_pod_under_a_job(
    data: st.DataObject,
) -> None:
    """Rounds of the daemon over a Slurm-owned node whose pod comes and goes, with any
    Slurm state, reason (sunkd's repair drain, an administrator's, Slurm's own "Not
    responding", a copy of sunkd's words), allocation, pods (foreign, impostors, unknown)
    and Node (NotReady, untainted, pinned to Kubernetes), and actions that succeed or
    fail: a drain only where no one else's word is; a pod deleted or created only under
    DRAIN (or Slurm's own DOWN for a create) with nothing allocated, on known pods, with
    the owner taint and no foreign pod; a resume only of a drain sunkd's log proves; no
    lend of a node whose pod is wrong."""
    log = slurm_owned_with_pod()
    now, drained_with = 10.0, ""
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(("ours", "ours", "slurms-down", "any", "any")))
        if kind == "ours" and drained_with:  # sunkd's repair drain shows, maybe registered
            log.add(slurm_obs("n1", state=data.draw(st.sampled_from(("IDLE", "DOWN"))),
                              flags=("DRAIN", *data.draw(st.sampled_from(
                                  ((), ("NOT_RESPONDING",))))),
                              reason=drained_with,
                              alloc_cpus=data.draw(st.sampled_from((0, 0, 0, 4)))), now)
        elif kind == "slurms-down":  # slurmctld's own DOWN for not hearing slurmd
            log.add(slurm_obs("n1", state="DOWN", flags=("NOT_RESPONDING",),
                              reason="Not responding"), now)
        else:
            reason = data.draw(st.sampled_from((
                None, "bad DIMM", "Not responding", "sunkd: copied by hand",
                drained_with or None)))
            flags = set(data.draw(st.sets(st.sampled_from(FLAGS))))
            log.add(slurm_obs("n1", state=data.draw(st.sampled_from(("IDLE", "DOWN", *STATES))),
                              flags=tuple(sorted(flags)), reason=reason,
                              alloc_cpus=data.draw(st.sampled_from((0, 0, 0, 4)))), now)
        if data.draw(st.integers(0, 4)) == 0:
            log.add(k8s_obs("n1", ready=data.draw(st.sampled_from((True, True, False))),
                            tainted=data.draw(st.sampled_from((True, True, False))),
                            pin=data.draw(st.sampled_from((None, None, "kubernetes")))), now)
        pods = data.draw(REPAIR_PODS | REPAIR_PODS | pods_seen())
        log.add(K8sWorkloadObserved(node="n1", pods=pods,
                                    complete=data.draw(st.sampled_from((True, True, False)))),
                now)
        now += data.draw(st.sampled_from((0.5, 1.0, 40.0, 130.0, 700.0)))
        state = log.state()
        node = state.nodes["n1"]
        slurm = node.slurm
        assert slurm is not None
        wrong = trouble(node, UID, now)
        decisions = step(log, now)
        event(f"verbs={sorted(verbs(decisions))}")
        for decision in decisions:
            if isinstance(decision, StartTransition):
                assert not (decision.to_owner == "kubernetes" and wrong is not None)
        for action in requests(decisions):
            args = {label.key: label.value for label in action.args}
            if action.verb == VERB_DRAIN:
                assert "DRAIN" not in slurm.flags and not foreign_word(slurm, node.drain_mark)
                assert args["reason"].startswith("sunkd:")
                drained_with = args["reason"]
            if action.verb == VERB_RESUME:
                assert our_drain(node)
            if action.verb in (VERB_SLURMD_CREATE, VERB_SLURMD_DELETE) \
                    and node.transition is None:
                assert node.pods is not None and not slurm_busy(slurm)
                assert not assess(state, node, now).k8s_holds
                if action.verb == VERB_SLURMD_DELETE:
                    assert drain_requested(slurm)
                    assert any(p.uid == args["pod_uid"] and p.slurmd == "n1"
                               and p.slurmd_nodeset == UID for p in node.pods)
                else:
                    assert drain_requested(slurm) or slurms_own_down(slurm)
                    assert has_owner_taint(node.k8s)
                    assert not any(p.phase not in ("Succeeded", "Failed")
                                   for p in node.pods)  # none of sunkd's, none foreign
        settle_adversely(log, decisions, now + 0.1, data.draw)
        now += 0.5


def test_an_aborted_reclaim_never_untaints_before_its_slurmd_pod_is_gone() -> None:
    """A reclaim pinned back to Kubernetes after its pod was created (or aborted by a
    refused resume): the node is Kubernetes-owned again with sunkd's slurmd pod running
    and the owner taint on. The taint comes off only once the pod is gone, as in a lend;
    today the repair of a lent node untaints it at once, the pod still running."""
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    succeed(log, step(log, 200.0), 200.1)  # the owner taint
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    create = step(log, 201.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=202.0),)), 202.0)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 202.5)  # registered
    log.add(k8s_obs("n1", pin="kubernetes"), 202.6)  # pinned back before the resume
    now = 203.0
    for _ in range(6):
        decisions = step(log, now)
        state = log.state()
        pods = state.nodes["n1"].pods or ()
        if VERB_UNLOCK in verbs(decisions):
            assert not any(p.slurmd == "n1" for p in pods), decisions
        succeed(log, decisions, now + 0.1)
        if VERB_SLURMD_DELETE in verbs(decisions):
            log.add(K8sWorkloadObserved(node="n1", pods=()), now + 0.5)
        if VERB_UNLOCK in verbs(decisions):
            log.add(k8s_obs("n1", pin="kubernetes", tainted=False), now + 0.6)
        now += 1.0
    state = log.state()
    assert not has_owner_taint(state.nodes["n1"].k8s)  # lent again in the end
