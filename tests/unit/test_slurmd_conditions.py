"""The slurmd conditions on a Nodeset's status: SlurmdReady, SlurmdProgressing,
SlurmdDegraded (docs/nodeset.md, "Status conditions"), each with a reason and a message
naming the nodes, `lastTransitionTime` kept while the status does not change (the
Kubernetes API conventions for conditions)."""

from __future__ import annotations

from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodesetObserved, K8sWorkloadObserved, SlurmdSpec, SourceHealth
from sunkd.domain.policy import effective_pools
from sunkd.domain.policy.slurmd import VERB_SLURMD_CREATE, VERB_SLURMD_DELETE
from sunkd.kubernetes.nodeset_status import build_nodeset_status
from tests.unit.domain_world import POOL, POOL_LABEL, Log, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_slurmd_ownership import UID, own, succeed
from tests.unit.test_slurmd_repair import brought_up, repair_drain, step, verbs
from tests.unit.test_slurmd_update import NEW, nodeset
from tests.unit.test_slurmd_update import brought_up as three_up

LOW_MEMORY = "Low RealMemory (reported:24105 < 100.00% of configured:99999999)"


def conditions(log: Log, now: float,
               previous: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    state = log.state()
    status = build_nodeset_status(state, effective_pools(state), POOL, 1, now,
                                  previous_conditions=previous)
    return {c["type"]: c for c in status["conditions"]}


def summary(found: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {kind: (found[kind]["status"], found[kind]["reason"])
            for kind in (wk.CONDITION_SLURMD_READY, wk.CONDITION_SLURMD_PROGRESSING,
                         wk.CONDITION_SLURMD_DEGRADED)}


def test_all_registered_is_ready_settled_and_not_degraded() -> None:
    assert summary(conditions(brought_up(), 6.0)) == {
        wk.CONDITION_SLURMD_READY: ("True", wk.REASON_ALL_REGISTERED),
        wk.CONDITION_SLURMD_PROGRESSING: ("False", wk.REASON_SETTLED),
        wk.CONDITION_SLURMD_DEGRADED: ("False", wk.REASON_AS_EXPECTED)}


def test_without_spec_slurmd_there_is_no_slurmd_condition() -> None:
    found = conditions(_cluster(1), 6.0)
    assert not {wk.CONDITION_SLURMD_READY, wk.CONDITION_SLURMD_DEGRADED} & set(found)


def test_a_bring_up_is_progressing_starting() -> None:
    log = _cluster(1)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=SlurmdSpec(image="i")), 2.0)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 2.0)
    found = summary(conditions(log, 3.0))
    assert found[wk.CONDITION_SLURMD_READY] == ("False", wk.REASON_NOT_ALL_REGISTERED)
    assert found[wk.CONDITION_SLURMD_PROGRESSING] == ("True", wk.REASON_STARTING)


def test_an_invalid_registration_is_degraded_with_slurms_reason() -> None:
    log = brought_up()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=LOW_MEMORY), 10.0)
    found = conditions(log, 11.0)
    assert summary(found) == {
        wk.CONDITION_SLURMD_READY: ("False", wk.REASON_NOT_ALL_REGISTERED),
        wk.CONDITION_SLURMD_PROGRESSING: ("False", wk.REASON_SETTLED),
        wk.CONDITION_SLURMD_DEGRADED: ("True", wk.REASON_INVALID_REGISTRATION)}
    message = found[wk.CONDITION_SLURMD_DEGRADED]["message"]
    assert "n1" in message and LOW_MEMORY in message and "INVALID_REG" in message
    assert found[wk.CONDITION_SLURMD_READY]["message"].endswith("not: n1")


def test_a_repair_is_progressing_and_ready_again_after() -> None:
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 110.0)
    found = summary(conditions(log, 110.2))
    assert found[wk.CONDITION_SLURMD_PROGRESSING] == ("True", wk.REASON_REPAIRING)
    assert found[wk.CONDITION_SLURMD_READY][0] == "False"
    reason = repair_drain(log, 110.5)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 111.0)
    succeed(log, step(log, 111.5), 111.6)  # the create
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=112.0),)), 112.0)
    # Registered, sunkd's repair drain still on: still repairing (the undrain comes).
    found = summary(conditions(log, 112.5))
    assert found[wk.CONDITION_SLURMD_PROGRESSING] == ("True", wk.REASON_REPAIRING)
    assert found[wk.CONDITION_SLURMD_READY] == ("True", wk.REASON_ALL_REGISTERED)
    succeed(log, step(log, 113.0), 113.1)  # the undrain
    log.add(slurm_obs("n1"), 114.0)
    found = summary(conditions(log, 115.0))
    assert found[wk.CONDITION_SLURMD_PROGRESSING] == ("False", wk.REASON_SETTLED)


def test_an_unregistered_pod_is_degraded() -> None:
    log = brought_up()
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 10.0)
    found = summary(conditions(log, 20.0))
    assert found[wk.CONDITION_SLURMD_DEGRADED] == ("False", wk.REASON_AS_EXPECTED)
    found = summary(conditions(log, 10.0 + 121.0))
    assert found[wk.CONDITION_SLURMD_DEGRADED] == ("True", wk.REASON_UNREGISTERED)
    assert found[wk.CONDITION_SLURMD_PROGRESSING] == ("True", wk.REASON_REPAIRING)


def test_recreated_again_and_again_is_repair_failing() -> None:
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 10.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 10.0)
    reason = repair_drain(log, 11.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            11.5)
    now, created = 12.0, 0
    while created < 2:
        decisions = step(log, now)
        if VERB_SLURMD_CREATE in verbs(decisions):
            created += 1
            succeed(log, decisions, now + 0.1)
            log.add(K8sWorkloadObserved(node="n1", pods=(own("Failed", started_at=now),)),
                    now + 1)
        elif VERB_SLURMD_DELETE in verbs(decisions):
            succeed(log, decisions, now + 0.1)
            log.add(K8sWorkloadObserved(node="n1", pods=()), now + 0.5)
        now += 1.0
    found = conditions(log, now)
    assert summary(found)[wk.CONDITION_SLURMD_DEGRADED] == ("True", wk.REASON_REPAIR_FAILING)
    assert "n1" in found[wk.CONDITION_SLURMD_DEGRADED]["message"]


def test_a_rolling_update_is_progressing() -> None:
    log = three_up()
    nodeset(log, NEW, 10.0)
    found = conditions(log, 10.5)
    assert summary(found)[wk.CONDITION_SLURMD_PROGRESSING] == ("True", wk.REASON_ROLLING_UPDATE)
    assert "n1, n2, n3" in found[wk.CONDITION_SLURMD_PROGRESSING]["message"]


def test_sources_not_fresh_make_every_slurmd_condition_unknown() -> None:
    log = brought_up()
    log.add(SourceHealth(source="slurm", status="stale"), 10.0, subject="slurm")
    found = summary(conditions(log, 11.0))
    assert set(found.values()) == {("Unknown", wk.REASON_SOURCES_STALE)}


def test_last_transition_time_is_kept_while_the_status_does_not_change() -> None:
    log = brought_up()
    first = conditions(log, 1000.0)
    later = conditions(log, 2000.0, previous=first)
    for kind in (wk.CONDITION_SLURMD_READY, wk.CONDITION_SLURMD_DEGRADED):
        assert later[kind]["lastTransitionTime"] == first[kind]["lastTransitionTime"]
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=LOW_MEMORY), 2500.0)
    changed = conditions(log, 3000.0, previous=later)
    again = conditions(log, 4000.0, previous=changed)
    for kind in (wk.CONDITION_SLURMD_READY, wk.CONDITION_SLURMD_DEGRADED):
        assert changed[kind]["lastTransitionTime"] != first[kind]["lastTransitionTime"]
        assert again[kind]["lastTransitionTime"] == changed[kind]["lastTransitionTime"]
    settled = {c[wk.CONDITION_SLURMD_PROGRESSING]["lastTransitionTime"]
               for c in (first, later, changed, again)}
    assert len(settled) == 1  # Progressing stayed False throughout
