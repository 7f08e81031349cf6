"""Normalization of Kubernetes objects: Nodes slimmed to the fields sunkd keeps in its
caches, Pods reduced to `PodFacts` (slotted, shared strings: the pod cache is most of the
daemon's memory on a big cluster), Nodeset custom resources parsed into
`K8sNodesetObserved`, pod resource requests and schedulability, and the workload-selector
rule. Pure functions on plain JSON dicts, so the source, tests and benchmarks share them
without a client."""


from __future__ import annotations

import dataclasses
import math
import re
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodesetObserved,
    Label,
    OwnershipSpec,
    Payload,
    TopologyChoice,
)
from sunkd.domain.topology import DEFAULT_PRESET, TopologyError, spec_from
from sunkd.kubernetes.client import JSON
from sunkd.kubernetes.slurmd_spec import parse_slurmd
from sunkd.kubernetes.wire import MalformedObject, checked_name, parse_quantity

log = structlog.get_logger("sunkd.kubernetes.source")

GPU_RESOURCE = "nvidia.com/gpu"
PayloadT = TypeVar("PayloadT", bound=Payload)

# ---------------------------------------------------------------------- sanitising
# Strings from the API server reach the log. PostgreSQL's JSONB refuses `\u0000`, lone
# surrogates cannot be encoded at all, and control characters turn `sunkd status` into a
# terminal-escape injection: every string of an observation is cleaned before it is
# emitted. Identities (object names) are checked instead (`checked_name`): a
# name that needs cleaning is rejected, since a cleaned name would be someone else's.

MAX_TEXT = 1024  # longest free-text field kept (annotation values are unbounded upstream)
REPLACEMENT = "\ufffd"
_DIRTY = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
MAX_QUANTITY = Decimal(2**63 - 1)


def clean_text(value: str) -> str:
    """`value` with control characters (C0, DEL, C1) and lone surrogates replaced by
    U+FFFD, cut to `MAX_TEXT` characters (the cut marked with "...")."""
    if _DIRTY.search(value) is not None:
        value = _DIRTY.sub(REPLACEMENT, value)
    if len(value) > MAX_TEXT:
        value = value[: MAX_TEXT - 3] + "..."
    return value


# Every observation of a first sync is cleaned (20,000 payloads, 100,000 pod references at
# 10,000 nodes), so the walk checks exact types first and reads each dataclass's field
# names once per class, not `dataclasses.fields()` per object.
_PLAIN = frozenset({int, bool, type(None)})
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _clean_value(value: Any, where: str) -> Any:
    kind = type(value)
    if kind is str:
        return clean_text(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        # orjson would write null and the row would no longer decode.
        raise MalformedObject(where, f"not a finite number: {value!r}")
    if isinstance(value, tuple):
        inner = f"{where}[]"
        cleaned = tuple(_clean_value(item, inner) for item in value)
        return value if all(a is b for a, b in zip(cleaned, value, strict=True)) else cleaned
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _clean_dataclass(value, where)
    return value


def _clean_dataclass(value: Any, where: str) -> Any:
    names = _FIELD_NAMES.get(type(value))
    if names is None:
        names = tuple(item.name for item in dataclasses.fields(value) if item.name != "extra")
        _FIELD_NAMES[type(value)] = names
    changes: dict[str, Any] = {}
    for name in names:
        current = getattr(value, name)
        kind = type(current)
        if kind in _PLAIN:
            continue
        cleaned = (clean_text(current) if kind is str
                   else _clean_value(current, f"{where}.{name}"))
        if cleaned is not current:
            changes[name] = cleaned
    return dataclasses.replace(value, **changes) if changes else value


def clean_payload(payload: PayloadT) -> PayloadT:
    """The payload with every string cleaned (`clean_text`); the same object when nothing
    needed cleaning. A non-finite float raises `MalformedObject`."""
    cleaned: PayloadT = _clean_dataclass(payload, payload.kind)
    return cleaned


# ------------------------------------------------------------------------ transforms
# The caches keep only what the payloads read; a 50k-pod relist then costs a fraction of the
# memory, and the relist diff (resourceVersion equality) still works. The transforms also
# check the shape of what they keep: a field no real API server would send in that shape
# raises `MalformedObject`, and the informer rejects that one object instead of the payload
# code failing on it later.


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if type(value) is dict or isinstance(value, Mapping):
        return value
    raise MalformedObject(where, f"not an object ({type(value).__name__})")


def _objects(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if type(value) is not list:
        raise MalformedObject(where, f"not a list ({type(value).__name__})")
    for index, item in enumerate(value):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise MalformedObject(f"{where}[{index}]", "not an object")
    return value


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


# slim_node and slim_pod run for every object of every relist (50,000 pods: bench/
# kube_watch.py), so they check shapes with `type() is` fast paths and copy maps with
# dict(); label values of another type than string only fail to match (the payloads
# convert them), so they are not converted here.


def slim_node(obj: JSON) -> JSON:
    meta = _mapping(obj.get("metadata"), "metadata")
    checked_name(meta.get("name"), "metadata.name")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    annotations = {
        k: "" if v is None else str(v)
        for k, v in _mapping(meta.get("annotations"), "metadata.annotations").items()
        if k.startswith(wk.PREFIX)
    }
    taints = [
        {"key": str(t.get("key") or ""), "value": str(t.get("value") or ""),
         "effect": str(t.get("effect") or "")}
        for t in _objects(spec.get("taints"), "spec.taints")
    ]
    ready = [c for c in _objects(status.get("conditions"), "status.conditions")
             if c.get("type") == "Ready"]
    # Maps shared between nodes with equal ones (allocatable of one hardware type, no
    # sunkd annotations), strings interned: 10,000 nodes are mostly alike.
    return {
        "metadata": {
            "name": sys.intern(str(meta.get("name"))),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": shared_labels(_mapping(meta.get("labels"), "metadata.labels")),
            "annotations": shared_labels(annotations),
        },
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": taints or None},
        "status": {
            "allocatable": shared_labels(
                _mapping(status.get("allocatable"), "status.allocatable")),
            "conditions": [_ready_condition(_optional_str(c.get("status"))) for c in ready],
        },
    }


_READY_CONDITIONS = {status: {"type": "Ready", "status": status}
                     for status in ("True", "False", "Unknown")}


def _ready_condition(status: str | None) -> dict[str, Any]:
    shared = _READY_CONDITIONS.get(status) if status is not None else None
    return shared if shared is not None else {"type": "Ready", "status": status}


def _requests(containers: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for container in _objects(containers, where):
        resources = container.get("resources")
        if type(resources) is not dict:
            resources = _mapping(resources, f"{where}[].resources")
        requests = resources.get("requests")
        if type(requests) is not dict:
            requests = _mapping(requests, f"{where}[].resources.requests")
        out.append({"resources": {"requests": dict(requests)}})
    return out


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What sunkd keeps of a Pod: a slotted object of shared strings, not the API's nested
    dicts (the dict form cost ~2.3-8 KB a pod, this ~0.34 KB: test_pod_facts). The
    requests and the schedulability are computed once, when the pod is admitted."""

    namespace: str
    name: str
    uid: str | None
    resource_version: str
    node: str | None  # spec.nodeName
    phase: str
    # DaemonSet pods and the kubelet's mirror pods belong on every node; every other pod
    # on a node sunkd reclaims for Slurm must go first (safety 9).
    node_local: bool
    pending_unschedulable: bool
    requests: tuple[int, int, int]  # (cpu millis, memory bytes, GPUs): `pod_requests`
    labels: Mapping[str, Any]  # shared between pods with the same labels: never mutate
    # A pod that says it is a Nodeset's slurmd pod: (controller owner uid, the Nodeset named
    # by its label, the Slurm node named by its annotation). The source believes it only
    # for a Nodeset it knows by that uid and name (`slurmd_claim`). None for every other pod.
    slurmd_claim: tuple[str, str, str] | None = None
    deleting: bool = False  # metadata.deletionTimestamp set
    started_at: float | None = None  # slurmd started (`ready_since`), slurmd claimants only
    slurmd_revision: str = ""  # annotation ANNOTATION_SLURMD_REVISION, slurmd claimants only


# Label maps are shared between pods that carry the same labels (a Deployment's replicas):
# weakly, so a label set no pod carries any more is freed.
class _SharedLabels(dict[str, Any]):
    __slots__ = ("__weakref__",)


_LABEL_SETS: weakref.WeakValueDictionary[tuple[tuple[str, Any], ...], _SharedLabels] = \
    weakref.WeakValueDictionary()
_NO_LABELS = _SharedLabels()


def shared_labels(labels: Mapping[str, Any]) -> Mapping[str, Any]:
    """`labels` as a map shared with every other pod that has the same ones, with interned
    keys and string values (label values of another type only fail to match, unshared)."""
    if not labels:
        return _NO_LABELS
    try:
        key = tuple(sorted((sys.intern(str(k)), sys.intern(v) if type(v) is str else v)
                           for k, v in labels.items()))
        hash(key)
    except TypeError:  # an unhashable value (hostile input): keep a private copy
        return dict(labels)
    found = _LABEL_SETS.get(key)
    if found is None:
        found = _SharedLabels(key)
        _LABEL_SETS[key] = found
    return found


# Pods of one Deployment request the same resources: one tuple for them all (bounded: a
# cluster has few distinct requests; past the bound new ones are simply not shared).
_REQUESTS: dict[tuple[int, int, int], tuple[int, int, int]] = {}
_REQUESTS_MAX = 4096


def _shared_requests(requests: tuple[int, int, int]) -> tuple[int, int, int]:
    found = _REQUESTS.get(requests)
    if found is not None:
        return found
    if len(_REQUESTS) < _REQUESTS_MAX:
        _REQUESTS[requests] = requests
    return requests


def _interned(value: str | None) -> str | None:
    return None if value is None else sys.intern(value)


def slim_pod(obj: JSON) -> PodFacts:
    meta = _mapping(obj.get("metadata"), "metadata")
    name = checked_name(meta.get("name"), "metadata.name")
    namespace = checked_name(meta.get("namespace"), "metadata.namespace")
    spec = obj.get("spec")
    if type(spec) is not dict:
        spec = _mapping(spec, "spec")
    status = obj.get("status")
    if type(status) is not dict:
        status = _mapping(status, "status")
    node_name = spec.get("nodeName")
    if node_name is not None and type(node_name) is not str:
        raise MalformedObject("spec.nodeName", f"not a string ({type(node_name).__name__})")
    # Shapes first (a list of objects where the API has one), then the derived facts.
    _objects(status.get("conditions"), "status.conditions")
    for part in ("containers", "initContainers"):
        _requests(spec.get(part), f"spec.{part}")
    _mapping(spec.get("overhead"), "spec.overhead")
    phase = status.get("phase") or "Pending"
    claim = slurmd_claim(meta)
    uid = meta.get("uid")
    rv = meta.get("resourceVersion")
    return PodFacts(
        namespace=sys.intern(namespace),
        # Name and uid interned too: the fold's `PodRef`s decode them from the log
        # interned (`sunkd.domain.events`), so both hold one copy of each.
        name=sys.intern(name),
        uid=sys.intern(uid) if type(uid) is str else None,
        resource_version="" if rv is None else str(rv),
        node=_interned(node_name or None),
        phase=sys.intern(phase if type(phase) is str else str(phase)),
        node_local=node_local(meta),
        pending_unschedulable=pod_is_pending_unschedulable(obj),
        requests=_shared_requests(pod_requests(obj)),
        labels=shared_labels(_mapping(meta.get("labels"), "metadata.labels")),
        slurmd_claim=claim,
        deleting=bool(meta.get("deletionTimestamp")),
        started_at=None if claim is None else ready_since(status),
        slurmd_revision="" if claim is None else slurmd_revision(meta),
    )


# The container that runs slurmd in sunkd's pods (`slurmd_pod.render`).
SLURMD_CONTAINER = "slurmd"


def ready_since(status: Mapping[str, Any]) -> float | None:
    """When the slurmd container last started, while the pod is Ready: its
    `state.running.startedAt` (core/v1 ContainerStateRunning, set by the node's runtime:
    the clock slurmd's own start time is read from, `slurmd_start_time` in Slurm, so the
    two compare without skew); None when the pod is not Ready, the container not
    running, or the time does not parse."""
    conditions = status.get("conditions")
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in (conditions if isinstance(conditions, list) else ()))
    containers = status.get("containerStatuses")
    if not ready or not isinstance(containers, list):
        return None
    for container in containers:
        if isinstance(container, Mapping) and container.get("name") == SLURMD_CONTAINER:
            running = (container.get("state") or {}).get("running") \
                if isinstance(container.get("state"), Mapping) else None
            if not isinstance(running, Mapping):
                return None
            try:
                text = str(running.get("startedAt")).replace("Z", "+00:00")
                return datetime.fromisoformat(text).timestamp()
            except ValueError:
                return None
    return None


def slurmd_claim(meta: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(owner uid, Nodeset name, Slurm node) of a pod labelled as a Nodeset's slurmd pod
    whose controller owner reference is a Nodeset; None otherwise (most pods: one lookup)."""
    labels = meta.get("labels")
    nodeset = labels.get(wk.LABEL_SLURMD_NODESET) if isinstance(labels, Mapping) else None
    if type(nodeset) is not str:
        return None
    annotations = meta.get("annotations")
    node = annotations.get(wk.ANNOTATION_SLURMD_NODE) if isinstance(annotations, Mapping) \
        else None
    owners = meta.get("ownerReferences")
    if type(node) is not str or not isinstance(owners, list):
        return None
    for owner in owners:
        if isinstance(owner, Mapping) and owner.get("controller") is True \
                and owner.get("kind") == wk.NODESET_KIND \
                and str(owner.get("apiVersion") or "").startswith(f"{wk.GROUP}/") \
                and owner.get("name") == nodeset and type(owner.get("uid")) is str:
            return (sys.intern(owner["uid"]), sys.intern(nodeset), sys.intern(node))
    return None


def slurmd_revision(meta: Mapping[str, Any]) -> str:
    """A slurmd pod's revision annotation (the hash of the spec it was made from); "" when
    it carries none or not a string (such a pod is never taken for up to date)."""
    annotations = meta.get("annotations")
    value = annotations.get(wk.ANNOTATION_SLURMD_REVISION) if isinstance(
        annotations, Mapping) else None
    return sys.intern(value) if type(value) is str else ""


def pod_version(pod: PodFacts) -> str:
    return pod.resource_version


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # set by the kubelet on static pods' mirrors


def node_local(meta: Mapping[str, Any]) -> bool:
    """A DaemonSet pod (controller ownerReference of kind DaemonSet) or a mirror pod."""
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and MIRROR_ANNOTATION in annotations:
        return True
    owners = meta.get("ownerReferences")
    if not isinstance(owners, list):
        return False
    return any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet"
               and o.get("controller") is True for o in owners)


def _check_selector(value: Any, where: str) -> None:
    """A LabelSelector (matchLabels + matchExpressions) or a plain label map."""
    selector = _mapping(value, where)
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        return
    _mapping(selector.get("matchLabels"), f"{where}.matchLabels")
    expressions = _objects(selector.get("matchExpressions"), f"{where}.matchExpressions")
    for index, expression in enumerate(expressions):
        values = expression.get("values")
        if values is not None and not isinstance(values, list):
            raise MalformedObject(f"{where}.matchExpressions[{index}].values", "not a list")


MAX_COUNT = 1_000_000  # bound on node counts in a Nodeset (minSlurm, maxInFlight, ...)
MAX_SECONDS = 10 * 365 * 86400.0  # bound on durations in a Nodeset


def slim_nodeset(obj: JSON) -> JSON:
    """A Nodeset is cached whole, but only once it parses: every field `parse_nodeset` and
    the workload selector match read has the right shape, numbers are finite and bounded."""
    meta = _mapping(obj.get("metadata"), "metadata")
    checked_name(meta.get("name"), "metadata.name")
    checked_name(meta.get("namespace"), "metadata.namespace")
    spec = _mapping(obj.get("spec"), "spec")
    _check_selector(spec.get("nodeSelector"), "spec.nodeSelector")
    _check_selector(spec.get("workloadSelector"), "spec.workloadSelector")
    _mapping(spec.get("slurm"), "spec.slurm")
    _mapping(spec.get("ownership"), "spec.ownership")
    try:
        nodeset = parse_nodeset(obj)
    except MalformedObject:
        raise  # names its field already (spec.slurmd)
    except (ValueError, TypeError, ArithmeticError, AttributeError) as error:
        raise MalformedObject("spec", f"does not parse: {error}") from None
    ownership = nodeset.ownership
    for name in ("min_slurm", "min_kubernetes", "max_kubernetes", "max_in_flight"):
        count = getattr(ownership, name)
        if count is not None and not 0 <= count <= MAX_COUNT:
            raise MalformedObject(f"spec.ownership.{name}", f"out of range: {count}")
    if not 0.5 <= ownership.headroom_quantile < 1:
        raise MalformedObject("spec.ownership.headroomQuantile",
                              f"out of range: {ownership.headroom_quantile}")
    if not (math.isfinite(ownership.forecast_block_hours)
            and 0 <= ownership.forecast_block_hours <= 23):
        raise MalformedObject("spec.ownership.forecastBlockHours",
                              f"out of range: {ownership.forecast_block_hours}")
    for name in ("dwell_seconds", "drain_timeout_seconds", "reclaim_grace_seconds",
                 "forecast_horizon_seconds"):
        seconds = getattr(ownership, name)
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
            raise MalformedObject(f"spec.ownership.{name}", f"out of range: {seconds}")
    return obj


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
        forecast=_bool(pick("forecast"), d.forecast),
        forecast_horizon_seconds=parse_duration(
            pick("forecastHorizonSeconds", "forecastHorizon"), d.forecast_horizon_seconds
        ),
        headroom_quantile=_float(pick("headroomQuantile"), d.headroom_quantile),
        forecast_block_hours=_float(pick("forecastBlockHours"), d.forecast_block_hours),
    )


def _bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    raise ValueError(f"not a boolean: {value!r}")


def _float(value: Any, default: float) -> float:
    if value is None or isinstance(value, bool):
        return default
    return float(value)


def parse_topology(raw: Any) -> TopologyChoice | None:
    """`spec.topology` (None when absent). What cannot be used is kept with `error`
    naming the field, so the operator sees why (the TopologyApplied condition) and the
    Nodeset's other fields still count."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        return TopologyChoice(error=f"spec.topology: expected an object, got {_kind(raw)}")
    problems: list[str] = []

    def text(key: str) -> str | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, str) and value.strip():
            return value
        problems.append(f"spec.topology.{key}: expected a non-empty string, got {value!r}")
        return None

    def items(key: str, kind: type) -> tuple[Any, ...]:
        value = raw.get(key)
        if value is None:
            return ()
        if isinstance(value, list) and all(
                isinstance(v, kind) and not isinstance(v, bool) for v in value):
            return tuple(value)
        problems.append(f"spec.topology.{key}: expected a list of {kind.__name__}, "
                        f"got {value!r}"[:300])
        return ()

    unknown = sorted(set(raw) - {"kind", "preset", "levels", "blockLabel", "blockSizes"})
    if unknown:
        problems.append(f"spec.topology: unknown fields {unknown}")
    kind = text("kind") or "tree"
    preset, label = text("preset"), text("blockLabel")
    levels, sizes = items("levels", str), items("blockSizes", int)
    if not problems:
        if kind not in ("tree", "block"):
            problems.append(f"spec.topology.kind: tree or block, got {kind!r}")
        else:
            try:
                spec_from("tree" if kind == "tree" else "block",
                          preset=preset or DEFAULT_PRESET, levels=levels,
                          block_label=label, block_sizes=sizes)
            except TopologyError as error:
                problems.append(f"spec.topology: {error}")
    return TopologyChoice(kind=kind, preset=preset, levels=levels, block_label=label,
                          block_sizes=sizes, error="; ".join(problems) or None)


def _kind(value: Any) -> str:
    return type(value).__name__


def pool_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _has_finalizer(finalizers: Any) -> bool:
    """sunkd's finalizer is in `metadata.finalizers` (a list of names; anything else: no)."""
    return isinstance(finalizers, list) and wk.FINALIZER_SLURMD_PODS in finalizers


def parse_nodeset(obj: JSON, *, deleted: bool = False) -> K8sNodesetObserved:
    spec = obj.get("spec") or {}
    slurm = spec.get("slurm") or {}
    partitions = slurm.get("partitions", spec.get("partitions")) or []
    if isinstance(partitions, str):
        partitions = [partitions]
    node_name_label = slurm.get("nodeNameLabel") or spec.get("nodeNameLabel")
    meta = obj.get("metadata") or {}
    slurmd = parse_slurmd(spec.get("slurmd"), str(meta.get("name") or ""))
    node_selector = _labels(_selector_map(spec.get("nodeSelector")))
    if slurmd is not None and slurmd.registration == "Dynamic" and not node_selector:
        # A pool without a selector takes the nodes of its partitions as Slurm lists
        # them: a Dynamic node is in Slurm only once its pod registered it.
        raise MalformedObject("spec.nodeSelector", "required for Dynamic registration: "
                              "its nodes are not in Slurm before their slurmd pods "
                              "register them")
    return K8sNodesetObserved(
        pool=pool_name(obj),
        generation=_int(meta.get("generation"), 0),
        node_selector=node_selector,
        partitions=tuple(str(p) for p in partitions),
        node_name_label=str(node_name_label) if node_name_label else None,
        workload_selector=_labels(_selector_map(spec.get("workloadSelector"))),
        ownership=parse_ownership(spec.get("ownership")),
        deleted=deleted,
        uid=str(meta.get("uid") or ""),
        slurmd=slurmd,
        topology=parse_topology(spec.get("topology")),
        deleting=bool(meta.get("deletionTimestamp")),
        slurmd_finalizer=_has_finalizer(meta.get("finalizers")),
    )


def slurm_node_name(name: str, labels: Mapping[str, Any], node_name_label: str | None
                    ) -> str:
    """The Slurm name of Kubernetes Node `name`: its Nodeset's `nodeNameLabel` when set
    and present, else sunkd's `sunkd.io/slurm-node-name` label, else the Node's name."""
    named = str(labels.get(node_name_label) or "") if node_name_label else ""
    return named or str(labels.get(wk.LABEL_SLURM_NODE_NAME) or "") or name


def workload_selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions) or a plain label map.

    An empty or missing selector matches nothing here (like a PDB's nil selector): a Nodeset
    without a workload selector must not claim every pod in the cluster. This is the one
    deliberate difference from the API server's label selectors (where an empty selector
    selects everything), hence its own name; the emulator's `label_selector_matches` in
    testbed/sunkd_testbed/kubeapi/selectors.py follows the API server."""
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


def selector_matches(selector: tuple[Label, ...], labels: Mapping[str, Any]) -> bool:
    """Equality selector match; an empty selector matches nothing (like a PDB's nil selector):
    a Nodeset without a selector must not claim every node or every pod in the cluster."""
    if not selector:
        return False
    return all(labels.get(label.key) == label.value for label in selector)


def _decimal_or_zero(value: Any) -> Decimal:
    """A quantity clamped to [0, 2**63 - 1]; malformed is 0. Unbounded, "1e999999999"
    would overflow the arithmetic or become an integer too long to write."""
    try:
        number = parse_quantity(value)
    except ValueError:
        return Decimal(0)
    if number.is_nan() or number < 0:
        return Decimal(0)
    return min(number, MAX_QUANTITY)


def node_quantity(allocatable: Mapping[str, Any], key: str, scale: int = 1) -> int | None:
    """A Node's allocatable `key` as an integer (`scale` 1000: millicores). Absent is 0:
    Kubernetes omits a resource the Node does not have. Present but not a usable
    quantity (malformed, NaN, infinite, negative, or beyond 2**63 - 1 once scaled) is
    None, unknown: never 0 (a Node with nothing) nor 2**63 - 1 (a Node with everything)."""
    if key not in allocatable:
        return 0
    try:
        number = parse_quantity(allocatable[key])
    except ValueError:
        return None
    if not number.is_finite() or number < 0 or number * scale > MAX_QUANTITY:
        return None
    return quantity_int(number, scale)


def quantity_int(value: Decimal, scale: int = 1, rounding: str | None = None) -> int:
    """`value * scale` as an integer within [0, 2**63 - 1]."""
    scaled = min(value * scale, MAX_QUANTITY)
    return int(scaled.to_integral_value(rounding=rounding))


# pod_requests by the request texts that decide it: the pods of one Deployment ask for the
# same, and parsing their quantities was ~45 % of mapping a Pod at 100,000 pods (py-spy
# on a restart, docs/performance.md, "Scale"). Only all-string quantities are memoized
# (the API's form; 1, 1.0 and True hash alike but parse differently); cleared when full.
_REQUESTS_BY_TEXT: dict[tuple[Any, ...], tuple[int, int, int]] = {}
_REQUESTS_BY_TEXT_MAX = 4096


def _texts_key(containers: Any) -> tuple[tuple[tuple[str, str], ...], ...] | None:
    """The containers' requests as (name, text) pairs, or None where any is not a string
    in the places the API puts it."""
    if not containers:
        return ()
    if type(containers) is not list:
        return None
    key: list[tuple[tuple[str, str], ...]] = []
    for container in containers:
        requests: Any = container
        for field_name in ("resources", "requests"):  # container.resources.requests
            if type(requests) is not dict:
                return None
            requests = requests.get(field_name)
            if requests is None:
                break
        if requests is None:
            key.append(())
            continue
        if type(requests) is not dict:
            return None
        pairs = tuple(requests.items())
        for name, text in pairs:
            if type(name) is not str or type(text) is not str:
                return None
        key.append(pairs)
    return tuple(key)


def pod_requests(pod: JSON) -> tuple[int, int, int]:
    """Effective (cpu millis, memory bytes, GPUs): max(sum(containers), max(init)) + overhead,
    the scheduler's rule (k/k pkg/api/v1/resource helpers)."""
    spec = pod.get("spec") or {}
    if type(spec) is dict:
        overhead = spec.get("overhead") or {}
        containers = _texts_key(spec.get("containers"))
        init = _texts_key(spec.get("initContainers"))
        if (containers is not None and init is not None and type(overhead) is dict
                and all(type(k) is str and type(v) is str for k, v in overhead.items())):
            key = (containers, init, tuple(overhead.items()))
            found = _REQUESTS_BY_TEXT.get(key)
            if found is None:
                found = _pod_requests(spec)
                if len(_REQUESTS_BY_TEXT) >= _REQUESTS_BY_TEXT_MAX:
                    _REQUESTS_BY_TEXT.clear()
                _REQUESTS_BY_TEXT[key] = found
            return found
    return _pod_requests(spec)


def _pod_requests(spec: Any) -> tuple[int, int, int]:
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
        quantity_int(totals["cpu"], 1000, "ROUND_CEILING"),
        quantity_int(totals["memory"], 1, "ROUND_CEILING"),
        quantity_int(totals[GPU_RESOURCE], 1, "ROUND_CEILING"),
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
