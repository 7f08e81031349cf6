"""Domain events: exact JSON round trips (hypothesis) and forward compatibility."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, get_args, get_origin

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.codec import decode_payload, encode_payload, payload_from_json, payload_to_json
from sunkd.domain.events import (
    PAYLOAD_TYPES,
    EventDecodeError,
    Payload,
    SlurmNodeObserved,
    UnknownPayload,
)

text = st.text(max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    origin = get_origin(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return st.one_of(*(strategy_for(option) for option in get_args(hint)))
    if hint is type(None):
        return st.none()
    if origin is tuple:
        return st.lists(strategy_for(get_args(hint)[0]), max_size=3).map(tuple)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(hint)
                  if f.name != "extra"}
        return st.builds(hint, **fields)
    return {str: text, int: st.integers(-2**53, 2**53), float: finite, bool: st.booleans()}[hint]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(PAYLOAD_TYPES)).flatmap(
    lambda kind: strategy_for(PAYLOAD_TYPES[kind])))
def test_every_payload_round_trips_exactly(payload: Payload) -> None:
    encoded = payload_to_json(payload)
    decoded = payload_from_json(payload.kind, encoded)
    assert decoded == payload
    assert payload_to_json(decoded) == encoded
    assert json.loads(encoded)["v"] == type(payload).VERSION


@settings(max_examples=40, deadline=None)
@given(kind=st.text(min_size=1, max_size=20).filter(lambda k: k not in PAYLOAD_TYPES),
       body=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5),
                                                          st.lists(st.integers(), max_size=3))))
def test_unknown_kinds_pass_through_untouched(kind: str, body: dict[str, Any]) -> None:
    payload = decode_payload(kind, body)
    assert isinstance(payload, UnknownPayload)
    assert payload.kind == kind
    assert encode_payload(payload) == body


def test_unknown_fields_of_a_known_kind_are_kept() -> None:
    body = {"v": 1, "node": "n1", "state": "IDLE", "rack": "r7", "labels": {"a": "b"}}
    payload = decode_payload("slurm.node.observed", body)
    assert isinstance(payload, SlurmNodeObserved)
    assert payload.node == "n1" and payload.extra == {"rack": "r7", "labels": {"a": "b"}}
    assert encode_payload(payload)["rack"] == "r7"


def test_a_newer_version_keeps_its_version_number() -> None:
    payload = decode_payload("slurm.node.observed", {"v": 7, "node": "n1"})
    assert encode_payload(payload)["v"] == 7


def test_a_newer_version_with_a_changed_field_type_is_passed_through() -> None:
    body = {"v": 9, "node": {"name": "n1"}}
    payload = decode_payload("slurm.node.observed", body)
    assert isinstance(payload, UnknownPayload)
    assert payload.kind == "slurm.node.observed"
    assert encode_payload(payload) == body


def test_a_corrupt_current_version_payload_is_an_error_naming_the_field() -> None:
    with pytest.raises(EventDecodeError, match=r"slurm\.node\.observed\.cpus"):
        decode_payload("slurm.node.observed", {"v": 1, "node": "n1", "cpus": "many"})
    with pytest.raises(EventDecodeError, match="not a JSON object"):
        payload_from_json("slurm.node.observed", "[1, 2]")


def test_payloads_are_immutable() -> None:
    payload = SlurmNodeObserved(node="n1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        payload.node = "n2"  # type: ignore[misc]


def test_a_pods_slurmd_fields_are_written_only_when_set() -> None:
    """Most pods are no slurmd pod: their references in every workload report carry none
    of the slurmd fields (the log's size, and a reader from before them decodes every
    other pod), and a slurmd pod's round-trips whole."""
    from sunkd.domain.codec import decode_payload, encode_payload
    from sunkd.domain.events import K8sWorkloadObserved, PodRef

    plain = PodRef("ns", "p", "Running", "u")
    slurmd = PodRef("ns", "gpu-n1", "Running", "u2", pool_pod=False, slurmd="n1",
                    slurmd_nodeset="U", deleting=True, started_at=5.0,
                    slurmd_revision="abc123")
    body = encode_payload(K8sWorkloadObserved(node="n", pods=(plain, slurmd)))
    assert set(body["pods"][0]) == {"namespace", "name", "phase", "uid", "pool_pod"}
    assert body["pods"][1]["slurmd_nodeset"] == "U" and body["pods"][1]["started_at"] == 5.0
    assert body["pods"][1]["slurmd_revision"] == "abc123"
    decoded = decode_payload(K8sWorkloadObserved.KIND, body)
    assert isinstance(decoded, K8sWorkloadObserved) and decoded.pods == (plain, slurmd)
