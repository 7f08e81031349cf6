"""Driving a node's transition: the next step of an open one, or starting an adoption.

`handle_transition` decides, before each step, whether an open move must stop (a
hold, a pin or pool mode to the other side, surplus, drain timeout) and otherwise
advances it through `lend` or `reclaim`. `adopt_node` gives a node sunkd sees for the
first time an owner, by starting a transition that finishes whatever phase it is in.
`stale_action` is the outbox's side of a transition's end: what the transition asked
for and has not run yet never runs after it.
"""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import OwnershipSpec
from sunkd.domain.ownership import (
    Assessment,
    has_owner_taint,
    is_lend_drain,
    running_pods,
    slurm_drained,
)
from sunkd.domain.policy.lend import abort_lend, advance_to_kubernetes, unlock_started
from sunkd.domain.policy.model import MODE_KUBERNETES, MODE_SLURM, PoolSpec
from sunkd.domain.policy.planner import Planner
from sunkd.domain.policy.reclaim import advance_to_slurm, resume_started
from sunkd.domain.slurmdgone import slurmd_gone
from sunkd.domain.state import OWNER_NONE, NodeState, OpenAction


def stale_action(action: OpenAction, node: NodeState | None) -> str | None:
    """Why `action` must not run any more, or None: it was asked for by a transition
    that is no longer the node's open one (aborted, completed, or replaced). A pin back
    to Kubernetes aborts a reclaim; the eviction that reclaim queued must not follow it.
    Actions outside any transition (repairs, mirrors, warnings, the resume that gives an
    aborted lend's drain back) carry no transition and are never stale."""
    tx = action.transition_id
    if tx is None:
        return None
    current = node.transition if node is not None else None
    if current is not None and current.transition_id == tx:
        return None
    return f"not run: transition {tx} ended before it ran"


def handle_transition(
    planner: Planner,
    node: NodeState,
    assessment: Assessment,
    spec: OwnershipSpec,
    surplus_lends: set[str],
) -> None:
    transition = node.transition
    assert transition is not None
    direction = transition.direction
    if assessment.held:
        # Past its point of no return (a lend's taint removal, a reclaim's resume), a
        # move waits out a passing hold (a kubelet or slurmd blip) instead of flipping
        # the node back; only a node gone from one side ends it.
        committed = (direction == "lend" and unlock_started(node, transition)) or (
            direction == "reclaim" and resume_started(node, transition)
        )
        missing = node.slurm is None or node.k8s is None
        if direction == "reclaim" and committed:
            # Past the resume Slurm may already run jobs there: going back to Kubernetes
            # would leave an untainted, Kubernetes-owned node running a Slurm job. A
            # reclaim that resumed finishes to Slurm; with the Node object gone there is
            # nothing left on the Kubernetes side to wait for, and a hold Slurm itself
            # reports (FAIL, DOWN) is Slurm's to clear, not a reason to wait forever.
            slurm, k8s = node.slurm, node.k8s
            if k8s is None and slurm is not None:
                planner.complete(
                    node, transition,
                    "Kubernetes Node gone after Slurm resumed it: node belongs to slurm",
                )
            elif (
                slurm is not None
                and "DRAIN" not in slurm.flags
                and has_owner_taint(k8s)
                and not running_pods(node)
            ):
                planner.complete(
                    node, transition,
                    "resumed in Slurm, tainted, no pods: node belongs to slurm "
                    "(held there: " + "; ".join(assessment.hold_reasons) + ")",
                )
            return
        if direction == "lend" and committed and not missing:
            # The owner taint is already coming off: finish the handover if Slurm still
            # reports the node drained by us (a drain undone meanwhile is drained again,
            # unless someone else's word is on it: then the lend is aborted).
            advance_to_kubernetes(planner, node, transition)
            return
        if not committed or missing:
            planner.abort(node, transition, "held: " + "; ".join(assessment.hold_reasons))
        return
    now = planner.now
    if direction == "lend":
        committed = unlock_started(node, transition)
        if not committed:
            if assessment.pin == wk.OWNER_SLURM:
                abort_lend(planner, node, transition, assessment.pin_why())
                return
            if spec.mode == MODE_SLURM and assessment.pin != wk.OWNER_KUBERNETES:
                abort_lend(planner, node, transition, "pool mode is Slurm")
                return
            if transition.transition_id in surplus_lends:
                abort_lend(
                    planner, node, transition, "kubernetes demand gone (fewer nodes needed)"
                )
                return
            if (
                not slurm_drained(node.slurm)
                and not slurmd_gone(node)
                and now - transition.started_at >= spec.drain_timeout_seconds
            ):
                abort_lend(
                    planner,
                    node,
                    transition,
                    f"Slurm drain not finished within drain_timeout "
                    f"({spec.drain_timeout_seconds:g}s)",
                )
                return
        advance_to_kubernetes(planner, node, transition)
        return
    if direction == "reclaim" and not resume_started(node, transition):
        if assessment.pin == wk.OWNER_KUBERNETES:
            planner.abort(node, transition, assessment.pin_why())
            return
        if spec.mode == MODE_KUBERNETES and assessment.pin != wk.OWNER_SLURM:
            planner.abort(node, transition, "pool mode is Kubernetes")
            return
    if transition.to_owner == wk.OWNER_KUBERNETES:
        advance_to_kubernetes(planner, node, transition)
    else:
        advance_to_slurm(planner, node, transition, spec)


def adopt_node(planner: Planner, node: NodeState, pool: PoolSpec) -> None:
    slurm = node.slurm
    k8s = node.k8s
    assert k8s is not None
    if slurm is None:
        # Only a Dynamic Nodeset's node is not held for that (ownership.assess,
        # slurmdgone.dynamic_absent): its slurmd pod will create it in Slurm.
        transition = planner.start(
            node, pool.name, OWNER_NONE, wk.OWNER_SLURM,
            "adopt: not in Slurm yet; the Dynamic Nodeset's slurmd pod registers it; nodes "
            "start Slurm-owned")
        advance_to_slurm(planner, node, transition, pool.ownership)
        return
    if is_lend_drain(slurm.reason) and slurm_drained(slurm) and not has_owner_taint(k8s):
        transition = planner.start(
            node,
            pool.name,
            OWNER_NONE,
            wk.OWNER_KUBERNETES,
            "adopt: drained by sunkd in Slurm and no owner taint, so already lent",
        )
        advance_to_kubernetes(planner, node, transition)
        return
    transition = planner.start(
        node,
        pool.name,
        OWNER_NONE,
        wk.OWNER_SLURM,
        f"adopt: first seen {slurm.state.upper()} in Slurm; nodes start Slurm-owned",
    )
    advance_to_slurm(planner, node, transition, pool.ownership)
