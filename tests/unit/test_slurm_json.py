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


@pytest.mark.parametrize("body", [b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[1e999]",
                                  b"[" * 5000 + b"]" * 5000, b'{"a": 1', b"\xff\xfe"])
def test_what_is_not_json_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_json(body)


def test_a_long_digit_run_in_a_string_takes_the_exact_path_and_agrees() -> None:
    raw = b'{"jobs": [{"name": "run-12345678901234567890123", "id": 7}]}'
    assert parse_json(raw) == json.loads(raw)
