"""Structural-schema handling for custom resources: pruning, defaulting, validation.

Reproduces the parts of `apiextensions-apiserver/pkg/apiserver/schema` that matter for
sunkd's CRD: unknown fields are pruned (or, with `fieldValidation=Strict`, rejected as
`strict decoding error: unknown field "spec.foo"`), `default`s are applied wherever the
parent object exists (structural defaulting, `schema/defaulting/algorithm.go`), and a
subset of OpenAPI v3 validation runs (type, enum, minimum/maximum, minLength/maxLength,
pattern, required, minItems/maxItems, nullable). CEL rules (`x-kubernetes-validations`)
are NOT evaluated.
"""

from __future__ import annotations

import copy
import re
from typing import Any

JSON = dict[str, Any]
Cause = tuple[str, str, str]  # (reason, field, message) as in field.ErrorList

_ROOT_META = ("apiVersion", "kind", "metadata")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune(schema: JSON, obj: Any, path: str = "", unknown: list[str] | None = None,
          root: bool = True) -> list[str]:
    """Drop fields the schema does not declare, in place; return their paths."""
    unknown = [] if unknown is None else unknown
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return unknown
    if isinstance(obj, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key in list(obj):
            if root and key in _ROOT_META:
                continue
            if isinstance(props, dict) and key in props:
                prune(props[key], obj[key], _join(path, key), unknown, False)
            elif isinstance(additional, dict):
                prune(additional, obj[key], _join(path, key), unknown, False)
            elif additional is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            elif props is not None or additional is False or schema.get("type") == "object":
                unknown.append(_join(path, key))
                del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            prune(schema["items"], item, f"{path}[{index}]", unknown, False)
    return unknown


def apply_defaults(schema: JSON, obj: Any) -> None:
    """Structural defaulting, in place: defaults apply to absent keys of existing maps."""
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(sub, obj[key])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key, value in obj.items():
                if key not in (schema.get("properties") or {}):
                    apply_defaults(additional, value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(schema["items"], item)


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float),
}


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate(schema: JSON, obj: Any, path: str = "", root: bool = True) -> list[Cause]:
    """Return field.ErrorList-style causes; empty means valid."""
    causes: list[Cause] = []
    if obj is None:
        if not schema.get("nullable") and not root:
            causes.append(("FieldValueRequired", path, "Required value"))
        return causes
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(obj, (int, str)) or isinstance(obj, bool):
            causes.append(("FieldValueTypeInvalid", path,
                           f"Invalid value: {_fmt(obj)}: must be integer or string"))
        return causes
    if kind in _TYPES:
        expected = _TYPES[kind]
        ok = isinstance(obj, expected) and not (kind in ("integer", "number")
                                                and isinstance(obj, bool))
        if kind == "integer" and isinstance(obj, float) and obj.is_integer():
            ok = True
        if not ok:
            got = {dict: "object", list: "array", str: "string", bool: "boolean",
                   int: "integer", float: "number"}.get(type(obj), type(obj).__name__)
            causes.append(("FieldValueTypeInvalid", path,
                           f'Invalid value: "{got}": {path} in body must be of type {kind}: '
                           f'"{got}"'))
            return causes
    if "enum" in schema and obj not in schema["enum"]:
        supported = ", ".join(_fmt(v) for v in schema["enum"])
        causes.append(("FieldValueNotSupported", path,
                       f"Unsupported value: {_fmt(obj)}: supported values: {supported}"))
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if "minimum" in schema and obj < schema["minimum"]:
            causes.append(("FieldValueInvalid", path,
                           f"Invalid value: {obj}: {path} in body should be greater than or "
                           f"equal to {schema['minimum']}"))
        if "maximum" in schema and obj > schema["maximum"]:
            causes.append(("FieldValueInvalid", path,
                           f"Invalid value: {obj}: {path} in body should be less than or "
                           f"equal to {schema['maximum']}"))
    if isinstance(obj, str):
        if "minLength" in schema and len(obj) < schema["minLength"]:
            causes.append(("FieldValueInvalid", path,
                           f'Invalid value: "{obj}": {path} in body should be at least '
                           f'{schema["minLength"]} chars long'))
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            causes.append(("FieldValueTooLong", path,
                           f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "pattern" in schema and not re.search(schema["pattern"], obj):
            causes.append(("FieldValueInvalid", path,
                           f'Invalid value: "{obj}": {path} in body should match '
                           f"'{schema['pattern']}'"))
    if isinstance(obj, list):
        if "minItems" in schema and len(obj) < schema["minItems"]:
            causes.append(("FieldValueInvalid", path,
                           f"Invalid value: {len(obj)}: {path} in body should have at least "
                           f"{schema['minItems']} items"))
        if "maxItems" in schema and len(obj) > schema["maxItems"]:
            causes.append(("FieldValueTooMany", path,
                           f"Too many: {len(obj)}: must have at most {schema['maxItems']} "
                           f"items"))
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(obj):
                causes += validate(schema["items"], item, f"{path}[{index}]", False)
    if isinstance(obj, dict):
        for key in schema.get("required") or []:
            if key not in obj:
                causes.append(("FieldValueRequired", _join(path, key), "Required value"))
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, value in obj.items():
            if root and key in _ROOT_META:
                continue
            if key in props:
                causes += validate(props[key], value, _join(path, key), False)
            elif isinstance(additional, dict):
                causes += validate(additional, value, _join(path, key), False)
    return causes
