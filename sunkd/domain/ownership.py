"""The per-node ownership state machine: what a node's evidence means right now.

The fold (`state.py`) records the evidence and the phase that transition events
moved the node to (SLURM, TO_K8S, KUBERNETES, TO_SLURM; UNKNOWN before adoption).
This module overlays what the observations say at time `now` (docs/architecture.md, "Ownership and
policy"):

- UNKNOWN: a source is not fresh (stale, lost or never reported), or the node has not
  been observed on both sides yet. Nobody may act on such a node. A Dynamic Nodeset's
  node never reported by a Slurm source fresh in this term is known absent, not unknown
  (its slurmd pod creates it in Slurm: `slurmdgone`, "absent").
- HELD: something outside sunkd's control makes the node unusable or claims it:
  Slurm DOWN/FAIL/NOT_RESPONDING/... for longer than `UNHEALTHY_GRACE_SECONDS` (unless
  sunkd's own slurmd pod is gone or starting there: `slurmdgone`), a slurmd registration
  slurmctld refused (INVALID_REG: at once, no grace; `slurmnode.registration_refused`), a
  foreign drain, Kubernetes NotReady, a cordon, a foreign hold taint, or the node
  vanished from one side (or, for a Dynamic Nodeset, is absent from Slurm past its
  registration bound, or is reported without the Nodeset's feature: someone else's).
  Foreign means sunkd's log does not prove it wrote it
  (`authorship`): a `sunkd:` reason or a `sunkd.io/slurm-hold` taint copied by hand is
  foreign too. Open transitions are aborted, the hold
  is mirrored to the other side, and no move starts until it clears.

Operator pins are *not* holds (they are intent, not trouble): a pin to the current
owner keeps the node where it is (no move starts, a move away is aborted), a pin to
the other side makes the policy move it. `Assessment.pin` reports the pin. A pin that
is none of slurm|kubernetes|auto (`Slurm`, spelled like the pool mode; a stray blank) is
an *invalid pin*: it must not read as "no pin", so it acts as a pin to the side the node
is on (nothing moves it) and `Assessment.invalid_pin` reports it.

Unknown is not none: a node whose Kubernetes Node has not reported its pods (never, or
not since the claim changed hands) is UNKNOWN, never "no pods": no resume, no unlock, no
handover while sunkd cannot see what runs there.

The Slurm vocabulary (busy, drained, usable, unhealthy, in contact) is `slurmnode.py`,
re-exported here; `is_ours` and the taint predicates are the rest of the safety
vocabulary the policy and the tests share.
"""

from __future__ import annotations

from dataclasses import dataclass

from sunkd.domain import authorship as marks
from sunkd.domain import wellknown as wk
from sunkd.domain.authorship import DrainMark
from sunkd.domain.events import K8sNodeObserved, PodRef, SlurmNodeObserved
from sunkd.domain.gres import gres_problem
from sunkd.domain.slurmdgone import (
    REGISTER_BOUND_SECONDS,
    dynamic_absent,
    dynamic_nodeset,
    expected_out_of_contact,
    observed_feature,
)
from sunkd.domain.slurmnode import (
    in_contact,
    registered,
    registration_refused,
    slurm_busy,
    slurm_drained,
    slurm_unhealthy,
    slurm_usable,
)
from sunkd.domain.state import OWNER_NONE, ClusterState, NodeState, Phase

__all__ = [
    "OWNER_NONE",
    "UNHEALTHY_GRACE_SECONDS",
    "VALID_PINS",
    "Assessment",
    "Phase",
    "assess",
    "assess_all",
    "foreign_hold_taint",
    "foreign_word",
    "has_hold_taint",
    "has_owner_taint",
    "in_contact",
    "is_lend_drain",
    "is_mirror_drain",
    "is_ours",
    "observed",
    "our_drain",
    "our_hold_taint",
    "running_pods",
    "slurm_busy",
    "slurm_drained",
    "slurm_unhealthy",
    "slurm_usable",
]

UNHEALTHY_GRACE_SECONDS = 30.0
# What `sunkd.io/pin` and `operator.pinned` may say; "auto" (or nothing) is no pin.
VALID_PINS = (wk.OWNER_SLURM, wk.OWNER_KUBERNETES, "auto")


def is_ours(reason: str | None) -> bool:
    """A reason in sunkd's format (`sunkd:` first). A convention, not a proof: necessary
    for sunkd to lift a drain, never sufficient (`our_drain` is the proof)."""
    return reason is not None and reason.startswith(wk.REASON_PREFIX)


def our_drain(node: NodeState) -> bool:
    """Slurm shows the node drained with a reason sunkd wrote and nobody changed since:
    the node's drain mark shows exactly (text and reason time), or sunkd's drain of this
    very text is in flight (requested, no outcome yet: the source may append the drained
    node before the executor appends the success; nothing is lifted while it is open).
    The only Slurm drain sunkd may remove."""
    slurm = node.slurm
    if slurm is None or "DRAIN" not in slurm.flags or not is_ours(slurm.reason):
        return False
    mark = node.drain_mark
    if mark is not None and marks.drain_shows(mark, slurm):
        return True
    return any(action.side == wk.OWNER_SLURM and action.verb == "drain"
               and marks.requested_reason(action.args, action.reason) == slurm.reason
               for action in node.open_actions.values())


def our_hold_taint(node: NodeState) -> bool:
    """The Kubernetes node carries sunkd's hold taint, and only it, as sunkd's log proves
    it wrote it (its hold mark shows), or sunkd's hold is in flight. The only hold sunkd
    may lift."""
    k8s = node.k8s
    if not has_hold_taint(k8s):
        return False
    mark = node.hold_mark
    if mark is not None and marks.hold_shows(mark, k8s):
        return True
    return any(action.side == wk.OWNER_KUBERNETES and action.verb == "cordon"
               for action in node.open_actions.values())


def foreign_hold_taint(node: NodeState) -> bool:
    """A taint under sunkd's hold key that sunkd's log does not prove it wrote (copied
    from a held node, or put back by hand after sunkd lifted its own): an operator's
    hold, never lifted."""
    return has_hold_taint(node.k8s) and not our_hold_taint(node)


def is_lend_drain(reason: str | None) -> bool:
    return reason is not None and reason.startswith(wk.REASON_LEND)


def is_mirror_drain(reason: str | None) -> bool:
    """Our drain mirroring a Kubernetes-side hold (`sunkd: k8s <why>`)."""
    return reason is not None and reason.startswith(wk.REASON_MIRROR)


def foreign_word(observation: SlurmNodeObserved | None, mark: DrainMark | None = None) -> bool:
    """Someone else's reason that still means something: on a drained node, or on one
    Slurm reports unhealthy (DOWN, FAIL, NOT_RESPONDING ...). sunkd never writes over it
    (`scontrol update state=down reason="bad DIMM"` sets no DRAIN flag, and is still an
    admin's word). A stale reason on a healthy, undrained node protects nothing (24.11
    keeps the old text after a RESUME). A `sunkd:` reason is sunkd's own only on a node
    whose drain `mark` (NodeState.drain_mark) shows it: otherwise it is foreign too."""
    if observation is None or not observation.reason:
        return False
    if is_ours(observation.reason) and mark is not None and (
            marks.drain_shows(mark, observation) or marks.drain_lifting(mark, observation)):
        return False
    return "DRAIN" in observation.flags or slurm_unhealthy(observation)


def has_hold_taint(observation: K8sNodeObserved | None) -> bool:
    """The Kubernetes node carries a taint under sunkd's hold key (`sunkd.io/slurm-hold`),
    whoever wrote it: enough to keep sunkd from adding its own, never proof that it is
    sunkd's (`our_hold_taint` is the proof). sunkd never sets spec.unschedulable, so every
    cordon is an operator's."""
    return observation is not None and any(
        taint.key == wk.TAINT_HOLD for taint in observation.taints
    )


def has_owner_taint(observation: K8sNodeObserved | None) -> bool:
    """The Kubernetes node carries the `sunkd.io/owner` taint (pool pods stay off)."""
    return observation is not None and any(
        taint.key == wk.TAINT_OWNER for taint in observation.taints
    )


@dataclass(frozen=True, slots=True)
class Assessment:
    """What a node's evidence means at `now`."""

    node: str
    phase: Phase
    owner: str
    unknown_reasons: tuple[str, ...] = ()  # why nobody may act (phase UNKNOWN)
    slurm_holds: tuple[str, ...] = ()  # Slurm-side trouble (mirrored to Kubernetes)
    k8s_holds: tuple[str, ...] = ()  # Kubernetes-side trouble (mirrored to Slurm)
    slurm_unhealthy: bool = False  # Slurm reports it broken, held or still in grace
    pin: str | None = None  # slurm | kubernetes when an operator pinned it
    # A Slurm job and a (non-DaemonSet) pod on the node at once: the one thing sunkd exists
    # to prevent. HELD, reported (metric, Event, audit record), never silent (I1).
    conflicts: tuple[str, ...] = ()
    # The operator's pin text when it is none of VALID_PINS: `pin` is then the side the
    # node is on (a move away is aborted as for a pin to it), never a move.
    invalid_pin: str | None = None
    # Slurm registered other GPUs than the Kubernetes Node has (or they cannot be read):
    # also in `slurm_holds`, so the node is HELD, never lent (`GresConsistent=False`).
    gres_problem: str | None = None
    # slurmctld refused the node's slurmd registration (INVALID_REG): Slurm's state and
    # reason, for people. Also in `slurm_holds` (HELD at once, never lent or undrained).
    invalid_registration: str | None = None

    @property
    def pin_problem(self) -> str | None:
        """Why the pin is not obeyed, for people (None when it is valid or absent)."""
        if self.invalid_pin is None:
            return None
        stays = f"the node stays with {self.pin}" if self.pin else "nothing moves the node"
        return (f"invalid pin {self.invalid_pin!r} (only {', '.join(VALID_PINS)}): "
                f"not obeyed; {stays}")

    def pin_why(self) -> str:
        """The reason a move stops for the pin."""
        return self.pin_problem or f"operator pinned the node to {self.pin}"

    @property
    def hold_reasons(self) -> tuple[str, ...]:
        return tuple(sorted((*self.slurm_holds, *self.k8s_holds, *self.conflicts)))

    @property
    def actionable(self) -> bool:
        """Fresh sources and observed on both sides: sunkd may act on it."""
        return not self.unknown_reasons

    @property
    def identity_conflict(self) -> bool:
        """Two Kubernetes Nodes claim this Slurm node: nobody knows which side is which."""
        return any(c.startswith("identity conflict") for c in self.conflicts)

    @property
    def held(self) -> bool:
        return bool(self.slurm_holds or self.k8s_holds or self.conflicts)


def _slurm_condition(observation: SlurmNodeObserved) -> str:
    words = [observation.state.upper(), *observation.flags]
    text = "+".join(words)
    if observation.reason:
        text += f" ({observation.reason})"
    return text


def sources_unknown(state: ClusterState) -> tuple[str, ...]:
    """Why no node may be acted on: a source not fresh in this leadership term."""
    unknown: list[str] = []
    for source in (wk.OWNER_SLURM, wk.OWNER_KUBERNETES):
        health = state.sources.get(source)
        if health is None:
            unknown.append(f"{source} source has not reported yet")
        elif health.status != "fresh":
            cause = f": {health.cause}" if health.cause else ""
            unknown.append(f"{source} source is {health.status}{cause}")
        elif not state.source_fresh(source):
            unknown.append(f"{source} source has not reported in this leadership term yet")
    return tuple(unknown)


def assess(state: ClusterState, node: NodeState, now: float,
           sources: tuple[str, ...] | None = None) -> Assessment:
    """The node's effective phase and the reasons behind it at `now`. `sources` is
    `sources_unknown(state)` when the caller assesses many nodes of one state."""
    unknown = list(sources_unknown(state) if sources is None else sources)
    # A Dynamic Nodeset's node is in Slurm only once its slurmd registered: with the
    # Slurm source fresh in this term (it lists every node each poll), never reported is
    # known absent, not unknown (slurmdgone.py, "absent").
    dynamic = dynamic_nodeset(state, node)
    if node.slurm is None and not node.slurm_missing and dynamic is None:
        unknown.append("not observed in Slurm yet")
    if node.k8s is None and not node.k8s_missing:
        unknown.append("not observed in Kubernetes yet")
    elif node.k8s is not None and node.pods is None:
        unknown.append(f"pods unknown: Kubernetes Node {node.k8s_name or node.name} has not "
                       "reported its pods to sunkd")
    pin, invalid_pin = _pin_of(node)
    if unknown:
        return Assessment(node.name, Phase.UNKNOWN, node.owner, tuple(unknown), pin=pin,
                          invalid_pin=invalid_pin)

    slurm_holds: list[str] = []
    slurm = node.slurm
    unhealthy = False
    gres: str | None = None
    invalid: str | None = None
    if slurm is None:
        if dynamic is None:
            slurm_holds.append("missing in Slurm")
        elif not dynamic_absent(state, node, now):
            slurm_holds.append(
                f"missing in Slurm (Dynamic Nodeset {dynamic.pool}: no slurmd pod of its "
                f"registered the node, {REGISTER_BOUND_SECONDS:g} s bound; its NodeSet= "
                "and partition lines, MaxNodeCount?)")
    else:
        feature = observed_feature(dynamic) if dynamic is not None else None
        if dynamic is not None and feature is not None and feature not in slurm.features:
            # A node of the name that is not the Nodeset's (slurmdgone.py): nothing of
            # sunkd's acts on someone else's node.
            slurm_holds.append(
                f"slurm node without feature {feature}: not Dynamic Nodeset "
                f"{dynamic.pool}'s node but another of the same name")
        unhealthy = slurm_unhealthy(slurm)
        since = node.slurm_unhealthy_since
        if registration_refused(slurm):
            # No grace: no blip sets it, only a registration slurmctld refused, and only
            # the next valid registration clears it (slurmnode.py).
            invalid = _slurm_condition(slurm)
            slurm_holds.append(f"slurmd registration refused by Slurm: {invalid}")
        elif (unhealthy and since is not None and now - since >= UNHEALTHY_GRACE_SECONDS
                and not expected_out_of_contact(state, node, now)):
            # Out of contact because sunkd's own slurmd pod is gone or starting
            # (slurmdgone.py) is the state sunkd made, not trouble.
            slurm_holds.append(f"slurm {_slurm_condition(slurm)}")
        if node.owner == wk.OWNER_SLURM and registered(slurm) and node.k8s is not None:
            gres = gres_problem(slurm.gres, node.k8s.gres)
            if gres is not None:
                slurm_holds.append(gres)  # after registration, before any lend
        if ("DRAIN" in slurm.flags and not our_drain(node)
                and not marks.drain_lifting(node.drain_mark, slurm)):
            by = f" by {slurm.reason_set_by}" if slurm.reason_set_by else ""
            forged = " (sunkd's log does not prove it wrote it)" if is_ours(slurm.reason) else ""
            slurm_holds.append(f"slurm drained{by}: {slurm.reason or '(no reason)'}{forged}")

    k8s_holds: list[str] = []
    k8s = node.k8s
    if k8s is None:
        k8s_holds.append("missing in Kubernetes")
    else:
        if k8s.ready is not True:
            k8s_holds.append("NotReady" if k8s.ready is False else "Ready unknown")
        if k8s.unschedulable:  # every cordon is an operator's: sunkd's hold is a taint
            k8s_holds.append("cordoned")
        if foreign_hold_taint(node):
            k8s_holds.append(f"foreign hold taint {wk.TAINT_HOLD} (sunkd's log does not "
                             "prove it wrote it)")
    identity = ""
    if node.k8s_rivals:
        claimants = ", ".join(sorted({node.k8s_name or node.name, *node.k8s_rivals}))
        identity = (f"identity conflict: Kubernetes Nodes {claimants} all claim Slurm node "
                    f"{node.name} (label {wk.LABEL_SLURM_NODE_NAME})")

    conflicts: list[str] = []
    # Slurm first: listing the pods costs a string per pod, and most nodes are not busy
    # in Slurm (every decide assesses every node).
    busy = slurm is not None and slurm_busy(slurm)
    pods = running_pods(node) if busy else []
    if pods:
        conflicts.append(
            f"conflict: Slurm job(s) and {len(pods)} pod(s) on one node ({', '.join(pods[:3])}"
            f"{', ...' if len(pods) > 3 else ''})"
        )

    if identity:
        conflicts.append(identity)

    if slurm_holds or k8s_holds or conflicts:
        phase = Phase.HELD
    else:
        phase = node.phase
    return Assessment(
        node=node.name,
        phase=phase,
        owner=node.owner,
        slurm_holds=tuple(slurm_holds),
        k8s_holds=tuple(k8s_holds),
        slurm_unhealthy=unhealthy,
        pin=pin,
        conflicts=tuple(conflicts),
        invalid_pin=invalid_pin,
        gres_problem=gres,
        invalid_registration=invalid,
    )


def _pin_of(node: NodeState) -> tuple[str | None, str | None]:
    """(the pin the policy obeys, the invalid pin text). The fold keeps a pin's text as
    written; one that is not slurm|kubernetes pins the node to the side it is on (the
    side a move started from): no move starts, a move away stops before its point of no
    return, and an adoption (from no owner) is left alone."""
    if node.pin is None:
        return None, None
    if node.pin.to in (wk.OWNER_SLURM, wk.OWNER_KUBERNETES):
        return node.pin.to, None
    here = node.transition.from_owner if node.transition is not None else node.owner
    return (here if here in (wk.OWNER_SLURM, wk.OWNER_KUBERNETES) else None), node.pin.to


_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def _beside_slurm(pod: PodRef, node: NodeState) -> bool:
    """A pod that has not finished and is not this node's own slurmd pod (Slurm's daemon,
    not a pod beside Slurm; a slurmd pod for another node, or an impostor, counts). The
    one test behind `running_pods` and `running_pod_count`, so they never disagree."""
    return pod.phase not in _DONE_PHASES and pod.slurmd != node.name


def running_pods(node: NodeState) -> list[str]:
    """`namespace/name` of every pod the Kubernetes source reports on the node that has not
    finished: the pool's pods and any other non-DaemonSet, non-mirror pod, except the
    node's own slurmd pod (`_beside_slurm`)."""
    return sorted(f"{pod.namespace}/{pod.name}" for pod in node.pods or ()
                  if _beside_slurm(pod, node))


def no_pods(node: NodeState) -> bool:
    """The node's Node reported its pods and none of them runs. Unknown pods (no report)
    are never "no pods": every handover to Slurm and every "idle" count asks this, not
    `running_pods(node) == []`."""
    return node.pods is not None and running_pod_count(node) == 0


def running_pod_count(node: NodeState) -> int:
    """How many pods `running_pods` lists, without naming and sorting them (the policy
    counts and orders by it for every member on every round)."""
    return sum(1 for pod in node.pods or () if _beside_slurm(pod, node))


def observed(node: NodeState) -> bool:
    """Whether the log ever said anything about `node` besides a pin: an observation from
    either side, a transition, an action or an owner. A pin of a name never observed
    (`sunkd pin --force typo-node`) makes the fold create the node; it is a phantom until
    observed: the `node_ownership` read model has no row for it, and `status`, `/metrics`
    and the API lists leave it out."""
    return (node.slurm is not None or node.k8s is not None or node.slurm_seq > 0
            or node.k8s_seq > 0 or node.transition is not None or bool(node.open_actions)
            or node.owner != OWNER_NONE)


def assess_all(state: ClusterState, now: float) -> dict[str, Assessment]:
    """Every node's assessment at `now` (for status, metrics and the read API)."""
    return {name: assess(state, node, now) for name, node in state.nodes.items()}


def slurm_state_text(observation: SlurmNodeObserved | None, missing: str = "-") -> str:
    """`IDLE+DRAIN`-style text of a Slurm observation, for people and annotations."""
    if observation is None:
        return missing
    return "+".join([observation.state.upper(), *observation.flags])


def explain(node: NodeState, assessment: Assessment) -> list[str]:
    """Why a node is where it is, most important first: the open transition's reason,
    then its holds (or why sunkd cannot judge it)."""
    reasons = list(assessment.hold_reasons or assessment.unknown_reasons)
    if node.transition is not None:
        reasons.insert(0, node.transition.reason)
    return reasons
