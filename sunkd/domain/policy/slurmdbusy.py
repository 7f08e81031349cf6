"""Which of a Nodeset's slurmd pods carry the busy label the PodDisruptionBudget selects.

`kubectl drain` and every other eviction go through the Eviction API, which refuses (429)
while a PodDisruptionBudget selecting the pod allows no disruption (Kubernetes "API-
initiated eviction"). sunkd keeps one PDB per Nodeset with `spec.slurmd` that allows no
disruption of the Nodeset's slurmd pods carrying `wellknown.LABEL_SLURMD_BUSY`
(`kubernetes/slurmd_actuator.py` `pdb_body`), and labels exactly the
pods whose node Slurm reports busy: evicting one would kill slurmd under a running job,
which leaves the node busy until `SlurmdTimeout` and the job's steps without their
slurmd (slurmd(8)). The protection Slinky's slurm-operator gives its NodeSet pods the
same way (a busy label under a PDB with `maxUnavailable: 0`; sunkd's budget is an
integer `minAvailable` instead, which needs no scale of the pods' controller).

The decision, per own live pod (sunkd's by labels *and* controller owner reference:
an impostor is never labelled, `policy/slurmd.py` `is_own`):

- Slurm reports the node busy (ALLOCATED, MIXED, COMPLETING, CPUs allocated:
  `slurmnode.slurm_busy`), even out of contact: label it;
- Slurm reports it not busy **and in contact** (slurmctld hears its slurmd, so what it
  says of jobs there is current): unlabel it;
- anything else is unknown, and unknown is not idle: the label stays as it is (sources
  not fresh, the node not seen by Slurm, NOT_RESPONDING or DOWN without an allocation,
  the pods unknown).

Adding the label only protects; removing it is the one direction that can expose a job,
so the executor asks Slurm again right before an unlabel (`runtime/executor.py`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sunkd.domain.events import Label
from sunkd.domain.policy.slurmd import SlurmdNode, SlurmdNodeset, is_own
from sunkd.domain.slurmnode import in_contact, slurm_busy

# kubernetes side; args below (`label_args`): the pod, its uid, the Nodeset, BUSY_ARG.
VERB_SLURMD_LABEL = "slurmd-label"
BUSY_ARG = "busy"  # "1": set the busy label (and keep the PDB); "0": remove it
_ENDED = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class BusyStep:
    """Set (`busy`) or remove the busy label on one of sunkd's slurmd pods."""

    node: str  # the Slurm node name
    k8s_node: str
    pod: str  # namespace/name
    uid: str  # the pod decided on
    busy: bool
    reason: str


def wanted(node: SlurmdNode) -> bool | None:
    """The label the node's slurmd pod should carry: True busy, False idle, None unknown
    (leave it as it is)."""
    if node.slurm is None:
        return None
    if slurm_busy(node.slurm):
        return True
    if in_contact(node.slurm):
        return False
    return None


def label_steps(nodeset: SlurmdNodeset, nodes: Sequence[SlurmdNode], *,
                sources_fresh: bool) -> tuple[BusyStep, ...]:
    """The label changes to make, one per own live pod whose label differs from
    `wanted`; nothing while the sources are not fresh or a node's pods are unknown."""
    if not sources_fresh or not nodeset.uid:
        return ()
    steps: list[BusyStep] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.k8s_node is None or node.pods is None:
            continue
        want = wanted(node)
        if want is None:
            continue
        for pod in node.pods:
            if not is_own(pod, nodeset, node.name) or pod.deleting or pod.phase in _ENDED:
                continue
            if pod.busy == want:
                continue
            reason = (f"sunkd: {node.name} busy in Slurm: slurmd pod {pod.key} protected "
                      "from eviction" if want else
                      f"sunkd: {node.name} idle in Slurm: slurmd pod {pod.key} no longer "
                      "protected from eviction")
            steps.append(BusyStep(node.name, node.k8s_node, pod.key, pod.uid, want, reason))
    return tuple(steps)


def label_args(step: BusyStep, nodeset: SlurmdNodeset) -> tuple[Label, ...]:
    """The `action.requested` args: the log records which pod, of which Nodeset, and
    which way."""
    return (Label("pod", step.pod), Label("pod_uid", step.uid),
            Label("nodeset", f"{nodeset.namespace}/{nodeset.name}"),
            Label("nodeset_uid", nodeset.uid), Label(BUSY_ARG, "1" if step.busy else "0"))
