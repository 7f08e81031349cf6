"""Mirroring holds across sides: trouble on one side keeps the other side off the node.

A Slurm hold (a foreign drain, a node unhealthy past its grace) becomes sunkd's hold taint
on the Kubernetes node; a Kubernetes hold (NotReady, a foreign cordon) becomes a Slurm
drain with our mirror reason. Only our own mirrors are ever undone, once the hold clears.

A node that left every pool keeps what sunkd put on it until sunkd takes it off
(`unpooled_marks`, `release_marks`): it is not forgotten meanwhile, so no view loses a
node Slurm cannot use because of a `sunkd:` drain.
"""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label
from sunkd.domain.ownership import (
    Assessment,
    assess,
    foreign_word,
    has_hold_taint,
    has_owner_taint,
    is_mirror_drain,
    is_ours,
    our_drain,
    our_hold_taint,
    slurm_state_text,
)
from sunkd.domain.policy.model import VERB_DRAIN, VERB_HOLD, VERB_RELEASE, VERB_RESUME
from sunkd.domain.policy.planner import Planner, expected_drain, may_resume
from sunkd.domain.slurmnode import slurm_unhealthy
from sunkd.domain.state import OWNER_NONE, NodeState


def mirror_holds(
    planner: Planner, node: NodeState, assessment: Assessment, add: bool = True
) -> None:
    """Mirror each side's trouble to the other side; undo only our own mirrors (only that
    with `add` False: a node in no pool gets no new mirror)."""
    slurm = node.slurm
    k8s = node.k8s
    if k8s is not None:
        if add and assessment.slurm_holds and not has_hold_taint(k8s):
            planner.ensure(
                node,
                wk.OWNER_KUBERNETES,
                VERB_HOLD,
                "mirror Slurm hold: " + "; ".join(assessment.slurm_holds),
                (
                    Label("slurm_state", slurm_state_text(node.slurm, missing="MISSING")),
                    Label("slurm_reason", (slurm.reason or "") if slurm else "missing"),
                ),
            )
        elif (
            not assessment.slurm_holds
            and not assessment.slurm_unhealthy
            and our_hold_taint(node)
        ):
            planner.ensure(
                node, wk.OWNER_KUBERNETES, VERB_RELEASE, "Slurm hold cleared: remove our hold"
            )
    if slurm is not None:
        # Never over an admin's word (`foreign_word`: a reason not ours on a drained or
        # unhealthy node, `scontrol update state=down reason="bad DIMM"` sets no DRAIN),
        # and a node Slurm reports DOWN/FAIL/NOT_RESPONDING is Slurm's to handle, not ours
        # to drain. A stale reason on a healthy, undrained node (24.11 keeps it after a
        # RESUME) protects nothing: the same test as the actuator's.
        if (
            add
            and assessment.k8s_holds
            and "DRAIN" not in slurm.flags
            and not foreign_word(slurm)
            and not slurm_unhealthy(slurm)
        ):
            why = ", ".join(assessment.k8s_holds)
            planner.ensure(
                node,
                wk.OWNER_SLURM,
                VERB_DRAIN,
                f"mirror Kubernetes hold: {why}",
                (Label("reason", f"{wk.REASON_MIRROR}{why}"),),
            )
        elif (
            not assessment.k8s_holds
            and "DRAIN" in slurm.flags
            and is_mirror_drain(slurm.reason)
            and our_drain(node)
            and node.owner == wk.OWNER_SLURM
            and node.transition is None
            and not assessment.slurm_unhealthy
            and not slurm_unhealthy(slurm)
            and may_resume(node)
        ):
            planner.ensure(
                node,
                wk.OWNER_SLURM,
                VERB_RESUME,
                "Kubernetes hold cleared: resume our mirror drain",
                expected_drain(slurm),
            )


def unpooled_marks(node: NodeState) -> list[str]:
    """The marks sunkd made that the node carries, each with what becomes of it once the
    node is in no pool, for people (empty: nothing of sunkd's is left on it). While any is
    left the node is not forgotten. The Slurm drain and the hold taint are sunkd's mirrors,
    removed once their hold clears (`release_marks`); the owner taint and any other
    `sunkd:` drain stay (taking either off lets one side's work land beside the other's:
    a Slurm-owned node would take pods beside its jobs, a lent one jobs beside its pods),
    for the operator to remove or for a pool that takes the node again."""
    marks: list[str] = []
    slurm = node.slurm
    if slurm is not None and "DRAIN" in slurm.flags and is_ours(slurm.reason):
        if is_mirror_drain(slurm.reason) and node.owner == wk.OWNER_SLURM:
            fate = "removed once the Kubernetes hold clears, the owner taint is on and no pod runs"
        else:
            whose = (f"the node is {node.owner}'s" if node.owner != OWNER_NONE
                     else "sunkd no longer knows whose the node is")
            fate = (f"kept: {whose}, resuming it could put jobs beside pods; undrain it "
                    "yourself or return the node to a pool")
        marks.append(f"Slurm drain {slurm.reason!r} ({fate})")
    if has_hold_taint(node.k8s):
        marks.append(f"taint {wk.TAINT_HOLD} (removed once the Slurm hold clears)")
    if has_owner_taint(node.k8s):
        marks.append(f"taint {wk.TAINT_OWNER} (kept: Slurm may run jobs there and pods "
                     "would land beside them; remove it yourself or return the node to a pool)")
    return marks


def release_marks(planner: Planner, node: NodeState) -> None:
    """A node in no pool that still carries sunkd's marks: undo its mirrors whose holds
    have cleared, on the same conditions as for a pool's node; start nothing new."""
    if node.transition is not None:
        return
    assessment = assess(planner.state, node, planner.now)
    if assessment.actionable:
        mirror_holds(planner, node, assessment, add=False)
