"""The three PATCH flavours the apiserver accepts for JSON bodies.

* JSON merge patch (RFC 7386, `application/merge-patch+json`): maps merge, `null`
  deletes, lists are replaced wholesale.
* JSON patch (RFC 6902, `application/json-patch+json`): add/remove/replace/move/copy/test.
  As in `k8s.io/apiserver/pkg/endpoints/handlers/patch.go` (applyJSPatch), a body that does
  not decode is 400, more than 10000 operations is 413, and an op that fails to apply
  (including a failed `test`) is 422 Invalid.
* Strategic merge patch (`application/strategic-merge-patch+json`,
  `k8s.io/apimachinery/pkg/util/strategicpatch`): a merge patch, except that lists whose Go
  type declares `patchStrategy:"merge"` merge element-wise by their `patchMergeKey` (or as
  a set, for primitive lists such as `metadata.finalizers`). Atomic lists (e.g.
  `NodeSpec.Taints`, `+listType=atomic`) are replaced. Directives implemented:
  `$patch: replace|delete|merge`, `$retainKeys`, `$setElementOrder/<f>`,
  `$deleteFromPrimitiveList/<f>`; any other `$` key is refused with 400 so nothing passes
  silently.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .errors import KubeAPIError, bad_request

JSON = dict[str, Any]
# Path of map keys from the object root, "*" standing for "each element of a list".
MergeKeys = Mapping[tuple[str, ...], str | None]  # None: merge primitive list as a set

MAX_JSON_PATCH_OPERATIONS = 10000


# ------------------------------------------------------------------ RFC 7386 merge patch


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: JSON = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ------------------------------------------------------------------ RFC 6902 JSON patch


def _invalid_patch(message: str) -> KubeAPIError:
    # patch.go applyJSPatch: errors.NewGenericServerResponse(422, ... Invalid ...)
    return KubeAPIError(422, "Invalid",
                        f"the server rejected our request due to an error in our request: "
                        f"{message}", {})


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise _invalid_patch(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str]) -> tuple[Any, str]:
    node = doc
    for token in tokens[:-1]:
        node = _child(node, token)
    return node, tokens[-1]


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise _invalid_patch(f"path component {token!r} not found")
        return node[token]
    if isinstance(node, list):
        index = _index(node, token, allow_end=False)
        return node[index]
    raise _invalid_patch(f"cannot descend into {type(node).__name__} at {token!r}")


def _index(node: list[Any], token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(node)
    if not token.isdigit():
        raise _invalid_patch(f"invalid array index {token!r}")
    index = int(token)
    limit = len(node) if allow_end else len(node) - 1
    if index > limit:
        raise _invalid_patch(f"array index {index} out of bounds")
    return index


def _get(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        node = _child(node, token)
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return copy.deepcopy(value)
    parent, last = _resolve_parent(doc, tokens)
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), copy.deepcopy(value))
    else:
        raise _invalid_patch("add target is not a container")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise _invalid_patch("cannot remove the whole document")
    parent, last = _resolve_parent(doc, tokens)
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid_patch(f"unable to remove nonexistent key: {last}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise _invalid_patch("remove target is not a container")
    return doc


def json_patch(target: JSON, operations: Any) -> JSON:
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    if len(operations) > MAX_JSON_PATCH_OPERATIONS:
        raise KubeAPIError(413, "RequestEntityTooLarge",
                           f"The allowed maximum operations in a JSON patch is "
                           f"{MAX_JSON_PATCH_OPERATIONS}, got {len(operations)}", {})
    doc: Any = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op:
            raise bad_request("invalid JSON patch operation")
        kind = op["op"]
        tokens = _pointer(op.get("path"))
        if kind == "add":
            doc = _add(doc, tokens, op.get("value"))
        elif kind == "remove":
            doc = _remove(doc, tokens)
        elif kind == "replace":
            _get(doc, tokens)  # must exist
            if not tokens:
                doc = copy.deepcopy(op.get("value"))
            else:
                parent, last = _resolve_parent(doc, tokens)
                if isinstance(parent, list):
                    parent[_index(parent, last, allow_end=False)] = copy.deepcopy(op.get("value"))
                else:
                    parent[last] = copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, tokens, value)
        elif kind == "test":
            actual = _get(doc, tokens)
            if actual != op.get("value"):
                raise _invalid_patch(f"testing value {op.get('path')} failed: test failed")
        else:
            raise _invalid_patch(f"Unexpected kind: {kind}")
    if not isinstance(doc, dict):
        raise _invalid_patch("patch result is not an object")
    return doc


# ------------------------------------------------------------------ strategic merge patch


def strategic_merge_patch(target: JSON, patch: Any, merge_keys: MergeKeys) -> JSON:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch body must be a JSON object")
    result = _smp_map(copy.deepcopy(target), patch, (), merge_keys)
    assert isinstance(result, dict)
    return result


def _smp_map(original: Any, patch: JSON, path: tuple[str, ...], keys: MergeKeys) -> Any:
    original = original if isinstance(original, dict) else {}
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: v for k, v in copy.deepcopy(patch).items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive}")
    retain = patch.get("$retainKeys")
    result = dict(original)
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = list(value or [])
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            remove = list(value or [])
            result[field] = [v for v in result.get(field) or [] if v not in remove]
            continue
        if key.startswith("$"):
            raise bad_request(f"unsupported strategic merge patch directive {key!r}")
        child = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _smp_map(result.get(key), value, child, keys)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and child in keys:
            result[key] = _smp_list(result.get(key), value, child, keys, keys[child])
        else:
            result[key] = copy.deepcopy(value)
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _apply_order(result[field], order, keys.get((*path, field)))
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _smp_list(original: Any, patch: list[Any], path: tuple[str, ...], keys: MergeKeys,
              merge_key: str | None) -> list[Any]:
    current: list[Any] = list(original) if isinstance(original, list) else []
    if merge_key is None:  # primitive set merge (e.g. metadata.finalizers)
        for item in patch:
            if isinstance(item, dict) and item.get("$patch") == "replace":
                return []
            if item not in current:
                current.append(copy.deepcopy(item))
        return current
    elem_path = (*path, "*")
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(f"expected a map with merge key {merge_key!r} in list {path[-1]}")
        if item.get("$patch") == "replace":
            return [copy.deepcopy({k: v for k, v in i.items() if k != "$patch"})
                    for i in patch if isinstance(i, dict) and i.get("$patch") != "replace"]
        if merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        match = next((i for i, e in enumerate(current)
                      if isinstance(e, dict) and e.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if match is not None:
                del current[match]
            continue
        if match is None:
            clean = {k: v for k, v in item.items() if not k.startswith("$")}
            current.append(_smp_map({}, clean, elem_path, keys))
        else:
            current[match] = _smp_map(current[match], item, elem_path, keys)
    return current


def _apply_order(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        if merge_key and isinstance(item, dict):
            return item.get(merge_key)
        return item

    wanted = [ident(o) for o in order]
    ordered = sorted(
        items, key=lambda i: wanted.index(ident(i)) if ident(i) in wanted else len(wanted)
    )
    return ordered
