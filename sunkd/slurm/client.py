"""slurmrestd client: version negotiation, JWT auth, error handling, normalization.

sunkd has to run against every Slurm an operator may have: Debian 12's 22.05 (REST
v0.0.36-38, read-only for nodes) up to 25.11 (v0.0.41-44). Their JSON comes in three
families (v0.0.38; v0.0.39; v0.0.40+ with `{set,infinite,number}` wrappers), so this
module probes the newest version the server serves, speaks it, and normalizes every
node and job into one model (`SlurmNode`, `SlurmJob`). Nothing outside this module sees
raw Slurm JSON. The behaviours guarded against are documented where they are handled;
the sources are SchedMD's code and live captures (docs/slurm.md).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import aiohttp
import structlog

from sunkd.domain.events import SlurmNodeObserved
from sunkd.domain.hostlist import HostlistError, expand

log = structlog.get_logger(__name__)

# Newest first: negotiation takes the first one the server answers (architecture §7).
SUPPORTED_VERSIONS: tuple[str, ...] = (
    "v0.0.44",
    "v0.0.43",
    "v0.0.42",
    "v0.0.41",
    "v0.0.40",
    "v0.0.39",
    "v0.0.38",
)
# POST /slurm/vX/node/{name} first appears in v0.0.39 (Slurm 23.02); v0.0.36-38 answer 405.
FIRST_WRITABLE_VERSION = "v0.0.39"

# A stopped slurmctld makes every slurmrestd call block ~9 s before the 500 (measured
# on 22.05.8), so anything shorter than that would misreport a down controller as a
# timeout of slurmrestd itself.
DEFAULT_TIMEOUT = 20.0
DEFAULT_TOKEN_LIFESPAN = 900  # seconds; Slinky uses 15 min too
TOKEN_ENV = "SUNKD_SLURM_TOKEN"
# See SlurmRestClient._raise_for: a 22.05 "500 errno -1" slower than this is a down
# slurmctld, faster is a refused JWT.
AMBIGUOUS_500_SLOW = 4.0

__all__ = [
    "FIRST_WRITABLE_VERSION",
    "SUPPORTED_VERSIONS",
    "SlurmApiError",
    "SlurmAuthError",
    "SlurmError",
    "SlurmJob",
    "SlurmNode",
    "SlurmPayloadError",
    "SlurmRestClient",
    "SlurmTimeoutError",
    "SlurmUnavailableError",
    "mint_jwt",
    "normalize_jobs",
    "normalize_nodes",
    "version_tuple",
]


# ---------------------------------------------------------------------------- errors


class SlurmError(Exception):
    """Base of everything this client raises."""


class SlurmAuthError(SlurmError):
    """slurmrestd or slurmctld refused our identity. The message carries a hint."""


class SlurmTimeoutError(SlurmError):
    """No answer within the request timeout."""


class SlurmUnavailableError(SlurmError):
    """slurmrestd is unreachable or cannot reach slurmctld (`controller_down`)."""

    def __init__(self, message: str, *, cause: str = "controller_down") -> None:
        super().__init__(message)
        self.cause = cause


class SlurmApiError(SlurmError):
    """A request failed: non-2xx status or a non-empty `errors[]` (even in a 200)."""

    def __init__(self, message: str, *, status: int, errors: Sequence[Mapping[str, Any]] = ()):
        super().__init__(message)
        self.status = status
        self.errors = tuple(errors)

    @property
    def error_numbers(self) -> tuple[int, ...]:
        numbers: list[int] = []
        for item in self.errors:
            number = item.get("error_number", item.get("errno"))
            if isinstance(number, int):
                numbers.append(number)
        return tuple(numbers)


class SlurmPayloadError(SlurmError):
    """The server answered JSON we cannot interpret; `field` names the culprit."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"malformed slurmrestd payload at {field_path}: {problem}")
        self.field = field_path
        self.problem = problem


# ----------------------------------------------------------------------------- model


class SlurmNode(NamedTuple):
    """One Slurm node, the same whatever REST version described it.

    A NamedTuple rather than a frozen dataclass: a poll builds 10k of them and tuple
    construction is several times cheaper than frozen-dataclass __setattr__ calls.
    """

    name: str
    state: str  # base state, upper case: IDLE MIXED ALLOCATED DOWN ERROR FUTURE UNKNOWN
    flags: frozenset[str] = frozenset()  # DRAIN NOT_RESPONDING COMPLETING ...
    reason: str | None = None
    reason_set_by: str | None = None
    reason_time: float | None = None
    cpus: int = 0
    alloc_cpus: int = 0
    gpus_total: int = 0
    gpus_used: int = 0
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    comment: str | None = None
    boot_time: float | None = None
    last_busy: float | None = None

    @property
    def is_drain(self) -> bool:
        # UNDRAIN can linger in the state next to DRAIN (slurmrestd.md §5).
        return "DRAIN" in self.flags and "UNDRAIN" not in self.flags

    @property
    def is_busy(self) -> bool:
        return self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags

    @property
    def is_drained(self) -> bool:
        """DRAIN and nothing running: slurmctld's own DRAINED (node_state_string())."""
        return self.is_drain and not self.is_busy and self.alloc_cpus == 0

    @property
    def display_state(self) -> str:
        """What sinfo prints (`draining`, `drained`, `idle*` ...), for humans."""
        if self.is_drain:
            text = "draining" if self.is_busy else "drained"
        else:
            text = self.state.lower()
        return text + ("*" if "NOT_RESPONDING" in self.flags else "")

    def to_observed(self) -> SlurmNodeObserved:
        return SlurmNodeObserved(
            node=self.name,
            state=self.state,
            flags=tuple(sorted(self.flags)),
            reason=self.reason,
            reason_set_by=self.reason_set_by,
            reason_time=self.reason_time,
            cpus=self.cpus,
            alloc_cpus=self.alloc_cpus,
            gpus_total=self.gpus_total,
            gpus_used=self.gpus_used,
            partitions=self.partitions,
            features=self.features,
            comment=self.comment,
            boot_time=self.boot_time,
            last_busy=self.last_busy,
        )


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: int
    state: str  # primary state, upper case: PENDING RUNNING COMPLETING ...
    state_flags: tuple[str, ...] = ()  # v0.0.40+ extra states (REQUEUED, ...)
    partition: str = ""  # may be "a,b" for a pending job submitted to several
    nodes: tuple[str, ...] = ()  # expanded from the hostlist; empty while pending
    node_count: int = 0
    time_limit: float | None = None  # minutes; None = unlimited / unset
    start_time: float | None = None
    end_time: float | None = None
    state_reason: str | None = None

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(p for p in self.partition.split(",") if p)


# ----------------------------------------------------------------------- normalizing

_NO_DEFAULT: Any = object()


def _unwrap_number(value: Any, where: str) -> float | None:
    """Plain numbers (v0.0.38/39) or `{set,infinite,number}` (v0.0.39+/40+)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SlurmPayloadError(where, f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        return value
    if isinstance(value, dict):
        if value.get("infinite"):
            return math.inf
        if not value.get("set"):
            return None
        number = value.get("number")
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise SlurmPayloadError(f"{where}.number", f"expected a number, got {number!r}")
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
    return value or None


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    """CSV string (v0.0.38 features) or array (v0.0.39+)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(item for item in value.split(",") if item)
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise SlurmPayloadError(f"{where}[{i}]", "expected a string")
        return tuple(value)
    raise SlurmPayloadError(where, f"expected a list or CSV string, got {type(value).__name__}")


_GRES_CACHE: dict[str, int] = {}


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
        return str(value)
    raise _Slow


def _fast_list(value: Any) -> tuple[str, ...]:
    kind = type(value)
    if kind is list:
        for item in value:
            if type(item) is not str:
                raise _Slow
        return tuple(value)
    if value is None or value == "":
        return ()
    if kind is str:
        return tuple(item for item in value.split(",") if item)
    raise _Slow


def _fast_node(raw: Any) -> SlurmNode:
    """The common case without building error paths (bench/slurm_poll.py: the poll
    cycle must stay within 2x of json.loads at 10k nodes)."""
    if type(raw) is not dict:
        raise _Slow
    name = raw.get("name")
    state_raw = raw.get("state")
    if type(name) is not str or not name:
        raise _Slow
    if type(state_raw) is str:
        state = state_raw.upper()
        flags_raw = raw.get("state_flags")
        if flags_raw:
            if type(flags_raw) is not list:
                raise _Slow
            flags = frozenset(flags_raw)
        else:
            flags = _EMPTY
    elif type(state_raw) is list and state_raw:
        state = state_raw[0]
        flags = frozenset(state_raw[1:]) if len(state_raw) > 1 else _EMPTY
    else:
        raise _Slow
    if type(state) is not str:
        raise _Slow
    for flag in flags:
        if type(flag) is not str:
            raise _Slow
    if "cpus" not in raw:
        raise _Slow
    gres = _fast_text(raw.get("gres"))
    gres_used = _fast_text(raw.get("gres_used"))
    return SlurmNode(
        name,
        state,
        flags,
        _fast_text(raw.get("reason")),
        _fast_text(raw.get("reason_set_by_user")),
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
    where = f"{where}({name})"
    state_raw = raw.get("state", _NO_DEFAULT)
    if isinstance(state_raw, str):
        # v0.0.36-38: lower-case base state plus upper-case `state_flags` (null on v0.0.36).
        state = state_raw.upper()
        flags_raw = raw.get("state_flags") or ()
        if not isinstance(flags_raw, list | tuple):
            raise SlurmPayloadError(f"{where}.state_flags", "expected a list")
        flags = frozenset(flags_raw)
    elif isinstance(state_raw, list) and state_raw:
        # v0.0.39+: ["IDLE","DRAIN",...]; the base state comes first (data_parser
        # dumps NODE_STATE_BASE before the flag bits). Unknown flags (v0.0.44 EXTERNAL,
        # BLOCKED ...) are kept as they are.
        state = state_raw[0]
        if not isinstance(state, str):
            raise SlurmPayloadError(f"{where}.state[0]", "expected a string")
        flags = frozenset(state_raw[1:])
    elif state_raw is _NO_DEFAULT:
        raise SlurmPayloadError(f"{where}.state", "missing")
    else:
        raise SlurmPayloadError(f"{where}.state", f"unexpected value {state_raw!r}")
    for flag in flags:
        if not isinstance(flag, str):
            raise SlurmPayloadError(f"{where}.state", f"non-string flag {flag!r}")
    if "cpus" not in raw:
        raise SlurmPayloadError(f"{where}.cpus", "missing")
    partitions = raw.get("partitions")
    return SlurmNode(
        name=name,
        state=state,
        flags=flags,
        reason=_text(raw.get("reason"), f"{where}.reason"),
        # `null` when unset on v0.0.38, `""` on v0.0.39+.
        reason_set_by=_text(raw.get("reason_set_by_user"), f"{where}.reason_set_by_user"),
        reason_time=_time(raw.get("reason_changed_at"), f"{where}.reason_changed_at"),
        cpus=_count(raw["cpus"], f"{where}.cpus"),
        alloc_cpus=_count(raw.get("alloc_cpus"), f"{where}.alloc_cpus"),
        gpus_total=gpu_count(_text(raw.get("gres"), f"{where}.gres")),
        gpus_used=gpu_count(_text(raw.get("gres_used"), f"{where}.gres_used")),
        # v0.0.36 has no partitions at all (a FIXME in 22.05's nodes.c).
        partitions=_string_list(partitions, f"{where}.partitions"),
        features=_string_list(raw.get("features"), f"{where}.features"),
        comment=_text(raw.get("comment"), f"{where}.comment"),
        boot_time=_time(raw.get("boot_time"), f"{where}.boot_time"),
        last_busy=_time(raw.get("last_busy"), f"{where}.last_busy"),
    )


def _check_errors(body: Mapping[str, Any], status: int, what: str) -> None:
    errors = body.get("errors")
    if errors:
        if not isinstance(errors, list):
            raise SlurmPayloadError("errors", "expected a list")
        raise SlurmApiError(
            f"{what}: slurmrestd reported {_describe_errors(errors)}", status=status, errors=errors
        )


def _describe_errors(errors: Iterable[Any]) -> str:
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
    return out


def normalize_job(raw: Any, where: str = "job") -> SlurmJob:
    if not isinstance(raw, dict):
        raise SlurmPayloadError(where, f"expected an object, got {type(raw).__name__}")
    job_id = raw.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise SlurmPayloadError(f"{where}.job_id", f"expected an integer, got {job_id!r}")
    where = f"{where}({job_id})"
    state_raw = raw.get("job_state")
    # v0.0.38/39: a string; v0.0.40+: an array (CHANGELOG 23.11.0rc1).
    if isinstance(state_raw, str):
        state, state_flags = state_raw.upper(), ()
    elif isinstance(state_raw, list) and state_raw and all(isinstance(s, str) for s in state_raw):
        state, state_flags = state_raw[0], tuple(state_raw[1:])
    else:
        raise SlurmPayloadError(f"{where}.job_state", f"unexpected value {state_raw!r}")
    partition = raw.get("partition") or ""
    if not isinstance(partition, str):
        raise SlurmPayloadError(f"{where}.partition", "expected a string")
    nodes_raw = raw.get("nodes") or ""
    if not isinstance(nodes_raw, str):
        raise SlurmPayloadError(f"{where}.nodes", "expected a hostlist string")
    try:
        nodes = tuple(expand(nodes_raw))
    except HostlistError as error:
        raise SlurmPayloadError(f"{where}.nodes", str(error)) from error
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


# ------------------------------------------------------------------------------- JWT


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint_jwt(
    key: bytes, user: str, lifespan: int = DEFAULT_TOKEN_LIFESPAN, *, now: float | None = None
) -> str:
    """An HS256 token slurmctld accepts (`jwt.shtml`: claims iat, exp, sun; the key is
    the raw bytes of `jwt_hs256.key`). Same as `scontrol token`, without a subprocess."""
    issued = int(time.time() if now is None else now)
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"exp": issued + int(lifespan), "iat": issued, "sun": user}
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    signature = _b64url(hmac.new(key, signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{signature}"


def jwt_expiry(token: str) -> float | None:
    """`exp` of a JWT, without verifying it (for refresh decisions and hints only)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, int | float) else None
    except (IndexError, ValueError, AttributeError):
        return None


class _TokenSource:
    """Where the JWT comes from: a fixed token, a token file (re-read when its mtime
    changes, so an external rotator works), or minted from the key file."""

    def __init__(
        self,
        *,
        user: str,
        token: str | None,
        token_file: Path | None,
        jwt_key_file: Path | None,
        lifespan: int,
    ) -> None:
        self.user = user
        self._token = token or os.environ.get(TOKEN_ENV) or None
        self._token_file = token_file
        self._key_file = jwt_key_file
        self._lifespan = lifespan
        self._file_mtime: float | None = None
        self._file_token: str | None = None
        self._minted: str | None = None
        self._minted_at = 0.0
        if self._token:
            self.mode = "jwt-token"
        elif token_file is not None:
            self.mode = "jwt-token-file"
        elif jwt_key_file is not None:
            self.mode = "jwt-key"
        else:
            self.mode = "none"

    def current(self) -> str | None:
        if self._token:
            return self._token
        if self._token_file is not None:
            return self._read_file(self._token_file)
        if self._key_file is not None:
            # Re-mint at half the lifespan: slurmctld checks exp on every RPC, and a
            # clock skew of minutes must not make us send an expired token.
            if self._minted is None or time.time() - self._minted_at > self._lifespan / 2:
                try:
                    key = self._key_file.read_bytes()
                except OSError as error:
                    raise SlurmAuthError(
                        f"cannot read the Slurm JWT key {self._key_file}: {error.strerror}"
                    ) from error
                self._minted = mint_jwt(key, self.user, self._lifespan)
                self._minted_at = time.time()
            return self._minted
        return None

    def invalidate(self) -> None:
        """Forget cached tokens so the next request re-reads or re-mints."""
        self._minted = None
        self._file_mtime = None

    def _read_file(self, path: Path) -> str:
        try:
            mtime = path.stat().st_mtime
            if self._file_token is None or mtime != self._file_mtime:
                text = path.read_text().strip()
                # Accept `scontrol token` output verbatim: "SLURM_JWT=eyJ...".
                if text.startswith("SLURM_JWT="):
                    text = text[len("SLURM_JWT=") :]
                self._file_token = text
                self._file_mtime = mtime
        except OSError as error:
            raise SlurmAuthError(
                f"cannot read the Slurm token file {path}: {error.strerror}"
            ) from error
        return self._file_token

    def hint(self) -> str:
        token = None
        try:
            token = self.current()
        except SlurmAuthError as error:
            return str(error)
        if self.mode == "none":
            return (
                "no JWT configured: set slurm.token, slurm.token_file or slurm.jwt_key_file "
                "(TCP slurmrestd needs rest_auth/jwt), or use a unix: URL with rest_auth/local"
            )
        expiry = jwt_expiry(token) if token else None
        if expiry is not None and expiry < time.time():
            return f"the token ({self.mode}) expired {int(time.time() - expiry)} s ago"
        if self.mode == "jwt-key":
            return (
                f"the token minted from {self._key_file} for user {self.user!r} was rejected: "
                "is it the key in slurm.conf AuthAltParameters=jwt_key=, and is "
                "AuthAltTypes=auth/jwt set?"
            )
        return (
            f"the token ({self.mode}) for user {self.user!r} was rejected: expired, for another "
            "user, or signed with another key (22.05 reports all of these as HTTP 500)"
        )


# ---------------------------------------------------------------------------- client


class SlurmSettingsLike(Protocol):
    """The slice of `sunkd.runtime.config` settings.slurm this module needs (duck typed)."""

    @property
    def url(self) -> str | None: ...
    @property
    def user(self) -> str: ...
    @property
    def token(self) -> str | None: ...
    @property
    def token_file(self) -> Path | None: ...
    @property
    def jwt_key_file(self) -> Path | None: ...


@dataclass
class _Negotiated:
    version: str
    release: str | None
    raw_ping: Mapping[str, Any] = field(default_factory=dict)


class SlurmRestClient:
    """Async slurmrestd client.

    `url` is `http://host:port` (rest_auth/jwt) or `unix:/path/to/socket`
    (rest_auth/local, or jwt). Call `negotiate()` (or use `async with`) before the
    typed calls; it picks the newest served version in `SUPPORTED_VERSIONS`.
    """

    def __init__(
        self,
        url: str,
        *,
        user: str = "root",
        token: str | None = None,
        token_file: Path | None = None,
        jwt_key_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        token_lifespan: int = DEFAULT_TOKEN_LIFESPAN,
        versions: Sequence[str] = SUPPORTED_VERSIONS,
    ) -> None:
        if url.startswith("unix:"):
            self._socket_path: str | None = url[len("unix:") :]
            self._base = "http://localhost"
        elif url.startswith(("http://", "https://")):
            self._socket_path = None
            self._base = url.rstrip("/")
        else:
            raise ValueError(f"slurm url must be http://host:port or unix:/path, got {url!r}")
        self.url = url
        self.user = user
        self._tokens = _TokenSource(
            user=user,
            token=token,
            token_file=token_file,
            jwt_key_file=jwt_key_file,
            lifespan=token_lifespan,
        )
        self._timeout = timeout
        self._versions = tuple(versions)
        self._session: aiohttp.ClientSession | None = None
        self._negotiated: _Negotiated | None = None
        self.last_elapsed = 0.0

    @classmethod
    def from_settings(cls, settings: SlurmSettingsLike, **kwargs: Any) -> SlurmRestClient:
        if not settings.url:
            raise ValueError("slurm.url is not set (http://host:port or unix:/path)")
        timeout = getattr(settings, "request_timeout", None)
        if isinstance(timeout, int | float) and "timeout" not in kwargs:
            kwargs["timeout"] = float(timeout)
        return cls(
            settings.url,
            user=settings.user,
            token=settings.token,
            token_file=settings.token_file,
            jwt_key_file=settings.jwt_key_file,
            **kwargs,
        )

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> SlurmRestClient:
        await self.negotiate()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector
            if self._socket_path is not None:
                connector = aiohttp.UnixConnector(path=self._socket_path)
            else:
                connector = aiohttp.TCPConnector(limit=8)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    # ---------------------------------------------------------------- properties

    @property
    def auth_mode(self) -> str:
        """jwt-token | jwt-token-file | jwt-key | local (unix socket, no JWT) | none."""
        mode = self._tokens.mode
        if mode == "none" and self._socket_path is not None:
            return "local"
        return mode

    @property
    def version(self) -> str:
        if self._negotiated is None:
            raise SlurmError("version not negotiated yet: call negotiate() first")
        return self._negotiated.version

    @property
    def slurm_release(self) -> str | None:
        return self._negotiated.release if self._negotiated else None

    @property
    def can_update_nodes(self) -> bool:
        """REST node update exists from v0.0.39 (Slurm 23.02) on."""
        return version_tuple(self.version) >= version_tuple(FIRST_WRITABLE_VERSION)

    # ---------------------------------------------------------------- transport

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._tokens.current()
        if token:
            # 22.05 needs both headers (token alone -> 401); 23.02+ accepts both too.
            headers["X-SLURM-USER-NAME"] = self.user
            headers["X-SLURM-USER-TOKEN"] = token
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        allow_404: bool = False,
    ) -> tuple[int, Any]:
        """Raw request; returns (status, parsed JSON or text); `last_elapsed` keeps its
        duration. Maps transport failures
        and auth failures to typed errors; leaves other statuses to the caller."""
        session = self._get_session()
        headers = self._headers()
        data: bytes | None = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        url = self._base + path
        started = time.monotonic()
        for attempt in (1, 2):
            try:
                async with session.request(method, url, headers=headers, data=data) as response:
                    raw = await response.read()
                    status = response.status
                    content_type = response.content_type
                self.last_elapsed = time.monotonic() - started
                break
            except TimeoutError as error:
                raise SlurmTimeoutError(
                    f"{method} {path}: no answer from slurmrestd at {self.url} within "
                    f"{self._timeout:.0f} s"
                ) from error
            except aiohttp.ServerDisconnectedError as error:
                # slurmrestd closes keep-alive connections after errors and after 5 s
                # idle (http.c DEFAULT_KEEP_ALIVE); retry once on a fresh connection.
                if attempt == 2:
                    raise SlurmUnavailableError(
                        f"{method} {path}: slurmrestd at {self.url} closed the connection",
                        cause="unreachable",
                    ) from error
            except aiohttp.ClientConnectionError as error:
                raise SlurmUnavailableError(
                    f"{method} {path}: cannot connect to slurmrestd at {self.url}: {error}",
                    cause="unreachable",
                ) from error
        if status in (401, 403, 511):
            # 401 text/plain "Authentication failure" (missing/invalid headers);
            # 511 (24.11+) when slurmctld rejects the token.
            self._tokens.invalidate()
            raise SlurmAuthError(
                f"{method} {path}: slurmrestd answered {status} "
                f"({raw[:80].decode(errors='replace').strip()}); {self._tokens.hint()}"
            )
        if status == 404 and allow_404:
            return status, None
        parsed: Any
        if content_type == "application/json" or raw[:1] in (b"{", b"["):
            try:
                parsed = json.loads(raw)
            except ValueError as error:
                raise SlurmPayloadError(f"{method} {path}", f"invalid JSON: {error}") from error
        else:
            parsed = raw.decode(errors="replace")
        return status, parsed

    def _raise_for(
        self, method: str, path: str, status: int, parsed: Any, elapsed: float = 0.0
    ) -> None:
        """Turn a non-success answer into the most precise error we can."""
        errors = parsed.get("errors") if isinstance(parsed, dict) else None
        errors = errors if isinstance(errors, list) else []
        text = _describe_errors(errors) if errors else str(parsed)[:200]
        if status in (502, 504):
            # 24.11+: 502 = slurmctld communication error, 504 = timeout.
            raise SlurmUnavailableError(
                f"{method} {path}: slurmctld unreachable ({status}: {text})"
            )
        if status >= 500 and errors:
            numbers = {e.get("error_number", e.get("errno")) for e in errors if isinstance(e, dict)}
            # Slurm errnos 1000-1099 are SLURM_COMMUNICATIONS_* / SLURMCTLD_COMMUNICATIONS_*.
            if any(isinstance(n, int) and 1000 <= n < 1100 for n in numbers):
                if 1007 in numbers:  # SLURM_PROTOCOL_AUTHENTICATION_ERROR
                    self._tokens.invalidate()
                    raise SlurmAuthError(f"{method} {path}: {text}; {self._tokens.hint()}")
                raise SlurmUnavailableError(f"{method} {path}: slurmctld unreachable ({text})")
            if numbers == {-1}:
                # 22.05 answers a bad or expired JWT *and* a stopped slurmctld with the
                # same 500 "Unspecified error" (errno -1); only latency differs: the JWT
                # is refused at once, a down slurmctld costs ~9 s of connect retries
                # (measured on 22.05.8; slurmctld logs "jwt_decode failure").
                if elapsed >= AMBIGUOUS_500_SLOW or self._tokens.mode == "none":
                    raise SlurmUnavailableError(
                        f"{method} {path}: slurmctld not answering ({text}, after {elapsed:.1f} s)"
                    )
                self._tokens.invalidate()
                raise SlurmAuthError(
                    f"{method} {path}: slurmrestd answered 500 ({text}) at once; "
                    f"{self._tokens.hint()}"
                )
        raise SlurmApiError(f"{method} {path}: HTTP {status}: {text}", status=status, errors=errors)

    async def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """A versioned call (`path` relative to /slurm/vX/); errors[] and non-2xx raise."""
        full = f"/slurm/{self.version}/{path.lstrip('/')}"
        status, parsed = await self.request(method, full, body=body)
        if status >= 300:
            self._raise_for(method, full, status, parsed, self.last_elapsed)
        if not isinstance(parsed, dict):
            raise SlurmPayloadError(f"{method} {full}", "expected a JSON object")
        if parsed.get("errors"):
            # HTTP 200 is not success: 24.11 answers GET node/<missing> with 200 + errors[].
            self._raise_for(
                method, full, status if status >= 400 else 500, parsed, self.last_elapsed
            )
        return parsed

    # ---------------------------------------------------------------- API

    async def negotiate(self) -> str:
        """Probe `GET /slurm/vX/ping` newest first; 404 = not served (Slurm-web does the
        same). The first version that answers anything else wins."""
        if self._negotiated is not None:
            return self._negotiated.version
        tried: list[str] = []
        for version in self._versions:
            path = f"/slurm/{version}/ping"
            status, parsed = await self.request("GET", path, allow_404=True)
            if status == 404:
                tried.append(version)
                continue
            if status >= 300 or (isinstance(parsed, dict) and parsed.get("errors")):
                self._raise_for(
                    "GET", path, status if status >= 300 else 500, parsed, self.last_elapsed
                )
            if not isinstance(parsed, dict):
                raise SlurmPayloadError(f"GET {path}", "expected a JSON object")
            self._negotiated = _Negotiated(version, slurm_release(parsed), parsed)
            log.info(
                "slurmrestd.negotiated",
                url=self.url,
                version=version,
                release=self._negotiated.release,
                auth=self.auth_mode,
            )
            return version
        raise SlurmError(
            f"slurmrestd at {self.url} serves none of {', '.join(tried)}: Slurm older than "
            "22.05, or slurmrestd started without these openapi plugins (-s)"
        )

    async def ping(self) -> Mapping[str, Any]:
        result: Mapping[str, Any] = await self.call("GET", "ping")
        return result

    async def get_nodes_raw(self) -> Any:
        # Never `update_time`: 304-empty or HTTP 500 on every release before 26.05.3.
        return await self.call("GET", "nodes")

    async def get_nodes(self) -> list[SlurmNode]:
        return normalize_nodes(await self.get_nodes_raw())

    async def get_node(self, name: str) -> SlurmNode:
        """Single-node GET. Its allocation data can be stale on 22.05 (slurm-lab §5);
        use it only for drain flag and reason, which are current."""
        body = await self.call("GET", f"node/{name}")
        nodes = normalize_nodes(body)
        for node in nodes:
            if node.name == name:
                return node
        raise SlurmApiError(f"GET node/{name}: node not in the answer", status=404)

    async def get_jobs(self) -> list[SlurmJob]:
        return normalize_jobs(await self.call("GET", "jobs"))

    async def update_node(self, name: str, *, state: str, reason: str | None = None) -> None:
        """POST node/{name} (v0.0.39+). `state` is DRAIN, RESUME, UNDRAIN ..."""
        if not self.can_update_nodes:
            raise SlurmError(
                f"slurmrestd {self.version} cannot update nodes (needs {FIRST_WRITABLE_VERSION}+)"
            )
        body: dict[str, Any] = {"state": [state]}
        if reason is not None:
            body["reason"] = reason
        await self.call("POST", f"node/{name}", body)


async def gather_nodes_and_jobs(client: SlurmRestClient) -> tuple[list[SlurmNode], list[SlurmJob]]:
    """Both collections, fetched concurrently (each GET is two slurmctld RPCs)."""
    nodes, jobs = await asyncio.gather(client.get_nodes(), client.get_jobs())
    return nodes, jobs
