"""slurmrestd bodies decode exactly as the stdlib would, on the fast path and the exact one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sunkd.slurm.client import parse_json

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "slurm").rglob("*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_recorded_answer_decodes_as_the_stdlib_does(path: Path) -> None:
    raw = path.read_bytes()
    assert parse_json(raw) == json.loads(raw)


@pytest.mark.parametrize("number", [2**64, 2**64 + 1, -(2**63) - 1, 10**30, 2**64 - 1])
def test_integers_beyond_64_bits_stay_exact(number: int) -> None:
    decoded = parse_json(b'{"nodes": [{"free_mem": %d}]}' % number)
    assert decoded["nodes"][0]["free_mem"] == number
    assert type(decoded["nodes"][0]["free_mem"]) is int


@pytest.mark.parametrize(("body", "says"), [(b"[NaN]", "NaN"), (b"[Infinity]", "Infinity"),
                                           (b"[-Infinity]", "Infinity"),
                                           (b'{"a": 1', "delimiter"),
                                           (b"\xff\xfe", "Expecting value")])
def test_what_is_not_json_is_a_value_error_that_says_why(body: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_json(body)


def test_deep_nesting_is_the_stdlib_recursion_error() -> None:
    with pytest.raises(RecursionError):  # the client answers "nested too deeply"
        parse_json(b"[" * 100_000 + b"]" * 100_000)


def test_a_long_digit_run_in_a_string_takes_the_exact_path_and_agrees() -> None:
    raw = b'{"jobs": [{"name": "run-12345678901234567890123", "id": 7}]}'
    assert parse_json(raw) == json.loads(raw)
