"""Normalization of Kubernetes objects: Nodes and Pods slimmed to the fields sunkd keeps in
its caches, Nodeset custom resources parsed into `K8sNodesetObserved`, pod resource
requests and schedulability, and the workload-selector rule. Pure functions on plain
JSON dicts, so the source, tests and benchmarks share them without a client."""


from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodesetObserved,
    Label,
    OwnershipSpec,
)
from sunkd.kubernetes.client import (
    JSON,
    parse_quantity,
)

log = structlog.get_logger("sunkd.kubernetes.source")

SUNKD_PREFIX = wk.PREFIX
GPU_RESOURCE = "nvidia.com/gpu"

# ------------------------------------------------------------------------ transforms
# The caches keep only what the payloads read; a 50k-pod relist then costs a fraction of the
# memory, and the relist diff (resourceVersion equality) still works.


def slim_node(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(SUNKD_PREFIX)
    }
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": spec.get("taints")},
        "status": {
            "allocatable": dict(status.get("allocatable") or {}),
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
        },
    }


def _requests(containers: Any) -> list[dict[str, Any]]:
    out = []
    for container in containers or []:
        resources = container.get("resources") or {}
        out.append({"resources": {"requests": dict(resources.get("requests") or {})}})
    return out


def slim_pod(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": _requests(spec.get("containers")),
            "initContainers": _requests(spec.get("initContainers")),
            "overhead": dict(spec.get("overhead") or {}),
        },
        "status": {
            "phase": status.get("phase") or "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": c.get("status"), "reason": c.get("reason")}
                for c in scheduled
            ],
        },
    }


# -------------------------------------------------------------------------- parsing


def _labels(mapping: Any) -> tuple[Label, ...]:
    if not isinstance(mapping, Mapping):
        return ()
    return tuple(Label(str(k), str(v)) for k, v in sorted(mapping.items()))


def _selector_map(value: Any) -> dict[str, str]:
    """A selector given as a plain label map or as a LabelSelector's `matchLabels`."""
    if not isinstance(value, Mapping):
        return {}
    if "matchLabels" in value or "matchExpressions" in value:
        value = value.get("matchLabels") or {}
    return {str(k): str(v) for k, v in value.items()}


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, default: float) -> float:
    """Seconds from a number or a Go-style duration string ("90s", "5m", "1h30m")."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in _DURATION_UNITS or not number:
            raise ValueError(f"not a duration: {value!r}")
        total += float(number) * _DURATION_UNITS[unit]
        number = ""
        i += len(unit)
    if number:
        total += float(number)  # bare number: seconds
    return total


def _int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    return int(value)


def parse_ownership(raw: Any) -> OwnershipSpec:
    if not isinstance(raw, Mapping):
        return OwnershipSpec()
    d = OwnershipSpec()

    def pick(*names: str) -> Any:
        for name in names:
            if name in raw:
                return raw[name]
        return None

    max_k8s = pick("maxKubernetes")
    return OwnershipSpec(
        mode=str(pick("mode") or d.mode),
        min_slurm=_int(pick("minSlurm"), d.min_slurm),
        min_kubernetes=_int(pick("minKubernetes"), d.min_kubernetes),
        max_kubernetes=None if max_k8s is None else int(max_k8s),
        prefer=str(pick("prefer") or d.prefer),
        dwell_seconds=parse_duration(pick("dwellSeconds", "dwell"), d.dwell_seconds),
        max_in_flight=_int(pick("maxInFlight"), d.max_in_flight),
        drain_timeout_seconds=parse_duration(
            pick("drainTimeoutSeconds", "drainTimeout"), d.drain_timeout_seconds
        ),
        reclaim_grace_seconds=parse_duration(
            pick("reclaimGraceSeconds", "reclaimGrace"), d.reclaim_grace_seconds
        ),
    )


def pool_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def parse_nodeset(obj: JSON, *, deleted: bool = False) -> K8sNodesetObserved:
    spec = obj.get("spec") or {}
    slurm = spec.get("slurm") or {}
    partitions = slurm.get("partitions", spec.get("partitions")) or []
    if isinstance(partitions, str):
        partitions = [partitions]
    node_name_label = slurm.get("nodeNameLabel") or spec.get("nodeNameLabel")
    return K8sNodesetObserved(
        pool=pool_name(obj),
        generation=_int((obj.get("metadata") or {}).get("generation"), 0),
        node_selector=_labels(_selector_map(spec.get("nodeSelector"))),
        partitions=tuple(str(p) for p in partitions),
        node_name_label=str(node_name_label) if node_name_label else None,
        workload_selector=_labels(_selector_map(spec.get("workloadSelector"))),
        ownership=parse_ownership(spec.get("ownership")),
        deleted=deleted,
    )


def workload_selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions) or a plain label map.

    An empty or missing selector matches nothing here (like a PDB's nil selector): a Nodeset
    without a workload selector must not claim every pod in the cluster. This is the one
    deliberate difference from the API server's label selectors (where an empty selector
    selects everything), hence its own name; the emulator's `label_selector_matches` in
    sunkd/testbed/kubeapi/selectors.py follows the API server."""
    if not isinstance(selector, Mapping) or not selector:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        return all(labels.get(str(k)) == str(v) for k, v in selector.items())
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(str(k)) != str(v) for k, v in match_labels.items()):
        return False
    for expression in expressions:
        key = str(expression.get("key"))
        operator = expression.get("operator")
        values = {str(v) for v in expression.get("values") or []}
        present = key in labels
        if operator == "In" and not (present and str(labels[key]) in values):
            return False
        if operator == "NotIn" and present and str(labels[key]) in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown operator: match nothing rather than everything
    return True


def _matches(selector: tuple[Label, ...], labels: Mapping[str, Any]) -> bool:
    """Equality selector match; an empty selector matches nothing (like a PDB's nil selector):
    a Nodeset without a selector must not claim every node or every pod in the cluster."""
    if not selector:
        return False
    return all(labels.get(label.key) == label.value for label in selector)


def _decimal_or_zero(value: Any) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError:
        return Decimal(0)


def pod_requests(pod: JSON) -> tuple[int, int, int]:
    """Effective (cpu millis, memory bytes, GPUs): max(sum(containers), max(init)) + overhead,
    the scheduler's rule (k/k pkg/api/v1/resource helpers)."""
    spec = pod.get("spec") or {}
    totals = {"cpu": Decimal(0), "memory": Decimal(0), GPU_RESOURCE: Decimal(0)}
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for name in totals:
            totals[name] += _decimal_or_zero(requests.get(name, 0))
    for container in spec.get("initContainers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for name in totals:
            totals[name] = max(totals[name], _decimal_or_zero(requests.get(name, 0)))
    for name, value in (spec.get("overhead") or {}).items():
        if name in totals:
            totals[name] += _decimal_or_zero(value)
    return (
        int((totals["cpu"] * 1000).to_integral_value(rounding="ROUND_CEILING")),
        int(totals["memory"].to_integral_value(rounding="ROUND_CEILING")),
        int(totals[GPU_RESOURCE].to_integral_value(rounding="ROUND_CEILING")),
    )


def pod_is_pending_unschedulable(pod: JSON) -> bool:
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return False
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return True
    return not (pod.get("spec") or {}).get("nodeName")
