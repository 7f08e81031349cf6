"""Repairs: put back what a settled phase requires when someone or something undid it.

A Slurm-owned node must carry the owner taint, run no pool pods and carry no lend
drain; a node lent to Kubernetes must stay drained in Slurm and untainted.
"""

from __future__ import annotations

import dataclasses

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label
from sunkd.domain.ownership import (
    Assessment,
    assess,
    foreign_word,
    has_owner_taint,
    is_lend_drain,
    our_drain,
    slurm_drained,
)
from sunkd.domain.policy.model import (
    VERB_DRAIN,
    VERB_EVICT,
    VERB_LOCK,
    VERB_RESUME,
    VERB_UNLOCK,
    VERB_WARN,
    lend_reason,
)
from sunkd.domain.policy.planner import (
    Planner,
    active_pod_count,
    evict_args,
    expected_drain,
    may_resume,
)
from sunkd.domain.state import OWNER_NONE, NodeState, Phase

CONFLICT_WARN_EVERY_SECONDS = 600.0  # a standing conflict is re-reported this often


def repair_while_held(planner: Planner, node: NodeState, assessment: Assessment) -> None:
    """What stays safe however held the node is, and must not wait for the hold to end.

    * A Slurm-owned node without the owner taint gets it back at once (adding a NoSchedule
      taint never harms a running pod): a Node deleted and re-created by its kubelet comes
      back NotReady and untainted, and is schedulable the moment it turns Ready.
    * A conflict (a Slurm job and a pod on one node) is reported as a Warning Event on the
      node (its request in the log is the audit record), then repaired like any drift:
      a lent node is drained again, pool pods on a Slurm node are evicted.
    """
    k8s = node.k8s
    if (
        node.owner == wk.OWNER_SLURM
        and node.transition is None
        and k8s is not None
        and not has_owner_taint(k8s)
    ):
        planner.ensure(
            node, wk.OWNER_KUBERNETES, VERB_LOCK,
            "repair: Slurm-owned node has no owner taint (safe to add while held)",
        )
    if assessment.conflicts:
        if (
            node.transition is None
            and node.owner != OWNER_NONE
            and not assessment.slurm_holds
            and not assessment.k8s_holds
            and node.slurm is not None
        ):
            # Repair as the settled phase would (HELD is only the conflict's overlay).
            repair_settled(planner, node, dataclasses.replace(assessment, phase=node.phase))


def _warned_lately(planner: Planner, node: NodeState) -> bool:
    """The last Warning Event on the node was written less than
    CONFLICT_WARN_EVERY_SECONDS ago. One the API server did not take was never said: it is
    asked again as any failed action is (`ensure`'s backoff), not after the long pause."""
    outcome = node.outcomes.get(f"{wk.OWNER_KUBERNETES}/{VERB_WARN}")
    return (outcome is not None and outcome.succeeded
            and planner.now - outcome.at < CONFLICT_WARN_EVERY_SECONDS)


def report_conflict(planner: Planner, node: NodeState, assessment: Assessment) -> None:
    """A Warning Event on the node, first thing in the node's round (nothing of this round
    may hold it back), then again every CONFLICT_WARN_EVERY_SECONDS while it lasts."""
    if not _warned_lately(planner, node):
        event = wk.EVENT_IDENTITY_CONFLICT if assessment.identity_conflict else wk.EVENT_CONFLICT
        planner.ensure(
            node, wk.OWNER_KUBERNETES, VERB_WARN, "; ".join(assessment.conflicts),
            (Label("event_reason", event),
             Label("message", "; ".join(assessment.conflicts))),
        )


def report_invalid_pin(planner: Planner, node: NodeState, assessment: Assessment) -> None:
    """An invalid pin is a Warning Event on the node (the operator meant something sunkd
    does not obey), as often as a conflict's."""
    problem = assessment.pin_problem
    if problem is not None and not _warned_lately(planner, node):
        planner.ensure(node, wk.OWNER_KUBERNETES, VERB_WARN, problem,
                       (Label("event_reason", wk.EVENT_INVALID_PIN), Label("message", problem)))


def report_gres(planner: Planner, node: NodeState, assessment: Assessment) -> None:
    """A Slurm-owned node whose registered GRES is not its GPUs is held (never lent): a
    Warning Event on the node says why, as often as a conflict's."""
    problem = assessment.gres_problem
    if problem is not None and not _warned_lately(planner, node):
        planner.ensure(node, wk.OWNER_KUBERNETES, VERB_WARN, problem,
                       (Label("event_reason", wk.EVENT_GRES_MISMATCH), Label("message", problem)))


def invalid_registration_message(node: NodeState, assessment: Assessment) -> str | None:
    """The Warning for a slurmd registration slurmctld refused (INVALID_REG), with Slurm's
    state and reason (22.05 keeps the reason that was on the node, sunkd's drain
    included; 24.11 and later show slurmctld's, e.g. `Low RealMemory (reported:... <
    ... of configured:...)`)."""
    if assessment.invalid_registration is None:
        return None
    return (f"Slurm refused the registration of {node.name}'s slurmd (INVALID_REG): "
            f"{assessment.invalid_registration}. slurmd reported less than the node's "
            "NodeName= line in slurm.conf (CPUs, RealMemory, Gres): fix the line or the "
            "host, then `scontrol reconfigure`. sunkd holds the node meanwhile: no lend, no "
            "undrain, its slurmd pod left as it is")


def report_invalid_registration(planner: Planner, node: NodeState,
                                assessment: Assessment) -> None:
    """A node whose slurmd registration slurmctld refused is held: a Warning Event on the
    node says why, with Slurm's reason, as often as a conflict's."""
    message = invalid_registration_message(node, assessment)
    if message is not None and not _warned_lately(planner, node):
        planner.ensure(node, wk.OWNER_KUBERNETES, VERB_WARN, message,
                       (Label("event_reason", wk.EVENT_INVALID_REGISTRATION),
                        Label("message", message)))


def report_unparsed(planner: Planner, node: NodeState) -> None:
    """A Node whose allocatable did not parse has unknown capacity (no pods are packed by
    it): a Warning Event on the node names the resources, as often as a conflict's."""
    k8s = node.k8s
    if k8s is not None and k8s.unparsed and not _warned_lately(planner, node):
        problem = (f"allocatable {', '.join(k8s.unparsed)} did not parse: capacity unknown, "
                   "no pods are packed by it until the Node reports a valid quantity")
        planner.ensure(node, wk.OWNER_KUBERNETES, VERB_WARN, problem,
                       (Label("event_reason", wk.EVENT_UNPARSED_QUANTITY),
                        Label("message", problem)))


def report_overlap(planner: Planner, node: NodeState, claimed_by: tuple[str, ...]) -> None:
    """A node several pools select belongs to none of them: say so on the node, once per
    CONFLICT_WARN_EVERY_SECONDS (only when both sides can be trusted right now).

    No pool drives it, but a Slurm job beside a pod there is still a conflict: the
    `SunkdConflict` Warning (naming the pool conflict too) and the repair of the node's
    settled owner (`repair_while_held`: a lent node drained again, pods evicted from a
    Slurm-owned one), as for a node of one pool; nothing else (no move, no mirror)."""
    state = planner.state
    if not state.sources_fresh():
        return
    if node.k8s is None:
        return
    why = (f"pool conflict: selected by {', '.join(claimed_by)}; no pool drives it until "
           "one Nodeset stops selecting it")
    assessment = assess(state, node, planner.now)
    if assessment.actionable and assessment.conflicts:
        report_conflict(planner, node, dataclasses.replace(
            assessment, conflicts=(*assessment.conflicts, why)))
        if not assessment.identity_conflict:  # which Node is which is unknown: warn only
            repair_while_held(planner, node, assessment)
        return
    if _warned_lately(planner, node):
        return
    planner.ensure(node, wk.OWNER_KUBERNETES, VERB_WARN, why,
                   (Label("event_reason", wk.EVENT_POOL_CONFLICT), Label("message", why)))


def repair_settled(planner: Planner, node: NodeState, assessment: Assessment) -> None:
    """Put back the side effects of a settled phase that someone or something undid."""
    slurm = node.slurm
    k8s = node.k8s
    assert k8s is not None
    if slurm is None:
        # Only a lent Dynamic node whose record is gone is settled without one
        # (slurmdgone.dynamic_absent): no drain to put back, nothing of Slurm's there.
        return
    if assessment.phase == Phase.SLURM:
        if not has_owner_taint(k8s):
            planner.ensure(node, wk.OWNER_KUBERNETES, VERB_LOCK,
                           "repair: Slurm-owned node lost its owner taint")
        pods = active_pod_count(node)
        if pods and has_owner_taint(k8s):
            planner.ensure(
                node,
                wk.OWNER_KUBERNETES,
                VERB_EVICT,
                f"repair: {pods} pool pod(s) on a Slurm-owned node",
                evict_args(node),
            )
        if ("DRAIN" in slurm.flags and is_lend_drain(slurm.reason) and our_drain(node)
                and may_resume(node)):
            planner.ensure(
                node,
                wk.OWNER_SLURM,
                VERB_RESUME,
                "repair: Slurm-owned node still carries a lend drain",
                expected_drain(slurm),
            )
    elif assessment.phase == Phase.KUBERNETES:
        if "DRAIN" not in slurm.flags and not foreign_word(slurm, node.drain_mark):
            planner.ensure(
                node,
                wk.OWNER_SLURM,
                VERB_DRAIN,
                "repair: node lent to kubernetes was resumed in Slurm; drain it again",
                (Label("reason", lend_reason(None)),),
            )
        elif (has_owner_taint(k8s) and slurm_drained(slurm) and our_drain(node)
              and node.pods is not None
              and not any(pod.slurmd == node.name for pod in node.pods)):
            # A slurmd pod still on the node (an aborted reclaim's: pinned back, or its
            # resume refused) goes first, as in a lend (the slurmd plan deletes it once
            # Slurm reports the node drained): never untainted beside a slurmd pod.
            planner.ensure(
                node,
                wk.OWNER_KUBERNETES,
                VERB_UNLOCK,
                "repair: node lent to kubernetes carries the owner taint",
            )
