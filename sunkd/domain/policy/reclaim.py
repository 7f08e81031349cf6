"""Reclaiming a node for Slurm: which nodes may come back, and each reclaim's steps.

A reclaim adds the owner taint (no new pool pods land), lets pool pods finish within
`reclaim_grace` of the taint and evicts the rest, resumes our Slurm drain, and completes
once Slurm reports the node usable. In a pool whose Nodeset has `spec.slurmd`, the slurmd
plan (`policy/slurmd.py`) creates sunkd's slurmd pod once the taint is on and no foreign
pod is left, and the resume waits until Slurm hears the new slurmd
(`slurmdgone.slurmd_registered`; ReturnToService=1 brings a node DOWN for not responding
back when it registers). Adoption for Slurm reuses the same steps
(`advance_to_slurm` with an `adopt` transition).
"""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, OwnershipSpec
from sunkd.domain.ownership import Assessment, has_owner_taint, our_drain, slurm_usable
from sunkd.domain.policy.model import (
    RETURN_TO_SERVICE_ARG,
    VERB_EVICT,
    VERB_LOCK,
    VERB_RESUME,
    PoolSpec,
)
from sunkd.domain.policy.planner import (
    OUTCOME_FAILED,
    Planner,
    active_pods,
    evict_args,
    expected_drain,
)
from sunkd.domain.slurmdgone import (
    dynamic_absent,
    observed_feature,
    slurmd_nodeset,
    slurmd_registered,
)
from sunkd.domain.state import NodeState, OpenTransition, Phase


def resume_started(node: NodeState, transition: OpenTransition) -> bool:
    if transition.did(wk.OWNER_SLURM, VERB_RESUME):
        return True
    return any(
        a.verb == VERB_RESUME and a.transition_id == transition.transition_id
        for a in node.open_actions.values()
    )


def reclaim_grace_started_at(node: NodeState, transition: OpenTransition) -> float:
    """When the pool's pods were told to go: the owner taint this transition added (the
    lock's success), or its start when the taint was already on. Counting from the start
    would cut the grace of pods that bound while the taint was not on yet (the lock
    failed and was retried, or the daemon that started the reclaim died before it)."""
    outcome = node.outcomes.get(f"{wk.OWNER_KUBERNETES}/{VERB_LOCK}")
    if (outcome is not None and outcome.succeeded
            and outcome.transition_id == transition.transition_id):
        return max(transition.started_at, outcome.at)
    return transition.started_at


def advance_to_slurm(
    planner: Planner, node: NodeState, transition: OpenTransition, spec: OwnershipSpec
) -> None:
    """Reclaim (or adopt): taint, let pool pods finish or evict them, resume, complete."""
    adopt = transition.direction == "adopt"
    slurm = node.slurm
    k8s = node.k8s
    # A Dynamic Nodeset's node is not in Slurm until its slurmd pod registers it
    # (slurmdgone.dynamic_absent): the steps before the registration need no record.
    assert k8s is not None
    tx = transition.transition_id
    lock_done = has_owner_taint(k8s) and (adopt or transition.did(wk.OWNER_KUBERNETES, VERB_LOCK))
    if not lock_done:
        result = planner.ensure(
            node,
            wk.OWNER_KUBERNETES,
            VERB_LOCK,
            "adopt for Slurm: add the owner taint"
            if adopt
            else "reclaim for Slurm: add the owner taint so no new pool pods land",
            (),
            tx,
        )
        if result == OUTCOME_FAILED:
            planner.abort(node, transition, "adding the owner taint failed")
        return
    if node.pods is None:
        return  # unknown is not none: nothing moves until the Node reports its pods
    pods = active_pods(node)
    if pods:
        told_at = reclaim_grace_started_at(node, transition)
        if planner.now - told_at >= spec.reclaim_grace_seconds:
            result = planner.ensure(
                node,
                wk.OWNER_KUBERNETES,
                VERB_EVICT,
                f"reclaim_grace ({spec.reclaim_grace_seconds:g}s) over: evict {len(pods)} "
                "pool pod(s)",
                evict_args(node),
                tx,
            )
            if result == OUTCOME_FAILED:
                planner.abort(node, transition, "evicting pool pods failed")
        return
    nodeset = slurmd_nodeset(planner.state, transition.pool)
    if nodeset is not None and not slurmd_registered(node, nodeset.uid,
                                                     observed_feature(nodeset)):
        return  # the plan creates the pod; the undrain waits for its slurmd
    if slurm is None:
        return
    if "DRAIN" in slurm.flags:
        if our_drain(node):
            down = nodeset is not None and slurm.state.upper() == "DOWN"
            result = planner.ensure(
                node,
                wk.OWNER_SLURM,
                VERB_RESUME,
                "sunkd's slurmd registered on the node Slurm left DOWN under sunkd's drain: "
                "return it to service" if down else "no pool pods left: resume the node in Slurm",
                (*expected_drain(slurm), Label(RETURN_TO_SERVICE_ARG, "1")) if down
                else expected_drain(slurm),
                tx,
            )
            if result == OUTCOME_FAILED:
                planner.abort(node, transition, "the Slurm resume failed")
        return
    if slurm_usable(slurm):
        planner.complete(
            node,
            transition,
            "adopted: usable in Slurm and tainted"
            if adopt
            else "Slurm reports the node usable and it is tainted: node belongs to slurm",
        )

def can_reclaim(planner: Planner, node: NodeState, assessment: Assessment) -> bool:
    slurm = node.slurm
    # A lent Dynamic node whose record is gone (slurmdgone.dynamic_absent): its next
    # slurmd creates it anew, after the reclaim's taint and with every pod gone.
    drained = (slurm is not None and "DRAIN" in slurm.flags and our_drain(node)) or (
        slurm is None and dynamic_absent(planner.state, node, planner.now))
    return (
        assessment.phase == Phase.KUBERNETES
        and node.transition is None
        and node.name not in planner.touched
        and not node.open_actions
        and drained
        and assessment.pin != wk.OWNER_KUBERNETES
    )

def start_reclaim(planner: Planner, node: NodeState, pool: PoolSpec, why: str) -> None:
    transition = planner.start(node, pool.name, wk.OWNER_KUBERNETES, wk.OWNER_SLURM, why)
    advance_to_slurm(planner, node, transition, pool.ownership)
