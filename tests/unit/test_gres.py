"""sunkd/domain/gres.py: GPU count and type from a Node, Slurm's config strings, and the
comparison with what Slurm reports."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodeObserved, SlurmNodeObserved
from sunkd.domain.gres import (
    UNKNOWN_PREFIX,
    Gres,
    GresError,
    expected_gres,
    gpu_type,
    gres_conf_line,
    gres_from_node,
    gres_matches,
    gres_problem,
    node_gres,
    parse_gres,
)
from sunkd.domain.ownership import assess
from sunkd.domain.state import ClusterState, NodeState, Phase, SourceState


def k8s_node(gpus: Any = None, product: str | None = None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    allocatable = {"cpu": "8"} if gpus is None else {"cpu": "8", "nvidia.com/gpu": gpus}
    return {"metadata": {"name": "n1", "labels": labels},
            "status": {"allocatable": allocatable}}


def test_count_and_type_from_the_node() -> None:
    assert gres_from_node(k8s_node("8", "NVIDIA-A100-SXM4-80GB")) == \
        Gres(8, "nvidia_a100_sxm4_80gb")
    assert gres_from_node(k8s_node("8", "NVIDIA-A100-SXM4-80GB"),
                          {"NVIDIA-A100-SXM4-80GB": "a100"}) == Gres(8, "a100")
    assert gres_from_node(k8s_node("2", "Tesla T4"), {"tesla_t4": "t4"}) == Gres(2, "t4")
    assert gres_from_node(k8s_node("4")) == Gres(4, "")
    assert gres_from_node(k8s_node()) == Gres()
    assert gres_from_node(k8s_node("0", "H100")) == Gres()


@pytest.mark.parametrize("bad", ["1.5", "-1", "8k", "", "lots", "1e3"])
def test_a_malformed_count_is_an_error_not_zero(bad: str) -> None:
    with pytest.raises(GresError, match="not a whole number"):
        gres_from_node(k8s_node(bad, "H100"))


def test_type_map_values_are_checked() -> None:
    with pytest.raises(GresError, match="GPU type"):
        gpu_type("H100", {"H100": "bad:type"})


def test_conf_strings() -> None:
    assert node_gres(Gres(8, "a100")) == "gpu:a100:8"
    assert node_gres(Gres(2)) == "gpu:2"
    assert node_gres(Gres()) == ""
    assert gres_conf_line("n1", Gres(8, "a100"), "22.05.8") == \
        "NodeName=n1 Name=gpu Type=a100 File=/dev/nvidia[0-7]"
    assert gres_conf_line("n1", Gres(1), "22.05") == "NodeName=n1 Name=gpu File=/dev/nvidia0"
    assert gres_conf_line("n1", Gres(8, "a100"), "24.11.5") == "NodeName=n1 AutoDetect=nvidia"
    assert gres_conf_line("n1", Gres(8, "a100"), (26, 5)) == "NodeName=n1 AutoDetect=nvidia"
    assert gres_conf_line("n1", Gres(), "24.11") == ""
    with pytest.raises(GresError):
        gres_conf_line("n1", Gres(1), "latest")


@pytest.mark.parametrize(("reported", "expected", "match"), [
    ("gpu:fake:2", Gres(2, "fake"), True),
    ("gpu:a100:8(S:0-1)", Gres(8, "a100"), True),
    ("gpu:a100:8(S:0,1)", Gres(8, "a100"), True),
    ("gpu:a100:4(S:0),gpu:a100:4(S:1)", Gres(8, "a100"), True),
    ("gpu:a100:8(IDX:0-7)", Gres(8, "a100"), True),
    ("gpu:8", Gres(8), True),
    ("gpu:a100:8,nic:1", Gres(8, "a100"), True),
    ("gpu:a100:7", Gres(8, "a100"), False),
    ("gpu:h100:8", Gres(8, "a100"), False),
    ("gpu:8", Gres(8, "a100"), False),
    ("", Gres(), True),
    ("(null)", Gres(), True),
    ("gpu:a100:0", Gres(), True),
    ("gpu:a100:8", Gres(), False),
    ("", Gres(1, "a100"), False),
    ("gpu:a100:8)(", Gres(8, "a100"), False),
])
def test_reported_gres_against_expected(reported: str, expected: Gres, match: bool) -> None:
    assert gres_matches(reported, expected) is match


@given(st.integers(1, 64), st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
       st.sampled_from(["", "(S:0-1)", "(S:0,1)", "(IDX:0-3)"]))
def test_what_sunkd_writes_matches_what_slurm_reports(count: int, kind: str,
                                                      suffix: str) -> None:
    gres = Gres(count, kind)
    assert gres_matches(node_gres(gres) + suffix, gres)
    assert parse_gres(node_gres(gres)) == {("gpu", kind): count}
    assert not gres_matches(node_gres(Gres(count + 1, kind)), gres)


@given(st.text(max_size=20))
def test_normalised_types_are_valid(product: str) -> None:
    try:
        kind = gpu_type(product)
    except GresError:
        assert len(product.strip()) > 64
        return
    assert all(c.isascii() and (c.isalnum() or c == "_") for c in kind)
    assert kind == kind.lower()


# ------------------------------------------------------------------- the check


def test_the_check_compares_slurm_with_the_node() -> None:
    expected = expected_gres(k8s_node("2", "NVIDIA-A100-SXM4-80GB"), {"NVIDIA-A100-SXM4-80GB":
                                                                    "a100"})
    assert expected == "gpu:a100:2"
    assert gres_problem("gpu:a100:2(S:0)", expected) is None
    assert gres_problem("gpu:a100:1(S:0)", expected) == (
        "GRES mismatch: Slurm reports gpu:a100:1(S:0), Kubernetes has gpu:a100:2")
    assert gres_problem("gpu:nvidia_a100:2", expected) is not None  # the type counts
    assert gres_problem(None, expected) == "GRES mismatch: Slurm reports no GRES, " \
        "Kubernetes has gpu:a100:2"
    assert gres_problem(None, expected_gres(k8s_node())) is None  # no GPUs on either side
    assert gres_problem("gpu:a100:2", "") is not None  # Slurm has GPUs the Node does not
    assert gres_problem("gpu:a100:2", None) is None  # the check is off


def test_an_unreadable_gpu_count_is_held_not_none() -> None:
    expected = expected_gres(k8s_node("lots"))
    assert expected.startswith(UNKNOWN_PREFIX)
    problem = gres_problem(None, expected)
    assert problem is not None and problem.startswith("GRES unknown: allocatable")


def _state(owner: str, slurm_state: str, reported: str | None, expected: str | None
           ) -> tuple[ClusterState, NodeState]:
    node = NodeState("n1", k8s_name="n1", owner=owner, phase=Phase.SLURM, pods=(),
                     slurm=SlurmNodeObserved(node="n1", state=slurm_state, gres=reported),
                     k8s=K8sNodeObserved(node="n1", slurm_node="n1", ready=True,
                                         gres=expected))
    fresh = SourceState("fresh", None, None, 0.0, 0.0)
    return ClusterState(nodes={"n1": node}, sources={"slurm": fresh,
                                                     "kubernetes": fresh}), node


@pytest.mark.parametrize(("owner", "slurm_state", "reported", "expected", "held"), [
    (wk.OWNER_SLURM, "IDLE", "gpu:a100:1", "gpu:a100:2", True),
    (wk.OWNER_SLURM, "IDLE", "gpu:a100:2(S:0-1)", "gpu:a100:2", False),
    (wk.OWNER_SLURM, "IDLE", "gpu:a100:1", None, False),  # check off
    (wk.OWNER_SLURM, "UNKNOWN", None, "gpu:a100:2", False),  # not registered yet
    (wk.OWNER_KUBERNETES, "IDLE", "gpu:a100:1", "gpu:a100:2", False),  # Slurm's slurmd is gone
])
def test_only_a_registered_slurm_owned_node_is_held(owner: str, slurm_state: str,
                                                    reported: str | None,
                                                    expected: str | None, held: bool) -> None:
    state, node = _state(owner, slurm_state, reported, expected)
    assessment = assess(state, node, 100.0)
    assert (assessment.gres_problem is not None) == held
    assert any(h.startswith("GRES") for h in assessment.slurm_holds) == held
    if held:
        assert assessment.phase == Phase.HELD


@given(st.integers(0, 64), st.integers(0, 64),
       st.sampled_from(["NVIDIA-A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla-T4", ""]),
       st.booleans(), st.sampled_from(["", "(S:0-1)", "(IDX:0-3)", ",nic:2"]))
def test_the_check_holds_exactly_when_slurm_differs(count: int, registered_count: int,
                                                    product: str, mapped: bool,
                                                    suffix: str) -> None:
    """Slurm registering the Node's own GPUs (whatever socket or index suffix and other
    GRES it adds) is never a problem; any other GPU count is."""
    type_map = {product: "mapped"} if mapped and product else None
    expected = expected_gres(k8s_node(str(count), product or None), type_map)
    kind = gpu_type(product, type_map) if product else ""
    registered = node_gres(Gres(registered_count, kind)) + (suffix if registered_count else "")
    assert (gres_problem(registered or None, expected) is None) == (registered_count == count)
