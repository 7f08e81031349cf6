"""What decide remembers across rounds never changes an answer.

The fold keeps an untouched node's identity, so the census re-assesses only nodes an
event touched (policy/demand.py `_assess`: pure in the node, the sources' verdict, and
`now` for an unhealthy node's grace) and membership re-matches only those too
(policy/model.py `_rules_for`: pure in the node and the pools). These check the inputs
besides the node: time, the sources, the pools."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sunkd.domain.events import Label, SourceHealth
from sunkd.domain.fold import fold
from sunkd.domain.ownership import UNHEALTHY_GRACE_SECONDS, assess, sources_unknown
from sunkd.domain.policy import PoolSpec, demand, membership, model
from sunkd.domain.state import Phase
from sunkd.simulate.arms import SimConfig, run_sunkd
from tests.unit.domain_world import POOL_LABEL, Log, k8s_obs, slurm_obs
from tests.unit.test_simulate_bridge import KNOBS, small_workload


def _fresh_log() -> Log:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    return log


def test_an_unhealthy_node_is_reassessed_as_its_grace_runs_out() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 100.0)
    state = log.state()
    node = state.nodes["n1"]
    early = demand._assess(state, node, 100.0 + UNHEALTHY_GRACE_SECONDS - 1, ())
    late = demand._assess(state, node, 100.0 + UNHEALTHY_GRACE_SECONDS, ())
    assert not early.held and late.phase == Phase.HELD


def test_a_source_going_stale_makes_an_untouched_node_unknown() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n1"), 1.0)
    state = log.state()
    fresh = demand._assess(state, state.nodes["n1"], 2.0, sources_unknown(state))
    assert fresh.actionable
    stale = log.add(SourceHealth(source="slurm", status="stale", cause="timeout"), 3.0,
                    subject="slurm")
    later = fold([stale], state)
    assert later.nodes["n1"] is state.nodes["n1"]  # untouched: the remembered one applies
    again = demand._assess(later, later.nodes["n1"], 4.0, sources_unknown(later))
    assert again.phase == Phase.UNKNOWN
    assert again == assess(later, later.nodes["n1"], 4.0)


def test_membership_follows_the_pools_of_the_round() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n1"), 1.0)
    state = log.state()
    label = POOL_LABEL  # k8s_obs's
    selecting = PoolSpec(name="ns/a", node_selector=(label,))
    other = PoolSpec(name="ns/b", node_selector=(Label(label.key, label.value + "-x"),))
    assert membership(state, [selecting]) == {"n1": "ns/a"}
    assert membership(state, [other]) == {}
    assert membership(state, [selecting, PoolSpec(name="ns/c", node_selector=(label,))]) == {}
    assert membership(state, [selecting]) == {"n1": "ns/a"}
    log.add(replace(k8s_obs("n1"), labels=()), 2.0)  # relabelled: the node is new
    assert membership(log.state(), [selecting]) == {}


@pytest.mark.parametrize(("seed", "backlog"), [(4, 0), (6, 3)])
def test_a_run_decides_the_same_without_the_memory(seed: int, backlog: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    workload = small_workload(seed, hours=4, backlog=backlog)
    remembered = run_sunkd(workload, 4, 1, KNOBS, SimConfig(check=True))
    assert remembered.violations == 0
    monkeypatch.setattr(demand, "_assess", assess)
    monkeypatch.setattr(model, "_rules_for",
                        lambda pools: (model._Rules(tuple(pools)), {}))
    fresh = run_sunkd(workload, 4, 1, KNOBS, SimConfig(check=True))
    assert remembered.digest == fresh.digest and remembered.decide_calls == fresh.decide_calls
