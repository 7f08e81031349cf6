"""The Nodeset finalizer (domain/policy/slurmdfinalizer.py) against adversaries: stale
sources, busy and out-of-contact nodes, someone's DOWN, foreign finalizers, pods
terminating or reappearing, unknown pods, a Dynamic node of the name without the feature.

Properties: never a pod deleted unless Slurm reports its node drained, idle and in
contact; never the finalizer removed while a pod of sunkd's is left (terminating ones
included) or any Node's pods are unknown; never a finalizer added to a Nodeset marked for
deletion; nothing at all on stale sources; and the happy paths do act (a test that cannot
fail is a defect).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.api.metrics import Metrics
from sunkd.domain import wellknown as wk
from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import (
    K8sNodesetObserved,
    K8sWorkloadObserved,
    PodRef,
    SlurmdSpec,
    SlurmNodeObserved,
    SourceHealth,
)
from sunkd.domain.policy import VERB_DRAIN, Decision, StartTransition, effective_pools
from sunkd.domain.policy.slurmd import VERB_SLURMD_DELETE
from sunkd.domain.policy.slurmdfinalizer import (
    DELETE,
    DRAIN,
    VERB_FINALIZER_ADD,
    VERB_FINALIZER_REMOVE,
    EndingNode,
    EndingNodeset,
    OwnPod,
    drain_reason,
    ending_waits,
    plan_end,
    still_busy,
)
from sunkd.domain.slurmnode import slurm_drained
from sunkd.kubernetes.nodeset_status import build_nodeset_status
from sunkd.kubernetes.normalize import parse_nodeset
from tests.unit.domain_world import POOL, POOL_LABEL, Log, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_slurmd_ownership import UID, requests, step, succeed

OURS = wk.FINALIZER_SLURMD_PODS
FOREIGN = "example.com/keep"


def nodeset(*, deleting: bool = True, slurmd: bool = True,
            finalizers: tuple[str, ...] = (OURS,), feature: str | None = None) -> EndingNodeset:
    return EndingNodeset("gpu", "slurm", "uid-gpu", slurmd, deleting, finalizers, feature)


def slurm(state: str = "IDLE", flags: tuple[str, ...] = ("DRAIN",), alloc: int = 0,
          reason: str | None = "sunkd: slurmd pods removed (Nodeset deleted)",
          features: tuple[str, ...] = ()) -> SlurmNodeObserved:
    return SlurmNodeObserved(node="n1", state=state, flags=flags, cpus=4, alloc_cpus=alloc,
                             reason=reason if "DRAIN" in flags or state == "DOWN" else None,
                             features=features)


def pod(name: str = "n1", deleting: bool = False) -> OwnPod:
    return OwnPod(f"slurm/gpu-{name}", f"u-{name}", deleting=deleting)


def node(name: str = "n1", pods: tuple[OwnPod, ...] | None = None,
         observed: SlurmNodeObserved | None = None, *, foreign: bool = False,
         no_slurm: bool = False) -> EndingNode:
    return EndingNode(name, f"k-{name}", None if no_slurm else (observed or slurm()),
                      (pod(name),) if pods is None else pods, foreign)


def verbs(ns: EndingNodeset, *nodes: EndingNode, fresh: bool = True,
          known: bool = True) -> list[tuple[str, str]]:
    return [(s.node, s.verb) for s in plan_end(ns, nodes, sources_fresh=fresh,
                                               all_pods_known=known) if s.verb]


# ------------------------------------------------------------------------ the finalizer


def test_a_live_nodeset_with_slurmd_gets_the_finalizer_beside_foreign_ones() -> None:
    assert verbs(nodeset(deleting=False, finalizers=(FOREIGN,))) == [("", VERB_FINALIZER_ADD)]
    assert verbs(nodeset(deleting=False, finalizers=(FOREIGN, OURS))) == []


def test_no_finalizer_added_on_stale_sources_or_unknown_uid() -> None:
    assert verbs(nodeset(deleting=False, finalizers=()), fresh=False) == []
    ns = EndingNodeset("gpu", "slurm", "", True, False, ())
    assert verbs(ns) == []


def test_a_nodeset_marked_for_deletion_gets_no_new_finalizer() -> None:
    # The API server refuses a new finalizer once deletionTimestamp is set; and the pods
    # then are the garbage collector's anyway: sunkd only drains nicely what it can.
    ns = nodeset(finalizers=(FOREIGN,))
    assert verbs(ns, node(observed=slurm(flags=()))) == [("n1", DRAIN)]
    assert verbs(ns, node(pods=())) == []


def test_finalizer_removed_only_once_no_pod_is_left() -> None:
    ns = nodeset(finalizers=(FOREIGN, OURS))
    assert verbs(ns, node(pods=()), node("n2", pods=())) == [("", VERB_FINALIZER_REMOVE)]
    # a terminating pod counts as left until it is gone
    assert verbs(ns, node(pods=(pod(deleting=True),))) == []
    # pods unknown on a node, or on some Node anywhere: kept
    assert verbs(ns, node(pods=()), known=False) == []
    unknown = EndingNode("n1", "k-n1", slurm(), None)
    assert verbs(ns, unknown) == []


def test_spec_slurmd_removed_from_a_live_nodeset_drains_deletes_then_releases() -> None:
    ns = nodeset(deleting=False, slurmd=False)
    steps = plan_end(ns, [node(observed=slurm(flags=()))], sources_fresh=True,
                     all_pods_known=True)
    drain = [s for s in steps if s.verb == DRAIN]
    assert drain and drain_reason(ns) == "sunkd: slurmd pods removed (spec.slurmd removed)"
    assert verbs(ns, node()) == [("n1", DELETE)]
    assert verbs(ns, node(pods=())) == [("", VERB_FINALIZER_REMOVE)]
    # never put on again while spec.slurmd is absent
    assert verbs(nodeset(deleting=False, slurmd=False, finalizers=()), node(pods=())) == []


# ------------------------------------------------------------------------- per node


def test_the_deletion_drains_then_deletes_idle_nodes_and_waits_for_busy_ones() -> None:
    ns = nodeset()
    idle_undrained = node("n1", observed=slurm(flags=()))
    idle_drained = node("n2")
    busy = node("n3", observed=slurm("ALLOCATED", alloc=4))
    steps = plan_end(ns, [idle_undrained, idle_drained, busy], sources_fresh=True,
                     all_pods_known=True)
    assert [(s.node, s.verb) for s in steps if s.verb] == [("n1", DRAIN), ("n2", DELETE)]
    assert still_busy(steps) == ["n3"]
    assert any(s.node == "" and "finalizer kept" in s.reason for s in steps)
    # the drain of a busy node that has none yet comes at once: no new job lands there
    assert verbs(ns, node(observed=slurm("MIXED", flags=(), alloc=1))) == [("n1", DRAIN)]


def test_never_a_delete_out_of_contact_completing_or_unreported() -> None:
    ns = nodeset()
    for observed in (slurm("DOWN", ("DRAIN", "NOT_RESPONDING")),
                     slurm("IDLE", ("COMPLETING", "DRAIN")),
                     slurm("IDLE", ("DRAIN", "UNDRAIN")),
                     slurm("IDLE", ("DRAIN", "INVALID_REG"))):
        assert verbs(ns, node(observed=observed)) == [], observed
    assert verbs(ns, node(no_slurm=True)) == []


def test_someones_down_is_not_drained_over_and_their_drain_is_enough() -> None:
    ns = nodeset()
    down = slurm("DOWN", flags=(), reason="bad DIMM")
    assert verbs(ns, node(observed=down, foreign=True)) == []
    theirs = slurm(reason="maintenance")
    assert verbs(ns, node(observed=theirs, foreign=True)) == [("n1", DELETE)]


def test_a_dynamic_nodes_namesake_without_the_feature_is_not_ours() -> None:
    ns = nodeset(feature="gpu")
    assert verbs(ns, node(observed=slurm())) == []
    assert verbs(ns, node(observed=slurm(features=("gpu",)))) == [("n1", DELETE)]


def test_stale_sources_decide_nothing() -> None:
    assert verbs(nodeset(), node(), node("n2", pods=()), fresh=False) == []


# ------------------------------------------------------------------------- property

STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN", "UNKNOWN", "FUTURE"])
FLAGS = st.lists(st.sampled_from(["DRAIN", "UNDRAIN", "NOT_RESPONDING", "COMPLETING",
                                  "INVALID_REG"]), unique=True).map(lambda f: tuple(sorted(f)))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[EndingNodeset, list[EndingNode], bool, bool]:
    finalizers = tuple(draw(st.lists(st.sampled_from([OURS, FOREIGN, "x.io/other"]),
                                     unique=True)))
    ns = EndingNodeset("gpu", "slurm", draw(st.sampled_from(["uid-gpu", ""])),
                       draw(st.booleans()), draw(st.booleans()), finalizers,
                       draw(st.sampled_from([None, "gpu"])))
    nodes = []
    for i in range(draw(st.integers(0, 4))):
        observed = None if draw(st.booleans()) and draw(st.booleans()) else SlurmNodeObserved(
            node=f"n{i}", state=draw(STATES), flags=draw(FLAGS),
            alloc_cpus=draw(st.sampled_from([0, 0, 2])), cpus=4,
            reason=draw(st.sampled_from([None, "sunkd: slurmd pods removed (Nodeset deleted)",
                                         "admin"])),
            features=draw(st.sampled_from([(), ("gpu",)])))
        pods = None if draw(st.integers(0, 5)) == 0 else tuple(
            OwnPod(f"slurm/gpu-n{i}-{j}", f"u{i}{j}", deleting=draw(st.booleans()))
            for j in range(draw(st.integers(0, 2))))
        nodes.append(EndingNode(f"n{i}", draw(st.sampled_from([f"k{i}", None])), observed,
                                pods, draw(st.booleans())))
    return ns, nodes, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_property_never_unsafe(world: tuple[EndingNodeset, list[EndingNode], bool, bool]
                               ) -> None:
    ns, nodes, fresh, known = world
    steps = plan_end(ns, nodes, sources_fresh=fresh, all_pods_known=known)
    acted = [s for s in steps if s.verb]
    if not fresh or not ns.uid:
        assert not acted
        return
    by_name = {n.name: n for n in nodes}
    for one in acted:
        if one.verb == DELETE:
            target = by_name[one.node]
            assert ns.ending and slurm_drained(target.slurm)
            assert target.pods is not None
            assert one.uid in {p.uid for p in target.pods if not p.deleting}
            if ns.feature is not None:
                assert target.slurm is not None and ns.feature in target.slurm.features
        elif one.verb == DRAIN:
            target = by_name[one.node]
            assert ns.ending and target.pods and not target.foreign_word
            assert target.slurm is not None and "DRAIN" not in target.slurm.flags
        elif one.verb == VERB_FINALIZER_REMOVE:
            assert ns.ending and OURS in ns.finalizers and known
            assert all(n.pods is not None and not n.pods for n in nodes)
            assert not any(s.verb in (DELETE, DRAIN) for s in acted)
        elif one.verb == VERB_FINALIZER_ADD:
            assert not ns.deleting and ns.slurmd and OURS not in ns.finalizers
            assert acted == [one]
        else:
            raise AssertionError(one)


# ------------------------------------------------------------- the daemon's round (decide)


def _world(*, deleting: bool, finalizer: bool = True, busy: str = "n3") -> Log:
    """n1..n3 Slurm-owned, each running sunkd's registered slurmd pod; `busy` runs a job."""
    log = _cluster(3)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               partitions=("gpu",), slurmd=SPEC, deleting=deleting,
                               slurmd_finalizer=finalizer), 2.5)
    for name in ("n1", "n2", "n3"):
        log.add(K8sWorkloadObserved(node=name, pods=(_pod(name, busy=name == busy),)), 2.5)
        if name == busy:
            log.add(slurm_obs(name, "ALLOCATED", alloc_cpus=4), 2.5)
    return log


SPEC = SlurmdSpec(image="slurmd:22.05", termination_grace_seconds=30)


def _pod(name: str, *, deleting: bool = False, busy: bool = False) -> PodRef:
    return PodRef("default", f"gpu-{name}", "Running", uid=f"p-{name}", pool_pod=False,
                  slurmd=name, slurmd_nodeset=UID, started_at=2.0, deleting=deleting,
                  slurmd_busy=busy)


def _by_node(decisions: list[Decision]) -> list[tuple[str, str]]:
    """The requests but the busy label's (the PDB protects n3's pod meanwhile)."""
    return sorted((a.node, a.verb) for a in requests(decisions) if a.verb != "slurmd-label")


def test_decide_puts_the_finalizer_on_a_live_nodeset_once() -> None:
    log = _world(deleting=False, finalizer=False, busy="")
    added = step(log, 3.0)
    assert _by_node(added) == [("n1", VERB_FINALIZER_ADD)]
    (action,) = requests(added)
    args = {a.key: a.value for a in action.args}
    assert (args["nodeset"], args["nodeset_uid"]) == (POOL, UID)
    assert requests(step(log, 3.5)) == []  # open: not asked twice


def test_decide_deletes_a_terminating_nodesets_pods_idle_first_busy_after_its_job() -> None:
    log = _world(deleting=True)
    drained = step(log, 3.0)
    assert _by_node(drained) == [("n1", VERB_DRAIN), ("n2", VERB_DRAIN), ("n3", VERB_DRAIN)]
    reasons = {a.node: next(x.value for x in a.args if x.key == "reason")
               for a in requests(drained) if a.verb == VERB_DRAIN}
    assert set(reasons.values()) == {"sunkd: slurmd pods removed (Nodeset deleted)"}
    succeed(log, drained, 3.1)
    for name in ("n1", "n2"):
        log.add(slurm_obs(name, flags=("DRAIN",), reason=reasons[name]), 3.2)
    log.add(slurm_obs("n3", "ALLOCATED", flags=("DRAIN",), reason=reasons["n3"],
                      alloc_cpus=4), 3.2)
    deleted = step(log, 4.0)
    assert _by_node(deleted) == [("n1", VERB_SLURMD_DELETE), ("n2", VERB_SLURMD_DELETE)]
    grace = {a.node: next(x.value for x in a.args if x.key == "grace_seconds")
             for a in requests(deleted) if a.verb == VERB_SLURMD_DELETE}
    assert grace == {"n1": "30", "n2": "30"}
    succeed(log, deleted, 4.1)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 4.5)
    log.add(K8sWorkloadObserved(node="n2", pods=(_pod("n2", deleting=True),)), 4.5)
    assert _by_node(step(log, 5.0)) == []  # n3's job runs, n2's pod terminating
    state = log.state()
    status = build_nodeset_status(state, effective_pools(state), POOL, 1, 5.0)
    progressing = next(c for c in status["conditions"]
                       if c["type"] == wk.CONDITION_SLURMD_PROGRESSING)
    assert progressing["reason"] == wk.REASON_DELETING
    assert "waiting for jobs on n3" in progressing["message"]
    log.add(K8sWorkloadObserved(node="n2", pods=()), 5.5)
    log.add(slurm_obs("n3", flags=("DRAIN",), reason=reasons["n3"]), 6.0)
    # the busy label comes off first (the same side of n3: one action at a time)
    unlabel = step(log, 6.2)
    assert [a.verb for a in requests(unlabel)] == ["slurmd-label"]
    succeed(log, unlabel, 6.3)
    log.add(K8sWorkloadObserved(node="n3", pods=(_pod("n3"),)), 6.4)
    last = step(log, 6.5)
    assert _by_node(last) == [("n3", VERB_SLURMD_DELETE)]
    succeed(log, last, 6.6)
    log.add(K8sWorkloadObserved(node="n3", pods=()), 7.0)
    released = step(log, 7.5)
    assert _by_node(released) == [("n1", VERB_FINALIZER_REMOVE)]
    # no move started on the way (a terminating Nodeset's pool starts none), no create
    assert not [d for d in released if isinstance(d, StartTransition)]


def test_decide_keeps_the_finalizer_while_a_pods_node_is_unknown_or_stale() -> None:
    log = _world(deleting=True, busy="")
    for name in ("n1", "n2", "n3"):
        log.add(K8sWorkloadObserved(node=name, pods=()), 3.0)
    log.add(SourceHealth(source="slurm", status="stale"), 3.0, subject="slurm")
    assert requests(step(log, 3.5)) == []
    log.add(SourceHealth(source="slurm", status="fresh"), 4.0, subject="slurm")
    assert _by_node(step(log, 4.5)) == [("n1", VERB_FINALIZER_REMOVE)]


# ------------------------------------------------------------------ what the source reads


def test_the_source_reads_the_deletion_and_only_sunkds_finalizer() -> None:
    def parsed(meta: dict[str, object]) -> K8sNodesetObserved:
        return parse_nodeset({"metadata": {"name": "gpu", "namespace": "slurm",
                                           "uid": "u", **meta},
                              "spec": {"slurmd": {"image": "slurmd:22.05"}}})

    plain = parsed({})
    assert (plain.deleting, plain.slurmd_finalizer) == (False, False)
    marked = parsed({"deletionTimestamp": "2026-12-06T05:00:00Z",
                     "finalizers": [FOREIGN, OURS]})
    assert (marked.deleting, marked.slurmd_finalizer) == (True, True)
    assert not parsed({"finalizers": [FOREIGN]}).slurmd_finalizer
    assert not parsed({"finalizers": OURS}).slurmd_finalizer  # not a list: not ours
    # written to the log only when set: older logs and plain Nodesets encode as before
    assert "deleting" not in encode_payload(plain) and "slurmd_finalizer" not in \
        encode_payload(plain)
    assert decode_payload(K8sNodesetObserved.KIND, encode_payload(marked)) == marked


def test_decide_spec_slurmd_removed_drains_deletes_and_releases_without_stopping_moves(
        ) -> None:
    log = _world(deleting=False, busy="")
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(POOL_LABEL,),
                               partitions=("gpu",), slurmd=None, slurmd_finalizer=True), 2.8)
    drained = step(log, 3.0)
    assert _by_node(drained) == [("n1", VERB_DRAIN), ("n2", VERB_DRAIN), ("n3", VERB_DRAIN)]
    reason = next(x.value for x in requests(drained)[0].args if x.key == "reason")
    assert reason == "sunkd: slurmd pods removed (spec.slurmd removed)"
    succeed(log, drained, 3.1)
    for name in ("n1", "n2", "n3"):
        log.add(slurm_obs(name, flags=("DRAIN",), reason=reason), 3.2)
    deleted = step(log, 4.0)
    assert [v for _, v in _by_node(deleted)] == [VERB_SLURMD_DELETE] * 3
    assert {next(x.value for x in a.args if x.key == "grace_seconds")
            for a in requests(deleted)} == {"60"}  # no spec left: the default grace
    succeed(log, deleted, 4.1)
    for name in ("n1", "n2", "n3"):
        log.add(K8sWorkloadObserved(node=name, pods=()), 4.5)
    assert _by_node(step(log, 5.0)) == [("n1", VERB_FINALIZER_REMOVE)]


def test_the_gauge_says_why_a_terminating_nodeset_waits() -> None:
    log = _world(deleting=True)
    log.add(K8sWorkloadObserved(node="n2", pods=(_pod("n2", deleting=True),)), 3.0)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 3.0)
    state = log.state()
    pools = effective_pools(state)
    members = [state.nodes[n] for n in ("n1", "n2", "n3")]
    waits = ending_waits(state.nodesets[POOL], members, sources_fresh=True)
    # n3 runs a job but is not drained yet (its drain is this round's step), n2's pod
    # terminates
    assert waits == {"terminating": 1}
    log.add(slurm_obs("n3", "ALLOCATED", flags=("DRAIN",), reason="x", alloc_cpus=4), 3.5)
    state = log.state()
    members = [state.nodes[n] for n in ("n1", "n2", "n3")]
    assert ending_waits(state.nodesets[POOL], members, sources_fresh=True) == {
        "terminating": 1, "busy": 1}
    assert ending_waits(state.nodesets[POOL], members, sources_fresh=False) == {"stale": 1}
    metrics = Metrics()
    metrics.set_state(state, 4.0, pools)
    text = metrics.render().decode()
    assert 'sunkd_nodeset_ending_waits{pool="default/gpu",why="busy"} 1.0' in text
