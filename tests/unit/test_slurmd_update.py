"""The protected rolling update of a Nodeset's slurmd pods (docs/nodeset.md, "Rolling
update").

A change of `spec.slurmd` makes every pod's revision outdated. Under `RollingUpdate`,
sunkd replaces them with the repair's steps: its own drain first, DRAIN with nothing
allocated, delete, create at the new revision, registered, undrain; at most
`maxUnavailable` nodes unavailable at once (in update, under repair, or not registered),
idle nodes first, busy ones last by their jobs' end. `OnDelete` replaces no running pod.
Adversaries: a job on the node, someone else's drain, a revision change mid-update, a
pin to Kubernetes, unknown revisions, arbitrary Slurm states and action failures
(the property at the end).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodesetObserved,
    K8sWorkloadObserved,
    PodRef,
    SlurmdSpec,
    SlurmNodeObserved,
)
from sunkd.domain.ownership import our_drain
from sunkd.domain.policy import VERB_DRAIN, VERB_RESUME, Decision, StartTransition, effective_pools
from sunkd.domain.policy.slurmd import VERB_SLURMD_CREATE, VERB_SLURMD_DELETE, revision
from sunkd.domain.policy.slurmdupdate import in_update, max_unavailable
from sunkd.domain.slurmnode import slurm_busy, slurm_drained
from sunkd.kubernetes.nodeset_status import build_nodeset_status
from tests.unit.domain_world import POOL, POOL_LABEL, SLURMD_STARTED, Log, k8s_obs, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_slurmd_ownership import (
    UID,
    requests,
    settle_adversely,
    step,
    succeed,
    verbs,
)

OLD = SlurmdSpec(image="slurmd:1")
NEW = SlurmdSpec(image="slurmd:2")


def pod(node: str, spec: SlurmdSpec = OLD, *, uid: str = "", **kw: object) -> PodRef:
    return PodRef("default", f"gpu-{node}", "Running", uid=uid or f"p-{node}",
                  pool_pod=False, slurmd=node, slurmd_nodeset=UID,
                  started_at=kw.pop("started_at", 4.0),  # type: ignore[arg-type]
                  slurmd_revision=revision(spec), **kw)  # type: ignore[arg-type]


def nodeset(log: Log, spec: SlurmdSpec, now: float) -> None:
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=spec), now)


def brought_up(nodes: int = 3, spec: SlurmdSpec = OLD) -> Log:
    """n1.. Slurm-owned; sunkd created each slurmd pod (at `spec`) and each registered."""
    log = _cluster(nodes)
    nodeset(log, spec, 2.0)
    create = step(log, 3.0)
    assert verbs(create) == [VERB_SLURMD_CREATE] * nodes, create
    succeed(log, create, 3.1)
    for i in range(1, nodes + 1):
        log.add(K8sWorkloadObserved(node=f"n{i}", pods=(pod(f"n{i}", spec),)), 4.0)
    assert verbs(step(log, 5.0)) == []
    return log


def by_node(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(action.node, action.verb) for action in requests(decisions)]


def arg(decisions: list[Decision], verb: str, key: str) -> str | None:
    for action in requests(decisions):
        if action.verb == verb:
            return next((a.value for a in action.args if a.key == key), None)
    return None


def replace(log: Log, node: str, now: float, *, spec: SlurmdSpec = NEW,
            reason: str = wk.REASON_SLURMD_UPDATE, uid: str = "") -> float:
    """The drain shows on `node`: the round deletes its pod, the pod goes, the round
    creates it at `spec`, it registers, the round undrains. Returns the time after."""
    log.add(slurm_obs(node, flags=("DRAIN",), reason=reason), now)
    delete = step(log, now + 0.5)
    assert by_node(delete) == [(node, VERB_SLURMD_DELETE)], delete
    assert arg(delete, VERB_SLURMD_DELETE, "slurmd_repair") is None  # in contact: drained
    succeed(log, delete, now + 0.6)
    log.add(K8sWorkloadObserved(node=node, pods=()), now + 1.0)
    create = step(log, now + 1.5)
    assert by_node(create) == [(node, VERB_SLURMD_CREATE)], create
    assert arg(create, VERB_SLURMD_CREATE, "revision") == revision(spec)
    succeed(log, create, now + 1.6)
    log.add(K8sWorkloadObserved(node=node, pods=(pod(node, spec, uid=uid or f"new-{node}",
                                                     started_at=now + 2.0),)), now + 2.0)
    resume = step(log, now + 2.5)
    assert by_node(resume) == [(node, VERB_RESUME)], resume
    assert arg(resume, VERB_RESUME, "expect_reason") == reason
    succeed(log, resume, now + 2.6)
    log.add(slurm_obs(node), now + 3.0)
    return now + 3.5


POD_OR_DRAIN = {VERB_DRAIN, VERB_RESUME, VERB_SLURMD_CREATE, VERB_SLURMD_DELETE}


def pod_or_drain(decisions: list[Decision]) -> set[str]:
    """The verbs of the update (a foreign drain is a Slurm hold: its mirror is no business
    of this test)."""
    return set(verbs(decisions)) & POD_OR_DRAIN


def drains(decisions: list[Decision]) -> list[str]:
    return [a.node for a in requests(decisions) if a.verb == VERB_DRAIN]


# ----------------------------------------------------------------------------- examples


def test_max_unavailable_is_an_integer_or_a_percentage_rounded_down_at_least_one() -> None:
    assert max_unavailable("1", 3) == 1 and max_unavailable("2", 3) == 2
    assert max_unavailable("25%", 3) == 1  # 0.75 -> at least one
    assert max_unavailable("50%", 3) == 1  # 1.5 -> 1
    assert max_unavailable("50%", 10) == 5 and max_unavailable("34%", 10) == 3
    assert max_unavailable("100%", 4) == 4 and max_unavailable("10%", 0) == 1


def test_a_spec_change_replaces_every_pod_one_at_a_time_and_undrains() -> None:
    """Today (updateStrategy parsed only): the spec changes and nothing happens."""
    log = brought_up()
    nodeset(log, NEW, 10.0)
    now = 11.0
    done = []
    for _ in range(3):
        decisions = step(log, now)
        assert len(drains(decisions)) == 1, decisions  # maxUnavailable 1
        (node,) = drains(decisions)
        assert arg(decisions, VERB_DRAIN, "reason") == wk.REASON_SLURMD_UPDATE
        succeed(log, decisions, now + 0.1)
        assert drains(step(log, now + 0.2)) == []  # the next waits for this one
        now = replace(log, node, now + 0.3)
        done.append(node)
    assert done == ["n1", "n2", "n3"]  # all idle: by name
    assert verbs(step(log, now + 1.0)) == []
    state = log.state()
    status = build_nodeset_status(state, effective_pools(state), POOL, 1, now + 1.0)
    assert status["slurmd"]["updated"] == 3 and status["slurmd"]["revision"] == revision(NEW)


def test_idle_nodes_first_busy_ones_last_by_their_jobs_end() -> None:
    log = brought_up()
    log.add(dataclasses.replace(slurm_obs("n1", state="MIXED", alloc_cpus=4), jobs=1,
                                job_end=900.0), 5.0)
    log.add(dataclasses.replace(slurm_obs("n2", state="MIXED", alloc_cpus=4), jobs=1,
                                job_end=500.0), 5.0)
    nodeset(log, dataclasses.replace(NEW, max_unavailable="100%"), 10.0)
    decisions = step(log, 11.0)
    order = drains(decisions)
    assert order == ["n3", "n2", "n1"], decisions  # idle, then the earliest end


def test_max_unavailable_counts_unregistered_and_repaired_nodes() -> None:
    log = brought_up(4)
    nodeset(log, dataclasses.replace(NEW, max_unavailable="50%"), 10.0)  # 2 of 4
    log.add(slurm_obs("n4", flags=("NOT_RESPONDING",)), 10.0)  # n4's slurmd unheard
    decisions = step(log, 11.0)
    assert drains(decisions) == ["n1"], decisions  # 2 - 1 unavailable
    succeed(log, decisions, 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 11.2)
    assert drains(step(log, 11.3)) == []
    log.add(slurm_obs("n4"), 12.0)  # n4 heard again: one slot more
    assert drains(step(log, 12.5)) == ["n2"]


def test_a_busy_node_is_drained_and_its_pod_deleted_only_once_its_jobs_ended() -> None:
    log = brought_up(1)
    log.add(slurm_obs("n1", state="MIXED", alloc_cpus=4), 5.0)
    # The busy label sunkd set when the job started (policy/slurmdbusy.py).
    log.add(K8sWorkloadObserved(node="n1", pods=(pod("n1", slurmd_busy=True),)), 6.0)
    nodeset(log, NEW, 10.0)
    decisions = step(log, 11.0)
    assert drains(decisions) == ["n1"]
    succeed(log, decisions, 11.1)
    for state, flags in (("MIXED", ("DRAIN",)), ("IDLE", ("COMPLETING", "DRAIN"))):
        log.add(slurm_obs("n1", state=state, flags=flags, reason=wk.REASON_SLURMD_UPDATE,
                          alloc_cpus=4 if state == "MIXED" else 0), 12.0)
        for now in (12.5, 100.0, 1000.0):
            assert VERB_SLURMD_DELETE not in verbs(step(log, now))
    replace(log, "n1", 1001.0)


def test_someone_elses_drain_blocks_the_update_and_is_never_lifted() -> None:
    log = brought_up(1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="bad DIMM"), 5.0)
    nodeset(log, NEW, 10.0)
    for now in (11.0, 100.0, 1000.0):
        assert pod_or_drain(step(log, now)) == set()
    # A drain of sunkd's text that its log does not prove is someone else's too.
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 1001.0)
    for now in (1002.0, 2000.0):
        assert pod_or_drain(step(log, now)) == set()


def test_a_drain_someone_puts_over_sunkds_update_drain_stops_the_update() -> None:
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    decisions = step(log, 11.0)
    succeed(log, decisions, 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 11.2)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="maintenance"), 12.0)
    for now in (12.5, 100.0):
        assert pod_or_drain(step(log, now)) == set()


def test_a_revision_change_mid_update_replaces_the_new_pod_again_before_the_undrain() -> None:
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    succeed(log, step(log, 11.0), 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 12.0)
    succeed(log, step(log, 12.5), 12.6)  # the delete
    log.add(K8sWorkloadObserved(node="n1", pods=()), 13.0)
    succeed(log, step(log, 13.5), 13.6)  # the create, at NEW
    newer = SlurmdSpec(image="slurmd:3")
    nodeset(log, newer, 13.7)  # the spec changes again
    log.add(K8sWorkloadObserved(node="n1", pods=(pod("n1", NEW, uid="b", started_at=14.0),)),
            14.0)
    delete = step(log, 14.5)  # registered at NEW, outdated: replaced, not undrained
    assert by_node(delete) == [("n1", VERB_SLURMD_DELETE)], delete
    assert arg(delete, VERB_SLURMD_DELETE, "pod_uid") == "b"
    succeed(log, delete, 14.6)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 15.0)
    # The second create in a row under one drain: the repair's backoff (60 s after the
    # previous create), at the newest revision.
    assert VERB_SLURMD_CREATE not in verbs(step(log, 15.5))
    create = step(log, 13.6 + 61.0)
    assert arg(create, VERB_SLURMD_CREATE, "revision") == revision(newer)


def test_the_spec_changing_back_mid_update_lifts_the_drain_without_a_replacement() -> None:
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    succeed(log, step(log, 11.0), 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 12.0)
    nodeset(log, OLD, 12.1)
    assert by_node(step(log, 12.5)) == [("n1", VERB_RESUME)]


def test_on_delete_replaces_no_running_pod_and_recreates_a_deleted_one_new() -> None:
    log = brought_up(1)
    on_delete = dataclasses.replace(NEW, update_strategy="OnDelete")
    assert revision(on_delete) == revision(NEW)
    nodeset(log, on_delete, 10.0)
    for now in (11.0, 100.0, 1000.0):
        assert verbs(step(log, now)) == []
    log.add(K8sWorkloadObserved(node="n1", pods=()), 1001.0)  # someone deleted it
    drain = step(log, 1001.5)
    assert verbs(drain) == [VERB_DRAIN]  # the repair's
    succeed(log, drain, 1001.6)
    reason = arg(drain, VERB_DRAIN, "reason")
    assert reason is not None and reason.startswith(wk.REASON_SLURMD_REPAIR)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 1002.0)
    create = step(log, 1002.5)
    assert arg(create, VERB_SLURMD_CREATE, "revision") == revision(NEW)


def test_strategy_turned_on_delete_mid_update_lifts_the_drain() -> None:
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    succeed(log, step(log, 11.0), 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 12.0)
    nodeset(log, dataclasses.replace(NEW, update_strategy="OnDelete"), 12.1)
    assert by_node(step(log, 12.5)) == [("n1", VERB_RESUME)]


def test_no_update_on_unknown_revisions_pods_or_stale_sources_nor_a_pinned_node() -> None:
    log = brought_up(1)
    log.add(K8sWorkloadObserved(node="n1", pods=(dataclasses.replace(
        pod("n1"), slurmd_revision=""),)), 5.0)
    nodeset(log, NEW, 10.0)
    assert verbs(step(log, 11.0)) == []  # revision not reported: unknown
    log = brought_up(1)
    log.add(K8sWorkloadObserved(node="n1", pods=(pod("n1"),), complete=False), 5.0)
    nodeset(log, NEW, 10.0)  # the Node's pods unknown
    assert verbs(step(log, 11.0)) == []
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    log.add(k8s_obs("n1", pin="kubernetes"), 10.5)
    decisions = step(log, 11.0)
    assert any(isinstance(d, StartTransition) for d in decisions)  # lent, not updated
    assert arg(decisions, VERB_DRAIN, "reason") != wk.REASON_SLURMD_UPDATE


def test_the_updates_recreate_does_not_back_off_but_a_failing_new_pod_does() -> None:
    """The pod the update deleted had lived: its replacement is attempt 1, at once, even
    minutes after the previous create; a new pod that fails is recreated with backoff."""
    log = brought_up(1)
    nodeset(log, NEW, 10.0)
    succeed(log, step(log, 11.0), 11.1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=wk.REASON_SLURMD_UPDATE), 12.0)
    succeed(log, step(log, 12.5), 12.6)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 13.0)
    create = step(log, 13.5)
    (action,) = requests(create)
    assert action.verb == VERB_SLURMD_CREATE and action.attempt == 1
    succeed(log, create, 13.6)
    log.add(K8sWorkloadObserved(node="n1", pods=(dataclasses.replace(
        pod("n1", NEW, uid="b"), phase="Failed"),)), 14.0)
    log.add(slurm_obs("n1", flags=("DRAIN", "NOT_RESPONDING"),
                      reason=wk.REASON_SLURMD_UPDATE), 14.0)
    succeed(log, step(log, 14.5), 14.6)  # the failed pod deleted (the repair's)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 15.0)
    assert VERB_SLURMD_CREATE not in verbs(step(log, 16.0))  # backing off
    later = step(log, 13.6 + 61.0)
    assert VERB_SLURMD_CREATE in verbs(later)
    assert requests(later)[0].attempt == 2


def test_in_update_counts_a_requested_drain_before_slurm_shows_it() -> None:
    log = brought_up(2)
    nodeset(log, NEW, 10.0)
    assert drains(step(log, 11.0)) == ["n1"]  # requested, no outcome yet
    state = log.state()
    assert in_update(state.nodes["n1"])
    assert drains(step(log, 11.5)) == []  # n2 waits: n1 holds the slot


# ------------------------------------------------------------------------ the property


def _obs(node: str, draw: st.DrawFn, reason: str | None) -> SlurmNodeObserved:
    state = draw(st.sampled_from(("IDLE", "IDLE", "MIXED", "DOWN", "COMPLETING")))
    flags = set(draw(st.sets(st.sampled_from(("DRAIN", "NOT_RESPONDING", "COMPLETING")))))
    if draw(st.integers(0, 2)) == 0:
        flags.add("DRAIN")
    text = draw(st.sampled_from((reason, reason, None, "bad DIMM",
                                 wk.REASON_SLURMD_UPDATE)))
    # Slurm may still report the slurmd from before the node's current pod (slurmctld
    # has not pinged it since), or no start time at all.
    started = draw(st.sampled_from((SLURMD_STARTED, SLURMD_STARTED, 3.0, None)))
    return slurm_obs(node, state=state, flags=tuple(sorted(flags)), reason=text,
                     alloc_cpus=4 if state == "MIXED" else 0, slurmd_start_time=started)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_pod_deleted_under_an_allocation_and_never_more_than_max_unavailable(
    data: st.DataObject,
) -> None:
    """Rounds of the daemon over four Slurm-owned nodes while the spec changes (once or
    twice, maxUnavailable 1, 2 or 50%), with Slurm reporting any state, allocation and
    reason (sunkd's update drain, someone's, a copy of sunkd's text), pods going and
    coming at any revision, and actions succeeding or failing: no slurmd pod deleted
    while Slurm reports an allocation (or without DRAIN), no outdated pod deleted under a
    drain that is not sunkd's, no resume of a drain sunkd's log does not prove, and never
    more nodes in update than maxUnavailable."""
    bound = data.draw(st.sampled_from(("1", "2", "50%")))
    log = brought_up(4)
    specs = [dataclasses.replace(NEW, max_unavailable=bound),
             dataclasses.replace(SlurmdSpec(image="slurmd:3"), max_unavailable=bound)]
    nodeset(log, specs[0], 10.0)
    now = 11.0
    for _ in range(data.draw(st.integers(2, 10))):
        if data.draw(st.integers(0, 9)) == 0:
            nodeset(log, specs[1], now)
        for i in range(1, 5):
            node = f"n{i}"
            if data.draw(st.integers(0, 2)) == 0:
                current = log.state().nodes[node].slurm
                log.add(_obs(node, data.draw, current.reason if current else None), now)
            if data.draw(st.integers(0, 3)) == 0:
                spec = data.draw(st.sampled_from((OLD, *specs)))
                pods = data.draw(st.sampled_from((
                    (), (pod(node, spec, uid=f"u{now}"),),
                    (dataclasses.replace(pod(node, spec), deleting=True),))))
                log.add(K8sWorkloadObserved(node=node, pods=pods), now)
        now += data.draw(st.sampled_from((0.5, 1.0, 70.0)))
        state = log.state()
        decisions = step(log, now)
        after = log.state()
        updating = [n for n in after.nodes.values() if in_update(n)]
        assert len(updating) <= max_unavailable(bound, 4), [n.name for n in updating]
        event(f"verbs={sorted(set(verbs(decisions)))} in_update={len(updating)}")
        for action in requests(decisions):
            node_state = state.nodes[action.node]
            slurm = node_state.slurm
            assert slurm is not None
            args = {label.key: label.value for label in action.args}
            if action.verb == VERB_SLURMD_DELETE and node_state.transition is None:
                assert not slurm_busy(slurm) and "DRAIN" in slurm.flags
                if "slurmd_repair" not in args:  # the update's: registered, in contact
                    assert slurm_drained(slurm) and our_drain(node_state)
                    assert (slurm.reason or "").startswith(wk.REASON_SLURMD_UPDATE)
            if action.verb == VERB_RESUME:
                assert our_drain(node_state)
                if node_state.transition is None:  # the update's or the repair's: the
                    # slurmd Slurm hears started with the pod (not before it)
                    assert any(p.started_at is not None and p.phase == "Running"
                               and (slurm.slurmd_start_time or 0) >= p.started_at
                               for p in node_state.pods or ()), slurm
            if action.verb == VERB_DRAIN:
                assert args["reason"].startswith("sunkd:")
        settle_adversely(log, decisions, now + 0.1, data.draw)
        now += 0.5


