"""Defunct Dynamic Slurm records (`domain/slurmddefunct.py`, `policy/defunct.py`): sunkd
asks to delete a Dynamic record only when its log shows it created the slurmd pod for
that name under that Nodeset, Slurm reports it DYNAMIC_NORM with the Nodeset's feature,
DOWN+NOT_RESPONDING, nothing allocated, no one's reason, no slurmd pod exists for it,
its Kubernetes Node is gone or no longer selected, and both sources are fresh in this
term. The executor asks Slurm's nodes and jobs again first.

Adversaries: a same-name Static node, another Nodeset's feature, a record an operator
made with the feature but no pod of sunkd's, stale or previous-term sources, a job (on
the node, or a pending one requiring it), a slurmd pod still there, the Node still
selected. Property: over arbitrary worlds, a delete is requested exactly when every
condition holds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    ActionSucceeded,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    LeaderElected,
    PodRef,
    SlurmNodeObserved,
    SlurmNodeVanished,
    SourceHealth,
)
from sunkd.domain.policy import RequestAction
from sunkd.domain.ports import ActionError
from sunkd.domain.slurmddefunct import defunct_records
from sunkd.domain.slurmdgone import VERB_DELETE_NODE
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import SLURMD_CREATED_MAX, OpenAction
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.model import SlurmJob, SlurmNode
from tests.unit.domain_world import POOL, Log, k8s_obs, slurm_obs
from tests.unit.test_slurmd_dynamic import FEATURE, UID, adopted_until_pod_runs, fresh
from tests.unit.test_slurmd_ownership import own, requests, step

NR = "Not responding"


def record(state: str = "DOWN", flags: tuple[str, ...] = ("DYNAMIC_NORM", "NOT_RESPONDING"),
           features: tuple[str, ...] = (FEATURE,), reason: str | None = NR,
           alloc_cpus: int = 0, node: str = "n1") -> SlurmNodeObserved:
    return replace(slurm_obs(node, state, flags, reason=reason, alloc_cpus=alloc_cpus),
                   features=features)


def registered() -> Log:
    """n1 adopted through sunkd's Dynamic slurmd pod, registered with the feature."""
    log = fresh()
    adopted_until_pod_runs(log)
    log.add(record("IDLE", ("DYNAMIC_NORM",), reason=None), 11.0)
    step(log, 11.0)
    return log


def node_gone(log: Log, at: float = 20.0) -> None:
    log.add(K8sNodeVanished(node="n1"), at)
    log.add(record(), at + 1)


def deletes(log: Log, now: float = 30.0) -> list[RequestAction]:
    return [d for d in requests(step(log, now)) if d.verb == VERB_DELETE_NODE]


def test_sunkd_created_the_pod_and_the_node_is_gone_the_record_is_deleted() -> None:
    log = registered()
    assert log.state().slurmd_created == {UID: ("n1",)}
    node_gone(log)
    asked = deletes(log)
    assert [(a.node, a.side) for a in asked] == [("n1", "slurm")], asked
    args = {label.key: label.value for label in asked[0].args}
    assert args == {"nodeset": POOL, "nodeset_uid": UID, "feature": FEATURE}
    assert asked[0].reason.startswith("sunkd: delete Dynamic record n1")
    assert deletes(log, 31.0) == []  # open: asked once
    log.add(ActionSucceeded(action_id=asked[0].action_id, side="slurm",
                            verb=VERB_DELETE_NODE, node="n1"), 32.0)
    log.add(SlurmNodeVanished(node="n1"), 33.0)
    state = log.state()
    assert state.slurmd_created == {} and defunct_records(state) == []
    assert deletes(log, 100.0) == []


def test_a_node_no_longer_selected_counts_as_gone() -> None:
    log = registered()
    log.add(replace(k8s_obs("n1"), labels=()), 20.0)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 20.0)
    log.add(record(), 21.0)
    assert [a.node for a in deletes(log)] == ["n1"]


def test_adversaries_are_never_deleted() -> None:
    cases: dict[str, Any] = {
        "static same name": lambda log: log.add(record(flags=("NOT_RESPONDING",)), 22.0),
        "another Nodeset's feature": lambda log: log.add(record(features=("cpu",)), 22.0),
        "still heard": lambda log: log.add(record(flags=("DYNAMIC_NORM",)), 22.0),
        "not down": lambda log: log.add(record("IDLE"), 22.0),
        "a job": lambda log: log.add(record(alloc_cpus=4), 22.0),
        "completing": lambda log: log.add(
            record(flags=("COMPLETING", "DYNAMIC_NORM", "NOT_RESPONDING")), 22.0),
        "someone's reason": lambda log: log.add(record(reason="keep: RMA 1234"), 22.0),
        "kubernetes stale": lambda log: log.add(
            SourceHealth(source="kubernetes", status="stale"), 22.0, subject="kubernetes"),
        "slurm stale": lambda log: log.add(
            SourceHealth(source="slurm", status="stale"), 22.0, subject="slurm"),
        "a new term, sources not fresh in it": lambda log: log.add(
            LeaderElected(epoch=2, identity="b"), 22.0, epoch=2),
        "a slurmd pod for it elsewhere": lambda log: (
            log.add(k8s_obs("n9"), 22.0),
            log.add(K8sWorkloadObserved(node="n9", pods=(own(),)), 22.0)),
        "the Node back, selected": lambda log: (
            log.add(k8s_obs("n1"), 22.0),
            log.add(K8sWorkloadObserved(node="n1", pods=()), 22.0)),
        "the Nodeset deleted": lambda log: log.add(
            K8sNodesetObserved(pool=POOL, uid=UID, deleted=True), 22.0),
    }
    for name, adversary in cases.items():
        log = registered()
        node_gone(log)
        adversary(log)
        assert deletes(log) == [], name


def test_a_record_sunkd_never_made_a_pod_for_is_not_deleted() -> None:
    """An operator's `slurmd -Z --conf Features=gpu` on a host of no Node: the record
    looks exactly like a defunct one, but sunkd's log has no create for it."""
    log = registered()
    node_gone(log)
    log.add(record(node="op1"), 22.0)
    assert [a.node for a in deletes(log)] == ["n1"]
    log = fresh()
    log.add(record(node="n1"), 5.0)  # before sunkd created anything
    log.add(K8sNodeVanished(node="n1"), 6.0)
    assert deletes(log) == []


def test_the_summary_is_bounded_and_survives_a_snapshot() -> None:
    log = registered()
    state = log.state()
    assert state_from_json(state_to_json(state)).slurmd_created == {UID: ("n1",)}
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, deleted=True), 30.0)
    assert log.state().slurmd_created == {}
    assert SLURMD_CREATED_MAX >= 1000


# ------------------------------------------------------------------- the executor


class FakeSlurm:
    def __init__(self, nodes: list[SlurmNode], jobs: list[SlurmJob] | None) -> None:
        self.nodes, self.jobs = nodes, jobs
        self.deleted: list[tuple[str, str]] = []

    async def get_nodes(self) -> list[SlurmNode]:
        return self.nodes

    async def drain(self, node: str, reason: str) -> bool:
        raise AssertionError("no drain")

    async def resume(self, node: str, **kw: object) -> bool:
        raise AssertionError("no resume")

    async def delete_node(self, node: str, *, feature: str) -> bool:
        self.deleted.append((node, feature))
        return True


class WithJobs(FakeSlurm):
    async def get_jobs(self) -> list[SlurmJob]:
        assert self.jobs is not None
        return self.jobs


def defunct_node(**kw: Any) -> SlurmNode:
    fields: dict[str, Any] = {"name": "n1", "state": "DOWN",
                              "flags": frozenset({"DYNAMIC_NORM", "NOT_RESPONDING"}),
                              "reason": NR, "features": (FEATURE,)}
    fields.update(kw)
    return SlurmNode(**fields)


ACTION = OpenAction("a1", None, "slurm", VERB_DELETE_NODE, "n1", 1, "r",
                    (), 0.0, 1)


def _action(feature: str = FEATURE) -> OpenAction:
    from sunkd.domain.events import Label
    return ACTION._replace(args=(Label("feature", feature),))


async def _run(slurm: FakeSlurm, feature: str = FEATURE) -> bool:
    executor = ActuatorExecutor(slurm, None, slurm_reader=slurm)  # type: ignore[arg-type]
    return await executor.execute(_action(feature), None)


async def test_the_executor_deletes_a_record_slurm_still_reports_defunct() -> None:
    slurm = WithJobs([defunct_node()], [SlurmJob(1, "COMPLETED", nodes=("n1",))])
    assert await _run(slurm) is True
    assert slurm.deleted == [("n1", FEATURE)]


async def test_the_executor_finds_it_gone_already() -> None:
    slurm = WithJobs([], [])
    assert await _run(slurm) is False and slurm.deleted == []


@pytest.mark.parametrize("why,slurm", [
    ("running", WithJobs([defunct_node()], [SlurmJob(2, "RUNNING", nodes=("n1",))])),
    ("pending, requires it", WithJobs([defunct_node()], [
        SlurmJob(3, "PENDING", required_nodes=("n0", "n1"))])),
    ("no job reader", FakeSlurm([defunct_node()], None)),
    ("heard again", WithJobs([defunct_node(flags=frozenset({"DYNAMIC_NORM"}))], [])),
    ("static", WithJobs([defunct_node(flags=frozenset({"NOT_RESPONDING"}))], [])),
    ("allocated", WithJobs([defunct_node(alloc_cpus=2)], [])),
    ("other feature", WithJobs([defunct_node(features=("cpu",))], [])),
])
async def test_the_executor_refuses_what_is_not_defunct_now(why: str,
                                                            slurm: FakeSlurm) -> None:
    with pytest.raises(ActionError) as refused:
        await _run(slurm)
    assert refused.value.retryable, why
    assert slurm.deleted == [], why


# ------------------------------------------------------------------- the property


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Log, bool]:
    """An adoption through sunkd's pod (or none: an operator's record), then arbitrary
    Slurm, Kubernetes and source reports; with whether every condition holds."""
    # Each condition holds three times in four, so the worlds where all but one hold
    # (the adversaries) are drawn often.
    def usually(good: Any, bad: st.SearchStrategy[Any]) -> Any:
        return good if draw(st.integers(0, 3)) else draw(bad)

    created = usually(True, st.just(False))
    log = registered() if created else fresh()
    state = usually("DOWN", st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN"]))
    flags = usually({"DYNAMIC_NORM", "NOT_RESPONDING"}, st.sets(st.sampled_from(
        ["DYNAMIC_NORM", "NOT_RESPONDING", "DRAIN", "COMPLETING"])))
    features = usually({FEATURE}, st.sets(st.sampled_from([FEATURE, "cpu"])))
    reason = usually(NR, st.sampled_from([None, "sunkd: lend", "sunkd: lend : Not responding",
                                          "admin: keep"]))
    alloc = usually(0, st.just(2))
    k8s = usually("gone", st.sampled_from(["unselected", "selected", "unselected-unknown"]))
    pod = usually("none", st.sampled_from(["on-n1", "on-n9"]))
    sources = usually("fresh", st.sampled_from(["stale", "new-term"]))
    if k8s == "gone":
        log.add(K8sNodeVanished(node="n1"), 20.0)
    else:
        labels = () if k8s.startswith("unselected") else k8s_obs("n1").labels
        log.auto_pods = False
        log.add(replace(k8s_obs("n1"), labels=labels), 20.0)
        if k8s != "unselected-unknown":
            log.add(K8sWorkloadObserved(node="n1", pods=(own(),) if pod == "on-n1" else ()),
                    20.0)
        else:
            log.add(K8sWorkloadObserved(node="n1", complete=False), 20.0)
    if pod == "on-n9":
        log.add(k8s_obs("n9"), 20.5)
        log.add(K8sWorkloadObserved(node="n9", pods=(PodRef(
            "default", "gpu-n1", "Running", uid="p9", slurmd="n1", slurmd_nodeset=UID),)),
            20.5)
    log.add(record(state, tuple(flags), tuple(features), reason, alloc), 21.0)
    if sources == "stale":
        log.add(SourceHealth(source="slurm", status="stale"), 22.0, subject="slurm")
    elif sources == "new-term":
        log.add(LeaderElected(epoch=2, identity="b"), 22.0, epoch=2)
    pod_on_n1 = pod == "on-n1" and k8s not in ("gone", "unselected-unknown")
    expected = (created and state == "DOWN" and {"DYNAMIC_NORM", "NOT_RESPONDING"} <= flags
                and "COMPLETING" not in flags and FEATURE in features and alloc == 0
                and reason != "admin: keep" and k8s in ("gone", "unselected")
                and not pod_on_n1 and pod != "on-n9" and sources == "fresh")
    return log, expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_a_delete_is_asked_exactly_when_every_condition_holds(
        world: tuple[Log, bool]) -> None:
    log, expected = world
    asked = deletes(log)
    assert bool(asked) == expected, (asked, log.state().nodes.get("n1"))
    assert all(a.node == "n1" for a in asked)


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.42", "v0.0.45"])
def test_a_pending_jobs_required_nodes_are_read(version: str) -> None:
    """`--nodelist` of a pending job (`required_nodes`, a hostlist in every REST family):
    the executor's job check reads it (captured answers of 22.05, 24.11, 26.05)."""
    import json
    from pathlib import Path

    from sunkd.slurm.normalize import normalize_jobs

    body = json.loads((Path(__file__).parents[1] / "fixtures" / "slurm"
                       / f"{version}_jobs_running.json").read_text())
    jobs = {job.job_id: job for job in normalize_jobs(body)}
    if version == "v0.0.38":
        assert jobs[1].required_nodes == ("node1",), jobs[1]
    else:
        assert jobs[3].state == "PENDING" and jobs[3].required_nodes == ("cap2",), jobs[3]


def test_a_record_made_again_under_the_name_by_someone_else_is_not_deleted() -> None:
    """sunkd's record of n1 vanished from Slurm (an administrator deleted it); an
    operator's own `slurmd -Z -N n1 --conf Features=gpu` made it again: sunkd's log no
    longer proves it, until sunkd creates a pod for n1 again."""
    log = registered()
    log.add(SlurmNodeVanished(node="n1"), 15.0)
    assert log.state().slurmd_created == {}
    node_gone(log)
    assert deletes(log) == []


def test_the_gauge_and_sunkd_status_report_the_record() -> None:
    """What an operator of 22.05 sees (no REST delete): the gauge per Nodeset and a status
    line with the `scontrol delete nodename=` an administrator can run."""
    from sunkd.api.metrics import Metrics
    from sunkd.cli.operator import status_rows
    from sunkd.runtime.config import Settings

    log = registered()
    node_gone(log)
    state = log.state()
    metrics = Metrics()
    metrics.set_state(state, 30.0)
    assert metrics.registry.get_sample_value(
        "sunkd_slurm_defunct_dynamic_nodes", {"nodeset": POOL}) == 1
    rows = {row["node"]: row for row in status_rows(state, Settings(), 30.0)}
    assert "scontrol delete nodename=n1" in rows["n1"]["reason"], rows["n1"]
    log.add(SlurmNodeVanished(node="n1"), 31.0)
    metrics.set_state(log.state(), 31.0)
    assert metrics.registry.get_sample_value(
        "sunkd_slurm_defunct_dynamic_nodes", {"nodeset": POOL}) == 0
