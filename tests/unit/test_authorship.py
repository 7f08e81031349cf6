"""Proof of authorship from the log (docs/safety.md, invariant I2): sunkd lifts only a
drain or hold taint whose exact text (and, for Slurm, reason time) its own log records it
writing and no one has changed since. A `sunkd:` reason or a `sunkd.io/slurm-hold` taint
that sunkd did not write is foreign: a hold, reported, never lifted.

Driven through the real fold and `decide()` on hand-built logs."""

from __future__ import annotations

import dataclasses
import json

from sunkd.domain import wellknown as wk
from sunkd.domain.events import ActionRequested, ActionSucceeded, Label, Taint
from sunkd.domain.ownership import assess
from sunkd.domain.policy import RequestAction, decide
from sunkd.domain.snapshot import state_from_json, state_to_json
from tests.unit.domain_world import Log, k8s_obs, pool_spec, slurm_obs
from tests.unit.test_domain_policy import T0, _actions, _cluster, _decide, _record, _succeed

HOLD = Taint(wk.TAINT_HOLD, wk.TAINT_OWNER_EFFECT, wk.OWNER_SLURM)
MIRROR = "sunkd: k8s NotReady"


def _drained(node: str, reason: str, at: float, **extra: object) -> object:
    base = slurm_obs(node, flags=("DRAIN",), reason=reason)
    return dataclasses.replace(base, reason_time=at, **extra)  # type: ignore[arg-type]


def _mirror_drain_by_sunkd(log: Log, now: float) -> None:
    """n1 goes NotReady; sunkd mirrors it as its drain, which Slurm then reports."""
    log.add(k8s_obs("n1", ready=False), now)
    decisions = _decide(log, now + 1)
    _record(log, decisions, now + 1)
    drain = next(d for d in decisions if isinstance(d, RequestAction) and d.verb == "drain")
    assert drain.arg("reason") == MIRROR
    _succeed(log, drain, now + 2)
    log.add(_drained("n1", MIRROR, now + 2), now + 3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ hole 5: hold taint


def test_an_operators_copy_of_the_hold_taint_is_never_removed_and_is_a_hold() -> None:
    """n1 is drained by an admin, so sunkd holds its Kubernetes side with its taint. An
    operator copies that taint onto n2 (`kubectl taint n2 sunkd.io/slurm-hold=slurm:
    NoSchedule`): sunkd never wrote it there, so it stays, and n2 is held."""
    log = _cluster(2)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="admin: bad fan"), 5.0)
    decisions = _decide(log, T0)
    _record(log, decisions, T0)
    cordon = next(d for d in decisions if isinstance(d, RequestAction) and d.verb == "cordon")
    assert cordon.node == "n1"
    _succeed(log, cordon, T0 + 1)
    log.add(k8s_obs("n1", hold_tainted=True), T0 + 2)
    log.add(k8s_obs("n2", hold_tainted=True), T0 + 3)  # the operator's copy

    decisions = _decide(log, T0 + 4)
    assert ("n2", "kubernetes", "uncordon") not in _actions(decisions)
    state = log.state()
    holds = assess(state, state.nodes["n2"], T0 + 4).k8s_holds
    assert any("foreign hold taint" in hold for hold in holds), holds


def test_a_hold_taint_added_after_sunkd_lifted_its_own_is_foreign() -> None:
    """sunkd removes its own hold when the Slurm hold clears; the same taint put back by
    hand afterwards is the operator's."""
    log = _cluster(1)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason="admin: bad fan"), 5.0)
    cordon = _only_action(log, T0, "cordon")
    _succeed(log, cordon, T0 + 1)
    log.add(k8s_obs("n1", hold_tainted=True), T0 + 2)
    log.add(slurm_obs("n1"), T0 + 3)  # the admin resumed it
    uncordon = _only_action(log, T0 + 4, "uncordon")  # sunkd's own hold: lifted
    _succeed(log, uncordon, T0 + 5)
    log.add(k8s_obs("n1"), T0 + 6)
    log.add(k8s_obs("n1", hold_tainted=True), T0 + 200)  # an operator's, by hand
    assert ("n1", "kubernetes", "uncordon") not in _actions(_decide(log, T0 + 201))


def _only_action(log: Log, now: float, verb: str) -> RequestAction:
    decisions = _decide(log, now)
    _record(log, decisions, now)
    return next(d for d in decisions if isinstance(d, RequestAction) and d.verb == verb)


# ----------------------------------------------------------- the known limit: reasons


def test_an_admins_sunkd_prefixed_reason_is_never_undrained() -> None:
    """An administrator drains by hand with a reason that looks like sunkd's (a mirror
    reason, a lend reason): sunkd never wrote it, so it is someone else's drain."""
    for reason in (MIRROR, "sunkd: lent to kubernetes [tx forged]", "sunkd: keep off"):
        log = _cluster(1)
        log.add(_drained("n1", reason, 4.0), 5.0)  # type: ignore[arg-type]
        decisions = _decide(log, T0)
        assert ("n1", "slurm", "resume") not in _actions(decisions), reason
        state = log.state()
        assessment = assess(state, state.nodes["n1"], T0)
        assert any(reason in hold for hold in assessment.slurm_holds), (reason, assessment)


def test_a_sunkd_drain_redrained_by_an_admin_with_the_same_text_is_not_undrained() -> None:
    """sunkd's mirror drain, then an admin undrains and drains the node again with the very
    same text between two of sunkd's looks (Slurm sets a new reason time): the drain is
    the admin's now."""
    log = _cluster(1)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(_drained("n1", MIRROR, 50.0), 51.0)  # type: ignore[arg-type]
    log.add(k8s_obs("n1", ready=True), 52.0)
    assert ("n1", "slurm", "resume") not in _actions(_decide(log, T0))
    state = log.state()
    assert assess(state, state.nodes["n1"], T0).slurm_holds


def test_a_sunkd_drain_undrained_and_redrained_by_hand_is_not_undrained() -> None:
    """Undrained by an admin (sunkd sees it), then drained again by hand with sunkd's text
    and, by chance, the same second: gone once is gone for good."""
    log = _cluster(1)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(slurm_obs("n1", reason=MIRROR), 20.0)  # UNDRAIN keeps the text (24.11)
    log.add(_drained("n1", MIRROR, 7.0), 30.0)  # type: ignore[arg-type]
    log.add(k8s_obs("n1", ready=True), 31.0)
    assert ("n1", "slurm", "resume") not in _actions(_decide(log, T0))


# ------------------------------------------------------------- sunkd's own: still lifted


def test_sunkds_own_mirror_drain_is_undrained_with_the_time_it_saw() -> None:
    log = _cluster(1)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(k8s_obs("n1", ready=True), 10.0)
    resume = next(d for d in _decide(log, T0) if isinstance(d, RequestAction))
    assert (resume.verb, resume.arg("expect_reason"), resume.arg("expect_reason_time")) == (
        "resume", MIRROR, "7")


def test_a_drain_sunkd_just_undrained_read_before_the_undrain_is_not_foreign() -> None:
    """The Slurm source polled the node before sunkd's undrain and appends it after the
    undrain's success: that observation still shows sunkd's drain exactly (its text and
    reason time). It is sunkd's drain being lifted, not someone else's: no hold, no
    mirror, nothing undrained again on its word; the next poll shows the node undrained.
    Any pool, any Slurm generation (seen on a real reclaim on 22.05)."""
    log = _cluster(1)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(k8s_obs("n1", ready=True), 10.0)
    decisions = _decide(log, 11.0)
    _record(log, decisions, 11.0)
    resume = next(d for d in decisions if isinstance(d, RequestAction))
    assert resume.verb == "resume"
    _succeed(log, resume, 11.5)
    log.add(_drained("n1", MIRROR, 7.0), 12.0)  # type: ignore[arg-type]  # polled at 11.4
    state = log.state()
    assert not assess(state, state.nodes["n1"], 12.5).slurm_holds
    after = _actions(_decide(log, 12.5))
    assert ("n1", "kubernetes", "cordon") not in after
    assert ("n1", "slurm", "resume") not in after
    # Someone drains it again with the same text: a new reason time, foreign.
    log.add(_drained("n1", MIRROR, 20.0), 21.0)  # type: ignore[arg-type]
    state = log.state()
    assert assess(state, state.nodes["n1"], 22.0).slurm_holds
    # A drain shown again after the undrain was seen is foreign too, whatever its time.
    log = _cluster(1)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(k8s_obs("n1", ready=True), 10.0)
    decisions = _decide(log, 11.0)
    _record(log, decisions, 11.0)
    _succeed(log, next(d for d in decisions if isinstance(d, RequestAction)), 11.5)
    log.add(slurm_obs("n1", reason=MIRROR), 12.0)
    log.add(_drained("n1", MIRROR, 7.0), 13.0)  # type: ignore[arg-type]
    state = log.state()
    assert assess(state, state.nodes["n1"], 14.0).slurm_holds


def test_a_drain_observed_before_its_success_is_logged_is_not_foreign() -> None:
    """The source can append the drained node before the executor appends the success:
    sunkd's drain in flight is neither foreign nor liftable."""
    log = _cluster(1)
    log.add(k8s_obs("n1", ready=False), 5.0)
    decisions = _decide(log, 6.0)
    _record(log, decisions, 6.0)
    log.add(_drained("n1", MIRROR, 7.0), 7.0)  # type: ignore[arg-type]
    state = log.state()
    assert not assess(state, state.nodes["n1"], 8.0).slurm_holds
    drain = next(d for d in decisions if isinstance(d, RequestAction))
    _succeed(log, drain, 9.0)  # no newer observation: the one in hand proves it
    log.add(k8s_obs("n1", ready=True), 10.0)
    assert ("n1", "slurm", "resume") in _actions(_decide(log, T0))


def test_an_old_log_with_the_drain_args_still_proves_sunkds_drain() -> None:
    """A log written before this change: the requested drain carried its reason as an
    argument, which is all the proof needs."""
    log = _cluster(1)
    log.add(k8s_obs("n1", ready=False), 5.0)
    log.add(ActionRequested(action_id="act-old-1", side="slurm", verb="drain", node="n1",
                            reason="mirror Kubernetes hold: NotReady",
                            args=(Label("reason", MIRROR),)), 6.0)
    log.add(ActionSucceeded(action_id="act-old-1", side="slurm", verb="drain", node="n1"), 7.0)
    log.add(_drained("n1", MIRROR, 7.0), 8.0)  # type: ignore[arg-type]
    log.add(k8s_obs("n1", ready=True), 9.0)
    assert ("n1", "slurm", "resume") in _actions(_decide(log, T0))


# ------------------------------------------------------------------------- snapshots


def _marked(nodes: int) -> Log:
    """n1 carries sunkd's mirror drain (seen); n2 an admin's drain and sunkd's hold (its
    success logged, the taint not seen yet)."""
    log = _cluster(nodes)
    _mirror_drain_by_sunkd(log, 5.0)
    log.add(slurm_obs("n2", flags=("DRAIN",), reason="admin: bad fan"), 20.0)
    cordon = next(d for d in _decide(log, 21.0) if isinstance(d, RequestAction)
                  and d.verb == "cordon" and d.node == "n2")
    _record(log, [cordon], 21.0)
    _succeed(log, cordon, 22.0)
    return log


def test_the_marks_round_trip_through_a_snapshot() -> None:
    state = _marked(2).state()
    assert state.nodes["n1"].drain_mark is not None
    assert state.nodes["n2"].hold_mark is not None
    assert state_from_json(json.loads(json.dumps(state_to_json(state)))) == state


def test_a_snapshot_from_before_the_marks_infers_only_what_its_outcomes_support() -> None:
    """A format-1 snapshot has no marks: sunkd's drain (its last drain succeeded, Slurm
    shows a `sunkd:` drain) is inferred; an admin's `sunkd:` drain on a node sunkd never
    drained, and a hold not yet seen, are not (foreign: fail closed)."""
    log = _marked(3)
    log.add(_drained("n3", MIRROR, 23.0), 23.0)  # type: ignore[arg-type]
    state = log.state()
    old = state_to_json(state)
    old["format"] = 1
    for node in old["nodes"]:
        del node["drain_mark"], node["hold_mark"]
    restored = state_from_json(json.loads(json.dumps(old)))
    assert restored.nodes["n1"].drain_mark == state.nodes["n1"].drain_mark
    assert restored.nodes["n2"].hold_mark is None  # not seen on the node: unproven
    assert restored.nodes["n3"].drain_mark is None
    assert ("n3", "slurm", "resume") not in _actions(decide(restored, [pool_spec()], T0))


def test_slurms_not_responding_suffix_on_sunkds_reason_is_sunkds_only_out_of_contact() -> None:
    """Slurm 24.11 and 26.05 append " : Not responding" to the reason of a drained node
    that loses contact (reason set by slurm, a new reason time): with slurmd in sunkd's
    pod that is every lent node. sunkd's drain still shows then, and only then: the same
    text on a node in contact is not sunkd's."""
    from sunkd.domain.authorship import DrainMark, drain_shows, follow_drain
    reason = "sunkd: lent to kubernetes [tx t1]"
    mark = DrainMark(reason, 100.0, True, 90.0)
    suffixed = _drained("n1", f"{reason} : Not responding", 160.0,  # type: ignore[arg-type]
                        flags=("DRAIN", "NOT_RESPONDING"), reason_set_by="slurm")
    down = dataclasses.replace(suffixed, state="DOWN")  # type: ignore[type-var]
    assert drain_shows(mark, suffixed) and drain_shows(mark, down)  # type: ignore[arg-type]
    assert follow_drain(mark, down, 170.0) == mark  # type: ignore[arg-type]
    in_contact = dataclasses.replace(suffixed, flags=("DRAIN",))  # type: ignore[type-var]
    assert not drain_shows(mark, in_contact)  # type: ignore[arg-type]
    other = dataclasses.replace(suffixed, reason=f"{reason} : bad DIMM")  # type: ignore[type-var]
    assert not drain_shows(mark, other)  # type: ignore[arg-type]
    earlier = dataclasses.replace(suffixed, reason_time=50.0)  # type: ignore[type-var]
    assert not drain_shows(mark, earlier)  # type: ignore[arg-type]
