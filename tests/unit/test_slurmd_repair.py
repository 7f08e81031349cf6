"""Repair of a Slurm-owned node's slurmd pod (docs/nodeset.md, "What sunkd does when").

A settled Slurm-owned node of a pool whose Nodeset has `spec.slurmd` must run sunkd's
registered slurmd pod. When the pod is missing (someone deleted it, the node lost it),
ended (Failed/Succeeded) or Running past the registration bound without Slurm hearing
it, sunkd drains the node with its own reason first (no job lands there while it
repairs), deletes an ended or unregistered pod, creates a new one with exponential
backoff counted from the log (the node's create outcomes), and undrains its own drain
once the new slurmd registered. Adversaries: a drain or DOWN that is not sunkd's, a job
still allocated, unknown pods, a NotReady Node, a pin to Kubernetes while repairing.
"""

from __future__ import annotations

import itertools

import pytest

from sunkd.domain.events import (
    ActionFailed,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    SlurmdSpec,
)
from sunkd.domain.policy import (
    VERB_DRAIN,
    VERB_HOLD,
    VERB_RELEASE,
    VERB_RESUME,
    Decision,
    StartTransition,
)
from sunkd.domain.policy.slurmd import VERB_SLURMD_CREATE, VERB_SLURMD_DELETE
from sunkd.domain.ports import ActionError
from sunkd.domain.state import OpenAction
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.model import SlurmNode
from tests.unit.domain_world import POOL, POOL_LABEL, Log, k8s_obs, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_slurmd_ownership import (
    UID,
    Kube,
    Slurm,
    own,
    requests,
    succeed,
)
from tests.unit.test_slurmd_ownership import step as one_round
from tests.unit.test_slurmd_ownership import verbs as all_verbs

MIRRORS = {VERB_HOLD, VERB_RELEASE}  # the hold mirrored to Kubernetes while Slurm holds it


def verbs(decisions: list) -> list[str]:  # type: ignore[type-arg]
    """The verbs asked, but the hold mirror (HELD while Slurm does not hear the node)."""
    return [verb for verb in all_verbs(decisions) if verb not in MIRRORS]


def arg(decisions: list, verb: str, key: str) -> str | None:  # type: ignore[type-arg]
    for action in requests(decisions):
        if action.verb == verb:
            return next((a.value for a in action.args if a.key == key), None)
    return None


def step(log: Log, now: float) -> list[Decision]:
    """A round; the hold mirrored to Kubernetes (HELD while Slurm does not hear the
    node) takes that side for the round, so it succeeds and the round is run again."""
    decisions = one_round(log, now)
    mirrors = [d for d in requests(decisions) if d.verb in MIRRORS]
    if not mirrors:
        return decisions
    succeed(log, list(mirrors), now)
    return [*decisions, *one_round(log, now)]


def brought_up() -> Log:
    """n1 Slurm-owned; sunkd created its slurmd pod (the bring-up) and it registered."""
    log = _cluster(1)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=SlurmdSpec(image="i")), 2.0)
    create = step(log, 3.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 3.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=4.0),)), 4.0)
    assert verbs(step(log, 5.0)) == []
    return log


def repair_drain(log: Log, now: float) -> str:
    """The round drains the node first with sunkd's reason; Slurm then reports it."""
    decisions = step(log, now)
    assert verbs(decisions) == [VERB_DRAIN], decisions
    reason = arg(decisions, VERB_DRAIN, "reason")
    assert reason is not None and reason.startswith("sunkd:")
    succeed(log, decisions, now + 0.1)
    return reason


def registered_and_undrained(log: Log, reason: str, now: float) -> None:
    """The new pod runs and its slurmd registered: Slurm left the node DOWN under sunkd's
    drain (ReturnToService=1 returns only a "Not responding" DOWN), so the resume returns
    exactly that DOWN to service."""
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=now),)), now)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN",), reason=reason), now + 0.5)
    resume = step(log, now + 1.0)
    assert verbs(resume) == [VERB_RESUME], resume
    assert arg(resume, VERB_RESUME, "return_to_service") == "1"
    assert arg(resume, VERB_RESUME, "expect_reason") == reason
    succeed(log, resume, now + 1.1)
    log.add(slurm_obs("n1"), now + 2.0)
    assert verbs(step(log, now + 3.0)) == []


def test_a_pod_that_vanished_minutes_ago_is_recreated_after_a_drain() -> None:
    """Today: held (Slurm stopped hearing the node 30 s ago), and nothing recreates it."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 11.0)
    reason = repair_drain(log, 310.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            311.0)
    create = step(log, 312.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 312.1)
    registered_and_undrained(log, reason, 313.0)


def test_a_pod_deleted_by_someone_else_drains_before_anything_else() -> None:
    """Today the plan creates the pod at once, with Slurm still scheduling on the node."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=(own(deleting=True, started_at=4.0),)), 110.0)
    reason = repair_drain(log, 110.5)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 111.0)
    assert verbs(step(log, 111.5)) == []  # still terminating
    log.add(K8sWorkloadObserved(node="n1", pods=()), 112.0)
    create = step(log, 112.5)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 112.6)
    registered_and_undrained(log, reason, 113.0)


@pytest.mark.parametrize("trouble", ["failed", "unregistered"])
def test_a_failed_or_unregistered_pod_is_drained_deleted_and_recreated(trouble: str) -> None:
    log = brought_up()
    if trouble == "failed":
        log.add(K8sWorkloadObserved(node="n1", pods=(own("Failed", started_at=4.0),)), 110.0)
        log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 111.0)
        now = 112.0
    else:  # slurmd lost Slurm: Running, Slurm not hearing it past the bound
        log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 10.0)
        assert verbs(step(log, 20.0)) == []  # within the bound: starting, nothing yet
        now = 10.0 + 121.0  # the pod and Slurm not hearing it, both past the bound
    reason = repair_drain(log, now)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            now + 1)
    delete = step(log, now + 2)
    assert verbs(delete) == [VERB_SLURMD_DELETE], delete
    assert arg(delete, VERB_SLURMD_DELETE, "pod_uid") == "p1"
    assert arg(delete, VERB_SLURMD_DELETE, "slurmd_repair") == "1"
    succeed(log, delete, now + 2.1)
    log.add(K8sWorkloadObserved(node="n1", pods=()), now + 3)
    create = step(log, now + 4)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, now + 4.1)
    registered_and_undrained(log, reason, now + 5)


def test_a_long_running_pod_that_slurm_briefly_misses_is_left_alone() -> None:
    """A slurmctld restart or a short loss of contact: the pod has run for long, but Slurm
    has not missed it for the bound yet."""
    log = brought_up()
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 1000.0)
    assert verbs(step(log, 1100.0)) == []
    log.add(slurm_obs("n1"), 1101.0)
    assert verbs(step(log, 1300.0)) == []
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 1301.0)
    assert verbs(step(log, 1430.0)) == [VERB_DRAIN]


def test_a_job_still_allocated_keeps_the_delete_waiting() -> None:
    log = brought_up()
    log.add(slurm_obs("n1", state="MIXED", flags=("NOT_RESPONDING",), alloc_cpus=4), 10.0)
    # The busy label sunkd set when the job started (policy/slurmdbusy.py).
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=4.0, slurmd_busy=True),)),
            10.0)
    reason = repair_drain(log, 135.0)
    log.add(slurm_obs("n1", state="MIXED", flags=("DRAIN", "NOT_RESPONDING"), reason=reason,
                      alloc_cpus=4), 136.0)
    assert verbs(step(log, 137.0)) == []
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            138.0)
    assert verbs(step(log, 139.0)) == [VERB_SLURMD_DELETE]


def test_a_foreign_drain_is_left_alone_and_the_pod_still_recreated() -> None:
    """DRAIN keeps jobs off whatever slurmd does, and no ReturnToService clears it: the
    pod is recreated, the administrator's drain neither overwritten nor lifted."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 110.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"),
                      reason="bad DIMM"), 111.0)
    create = step(log, 112.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 112.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=113.0),)), 113.0)
    log.add(slurm_obs("n1", state="IDLE", flags=("DRAIN",), reason="bad DIMM"), 114.0)
    for now in (115.0, 200.0, 500.0):
        assert not {VERB_DRAIN, VERB_RESUME} & set(verbs(step(log, now)))


def test_a_foreign_down_without_drain_gets_nothing_slurms_own_not_responding_a_pod() -> None:
    """An administrator's DOWN: with ReturnToService=2 a registration would return it to
    service, so no pod. Slurm's own DOWN for not responding: no job lands on a DOWN node,
    and registration returning it is what Slurm does for any returning slurmd."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("NOT_RESPONDING",), reason="maintenance"),
            11.0)
    for now in (12.0, 400.0):
        assert verbs(step(log, now)) == []
    log.add(slurm_obs("n1", state="DOWN", flags=("NOT_RESPONDING",), reason="Not responding"),
            401.0)
    decisions = step(log, 402.0)
    assert VERB_SLURMD_CREATE in verbs(decisions) or VERB_SLURMD_CREATE in verbs(
        step(log, 403.0))


def test_unknown_pods_or_a_notready_node_get_nothing() -> None:
    log = brought_up()
    log.auto_pods = False
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 11.0)
    log.add(k8s_obs("n1", ready=False), 12.0)
    assert not {VERB_DRAIN, VERB_SLURMD_CREATE} & set(verbs(step(log, 300.0)))


def test_recreates_back_off_exponentially_counted_from_the_log() -> None:
    """Each create is an action whose attempt the log keeps; a pod failing again and again
    is recreated ever later (the fold alone says how many: a restarted sunkd agrees)."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 10.0)
    reason = repair_drain(log, 11.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            11.5)
    now, created = 12.0, []
    while now < 2000.0 and len(created) < 5:
        decisions = step(log, now)
        if VERB_SLURMD_CREATE in verbs(decisions):
            created.append(now)
            succeed(log, decisions, now + 0.1)
            log.add(K8sWorkloadObserved(node="n1", pods=(own("Failed", started_at=now),)),
                    now + 1)
        elif VERB_SLURMD_DELETE in verbs(decisions):
            succeed(log, decisions, now + 0.1)
            log.add(K8sWorkloadObserved(node="n1", pods=()), now + 0.5)
        now += 1.0
    gaps = [b - a for a, b in itertools.pairwise(created)]
    assert len(created) == 5, created
    assert all(b > a * 1.5 for a, b in itertools.pairwise(gaps)), gaps


def test_a_failed_create_is_retried_with_the_usual_backoff() -> None:
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 110.0)
    reason = repair_drain(log, 110.5)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 111.0)
    (create,) = requests(step(log, 111.5))
    log.add(ActionFailed(action_id=create.action_id, transition_id=None, side=create.side,
                         verb=create.verb, node="n1", attempt=create.attempt,
                         error="refused: no owner taint", retryable=True), 111.6)
    assert verbs(step(log, 111.7)) == []
    assert VERB_SLURMD_CREATE in verbs(step(log, 500.0))


def test_never_lent_while_repairing() -> None:
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(k8s_obs("n1", pin="kubernetes"), 10.0)
    for now in (10.5, 11.0, 50.0):
        assert not any(isinstance(d, StartTransition) for d in step(log, now))


async def test_the_executor_deletes_a_repaired_pod_out_of_contact_never_under_a_job() -> None:
    repair = OpenAction("a1", None, "kubernetes", VERB_SLURMD_DELETE, "n1", 1, "repair",
                        (Label("slurmd_repair", "1"),), 0.0, 1)
    out = SlurmNode("n1", "DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}), reason="sunkd: x")

    class Pods(Kube):
        def __init__(self) -> None:
            super().__init__()
            self.deleted: list[str] = []

        async def slurmd(self, verb: str, slurm_node: str, k8s_node: str,
                         args: dict[str, str]) -> bool:
            self.deleted.append(slurm_node)
            return True

    kube = Pods()
    assert await ActuatorExecutor(None, kube, Slurm(out)).execute(repair, None)  # type: ignore[arg-type]
    assert kube.deleted == ["n1"]
    with pytest.raises(ActionError, match="not drained"):  # a lend's delete: contact needed
        await ActuatorExecutor(None, kube, Slurm(out)).execute(  # type: ignore[arg-type]
            repair._replace(args=()), None)
    for busy in (out._replace(state="MIXED", alloc_cpus=4),
                 out._replace(flags=frozenset({"NOT_RESPONDING"}))):
        with pytest.raises(ActionError):
            await ActuatorExecutor(None, kube, Slurm(busy)).execute(repair, None)  # type: ignore[arg-type]
    assert kube.deleted == ["n1"]


def test_no_undrain_while_slurm_still_hears_the_slurmd_from_before_the_new_pod() -> None:
    """slurmctld reports a node in contact from its previous slurmd until its next ping
    finds it gone: a repaired node whose new pod is Running is undrained only once Slurm
    reports a slurmd that started with that pod (seen in the real e2e: the drain lifted
    while the new slurmd had not registered, then NOT_RESPONDING)."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=(own(deleting=True, started_at=4.0),)), 110.0)
    reason = repair_drain(log, 110.5)
    old = slurm_obs("n1", flags=("DRAIN",), reason=reason, slurmd_start_time=3.0)
    log.add(old, 111.0)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 112.0)
    create = step(log, 112.5)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 112.6)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=113.0),)), 113.0)
    for now in (113.5, 114.0, 150.0):
        assert verbs(step(log, now)) == []  # in contact, but with the old slurmd
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason, slurmd_start_time=113.0), 151.0)
    resume = step(log, 151.5)
    assert verbs(resume) == [VERB_RESUME], resume
