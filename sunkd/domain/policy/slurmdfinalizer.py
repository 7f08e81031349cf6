"""A Nodeset's slurmd pods when the Nodeset goes: its finalizer, drain, delete, release.

Deleting a Nodeset (`kubectl delete`, a background deletion) lets Kubernetes' garbage
collector delete its dependents, sunkd's slurmd pods, once the owner is gone: killing
slurmd under a running job leaves the node busy until `SlurmdTimeout` and the job's
steps without their slurmd (slurmd(8)). A finalizer keeps the owner: an object with
`metadata.finalizers` is only marked (`deletionTimestamp`) until the list is empty, and
the collector counts an owner that exists without `foregroundDeletion` as solid, so its
dependents stay (`classifyReferences` and `attemptToDeleteItem` in
pkg/controller/garbagecollector). So, with `wk.FINALIZER_SLURMD_PODS`:

- **put on** every live Nodeset with `spec.slurmd` that lacks it (never on one already
  marked for deletion: the API server refuses a new finalizer then, `ValidateObjectMeta
  Update` in staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go);
- **ending** (the Nodeset marked for deletion, or its `spec.slurmd` removed while it
  lives: sunkd no longer runs pods for it, and the ones left must go the same careful
  way), per node with a pod of sunkd's for this Nodeset:
  - no DRAIN in Slurm → **drain** with `wk.REASON_SLURMD_REMOVED` (never over someone
    else's word: `ownership.foreign_word`, e.g. an administrator's DOWN; then wait);
  - DRAIN, and Slurm reports the node drained, idle and in contact (the lend's gate,
    `slurmnode.slurm_drained`; the executor asks Slurm again right before) →
    **delete** the pod; whose DRAIN it is does not matter, it keeps jobs off the node;
  - anything else (a job allocated or completing, out of contact, not reported, without
    the Dynamic Nodeset's feature, pods unknown) → wait, and say why;
- **take off** the finalizer once no pod of sunkd's for this Nodeset is left anywhere
  (a terminating pod counts as left until it is gone; every Node's pods must be known:
  unknown is never none), and only sunkd's own name: other finalizers stay.

Both sources not fresh: nothing at all. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodesetObserved, Label, SlurmNodeObserved
from sunkd.domain.ownership import foreign_word
from sunkd.domain.slurmdgone import has_feature, observed_feature, own_slurmd_pods
from sunkd.domain.slurmnode import in_contact, slurm_busy, slurm_drained
from sunkd.domain.state import NodeState

VERB_FINALIZER_ADD = "finalizer-add"  # kubernetes; args `nodeset`, `nodeset_uid`
VERB_FINALIZER_REMOVE = "finalizer-remove"  # kubernetes; args `nodeset`, `nodeset_uid`
DRAIN = "drain"  # policy/model.VERB_DRAIN (slurm side), with arg `reason`
DELETE = "slurmd-delete"  # slurmdgone.VERB_SLURMD_DELETE
WHY_DELETED = "Nodeset deleted"
WHY_SPEC_REMOVED = "spec.slurmd removed"
BUSY = "busy"
TERMINATING = "terminating"
UNKNOWN = "unknown"
FOREIGN = "foreign"
STALE = "stale"


@dataclass(frozen=True, slots=True)
class EndingNodeset:
    """What the finalizer needs of a Nodeset."""

    name: str
    namespace: str
    uid: str
    slurmd: bool  # spec.slurmd present
    deleting: bool  # metadata.deletionTimestamp set
    finalizers: tuple[str, ...]  # metadata.finalizers, as the API server has them
    feature: str | None = None  # a Dynamic Nodeset's Slurm feature (slurmdgone)

    @property
    def ending(self) -> bool:
        return self.deleting or not self.slurmd

    @property
    def ours(self) -> bool:
        return wk.FINALIZER_SLURMD_PODS in self.finalizers


@dataclass(frozen=True, slots=True)
class OwnPod:
    """A pod of sunkd's for this Nodeset (the source judged it by owner uid and labels)."""

    key: str  # namespace/name
    uid: str
    phase: str = "Running"
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class EndingNode:
    name: str  # the Slurm name
    k8s_node: str | None
    slurm: SlurmNodeObserved | None
    pods: tuple[OwnPod, ...] | None  # sunkd's pods of this Nodeset on it; None: unknown
    foreign_word: bool = False  # someone else's reason on Slurm's node (not sunkd's)


@dataclass(frozen=True, slots=True)
class EndStep:
    """`verb`: DRAIN, DELETE, VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE, or "" (waiting,
    `reason` says why). `node` is "" for the finalizer's steps."""

    node: str
    verb: str
    reason: str
    k8s_node: str | None = None
    pod: str = ""
    uid: str = ""
    busy: bool = False  # waiting for a job (the condition names these nodes)
    # why it waits, for the gauge sunkd_nodeset_ending_waits: busy, terminating, unknown
    # (pods, or Slurm's word on the node), foreign (someone's word), stale; "" when acting
    kind: str = ""


def _why(nodeset: EndingNodeset) -> str:
    return WHY_DELETED if nodeset.deleting else WHY_SPEC_REMOVED


def drain_reason(nodeset: EndingNodeset) -> str:
    """The Slurm reason of the drain (arg `reason` of the DRAIN step)."""
    return f"{wk.REASON_SLURMD_REMOVED} ({_why(nodeset)})"


def plan_end(nodeset: EndingNodeset, nodes: Sequence[EndingNode], *,
             sources_fresh: bool, all_pods_known: bool) -> tuple[EndStep, ...]:
    """The finalizer's steps this round (module docstring). `nodes`: every node that runs,
    or may run, a pod of sunkd's for this Nodeset (in its pool or not); `all_pods_known`:
    every Kubernetes Node's pods are known (a pod elsewhere would be missed otherwise)."""
    if not nodeset.uid:
        return (EndStep("", "", "the Nodeset's uid is unknown: its pods cannot be told apart",
                        kind=UNKNOWN),)
    if not sources_fresh:
        return (EndStep("", "", "sources not fresh: nothing is decided", kind=STALE),)
    if not nodeset.ending:
        if nodeset.ours:
            return ()
        return (EndStep("", VERB_FINALIZER_ADD,
                        f"sunkd: protect {nodeset.namespace}/{nodeset.name}'s slurmd pods "
                        f"from the garbage collector ({wk.FINALIZER_SLURMD_PODS})"),)
    steps: list[EndStep] = []
    left: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.pods is None:
            steps.append(EndStep(node.name, "", "pods unknown: unknown is not none",
                                 node.k8s_node, kind=UNKNOWN))
            left.append(node.name)
            continue
        if not node.pods:
            continue
        left.append(node.name)
        steps.extend(_node_steps(nodeset, node))
    if not nodeset.ours:
        return tuple(steps)  # not ours to take off (never put on, or already gone)
    if left or not all_pods_known:
        why = (f"slurmd pods left on {', '.join(left[:5])}" if left
               else "some Node's pods are unknown")
        steps.append(EndStep("", "", f"finalizer kept: {why}"))
        return tuple(steps)
    steps.append(EndStep("", VERB_FINALIZER_REMOVE,
                         f"sunkd: no slurmd pod of {nodeset.namespace}/{nodeset.name} is "
                         f"left ({_why(nodeset)}): "
                         f"finalizer {wk.FINALIZER_SLURMD_PODS} removed"))
    return tuple(steps)


def _wait(node: EndingNode, reason: str, *, busy: bool = False,
          kind: str = UNKNOWN) -> list[EndStep]:
    return [EndStep(node.name, "", reason, node.k8s_node, busy=busy,
                    kind=BUSY if busy else kind)]


def _node_steps(nodeset: EndingNodeset, node: EndingNode) -> list[EndStep]:
    pods = node.pods or ()
    live = [p for p in pods if not p.deleting]
    if not live:
        return _wait(node, "slurmd pod terminating: left until it is gone", kind=TERMINATING)
    if node.k8s_node is None:
        return _wait(node, "no Kubernetes Node")
    slurm = node.slurm
    if slurm is None:
        return _wait(node, "Slurm does not report the node: unknown is not drained")
    if not has_feature(slurm, nodeset.feature):
        return _wait(node, f"Slurm's node lacks feature {nodeset.feature}: not this "
                     "Nodeset's, its state says nothing of sunkd's pod")
    if "DRAIN" not in slurm.flags:
        if node.foreign_word:
            return _wait(node, f"someone's word on the node ({_state(slurm)}: "
                         f"{slurm.reason}): sunkd does not drain over it", kind=FOREIGN)
        return [EndStep(node.name, DRAIN, f"sunkd: {nodeset.namespace}/{nodeset.name} "
                        f"ending: drain {node.name} before its slurmd pod goes",
                        node.k8s_node)]
    if slurm_busy(slurm):
        return _wait(node, f"waiting for the jobs on the node to end ({_state(slurm)})",
                     busy=True)
    if not in_contact(slurm):
        return _wait(node, f"out of contact ({_state(slurm)}): Slurm cannot vouch that "
                     "nothing runs there")
    if not slurm_drained(slurm):
        return _wait(node, f"not drained ({_state(slurm)})")
    return [EndStep(node.name, DELETE, f"sunkd: {node.name} drained, idle and in contact: "
                    f"slurmd pod removed ({_why(nodeset)})",
                    node.k8s_node, pod.key, pod.uid) for pod in live]


def _state(slurm: SlurmNodeObserved) -> str:
    return "+".join([slurm.state.upper(), *slurm.flags])


def still_busy(steps: Sequence[EndStep]) -> list[str]:
    """The nodes whose pod waits for a job (for the condition's message)."""
    return sorted({s.node for s in steps if s.busy})


def nodes_left(steps: Sequence[EndStep]) -> list[str]:
    """The nodes with a pod of sunkd's left (or unknown), in the round's steps."""
    return sorted({s.node for s in steps if s.node})


# ------------------------------------------------------------------ from the folded state


def ending_nodeset(observed: K8sNodesetObserved) -> EndingNodeset | None:
    """The finalizer's view of an observed Nodeset (None when it is gone)."""
    if observed.deleted:
        return None
    namespace, _, name = observed.pool.partition("/")
    return EndingNodeset(name, namespace, observed.uid, observed.slurmd is not None,
                         observed.deleting,
                         (wk.FINALIZER_SLURMD_PODS,) if observed.slurmd_finalizer else (),
                         observed_feature(observed))


def nodes_from_state(nodeset: EndingNodeset,
                     members: Sequence[NodeState]) -> tuple[list[EndingNode], bool]:
    """The pool's members with sunkd's pods of this Nodeset (the source judged them by its
    uid, `PodRef.slurmd_nodeset`), and whether every member's pods are known."""
    out = []
    known = True
    for node in members:
        pods = None if node.pods is None else tuple(
            OwnPod(f"{p.namespace}/{p.name}", p.uid, p.phase, p.deleting)
            for p in own_slurmd_pods(node, nodeset.uid))
        known = known and pods is not None
        out.append(EndingNode(node.name, (node.k8s_name or node.name)
                              if node.k8s is not None else None, node.slurm, pods,
                              foreign_word(node.slurm, node.drain_mark)))
    return out, known


def deleting_condition(nodeset: EndingNodeset, steps: Sequence[EndStep]) -> tuple[str, str]:
    """SlurmdProgressing (True, `Deleting`)'s message: what the Terminating Nodeset waits
    for."""
    busy = still_busy(steps)
    left = [n for n in nodes_left(steps) if n not in busy]
    parts = []
    if busy:
        parts.append(f"waiting for jobs on {', '.join(busy[:5])}")
    if left:
        parts.append(f"slurmd pods going on {', '.join(left[:5])}")
    kept = next((s.reason for s in steps if not s.node and not s.verb), "")
    what = "; ".join(parts) or kept or "no slurmd pod left"
    return wk.REASON_DELETING, (f"{_why(nodeset)}: each node drained, its slurmd pod "
                                f"deleted once Slurm reports it idle: {what}")


def finalizer_args(nodeset: EndingNodeset) -> tuple[Label, ...]:
    """The args of VERB_FINALIZER_ADD/REMOVE: which Nodeset, by uid."""
    return (Label("nodeset", f"{nodeset.namespace}/{nodeset.name}"),
            Label("nodeset_uid", nodeset.uid))


def finalizer_delete_args(nodeset: EndingNodeset, step: EndStep,
                          grace_seconds: int) -> tuple[Label, ...]:
    """The args of a pod delete (as `policy/slurmd.py` `slurmd_args` writes them)."""
    return (Label("k8s_node", step.k8s_node or ""), Label("pod", step.pod),
            *finalizer_args(nodeset), Label("pod_uid", step.uid),
            Label("grace_seconds", str(grace_seconds)))


def ending_waits(observed: K8sNodesetObserved | None, members: Sequence[NodeState], *,
                 sources_fresh: bool) -> dict[str, int]:
    """Per reason (`EndStep.kind`), how many of a Terminating (or spec.slurmd-removed)
    Nodeset's nodes wait with a slurmd pod left (the gauge sunkd_nodeset_ending_waits);
    {"stale": 1} on stale sources; {} when the Nodeset is not ending."""
    nodeset = ending_nodeset(observed) if observed is not None else None
    if nodeset is None or not nodeset.ending or not (nodeset.slurmd or nodeset.ours):
        return {}
    views, known = nodes_from_state(nodeset, members)
    out: dict[str, int] = {}
    for step in plan_end(nodeset, views, sources_fresh=sources_fresh, all_pods_known=known):
        if not step.verb and step.kind and (step.node or step.kind == STALE):
            out[step.kind] = out.get(step.kind, 0) + 1
    return out
