"""The fast node parser and the checked one agree on every input.

`normalize_node` tries `_fast_node` (no error paths, for 10k-node polls) and falls back to
`_checked_node` (which names the bad field) when the fast path raises `_Slow`. The fast
path must therefore never return something the checked path would not: either it steps
aside, or both produce the same `SlurmNode`. The inputs mix the three JSON families
(v0.0.38 strings, v0.0.39 lists, v0.0.40+ `{set,infinite,number}` wrappers) with values of
the wrong type, as a broken or hostile slurmrestd might send.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.slurm.model import SlurmPayloadError
from sunkd.slurm.normalize import _checked_node, _fast_node, _Slow

junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.integers(-3, 3),
                 st.text(max_size=4), st.lists(st.integers(0, 2), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
number = st.one_of(
    st.integers(0, 2**40), st.none(),
    st.fixed_dictionaries({"set": st.booleans(), "infinite": st.booleans(),
                           "number": st.one_of(st.integers(0, 2**40), junk)}),
    junk,
)
text = st.one_of(st.none(), st.just(""), st.text(max_size=12),
                 st.sampled_from(["gpu:4", "gpu:h100:2,gpu:h200:4", "gpu:1(IDX:0,2)", "(null)"]),
                 junk)
names = st.lists(st.sampled_from(["a", "b", "gpu", ""]), max_size=3)
string_list = st.one_of(st.none(), st.just(""), names, names.map(",".join), junk)
base_states = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN", "idle", "BOGUS", ""])
flags = st.lists(st.one_of(st.sampled_from(["DRAIN", "NOT_RESPONDING", "COMPLETING"]), junk),
                 max_size=3)
state = st.one_of(
    base_states,  # v0.0.38 (with state_flags beside it)
    st.tuples(base_states, flags).map(lambda pair: [pair[0], *pair[1]]),  # v0.0.39+
    st.lists(junk, max_size=2),
    junk,
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "state": state, "state_flags": st.one_of(flags, junk), "reason": text,
    "reason_set_by_user": text, "reason_changed_at": number, "cpus": number,
    "alloc_cpus": number, "gres": text, "gres_used": text, "partitions": string_list,
    "features": string_list, "comment": text, "boot_time": number, "last_busy": number,
}


@st.composite
def raw_nodes(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 30)) == 0:
        return draw(junk)
    node: dict[str, Any] = {"name": draw(st.one_of(st.sampled_from(["n1", "gpu-a001"]), junk))}
    for key, strategy in FIELDS.items():
        if draw(st.integers(0, 5)) != 0:  # most fields present, some missing
            node[key] = draw(strategy)
    return node


@settings(max_examples=2000, deadline=None)
@given(raw_nodes())
def test_fast_and_checked_parsers_agree(raw: Any) -> None:
    try:
        fast = _fast_node(raw)
    except _Slow:
        return  # the checked path decides; nothing to compare
    try:
        checked = _checked_node(raw, "node")
    except SlurmPayloadError as error:
        raise AssertionError(f"fast path accepted what the checked path rejects: {error}") from None
    assert fast == checked


def test_the_fast_path_is_taken_for_real_shapes() -> None:
    """Not vacuous: typical nodes of each family go the fast way and agree."""
    nodes = [
        {"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "cpus": 8, "gres": "gpu:4",
         "reason": "sunkd: lent", "partitions": None, "features": "a,b"},
        {"name": "n2", "state": ["IDLE", "DRAIN"], "cpus": 8, "features": ["a"],
         "reason_changed_at": 1700000000},
        {"name": "n3", "state": ["MIXED"], "cpus": {"set": True, "infinite": False, "number": 8},
         "boot_time": {"set": True, "infinite": False, "number": 1700000000}},
    ]
    for raw in nodes:
        assert _fast_node(raw) == _checked_node(raw, "node")
