"""sunkd/domain/gres.py: GPU count and type from a Node, Slurm's config strings, and the
comparison with what Slurm reports."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd.domain.gres import (
    Gres,
    GresError,
    gpu_type,
    gres_conf_line,
    gres_from_node,
    gres_matches,
    node_gres,
    parse_gres,
)


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
