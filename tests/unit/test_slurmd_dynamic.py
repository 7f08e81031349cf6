"""Dynamic registration: a Nodeset's node exists in Slurm only once its slurmd pod
(`slurmd -Z --conf Features=<nodeset>`) registered it, and it is the Nodeset's only with
the Nodeset's feature.

The adoption of a node Slurm has never reported (Slurm source fresh): taint -> create the
pod -> Slurm reports the node with the feature -> adopted. Adversaries: a node of the
same name without the feature (a slurm.conf line, a slurmd that joined an existing
record), one with another Nodeset's feature, a pod that never registers, a Static
Nodeset (never reported stays unknown). Property: over arbitrary Slurm reports (features,
states, flags) and pod reports, nothing completes a move to Slurm, undrains, counts the
node registered or lends it unless Slurm reports it with the Nodeset's feature.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    K8sNodesetObserved,
    K8sWorkloadObserved,
    PodRef,
    SlurmdSpec,
    SlurmNodeObserved,
    SlurmNodeVanished,
)
from sunkd.domain.ownership import assess
from sunkd.domain.policy import (
    VERB_LOCK,
    VERB_RESUME,
    CompleteTransition,
    Decision,
    RequestAction,
    StartTransition,
)
from sunkd.domain.policy.slurmd import (
    REGISTER_BOUND_SECONDS,
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    counts,
    nodes_from_state,
    nodeset_of,
    registered,
)
from sunkd.domain.slurmdgone import dynamic_absent, dynamic_nodeset, slurmd_registered
from sunkd.domain.state import Phase
from tests.unit.domain_world import POOL, Log, k8s_obs, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_slurmd_ownership import own, requests, step, succeed, verbs

UID = "U"
FEATURE = "gpu"  # POOL is default/gpu: the Nodeset's name
DYNAMIC = SlurmdSpec(image="i", registration="Dynamic", conf_server="ctl:6817")


def with_features(obs: SlurmNodeObserved, *features: str) -> SlurmNodeObserved:
    return replace(obs, features=tuple(features))


def fresh(spec: SlurmdSpec = DYNAMIC) -> Log:
    """Fresh sources, a Dynamic Nodeset, and Node n1 that Slurm has never reported."""
    log = _cluster(0)
    log.add(K8sNodesetObserved(pool=POOL, uid=UID, node_selector=(k8s_obs("n1").labels[0],),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=spec), 1.0)
    log.add(k8s_obs("n1", tainted=False), 1.0)
    return log


def adopted_until_pod_runs(log: Log) -> None:
    """The adoption to the point where sunkd's pod runs (Slurm has not heard it yet)."""
    lock = step(log, 2.0)
    assert any(isinstance(d, StartTransition) for d in lock), lock
    assert verbs(lock) == [VERB_LOCK], lock
    succeed(log, lock, 2.1)
    log.add(k8s_obs("n1"), 2.2)
    create = step(log, 3.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 3.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=4.0),)), 4.0)


def test_a_node_slurm_never_reported_is_adopted_through_its_dynamic_pod() -> None:
    log = fresh()
    state = log.state()
    node = state.nodes["n1"]
    assert dynamic_nodeset(state, node) is not None
    first = assess(state, node, 1.5)  # known absent, not unknown, and no hold
    assert not first.unknown_reasons and not first.held, first
    adopted_until_pod_runs(log)
    state = log.state()
    assert assess(state, state.nodes["n1"], 10.0).phase == Phase.TO_SLURM  # within the bound
    assert verbs(step(log, 10.0)) == []
    log.add(with_features(slurm_obs("n1"), FEATURE), 11.0)
    done = step(log, 11.0)
    assert any(isinstance(d, CompleteTransition) for d in done), done
    state = log.state()
    nodeset = nodeset_of(state.nodesets[POOL])
    assert nodeset is not None
    views = nodes_from_state(state, nodeset, [state.nodes["n1"]], 12.0)
    assert counts(nodeset, views)["registered"] == 1


def test_a_same_name_node_without_the_feature_is_never_ours() -> None:
    for features in ((), ("cpu",), ("gpu-a",)):  # none, another Nodeset's, a near miss
        log = fresh()
        adopted_until_pod_runs(log)
        log.add(with_features(slurm_obs("n1"), *features), 11.0)
        state = log.state()
        node = state.nodes["n1"]
        assessment = assess(state, node, 11.0)
        assert assessment.phase == Phase.HELD, assessment
        assert any("without feature gpu" in h for h in assessment.slurm_holds)
        assert not slurmd_registered(node, UID, FEATURE)
        decisions = step(log, 11.0)
        assert not any(isinstance(d, CompleteTransition) for d in decisions), decisions
        nodeset = nodeset_of(state.nodesets[POOL])
        assert nodeset is not None
        assert not registered(nodeset, node.slurm)
        assert counts(nodeset, nodes_from_state(state, nodeset, [node], 11.0))[
            "registered"] == 0


def test_a_pod_that_never_registers_holds_the_node_past_the_bound() -> None:
    log = fresh()
    adopted_until_pod_runs(log)
    state = log.state()
    node = state.nodes["n1"]
    assert dynamic_absent(state, node, 3.1 + REGISTER_BOUND_SECONDS - 1)
    late = 3.1 + REGISTER_BOUND_SECONDS + 1
    assert not dynamic_absent(state, node, late)
    assessment = assess(state, node, late)
    assert assessment.phase == Phase.HELD
    assert any(h.startswith("missing in Slurm") for h in assessment.slurm_holds)


def test_a_static_nodesets_node_never_reported_stays_unknown() -> None:
    log = fresh(SlurmdSpec(image="i"))
    state = log.state()
    assert dynamic_nodeset(state, state.nodes["n1"]) is None
    assert "not observed in Slurm yet" in assess(state, state.nodes["n1"], 2.0).unknown_reasons
    assert not requests(step(log, 2.0))


def test_two_nodesets_selecting_the_node_make_it_no_ones_dynamic_node() -> None:
    log = fresh()
    log.add(K8sNodesetObserved(slurmd_finalizer=True, pool="other/gpu2", uid="U2", node_selector=(
        k8s_obs("n1").labels[0],), partitions=("gpu",), slurmd=DYNAMIC), 1.0)
    state = log.state()
    assert dynamic_nodeset(state, state.nodes["n1"]) is None
    assert "not observed in Slurm yet" in assess(state, state.nodes["n1"], 2.0).unknown_reasons


# ------------------------------------------------------------------- against adversaries

STATES = ("IDLE", "MIXED", "ALLOCATED", "DOWN", "UNKNOWN")
FLAGS = ("DRAIN", "NOT_RESPONDING", "COMPLETING")
FEATURES = st.lists(st.sampled_from(["gpu", "cpu", "GPU", "gpu2", "ib"]), max_size=3,
                    unique=True)


def _completes_to_slurm(decisions: list[Decision]) -> bool:
    return any(isinstance(d, CompleteTransition) for d in decisions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_nothing_counts_a_node_without_the_feature_as_the_nodesets(
        data: st.DataObject) -> None:
    log = fresh()
    adopted_until_pod_runs(log)
    now = 5.0
    for _ in range(data.draw(st.integers(1, 4))):
        now += data.draw(st.floats(0.1, 80.0))
        if data.draw(st.booleans()):
            features = data.draw(FEATURES)
            obs = slurm_obs("n1", state=data.draw(st.sampled_from(STATES)),
                            flags=tuple(data.draw(st.lists(st.sampled_from(FLAGS),
                                                           unique=True, max_size=2))))
            log.add(with_features(obs, *features), now)
        elif data.draw(st.integers(0, 4)) == 0:  # `scontrol delete nodename=n1`
            log.add(SlurmNodeVanished(node="n1"), now)
        if data.draw(st.booleans()):
            phase = data.draw(st.sampled_from(["Pending", "Running", "Failed"]))
            log.add(K8sWorkloadObserved(node="n1", pods=(own(phase, started_at=4.0),)), now)
        state = log.state()
        node = state.nodes["n1"]
        featured = node.slurm is not None and FEATURE in node.slurm.features
        decisions = step(log, now)
        for action in requests(decisions):
            succeed(log, [action], now + 0.05)
            assert featured or action.verb not in (VERB_RESUME, VERB_SLURMD_DELETE), action
        if not featured:
            assert not _completes_to_slurm(decisions), decisions
            assert not slurmd_registered(node, UID, FEATURE)
            nodeset = nodeset_of(state.nodesets[POOL])
            assert nodeset is not None
            assert counts(nodeset, nodes_from_state(state, nodeset, [node], now))[
                "registered"] == 0
            if node.slurm is not None:
                assert assess(state, node, now).phase in (Phase.HELD, Phase.UNKNOWN)


def test_pod_refs_of_the_nodeset_are_the_ones_the_feature_check_reads() -> None:
    # The registration check names the Nodeset's uid and its feature: another Nodeset's
    # Running pod on the node registers nothing for this one, feature or not.
    log = fresh()
    adopted_until_pod_runs(log)
    other = PodRef("default", "x-n1", "Running", uid="p9", pool_pod=False, slurmd="n1",
                   slurmd_nodeset="U2", started_at=4.0)
    log.add(K8sWorkloadObserved(node="n1", pods=(other,)), 5.0)
    log.add(with_features(slurm_obs("n1"), FEATURE), 5.0)
    node = log.state().nodes["n1"]
    assert not slurmd_registered(node, UID, FEATURE)
    assert slurmd_registered(node, "U2", FEATURE)
    assert isinstance(requests(step(log, 6.0)), list)
    assert all(not isinstance(d, RequestAction) or d.verb != VERB_RESUME
               for d in step(log, 6.0))


def test_a_lent_node_whose_record_an_administrator_deleted_is_reclaimed_anew() -> None:
    log = fresh()
    adopted_until_pod_runs(log)
    log.add(with_features(slurm_obs("n1"), FEATURE), 11.0)
    assert any(isinstance(d, CompleteTransition) for d in step(log, 11.0))
    # Lent: drained, pod deleted, untainted (as for Static).
    log.add(k8s_obs("n1", pin="kubernetes"), 20.0)
    drain = step(log, 20.0)
    succeed(log, drain, 20.1)
    reason = next(label.value for d in requests(drain) for label in d.args
                  if label.key == "reason")
    log.add(with_features(slurm_obs("n1", flags=("DRAIN",), reason=reason), FEATURE), 20.2)
    delete = step(log, 21.0)
    assert verbs(delete) == [VERB_SLURMD_DELETE], delete
    succeed(log, delete, 21.1)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 22.0)
    unlock = step(log, 22.0)
    succeed(log, unlock, 22.1)
    log.add(k8s_obs("n1", pin="kubernetes", tainted=False), 22.2)
    assert any(isinstance(d, CompleteTransition) for d in step(log, 23.0))
    # `scontrol delete nodename=n1`: the record is gone. Lent without a pod: no hold.
    log.add(SlurmNodeVanished(node="n1"), 30.0)
    state = log.state()
    assert dynamic_absent(state, state.nodes["n1"], 100.0)
    assert not assess(state, state.nodes["n1"], 100.0).held
    # Someone's pod on it beside a record-less node is still no hold; a slurmd pod of the
    # node there (not sunkd's lend left it) is not "absent".
    stray = PodRef("default", "x-n1", "Running", uid="p9", pool_pod=False, slurmd="n1",
                   slurmd_nodeset="U2")
    log.add(K8sWorkloadObserved(node="n1", pods=(stray,)), 31.0)
    state = log.state()
    assert not dynamic_absent(state, state.nodes["n1"], 100.0)
    log.add(K8sWorkloadObserved(node="n1", pods=()), 32.0)
    # Pinned back: taint, pod, the new slurmd creates the record anew (IDLE, the
    # feature): the reclaim completes without any resume.
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 100.0)
    lock = step(log, 100.0)
    assert verbs(lock) == [VERB_LOCK], lock
    succeed(log, lock, 100.1)
    log.add(k8s_obs("n1", pin="slurm"), 100.2)
    create = step(log, 101.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 101.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=102.0),)), 102.0)
    assert not assess(log.state(), log.state().nodes["n1"], 103.0).held
    log.add(with_features(slurm_obs("n1"), FEATURE), 104.0)
    done = step(log, 104.0)
    assert any(isinstance(d, CompleteTransition) for d in done), done
    assert VERB_RESUME not in verbs(done)
