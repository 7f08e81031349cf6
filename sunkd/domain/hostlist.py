"""Slurm hostlist expressions: expansion and compression.

Slurm speaks in hostlists everywhere sunkd looks: a job's `nodes` (`gpu-a[001-004,010]`),
a partition's node list, the harness's node parameter. The domain needs plain node
names to join Slurm nodes with Kubernetes nodes, and operators want short lists back
in messages, so both directions live here, pure and without I/O (no python-hostlist
dependency: the grammar sunkd needs is small and the property tests pin it down).

Grammar (the subset Slurm's `hostlist_create()` accepts and sunkd meets in practice):

* a comma separated list of host expressions; commas inside `[...]` do not split;
* a host expression is literal text with zero or more bracket groups, each a comma
  separated list of `N` or `LO-HI` numbers; several groups expand as a cartesian
  product (`r[1-2]n[1-2]` -> r1n1 r1n2 r2n1 r2n2);
* zero padding follows Slurm: the width of `LO` is the width of every number of that
  range (`[08-10]` -> 08 09 10, `[1-10]` -> 1 ... 10).

Expansion keeps order and duplicates, like `scontrol show hostnames`. Compression keeps
order too, so `expand(compress(names)) == names` for any list of valid names; pass
`sort=True` for the canonical short form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import product

__all__ = ["HostlistError", "compress", "expand", "is_valid_name"]

# A generous bound: one bad `[0-999999999]` must not eat the daemon's memory.
MAX_EXPANSION = 1_000_000

_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


class HostlistError(ValueError):
    """A hostlist expression is malformed (the message says where)."""


def is_valid_name(name: str) -> bool:
    """A single host name that a hostlist can carry unchanged."""
    return bool(name) and not any(c in name for c in "[],") and name.strip() == name


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise HostlistError(f"nested '[' at offset {i} in {text!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"unbalanced ']' at offset {i} in {text!r}")
            depth = 0
        elif char == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {text!r}")
    parts.append(text[start:])
    return parts


def _expand_group(body: str, where: str) -> list[str]:
    out: list[str] = []
    for element in body.split(","):
        element = element.strip()
        lo, dash, hi = element.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise HostlistError(f"bad range {element!r} in {where!r}")
        width = len(lo)
        low = int(lo)
        high = int(hi) if dash else low
        if high < low:
            raise HostlistError(f"descending range {element!r} in {where!r}")
        if high - low + 1 > MAX_EXPANSION:
            raise HostlistError(f"range {element!r} in {where!r} is larger than {MAX_EXPANSION}")
        out.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return out


def _expand_one(expr: str) -> list[str]:
    if "[" not in expr:
        if "]" in expr:
            raise HostlistError(f"unbalanced ']' in {expr!r}")
        return [expr]
    pieces: list[list[str]] = []
    rest = expr
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            pieces.append([rest])
            break
        if open_at:
            pieces.append([rest[:open_at]])
        close_at = rest.find("]", open_at)
        if close_at < 0:
            raise HostlistError(f"unclosed '[' in {expr!r}")
        pieces.append(_expand_group(rest[open_at + 1 : close_at], expr))
        rest = rest[close_at + 1 :]
    total = 1
    for piece in pieces:
        total *= len(piece)
    if total > MAX_EXPANSION:
        raise HostlistError(f"{expr!r} expands to more than {MAX_EXPANSION} names")
    return ["".join(parts) for parts in product(*pieces)]


def expand(hostlist: str | Iterable[str]) -> list[str]:
    """Expand a hostlist (`"gpu-a[001-004,010],cpu1"`) into node names, in order.

    An iterable of expressions is expanded one after the other. Empty input and empty
    items (`"a,,b"`, Slurm's `""` for a pending job) yield nothing.
    """
    if not isinstance(hostlist, str):
        return [name for expr in hostlist for name in expand(expr)]
    text = hostlist.strip()
    if not text or text in ("(null)", "None"):
        return []
    names: list[str] = []
    for expr in _split_top(text):
        expr = expr.strip()
        if expr:
            names.extend(_expand_one(expr))
    return names


def _split_name(name: str) -> tuple[str, str, str] | None:
    match = _LAST_NUMBER.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2), match.group(3)


def compress(names: Sequence[str], *, sort: bool = False) -> str:
    """Compress node names into a hostlist; `expand(compress(x)) == x`.

    Consecutive names that differ only in their last number are merged into one bracket
    group; ascending runs whose numbers keep the run's zero padding become `LO-HI`.
    With `sort=True` the names are first deduplicated and sorted by (prefix, suffix,
    number), which gives Slurm's canonical form (`node[1-4,10]`).
    """
    for name in names:
        if not is_valid_name(name):
            raise HostlistError(f"{name!r} is not a valid node name for a hostlist")
    items: Sequence[str] = names
    if sort:

        def key(name: str) -> tuple[str, str, int, int, str]:
            split = _split_name(name)
            if split is None:
                return (name, "", -1, 0, name)
            return (split[0], split[2], int(split[1]), len(split[1]), name)

        items = sorted(set(names), key=key)

    out: list[str] = []
    i = 0
    count = len(items)
    while i < count:
        split = _split_name(items[i])
        if split is None:
            out.append(items[i])
            i += 1
            continue
        prefix, digits, suffix = split
        numbers = [digits]
        j = i + 1
        while j < count:
            other = _split_name(items[j])
            if other is None or other[0] != prefix or other[2] != suffix:
                break
            numbers.append(other[1])
            j += 1
        if len(numbers) == 1:
            out.append(items[i])
        else:
            out.append(f"{prefix}[{_ranges(numbers)}]{suffix}")
        i = j
    return ",".join(out)


def _ranges(numbers: list[str]) -> str:
    """`["01","02","03","07"]` -> `"01-03,07"`, keeping order and padding exact."""
    elements: list[str] = []
    k = 0
    while k < len(numbers):
        lo = numbers[k]
        width = len(lo)
        last = int(lo)
        m = k + 1
        while m < len(numbers):
            candidate = numbers[m]
            if int(candidate) != last + 1 or candidate != f"{last + 1:0{width}d}":
                break
            last += 1
            m += 1
        elements.append(lo if m == k + 1 else f"{lo}-{numbers[m - 1]}")
        k = m
    return ",".join(elements)
