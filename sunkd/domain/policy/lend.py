"""Lending a node to Kubernetes: which nodes may go, in what order, and each lend's steps.

A lend drains the node in Slurm (with our lend reason), waits until Slurm reports it
drained, removes the owner taint, and completes; until the taint removal has started
it can still be aborted (our drain is resumed, the taint kept). In a pool whose Nodeset
has `spec.slurmd`, the slurmd plan (`policy/slurmd.py`) deletes sunkd's slurmd pod once
Slurm reports the node drained, idle and in contact, and the taint comes off only once
the pod is gone: then Slurm no longer hears the node, which `slurmdgone.slurmd_gone`
accepts for this one step (the unlock says so, and the executor still refuses any
allocation Slurm shows). Adoption "as lent"
reuses the same steps (`advance_to_kubernetes` with an `adopt` transition).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label
from sunkd.domain.ownership import (
    Assessment,
    foreign_word,
    has_hold_taint,
    has_owner_taint,
    our_drain,
    slurm_busy,
    slurm_drained,
)
from sunkd.domain.policy.model import (
    SLURMD_GONE_ARG,
    VERB_DRAIN,
    VERB_RESUME,
    VERB_UNLOCK,
    PoolSpec,
    lend_reason,
)
from sunkd.domain.policy.planner import OUTCOME_FAILED, Planner, expected_drain, may_resume
from sunkd.domain.slurmdgone import slurmd_gone, slurmd_nodeset
from sunkd.domain.state import NodeState, OpenTransition, Phase


def abort_lend(
    planner: Planner, node: NodeState, transition: OpenTransition, reason: str
) -> None:
    """Abort a lend: resume our drain (if it is ours and in place); the taint stays.

    The resume belongs to no transition: the lend has ended (an action of an ended
    transition never runs, `transitions.stale_action`); its reason names the lend."""
    planner.abort(node, transition, reason)
    slurm = node.slurm
    if (
        slurm is not None
        and "DRAIN" in slurm.flags
        and our_drain(node)
        and may_resume(node)
    ):
        planner.ensure(
            node,
            wk.OWNER_SLURM,
            VERB_RESUME,
            f"lend {transition.transition_id} aborted ({reason}): give the node back "
            "to Slurm",
            expected_drain(slurm),
        )


def unlock_started(node: NodeState, transition: OpenTransition) -> bool:
    if transition.did(wk.OWNER_KUBERNETES, VERB_UNLOCK):
        return True
    return any(
        a.verb == VERB_UNLOCK and a.transition_id == transition.transition_id
        for a in node.open_actions.values()
    )

def advance_to_kubernetes(
    planner: Planner, node: NodeState, transition: OpenTransition
) -> None:
    """Lend (or adopt as lent): drain in Slurm, wait for drained, unlock, complete."""
    adopt = transition.direction == "adopt"
    slurm = node.slurm
    k8s = node.k8s
    assert slurm is not None and k8s is not None
    tx = transition.transition_id
    if "DRAIN" not in slurm.flags or not our_drain(node):
        if adopt:
            planner.abort(node, transition, "adoption as lent no longer matches: not drained")
            return
        if foreign_word(slurm, node.drain_mark):
            abort_lend(planner, node, transition,
                        f"Slurm reports {slurm.state.upper()} with someone else's reason "
                        f"{slurm.reason!r}: not draining over it")
            return
        result = planner.ensure(
            node,
            wk.OWNER_SLURM,
            VERB_DRAIN,
            f"lend to kubernetes: drain in Slurm ({transition.reason})",
            (Label("reason", lend_reason(tx)),),
            tx,
        )
        if result == OUTCOME_FAILED:
            abort_lend(planner, node, transition, "the Slurm drain failed")
        return
    gone = False
    if slurmd_nodeset(planner.state, transition.pool) is not None:
        if node.pods is None or any(pod.slurmd == node.name for pod in node.pods):
            # A slurmd pod is still there (sunkd's: the plan deletes it once Slurm reports
            # the node drained; another Nodeset's: not ours to take away): no untaint yet.
            return
        gone = not slurm_drained(slurm) and slurmd_gone(node)
        if not (gone or slurm_drained(slurm)):
            return
    elif not slurm_drained(slurm):
        return  # jobs still running or completing: wait (drain_timeout is checked earlier)
    unlock_done = adopt or transition.did(wk.OWNER_KUBERNETES, VERB_UNLOCK)
    if has_owner_taint(k8s) or not unlock_done:
        result = planner.ensure(
            node,
            wk.OWNER_KUBERNETES,
            VERB_UNLOCK,
            "sunkd's slurmd pod is gone from the drained node: remove the owner taint"
            if gone else "Slurm reports the node drained: remove the owner taint",
            (Label(SLURMD_GONE_ARG, "1"),) if gone else (),
            tx,
        )
        if result == OUTCOME_FAILED:
            abort_lend(planner, node, transition, "removing the owner taint failed")
        return
    planner.complete(
        node,
        transition,
        "adopted: drained by sunkd in Slurm and untainted"
        if adopt
        else "Slurm reports drained and the owner taint is gone: node belongs to kubernetes",
    )

def can_lend(planner: Planner, node: NodeState, assessment: Assessment) -> bool:
    slurm = node.slurm
    k8s = node.k8s
    return (
        assessment.phase == Phase.SLURM
        and node.transition is None
        and node.name not in planner.touched
        and node.name not in planner.repairing  # its slurmd pod is being repaired
        and not node.open_actions
        and slurm is not None
        and k8s is not None
        and has_owner_taint(k8s)
        and "DRAIN" not in slurm.flags
        and not assessment.slurm_unhealthy
        and not k8s.unschedulable
        and not has_hold_taint(k8s)
        and assessment.pin != wk.OWNER_SLURM
    )

def lend_order(node: NodeState, ends: Mapping[str, float]) -> tuple[int, float, str]:
    slurm = node.slurm
    idle = slurm is not None and not slurm_busy(slurm) and slurm.alloc_cpus == 0
    return (0 if idle else 1, 0.0 if idle else ends.get(node.name, math.inf), node.name)


def start_lend(planner: Planner, node: NodeState, pool: PoolSpec, why: str) -> None:
    transition = planner.start(node, pool.name, wk.OWNER_SLURM, wk.OWNER_KUBERNETES, why)
    advance_to_kubernetes(planner, node, transition)
