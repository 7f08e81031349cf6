"""GPU GRES for a Slurm node, from its Kubernetes Node: count, type and config lines.

The NVIDIA device plugin advertises `nvidia.com/gpu` in a Node's allocatable, and GPU
feature discovery labels the Node with `nvidia.com/gpu.product` (`NVIDIA-A100-SXM4-80GB`).
Slurm wants the same facts as `Gres=gpu:TYPE:N` on the node and a gres.conf line, and
reports them back as `gpu:TYPE:N(S:0-1)`. Pure functions; a malformed count is an error,
never zero (what sunkd cannot read is unknown, not none).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GPU_PRODUCT_LABEL", "GPU_RESOURCE", "UNKNOWN_PREFIX", "Gres", "GresError",
           "expected_gres", "gpu_type", "gres_conf_line", "gres_from_node", "gres_matches",
           "gres_problem", "node_gres", "parse_gres"]

GPU_RESOURCE = "nvidia.com/gpu"  # extended resource of the NVIDIA device plugin
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery
AUTODETECT_SINCE = (24, 11)  # gres.conf AutoDetect=nvidia (NVML-free) used from here on
_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_COUNT = re.compile(r"[0-9]{1,9}")
# One entry of Slurm's GRES string: name[:type][:count][(S:sockets|IDX:...)]
_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[^:(,]+))?(?::(?P<count>\d+))?"
                    r"(?:\([^)]*\))?")


UNKNOWN_PREFIX = "unknown: "  # an expectation that could not be read (never "none")


class GresError(ValueError):
    """A GPU count or type that cannot be read."""


@dataclass(frozen=True, slots=True)
class Gres:
    count: int = 0
    type: str = ""  # "" when the product is unknown: `gpu:N`

    def __str__(self) -> str:
        return node_gres(self)


def gpu_type(product: str, type_map: Mapping[str, str] | None = None) -> str:
    """`NVIDIA-A100-SXM4-80GB` -> `nvidia_a100_sxm4_80gb`; `type_map` maps the product
    label (as is, or normalised) to the type operators use (`a100`)."""
    normal = re.sub(r"[^a-z0-9]", "_", product.strip().lower())
    mapped = (type_map or {}).get(product.strip()) or (type_map or {}).get(normal)
    chosen = mapped if mapped is not None else normal
    if chosen and not _TYPE.fullmatch(chosen):
        raise GresError(f"GPU type {chosen!r}: letters, digits, '_', '.', '-' only, "
                        "at most 64")
    return chosen


def gres_from_node(obj: Mapping[str, Any], type_map: Mapping[str, str] | None = None
                   ) -> Gres:
    """Count from `status.allocatable["nvidia.com/gpu"]` (absent: 0), type from the
    product label. Raises GresError on a count that is not a whole number."""
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or {}
    raw = allocatable.get(GPU_RESOURCE) if isinstance(allocatable, Mapping) else None
    if raw is None:
        return Gres()
    text = str(raw).strip()
    if not _COUNT.fullmatch(text):
        raise GresError(f"allocatable {GPU_RESOURCE} is {text!r}, not a whole number")
    count = int(text)
    if count == 0:
        return Gres()
    labels = (obj.get("metadata") or {}).get("labels") or {}
    product = str(labels.get(GPU_PRODUCT_LABEL) or "")
    return Gres(count, gpu_type(product, type_map) if product else "")


def node_gres(gres: Gres) -> str:
    """The slurm.conf NodeName value: `gpu:a100:8`, `gpu:8`, or "" without GPUs."""
    if gres.count <= 0:
        return ""
    return f"gpu:{gres.type}:{gres.count}" if gres.type else f"gpu:{gres.count}"


def _release(version: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(version, tuple):
        return version
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    if match is None:
        raise GresError(f"Slurm version {version!r}: expected like 24.11")
    return int(match.group(1)), int(match.group(2))


def gres_conf_line(node: str, gres: Gres, slurm_version: str | tuple[int, int]) -> str:
    """The node's gres.conf line. From 24.11 slurmd finds the devices itself
    (`AutoDetect=nvidia`); before, the device files are listed (`/dev/nvidia0..N-1`, the
    NVIDIA driver's names). "" without GPUs."""
    if gres.count <= 0:
        return ""
    if _release(slurm_version) >= AUTODETECT_SINCE:
        return f"NodeName={node} AutoDetect=nvidia"
    files = "/dev/nvidia0" if gres.count == 1 else f"/dev/nvidia[0-{gres.count - 1}]"
    kind = f" Type={gres.type}" if gres.type else ""
    return f"NodeName={node} Name=gpu{kind} File={files}"


def parse_gres(reported: str) -> dict[tuple[str, str], int]:
    """Slurm's GRES string (`gpu:a100:8(S:0-1),gpu:t4:1`) -> {(name, type): count}.
    `(null)` and "" are empty. Raises GresError on what does not parse."""
    text = reported.strip()
    out: dict[tuple[str, str], int] = {}
    if text in ("", "(null)"):
        return out
    position = 0
    while position < len(text):
        match = _ENTRY.match(text, position)
        if match is None or match.end() == position:
            raise GresError(f"GRES {reported!r}: cannot read from {text[position:]!r}")
        kind, count = match.group("type") or "", match.group("count")
        if count is None and kind.isdigit():  # `gpu:2`: a count, no type
            kind, count = "", kind
        key = (match.group("name"), kind)
        out[key] = out.get(key, 0) + int(count if count is not None else 1)
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                raise GresError(f"GRES {reported!r}: unexpected {text[position]!r}")
            position += 1
    return out


def gres_matches(reported: str, expected: Gres) -> bool:
    """Whether Slurm reports exactly the expected GPUs (other GRES kinds are ignored).
    An unreadable report does not match."""
    try:
        parsed = parse_gres(reported)
    except GresError:
        return False
    gpus = {kind: n for (name, kind), n in parsed.items() if name == "gpu" and n}
    if expected.count <= 0:
        return not gpus
    return gpus == {expected.type: expected.count}


def expected_gres(obj: Mapping[str, Any], type_map: Mapping[str, str] | None = None) -> str:
    """What Slurm must report for this Kubernetes Node (`gpu:TYPE:N`, "" for no GPUs), or
    `unknown: why` when its GPUs cannot be read: unknown is not none."""
    try:
        return node_gres(gres_from_node(obj, type_map))
    except GresError as error:
        return f"{UNKNOWN_PREFIX}{error}"


def gres_problem(reported: str | None, expected: str | None) -> str | None:
    """Why Slurm's GRES is not the expected one (None when it is, or when nothing is
    expected: the check is off). Other GRES kinds than `gpu` are Slurm's business."""
    if expected is None:
        return None
    if expected.startswith(UNKNOWN_PREFIX):
        return f"GRES unknown: {expected.removeprefix(UNKNOWN_PREFIX)}"
    try:
        parsed = parse_gres(expected)
    except GresError as error:
        return f"GRES expected {expected!r} cannot be read: {error}"
    gpus = [(kind, n) for (name, kind), n in parsed.items() if name == "gpu"]
    want = Gres(gpus[0][1], gpus[0][0]) if len(gpus) == 1 else Gres()
    if gres_matches(reported or "", want):
        return None
    return (f"GRES mismatch: Slurm reports {reported or 'no GRES'}, Kubernetes has "
            f"{node_gres(want) or 'no GPUs'}")
