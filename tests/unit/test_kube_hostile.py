"""Hostile Kubernetes objects, without a server: what the transforms refuse, what
the sanitiser cleans, and numbers that used to overflow."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sunkd.domain.events import K8sNodeObserved, K8sNodesetObserved, Label, OwnershipSpec
from sunkd.kubernetes.kubeconfig import KubeConfigNotFound, find_kubeconfig
from sunkd.kubernetes.normalize import (
    MAX_TEXT,
    _decimal_or_zero,
    clean_payload,
    clean_text,
    node_quantity,
    quantity_int,
    slim_node,
    slim_nodeset,
    slim_pod,
)
from sunkd.kubernetes.wire import MalformedObject, checked_key, parse_quantity


def test_clean_text_replaces_control_characters_and_bounds_length() -> None:
    assert clean_text("x\u0000") == "x\ufffd"
    assert clean_text("a\x1b[31mb\x07\x7f\x85\ud800") == "a\ufffd[31mb\ufffd\ufffd\ufffd\ufffd"
    assert clean_text("plain ünïcode 🙂") == "plain ünïcode 🙂"
    long = clean_text("y" * 10_000)
    assert len(long) == MAX_TEXT and long.endswith("...")


def test_clean_payload_cleans_every_string_and_keeps_clean_payloads() -> None:
    dirty = K8sNodeObserved(node="n1", slurm_node="n1", pin="slurm\u0000",
                            labels=(Label("sunkd.io/x", "a\u001bb"),))
    cleaned = clean_payload(dirty)
    assert cleaned.pin == "slurm\ufffd" and cleaned.labels == (Label("sunkd.io/x", "a\ufffdb"),)
    clean = K8sNodeObserved(node="n1", slurm_node="n1")
    assert clean_payload(clean) is clean
    infinite = K8sNodesetObserved(pool="ml/a", ownership=OwnershipSpec(dwell_seconds=float("inf")))
    with pytest.raises(MalformedObject):
        clean_payload(infinite)


@pytest.mark.parametrize("meta", [
    None, "x", {}, {"name": ""}, {"name": 5}, {"name": "a\u0000"}, {"name": "a/b"},
    {"name": "x" * 300}, {"name": "ok", "namespace": "bad ns"},
])
def test_objects_without_a_usable_identity_are_refused(meta: Any) -> None:
    with pytest.raises(MalformedObject):
        checked_key({"metadata": meta})


@pytest.mark.parametrize("broken", [
    {"spec": {"taints": "oops"}},
    {"spec": {"taints": ["oops"]}},
    {"status": {"conditions": {"type": "Ready"}}},
    {"metadata": {"name": "n", "labels": ["a"]}},
    {"metadata": {"name": "n", "annotations": "x"}},
    {"status": {"allocatable": 5}},
])
def test_slim_node_refuses_impossible_shapes(broken: dict[str, Any]) -> None:
    node: dict[str, Any] = {"metadata": {"name": "n"}, **broken}
    if "metadata" in broken:
        node["metadata"] = broken["metadata"]
    with pytest.raises(MalformedObject):
        slim_node(node)


def test_slim_pod_refuses_impossible_shapes() -> None:
    base = {"metadata": {"name": "p", "namespace": "ml"}}
    assert slim_pod(base).node is None
    for broken in ({"spec": {"nodeName": {"x": 1}}}, {"spec": {"containers": "c"}},
                   {"spec": {"containers": [{"resources": []}]}}, {"status": []}):
        with pytest.raises(MalformedObject):
            slim_pod({**base, **broken})
    with pytest.raises(MalformedObject):
        slim_pod({"metadata": {"name": "p"}})  # pods have namespaces


def test_slim_nodeset_refuses_what_does_not_parse_or_is_out_of_range() -> None:
    good = {"metadata": {"name": "a", "namespace": "ml"},
            "spec": {"nodeSelector": {"pool": "a"}, "ownership": {"minSlurm": 1}}}
    assert slim_nodeset(good) is good
    for spec in ({"ownership": {"minSlurm": "many"}}, {"ownership": {"dwell": "forever"}},
                 {"ownership": {"minSlurm": 10**12}}, {"ownership": {"dwellSeconds": 1e400}},
                 {"ownership": {"maxInFlight": float("inf")}},
                 {"workloadSelector": {"matchExpressions": [1]}},
                 {"workloadSelector": {"matchLabels": ["a"]}}, {"slurm": "gpu"}):
        with pytest.raises(MalformedObject):
            slim_nodeset({**good, "spec": {**good["spec"], **spec}})


def test_quantities_are_finite_and_bounded() -> None:
    for hostile in ("1e999999999", float("nan"), float("inf"), "-5", 10**5000, {"x": 1}):
        assert _decimal_or_zero(hostile) >= 0
        assert quantity_int(_decimal_or_zero(hostile), 1000) <= 2**63 - 1
    assert quantity_int(_decimal_or_zero("1e30"), 1000) == 2**63 - 1
    assert parse_quantity("500m") == Decimal("0.5")
    with pytest.raises(ValueError):
        parse_quantity("1e999999999")


def test_unparsable_node_quantities_are_unknown_not_zero_or_int64_max() -> None:
    """A Node's allocatable that is not a usable quantity is unknown (None), never 0 or
    2**63 - 1; absent is none (Kubernetes omits a resource the Node does not have)."""
    for hostile in ("NaN", "-4", "abc", "1e309", "1e99999999", float("nan"), float("inf"),
                    -1, None, {"x": 1}, "1e30"):
        assert node_quantity({"cpu": hostile}, "cpu", 1000) is None, hostile
    assert node_quantity({}, "cpu", 1000) == 0
    assert node_quantity({"cpu": "500m", "memory": "1Gi"}, "cpu", 1000) == 500
    assert node_quantity({"memory": "1Gi"}, "memory") == 2**30
    assert node_quantity({"nvidia.com/gpu": "8"}, "nvidia.com/gpu") == 8


def test_find_kubeconfig_says_where_it_looked(tmp_path: Any) -> None:
    env = {"HOME": str(tmp_path)}
    with pytest.raises(KubeConfigNotFound) as missing:
        find_kubeconfig(None, env)
    text = str(missing.value)
    assert "$KUBECONFIG is unset" in text and "not in a pod" in text
    with pytest.raises(KubeConfigNotFound, match="does not exist"):
        find_kubeconfig(str(tmp_path / "nope"), env)
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\n")
    assert find_kubeconfig(None, {**env, "KUBECONFIG": f"/missing:{config}"}) == \
        f"/missing:{config}"
    assert find_kubeconfig(str(config), env) == str(config)
