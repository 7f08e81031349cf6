"""The API emulator's encoder (orjson, the stdlib where orjson would write otherwise)
writes what `json.dumps` writes, as far as any reader can tell: the same values back,
the same errors. Adversarial values: NaN and infinities (orjson writes null), integers
beyond 64 bits, lone surrogates, non-string keys, datetimes, str/int subclasses."""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd_testbed.kubeapi.server import dumps


class Colour(enum.StrEnum):
    RED = "red"


_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["\ud800", "ü", "a\u2028b", Colour.RED]))
_KEY = st.one_of(st.text(max_size=5), st.integers(min_value=-3, max_value=3),
                 st.sampled_from(["\udfff", Colour.RED]))
_JSONISH = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEY, inner, max_size=4)), max_leaves=20)


def _as_stdlib_reads_it(text: bytes | str) -> str:
    # NaN != NaN: compare what the stdlib writes of what it reads back.
    return json.dumps(json.loads(text))


@given(_JSONISH)
def test_the_emulator_writes_what_the_stdlib_writes(obj: Any) -> None:
    try:
        expected = json.dumps(obj, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        with pytest.raises(type(error)):
            dumps(obj)
        return
    assert _as_stdlib_reads_it(dumps(obj)) == _as_stdlib_reads_it(expected)


def test_what_orjson_would_write_otherwise_is_the_stdlibs_bytes() -> None:
    for obj in ({"x": float("nan")}, {"x": [float("inf")]}, {"n": 2**64}, {1: "a"},
                {"s": "\ud800"}):
        assert dumps(obj) == json.dumps(obj, separators=(",", ":")).encode()
    with pytest.raises(TypeError):
        dumps({"at": datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)})
    assert dumps({"kind": "Pod", "items": [1, "ü"]}) == b'{"kind":"Pod","items":[1,"\xc3\xbc"]}'
