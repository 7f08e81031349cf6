"""Normalization of slurmrestd JSON into `SlurmNode`/`SlurmJob`.

Slurm's JSON comes in three families (v0.0.38; v0.0.39; v0.0.40+ with
`{set,infinite,number}` wrappers). Nothing outside this module sees raw Slurm JSON. Nodes
go through a fast path that assumes the common shapes and falls back to a checked parser
(`_checked_node`) that names the offending field; a property test checks that both agree.
The behaviours guarded against are documented where they are handled; the sources are
SchedMD's code and live captures (docs/slurm.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sunkd.domain.hostlist import HostlistError, expand
from sunkd.slurm.model import SlurmApiError, SlurmJob, SlurmNode, SlurmPayloadError

# ----------------------------------------------------------------------- sanitizing

# C0 and C1 control characters (NUL, ESC, DEL ...) and lone surrogates: a `\u0000` in a
# node comment made PostgreSQL's JSONB refuse the append, an ESC reaches
# terminals through `sunkd status`, a lone surrogate is not UTF-8. Slurm's free text
# (reasons, comments, partitions, features, job fields) has them replaced by U+FFFD
# before anything reaches the log; identifiers a node is known by (name, state, flags)
# carrying them make the payload invalid instead (`SlurmPayloadError`). Tab, CR and LF
# become a space (text stays readable on one line), everything else U+FFFD.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def _replacement(match: re.Match[str]) -> str:
    return " " if match.group() in "\t\r\n" else REPLACEMENT


def clean_text(value: str) -> str:
    """`value` with control characters and lone surrogates replaced (see above)."""
    if value.isprintable():  # one C-level scan: the common case costs ~nothing
        return value
    return _UNSAFE.sub(_replacement, value)


def _safe_identifier(value: str) -> bool:
    return value.isprintable() or _UNSAFE.search(value) is None


# ----------------------------------------------------------------------- normalizing

_NO_DEFAULT: Any = object()


def _unwrap_number(value: Any, where: str) -> float | None:
    """Plain numbers (v0.0.38/39) or `{set,infinite,number}` (v0.0.39+/40+)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SlurmPayloadError(where, f"expected a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):  # NaN/Infinity: not JSON, but Python's parser takes it
            raise SlurmPayloadError(where, f"expected a finite number, got {value!r}")
        return value
    if isinstance(value, dict):
        if value.get("infinite"):
            return math.inf
        if not value.get("set"):
            return None
        number = value.get("number")
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise SlurmPayloadError(f"{where}.number", f"expected a number, got {number!r}")
        if isinstance(number, float) and not math.isfinite(number):
            raise SlurmPayloadError(f"{where}.number", f"expected a finite number, got {number!r}")
        return number
    raise SlurmPayloadError(where, f"expected a number, got {type(value).__name__}")


def _time(value: Any, where: str) -> float | None:
    number = _unwrap_number(value, where)
    # 0 is Slurm's "never" for times (reason_changed_at=0 when no reason, v0.0.38).
    if number is None or number == 0 or number == math.inf:
        return None
    return float(number)


def _count(value: Any, where: str) -> int:
    number = _unwrap_number(value, where)
    # v0.0.36 prints `"alloc_cpus": null`; NO_VAL counts are unset, not errors.
    if number is None or number == math.inf:
        return 0
    return int(number)


def _text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise SlurmPayloadError(where, f"expected a string, got {type(value).__name__}")
    return clean_text(value) if value else None


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    """CSV string (v0.0.38 features) or array (v0.0.39+)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(clean_text(item) for item in value.split(",") if item)
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise SlurmPayloadError(f"{where}[{i}]", "expected a string")
        return tuple(clean_text(item) for item in value)
    raise SlurmPayloadError(where, f"expected a list or CSV string, got {type(value).__name__}")


_GRES_CACHE: dict[str, int] = {}
_NO_GRES = ("(null)", "N/A")  # how slurmrestd says "no GRES"


def gpu_count(gres: str | None) -> int:
    """Sum of `gpu` GRES in a gres string.

    Shapes seen in real payloads: `gpu:4`, `gpu:h100:2,gpu:h200:4`, `gpu:1(IDX:0)`,
    `gpu:h100:0(IDX:N/A)`, `gpu:4(S:0-1)`; `""` and `(null)` when none. Commas inside
    parentheses (`IDX:0,2`) do not separate items.
    """
    if not gres or gres in ("(null)", "N/A"):
        return 0
    cached = _GRES_CACHE.get(gres)
    if cached is not None:
        return cached
    total = 0
    depth = 0
    item_start = 0
    items: list[str] = []
    for i, char in enumerate(gres):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(gres[item_start:i])
            item_start = i + 1
    items.append(gres[item_start:])
    for item in items:
        item = item.split("(", 1)[0].strip()
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        last = parts[-1] if len(parts) > 1 else "1"
        if last.isdigit():
            total += int(last)
        elif len(parts) == 2:
            total += 1  # `gpu:h100` means one of that type
    if len(_GRES_CACHE) < 4096:
        _GRES_CACHE[gres] = total
    return total


class _Slow(Exception):
    """The fast path met something unusual; the checked path decides (and names it)."""


_EMPTY: frozenset[str] = frozenset()
_INF = math.inf


def _fast_time(value: Any) -> float | None:
    kind = type(value)
    if kind is int:
        return float(value) if value else None
    if value is None:
        return None
    if kind is dict:
        if value.get("set") and not value.get("infinite"):
            number = value.get("number")
            if type(number) is int:
                return float(number) if number else None
            raise _Slow
        return None
    raise _Slow


def _fast_count(value: Any) -> int:
    kind = type(value)
    if kind is int:
        return int(value)
    if value is None:
        return 0
    if kind is dict:
        if value.get("set") and not value.get("infinite"):
            number = value.get("number")
            if type(number) is int:
                return int(number)
            raise _Slow
        return 0
    raise _Slow


def _fast_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if type(value) is str:
        return value if value.isprintable() else clean_text(value)
    raise _Slow


def _fast_list(value: Any) -> tuple[str, ...]:
    kind = type(value)
    if kind is list:
        for item in value:
            if type(item) is not str or not item.isprintable():
                raise _Slow
        return tuple(value)
    if value is None or value == "":
        return ()
    if kind is str:
        if not value.isprintable():
            raise _Slow
        return tuple(item for item in value.split(",") if item)
    raise _Slow


def _fast_node(raw: Any) -> SlurmNode:
    """The common case without building error paths (bench/slurm_poll.py: the poll
    cycle must stay within 2x of json.loads at 10k nodes)."""
    if type(raw) is not dict:
        raise _Slow
    name = raw.get("name")
    state_raw = raw.get("state")
    if type(name) is not str or not name or not name.isprintable():
        raise _Slow
    if type(state_raw) is str:
        state = state_raw.upper()
        flags_raw = raw.get("state_flags")
        if flags_raw:
            if type(flags_raw) is not list:
                raise _Slow
            flag_list = flags_raw
        else:
            flag_list = []
    elif type(state_raw) is list and state_raw:
        state = state_raw[0]
        flag_list = state_raw[1:]
    else:
        raise _Slow
    if type(state) is not str or not state.isprintable():
        raise _Slow
    for flag in flag_list:  # before frozenset(): a list or dict "flag" is unhashable
        if type(flag) is not str or not flag.isprintable():
            raise _Slow
    flags = frozenset(flag_list) if flag_list else _EMPTY
    if "cpus" not in raw:
        raise _Slow
    gres = _fast_text(raw.get("gres"))
    gres_used = _fast_text(raw.get("gres_used"))
    reason = _fast_text(raw.get("reason"))
    set_by = _fast_text(raw.get("reason_set_by_user"))
    return SlurmNode(
        name,
        state,
        flags,
        reason,
        set_by if reason is not None else None,  # see _checked_node
        _fast_time(raw.get("reason_changed_at")),
        _fast_count(raw["cpus"]),
        _fast_count(raw.get("alloc_cpus")),
        gpu_count(gres) if gres else 0,
        gpu_count(gres_used) if gres_used else 0,
        _fast_list(raw.get("partitions")),
        _fast_list(raw.get("features")),
        _fast_text(raw.get("comment")),
        _fast_time(raw.get("boot_time")),
        _fast_time(raw.get("last_busy")),
        gres if gres and gres not in _NO_GRES else None,
        _fast_time(raw.get("slurmd_start_time")),
    )


def normalize_node(raw: Any, where: str = "node") -> SlurmNode:
    """One node of any family into `SlurmNode`; `SlurmPayloadError` names the field."""
    try:
        return _fast_node(raw)
    except _Slow:
        return _checked_node(raw, where)


def _checked_node(raw: Any, where: str) -> SlurmNode:
    if not isinstance(raw, dict):
        raise SlurmPayloadError(where, f"expected an object, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SlurmPayloadError(f"{where}.name", f"expected a node name, got {name!r}")
    if not _safe_identifier(name):
        raise SlurmPayloadError(f"{where}.name", f"control character in node name {name!r}")
    where = f"{where}({name})"
    state_raw = raw.get("state", _NO_DEFAULT)
    if isinstance(state_raw, str):
        # v0.0.36-38: lower-case base state plus upper-case `state_flags` (null on v0.0.36).
        state = state_raw.upper()
        flags_raw = raw.get("state_flags") or ()
        if not isinstance(flags_raw, list | tuple):
            raise SlurmPayloadError(f"{where}.state_flags", "expected a list")
        flag_list = list(flags_raw)
    elif isinstance(state_raw, list) and state_raw:
        # v0.0.39+: ["IDLE","DRAIN",...]; the base state comes first (data_parser
        # dumps NODE_STATE_BASE before the flag bits). Unknown flags (v0.0.44 EXTERNAL,
        # BLOCKED ...) are kept as they are.
        state = state_raw[0]
        if not isinstance(state, str):
            raise SlurmPayloadError(f"{where}.state[0]", "expected a string")
        flag_list = state_raw[1:]
    elif state_raw is _NO_DEFAULT:
        raise SlurmPayloadError(f"{where}.state", "missing")
    else:
        raise SlurmPayloadError(f"{where}.state", f"unexpected value {state_raw!r}")
    for flag in flag_list:  # before frozenset(): a list or dict "flag" is unhashable
        if not isinstance(flag, str):
            raise SlurmPayloadError(f"{where}.state", f"non-string flag {flag!r}")
    for word in (state, *flag_list):
        if not _safe_identifier(word):
            raise SlurmPayloadError(f"{where}.state", f"control character in {word!r}")
    flags = frozenset(flag_list)
    if "cpus" not in raw:
        raise SlurmPayloadError(f"{where}.cpus", "missing")
    partitions = raw.get("partitions")
    reason = _text(raw.get("reason"), f"{where}.reason")
    # `null` when unset on v0.0.38, `""` on v0.0.39+; 24.11 says `root` on nodes that
    # never had a reason (reason_uid 0), so a setter without a reason is dropped.
    set_by = _text(raw.get("reason_set_by_user"), f"{where}.reason_set_by_user")
    gres = _text(raw.get("gres"), f"{where}.gres")
    return SlurmNode(
        name=name,
        state=state,
        flags=flags,
        reason=reason,
        reason_set_by=set_by if reason is not None else None,
        reason_time=_time(raw.get("reason_changed_at"), f"{where}.reason_changed_at"),
        cpus=_count(raw["cpus"], f"{where}.cpus"),
        alloc_cpus=_count(raw.get("alloc_cpus"), f"{where}.alloc_cpus"),
        gpus_total=gpu_count(gres),
        gpus_used=gpu_count(_text(raw.get("gres_used"), f"{where}.gres_used")),
        # v0.0.36 has no partitions at all (a FIXME in 22.05's nodes.c).
        partitions=_string_list(partitions, f"{where}.partitions"),
        features=_string_list(raw.get("features"), f"{where}.features"),
        comment=_text(raw.get("comment"), f"{where}.comment"),
        boot_time=_time(raw.get("boot_time"), f"{where}.boot_time"),
        last_busy=_time(raw.get("last_busy"), f"{where}.last_busy"),
        gres=gres if gres and gres not in _NO_GRES else None,
        slurmd_start_time=_time(raw.get("slurmd_start_time"), f"{where}.slurmd_start_time"),
    )


def _check_errors(body: Mapping[str, Any], status: int, what: str) -> None:
    errors = body.get("errors")
    if errors:
        if not isinstance(errors, list):
            raise SlurmPayloadError("errors", "expected a list")
        raise SlurmApiError(
            f"{what}: slurmrestd reported {describe_errors(errors)}", status=status, errors=errors
        )


def describe_errors(errors: Iterable[Any]) -> str:
    parts: list[str] = []
    for item in errors:
        if isinstance(item, dict):
            text = item.get("error") or ""
            description = item.get("description") or ""
            number = item.get("error_number", item.get("errno"))
            source = item.get("source") or ""
            piece = " / ".join(p for p in (str(text), str(description)) if p)
            if number is not None:
                piece += f" (errno {number})"
            if source:
                piece += f" in {source}"
            parts.append(piece)
        else:
            parts.append(repr(item))
    return "; ".join(parts) or "an error"


def normalize_nodes(body: Any) -> list[SlurmNode]:
    """A whole `GET /nodes` body (any family) into nodes; errors[] raises."""
    if not isinstance(body, dict):
        raise SlurmPayloadError("$", f"expected an object, got {type(body).__name__}")
    _check_errors(body, 200, "GET nodes")
    nodes = body.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmPayloadError("nodes", "missing or not a list")
    out: list[SlurmNode] = []
    append = out.append
    for raw in nodes:
        try:
            append(_fast_node(raw))
        except _Slow:
            append(_checked_node(raw, f"nodes[{len(out)}]"))
    _refuse_duplicates(out)
    return out


def _refuse_duplicates(nodes: list[SlurmNode]) -> None:
    """A node listed twice (with different states, in the fault run) would alternate
    between its two descriptions every poll; which one is true is unknowable, so the
    whole answer is invalid."""
    first: dict[str, int] = {}
    for index, node in enumerate(nodes):
        seen = first.setdefault(node.name, index)
        if seen != index:
            raise SlurmPayloadError(
                f"nodes[{index}].name",
                f"duplicate node name {node.name!r} (also nodes[{seen}]): the answer is "
                "ambiguous, so the whole poll is ignored", cause="duplicate_node")


def normalize_job(raw: Any, where: str = "job") -> SlurmJob:
    if not isinstance(raw, dict):
        raise SlurmPayloadError(where, f"expected an object, got {type(raw).__name__}")
    job_id = raw.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise SlurmPayloadError(f"{where}.job_id", f"expected an integer, got {job_id!r}")
    where = f"{where}({job_id})"
    state_raw = raw.get("job_state")
    # v0.0.38/39: a string; v0.0.40+: an array (CHANGELOG 23.11.0rc1).
    state_flags: tuple[str, ...] = ()
    if isinstance(state_raw, str):
        state = clean_text(state_raw.upper())
    elif isinstance(state_raw, list) and state_raw and all(isinstance(s, str) for s in state_raw):
        state, state_flags = clean_text(state_raw[0]), tuple(clean_text(s) for s in state_raw[1:])
    else:
        raise SlurmPayloadError(f"{where}.job_state", f"unexpected value {state_raw!r}")
    partition = raw.get("partition") or ""
    if not isinstance(partition, str):
        raise SlurmPayloadError(f"{where}.partition", "expected a string")
    partition = clean_text(partition)
    nodes_raw = raw.get("nodes") or ""
    if not isinstance(nodes_raw, str):
        raise SlurmPayloadError(f"{where}.nodes", "expected a hostlist string")
    nodes_raw = clean_text(nodes_raw)
    try:
        nodes = tuple(expand(nodes_raw))
    except HostlistError as error:
        raise SlurmPayloadError(f"{where}.nodes", str(error)) from error
    required_raw = raw.get("required_nodes") or ""
    if not isinstance(required_raw, str):
        raise SlurmPayloadError(f"{where}.required_nodes", "expected a hostlist string")
    try:
        required = tuple(expand(clean_text(required_raw)))
    except HostlistError as error:
        raise SlurmPayloadError(f"{where}.required_nodes", str(error)) from error
    limit = _unwrap_number(raw.get("time_limit"), f"{where}.time_limit")
    return SlurmJob(
        job_id=job_id,
        state=state,
        state_flags=state_flags,
        partition=partition,
        nodes=nodes,
        node_count=_count(raw.get("node_count"), f"{where}.node_count"),
        # v0.0.38 prints null for UNLIMITED; v0.0.40+ {infinite:true}.
        time_limit=None if limit is None or limit == math.inf else float(limit),
        start_time=_time(raw.get("start_time"), f"{where}.start_time"),
        end_time=_time(raw.get("end_time"), f"{where}.end_time"),
        state_reason=_text(raw.get("state_reason"), f"{where}.state_reason"),
        required_nodes=required,
    )


def normalize_jobs(body: Any) -> list[SlurmJob]:
    if not isinstance(body, dict):
        raise SlurmPayloadError("$", f"expected an object, got {type(body).__name__}")
    _check_errors(body, 200, "GET jobs")
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmPayloadError("jobs", "missing or not a list")
    return [normalize_job(raw, f"jobs[{i}]") for i, raw in enumerate(jobs)]


def slurm_release(body: Mapping[str, Any]) -> str | None:
    """`meta.Slurm.release` (v0.0.38/39) or `meta.slurm.release` (v0.0.40+)."""
    meta = body.get("meta")
    if not isinstance(meta, dict):
        return None
    for key in ("slurm", "Slurm"):
        info = meta.get(key)
        if isinstance(info, dict) and isinstance(info.get("release"), str):
            return str(info["release"])
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))
