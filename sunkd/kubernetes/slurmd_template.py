"""Nodeset `spec.slurmd.template`: a partial PodTemplateSpec a site merges onto sunkd's
slurmd pod (sidecars, init containers, tolerations, a service account, probes, ...).

Why a module of its own: the template is the one part of `spec.slurmd` a site writes in
Kubernetes' own shape, so it needs two things the typed fields do not. The check
(`parse_template`) refuses every field sunkd owns, with an error naming it, before the
Nodeset is folded: a template may add to the pod but never move it off its node, off the
host network, out of the Nodeset's ownership, or change what slurmd runs. The merge
(`apply_template`) follows Kubernetes' strategic merge for a PodSpec (lists of named
objects merged by `name`, tolerations appended: `patchMergeKey` in
k8s.io/api/core/v1/types.go) and copies only the fields the check accepts, so even a
template that never went through the check (an old log entry) cannot break those
invariants. The rules are written down in docs/nodeset.md ("Pod template").
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.kubernetes.wire import MalformedObject

WHERE = "spec.slurmd.template"
SLURMD = "slurmd"  # the container sunkd renders (normalize.SLURMD_CONTAINER)

# PodSpec fields a template may set, and how they meet sunkd's pod.
_APPENDED = ("tolerations", "hostAliases", "imagePullSecrets")  # after sunkd's entries
_SET = ("securityContext", "serviceAccountName", "automountServiceAccountToken",
        "dnsConfig", "dnsPolicy", "runtimeClassName", "hostPID", "hostIPC",
        "shareProcessNamespace", "enableServiceLinks")  # sunkd sets none or a default
_NAMED = ("initContainers", "containers", "volumes")  # merged by name (below)
POD_FIELDS = frozenset(_APPENDED + _SET + _NAMED)
# With hostNetwork the pod takes the node's resolver (Default) or the cluster's
# (ClusterFirstWithHostNet); ClusterFirst falls back to Default there (pod DNS docs).
DNS_POLICIES = ("Default", "ClusterFirstWithHostNet", "None")

# Why a PodSpec field is refused: the ones a site is most likely to try get their own
# word; any other field is refused as not supported. A pod with nodeName set skips the
# scheduler, but the kubelet still admits it through the scheduler's general predicates
# (`generalFilter` in pkg/kubelet/lifecycle/predicate.go, Kubernetes 1.37:
# `scheduler.AdmissionCheck` for node name, node affinity and nodeSelector, host ports and
# resources, then the node's NoExecute taints) and fails it on a mismatch: nodeSelector
# and affinity could only ever make the pod fail.
_OWNED = {
    "nodeName": "sunkd binds each pod to its node (the Nodeset's spec.nodeSelector picks "
                "the nodes)",
    "nodeSelector": "the pod is bound by nodeName, the scheduler is not asked, and the "
                    "kubelet fails a pod whose nodeSelector does not match its node "
                    "(NodeAffinity): select nodes with the Nodeset's spec.nodeSelector",
    "affinity": "the pod is bound by nodeName: the scheduler never reads it, and the "
                "kubelet fails a pod whose node affinity does not match its node",
    "schedulerName": "the pod is bound by nodeName: no scheduler places it",
    "topologySpreadConstraints": "the pod is bound by nodeName: no scheduler places it",
    "hostNetwork": "slurmctld reaches slurmd at the node's address (sunkd sets true)",
    "hostname": "the pod shares the host's name (host network); the Slurm name is slurmd -N",
    "subdomain": "the pod shares the host's name (host network)",
    "setHostnameAsFQDN": "the pod shares the host's name (host network)",
    "restartPolicy": "sunkd's pods restart in place (Always); the repair replaces ended pods",
    "priorityClassName": "set spec.slurmd.priorityClassName",
    "priority": "comes from spec.slurmd.priorityClassName (admission sets it)",
    "preemptionPolicy": "comes from spec.slurmd.priorityClassName",
    "terminationGracePeriodSeconds": "set spec.slurmd.terminationGracePeriodSeconds",
    "activeDeadlineSeconds": "would stop slurmd under running jobs",
}
_METADATA_FIELDS = frozenset({"labels", "annotations"})
# The slurmd container: fields a template may merge onto it.
_SLURMD_FIELDS = frozenset({
    "env", "envFrom", "volumeMounts", "volumeDevices", "resources", "securityContext",
    "lifecycle", "livenessProbe", "readinessProbe", "startupProbe", "ports", "workingDir",
    "terminationMessagePath", "terminationMessagePolicy"})
_SLURMD_OWNED = {
    "image": "set spec.slurmd.image", "imagePullPolicy": "set spec.slurmd.imagePullPolicy",
    "command": "sunkd runs slurmd (spec.slurmd.registration, conf, confServer)",
    "args": "set spec.slurmd.args",
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _key_ok(key: str) -> bool:
    """A label or annotation key: `[prefix/]name` (k8s.io/apimachinery validation
    IsQualifiedName)."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED.match(name))


def _strings(raw: Any, where: str, labels: bool) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise MalformedObject(where, "not a map of strings")
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _key_ok(key):
            raise MalformedObject(where, f"not a valid key: {key!r}")
        if key.startswith(wk.PREFIX):
            raise MalformedObject(f"{where}.{key}", f"keys under {wk.PREFIX} are sunkd's own "
                                  "(it sets them on every slurmd pod)")
        if not isinstance(value, str):
            raise MalformedObject(f"{where}.{key}", f"not a string: {value!r}")
        if labels and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            raise MalformedObject(f"{where}.{key}", f"not a label value: {value!r}")
        out[key] = value
    return out


def _named(raw: Any, where: str) -> list[Mapping[str, Any]]:
    """A list of objects each with a DNS-label `name`, no name twice."""
    if not isinstance(raw, list):
        raise MalformedObject(where, "not a list")
    seen: set[str] = set()
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise MalformedObject(f"{where}[{index}]", "not an object")
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
            raise MalformedObject(f"{where}[{index}].name", f"not a DNS label: {name!r}")
        if name in seen:
            raise MalformedObject(f"{where}[{index}].name", f"{name!r} given twice")
        seen.add(name)
    return list(raw)


def _objects(raw: Any, where: str) -> list[Mapping[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise MalformedObject(where, "not a list of objects")
    return list(raw)


def _slurmd_container(item: Mapping[str, Any], where: str, *, env: set[str],
                      mounts: set[str], resources: Mapping[str, set[str]]) -> None:
    for key in sorted(item):
        if key == "name":
            continue
        if key in _SLURMD_OWNED:
            raise MalformedObject(f"{where}.{key}", f"sunkd's to set: {_SLURMD_OWNED[key]}")
        if key not in _SLURMD_FIELDS:
            raise MalformedObject(f"{where}.{key}", "not supported on the slurmd container")
    for name, element in (("env", "name"), ("volumeMounts", "mountPath")):
        spec_keys = env if name == "env" else mounts
        for index, entry in enumerate(_objects(item.get(name, []), f"{where}.{name}")):
            given = entry.get(element)
            if not isinstance(given, str) or not given:
                raise MalformedObject(f"{where}.{name}[{index}].{element}", "missing")
            if given in spec_keys:
                raise MalformedObject(f"{where}.{name}[{index}]", f"{given!r} is already in "
                                      f"spec.slurmd.{name}: give it in one place")
    for name in ("envFrom", "volumeDevices", "ports"):
        if name in item:
            _objects(item[name], f"{where}.{name}")
    res = item.get("resources", {})
    if not isinstance(res, Mapping):
        raise MalformedObject(f"{where}.resources", "not an object")
    for kind, quantities in res.items():
        if kind not in ("requests", "limits"):
            raise MalformedObject(f"{where}.resources.{kind}", "not requests or limits")
        if not isinstance(quantities, Mapping):
            raise MalformedObject(f"{where}.resources.{kind}", "not an object")
        both = sorted(set(quantities) & resources.get(kind, set()))
        if both:
            raise MalformedObject(f"{where}.resources.{kind}", f"{', '.join(both)} already in "
                                  f"spec.slurmd.resources.{kind}: give it in one place")
    context = item.get("securityContext", {})
    if not isinstance(context, Mapping):
        raise MalformedObject(f"{where}.securityContext", "not an object")
    if "privileged" in context:
        raise MalformedObject(f"{where}.securityContext.privileged",
                              "set spec.slurmd.privileged")
    for name in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
        if name in item and not isinstance(item[name], Mapping):
            raise MalformedObject(f"{where}.{name}", "not an object")


def parse_template(raw: Any, *, volumes: set[str], env: set[str], mounts: set[str],
                   resources: Mapping[str, set[str]]) -> str | None:
    """`spec.slurmd.template` checked, as canonical JSON text; None when absent or empty. `volumes`,
    `env`, `mounts` (mount paths) and `resources` (kind -> names) are what `spec.slurmd`
    itself gives: the template may not give them again. Raises `MalformedObject`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise MalformedObject(WHERE, "not an object (a partial PodTemplateSpec)")
    unknown = sorted(set(raw) - {"metadata", "spec"})
    if unknown:
        raise MalformedObject(WHERE, f"unknown field(s): {', '.join(unknown)} (metadata, spec)")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise MalformedObject(f"{WHERE}.metadata", "not an object")
    for key in sorted(meta):
        if key not in _METADATA_FIELDS:
            raise MalformedObject(f"{WHERE}.metadata.{key}", "sunkd's to set (a template "
                                  "gives labels and annotations only)")
    _strings(meta.get("labels"), f"{WHERE}.metadata.labels", labels=True)
    _strings(meta.get("annotations"), f"{WHERE}.metadata.annotations", labels=False)
    spec = raw.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise MalformedObject(f"{WHERE}.spec", "not an object")
    for key in sorted(spec):
        if key in _OWNED:
            raise MalformedObject(f"{WHERE}.spec.{key}", f"sunkd's to set: {_OWNED[key]}")
        if key not in POD_FIELDS:
            raise MalformedObject(f"{WHERE}.spec.{key}", "not supported in a slurmd pod "
                                  "template (docs/nodeset.md, Pod template)")
    for key in _APPENDED:
        if key in spec:
            _objects(spec[key], f"{WHERE}.spec.{key}")
    for key in ("securityContext", "dnsConfig"):
        if key in spec and not isinstance(spec[key], Mapping):
            raise MalformedObject(f"{WHERE}.spec.{key}", "not an object")
    for key in ("automountServiceAccountToken", "hostPID", "hostIPC", "shareProcessNamespace",
                "enableServiceLinks"):
        if key in spec and not isinstance(spec[key], bool):
            raise MalformedObject(f"{WHERE}.spec.{key}", f"not a boolean: {spec[key]!r}")
    for key in ("serviceAccountName", "runtimeClassName"):
        if key in spec and (not isinstance(spec[key], str)
                            or not _DNS_SUBDOMAIN.match(spec[key])):
            raise MalformedObject(f"{WHERE}.spec.{key}", f"not a DNS name: {spec[key]!r}")
    if "dnsPolicy" in spec and spec["dnsPolicy"] not in DNS_POLICIES:
        raise MalformedObject(f"{WHERE}.spec.dnsPolicy", f"{spec['dnsPolicy']!r} is not one "
                              f"of {', '.join(DNS_POLICIES)} (the pod is on the host network)")
    names: set[str] = set()
    for key in ("initContainers", "containers"):
        for index, item in enumerate(_named(spec.get(key, []), f"{WHERE}.spec.{key}")):
            where = f"{WHERE}.spec.{key}[{index}]"
            name = item["name"]
            if name == SLURMD and key == "containers":
                _slurmd_container(item, where, env=env, mounts=mounts, resources=resources)
                continue
            if name == SLURMD or name in names:
                raise MalformedObject(f"{where}.name", f"{name!r} is already a container of "
                                      "the pod")
            names.add(name)
            if not isinstance(item.get("image"), str) or not item["image"]:
                raise MalformedObject(f"{where}.image", "missing (a container sunkd adds "
                                      "needs its image)")
    for index, item in enumerate(_named(spec.get("volumes", []), f"{WHERE}.spec.volumes")):
        if item["name"] in volumes:
            raise MalformedObject(f"{WHERE}.spec.volumes[{index}].name",
                                  f"{item['name']!r} is already in spec.slurmd.volumes")
    kept = {key: value for key, value in (("metadata", meta), ("spec", spec)) if value}
    # An empty template is none: the same pod, so the same revision.
    return json.dumps(kept, sort_keys=True, separators=(",", ":")) if kept else None


def _list(value: Any) -> list[Any]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) \
        else []


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _merge_slurmd(container: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """The template's `slurmd` entry onto sunkd's container: lists appended (a name or
    mount path sunkd has keeps sunkd's entry), maps merged (sunkd's keys win: the image,
    the command and `privileged` are never taken from here)."""
    for key in ("env", "volumeMounts"):
        element = "name" if key == "env" else "mountPath"
        entries = list(container.get(key, []))
        have = {entry.get(element) for entry in entries}
        for entry in _list(patch.get(key)):
            if entry.get(element) not in have:
                entries.append(copy.deepcopy(entry))
                have.add(entry.get(element))
        container[key] = entries
    for key in ("envFrom", "volumeDevices", "ports"):
        if _list(patch.get(key)):
            container[key] = [*container.get(key, []), *copy.deepcopy(_list(patch[key]))]
    resources = _dict(container.get("resources"))
    for kind, quantities in _dict(patch.get("resources")).items():
        if kind in ("requests", "limits") and isinstance(quantities, Mapping):
            resources[kind] = {**copy.deepcopy(dict(quantities)), **_dict(resources.get(kind))}
    if resources:
        container["resources"] = resources
    container["securityContext"] = {**copy.deepcopy(_dict(patch.get("securityContext"))),
                                    **_dict(container.get("securityContext"))}
    for key in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe", "workingDir",
                "terminationMessagePath", "terminationMessagePolicy"):
        if key in patch:
            container[key] = copy.deepcopy(patch[key])


def apply_template(pod: dict[str, Any], template_json: str | None) -> dict[str, Any]:
    """`pod` (sunkd's rendering, changed in place and returned) with the template merged:

    - metadata.labels/annotations: added; sunkd's keys win;
    - tolerations, hostAliases, imagePullSecrets: appended after sunkd's;
    - securityContext, serviceAccountName, automountServiceAccountToken, dnsConfig,
      dnsPolicy, runtimeClassName, hostPID, hostIPC, shareProcessNamespace,
      enableServiceLinks: the template's;
    - initContainers: appended after sunkd's; containers: `slurmd` merged onto sunkd's container
      (`_merge_slurmd`), any other name appended (a sidecar);
    - volumes: appended, a name sunkd's pod has keeps sunkd's volume.

    Only those fields are read, so nothing else of sunkd's pod can change."""
    if not template_json:
        return pod
    template = json.loads(template_json)
    if not isinstance(template, Mapping):
        return pod
    meta = pod["metadata"]
    tmeta = _dict(template.get("metadata"))
    for key in ("labels", "annotations"):
        extra = {k: v for k, v in _dict(tmeta.get(key)).items()
                 if isinstance(k, str) and isinstance(v, str) and not k.startswith(wk.PREFIX)}
        if extra:
            meta[key] = {**extra, **meta.get(key, {})}
    spec = pod["spec"]
    tspec = _dict(template.get("spec"))
    for key in _APPENDED:
        if _list(tspec.get(key)):
            spec[key] = [*spec.get(key, []), *copy.deepcopy(_list(tspec[key]))]
    for key in _SET:
        if key in tspec:
            spec[key] = copy.deepcopy(tspec[key])
    # Container names are unique across containers and initContainers (the API server's
    # pod validation); sunkd's own (slurmd, the auth's munged sidecar) keep their names,
    # and sunkd's init containers stay first.
    inits = list(spec.get("initContainers", []))
    taken = {c.get("name") for c in [*spec["containers"], *inits]}
    for item in _list(tspec.get("initContainers")):
        if item.get("name") not in taken:
            inits.append(copy.deepcopy(item))
            taken.add(item.get("name"))
    if inits:
        spec["initContainers"] = inits
    for item in _list(tspec.get("containers")):
        if item.get("name") == SLURMD:
            _merge_slurmd(spec["containers"][0], item)
        elif item.get("name") not in taken:
            spec["containers"].append(copy.deepcopy(item))
            taken.add(item.get("name"))
    volumes = list(spec.get("volumes", []))
    have = {v.get("name") for v in volumes}
    for volume in _list(tspec.get("volumes")):
        if volume.get("name") not in have:
            volumes.append(copy.deepcopy(volume))
            have.add(volume.get("name"))
    spec["volumes"] = volumes
    return pod
