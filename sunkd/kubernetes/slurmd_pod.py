"""The slurmd pod of a Nodeset's node, rendered from `spec.slurmd`, and a pod read back as
the plan sees it (`SeenPod`).

What makes the pod sunkd's is its controller owner reference to the Nodeset (kind, uid)
together with the labels; the plan trusts neither alone. The pod is bound to its node
(`nodeName`: the scheduler is not asked, so a full node or a taint cannot strand it),
tolerates sunkd's owner taint (the node is Slurm's, tainted against Kubernetes work),
runs on the host network (slurmctld reaches slurmd at the node's address; with
hostNetwork the pod shares the host's UTS namespace, so `-N` carries the Slurm name), and
has a node-critical priority so the scheduler never preempts it for a pool pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmd import SeenPod, revision
from sunkd.kubernetes.client import JSON
from sunkd.kubernetes.normalize import SLURMD_CONTAINER, ready_since
from sunkd.kubernetes.slurmd_auth import render_auth
from sunkd.kubernetes.slurmd_spec import MAX_LABEL_VALUE, conf_words
from sunkd.kubernetes.slurmd_template import apply_template

CONTAINER = SLURMD_CONTAINER
_LABEL_VALUE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _label_value(text: str) -> bool:
    return (0 < len(text) <= MAX_LABEL_VALUE and set(text) <= _LABEL_VALUE_CHARS
            and text[0].isalnum() and text[-1].isalnum())


def dynamic_conf(spec: SlurmdSpec, nodeset: str) -> str:
    """`--conf` of a Dynamic node: `Features=<nodeset>` first (the feature sunkd checks
    the registration by, and a `NodeSet=<nodeset> Feature=<nodeset>` line in slurm.conf
    puts the node in its partitions), the site's own Feature(s) words merged into it
    (Slurm keeps one Features value), then the site's other words as given."""
    features = [nodeset]
    rest = []
    for key, value in conf_words(spec.conf):
        if key.lower() in ("feature", "features"):
            features += [f for f in value.split(",") if f and f not in features]
        else:
            rest.append(f"{key}={value}")
    return " ".join([f"Features={','.join(features)}", *rest])


def command(spec: SlurmdSpec, slurm_node: str, nodeset: str) -> list[str]:
    """Static: `slurmd -D -N <node>`; Dynamic: `slurmd -D -Z -N <node> --conf ...`
    (slurmctld creates the node from it; -N names it, else slurmd takes the host name,
    `_dynamic_init` in src/slurmd/slurmd/slurmd.c); then --conf-server and the site's
    args."""
    argv = ["slurmd", "-D"]
    if spec.registration == "Dynamic":
        argv += ["-Z", "-N", slurm_node, "--conf", dynamic_conf(spec, nodeset)]
    else:
        argv += ["-N", slurm_node]
    if spec.conf_server:
        argv += ["--conf-server", spec.conf_server]
    return argv + list(spec.args)


def render(spec: SlurmdSpec, *, nodeset: str, namespace: str, nodeset_uid: str,
           slurm_node: str, k8s_node: str, name: str) -> JSON:
    """The core/v1 Pod for `slurm_node` on Kubernetes Node `k8s_node`, with the spec's
    pod template merged (`slurmd_template.apply_template`: it adds, never replaces what
    sunkd sets here)."""
    labels = {wk.LABEL_SLURMD_NODESET: nodeset}
    if _label_value(slurm_node):
        labels[wk.LABEL_SLURMD_NODE] = slurm_node
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command(spec, slurm_node, nodeset),
        "env": [{"name": e.key, "value": e.value} for e in spec.env],
        "volumeMounts": [json.loads(m) for m in spec.volume_mounts],
        "securityContext": {"privileged": spec.privileged},
    }
    resources = {key: {q.key: q.value for q in quantities}
                 for key, quantities in (("requests", spec.requests), ("limits", spec.limits))
                 if quantities}
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {wk.ANNOTATION_SLURMD_NODE: slurm_node,
                            wk.ANNOTATION_SLURMD_REVISION: revision(spec)},
            "ownerReferences": [{"apiVersion": wk.API_VERSION, "kind": wk.NODESET_KIND,
                                 "name": nodeset, "uid": nodeset_uid, "controller": True}],
        },
        "spec": {
            "nodeName": k8s_node,
            "hostNetwork": True,
            "dnsPolicy": "Default",  # the node's resolver: slurmctld is a host name there
            "priorityClassName": spec.priority_class_name,
            "terminationGracePeriodSeconds": spec.termination_grace_seconds,
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [{"key": wk.TAINT_OWNER, "operator": "Equal",
                             "value": wk.OWNER_SLURM, "effect": wk.TAINT_OWNER_EFFECT}],
            "containers": [container],
            "volumes": [json.loads(v) for v in spec.volumes],
        },
    }
    render_auth(spec, pod["spec"], container)  # spec.slurmd.auth: munged sidecar or key
    return apply_template(pod, spec.template)


def seen_pod(obj: Mapping[str, Any]) -> SeenPod:
    """A pod from the API as the plan needs it (owner, labels, phase, deletion)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    controller = next((o for o in meta.get("ownerReferences") or []
                       if isinstance(o, Mapping) and o.get("controller") is True), None)
    return SeenPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        nodeset_label=(meta.get("labels") or {}).get(wk.LABEL_SLURMD_NODESET),
        slurm_node=(meta.get("annotations") or {}).get(wk.ANNOTATION_SLURMD_NODE),
        controller_kind=controller.get("kind") if controller else None,
        controller_uid=controller.get("uid") if controller else None,
        started_at=ready_since(status),
        busy=(meta.get("labels") or {}).get(wk.LABEL_SLURMD_BUSY) == wk.SLURMD_BUSY_VALUE,
        revision=str((meta.get("annotations") or {}).get(wk.ANNOTATION_SLURMD_REVISION) or ""),
    )
