"""Hostlist expansion/compression: Slurm's examples plus round-trip properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd.domain.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("", []),
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu-a[001-004,010]", ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a004", "gpu-a010"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a[1-2],b[3,5-6],c", ["a1", "a2", "b3", "b5", "b6", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        (" a1 , a2 ", ["a1", "a2"]),
        ("a,,b", ["a", "b"]),
        ("x[3,1]", ["x3", "x1"]),
    ],
)
def test_expand_examples(hostlist: str, names: list[str]) -> None:
    assert expand(hostlist) == names


def test_expand_iterable() -> None:
    assert expand(["a[1-2]", "b"]) == ["a1", "a2", "b"]


@pytest.mark.parametrize(
    "bad", ["a[1-", "a]1", "a[[1]]", "a[x]", "a[3-1]", "a[1-2", "a[]", "a[1-b]", "a[0-99999999]"]
)
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


@pytest.mark.parametrize(
    ("names", "hostlist"),
    [
        (["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a004", "gpu-a010"], "gpu-a[001-004,010]"),
        (["node1"], "node1"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n09", "n10"], "n[09-10]"),
        (["n1", "n01"], "n[1,01]"),
        (["a", "b1", "b2"], "a,b[1-2]"),
        (["r1n1", "r1n2", "r2n1"], "r1n[1-2],r2n1"),
    ],
)
def test_compress_examples(names: list[str], hostlist: str) -> None:
    assert compress(names) == hostlist


def test_compress_sort_is_canonical() -> None:
    assert compress(["n3", "n1", "n2", "n1", "m7"], sort=True) == "m7,n[1-3]"


def test_compress_rejects_bad_names() -> None:
    with pytest.raises(HostlistError):
        compress(["a,b"])
    with pytest.raises(HostlistError):
        compress([""])


_prefix = st.text(alphabet="abcxyz-_.", min_size=0, max_size=4)
_suffix = st.text(alphabet="abz-", min_size=0, max_size=2)


@st.composite
def _name(draw: st.DrawFn) -> str:
    prefix = draw(_prefix)
    suffix = draw(_suffix)
    if draw(st.booleans()) or not (prefix or suffix):
        number = draw(st.integers(min_value=0, max_value=1200))
        width = draw(st.integers(min_value=1, max_value=4))
        return f"{prefix}{number:0{width}d}{suffix}"
    return prefix + suffix


@given(st.lists(_name(), max_size=40))
def test_roundtrip_any_order(names: list[str]) -> None:
    assert expand(compress(names)) == names


@given(st.lists(_name(), max_size=40))
def test_roundtrip_sorted(names: list[str]) -> None:
    text = compress(names, sort=True)
    assert sorted(expand(text)) == sorted(set(names))
    # canonical form is stable
    assert compress(expand(text), sort=True) == text


@given(st.text(alphabet="ab0123456789[],-", max_size=20))
def test_expand_never_crashes_unexpectedly(text: str) -> None:
    try:
        expand(text)
    except HostlistError:
        pass


@given(st.integers(min_value=0, max_value=50), st.integers(min_value=0, max_value=50))
def test_range_padding(lo: int, span: int) -> None:
    hi = lo + span
    names = expand(f"n[{lo:03d}-{hi:03d}]")
    assert names == [f"n{i:03d}" for i in range(lo, hi + 1)]
    assert compress(names) == (f"n[{lo:03d}-{hi:03d}]" if span else f"n{lo:03d}")
