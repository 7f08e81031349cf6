"""The ownership machine's overlay: UNKNOWN, HELD and the safety predicates."""

from __future__ import annotations

import pytest

from sunkd.domain.events import (
    K8sNodeVanished,
    OperatorPinned,
    SlurmNodeVanished,
    SourceHealth,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.ownership import (
    UNHEALTHY_GRACE_SECONDS,
    Assessment,
    assess,
    assess_all,
    has_owner_taint,
    is_ours,
    slurm_drained,
    slurm_usable,
)
from sunkd.domain.state import Phase
from tests.unit.domain_world import Log, k8s_obs, slurm_obs, sunkd_drained, sunkd_held


def _fresh_log() -> Log:
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    return log


def _assess(log: Log, now: float, node: str = "n1") -> Assessment:
    state = log.state()
    return assess(state, state.nodes[node], now)


@pytest.mark.parametrize(
    ("state", "flags", "drained"),
    [
        ("IDLE", ("DRAIN",), True),
        ("DOWN", ("DRAIN",), False),  # out of contact: slurmctld cannot vouch for it
        ("IDLE", ("DRAIN", "NOT_RESPONDING"), False),
        ("IDLE", ("DRAIN", "UNDRAIN"), False),
        ("ALLOCATED", ("DRAIN",), False),
        ("MIXED", ("DRAIN",), False),
        ("IDLE", ("COMPLETING", "DRAIN"), False),
        ("IDLE", (), False),
    ],
)
def test_drained_means_drain_flag_nothing_running_and_in_contact(
    state: str, flags: tuple[str, ...], drained: bool
) -> None:
    assert slurm_drained(slurm_obs("n1", state, flags, "sunkd: x")) is drained


def test_nothing_observed_is_never_drained_nor_usable() -> None:
    assert not slurm_drained(None)
    assert not slurm_usable(None)
    assert not has_owner_taint(None)


def test_our_reasons_carry_the_prefix() -> None:
    assert is_ours("sunkd: lent to kubernetes [tx t1]")
    assert not is_ours("admin: bad dimm")
    assert not is_ours(None)
    assert not is_ours("Sunkd: lookalike")


def test_unknown_until_both_sources_fresh_and_both_sides_observed() -> None:
    log = Log()
    log.add(slurm_obs("n1"), 1.0)
    first = _assess(log, 2.0)
    assert first.phase == Phase.UNKNOWN and not first.actionable
    assert "slurm source has not reported yet" in first.unknown_reasons
    log.add(SourceHealth(source="slurm", status="fresh"), 2.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 2.0, subject="kubernetes")
    assert _assess(log, 3.0).unknown_reasons == ("not observed in Kubernetes yet",)
    log.add(k8s_obs("n1"), 3.0)
    assert _assess(log, 4.0).actionable
    log.add(SourceHealth(source="kubernetes", status="stale", cause="timeout"), 5.0,
            subject="kubernetes")
    stale = _assess(log, 6.0)
    assert stale.phase == Phase.UNKNOWN
    assert stale.unknown_reasons == ("kubernetes source is stale: timeout",)


def test_not_responding_is_held_only_after_the_grace() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n1", flags=("NOT_RESPONDING",)), 100.0)
    early = _assess(log, 100.0 + UNHEALTHY_GRACE_SECONDS - 1)
    assert not early.held and early.slurm_unhealthy
    late = _assess(log, 100.0 + UNHEALTHY_GRACE_SECONDS)
    assert late.phase == Phase.HELD
    assert late.slurm_holds == ("slurm IDLE+NOT_RESPONDING",)


def test_down_is_held_after_grace_with_its_reason() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n1", "DOWN", reason="Not responding"), 1.0)
    assert _assess(log, 100.0).slurm_holds == ("slurm DOWN (Not responding)",)


def test_foreign_drain_holds_at_once_our_drain_does_not() -> None:
    log = _fresh_log()
    log.add(k8s_obs("n1"), 1.0)
    sunkd_drained(log, "n1", "sunkd: lent to kubernetes", 1.0)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="sunkd: lent to kubernetes"), 1.0)
    assert not _assess(log, 1.0).held
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="admin: bad dimm"), 2.0)
    held = _assess(log, 2.0)
    assert held.phase == Phase.HELD
    assert held.hold_reasons == ("slurm drained: admin: bad dimm",)


def test_kubernetes_not_ready_and_any_cordon_hold_our_hold_taint_does_not() -> None:
    log = _fresh_log()
    log.add(slurm_obs("n1"), 1.0)
    sunkd_held(log, "n1", 1.0)
    log.add(k8s_obs("n1", hold_tainted=True), 1.0)
    assert not _assess(log, 1.0).held
    # A cordon is always an operator's, even with sunkd's old annotation left behind.
    log.add(k8s_obs("n1", unschedulable=True, held_by_sunkd=True), 1.5)
    assert _assess(log, 1.5).k8s_holds == ("cordoned",)
    log.add(k8s_obs("n1", ready=False, unschedulable=True), 2.0)
    assert _assess(log, 2.0).k8s_holds == ("NotReady", "cordoned")
    log.add(k8s_obs("n1", ready=None), 3.0)
    assert _assess(log, 3.0).k8s_holds == ("Ready unknown",)


def test_vanished_on_one_side_is_held_not_unknown() -> None:
    log = _fresh_log()
    log.add(slurm_obs("n1"), 1.0)
    log.add(k8s_obs("n1"), 1.0)
    log.add(K8sNodeVanished(node="n1"), 2.0)
    assert _assess(log, 2.0).k8s_holds == ("missing in Kubernetes",)
    log.add(SlurmNodeVanished(node="n1"), 3.0)
    assert _assess(log, 3.0).slurm_holds == ("missing in Slurm",)


def test_settled_phase_comes_from_transitions_and_pins_are_not_holds() -> None:
    log = _fresh_log()
    log.add(slurm_obs("n1"), 1.0)
    log.add(k8s_obs("n1"), 1.0)
    log.add(TransitionStarted(transition_id="t", node="n1", pool="p", from_owner="none",
                              to_owner="slurm"), 2.0)
    assert _assess(log, 2.0).phase == Phase.TO_SLURM
    log.add(TransitionCompleted(transition_id="t", node="n1"), 3.0)
    log.add(OperatorPinned(node="n1", to="slurm", who="op"), 4.0)
    settled = _assess(log, 4.0)
    assert (settled.phase, settled.owner, settled.pin) == (Phase.SLURM, "slurm", "slurm")
    assert not settled.held


def test_assess_all_covers_every_node() -> None:
    log = _fresh_log()
    log.add(slurm_obs("n1"), 1.0)
    log.add(k8s_obs("n1"), 1.0)
    log.add(slurm_obs("n2"), 1.0)
    views = assess_all(log.state(), 2.0)
    assert set(views) == {"n1", "n2"}
    assert views["n2"].phase == Phase.UNKNOWN and views["n1"].actionable
