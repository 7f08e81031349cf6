"""The NetworkPolicy in manifests/: sunkd's HTTP API has no authentication,
so only kube-scheduler (the extender) and Prometheus (/metrics) may reach its port.

Checked on the rendered manifests of every variant (the Kubernetes schema check of
test_manifests.py covers the object's shape): the policy selects exactly sunkd's pods,
restricts ingress only, names the container's HTTP port, and -- evaluated with the
NetworkPolicy rules (a peer with both selectors needs both to match; `{}` matches all) --
admits the two clients and refuses everything else.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_manifests import VARIANTS, Obj, container, deployment, find


def _labels_match(selector: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector matches everything."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], \
            expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def admits(policy: Obj, namespace: str, policy_namespace: str,
           namespace_labels: dict[str, str], pod_labels: dict[str, str], port: Any) -> bool:
    """Would `policy` admit a connection from that pod to `port` (name or number)?"""
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port for p in ports):
            continue
        peers = rule.get("from")
        if not peers:
            return True  # no `from`: everyone
        for peer in peers:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                if not _labels_match(peer["namespaceSelector"], namespace_labels):
                    continue
            elif namespace != policy_namespace:
                continue  # a podSelector alone means the policy's own namespace
            if _labels_match(peer.get("podSelector"), pod_labels):
                return True
    return False


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    from tests.integration.test_manifests import render

    return {name: render(path) for name, path in VARIANTS.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_network_policy_admits_only_kube_scheduler_and_prometheus(
        rendered: dict[str, list[Obj]], variant: str) -> None:
    docs = rendered[variant]
    (policy,) = find(docs, "NetworkPolicy")
    spec = policy["spec"]
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    # It selects sunkd's pods (and nothing that is not sunkd).
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["podSelector"]["matchLabels"].get("app.kubernetes.io/name") == "sunkd"
    # Ingress only: sunkd must still reach the database, slurmrestd and the API server.
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    for rule in spec["ingress"]:
        assert rule.get("from"), "an ingress rule without `from` admits everyone"
        assert rule.get("ports"), "an ingress rule without `ports` opens every port"
        for port in rule["ports"]:
            assert port["port"] in ports or port["port"] in ports.values()
    namespace = policy["metadata"]["namespace"]

    def allowed(ns: str, labels: dict[str, str], port: Any = "http") -> bool:
        return admits(policy, ns, namespace, {"kubernetes.io/metadata.name": ns}, labels,
                      port)

    # kube-scheduler: kubeadm's control-plane label, or the "multiple schedulers" example.
    assert allowed("kube-system", {"component": "kube-scheduler", "tier": "control-plane"})
    assert allowed("sunkd", {"component": "scheduler", "tier": "control-plane"})
    # Prometheus (kube-prometheus-stack / the Prometheus Operator), from its namespace.
    assert allowed("monitoring", {"app.kubernetes.io/name": "prometheus",
                                  "prometheus": "k8s"})
    # Everyone else is refused: workloads, other pods of sunkd's namespace, unlabelled pods.
    assert not allowed("default", {"app": "web"})
    assert not allowed("ml", {"app": "serve"})
    assert not allowed("sunkd", {"app.kubernetes.io/name": "sunkd"})
    assert not allowed("kube-system", {})
    assert not allowed("monitoring", {"app.kubernetes.io/name": "grafana"})
    # ... and nobody reaches another port.
    assert not allowed("kube-system", {"component": "kube-scheduler"}, port=9090)
