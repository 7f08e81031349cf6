"""The JSON codec of the event log's payloads (`sunkd.domain.events`).

Serialization is a small, explicit codec over dataclass fields (str, int, float,
bool, None, tuples and nested dataclasses) instead of a general library: payloads
stay plain frozen dataclasses that mypy checks, and the JSON shape is ours to keep
stable. Encoders and decoders are built once per class from the dataclasses' type
hints: encoding is on the append hot path (bench/eventlog.py), decoding on every
replay.

Forward compatibility is a safety property (see `events`): unknown kinds decode to
`UnknownPayload`, unknown fields of known kinds are kept in `extra`, and both re-encode
byte-for-byte equivalently.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Union, get_args, get_origin

from sunkd.domain.events import (
    PAYLOAD_TYPES,
    VERSION_KEY,
    EventDecodeError,
    NodeJobEnd,
    Payload,
    SlurmDemandObserved,
    UnknownPayload,
)

_HINTS_CACHE: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS_CACHE.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS_CACHE[cls] = hints
    return hints


_PRIMITIVES = (str, int, float, bool, type(None))
_OPTIONAL_STR: Any = str | None
_STR_TUPLE: Any = tuple[str, ...]
# Per dataclass: (field name, how to encode it) with "how" one of
#   None (a JSON primitive, copied as is), "tuple" (a tuple of primitives -> list) or
#   a callable for nested dataclasses / tuples of them. Built once per class: encoding
#   is on the append hot path (bench/eventlog.py).
_ENCODERS: dict[type, list[tuple[str, Any]]] = {}


def _field_encoder(hint: Any) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(hint) if option is not type(None)]
        if all(option in _PRIMITIVES for option in options):
            return None
        return _encode_value
    if origin is tuple:
        item = get_args(hint)[0]
        return "tuple" if item in _PRIMITIVES else _encode_value
    if hint in _PRIMITIVES:
        return None
    return _encode_value


def _encoder_for(cls: type) -> list[tuple[str, Any]]:
    plan = _ENCODERS.get(cls)
    if plan is None:
        hints = _hints(cls)
        plan = [(f.name, _field_encoder(hints[f.name]))
                for f in dataclasses.fields(cls) if f.name != "extra"]
        _ENCODERS[cls] = plan
    return plan


_COMPILED: dict[tuple[type, bool], Callable[[Any], dict[str, Any]]] = {}


def _compile_encoder(cls: type, with_version: bool) -> Callable[[Any], dict[str, Any]]:
    """A function building the JSON object of one dataclass type, generated from its
    field plan: one dict display instead of a loop of getattr calls (about 4x faster
    on the append hot path). Field names are Python identifiers, so the generated
    source is safe by construction."""
    namespace: dict[str, Any] = {}
    lines = ["def encode(value):", "    body = {"]
    if with_version:
        lines.append(f"        {VERSION_KEY!r}: {cls.VERSION!r},")  # type: ignore[attr-defined]
    # A class's OMIT_DEFAULTS fields are written only when not at their (primitive)
    # default; a reader takes a missing field as its default.
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    omit = set(getattr(cls, "OMIT_DEFAULTS", ()))
    omitted: list[tuple[str, str, str]] = []
    for index, (name, how) in enumerate(_encoder_for(cls)):
        if how is None:
            expression = f"value.{name}"
        elif how == "tuple":
            expression = f"list(value.{name})"
        else:
            namespace[f"how{index}"] = how
            expression = f"how{index}(value.{name})"
        if name in omit:
            default = defaults[name]
            assert default is None or type(default) in (str, int, float, bool), (cls, name)
            omitted.append((name, repr(default), expression))
            continue
        lines.append(f"        {name!r}: {expression},")
    lines.append("    }")
    for name, literal, expression in omitted:
        lines += [f"    if value.{name} != {literal}:", f"        body[{name!r}] = {expression}"]
    if any(f.name == "extra" for f in dataclasses.fields(cls)):
        # A newer writer's fields (and version) win, so re-encoding never downgrades.
        lines += ["    extra = value.extra", "    if extra:", "        body.update(extra)"]
    lines.append("    return body")
    exec("\n".join(lines), namespace)  # generated from dataclass field names only
    encoder: Callable[[Any], dict[str, Any]] = namespace["encode"]
    return encoder


def _encode_dataclass(value: Any, with_version: bool = False) -> dict[str, Any]:
    key = (type(value), with_version)
    encoder = _COMPILED.get(key)
    if encoder is None:
        encoder = _COMPILED[key] = _compile_encoder(type(value), with_version)
    return encoder(value)


def _encode_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode_dataclass(value)
    if isinstance(value, tuple):
        return [_encode_value(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _encode_value(v) for k, v in value.items()}
    return value


def _decode_value(hint: Any, raw: Any, where: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if raw is None and type(None) in options:
            return None
        last_error: Exception | None = None
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode_value(option, raw, where)
            except EventDecodeError as error:
                last_error = error
        raise EventDecodeError(f"{where}: {raw!r} matches none of {hint}") from last_error
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            raise EventDecodeError(f"{where}: expected a list, got {type(raw).__name__}")
        item_hint = get_args(hint)[0]
        return tuple(_decode_value(item_hint, item, f"{where}[]") for item in raw)
    if origin is not None and origin in (Mapping, dict):
        if not isinstance(raw, dict):
            raise EventDecodeError(f"{where}: expected an object")
        return dict(raw)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(raw, dict):
            raise EventDecodeError(f"{where}: expected an object, got {type(raw).__name__}")
        return _decode_dataclass(hint, raw, where)
    if hint is Any:
        return raw
    if hint is float:
        # JSON writes 3.0 as 3.0 but other producers may write 3; accept ints, not bools.
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise EventDecodeError(f"{where}: expected a number, got {raw!r}")
        return float(raw)
    if hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise EventDecodeError(f"{where}: expected an integer, got {raw!r}")
        return raw
    if hint is bool:
        if not isinstance(raw, bool):
            raise EventDecodeError(f"{where}: expected true/false, got {raw!r}")
        return raw
    if hint is str:
        if not isinstance(raw, str):
            raise EventDecodeError(f"{where}: expected a string, got {raw!r}")
        return _short(str(raw))
    raise EventDecodeError(f"{where}: unsupported type {hint!r}")


_DECODERS: dict[type, tuple[dict[str, Any], bool]] = {}


def _decoder_for(cls: type) -> tuple[dict[str, Any], bool]:
    """Per dataclass: field name -> type hint, and whether it keeps `extra`."""
    plan = _DECODERS.get(cls)
    if plan is None:
        hints = _hints(cls)
        fields = {f.name: hints[f.name] for f in dataclasses.fields(cls)
                  if f.init and f.name != "extra"}
        plan = (fields, any(f.name == "extra" for f in dataclasses.fields(cls)))
        _DECODERS[cls] = plan
    return plan


# Short strings of a decoded payload are interned: the fold keeps the latest observation of
# every node, and the same few values (node, pool, partition and state names, namespaces,
# phases) recur in all of them; a JSON decoder makes a new copy each time (the
# fold's memory is per node, not per event). Interned strings are freed like any other.
_INTERN_UP_TO = 64


def _short(text: str) -> str:
    return sys.intern(text) if len(text) <= _INTERN_UP_TO else text


def _decode_fast(hint: Any, raw: Any, where: str) -> Any:
    # Hot path for the common, exactly-typed cases; everything else is checked fully.
    if hint is str and type(raw) is str:
        return _short(raw)
    if hint is int and type(raw) is int:
        return raw
    if hint is bool and type(raw) is bool:
        return raw
    if hint == _OPTIONAL_STR and (raw is None or type(raw) is str):
        return raw if raw is None else _short(raw)
    if hint == _STR_TUPLE and type(raw) is list and all(type(item) is str for item in raw):
        return tuple(map(_short, raw))
    return _decode_value(hint, raw, where)


def _decode_dataclass(cls: type, raw: Mapping[str, Any], where: str) -> Any:
    fields, has_extra = _decoder_for(cls)
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        hint = fields.get(key)
        if hint is not None:
            known[key] = _decode_fast(hint, value, where + "." + key)
        elif key != VERSION_KEY:
            extra[key] = value
    if extra and not has_extra:
        # Nested objects have no `extra`; a newer writer's field there cannot be kept
        # typed, so refuse loudly rather than silently drop it.
        raise EventDecodeError(f"{where}: unknown fields {sorted(extra)}")
    if has_extra:
        known["extra"] = extra
    return cls(**known)


def encode_payload(payload: Payload) -> dict[str, Any]:
    """The JSON object stored for a payload (includes the schema version)."""
    if isinstance(payload, UnknownPayload):
        return dict(payload.data)
    return _encode_dataclass(payload, with_version=True)


def decode_payload(kind: str, body: Mapping[str, Any]) -> Payload:
    """Decode a stored payload; unknown kinds and fields are kept, not dropped.

    A payload of a known kind written with a *newer* schema version that cannot be
    decoded with this version's types is kept as `UnknownPayload` too: a newer sunkd
    may have changed a field's meaning, and passing it through is safer than guessing.
    A payload that claims this or an older version and still does not decode is a
    corrupt row and raises `EventDecodeError`.
    """
    cls = PAYLOAD_TYPES.get(kind)
    if cls is None:
        return UnknownPayload(unknown_kind=kind, data=dict(body))
    version = body.get(VERSION_KEY, 1)
    try:
        payload: Payload = _decode_dataclass(cls, body, kind)
    except EventDecodeError:
        if isinstance(version, int) and version > cls.VERSION:
            return UnknownPayload(unknown_kind=kind, data=dict(body))
        raise
    if isinstance(version, int) and version > cls.VERSION:
        # Keep the writer's version so re-encoding does not downgrade the row.
        payload = dataclasses.replace(payload, extra={**payload.extra, VERSION_KEY: version})
    return payload


def payload_to_json(payload: Payload) -> str:
    return json.dumps(encode_payload(payload), separators=(",", ":"), sort_keys=True)


def payload_from_json(kind: str, text: str | bytes) -> Payload:
    body = json.loads(text)
    if not isinstance(body, dict):
        raise EventDecodeError(f"{kind}: payload is not a JSON object")
    return decode_payload(kind, body)


LEGACY_NODE_JOB_ENDS = "node_job_ends"


def legacy_node_job_ends(demand: SlurmDemandObserved) -> tuple[NodeJobEnd, ...]:
    """The per-node job ends an old-format `slurm.demand.observed` carried (empty for a
    current one). Decoded on read: such rows are only in logs older than that move."""
    raw = demand.extra.get(LEGACY_NODE_JOB_ENDS)
    if not raw:
        return ()
    try:
        ends: tuple[NodeJobEnd, ...] = _decode_value(
            tuple[NodeJobEnd, ...], raw, f"{SlurmDemandObserved.KIND}.{LEGACY_NODE_JOB_ENDS}")
    except EventDecodeError:
        # Ends only order lend candidates (soonest first); a malformed old row must not
        # stop the policy, and without ends a node simply sorts last among busy ones.
        return ()
    return ends
