"""The normalizer's half: hostile values in slurmrestd JSON are refused with a
named field or sanitised before they can reach the log (the integration half, against
the fake slurmrestd, is tests/integration/test_hostile_slurm.py)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from sunkd.domain.codec import encode_payload
from sunkd.slurm.model import SlurmPayloadError
from sunkd.slurm.normalize import clean_text, normalize_jobs, normalize_nodes
from sunkd.store.eventlog import dumps_json
from sunkd_testbed.slurmrestd import fake_node


def _body(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": list(nodes), "errors": [], "meta": {}}


@pytest.mark.parametrize("where", ["cpus", "alloc_cpus", "boot_time"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_number_is_a_payload_error_naming_the_field(where: str, value: float) -> None:
    """Before: `int(nan)` raised a bare ValueError out of the poll."""
    node = fake_node("n1")
    node[where] = value
    with pytest.raises(SlurmPayloadError) as error:
        normalize_nodes(_body(node))
    assert error.value.field == f"nodes[0](n1).{where}" and error.value.cause == "bad_payload"


def test_non_finite_number_inside_a_wrapper_is_a_payload_error() -> None:
    node = fake_node("n1")
    node["cpus"] = {"set": True, "infinite": False, "number": math.nan}
    with pytest.raises(SlurmPayloadError, match=r"cpus\.number"):
        normalize_nodes(_body(node))


def test_duplicate_node_name_invalidates_the_answer() -> None:
    body = _body(fake_node("n1"), fake_node("n2"), fake_node("n1", state=("ALLOCATED",)))
    with pytest.raises(SlurmPayloadError) as error:
        normalize_nodes(body)
    assert error.value.cause == "duplicate_node"
    assert error.value.field == "nodes[2].name"
    assert "duplicate node name 'n1' (also nodes[0])" in error.value.problem


def test_control_characters_in_free_text_are_replaced() -> None:
    node = fake_node("n1", comment="x\u0000y", reason="r\u001b[31m\tz\ud800")
    node["features"] = ["gpu\u0007", "ib"]
    node["partitions"] = ["batch\u0000"]
    [parsed] = normalize_nodes(_body(node))
    assert parsed.comment == "x\ufffdy"
    assert parsed.reason == "r\ufffd[31m z\ufffd"
    assert parsed.features == ("gpu\ufffd", "ib")
    assert parsed.partitions == ("batch\ufffd",)
    # What reaches the log is now plain, valid JSON text with no NUL escape.
    text = dumps_json(encode_payload(parsed.to_observed()))
    assert "\\u0000" not in text and "\\ud800" not in text


@pytest.mark.parametrize(("field", "value"), [
    ("name", "n\u00001"), ("state", ["IDLE\u001b"]), ("state", ["IDLE", "DRAIN\u0000"]),
])
def test_control_characters_in_identifiers_make_the_node_invalid(field: str, value: Any) -> None:
    node = fake_node("n1")
    node[field] = value
    with pytest.raises(SlurmPayloadError, match="control character"):
        normalize_nodes(_body(node))


def test_fast_and_checked_paths_sanitise_alike() -> None:
    """A node with one odd field goes through the checked parser; the others through the
    fast one: both must come out sanitised the same way."""
    clean = fake_node("n1", reason="a\u0000b")
    odd = copy.deepcopy(clean)
    odd["name"] = "n2"
    odd["cpus"] = 64.0  # a float count: the checked path
    fast, checked = normalize_nodes(_body(clean, odd))
    assert fast.reason == checked.reason == "a\ufffdb"


def test_job_strings_are_sanitised() -> None:
    body = {"jobs": [{"job_id": 1, "job_state": ["PENDING"], "partition": "gpu\u0000",
                      "nodes": "", "state_reason": "Resources\u001b", "node_count": 1}],
            "errors": []}
    [job] = normalize_jobs(body)
    assert job.partition == "gpu\ufffd" and job.state_reason == "Resources\ufffd"


def test_clean_text_leaves_ordinary_text_alone() -> None:
    text = "sunkd: lent to kubernetes (pool gpu-a) — é ü 日本 \u00a0"
    assert clean_text(text) == text
