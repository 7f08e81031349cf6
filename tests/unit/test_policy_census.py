"""The census remembers assessments (policy/demand.py `_assess`): never a different one.

`assess` is pure in (node, sources' verdict, and `now` for an unhealthy node's grace),
and the fold keeps an untouched node's identity, so the census re-assesses only nodes an
event touched. These check the two inputs besides the node: time and the sources."""

from __future__ import annotations

import pytest

from sunkd.domain.events import SourceHealth
from sunkd.domain.ownership import UNHEALTHY_GRACE_SECONDS, assess, sources_unknown
from sunkd.domain.policy import demand
from sunkd.domain.state import Phase, fold
from sunkd.simulate.arms import SimConfig, run_sunkd
from tests.unit.domain_world import Log, k8s_obs, slurm_obs
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


@pytest.mark.parametrize(("seed", "backlog"), [(4, 0), (6, 3)])
def test_a_run_decides_the_same_without_the_memory(seed: int, backlog: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    workload = small_workload(seed, hours=4, backlog=backlog)
    remembered = run_sunkd(workload, 4, 1, KNOBS, SimConfig(check=True))
    assert remembered.violations == 0
    monkeypatch.setattr(demand, "_assess", assess)
    fresh = run_sunkd(workload, 4, 1, KNOBS, SimConfig(check=True))
    assert remembered.digest == fresh.digest and remembered.decide_calls == fresh.decide_calls
