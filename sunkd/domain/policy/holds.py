"""Mirroring holds across sides: trouble on one side keeps the other side off the node.

A Slurm hold (a foreign drain, a node unhealthy past its grace) becomes a Kubernetes
cordon marked as ours; a Kubernetes hold (NotReady, a foreign cordon) becomes a Slurm
drain with our mirror reason. Only our own mirrors are ever undone, once the hold clears.
"""

from __future__ import annotations

from sunkd.domain.events import Label
from sunkd.domain.ownership import (
    MIRROR_REASON_PREFIX,
    Assessment,
    has_hold_taint,
    is_mirror_drain,
    is_ours,
    our_drain,
    our_hold_taint,
    slurm_state_text,
)
from sunkd.domain.policy.model import VERB_CORDON, VERB_DRAIN, VERB_RESUME, VERB_UNCORDON
from sunkd.domain.policy.planner import _expected_drain, _may_resume, _Planner
from sunkd.domain.state import OWNER_KUBERNETES, OWNER_SLURM, NodeState, slurm_unhealthy


def _mirror_holds(planner: _Planner, node: NodeState, assessment: Assessment) -> None:
    """Mirror each side's trouble to the other side; undo only our own mirrors."""
    slurm = node.slurm
    k8s = node.k8s
    if k8s is not None:
        if assessment.slurm_holds and not has_hold_taint(k8s):
            planner.ensure(
                node,
                OWNER_KUBERNETES,
                VERB_CORDON,
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
                node, OWNER_KUBERNETES, VERB_UNCORDON, "Slurm hold cleared: remove our cordon"
            )
    if slurm is not None:
        # Never over an admin's word: any reason that is not ours is foreign whatever the
        # flags (`scontrol update state=down reason="bad DIMM"` sets no DRAIN), and a node
        # Slurm reports DOWN/FAIL/NOT_RESPONDING is Slurm's to handle, not ours to drain.
        foreign_reason = bool(slurm.reason) and not is_ours(slurm.reason)
        if (
            assessment.k8s_holds
            and "DRAIN" not in slurm.flags
            and not foreign_reason
            and not slurm_unhealthy(slurm)
        ):
            why = ", ".join(assessment.k8s_holds)
            planner.ensure(
                node,
                OWNER_SLURM,
                VERB_DRAIN,
                f"mirror Kubernetes hold: {why}",
                (Label("reason", f"{MIRROR_REASON_PREFIX}{why}"),),
            )
        elif (
            not assessment.k8s_holds
            and "DRAIN" in slurm.flags
            and is_mirror_drain(slurm.reason)
            and our_drain(node)
            and node.owner == OWNER_SLURM
            and node.transition is None
            and not assessment.slurm_unhealthy
            and not slurm_unhealthy(slurm)
            and _may_resume(node)
        ):
            planner.ensure(
                node,
                OWNER_SLURM,
                VERB_RESUME,
                "Kubernetes hold cleared: resume our mirror drain",
                _expected_drain(slurm),
            )
