"""Repair of a Slurm-owned node's slurmd pod: drain, delete, recreate with backoff, undrain.

With a Nodeset's `spec.slurmd`, a settled Slurm-owned node must run sunkd's slurmd pod and
Slurm must hear its slurmd. Three things break that: the pod is **missing** (someone
deleted it, the node lost it), it **ended** (Failed or Succeeded: slurmd exited), or it
runs **unregistered** (Running, or never Running, `REGISTER_BOUND_SECONDS` after it
started or was created, and Slurm has not heard the node for as long). slurmctld keeps
scheduling on a node until it misses its slurmd (NOT_RESPONDING, then DOWN after
`SlurmdTimeout`, slurm.conf(5)), and a job sent there fails. So, in this order:

1. **drain first** with sunkd's reason (`wk.REASON_SLURMD_REPAIR`): no job lands while
   it repairs. Never over someone else's word (`ownership.foreign_word`): a node
   someone else drained is already kept free of jobs (DRAIN survives a registration
   under every ReturnToService, slurm.conf(5)), so the repair goes on without writing
   to Slurm; a DOWN someone else set without DRAIN is left alone altogether (under
   ReturnToService=2 a registering slurmd returns any DOWN node to service, so a new pod
   would undo an administrator's DOWN). One DOWN without DRAIN is not anyone's word:
   slurmctld's own for not hearing the slurmd (reason `Not responding`, the node
   NOT_RESPONDING), which is what a returning slurmd is meant to lift; no job lands on a
   DOWN node, and a missing pod is recreated there without a drain (sunkd could not
   write one: its actuator never writes over a reason that is not sunkd's).
2. **delete** an ended or unregistered pod, only under DRAIN and with nothing allocated
   (a slurmd out of contact may still have job steps in its cgroup: slurmctld's
   allocation says so until it gives up on the node). The delete carries
   `SLURMD_REPAIR_ARG`: the executor asks Slurm again right before and accepts the node
   out of contact, never without DRAIN or with an allocation.
3. **recreate** once no pod of sunkd's is left (a terminating one is waited for), with
   the owner taint on and no foreign pod running (the slurmd actuator checks both again),
   and with exponential backoff: a create less than `REPAIR_RESET_SECONDS` after the
   node's previous one is attempt `previous + 1`, sent `repair_delay(attempt)` after it.
   The count is the create's attempt in the log (`ActionOutcome.attempt`), so a
   restarted sunkd backs off the same.
4. **undrain** sunkd's repair drain once the new slurmd registered
   (`slurmdgone.slurmd_registered`), with `RETURN_TO_SERVICE_ARG` when Slurm left the
   node DOWN under it (it registers as DOWN+DRAIN: ReturnToService=1 lifts only a
   `Not responding` DOWN, `validate_node_specs` in src/slurmctld/node_mgr.c).

A pod whose registration slurmctld refused (**invalid**: INVALID_REG, its slurmd reported
less than the node's `NodeName=` line, `slurmnode.registration_refused`) is left as it
is: a new pod on the same host would register the same way, and slurmctld refuses
UNDRAIN and RESUME while the flag is on. The node is HELD at once (`ownership.assess`,
a Warning Event with Slurm's state and reason, `policy/repair.py`); nothing is drained
(slurmctld drained it, or a DOWN or DRAIN was there already), deleted, created or
undrained until a registration clears the flag. A pod that ends meanwhile, or that
someone deletes, is replaced as any other (with the backoff of its creates).

Out of contact past `UNHEALTHY_GRACE_SECONDS`, the node is HELD meanwhile (the hold is
mirrored as usual); the repair still runs then, as long as nothing else holds it: no
Kubernetes hold (NotReady, a cordon, a foreign hold taint), no conflict, no GRES problem,
both sources fresh and the pods known (unknown is never "no pod"). A node whose pod is
under repair is never lent (`Planner.repairing`, `lend.can_lend`).

A node that never had a pod of sunkd's (no slurmd-create in its log) gets its first one
from the plan (`policy/slurmd.py`) as before, without a drain.

The rolling update (`policy/slurmdupdate.py`) runs the same steps on a node whose own
registered pod is **outdated** (its revision is not the spec's), for the nodes it chose
within `maxUnavailable`: drain with `wk.REASON_SLURMD_UPDATE`, wait for DRAIN with
nothing allocated, delete (the node is in contact: the executor asks Slurm for drained,
idle and in contact, as for a lend), then the pod is missing under sunkd's update drain
and the steps above create it at the spec's revision (the first create after that drain
is attempt 1: the pod it replaces had lived) and lift the drain once it registered. An
outdated pod is never deleted under a drain that is not sunkd's update drain.

Pure: no I/O; `planner.now` is the time.
"""

from __future__ import annotations

from dataclasses import dataclass

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, PodRef, SlurmNodeObserved
from sunkd.domain.ownership import Assessment, foreign_word, has_owner_taint, no_pods, our_drain
from sunkd.domain.policy.model import (
    RETURN_TO_SERVICE_ARG,
    SLURMD_REPAIR_ARG,
    VERB_DRAIN,
    VERB_RESUME,
)
from sunkd.domain.policy.planner import Planner, expected_drain
from sunkd.domain.policy.slurmd import (
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    SlurmdNodeset,
    SlurmdStep,
    pod_name,
    revision,
    slurmd_args,
)
from sunkd.domain.slurmdgone import (
    CREATE,
    DELETE,
    REGISTER_BOUND_SECONDS,
    own_slurmd_pods,
    slurmd_registered,
)
from sunkd.domain.slurmnode import (
    drain_requested,
    registration_refused,
    slurm_busy,
    slurm_drained,
)
from sunkd.domain.state import NodeState

# The second create of a row waits this long after the first, each next one twice as
# long, up to REPAIR_BACKOFF_MAX_SECONDS. The base is the policy's wait for an
# observation after a success (model.OBSERVATION_CATCHUP_SECONDS), which holds back any
# sooner second create anyway.
REPAIR_BACKOFF_BASE_SECONDS = 60.0
REPAIR_BACKOFF_MAX_SECONDS = 960.0
# A create this long after the node's previous one starts the count again (the pod lived).
REPAIR_RESET_SECONDS = 1800.0

_DONE = frozenset({"Succeeded", "Failed"})
MISSING = "missing"
TERMINATING = "terminating"
ENDED = "ended"
UNREGISTERED = "unregistered"
INVALID = "invalid"  # slurmctld refused the registration (INVALID_REG): left as it is
OUTDATED = "outdated"  # the rolling update's (policy/slurmdupdate.py)
ROLLING_UPDATE = "RollingUpdate"


@dataclass(frozen=True, slots=True)
class Trouble:
    """What is wrong with the node's slurmd pod; `pod` is the one to delete."""

    kind: str  # MISSING, TERMINATING, ENDED, UNREGISTERED, INVALID, OUTDATED
    why: str
    pod: PodRef | None = None


def repair_delay(attempt: int) -> float:
    """Seconds between the previous create and attempt number `attempt` (1: none)."""
    if attempt <= 1:
        return 0.0
    return float(min(REPAIR_BACKOFF_BASE_SECONDS * 2.0 ** (attempt - 2),
                     REPAIR_BACKOFF_MAX_SECONDS))


def repair_attempt(node: NodeState, now: float) -> int:
    """This create's number in the node's row of recent creates, from the log alone."""
    last = node.outcomes.get(CREATE)
    if last is None or now - last.at >= REPAIR_RESET_SECONDS:
        return 1
    mark = node.drain_mark
    if (mark is not None and mark.lifted is None and is_update_drain(mark.reason)
            and mark.at > last.at):
        return 1  # the rolling update's replacement: the pod it deleted had lived
    return last.attempt + 1


def is_repair_drain(reason: str | None) -> bool:
    return reason is not None and reason.startswith(wk.REASON_SLURMD_REPAIR)


def is_update_drain(reason: str | None) -> bool:
    return reason is not None and reason.startswith(wk.REASON_SLURMD_UPDATE)


def outdated_pod(node: NodeState, nodeset: SlurmdNodeset) -> PodRef | None:
    """Under `RollingUpdate`, the node's one slurmd pod of sunkd's when it runs, its
    slurmd registered, and its revision is reported and is not the spec's. A revision not
    reported ("") is unknown, never outdated."""
    if nodeset.spec.update_strategy != ROLLING_UPDATE:
        return None
    pods = own_slurmd_pods(node, nodeset.uid)
    if len(pods) != 1 or pods[0].deleting or pods[0].phase != "Running" \
            or not slurmd_registered(node, nodeset.uid, nodeset.feature):
        return None
    pod = pods[0]
    if not pod.slurmd_revision or pod.slurmd_revision == revision(nodeset.spec):
        return None
    return pod


def slurms_own_down(slurm: SlurmNodeObserved) -> bool:
    """DOWN because slurmctld stopped hearing the node's slurmd, nobody's word: its own
    reason, NOT_RESPONDING, no DRAIN (module docstring, step 1)."""
    return (slurm.state.upper() == "DOWN" and "NOT_RESPONDING" in slurm.flags
            and "DRAIN" not in slurm.flags and slurm.reason == wk.SLURM_REASON_NOT_RESPONDING)


def trouble(node: NodeState, nodeset_uid: str, now: float,
            feature: str | None = None) -> Trouble | None:
    """What is wrong with the node's slurmd pod of the Nodeset `nodeset_uid` (None:
    nothing the repair mends; two live pods are the plan's to report). `feature`: the
    Dynamic Nodeset's (`slurmdgone.nodeset_feature`), without which Slurm's node of that
    name is not the pod's."""
    pods = own_slurmd_pods(node, nodeset_uid)
    live = [p for p in pods if not p.deleting and p.phase not in _DONE]
    if len(live) > 1:
        return None
    if live:
        pod = live[0]
        if registration_refused(node.slurm) and pod.phase == "Running":
            slurm = node.slurm
            assert slurm is not None
            return Trouble(INVALID, f"slurmd pod {pod.namespace}/{pod.name} registered and "
                           f"Slurm refused it (INVALID_REG): {slurm.reason or '(no reason)'}",
                           pod)
        if slurmd_registered(node, nodeset_uid, feature):
            return None
        create = node.outcomes.get(CREATE)
        since = pod.started_at if pod.started_at is not None else (
            create.at if create is not None and create.succeeded else None)
        # Slurm not hearing it for the bound too: a slurmctld restart or a short loss
        # of contact with a pod that has run for long is no reason to repair anything.
        unheard = node.slurm_unhealthy_since
        if (since is not None and now - since > REGISTER_BOUND_SECONDS
                and unheard is not None and now - unheard > REGISTER_BOUND_SECONDS):
            return Trouble(UNREGISTERED, f"slurmd pod {pod.namespace}/{pod.name} "
                           f"{pod.phase} {now - since:.0f} s and Slurm does not hear it", pod)
        return None
    ended = [p for p in pods if not p.deleting and p.phase in _DONE]
    if ended:
        pod = ended[0]
        return Trouble(ENDED, f"slurmd pod {pod.namespace}/{pod.name} {pod.phase}", pod)
    if node.outcomes.get(CREATE) is None and not _own_drain_shows(node):
        return None  # never had one: the plan creates the first (no repair)
    if any(p.deleting for p in pods):
        return Trouble(TERMINATING, "slurmd pod terminating (not deleted by a lend)")
    return Trouble(MISSING, "slurmd pod missing")


def _own_drain_shows(node: NodeState) -> bool:
    """sunkd's repair or update drain is on the node, as its log proves."""
    slurm = node.slurm
    return (slurm is not None and (is_repair_drain(slurm.reason)
                                   or is_update_drain(slurm.reason)) and our_drain(node))


def _may_repair(node: NodeState, assessment: Assessment) -> bool:
    """Nothing but Slurm not hearing the node (or someone's drain) holds it, and what runs
    there is known."""
    return (assessment.actionable and not assessment.k8s_holds and not assessment.conflicts
            and assessment.gres_problem is None and node.slurm is not None
            and node.k8s is not None and node.pods is not None)


def repair_node(planner: Planner, node: NodeState, nodeset: SlurmdNodeset,
                assessment: Assessment, *, update: bool = False) -> bool:
    """One round of the repair on a node of the Nodeset's pool. True when the node's
    slurmd pod is the repair's this round (the plan leaves the node alone). `update`: the
    rolling update chose the node (`policy/slurmdupdate.py`): an outdated pod is replaced
    by the same steps."""
    if node.owner != wk.OWNER_SLURM or node.transition is not None:
        return False
    found = trouble(node, nodeset.uid, planner.now, nodeset.feature)
    if found is None and update:
        pod = outdated_pod(node, nodeset)
        if pod is not None:
            found = Trouble(OUTDATED, f"slurmd pod {pod.namespace}/{pod.name} at revision "
                            f"{pod.slurmd_revision}, the spec's is {revision(nodeset.spec)}",
                            pod)
    if found is None:
        if _own_drain_shows(node):
            slurm = node.slurm
            assert slurm is not None
            if _may_repair(node, assessment) and not (
                    is_update_drain(slurm.reason) and outdated_pod(node, nodeset) is not None):
                _undrain(planner, node, nodeset)
            planner.repairing.add(node.name)
            return True
        return False
    planner.repairing.add(node.name)
    if found.kind == INVALID or not _may_repair(node, assessment):
        return True  # an invalid registration: held and said, nothing else (docstring)
    slurm = node.slurm
    assert slurm is not None
    if "DRAIN" not in slurm.flags:
        if not (found.kind in (MISSING, TERMINATING) and slurms_own_down(slurm)):
            if not foreign_word(slurm, node.drain_mark):
                planner.ensure(
                    node, wk.OWNER_SLURM, VERB_DRAIN,
                    f"{_what(found)}: {found.why}: drain the node first",
                    (Label("reason", wk.REASON_SLURMD_UPDATE if found.kind == OUTDATED
                           else f"{wk.REASON_SLURMD_REPAIR} ({found.kind})"),))
            return True  # a DOWN that is someone's word: nothing (module docstring)
    elif not drain_requested(slurm):
        return True  # an UNDRAIN is pending: whose and why is not sunkd's to guess
    if slurm_busy(slurm):
        return True  # job steps may still run in the pod's cgroup
    if found.kind == OUTDATED:
        # Only under sunkd's own update drain, with Slurm reporting the node drained,
        # idle and in contact (the executor asks again right before the delete).
        if is_update_drain(slurm.reason) and our_drain(node) and slurm_drained(slurm):
            _delete(planner, node, nodeset, found)
        return True
    if found.kind in (ENDED, UNREGISTERED):
        if drain_requested(slurm):
            _delete(planner, node, nodeset, found)
        return True
    if found.kind == MISSING:
        _create(planner, node, nodeset, found)
    return True


def _what(found: Trouble) -> str:
    return "update" if found.kind == OUTDATED else "repair"


def _delete(planner: Planner, node: NodeState, nodeset: SlurmdNodeset, found: Trouble) -> None:
    pod = found.pod
    assert pod is not None
    step = SlurmdStep(node.name, VERB_SLURMD_DELETE, f"{_what(found)}: {found.why}: delete it",
                      node.k8s_name or node.name, f"{pod.namespace}/{pod.name}", pod.uid)
    # A repair's pod may be out of contact (the executor accepts that, never without DRAIN
    # or with an allocation); an outdated one is registered: drained, idle and in contact.
    extra = () if found.kind == OUTDATED else (Label(SLURMD_REPAIR_ARG, "1"),)
    # The previous delete's pod went and a create succeeded since: no wait for it.
    last, create = node.outcomes.get(DELETE), node.outcomes.get(CREATE)
    planner.ensure(node, wk.OWNER_KUBERNETES, VERB_SLURMD_DELETE, step.reason,
                   (*slurmd_args(step, nodeset), *extra),
                   caught_up=(last is not None and create is not None and create.succeeded
                              and create.seq > last.seq))


def _create(planner: Planner, node: NodeState, nodeset: SlurmdNodeset, found: Trouble) -> None:
    pods = node.pods or ()
    foreign = [p for p in pods if p.phase not in _DONE
               and not (p.slurmd == node.name and p.slurmd_nodeset == nodeset.uid)]
    if not has_owner_taint(node.k8s) or foreign:
        return  # the owner taint first, foreign pods gone (as for the plan's create)
    attempt = repair_attempt(node, planner.now)
    last = node.outcomes.get(CREATE)
    if (last is not None and last.succeeded
            and planner.now < last.at + repair_delay(attempt)):
        return  # backing off
    step = SlurmdStep(node.name, VERB_SLURMD_CREATE,
                      f"repair: {found.why}: create it again (attempt {attempt})",
                      node.k8s_name or node.name,
                      f"{nodeset.namespace}/{pod_name(nodeset.name, node.name)}")
    # The previous create's pod was seen and deleted since (a delete that succeeded
    # after it): its observation is no reason to wait.
    delete = node.outcomes.get(DELETE)
    planner.ensure(node, wk.OWNER_KUBERNETES, VERB_SLURMD_CREATE, step.reason,
                   slurmd_args(step, nodeset), min_attempt=attempt,
                   caught_up=(last is not None and delete is not None and delete.succeeded
                              and delete.seq > last.seq))


def _undrain(planner: Planner, node: NodeState, nodeset: SlurmdNodeset) -> None:
    """sunkd's repair (or update) drain goes once the new slurmd registered, the owner
    taint is on and no pod runs beside it (as a reclaim's resume)."""
    slurm = node.slurm
    assert slurm is not None
    if (slurm_busy(slurm) or not slurmd_registered(node, nodeset.uid, nodeset.feature)
            or not has_owner_taint(node.k8s) or not no_pods(node)):
        return
    down = slurm.state.upper() == "DOWN"
    what = "update" if is_update_drain(slurm.reason) else "repair"
    planner.ensure(
        node, wk.OWNER_SLURM, VERB_RESUME,
        f"{what}: the new slurmd registered; Slurm left the node DOWN under sunkd's drain: "
        "return it to service" if down else f"{what}: the new slurmd registered: undrain",
        (*expected_drain(slurm), Label(RETURN_TO_SERVICE_ARG, "1")) if down
        else expected_drain(slurm))
