"""Which slurmd pods a Nodeset with `spec.slurmd` should create or delete, node by node.

Ownership becomes physical: a Slurm-owned node runs sunkd's slurmd pod, a node lent to
Kubernetes runs none. The two moves are where a job or a pod could be hurt, so each has
a gate, and everything else waits and says why:

- **delete** only sunkd's own pod, and only when Slurm reports the node drained, idle and
  in contact (`slurmnode.slurm_drained`): killing slurmd under a running job leaves the
  node busy until `SlurmdTimeout` and the job's steps orphaned (Slurm's slurmd(8)), so the
  drain comes first. The executor asks Slurm again right before the delete.
- **create** only on a node whose pods are known (`None` is unknown, never "no pods"),
  with sunkd's owner taint on, and with no foreign pod left: a reclaim creates the pod
  after every other pod is gone.
- **own** means the labels *and* the controller owner reference to this Nodeset's uid for
  this Slurm node: a pod wearing the labels with another owner is an impostor, i.e. a
  foreign pod like any other; it blocks a create and is never deleted here.

Pure: no I/O; `now` is an input. The caller passes each node's phase from
`ownership.assess()` (HELD and UNKNOWN act on nothing) and whether both sources are fresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodesetObserved,
    Label,
    PodRef,
    SlurmdAuth,
    SlurmdSpec,
    SlurmNodeObserved,
)
from sunkd.domain.ownership import assess, has_owner_taint
from sunkd.domain.slurmdgone import REGISTER_BOUND_SECONDS as REGISTER_BOUND_SECONDS
from sunkd.domain.slurmdgone import VERB_SLURMD_CREATE as VERB_SLURMD_CREATE
from sunkd.domain.slurmdgone import VERB_SLURMD_DELETE as VERB_SLURMD_DELETE
from sunkd.domain.slurmdgone import has_feature, heard_since, nodeset_feature
from sunkd.domain.slurmnode import in_contact, registration_refused, slurm_busy, slurm_drained
from sunkd.domain.state import ClusterState, NodeState, Phase

# kubernetes side; create: args below (`slurmd_args`), delete: `pod`, `pod_uid`,
# `grace_seconds`. A pod Running REGISTER_BOUND_SECONDS with Slurm not hearing its slurmd
# is reported unregistered. Defined with the rest of the pods' ownership in slurmdgone.
_DONE = frozenset({"Succeeded", "Failed"})
_WANTED = frozenset({Phase.SLURM, Phase.TO_SLURM})
_UNWANTED = frozenset({Phase.TO_K8S, Phase.KUBERNETES})


@dataclass(frozen=True, slots=True)
class SeenPod:
    """A pod the Kubernetes source reports on the node's Kubernetes Node."""

    namespace: str
    name: str
    uid: str = ""
    phase: str = "Running"  # Pending Running Succeeded Failed Unknown
    deleting: bool = False  # metadata.deletionTimestamp set
    nodeset_label: str | None = None  # label LABEL_SLURMD_NODESET
    slurm_node: str | None = None  # annotation ANNOTATION_SLURMD_NODE
    controller_kind: str | None = None  # the controller owner reference
    controller_uid: str | None = None
    started_at: float | None = None  # when it turned Running
    busy: bool = False  # label LABEL_SLURMD_BUSY is on it
    revision: str = ""  # annotation ANNOTATION_SLURMD_REVISION ("": not reported)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class SlurmdNode:
    """One node of the pool as the plan needs it."""

    name: str  # the Slurm node name
    k8s_node: str | None
    phase: Phase
    slurm: SlurmNodeObserved | None
    owner_taint: bool  # sunkd's owner taint is on the Kubernetes Node
    pods: tuple[SeenPod, ...] | None  # None: unknown


@dataclass(frozen=True, slots=True)
class SlurmdNodeset:
    name: str
    namespace: str
    uid: str  # metadata.uid: own pods' controller owner reference names it
    spec: SlurmdSpec

    @property
    def feature(self) -> str | None:
        """The Slurm feature a Dynamic Nodeset's nodes register with (`nodeset_feature`);
        None for Static registration."""
        return nodeset_feature(self.name, self.spec)


@dataclass(frozen=True, slots=True)
class SlurmdStep:
    """`verb` is VERB_SLURMD_CREATE, VERB_SLURMD_DELETE or "" (nothing to do, or waiting:
    `reason` says why)."""

    node: str
    verb: str
    reason: str
    k8s_node: str | None = None
    pod: str = ""  # namespace/name
    uid: str = ""  # the pod decided on (delete)


def is_own(pod: SeenPod, nodeset: SlurmdNodeset, node: str) -> bool:
    """sunkd's slurmd pod of `nodeset` for Slurm node `node`: labels and owner agree."""
    return (bool(nodeset.uid) and pod.nodeset_label == nodeset.name
            and pod.controller_kind == wk.NODESET_KIND and pod.controller_uid == nodeset.uid
            and pod.slurm_node == node)


def registered(nodeset: SlurmdNodeset, slurm: SlurmNodeObserved | None) -> bool:
    """Slurm hears the node's slurmd, and for a Dynamic Nodeset reports the node with its
    feature (`slurmdgone`: a node of the name without it is someone else's)."""
    return in_contact(slurm) and has_feature(slurm, nodeset.feature)


def foreign_pods(pods: Iterable[SeenPod], nodeset: SlurmdNodeset, node: str) -> list[str]:
    """Every pod on the node that runs and is not sunkd's slurmd pod for it (impostors too)."""
    return sorted(p.key for p in pods if p.phase not in _DONE and not is_own(p, nodeset, node))


def pod_name(nodeset: str, node: str) -> str:
    """A DNS-subdomain pod name for the node's slurmd pod: `<nodeset>-<node>`, lowercased;
    a Slurm name that needed changing gets a hash of the exact name so two never meet."""
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in node.lower()).strip("-.")
    name = f"{nodeset}-{cleaned or 'node'}"
    if cleaned != node or len(name) > 230:
        name = f"{name[:220]}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"
    return name


# Fields written only when set: a spec without them has the JSON (and so the revision) it
# had before they existed.
_OMITTED_WHEN_NONE = ("template", "auth")


def spec_json(spec: SlurmdSpec) -> str:
    raw = dataclasses.asdict(spec)
    for key in _OMITTED_WHEN_NONE:
        if raw.get(key) is None:
            raw.pop(key, None)
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def spec_from_json(text: str) -> SlurmdSpec:
    raw: dict[str, Any] = json.loads(text)
    for key in ("env", "requests", "limits"):
        raw[key] = tuple(Label(item["key"], item["value"]) for item in raw.get(key) or ())
    for key in ("args", "volumes", "volume_mounts"):
        raw[key] = tuple(raw.get(key) or ())
    if raw.get("auth") is not None:
        raw["auth"] = SlurmdAuth(**raw["auth"])
    return SlurmdSpec(**raw)


def revision(spec: SlurmdSpec) -> str:
    """The pod template's revision: changes exactly when what the pod runs does. How the
    pods are rolled out (the update strategy, maxUnavailable, maxConcurrentStartup) is
    left out at its default, so a change of it replaces no pod (a DaemonSet's
    updateStrategy is not part of its pod template's hash either)."""
    default = SlurmdSpec()
    template = dataclasses.replace(
        spec, update_strategy=default.update_strategy, max_unavailable=default.max_unavailable,
        max_concurrent_startup=default.max_concurrent_startup,
        # `auth: {type: munge}` alone renders what no `auth` does: the same pod.
        auth=None if spec.auth == SlurmdAuth() else spec.auth)
    return hashlib.sha256(spec_json(template).encode()).hexdigest()[:10]


def slurmd_args(step: SlurmdStep, nodeset: SlurmdNodeset) -> tuple[Label, ...]:
    """The `action.requested` args of a step: the log records exactly which pod was asked."""
    args = [Label("k8s_node", step.k8s_node or ""), Label("pod", step.pod),
            Label("nodeset", f"{nodeset.namespace}/{nodeset.name}"),
            Label("nodeset_uid", nodeset.uid)]
    if step.verb == VERB_SLURMD_DELETE:
        return (*args, Label("pod_uid", step.uid),
                Label("grace_seconds", str(nodeset.spec.termination_grace_seconds)))
    return (*args, Label("revision", revision(nodeset.spec)),
            Label("spec", spec_json(nodeset.spec)))


def _startup_slots(nodeset: SlurmdNodeset, nodes: Sequence[SlurmdNode]) -> int | None:
    bound = nodeset.spec.max_concurrent_startup
    if bound is None:
        return None
    starting = sum(1 for node in nodes for pod in node.pods or ()
                   if is_own(pod, nodeset, node.name) and pod.phase == "Pending"
                   and not pod.deleting)
    return max(0, bound - starting)


def plan(nodeset: SlurmdNodeset, nodes: Sequence[SlurmdNode], now: float, *,
         sources_fresh: bool) -> tuple[SlurmdStep, ...]:
    """One step per node (sorted by name); deletes one per own pod."""
    if not sources_fresh:
        return tuple(SlurmdStep(n.name, "", "sources not fresh: nothing is decided")
                     for n in sorted(nodes, key=lambda n: n.name))
    slots = _startup_slots(nodeset, nodes)
    steps: list[SlurmdStep] = []
    for node in sorted(nodes, key=lambda n: n.name):
        found = _node_steps(nodeset, node, now)
        for step in found:
            if step.verb == VERB_SLURMD_CREATE and slots is not None:
                if slots == 0:
                    step = dataclasses.replace(
                        step, verb="", reason="waiting: maxConcurrentStartup pods starting")
                else:
                    slots -= 1
            steps.append(step)
    return tuple(steps)


def _wait(node: SlurmdNode, reason: str) -> list[SlurmdStep]:
    return [SlurmdStep(node.name, "", reason, node.k8s_node)]


def _node_steps(nodeset: SlurmdNodeset, node: SlurmdNode, now: float) -> list[SlurmdStep]:
    if not nodeset.uid:
        return _wait(node, "the Nodeset's uid is unknown: its pods cannot be told apart")
    if node.phase not in _WANTED | _UNWANTED:
        return _wait(node, f"{node.phase.value}: no pod is created or deleted")
    if node.k8s_node is None:
        return _wait(node, "no Kubernetes Node")
    if node.pods is None:
        return _wait(node, "pods unknown: unknown is not none")
    own = [p for p in node.pods if is_own(p, nodeset, node.name)]
    live = [p for p in own if not p.deleting and p.phase not in _DONE]
    if node.phase in _UNWANTED:
        return _lend_steps(nodeset, node, live)
    if any(p.deleting for p in own):
        return _wait(node, "sunkd's previous slurmd pod is still terminating")
    if len(live) > 1:
        return _wait(node, f"{len(live)} slurmd pods of this Nodeset: "
                     f"{', '.join(p.key for p in live)}")
    if live:
        return _wait(node, _running_reason(nodeset, live[0], node.slurm, now))
    ended = [p for p in own if p.phase in _DONE]
    if ended:
        return _wait(node, f"slurmd pod {ended[0].key} {ended[0].phase}: "
                     "left to the repair (policy/slurmdrepair.py)")
    if not node.owner_taint:
        return _wait(node, "waiting for the owner taint before creating the slurmd pod")
    foreign = foreign_pods(node.pods, nodeset, node.name)
    if foreign:
        return _wait(node, f"waiting for foreign pods to go: {', '.join(foreign[:5])}")
    return [SlurmdStep(node.name, VERB_SLURMD_CREATE,
                       f"sunkd: slurmd pod for Slurm-owned node {node.name}", node.k8s_node,
                       f"{nodeset.namespace}/{pod_name(nodeset.name, node.name)}")]


def _lend_steps(nodeset: SlurmdNodeset, node: SlurmdNode,
                live: list[SeenPod]) -> list[SlurmdStep]:
    if not live:
        return _wait(node, "no slurmd pod: nothing to delete")
    feature = nodeset.feature
    if not has_feature(node.slurm, feature):
        return _wait(node, f"Slurm's node {node.name} lacks feature {feature}: not this "
                     "Nodeset's, its drain says nothing of sunkd's pod")
    if not slurm_drained(node.slurm):
        return _wait(node, "waiting for Slurm to report the node drained, idle and in "
                     f"contact before deleting its slurmd pod ({_state(nodeset, node.slurm)})")
    return [SlurmdStep(node.name, VERB_SLURMD_DELETE,
                       f"sunkd: {node.name} drained for Kubernetes: slurmd pod removed",
                       node.k8s_node, pod.key, pod.uid) for pod in live]


def _running_reason(nodeset: SlurmdNodeset, pod: SeenPod, slurm: SlurmNodeObserved | None,
                    now: float) -> str:
    if registration_refused(slurm):
        return (f"slurmd pod {pod.key}: Slurm refused its registration "
                f"({_state(nodeset, slurm)}): held, left as it is")
    if registered(nodeset, slurm) and heard_since(slurm, pod.started_at):
        return f"slurmd pod {pod.key} registered"
    if pod.phase == "Running" and pod.started_at is not None \
            and now - pod.started_at > REGISTER_BOUND_SECONDS:
        return (f"slurmd pod {pod.key} unregistered {now - pod.started_at:.0f} s after it "
                f"started ({_state(nodeset, slurm)}): left to the repair (policy/slurmdrepair.py)")
    return f"slurmd pod {pod.key} starting ({_state(nodeset, slurm)})"


def _state(nodeset: SlurmdNodeset, slurm: SlurmNodeObserved | None) -> str:
    if slurm is None:
        return "Slurm: not seen"
    feature = nodeset.feature
    if not has_feature(slurm, feature):
        return f"Slurm: a node of the name without feature {feature}, not this Nodeset's"
    busy = ", busy" if slurm_busy(slurm) else ""
    return "Slurm: " + "+".join([slurm.state.upper(), *slurm.flags]) + busy


def counts(nodeset: SlurmdNodeset, nodes: Sequence[SlurmdNode]) -> dict[str, int]:
    """status.slurmd: desired (Slurm-owned nodes), current (own live pods), ready
    (Running), registered (Running, Slurm in contact with its slurmd: `heard_since`, and
    its registration not refused: INVALID_REG), updated (own live pods at the spec's
    revision; left out while a live pod's revision is not reported: unknown is no
    number)."""
    rev = revision(nodeset.spec)
    out = {"desired": 0, "current": 0, "ready": 0, "registered": 0, "updated": 0}
    known = True
    for node in nodes:
        out["desired"] += node.phase in _WANTED
        for pod in node.pods or ():
            if not is_own(pod, nodeset, node.name) or pod.deleting or pod.phase in _DONE:
                continue
            out["current"] += 1
            out["ready"] += pod.phase == "Running"
            out["registered"] += (pod.phase == "Running" and registered(nodeset, node.slurm)
                                  and heard_since(node.slurm, pod.started_at)
                                  and not registration_refused(node.slurm))
            out["updated"] += pod.revision == rev
            known = known and bool(pod.revision)
    if not known:
        del out["updated"]
    return out


# ------------------------------------------------------------------ from the folded state


def nodeset_of(observed: K8sNodesetObserved) -> SlurmdNodeset | None:
    """The plan's view of a Nodeset; None when it asks for no slurmd pods."""
    if observed.slurmd is None or observed.deleted:
        return None
    namespace, _, name = observed.pool.partition("/")
    return SlurmdNodeset(name, namespace, observed.uid, observed.slurmd)


def _seen(ref: PodRef, nodeset: SlurmdNodeset) -> SeenPod:
    """A reported pod as the plan sees it. The source judged `ref.slurmd` (the controller
    owner is a Nodeset it knows by uid, the labels name it) and named that Nodeset's uid
    (`ref.slurmd_nodeset`); a pod it did not judge so, or another Nodeset's, is foreign.
    A terminating pod (`deleting`) is neither live nor deleted again; `started_at` is
    when it turned Ready (the registration bound)."""
    if not ref.slurmd or not nodeset.uid or ref.slurmd_nodeset != nodeset.uid:
        return SeenPod(ref.namespace, ref.name, ref.uid, ref.phase, deleting=ref.deleting)
    return SeenPod(ref.namespace, ref.name, ref.uid, ref.phase, deleting=ref.deleting,
                   nodeset_label=nodeset.name, slurm_node=ref.slurmd,
                   controller_kind=wk.NODESET_KIND, controller_uid=nodeset.uid,
                   started_at=ref.started_at, busy=ref.slurmd_busy,
                   revision=ref.slurmd_revision)


def nodes_from_state(state: ClusterState, nodeset: SlurmdNodeset,
                     members: Sequence[NodeState], now: float) -> list[SlurmdNode]:
    """The pool's members as the plan sees them: the phase `ownership.assess` gives at
    `now` (HELD and UNKNOWN included), Slurm's last observation, the owner taint, and the
    pods their Kubernetes Node last reported (None: unknown)."""
    out = []
    for node in members:
        pods = None if node.pods is None else tuple(_seen(ref, nodeset) for ref in node.pods)
        out.append(SlurmdNode(
            node.name, (node.k8s_name or node.name) if node.k8s is not None else None,
            assess(state, node, now).phase, node.slurm, has_owner_taint(node.k8s), pods))
    return out
