"""The slurmd conditions of a Nodeset with `spec.slurmd`: Ready, Progressing, Degraded.

`status.slurmd` counts the pods; the conditions say in one line each what a person (or
`kubectl wait --for=condition=SlurmdReady`) wants to know, with the nodes concerned:

- **SlurmdReady**: every node that should run sunkd's slurmd pod (Slurm-owned, or being
  reclaimed, held or not) runs one whose slurmd Slurm hears and accepted
  (`slurmdgone.slurmd_registered`: a registration slurmctld refused, INVALID_REG, is not
  registered). No such node: True.
- **SlurmdProgressing**: sunkd is replacing pods (`RollingUpdate`: a node in update, or a
  registered pod at another revision than the spec's under `RollingUpdate`), repairing
  one (a pod missing, ended or unregistered on a settled Slurm-owned node, or sunkd's
  repair drain still on), or starting one (a node that should run a pod has none
  registered yet, and nothing is wrong with it). In that order of precedence.
- **SlurmdDegraded**: a node that needs someone: its registration refused
  (`InvalidRegistration`, with Slurm's state and reason), its pod Running past the
  registration bound with Slurm not hearing it (`Unregistered`), or its pod recreated
  again and again (`RepairFailing`: the latest create is a repeat within the repair's
  reset window, or a pod action failed). In that order of precedence; every node is named
  in the message (at most `MAX_NAMED`).

Sources not fresh: all three `Unknown` (nothing is decided on stale data, nor said).

Pure: no I/O; `now` is an input. `lastTransitionTime` is kept by the status writer
(`kubernetes/nodeset_status.py`) while a condition's status does not change, as the
Kubernetes API conventions ask for conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.slurmd import SlurmdNodeset, revision
from sunkd.domain.policy.slurmdrepair import (
    INVALID,
    ROLLING_UPDATE,
    UNREGISTERED,
    is_repair_drain,
    trouble,
)
from sunkd.domain.policy.slurmdupdate import in_update
from sunkd.domain.slurmdgone import (
    CREATE,
    DELETE,
    own_slurmd_pods,
    slurmd_registered,
)
from sunkd.domain.slurmnode import registration_refused
from sunkd.domain.state import ClusterState, NodeState

MAX_NAMED = 5  # nodes named in a condition's message


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True", "False", "Unknown"
    reason: str
    message: str


def _named(nodes: Sequence[str]) -> str:
    more = f", ... ({len(nodes)} in all)" if len(nodes) > MAX_NAMED else ""
    return ", ".join(nodes[:MAX_NAMED]) + more


def _should_run(node: NodeState) -> bool:
    """Slurm-owned (settled, held or not) or being moved to Slurm: its pod should run."""
    transition = node.transition
    target = transition.to_owner if transition is not None else node.owner
    return target == wk.OWNER_SLURM


def _repeating(node: NodeState) -> bool:
    """The latest slurmd pod create is a repeat of the repair's backoff row, or the last
    create or delete failed."""
    create = node.outcomes.get(CREATE)
    delete = node.outcomes.get(DELETE)
    return ((create is not None and (not create.succeeded or create.attempt >= 2))
            or (delete is not None and not delete.succeeded))


def slurmd_conditions(state: ClusterState, nodeset: SlurmdNodeset,
                      members: Sequence[NodeState], now: float) -> list[Condition]:
    """SlurmdReady, SlurmdProgressing, SlurmdDegraded for the Nodeset's pool members."""
    if not state.sources_fresh():
        why = "a source is stale or lost: sunkd does not judge its slurmd pods"
        return [Condition(kind, "Unknown", wk.REASON_SOURCES_STALE, why)
                for kind in (wk.CONDITION_SLURMD_READY, wk.CONDITION_SLURMD_PROGRESSING,
                             wk.CONDITION_SLURMD_DEGRADED)]
    rev = revision(nodeset.spec)
    feature = nodeset.feature  # Dynamic: the Nodeset's feature
    rolling = nodeset.spec.update_strategy == ROLLING_UPDATE
    wanted = registered = 0
    unregistered: list[str] = []
    updating: list[str] = []
    repairing: list[str] = []
    starting: list[str] = []
    refused: list[str] = []
    silent: list[str] = []
    failing: list[str] = []
    for node in sorted(members, key=lambda n: n.name):
        slurm = node.slurm
        if registration_refused(slurm) and (_should_run(node) or any(
                not p.deleting for p in own_slurmd_pods(node, nodeset.uid))):
            # Also on a node whose reclaim the hold aborted: sunkd's pod is there.
            assert slurm is not None
            state_text = "+".join([slurm.state.upper(), *slurm.flags])
            refused.append(f"{node.name} ({state_text}: {slurm.reason or 'no reason'})")
        if not _should_run(node):
            continue
        wanted += 1
        ok = slurmd_registered(node, nodeset.uid, feature)
        registered += ok
        if not ok:
            unregistered.append(node.name)
        wrong = trouble(node, nodeset.uid, now, feature) if node.transition is None else None
        pods = [p for p in own_slurmd_pods(node, nodeset.uid)
                if not p.deleting and p.phase == "Running"]
        if in_update(node) or (rolling and ok and any(
                p.slurmd_revision and p.slurmd_revision != rev for p in pods)):
            updating.append(node.name)
        elif (wrong is not None and wrong.kind != INVALID) or (
                slurm is not None and "DRAIN" in slurm.flags and is_repair_drain(slurm.reason)
                and node.transition is None and not registration_refused(slurm)):
            repairing.append(node.name)
        elif not ok and not registration_refused(slurm):
            starting.append(node.name)
        if wrong is not None and wrong.kind == UNREGISTERED:
            silent.append(node.name)
        if wrong is not None and wrong.kind != INVALID and _repeating(node):
            failing.append(node.name)

    ready = (Condition(wk.CONDITION_SLURMD_READY, "True", wk.REASON_ALL_REGISTERED,
                       f"{registered} of {wanted} Slurm-owned node(s) run a registered "
                       "slurmd pod") if not unregistered else
             Condition(wk.CONDITION_SLURMD_READY, "False", wk.REASON_NOT_ALL_REGISTERED,
                       f"{registered} of {wanted} Slurm-owned node(s) run a registered "
                       f"slurmd pod; not: {_named(unregistered)}"))
    if updating:
        progressing = Condition(wk.CONDITION_SLURMD_PROGRESSING, "True",
                                wk.REASON_ROLLING_UPDATE,
                                f"replacing slurmd pods for revision {rev}: "
                                f"{_named(updating)}")
    elif repairing:
        progressing = Condition(wk.CONDITION_SLURMD_PROGRESSING, "True", wk.REASON_REPAIRING,
                                f"repairing slurmd pods: {_named(repairing)}")
    elif starting:
        progressing = Condition(wk.CONDITION_SLURMD_PROGRESSING, "True", wk.REASON_STARTING,
                                f"slurmd pods starting: {_named(starting)}")
    else:
        progressing = Condition(wk.CONDITION_SLURMD_PROGRESSING, "False", wk.REASON_SETTLED,
                                f"every slurmd pod at revision {rev}, none repaired")
    found = [(wk.REASON_INVALID_REGISTRATION,
              f"Slurm refused the slurmd registration of {_named(refused)}: slurmd reported "
              "less than the NodeName= line (held)", refused),
             (wk.REASON_UNREGISTERED,
              f"slurmd pod running and Slurm not hearing it: {_named(silent)}", silent),
             (wk.REASON_REPAIR_FAILING,
              f"slurmd pod recreated again or its action failing: {_named(failing)}",
              failing)]
    bad = [(reason, message) for reason, message, nodes in found if nodes]
    degraded = (Condition(wk.CONDITION_SLURMD_DEGRADED, "True", bad[0][0],
                          "; ".join(message for _, message in bad)) if bad else
                Condition(wk.CONDITION_SLURMD_DEGRADED, "False", wk.REASON_AS_EXPECTED,
                          "no slurmd pod needs anyone"))
    return [ready, progressing, degraded]
