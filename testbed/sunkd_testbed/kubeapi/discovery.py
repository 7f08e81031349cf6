"""Discovery documents and the minimal OpenAPI v3 that kubectl needs.

* Aggregated discovery (`apidiscovery.k8s.io/v2 APIGroupDiscoveryList`) is served when the
  client asks for it in `Accept`; the response Content-Type must then carry
  `g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList` or kubectl parses it as legacy.
* Legacy `APIVersions`, `APIGroupList`, `APIGroup` and `APIResourceList` otherwise; and
  `/api/v1` is always legacy because `kubectl drain` reads it directly and needs
  `pods/eviction` with `group: policy, version: v1, kind: Eviction` (otherwise it falls
  back to DELETE and bypasses PDBs).
* `/openapi/v3`: an index and per-group-version documents whose PATCH operations carry
  `x-kubernetes-group-version-kind` and a `fieldValidation` parameter. That is how
  kubectl 1.32 (`cli-runtime/pkg/resource/query_param_verifier_v3.go`) decides the server
  validates fields, so `kubectl apply` works without `--validate=false`. CRD schemas are
  included as components so `kubectl explain` has something to read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import JSON, ResourceType

AGGREGATED_CT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _singular(rt: ResourceType) -> str:
    return rt.singular or rt.kind.lower()


def _subresources(rt: ResourceType) -> list[tuple[str, str, str, str, list[str]]]:
    subs: list[tuple[str, str, str, str, list[str]]] = []
    if rt.status_subresource:
        subs.append(("status", rt.group, rt.version, rt.kind, ["get", "patch", "update"]))
    for name, (group, version, kind) in rt.extra_subresources.items():
        subs.append((name, group, version, kind, ["create"]))
    return subs


def api_resource_list(group_version: str, types: list[ResourceType]) -> JSON:
    resources: list[JSON] = []
    for rt in sorted(types, key=lambda t: t.plural):
        entry: JSON = {"name": rt.plural, "singularName": _singular(rt),
                       "namespaced": rt.namespaced, "kind": rt.kind, "verbs": VERBS}
        if rt.short_names:
            entry["shortNames"] = rt.short_names
        if rt.categories:
            entry["categories"] = rt.categories
        resources.append(entry)
        for name, group, version, kind, verbs in _subresources(rt):
            sub: JSON = {"name": f"{rt.plural}/{name}", "singularName": _singular(rt),
                         "namespaced": rt.namespaced, "kind": kind, "verbs": verbs}
            if (group, version) != (rt.group, rt.version):
                sub["group"] = group
                sub["version"] = version
            resources.append(sub)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources}


def _aggregated_resource(rt: ResourceType) -> JSON:
    entry: JSON = {
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": _singular(rt),
        "verbs": VERBS,
    }
    if rt.short_names:
        entry["shortNames"] = rt.short_names
    if rt.categories:
        entry["categories"] = rt.categories
    subs = [{"subresource": name, "responseKind": {"group": g, "version": v, "kind": k},
             "verbs": verbs} for name, g, v, k, verbs in _subresources(rt)]
    if subs:
        entry["subresources"] = subs
    return entry


def _versions_by_group(types: list[ResourceType]) -> dict[str, dict[str, list[ResourceType]]]:
    out: dict[str, dict[str, list[ResourceType]]] = {}
    for rt in types:
        out.setdefault(rt.group, {}).setdefault(rt.version, []).append(rt)
    return out


def _version_order(versions: list[str]) -> list[str]:
    """Kubernetes version priority: GA > beta > alpha, higher numbers first."""
    import re

    def key(v: str) -> tuple[int, int, int]:
        m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", v)
        if not m:
            return (3, 0, 0)
        stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
        return (stage, -int(m.group(1)), -int(m.group(3) or 0))

    return sorted(versions, key=key)


def aggregated(types: list[ResourceType], core: bool) -> JSON:
    items = []
    for group, versions in sorted(_versions_by_group(types).items()):
        if (group == "") != core:
            continue
        items.append({
            "metadata": {"name": group, "creationTimestamp": None},
            "versions": [{"version": v, "freshness": "Current",
                          "resources": [_aggregated_resource(rt) for rt in
                                        sorted(versions[v], key=lambda t: t.plural)]}
                         for v in _version_order(list(versions))],
        })
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {}, "items": items}


def api_versions() -> JSON:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": "127.0.0.1"}]}


def api_group(group: str, versions: list[str]) -> JSON:
    ordered = _version_order(versions)
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered],
            "preferredVersion": {"groupVersion": f"{group}/{ordered[0]}",
                                 "version": ordered[0]}}


def api_group_list(types: list[ResourceType]) -> JSON:
    groups = []
    for group, versions in sorted(_versions_by_group(types).items()):
        if group:
            groups.append(api_group(group, list(versions)))
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


# ------------------------------------------------------------------ OpenAPI v3


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def openapi_document(group: str, version: str, types: list[ResourceType]) -> JSON:
    paths: JSON = {}
    schemas: JSON = {}
    for rt in sorted(types, key=lambda t: t.plural):
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                  {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                  {"name": "dryRun", "in": "query", "schema": {"type": "string"}}]
        base = "/" + _gv_path(group, version)
        if rt.namespaced:
            base += "/namespaces/{namespace}"
        op: JSON = {"x-kubernetes-group-version-kind": gvk, "parameters": params,
                    "responses": {"200": {"description": "OK"}}}
        paths[f"{base}/{rt.plural}"] = {"post": op}
        paths[f"{base}/{rt.plural}/{{name}}"] = {"patch": op, "put": op}
        if rt.status_subresource:
            paths[f"{base}/{rt.plural}/{{name}}/status"] = {"patch": op, "put": op}
        if rt.schema is not None:
            ref = f"{rt.group}.{rt.version}.{rt.kind}"
            schema: JSON = json.loads(json.dumps(rt.schema))
            schema["x-kubernetes-group-version-kind"] = [gvk]
            schemas[ref] = schema
    doc: JSON = {"openapi": "3.0.0",
                 "info": {"title": "sunkd Kubernetes API emulator", "version": "v1.32.4"},
                 "paths": paths}
    if schemas:
        doc["components"] = {"schemas": schemas}
    return doc


def openapi_docs(types: list[ResourceType]) -> dict[str, JSON]:
    out: dict[str, JSON] = {}
    for group, versions in _versions_by_group(types).items():
        for version, rts in versions.items():
            out[_gv_path(group, version)] = openapi_document(group, version, rts)
    return out


def openapi_index(docs: dict[str, JSON]) -> JSON:
    paths: dict[str, Any] = {}
    for path, doc in sorted(docs.items()):
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64]
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest.upper()}"}
    return {"paths": paths}
