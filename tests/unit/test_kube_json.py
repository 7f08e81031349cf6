"""Kubernetes bodies and watch lines decode exactly as the stdlib would (orjson first,
the stdlib for what orjson refuses or could read differently), and whatever the stdlib
refuses is still a ValueError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.kubernetes.wire import loads

# Every JSON value, including what only Python's parser writes and reads back: NaN and
# the infinities, integers of any size, lone surrogates in strings.
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
           | st.floats() | st.text(st.characters(codec=None), max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(st.characters(codec=None), max_size=6), inner, max_size=5),
    max_leaves=30)


def same(left: Any, right: Any) -> bool:
    """Equal including types (1 is not 1.0) and NaN == NaN."""
    return json.dumps(left) == json.dumps(right)


def outcome(decode: Any, raw: bytes | str) -> tuple[str, Any]:
    try:
        return "value", decode(raw)
    except RecursionError:
        return "error", None
    except ValueError:
        return "error", None


@settings(max_examples=400)
@given(values, st.booleans())
def test_every_json_value_decodes_as_the_stdlib_does(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    raw = text.encode("utf-8", "surrogatepass")
    assert same(loads(raw), json.loads(raw))
    assert same(loads(text), json.loads(text))


@settings(max_examples=400)
@given(st.binary(max_size=64) | values.map(
    lambda v: json.dumps(v).encode("utf-8", "surrogatepass")).flatmap(
    lambda raw: st.tuples(st.just(raw), st.integers(0, max(len(raw) - 1, 0)),
                          st.integers(0, 255)).map(
        lambda t: t[0][:t[1]] + bytes([t[2]]) + t[0][t[1] + 1:])))
def test_hostile_bytes_fail_or_agree_with_the_stdlib(raw: bytes) -> None:
    """Random bytes and valid bodies with one byte changed: either both decoders refuse
    (as a ValueError) or both give the same value."""
    ours, theirs = outcome(loads, raw), outcome(json.loads, raw)
    assert ours[0] == theirs[0]
    if ours[0] == "value":
        assert same(ours[1], theirs[1])


@pytest.mark.parametrize("number", [2**64, 2**64 - 1, -(2**63) - 1, 10**30, 12345678901234567890])
def test_integers_beyond_64_bits_stay_exact(number: int) -> None:
    decoded = loads(b'{"metadata": {"generation": %d}}' % number)
    assert decoded["metadata"]["generation"] == number
    assert type(decoded["metadata"]["generation"]) is int


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbf{\"a\": 1}", b"{\"a\": \"\\ud800\"}",
                                 b"[NaN, Infinity]", '{"a": "\ud800"}',
                                 "[1]".encode("utf-16")])
def test_what_orjson_refuses_reads_as_the_stdlib_reads_it(raw: bytes | str) -> None:
    assert same(loads(raw), json.loads(raw))


def test_deep_nesting_is_a_value_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        loads(b"[" * 100_000 + b"]" * 100_000)


def test_a_page_of_pods_is_read_as_the_stdlib_reads_it() -> None:
    page = {"kind": "PodList", "metadata": {"resourceVersion": "81234", "continue": "eyJ2"},
            "items": [{"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u-{i}",
                                    "labels": {"app": "serve"}, "resourceVersion": str(i)},
                       "spec": {"nodeName": f"node{i:05d}", "priority": -7,
                                "containers": [{"resources": {"requests": {
                                    "nvidia.com/gpu": "1", "cpu": "500m"}}}]},
                       "status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}}
                      for i in range(50)]}
    raw = json.dumps(page).encode()
    assert loads(raw) == json.loads(raw) == page
