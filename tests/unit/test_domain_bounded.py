"""Bounded growth in the fold and the policy: events proportional to change (job
ends per node; old demand rows still mean what they meant) and memory proportional to
the pools (only nodes a pool, a pin or sunkd's history names are `NodeState`s; the rest
are compact `UnpooledNode` records; a node is forgotten by an explicit event after a
grace). Hand-built logs, the real fold, snapshot codec and policy."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.codec import decode_payload, encode_payload, legacy_node_job_ends, payload_to_json
from sunkd.domain.events import (
    ConfiguredPool,
    K8sNodesetObserved,
    K8sNodeVanished,
    Label,
    NodeForgotten,
    OperatorPinned,
    PoolsConfigured,
    SlurmDemandObserved,
    SlurmNodeVanished,
    SourceHealth,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.policy import FORGET_AFTER_SECONDS, ForgetNode, StartTransition, decide
from sunkd.domain.policy.demand import job_ends
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import ClusterState
from tests.unit.domain_world import PARTITION, POOL, POOL_LABEL, Log, k8s_obs, pool_spec, slurm_obs

T0 = 100_000.0
OTHER = Label("sunkd.io/pool", "cpu")


def _fresh(log: Log) -> None:
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")


def _nodeset(log: Log, now: float, *, deleted: bool = False) -> None:
    log.add(K8sNodesetObserved(pool=POOL, node_selector=(POOL_LABEL,), partitions=(PARTITION,),
                               deleted=deleted), now, subject=POOL)


def _both(log: Log, name: str, now: float, labels: tuple[Label, ...] = (POOL_LABEL,)) -> None:
    log.add(slurm_obs(name), now)
    log.add(replace(k8s_obs(name), labels=labels), now)


def _assert_batching_independent(log: Log) -> ClusterState:
    """The fold of the whole log equals snapshot + tail at every split, and folding one
    event at a time (sunkd replay --check holds the daemon to the same)."""
    whole = fold(log.events)
    assert state_from_json(json.loads(json.dumps(state_to_json(whole)))) == whole
    one_by_one = ClusterState()
    for event in log.events:
        one_by_one = fold([event], one_by_one)
    assert one_by_one == whole
    for split in range(len(log.events) + 1):
        prefix = fold(log.events[:split])
        restored = state_from_json(json.loads(json.dumps(state_to_json(prefix))))
        assert fold(log.events[split:], restored) == whole, split
    return whole


# ------------------------------------------------------------------- job ends (15.3)


def _legacy_demand(ends: list[dict[str, object]]) -> SlurmDemandObserved:
    """A slurm.demand.observed row exactly as sunkd wrote it before job ends moved into
    node observations."""
    payload = decode_payload(SlurmDemandObserved.KIND, {
        "v": 1, "partition": PARTITION, "pending_jobs": 0, "pending_nodes": 0,
        "running_jobs": len(ends), "node_job_ends": ends})
    assert isinstance(payload, SlurmDemandObserved)
    return payload


def test_old_demand_rows_keep_their_job_ends() -> None:
    raw = [{"node": "n1", "expected_end": None, "jobs": 1},
           {"node": "n2", "expected_end": T0 + 500, "jobs": 2}]
    old = _legacy_demand(raw)
    # Re-encoded unchanged (the log and the snapshots keep the row as written).
    assert encode_payload(old)["node_job_ends"] == raw
    assert [(e.node, e.expected_end, e.jobs) for e in legacy_node_job_ends(old)] == [
        ("n1", None, 1), ("n2", T0 + 500, 2)]
    log = Log()
    _fresh(log)
    for name in ("n1", "n2", "n3"):
        _both(log, name, 1.0)
    log.add(old, 2.0, subject=PARTITION)
    state = _assert_batching_independent(log)
    assert dict(job_ends(state, pool_spec())) == {"n1": float("inf"), "n2": T0 + 500}
    # A current demand row of the partition replaces the old one, ends and all; from then
    # on the ends are the nodes' own.
    log.add(SlurmDemandObserved(partition=PARTITION), 3.0, subject=PARTITION)
    log.add(replace(slurm_obs("n3", "ALLOCATED", alloc_cpus=8), jobs=1, job_end=T0 + 9), 3.0)
    assert dict(job_ends(_assert_batching_independent(log), pool_spec())) == {"n3": T0 + 9}


def test_a_malformed_old_row_loses_only_its_ends() -> None:
    bad = _legacy_demand([{"node": 7, "expected_end": "soon"}])
    assert legacy_node_job_ends(bad) == ()


def test_demand_event_size_does_not_grow_with_busy_nodes() -> None:
    sizes = [len(payload_to_json(SlurmDemandObserved(
        partition=PARTITION, pending_jobs=100, pending_nodes=100, running_jobs=busy)))
        for busy in (1000, 9999)]
    assert sizes[0] == sizes[1] < 200


# ------------------------------------------------------------ memory ∝ pools (15.4)


def _aware(log: Log, pools: tuple[ConfiguredPool, ...] = ()) -> None:
    log.add(PoolsConfigured(pools=pools), 0.5, subject="config")


def test_without_pools_configured_every_node_is_kept_as_before() -> None:
    log = Log()
    _fresh(log)
    _both(log, "other1", 1.0, labels=(OTHER,))
    state = fold(log.events)
    assert set(state.nodes) == {"other1"} and not state.unpooled
    assert state.configured_pools is None
    assert decide(state, [pool_spec()], T0) == []  # in state, yet never a decision target


def test_non_pool_nodes_are_compact_records_and_never_decision_targets() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    _both(log, "other1", 1.0, labels=(OTHER,))
    log.add(slurm_obs("slurm-only"), 1.0)  # no Kubernetes node: no selector can match
    state = _assert_batching_independent(log)
    assert set(state.nodes) == {"n1"}
    assert set(state.unpooled) == {"other1", "slurm-only"}
    assert state.unpooled["other1"].k8s is not None
    decisions = decide(state, [pool_spec()], T0)
    assert {d.node for d in decisions} == {"n1"}  # the adoption of the pool's node


def test_a_config_pool_by_name_or_partition_names_its_nodes() -> None:
    log = Log()
    _fresh(log)
    _aware(log, (ConfiguredPool("cfg/a", nodes=("x1",)),
                 ConfiguredPool("cfg/b", partitions=(PARTITION,))))
    log.add(replace(slurm_obs("x1"), partitions=("elsewhere",)), 1.0)
    log.add(slurm_obs("p1"), 1.0)  # in PARTITION
    log.add(replace(slurm_obs("x2"), partitions=("elsewhere",)), 1.0)
    state = _assert_batching_independent(log)
    assert set(state.nodes) == {"x1", "p1"} and set(state.unpooled) == {"x2"}


def test_a_pin_names_a_node() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _both(log, "other1", 1.0, labels=(OTHER,))
    log.add(OperatorPinned(node="other1", to="slurm", who="op"), 2.0)
    state = _assert_batching_independent(log)
    assert "other1" in state.nodes and state.nodes["other1"].k8s is not None


def test_a_pool_that_appears_later_gets_its_nodes_state() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _both(log, "n1", 1.0)
    _both(log, "n2", 1.0)
    before = fold(log.events)
    assert not before.nodes and set(before.unpooled) == {"n1", "n2"}
    _nodeset(log, 5.0)  # the Nodeset arrives after its nodes; they do not change
    state = _assert_batching_independent(log)
    assert set(state.nodes) == {"n1", "n2"} and not state.unpooled
    for name in ("n1", "n2"):
        assert state.nodes[name] == before.unpooled[name].expand(name)
    starts = [d for d in decide(state, [pool_spec()], T0) if isinstance(d, StartTransition)]
    assert sorted(d.node for d in starts) == ["n1", "n2"]  # adopted at once
    # The Nodeset deleted again: nodes without history go back to compact records.
    _nodeset(log, 6.0, deleted=True)
    state = _assert_batching_independent(log)
    assert not state.nodes and set(state.unpooled) == {"n1", "n2"}


def _adopted(log: Log, name: str, now: float) -> None:
    log.add(TransitionStarted(transition_id=f"a-{name}", node=name, pool=POOL,
                              from_owner="none", to_owner="slurm"), now)
    log.add(TransitionCompleted(transition_id=f"a-{name}", node=name, pool=POOL,
                                from_owner="none", to_owner="slurm"), now)


def test_a_node_that_leaves_every_pool_is_forgotten_after_the_grace() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    _adopted(log, "n1", 2.0)
    # Relabelled out of the pool, and the operator took sunkd's owner taint off (while a
    # mark sunkd made is on it, it is never forgotten: test_safety_scenarios, h13).
    log.add(replace(k8s_obs("n1", tainted=False), labels=(OTHER,)), T0)
    state = _assert_batching_independent(log)
    node = state.nodes["n1"]  # its history keeps it a NodeState until the grace ends
    assert node.owner == "slurm" and node.unpooled_since == T0
    assert not [d for d in decide(state, [pool_spec()], T0 + FORGET_AFTER_SECONDS - 1)
                if isinstance(d, ForgetNode)]
    forget = [d for d in decide(state, [pool_spec()], T0 + FORGET_AFTER_SECONDS)
              if isinstance(d, ForgetNode)]
    assert [(d.node, d.reason.split(" for")[0]) for d in forget] == [("n1", "in no pool")]
    log.add(NodeForgotten(node="n1", reason=forget[0].reason), T0 + FORGET_AFTER_SECONDS)
    state = _assert_batching_independent(log)
    # Its history is gone, its observations are not: relabelled back, it is adopted afresh.
    assert "n1" not in state.nodes and state.unpooled["n1"].slurm is not None
    log.add(k8s_obs("n1"), T0 + FORGET_AFTER_SECONDS + 10)
    state = _assert_batching_independent(log)
    assert state.nodes["n1"].owner == "none" and state.nodes["n1"].unpooled_since is None
    assert [d.node for d in decide(state, [pool_spec()], T0 + FORGET_AFTER_SECONDS + 10)
            if isinstance(d, StartTransition)] == ["n1"]


def test_back_in_a_pool_before_the_grace_clears_the_clock() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    _adopted(log, "n1", 2.0)
    _nodeset(log, T0, deleted=True)
    assert fold(log.events).nodes["n1"].unpooled_since == T0
    _nodeset(log, T0 + 5)
    state = _assert_batching_independent(log)
    assert state.nodes["n1"].unpooled_since is None


def test_a_lent_node_outside_every_pool_keeps_its_history() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    log.add(TransitionStarted(transition_id="l", node="n1", pool=POOL, from_owner="slurm",
                              to_owner="kubernetes"), 2.0)
    log.add(TransitionCompleted(transition_id="l", node="n1", pool=POOL, from_owner="slurm",
                                to_owner="kubernetes"), 2.0)
    log.add(replace(k8s_obs("n1", tainted=False), labels=(OTHER,)), T0)
    state = _assert_batching_independent(log)
    assert state.nodes["n1"].unpooled_since == T0
    assert not [d for d in decide(state, [pool_spec()], T0 + 10 * FORGET_AFTER_SECONDS)
                if isinstance(d, ForgetNode)]


def test_the_policy_does_not_forget_a_node_its_own_pools_name() -> None:
    # The fold knows no pool for n1 (the config pools are not recorded yet), but the
    # pools decide() runs with do: no forgetting.
    log = Log()
    _fresh(log)
    _aware(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    _adopted(log, "n1", 2.0)
    _nodeset(log, T0, deleted=True)
    state = fold(log.events)
    assert not [d for d in decide(state, [pool_spec()], T0 + 2 * FORGET_AFTER_SECONDS)
                if isinstance(d, ForgetNode)]


def test_a_vanished_non_pool_node_is_forgotten_by_an_event_after_the_grace() -> None:
    log = Log()
    _fresh(log)
    _aware(log)
    _both(log, "other1", 1.0, labels=(OTHER,))
    log.add(SlurmNodeVanished(node="other1"), T0)
    log.add(K8sNodeVanished(node="other1"), T0)
    state = _assert_batching_independent(log)
    assert state.unpooled["other1"].gone_since == T0 and "other1" in state.k8s_names
    assert not [d for d in decide(state, [], T0 + FORGET_AFTER_SECONDS - 1)]
    forget = decide(state, [], T0 + FORGET_AFTER_SECONDS)
    assert [(type(d), d.node) for d in forget] == [(ForgetNode, "other1")]
    log.add(NodeForgotten(node="other1", reason=forget[0].reason), T0 + FORGET_AFTER_SECONDS)
    state = _assert_batching_independent(log)
    assert not state.unpooled and not state.nodes and not state.k8s_names


def test_first_pools_configured_on_an_old_log_compacts_the_non_pool_nodes() -> None:
    log = Log()
    _fresh(log)
    _nodeset(log, 0.5)
    _both(log, "n1", 1.0)
    _both(log, "other1", 1.0, labels=(OTHER,))
    assert set(fold(log.events).nodes) == {"n1", "other1"}  # an old log: all kept
    _aware(log)  # the upgraded leader records its config pools
    state = _assert_batching_independent(log)
    assert set(state.nodes) == {"n1"} and set(state.unpooled) == {"other1"}


# ------------------------------------------------------------------------ property

_NAMES = ("n1", "n2", "n3")
_step = st.one_of(
    st.tuples(st.just("slurm"), st.sampled_from(_NAMES), st.sampled_from((PARTITION, "x"))),
    st.tuples(st.just("k8s"), st.sampled_from(_NAMES), st.sampled_from(("gpu", "cpu"))),
    st.tuples(st.just("slurm-gone"), st.sampled_from(_NAMES), st.just("")),
    st.tuples(st.just("k8s-gone"), st.sampled_from(_NAMES), st.just("")),
    st.tuples(st.just("nodeset"), st.just(""), st.sampled_from(("add", "delete"))),
    st.tuples(st.just("config"), st.just(""), st.sampled_from(("none", "n2", PARTITION))),
    st.tuples(st.just("pin"), st.sampled_from(_NAMES), st.sampled_from(("slurm", "auto"))),
    st.tuples(st.just("adopt"), st.sampled_from(_NAMES), st.just("")),
    st.tuples(st.just("forget"), st.sampled_from(_NAMES), st.just("")),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_step, max_size=30), split=st.integers(0, 40))
def test_pool_aware_fold_is_independent_of_batching(steps: list[tuple[str, str, str]],
                                                    split: int) -> None:
    log = Log()
    _fresh(log)
    for index, (kind, name, arg) in enumerate(steps):
        now = 10.0 + index
        if kind == "slurm":
            log.add(replace(slurm_obs(name), partitions=(arg,)), now)
        elif kind == "k8s":
            log.add(replace(k8s_obs(name), labels=(Label("sunkd.io/pool", arg),)), now)
        elif kind == "slurm-gone":
            log.add(SlurmNodeVanished(node=name), now)
        elif kind == "k8s-gone":
            log.add(K8sNodeVanished(node=name), now)
        elif kind == "nodeset":
            _nodeset(log, now, deleted=arg == "delete")
        elif kind == "config":
            pools = {"none": (), "n2": (ConfiguredPool("cfg/n", nodes=("n2",)),),
                     PARTITION: (ConfiguredPool("cfg/p", partitions=(PARTITION,)),)}[arg]
            log.add(PoolsConfigured(pools=pools), now, subject="config")
        elif kind == "pin":
            log.add(OperatorPinned(node=name, to=arg, who="op"), now)
        elif kind == "adopt":
            _adopted(log, name, now)
        else:
            log.add(NodeForgotten(node=name), now)
    whole = fold(log.events)
    cut = min(split, len(log.events))
    restored = state_from_json(json.loads(json.dumps(state_to_json(fold(log.events[:cut])))))
    assert fold(log.events[cut:], restored) == whole
    one_by_one = ClusterState()
    for event in log.events:
        one_by_one = fold([event], one_by_one)
    assert one_by_one == whole
    # Every node is in exactly one of the two maps, and a record has no history.
    assert not set(whole.nodes) & set(whole.unpooled)
    if whole.configured_pools is None:
        assert not whole.unpooled
