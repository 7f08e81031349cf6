"""The fold: deterministic, total, immutable, and snapshots round-trip exactly."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    K8sDemandObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    LeaderElected,
    OperatorPinned,
    OwnershipSpec,
    Payload,
    PendingPod,
    PodRef,
    SlurmDemandObserved,
    SlurmNodeVanished,
    SourceHealth,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
    UnknownPayload,
)
from sunkd.domain.fold import apply, fold
from sunkd.domain.snapshot import state_from_json, state_to_json, state_to_json_text
from sunkd.domain.state import EMPTY, Phase
from tests.unit.domain_world import Log, k8s_obs, slurm_obs


def test_observations_are_kept_per_node_and_side() -> None:
    log = Log()
    log.auto_pods = False
    log.add(slurm_obs("n1", "ALLOCATED", alloc_cpus=8), 100.0)
    log.add(k8s_obs("n1"), 101.0)
    state = log.state()
    node = state.nodes["n1"]
    assert node.slurm is not None and node.slurm.state == "ALLOCATED"
    assert node.k8s is not None and node.k8s_name == "n1"
    assert node.slurm_seq == 1 and node.k8s_seq == 2
    assert state.last_seq == 2 and state.last_recorded_at == 101.0


def test_k8s_node_is_keyed_by_its_slurm_name() -> None:
    log = Log()
    log.add(dataclasses.replace(k8s_obs("k-node-1"), slurm_node="n1"), 1.0)
    log.add(K8sWorkloadObserved(node="k-node-1", pool="p", pods=(PodRef("a", "b"),)), 2.0)
    log.add(K8sNodeVanished(node="k-node-1"), 3.0)
    state = log.state()
    assert set(state.nodes) == {"n1"}
    assert state.k8s_names == {"k-node-1": "n1"}
    node = state.nodes["n1"]
    assert node.k8s is None and node.k8s_missing
    assert node.pods is None and state.pod_reports == {}  # its pods went with the Node


def test_unknown_payload_only_advances_seq() -> None:
    log = Log()
    log.add(slurm_obs("n1"), 1.0)
    before = log.state()
    log.add(UnknownPayload(unknown_kind="future.thing", data={"x": 1}), 2.0, subject="n1")
    after = log.state()
    assert after.last_seq == before.last_seq + 1
    assert after.nodes == before.nodes


def test_fold_skips_events_already_in_the_state() -> None:
    log = Log()
    log.add(slurm_obs("n1"), 1.0)
    log.add(slurm_obs("n1", "ALLOCATED"), 2.0)
    state = log.state()
    assert fold(log.events, state) == state


def test_unhealthy_since_survives_other_changes_and_clears() -> None:
    log = Log()
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 10.0)
    log.add(slurm_obs("n1", "ALLOCATED", flags=("NOT_RESPONDING",)), 20.0)
    assert log.state().nodes["n1"].slurm_unhealthy_since == 10.0
    log.add(slurm_obs("n1"), 30.0)
    assert log.state().nodes["n1"].slurm_unhealthy_since is None
    log.add(SlurmNodeVanished(node="n1"), 40.0)
    node = log.state().nodes["n1"]
    assert node.slurm is None and node.slurm_missing


def test_transitions_move_owner_phase_and_since() -> None:
    log = Log()
    log.add(TransitionStarted(transition_id="t1", node="n1", pool="p", from_owner="none",
                              to_owner="slurm"), 5.0)
    node = log.state().nodes["n1"]
    assert node.phase == Phase.TO_SLURM and node.since == 5.0
    assert node.transition is not None and node.transition.direction == "adopt"
    log.add(TransitionCompleted(transition_id="t1", node="n1", to_owner="slurm"), 6.0)
    node = log.state().nodes["n1"]
    assert (node.owner, node.phase, node.since, node.last_move_at) == (
        wk.OWNER_SLURM, Phase.SLURM, 6.0, None,
    )
    log.add(TransitionStarted(transition_id="t2", node="n1", pool="p", from_owner="slurm",
                              to_owner="kubernetes"), 10.0)
    assert log.state().nodes["n1"].phase == Phase.TO_K8S
    # An end naming another transition is ignored.
    log.add(TransitionCompleted(transition_id="other", node="n1"), 11.0)
    assert log.state().nodes["n1"].phase == Phase.TO_K8S
    log.add(TransitionAborted(transition_id="t2", node="n1"), 12.0)
    node = log.state().nodes["n1"]
    assert (node.owner, node.phase, node.last_move_at) == (wk.OWNER_SLURM, Phase.SLURM, 12.0)
    log.add(TransitionStarted(transition_id="t3", node="n1", pool="p", from_owner="slurm",
                              to_owner="kubernetes"), 20.0)
    log.add(TransitionCompleted(transition_id="t3", node="n1"), 21.0)
    node = log.state().nodes["n1"]
    assert (node.owner, node.phase) == (wk.OWNER_KUBERNETES, Phase.KUBERNETES)


def test_actions_open_until_an_outcome_and_mark_transition_progress() -> None:
    log = Log()
    log.add(TransitionStarted(transition_id="t1", node="n1", pool="p", from_owner="slurm",
                              to_owner="kubernetes"), 1.0)
    log.add(ActionRequested(action_id="a1", transition_id="t1", side="slurm", verb="drain",
                            node="n1", args=(Label("reason", "sunkd: x"),)), 2.0)
    state = log.state()
    assert [a.action_id for a in state.pending_actions()] == ["a1"]
    assert state.nodes["n1"].open_action_on("slurm") is not None
    log.add(ActionFailed(action_id="a1", transition_id="t1", side="slurm", verb="drain",
                         node="n1", error="timeout", retryable=True), 3.0)
    state = log.state()
    assert state.pending_actions() == []
    outcome = state.nodes["n1"].outcomes["slurm/drain"]
    assert (outcome.succeeded, outcome.error, outcome.retryable) == (False, "timeout", True)
    log.add(ActionRequested(action_id="a2", transition_id="t1", side="slurm", verb="drain",
                            node="n1", attempt=2), 4.0)
    log.add(ActionSucceeded(action_id="a2", transition_id="t1", side="slurm", verb="drain",
                            node="n1", attempt=2), 5.0)
    node = log.state().nodes["n1"]
    assert node.outcomes["slurm/drain"].succeeded
    assert node.transition is not None and node.transition.done_verbs == ("slurm/drain",)


def test_pins_last_writer_wins_between_operator_and_annotation() -> None:
    log = Log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(OperatorPinned(node="n1", to="kubernetes", who="alice", why="demo"), 2.0)
    pin = log.state().nodes["n1"].pin
    assert pin is not None and (pin.to, pin.who, pin.source) == ("kubernetes", "alice", "operator")
    log.add(k8s_obs("n1", pin="slurm"), 3.0)
    pin = log.state().nodes["n1"].pin
    assert pin is not None and (pin.to, pin.source) == ("slurm", "annotation")
    # Another change of the node that keeps the annotation does not re-pin.
    log.add(OperatorPinned(node="n1", to="auto", who="bob"), 4.0)
    log.add(k8s_obs("n1", pin="slurm", ready=False), 5.0)
    assert log.state().nodes["n1"].pin is None


def test_sources_health_and_leader() -> None:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 1.0)
    log.add(SourceHealth(source="slurm", status="stale", cause="timeout"), 5.0)
    log.add(SourceHealth(source="slurm", status="stale", cause="auth"), 6.0)
    log.add(LeaderElected(epoch=3, identity="a"), 7.0)
    log.add(LeaderElected(epoch=2, identity="old"), 8.0)
    state = log.state()
    slurm = state.sources["slurm"]
    assert (slurm.status, slurm.cause, slurm.since, slurm.last_fresh_at) == (
        "stale", "auth", 5.0, 1.0,
    )
    assert not state.source_fresh("slurm") and not state.source_fresh("kubernetes")
    assert (state.leader_epoch, state.leader_identity) == (3, "a")


def test_old_states_stay_valid_after_later_applies() -> None:
    log = Log()
    log.add(slurm_obs("n1"), 1.0)
    first = log.state()
    snapshot = state_to_json(first)
    second = apply(first, log.add(slurm_obs("n1", "ALLOCATED"), 2.0))
    assert second.nodes["n1"].slurm is not None
    assert second.nodes["n1"].slurm.state == "ALLOCATED"
    assert state_from_json(snapshot) == first
    assert first.nodes["n1"].slurm is not None and first.nodes["n1"].slurm.state == "IDLE"


# ------------------------------------------------------------------ snapshot property

_names = st.sampled_from(["n1", "n2", "n3"])
_times = st.floats(min_value=0, max_value=2e9, allow_nan=False)
_texts = st.text(max_size=8)


def _payloads() -> st.SearchStrategy[Payload]:
    return st.one_of(
        st.builds(slurm_obs, _names, st.sampled_from(["IDLE", "ALLOCATED", "DOWN", "MIXED"]),
                  st.lists(st.sampled_from(["DRAIN", "COMPLETING", "NOT_RESPONDING"]),
                           unique=True).map(tuple),
                  st.none() | _texts, st.integers(0, 64)),
        st.builds(k8s_obs, _names, ready=st.none() | st.booleans(), tainted=st.booleans(),
                  unschedulable=st.booleans(), held_by_sunkd=st.booleans(),
                  pin=st.sampled_from([None, "slurm", "kubernetes", "auto"])),
        st.builds(SlurmNodeVanished, node=_names),
        st.builds(K8sNodeVanished, node=_names),
        st.builds(K8sWorkloadObserved, node=_names, pool=st.just("p"),
                  pods=st.lists(st.builds(PodRef, _texts, _texts)).map(tuple)),
        st.builds(K8sDemandObserved, pool=st.just("p"),
                  pending=st.lists(st.builds(PendingPod, _texts, _texts,
                                             st.integers(0, 10**6))).map(tuple)),
        st.builds(SlurmDemandObserved, partition=st.just("gpu"),
                  pending_nodes=st.integers(0, 9)),
        st.builds(K8sNodesetObserved, pool=st.just("p"), partitions=st.just(("gpu",)),
                  ownership=st.builds(OwnershipSpec, min_slurm=st.integers(0, 3)),
                  deleted=st.booleans()),
        st.builds(SourceHealth, source=st.sampled_from(["slurm", "kubernetes"]),
                  status=st.sampled_from(["fresh", "stale", "lost"]), cause=st.none() | _texts),
        st.builds(OperatorPinned, node=_names, to=st.sampled_from(["slurm", "kubernetes", "auto"]),
                  who=_texts, why=_texts),
        st.builds(TransitionStarted, transition_id=st.sampled_from(["t1", "t2"]), node=_names,
                  pool=st.just("p"), from_owner=st.sampled_from(["none", "slurm", "kubernetes"]),
                  to_owner=st.sampled_from(["slurm", "kubernetes"])),
        st.builds(TransitionCompleted, transition_id=st.sampled_from(["t1", "t2"]), node=_names),
        st.builds(TransitionAborted, transition_id=st.sampled_from(["t1", "t2"]), node=_names),
        st.builds(ActionRequested, action_id=st.sampled_from(["a1", "a2"]),
                  transition_id=st.sampled_from([None, "t1"]), side=st.just("slurm"),
                  verb=st.sampled_from(["drain", "resume"]), node=_names,
                  args=st.lists(st.builds(Label, _texts, _texts)).map(tuple)),
        st.builds(ActionSucceeded, action_id=st.sampled_from(["a1", "a2"]),
                  transition_id=st.sampled_from([None, "t1"]), side=st.just("slurm"),
                  verb=st.sampled_from(["drain", "resume"]), node=_names),
        st.builds(ActionFailed, action_id=st.sampled_from(["a1", "a2"]), side=st.just("slurm"),
                  verb=st.just("drain"), node=_names, error=_texts, retryable=st.booleans()),
        st.builds(LeaderElected, epoch=st.integers(0, 5), identity=_texts),
        st.builds(UnknownPayload, unknown_kind=st.just("x.y"), data=st.just({"a": 1})),
    )


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(_payloads(), _times), max_size=40), st.integers(0, 40))
def test_snapshot_round_trips_and_snapshot_plus_tail_equals_full_fold(
    steps: list[tuple[Payload, float]], cut: int
) -> None:
    log = Log()
    for payload, when in steps:
        log.add(payload, when, subject="n1")
    full = fold(log.events)
    again = fold(log.events)
    assert again == full  # determinism
    restored = state_from_json(json.loads(json.dumps(state_to_json(full))))
    assert restored == full
    # The daemon's snapshots are encoded a node at a time: the same JSON.
    text = state_to_json_text(full, lambda value: json.dumps(value, separators=(",", ":")))
    assert json.loads(text) == json.loads(json.dumps(state_to_json(full)))
    prefix = fold(log.events[:cut])
    snapshot = state_from_json(json.loads(json.dumps(state_to_json(prefix))))
    assert fold(log.events[cut:], snapshot) == full
    one_by_one = EMPTY
    for event in log.events:
        one_by_one = apply(one_by_one, event)
    assert one_by_one == full
    # (the log is of one node: a second one checks what separates two nodes' JSON)
    log.add(slurm_obs("n2"), max((when for _, when in steps), default=0.0), subject="n2")
    two = fold(log.events)
    assert json.loads(state_to_json_text(two, json.dumps)) == \
        json.loads(json.dumps(state_to_json(two)))
