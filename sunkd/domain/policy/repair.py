"""Repairs: put back what a settled phase requires when someone or something undid it.

A Slurm-owned node must carry the owner taint, run no pool pods and carry no lend
drain; a node lent to Kubernetes must stay drained in Slurm and untainted.
"""

from __future__ import annotations

from sunkd.domain.events import Label
from sunkd.domain.ownership import (
    Assessment,
    has_owner_taint,
    is_lend_drain,
    is_ours,
    slurm_drained,
)
from sunkd.domain.policy.model import (
    VERB_DRAIN,
    VERB_EVICT,
    VERB_LOCK,
    VERB_RESUME,
    VERB_UNLOCK,
    lend_reason,
)
from sunkd.domain.policy.planner import _active_pods, _expected_drain, _may_resume, _Planner
from sunkd.domain.state import OWNER_KUBERNETES, OWNER_SLURM, NodeState, Phase


def _repair(planner: _Planner, node: NodeState, assessment: Assessment) -> None:
    """Put back the side effects of a settled phase that someone or something undid."""
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    if assessment.phase == Phase.SLURM:
        if not has_owner_taint(k8s):
            planner.ensure(
                node, OWNER_KUBERNETES, VERB_LOCK, "repair: Slurm-owned node lost its owner taint"
            )
        pods = _active_pods(node)
        if pods and has_owner_taint(k8s):
            planner.ensure(
                node,
                OWNER_KUBERNETES,
                VERB_EVICT,
                f"repair: {len(pods)} pool pod(s) on a Slurm-owned node",
                tuple(Label("pod", pod) for pod in pods),
            )
        if "DRAIN" in slurm.flags and is_lend_drain(slurm.reason) and _may_resume(node):
            planner.ensure(
                node,
                OWNER_SLURM,
                VERB_RESUME,
                "repair: Slurm-owned node still carries a lend drain",
                _expected_drain(slurm),
            )
    elif assessment.phase == Phase.KUBERNETES:
        if "DRAIN" not in slurm.flags:
            planner.ensure(
                node,
                OWNER_SLURM,
                VERB_DRAIN,
                "repair: node lent to kubernetes was resumed in Slurm; drain it again",
                (Label("reason", lend_reason(None)),),
            )
        elif has_owner_taint(k8s) and slurm_drained(slurm) and is_ours(slurm.reason):
            planner.ensure(
                node,
                OWNER_KUBERNETES,
                VERB_UNLOCK,
                "repair: node lent to kubernetes carries the owner taint",
            )
