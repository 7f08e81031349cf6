"""store/recent.py: `identical` is type-exact equality, and `RecentAppends` is bounded."""

from __future__ import annotations

import copy
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.codec import payload_from_json, payload_to_json
from sunkd.domain.events import PAYLOAD_TYPES, Payload, PodRef
from sunkd.store.recent import RecentAppends, identical
from tests.unit.test_events import strategy_for

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=12)


def same_shape(a: Any, b: Any) -> bool:
    """The reference: types equal at every level, floats equal bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_shape(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_shape(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_identical_is_type_exact_equality(a: Any, b: Any) -> None:
    assert identical(a, b) == same_shape(a, b)
    assert identical(a, copy.deepcopy(a))


def test_values_equal_but_not_identical() -> None:
    for a, b in [(1, 1.0), (True, 1), (0.0, -0.0), ((1,), [1]), ({"a": 1}, {"a": 1.0}),
                 ("x", None)]:
        assert not identical(a, b) and not identical(b, a)
    assert identical(math.nan, math.nan)
    assert not identical(PodRef("ml", "a", uid="u"), PodRef("ml", "a", uid="v"))
    assert identical(PodRef("ml", "a", uid="u"), PodRef("ml", "a", uid="u"))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PAYLOAD_TYPES)).flatmap(
    lambda kind: strategy_for(PAYLOAD_TYPES[kind])))
def test_every_payload_is_identical_to_its_round_trip(payload: Payload) -> None:
    """So the engine does share what the sources append (every kind, any values)."""
    assert identical(payload, payload_from_json(payload.kind, payload_to_json(payload)))


def test_share_hands_out_the_remembered_object_once() -> None:
    recent = RecentAppends(limit=10)
    appended = PodRef("ml", "a", uid="u")
    recent.remember([7], [appended])  # type: ignore[list-item]
    decoded = PodRef("ml", "a", uid="u")
    assert recent.share(7, decoded) is appended  # type: ignore[arg-type]
    assert recent.share(7, decoded) is decoded  # type: ignore[arg-type]
    recent.remember([8], [appended])  # type: ignore[list-item]
    other = PodRef("ml", "a", uid="changed")
    assert recent.share(8, other) is other  # type: ignore[arg-type]
    assert recent.shared == 1 and len(recent) == 0


def test_remember_keeps_only_the_newest() -> None:
    recent = RecentAppends(limit=3)
    refs = [PodRef("ml", str(i)) for i in range(5)]
    recent.remember(range(1, 6), refs)  # type: ignore[arg-type]
    assert len(recent) == 3
    assert recent.share(2, PodRef("ml", "1")) is not refs[1]  # type: ignore[arg-type]
    assert recent.share(5, PodRef("ml", "4")) is refs[4]  # type: ignore[arg-type]
    RecentAppends(limit=0).remember([1], [refs[0]])  # type: ignore[list-item]
