"""Server-side printing: `meta.k8s.io/v1 Table` responses.

kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` for every
human-readable `get` and prints the cells verbatim, so ages must already be strings like
`5m` (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`). Built-in column sets follow
`pkg/printers/internalversion/printers.go`; custom resources use the CRD's
`additionalPrinterColumns` (`apiextensions-apiserver/pkg/registry/customresource/
tableconvertor`), or a default `Age` column when there are none.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from .resources import JSON, Column, ResourceType

NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds_f: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    seconds = int(seconds_f)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y" if dy == 0 else f"{years}y{dy}d"
    return f"{hours // 24 // 365}y"


def age(value: Any) -> str:
    when = parse_time(value)
    if when is None:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - when).total_seconds())


def age_column(description: str = "") -> Column:
    return Column(
        "Age", "string",
        description or "CreationTimestamp is a timestamp representing the server time when "
        "this object was created.",
        value=lambda obj: age((obj.get("metadata") or {}).get("creationTimestamp")),
    )


# ------------------------------------------------------------------ simple JSONPath


_TOKEN = re.compile(
    r"\.([A-Za-z0-9_\-$/]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.]+)==[\"']([^\"']*)[\"']\)\]"
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The subset of kubectl JSONPath that printer columns use in practice:
    `.a.b`, `.a[0]`, and `.a[?(@.type=="Ready")].status`."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    current: list[Any] = [obj]
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if not match:
            return []
        pos = match.end()
        nxt: list[Any] = []
        for node in current:
            if match.group(1) is not None:
                if isinstance(node, dict) and match.group(1) in node:
                    nxt.append(node[match.group(1)])
            elif match.group(2) is not None:
                index = int(match.group(2))
                if isinstance(node, list) and index < len(node):
                    nxt.append(node[index])
            elif isinstance(node, list):
                field_path, want = match.group(3), match.group(4)
                for element in node:
                    found = jsonpath(element, "." + field_path)
                    if found and str(found[0]) == want:
                        nxt.append(element)
        current = nxt
    return current


def crd_column(spec: JSON) -> Column:
    path = str(spec.get("jsonPath", ""))
    kind = str(spec.get("type", "string"))

    def value(obj: JSON) -> Any:
        found = jsonpath(obj, path)
        if not found:
            return None
        item = found[0]
        if kind == "date":
            return age(item)
        if isinstance(item, (dict, list)):
            return json.dumps(item, separators=(",", ":"))
        if kind == "string":
            return str(item) if not isinstance(item, bool) else str(item).lower()
        return item

    return Column(
        name=str(spec.get("name", path)),
        type="string" if kind == "date" else kind,
        description=str(spec.get("description")
                        or f"Custom resource definition column (in JSONPath format): {path}"),
        priority=int(spec.get("priority", 0) or 0),
        format=str(spec.get("format", "") or ""),
        value=value,
    )


# ------------------------------------------------------------------ table assembly


def partial_metadata(obj: JSON) -> JSON:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {})}


def columns_for(rt: ResourceType) -> list[Column]:
    return rt.columns or [age_column()]


def build_table(rt: ResourceType, items: list[JSON], resource_version: str,
                include_object: str = "Metadata", continue_token: str = "",
                headers: bool = True) -> JSON:
    columns = columns_for(rt)
    rows = []
    for obj in items:
        cells: list[Any] = [(obj.get("metadata") or {}).get("name", "")] \
            if rt.name_column else []
        cells.extend(column.value(obj) for column in columns)
        row: JSON = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = partial_metadata(obj)
        rows.append(row)
    meta: JSON = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    definitions = [{"name": "Name", "type": "string", "format": "name",
                    "description": NAME_DESCRIPTION, "priority": 0}] if rt.name_column else []
    definitions += [{"name": c.name, "type": c.type, "format": c.format,
                     "description": c.description, "priority": c.priority} for c in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "columnDefinitions": definitions if headers else [], "rows": rows}
