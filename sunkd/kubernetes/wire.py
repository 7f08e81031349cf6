"""What sunkd reads and writes of the Kubernetes API's JSON, apart from any request:
metav1 times, resource quantities, object identities checked before they are cached or
observed (`MalformedObject`), the JSON decoder every body and watch line goes through, and
the GC pause around a bulk decode. Pure functions: the client, the informer, the
normalizers, the actuator and the lease all read objects through them."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from sunkd.domain.jsontext import maybe_beyond_64_bits


def format_time(moment: datetime) -> str:
    """metav1.Time: RFC3339 with seconds precision and `Z` (creationTimestamp, Event times)."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """metav1.MicroTime: exactly six fractional digits (Lease times, eventTime).

    `datetime.isoformat()` drops the fraction when microsecond == 0 and the API server then
    rejects the value with 400 (kubernetes/kubernetes#89156; metav1.MicroTime in apimachinery
    micro_time.go).
    """
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse metav1.Time / MicroTime (RFC3339, `Z` or offset) into an aware UTC datetime."""
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    return datetime.fromisoformat(value).astimezone(UTC)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("naive datetime: Kubernetes times must be timezone-aware")
    return moment.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(value: object) -> Decimal:
    """resource.Quantity ("500m", "2", "1Gi", "1e9") to a Decimal; malformed -> ValueError.
    A JSON NaN or Infinity (Python's json accepts both) is malformed too."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {value!r}")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as error:
        raise ValueError(f"not a quantity: {value!r}") from error
    if number.is_finite() and number and number.adjusted() > 40:
        # "1e999999999" would overflow the arithmetic below (decimal.Overflow).
        raise ValueError(f"quantity out of range: {value!r}")
    return number * _SUFFIX[match.group(2)]


class MalformedObject(ValueError):
    """An object from the API server that sunkd refuses to cache or observe: its identity
    is missing or unusable, or a field has a shape no real API server sends. `field`
    names the offending field (e.g. `metadata.name`, `spec.taints[0]`)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


# Longest name a Kubernetes object can have (a DNS subdomain, RFC 1123).
MAX_NAME_LENGTH = 253
_BAD_NAME_CHARACTERS = re.compile("[\x00-\x20\x7f-\x9f\ud800-\udfff/]")


def checked_name(value: Any, field: str, *, required: bool = True) -> str:
    """A name (or namespace) that can serve as an identity: a non-empty string of at most
    253 characters without control characters, spaces or `/`. Real API servers enforce
    stricter rules; anything else comes from a broken server, proxy or emulator, and is
    rejected rather than recorded as node "" or pool "/"."""
    if type(value) is str and 0 < len(value) <= MAX_NAME_LENGTH and \
            _BAD_NAME_CHARACTERS.search(value) is None:
        return value  # the common case, first
    if value is None or value == "":
        if required:
            raise MalformedObject(field, "missing")
        return ""
    if not isinstance(value, str):
        raise MalformedObject(field, f"not a string ({type(value).__name__})")
    if len(value) > MAX_NAME_LENGTH:
        raise MalformedObject(field, f"longer than {MAX_NAME_LENGTH} characters")
    bad = _BAD_NAME_CHARACTERS.search(value)
    if bad is not None:
        raise MalformedObject(field, f"contains the character U+{ord(bad.group()):04X}")
    return value


def checked_key(obj: Any) -> str:
    """`object_key` of an object whose identity is usable, else `MalformedObject`."""
    if not isinstance(obj, Mapping):
        raise MalformedObject("object", f"not an object ({type(obj).__name__})")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise MalformedObject("metadata", "missing or not an object")
    name = checked_name(meta.get("name"), "metadata.name")
    namespace = checked_name(meta.get("namespace"), "metadata.namespace", required=False)
    return f"{namespace}/{name}" if namespace else name


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` for namespaced objects, `name` otherwise (client-go's cache key)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    namespace = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{namespace}/{name}" if namespace else name


def resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ""
    return str(meta.get("resourceVersion") or "")


def loads(raw: bytes | str) -> Any:
    """A body or watch line as `json.loads` reads it, with JSON nested too deeply for the
    decoder (RecursionError) reported as the ValueError every other malformed body raises.

    orjson goes first: it decodes a 500-Pod LIST page about 2x faster than the stdlib,
    and a 100,000-Pod relist is most of a (re)start at scale (docs/performance.md,
    "Scale"). Whatever orjson refuses (NaN, a lone surrogate, another encoding, nesting
    deeper than 1024) or might read differently (long digit runs) goes through the
    stdlib, so the result and the error are the stdlib's (tests/unit/test_kube_json.py)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if not maybe_beyond_64_bits(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the stdlib says why, or accepts what orjson is stricter about
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


@contextlib.contextmanager
def gc_paused() -> Any:
    """Pause the cyclic GC around a bulk decode (no awaits inside but a single loop turn).

    A 50k-pod relist allocates millions of dicts; a young collection runs every threshold0
    allocations (CPython's default 700; `sunkd run` raises it, runtime/collector.py), and
    the older generations get rescanned over a growing heap, which more than doubles the
    cost of the relist. JSON trees have no reference cycles, so nothing is lost by collecting
    after the bulk work instead of during it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
