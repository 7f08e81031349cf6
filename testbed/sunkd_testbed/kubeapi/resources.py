"""Resource types the emulator serves: built-in ones and those created from CRDs.

One `ResourceType` carries what discovery, routing, field selectors, strategic merge
patch and printing need to know about a type. Facts come from `k8s.io/api` (types.go
patch strategies and `+listType` markers) and from the registry strategies in
`k8s.io/kubernetes/pkg/registry/*/strategy.go` (what create/update reset, which
field selectors each type supports: `GetAttrs`/`ToSelectableFields`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
FieldGetter = Callable[[JSON], dict[str, str]]


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # string | integer | number | boolean | date
    description: str = ""
    priority: int = 0
    format: str = ""
    # Returns the cell value (already human-formatted) for an object.
    value: Callable[[JSON], Any] = field(default=lambda obj: None, compare=False)


def _meta(obj: JSON) -> JSON:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def metadata_fields(obj: JSON) -> dict[str, str]:
    meta = _meta(obj)
    return {"metadata.name": str(meta.get("name", "")),
            "metadata.namespace": str(meta.get("namespace", ""))}


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status_subresource: bool = False
    builtin: bool = True  # strategic merge patch is allowed on built-in types only
    tracks_generation: bool = False  # generation bumps on spec changes (CRs, PDBs, CRDs)
    unconditional_update: bool = True  # PUT without resourceVersion allowed (false for CRs)
    status_reset_on_create: bool = False  # POST drops .status (pods/PDBs/CRs with status)
    fields: FieldGetter = metadata_fields
    field_names: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    merge_keys: dict[tuple[str, ...], str | None] = field(default_factory=dict)
    columns: list[Column] = field(default_factory=list)
    name_column: bool = True  # False: `columns` is the whole row (core Events)
    schema: JSON | None = None  # CRD openAPIV3Schema for this version
    crd_name: str | None = None
    extra_subresources: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key shared by all versions of a resource: `plural.group`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else "/api/v1"

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = self.prefix
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def matches_name(self, word: str) -> bool:
        lowered = word.lower()
        return lowered in {self.plural, self.singular or self.kind.lower(), self.kind.lower(),
                           self.key, *self.short_names} or word == self.kind


# ------------------------------------------------------------------ field getters


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _s(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pod_fields(obj: JSON) -> dict[str, str]:
    # pkg/registry/core/pod/strategy.go ToSelectableFields
    out = metadata_fields(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out.update({
        "spec.nodeName": _s(spec.get("nodeName")),
        "spec.restartPolicy": _s(spec.get("restartPolicy")),
        "spec.schedulerName": _s(spec.get("schedulerName")),
        "spec.serviceAccountName": _s(spec.get("serviceAccountName")),
        "spec.hostNetwork": _s(bool(spec.get("hostNetwork", False))),
        "status.phase": _s(status.get("phase")),
        "status.podIP": _s(status.get("podIP")),
        "status.nominatedNodeName": _s(status.get("nominatedNodeName")),
    })
    return out


def node_fields(obj: JSON) -> dict[str, str]:
    # pkg/registry/core/node/strategy.go NodeToSelectableFields
    out = metadata_fields(obj)
    out["spec.unschedulable"] = _s(bool(_dig(obj, "spec", "unschedulable") or False))
    return out


def namespace_fields(obj: JSON) -> dict[str, str]:
    out = metadata_fields(obj)
    out["status.phase"] = _s(_dig(obj, "status", "phase"))
    return out


def event_fields(obj: JSON) -> dict[str, str]:
    # pkg/registry/core/event/strategy.go ToSelectableFields
    out = metadata_fields(obj)
    inv = obj.get("involvedObject") or {}
    for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion",
                "fieldPath"):
        out[f"involvedObject.{key}"] = _s(inv.get(key))
    out["reason"] = _s(obj.get("reason"))
    out["reportingComponent"] = _s(obj.get("reportingComponent"))
    out["source"] = _s(_dig(obj, "source", "component"))
    out["type"] = _s(obj.get("type"))
    return out


POD_FIELDS = frozenset(pod_fields({}).keys())
NODE_FIELDS = frozenset(node_fields({}).keys())
NAMESPACE_FIELDS = frozenset(namespace_fields({}).keys())
EVENT_FIELDS = frozenset(event_fields({}).keys())

# Patch strategies from k8s.io/api core/v1, policy/v1 and meta/v1 types.go.
META_MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    ("metadata", "finalizers"): None,
    ("metadata", "ownerReferences"): "uid",
}
POD_MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    **META_MERGE_KEYS,
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "containers", "*", "env"): "name",
    ("spec", "initContainers", "*", "env"): "name",
    ("spec", "containers", "*", "ports"): "containerPort",
    ("spec", "initContainers", "*", "ports"): "containerPort",
    ("spec", "containers", "*", "volumeMounts"): "mountPath",
    ("spec", "initContainers", "*", "volumeMounts"): "mountPath",
    ("spec", "containers", "*", "volumeDevices"): "devicePath",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("status", "conditions"): "type",
    # spec.tolerations, status.containerStatuses: atomic (no patchStrategy).
}
NODE_MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    **META_MERGE_KEYS,
    ("spec", "podCIDRs"): None,
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    # spec.taints: `+listType=atomic`, replaced as a whole.
}
PDB_MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    **META_MERGE_KEYS,
    ("status", "conditions"): "type",
}
