"""The shortcuts on the Kubernetes LIST path give exactly what the long way gives: the
digit-run check before orjson (`domain/jsontext.py`) and `pod_requests` memoized by its
request texts (`kubernetes/normalize.py`). Adversarial worlds: digits everywhere, and
quantities of every JSON type that hash alike (1, 1.0, True) but parse differently."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.jsontext import maybe_beyond_64_bits
from sunkd.kubernetes import normalize
from sunkd.kubernetes.normalize import pod_requests

_REGEX = re.compile(rb"[0-9]{19,}")


@given(st.lists(st.one_of(st.binary(max_size=30),
                          st.integers(min_value=0, max_value=30).map(lambda n: b"7" * n),
                          st.sampled_from([b"0", b"9", b"/", b":", b"a", b"\xb9", b"\xff"])),
                max_size=40).map(b"".join))
def test_the_digit_run_check_is_the_regex(data: bytes) -> None:
    assert maybe_beyond_64_bits(data) == (_REGEX.search(data) is not None)
    assert maybe_beyond_64_bits(bytearray(data)) == (_REGEX.search(data) is not None)


def test_the_digit_run_check_at_its_edges() -> None:
    assert not maybe_beyond_64_bits(b'{"a":' + b"1" * 18 + b"}")
    assert maybe_beyond_64_bits(b'{"a":' + b"1" * 19 + b"}")
    assert not maybe_beyond_64_bits(b"1" * 18 + b"." + b"1" * 18)
    assert not maybe_beyond_64_bits("\u0661".encode() * 40)  # Arabic-Indic digits are not ASCII


_QUANTITY = st.one_of(
    st.sampled_from(["500m", "1", "1.5", "2Gi", "1e3", "0.1m", "-1", "x", "", " 2 ",
                     "1e999999999"]),
    st.sampled_from([1, 1.0, True, False, 0, None, -1, float("nan"), 10**30]),
    st.just({"nested": "1"}), st.just(["1"]))
_NAME = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"])
_REQUESTS = st.dictionaries(_NAME, _QUANTITY, max_size=3)
_CONTAINER = st.one_of(
    st.fixed_dictionaries({"resources": st.fixed_dictionaries({"requests": _REQUESTS})}),
    st.just({}), st.just({"resources": None}), st.just({"resources": {"requests": None}}),
    st.just({"resources": {}}))
_SPEC = st.fixed_dictionaries({}, optional={
    "containers": st.lists(_CONTAINER, max_size=3),
    "initContainers": st.lists(_CONTAINER, max_size=2),
    "overhead": _REQUESTS})


def _direct(pod: dict[str, Any]) -> Any:
    try:
        return normalize._pod_requests(pod.get("spec") or {})
    except Exception as error:  # the same error either way
        return type(error)


def _memoized(pod: dict[str, Any]) -> Any:
    try:
        return pod_requests(pod)
    except Exception as error:
        return type(error)


@settings(max_examples=300)
@given(st.lists(_SPEC.map(lambda spec: {"spec": spec}), min_size=1, max_size=12))
def test_memoized_requests_are_the_scheduler_rule_computed_afresh(
        pods: list[dict[str, Any]]) -> None:
    # In sequence, so a memo entry made by one pod is what a look-alike pod would find.
    for pod in pods + pods[::-1]:
        assert _memoized(pod) == _direct(pod), pod


def test_quantities_that_hash_alike_are_not_confused() -> None:
    def pod(value: Any) -> dict[str, Any]:
        return {"spec": {"containers": [{"resources": {"requests": {"cpu": value}}}]}}

    normalize._REQUESTS_BY_TEXT.clear()
    assert pod_requests(pod("1")) == (1000, 0, 0)
    assert pod_requests(pod(True)) == (0, 0, 0)  # not a quantity: 0, as unmemoized
    assert pod_requests(pod(1.0)) == (1000, 0, 0)
    assert pod_requests(pod("1")) == (1000, 0, 0)


def test_the_memo_is_bounded() -> None:
    normalize._REQUESTS_BY_TEXT.clear()
    for i in range(normalize._REQUESTS_BY_TEXT_MAX + 10):
        pod_requests({"spec": {"containers": [{"resources": {"requests": {"cpu": f"{i}m"}}}]}})
        assert len(normalize._REQUESTS_BY_TEXT) <= normalize._REQUESTS_BY_TEXT_MAX
