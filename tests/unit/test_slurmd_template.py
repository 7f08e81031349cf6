"""Nodeset `spec.slurmd.template` (kubernetes/slurmd_template.py): a partial PodTemplateSpec
merged onto sunkd's slurmd pod. What it may add lands on the pod; every field sunkd owns is
refused with an error naming it; a change of it is a new revision (the rolling update
replaces the pods); and whatever a template says, even one that never went through the
check, the rendered pod keeps sunkd's invariants."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import K8sNodesetObserved, SlurmdSpec
from sunkd.domain.policy.slurmd import revision, spec_from_json, spec_json
from sunkd.kubernetes.normalize import parse_nodeset
from sunkd.kubernetes.slurmd_pod import render
from sunkd.kubernetes.slurmd_spec import parse_slurmd
from sunkd.kubernetes.wire import MalformedObject

BASE: dict[str, Any] = {
    "image": "slurmd:22.05",
    "env": [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}],
    "resources": {"requests": {"cpu": "500m"}},
    "volumes": [{"name": "etc", "configMap": {"name": "slurm-conf"}}],
    "volumeMounts": [{"name": "etc", "mountPath": "/etc/slurm"}],
}
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "hpc"}, "annotations": {"example.com/owner": "hpc"}},
    "spec": {
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"fsGroup": 1000},
        "serviceAccountName": "slurmd",
        "dnsPolicy": "ClusterFirstWithHostNet",
        "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["slurmctld"]}],
        "initContainers": [{"name": "prep", "image": "busybox", "command": ["true"]}],
        "containers": [
            {"name": "slurmd",
             "env": [{"name": "EXTRA", "value": "1"}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
             "resources": {"limits": {"memory": "1Gi"}},
             "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
             "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
             "readinessProbe": {"exec": {"command": ["scontrol", "ping"]}}},
            {"name": "munged", "image": "munge:1", "volumeMounts": [
                {"name": "scratch", "mountPath": "/run/munge"}]},
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
}


def spec_of(template: Any, **fields: Any) -> SlurmdSpec:
    spec = parse_slurmd({**BASE, **fields, "template": template}, "gpu")
    assert spec is not None
    return spec


def pod_of(spec: SlurmdSpec, slurm_node: str = "node1") -> dict[str, Any]:
    return render(spec, nodeset="gpu", namespace="slurm", nodeset_uid="uid-gpu",
                  slurm_node=slurm_node, k8s_node="k8s-1", name="gpu-node1")


def test_a_template_adds_to_the_pod() -> None:
    pod = pod_of(spec_of(TEMPLATE))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"] == {"team": "hpc", wk.LABEL_SLURMD_NODESET: "gpu",
                              wk.LABEL_SLURMD_NODE: "node1"}
    assert meta["annotations"]["example.com/owner"] == "hpc"
    assert wk.ANNOTATION_SLURMD_REVISION in meta["annotations"]
    assert spec["tolerations"] == [
        {"key": wk.TAINT_OWNER, "operator": "Equal", "value": wk.OWNER_SLURM,
         "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["securityContext"] == {"fsGroup": 1000}
    assert spec["serviceAccountName"] == "slurmd"
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["slurmctld"]}]
    assert spec["initContainers"] == [{"name": "prep", "image": "busybox", "command": ["true"]}]
    slurmd, munged = spec["containers"]
    assert munged["name"] == "munged" and munged["image"] == "munge:1"
    assert slurmd["name"] == "slurmd" and slurmd["image"] == "slurmd:22.05"
    assert slurmd["command"] == ["slurmd", "-D", "-N", "node1"]
    assert slurmd["env"] == [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"},
                             {"name": "EXTRA", "value": "1"}]
    assert slurmd["volumeMounts"] == [{"name": "etc", "mountPath": "/etc/slurm"},
                                      {"name": "scratch", "mountPath": "/scratch"}]
    assert slurmd["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    assert slurmd["securityContext"] == {"privileged": True,
                                         "capabilities": {"add": ["SYS_ADMIN"]}}
    assert slurmd["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "1"]}}}
    assert slurmd["readinessProbe"] == {"exec": {"command": ["scontrol", "ping"]}}
    assert spec["volumes"] == [{"name": "etc", "configMap": {"name": "slurm-conf"}},
                               {"name": "scratch", "emptyDir": {}}]
    assert spec["nodeName"] == "k8s-1" and spec["hostNetwork"] is True
    json.dumps(pod)


def test_without_a_template_the_pod_and_revision_are_unchanged() -> None:
    """The field is new: a spec without it keeps its revision (an upgrade of sunkd replaces
    no pod) and its JSON in the log (codec and action args)."""
    assert revision(SlurmdSpec(image="i")) == "e21536c019"  # the value before the field
    assert "template" not in json.loads(spec_json(SlurmdSpec(image="i")))
    body = encode_payload(K8sNodesetObserved(pool="slurm/gpu", slurmd=SlurmdSpec(image="i")))
    assert "template" not in body["slurmd"]
    assert pod_of(spec_of(None)) == pod_of(spec_of({}))


def test_a_template_change_is_a_new_revision_and_round_trips() -> None:
    plain, templated = spec_of(None), spec_of(TEMPLATE)
    assert revision(plain) != revision(templated)
    other = json.loads(json.dumps(TEMPLATE))
    other["metadata"]["labels"]["team"] = "ml"
    assert revision(spec_of(other)) != revision(templated)
    reordered = {"spec": TEMPLATE["spec"], "metadata": TEMPLATE["metadata"]}
    assert revision(spec_of(reordered)) == revision(templated)  # canonical JSON
    assert spec_from_json(spec_json(templated)) == templated
    body = encode_payload(K8sNodesetObserved(pool="slurm/gpu", slurmd=templated))
    assert decode_payload("k8s.nodeset.observed", body) == K8sNodesetObserved(
        pool="slurm/gpu", slurmd=templated)


def test_a_template_change_alone_rolls_the_pods_through_the_protected_update() -> None:
    """The domain's rolling update (policy/slurmdupdate.py) sees the new revision: the
    first node gets sunkd's update drain, one at a time (maxUnavailable 1), before any pod
    is deleted."""
    from sunkd.domain.policy import VERB_DRAIN
    from tests.unit.test_slurmd_update import OLD, arg, brought_up, drains, nodeset, step

    log = brought_up()
    assert drains(step(log, 9.0)) == []
    with_template = dataclasses.replace(OLD, template=json.dumps(
        {"metadata": {"labels": {"team": "hpc"}}}, sort_keys=True, separators=(",", ":")))
    nodeset(log, with_template, 10.0)
    decisions = step(log, 11.0)
    assert drains(decisions) == ["n1"], decisions
    assert arg(decisions, VERB_DRAIN, "reason") == wk.REASON_SLURMD_UPDATE


def test_the_nodeset_carries_it_through_normalize() -> None:
    observed = parse_nodeset({
        "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
        "metadata": {"name": "gpu", "namespace": "slurm", "uid": "u", "generation": 1},
        "spec": {"slurm": {"partitions": ["gpu"]}, "slurmd": {**BASE, "template": TEMPLATE}}})
    assert isinstance(observed, K8sNodesetObserved) and observed.slurmd is not None
    assert json.loads(observed.slurmd.template or "") == TEMPLATE


def _with(path: str, value: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {}, "spec": {}}
    *parents, last = path.split(".")
    node = template
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return template


def _slurmd(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "slurmd", **fields}]}}


@pytest.mark.parametrize(("template", "field", "why"), [
    ("pod", "spec.slurmd.template", "not an object"),
    ({"apiVersion": "v1"}, "spec.slurmd.template", "unknown field(s): apiVersion"),
    (_with("metadata.name", "x"), "spec.slurmd.template.metadata.name", "sunkd's to set"),
    (_with("metadata.ownerReferences", []), "spec.slurmd.template.metadata.ownerReferences",
     "sunkd's to set"),
    (_with("metadata.labels", {wk.LABEL_SLURMD_NODESET: "x"}),
     f"spec.slurmd.template.metadata.labels.{wk.LABEL_SLURMD_NODESET}", "sunkd's own"),
    (_with("metadata.labels", {wk.LABEL_SLURMD_BUSY: "true"}),
     f"spec.slurmd.template.metadata.labels.{wk.LABEL_SLURMD_BUSY}", "sunkd's own"),
    (_with("metadata.annotations", {wk.ANNOTATION_SLURMD_REVISION: "x"}),
     f"spec.slurmd.template.metadata.annotations.{wk.ANNOTATION_SLURMD_REVISION}",
     "sunkd's own"),
    (_with("metadata.labels", {"a": "no spaces"}), "spec.slurmd.template.metadata.labels.a",
     "not a label value"),
    (_with("metadata.labels", {"a": 1}), "spec.slurmd.template.metadata.labels.a",
     "not a string"),
    (_with("spec.nodeName", "k8s-2"), "spec.slurmd.template.spec.nodeName", "binds"),
    (_with("spec.hostNetwork", False), "spec.slurmd.template.spec.hostNetwork", "sunkd's"),
    (_with("spec.nodeSelector", {"a": "b"}), "spec.slurmd.template.spec.nodeSelector",
     "NodeAffinity"),
    (_with("spec.affinity", {}), "spec.slurmd.template.spec.affinity", "nodeName"),
    (_with("spec.restartPolicy", "Never"), "spec.slurmd.template.spec.restartPolicy",
     "sunkd's"),
    (_with("spec.priorityClassName", "low"), "spec.slurmd.template.spec.priorityClassName",
     "spec.slurmd.priorityClassName"),
    (_with("spec.priority", 0), "spec.slurmd.template.spec.priority", "priorityClassName"),
    (_with("spec.terminationGracePeriodSeconds", 1),
     "spec.slurmd.template.spec.terminationGracePeriodSeconds", "spec.slurmd"),
    (_with("spec.activeDeadlineSeconds", 1),
     "spec.slurmd.template.spec.activeDeadlineSeconds", "running jobs"),
    (_with("spec.overhead", {}), "spec.slurmd.template.spec.overhead", "not supported"),
    (_with("spec.dnsPolicy", "ClusterFirst"), "spec.slurmd.template.spec.dnsPolicy",
     "host network"),
    (_with("spec.tolerations", "all"), "spec.slurmd.template.spec.tolerations",
     "not a list of objects"),
    (_with("spec.automountServiceAccountToken", "yes"),
     "spec.slurmd.template.spec.automountServiceAccountToken", "not a boolean"),
    (_slurmd(image="other"), "spec.slurmd.template.spec.containers[0].image",
     "spec.slurmd.image"),
    (_slurmd(command=["sh"]), "spec.slurmd.template.spec.containers[0].command", "sunkd runs"),
    (_slurmd(args=["-v"]), "spec.slurmd.template.spec.containers[0].args", "spec.slurmd.args"),
    (_slurmd(stdin=True), "spec.slurmd.template.spec.containers[0].stdin", "not supported"),
    (_slurmd(securityContext={"privileged": False}),
     "spec.slurmd.template.spec.containers[0].securityContext.privileged",
     "spec.slurmd.privileged"),
    (_slurmd(env=[{"name": "SLURM_CONF", "value": "/x"}]),
     "spec.slurmd.template.spec.containers[0].env[0]", "already in spec.slurmd.env"),
    (_slurmd(volumeMounts=[{"name": "x", "mountPath": "/etc/slurm"}]),
     "spec.slurmd.template.spec.containers[0].volumeMounts[0]",
     "already in spec.slurmd.volumeMounts"),
    (_slurmd(resources={"requests": {"cpu": "1"}}),
     "spec.slurmd.template.spec.containers[0].resources.requests",
     "already in spec.slurmd.resources.requests"),
    (_with("spec.containers", [{"name": "log"}]),
     "spec.slurmd.template.spec.containers[0].image", "missing"),
    (_with("spec.containers", [{"name": "Log", "image": "x"}]),
     "spec.slurmd.template.spec.containers[0].name", "DNS label"),
    (_with("spec.initContainers", [{"name": "slurmd", "image": "x"}]),
     "spec.slurmd.template.spec.initContainers[0].name", "already a container"),
    (_with("spec.containers", [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]),
     "spec.slurmd.template.spec.containers[1].name", "twice"),
    (_with("spec.volumes", [{"name": "etc", "emptyDir": {}}]),
     "spec.slurmd.template.spec.volumes[0].name", "already in spec.slurmd.volumes"),
])
def test_what_sunkd_owns_is_refused_with_the_field(template: Any, field: str,
                                                   why: str) -> None:
    with pytest.raises(MalformedObject) as raised:
        parse_slurmd({**BASE, "template": template}, "gpu")
    assert raised.value.field == field
    assert why in raised.value.why


def test_a_malformed_template_makes_the_whole_nodeset_malformed() -> None:
    """Bad input never reaches the log: the source reports a MalformedObject, nothing is
    folded (as for every field of spec.slurmd)."""
    with pytest.raises(MalformedObject, match=r"spec\.slurmd\.template\.spec\.nodeName"):
        parse_nodeset({
            "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": "gpu", "namespace": "slurm", "uid": "u", "generation": 1},
            "spec": {"slurm": {"partitions": ["gpu"]},
                     "slurmd": {**BASE, "template": _with("spec.nodeName", "x")}}})


# ------------------------------------------------------------------ the invariants

_OWNED_KEYS = ["nodeName", "hostNetwork", "restartPolicy", "priorityClassName",
               "terminationGracePeriodSeconds", "nodeSelector", "containers", "initContainers",
               "tolerations", "volumes", "dnsPolicy", "serviceAccountName", "hostname"]
_scalar = st.none() | st.booleans() | st.integers(-1, 2) | st.sampled_from(
    ["", "x", "slurmd", "etc", "k8s-2", "Never", wk.LABEL_SLURMD_NODESET])
_container = st.fixed_dictionaries(
    {"name": st.sampled_from(["slurmd", "side", "etc", "prep"]) | _scalar},
    optional={"image": _scalar, "command": st.lists(st.text(max_size=3), max_size=2) | _scalar,
              "args": st.lists(st.text(max_size=3), max_size=2),
              "env": st.lists(st.fixed_dictionaries({"name": st.sampled_from(
                  ["SLURM_CONF", "X"]), "value": st.text(max_size=2)}), max_size=2) | _scalar,
              "securityContext": st.fixed_dictionaries(
                  {}, optional={"privileged": st.booleans()}) | _scalar,
              "volumeMounts": st.lists(st.fixed_dictionaries(
                  {"name": st.sampled_from(["etc", "x"]),
                   "mountPath": st.sampled_from(["/etc/slurm", "/x"])}), max_size=2)})
_values = _scalar | st.lists(_container | _scalar, max_size=3) | st.dictionaries(
    st.sampled_from(["a", wk.LABEL_SLURMD_NODESET, wk.ANNOTATION_SLURMD_REVISION,
                     wk.LABEL_SLURMD_BUSY]), _scalar, max_size=3)
_templates = st.fixed_dictionaries({}, optional={
    "metadata": st.dictionaries(st.sampled_from(["labels", "annotations", "name",
                                                 "ownerReferences"]), _values, max_size=3)
    | _scalar,
    "spec": st.dictionaries(st.sampled_from(_OWNED_KEYS), _values, max_size=6) | _scalar,
}) | _scalar


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])  # 2 shared cores
@given(_templates, st.sampled_from(["node1", "Node_1", "n" * 70]))
def test_whatever_the_template_says_sunkds_invariants_hold(template: Any,
                                                           slurm_node: str) -> None:
    """Straight into the spec, without the check (as an old log entry could carry it): the
    pod stays bound to its node, on the host network, tolerating the owner taint, owned by
    the Nodeset, labelled and annotated as sunkd's, running sunkd's slurmd command from
    spec.slurmd's image, privileged as spec.slurmd says, restarting in place. And the check
    either refuses the template with a field under spec.slurmd.template or accepts it."""
    base = spec_of(None)
    plain = pod_of(base, slurm_node)
    spec = dataclasses.replace(base, template=json.dumps(template))
    pod = pod_of(spec, slurm_node)
    json.dumps(pod)
    for key in ("name", "namespace", "ownerReferences"):
        assert pod["metadata"][key] == plain["metadata"][key]
    for key in ("labels", "annotations"):
        for name, value in plain["metadata"][key].items():
            if name != wk.ANNOTATION_SLURMD_REVISION:  # the template is part of it (below)
                assert pod["metadata"][key][name] == value
        assert not {k for k in pod["metadata"][key] if k.startswith(wk.PREFIX)} \
            - set(plain["metadata"][key])
    assert pod["metadata"]["annotations"][wk.ANNOTATION_SLURMD_REVISION] == revision(spec)
    for key in ("nodeName", "hostNetwork", "restartPolicy", "priorityClassName",
                "terminationGracePeriodSeconds"):
        assert pod["spec"][key] == plain["spec"][key]
    assert "nodeSelector" not in pod["spec"] and "hostname" not in pod["spec"]
    assert pod["spec"]["tolerations"][0] == plain["spec"]["tolerations"][0]
    slurmd = pod["spec"]["containers"][0]
    want = plain["spec"]["containers"][0]
    for key in ("name", "image", "imagePullPolicy", "command"):
        assert slurmd[key] == want[key]
    assert "args" not in slurmd
    assert slurmd["securityContext"]["privileged"] is True
    assert slurmd["env"][:len(want["env"])] == want["env"]
    assert slurmd["volumeMounts"][:len(want["volumeMounts"])] == want["volumeMounts"]
    names = [c.get("name") for c in pod["spec"]["containers"]
             + pod["spec"].get("initContainers", [])]
    assert names.count("slurmd") == 1 and len(names) == len(set(names))
    volumes = [v.get("name") for v in pod["spec"]["volumes"]]
    assert pod["spec"]["volumes"][0] == plain["spec"]["volumes"][0]
    assert len(volumes) == len(set(volumes))
    try:
        checked = parse_slurmd({**BASE, "template": template}, "gpu")
    except MalformedObject as error:
        assert error.field.startswith("spec.slurmd.template")
    else:
        assert checked is not None


# --- the template beside spec.slurmd.auth (both render into the same pod) ---------------

MUNGE_AUTH = {"type": "munge", "keySecret": {"name": "munge-key"}}


def test_template_init_containers_keep_the_munged_sidecar() -> None:
    """The auth's munged sidecar is an init container (a native sidecar); the template's
    init containers come after it. A template container of the sidecar's name is refused
    by the check and, unchecked, keeps sunkd's (container names are unique across
    containers and initContainers)."""
    pod = pod_of(spec_of({"spec": {"initContainers": [
        {"name": "prep", "image": "busybox", "command": ["true"]}]}}, auth=MUNGE_AUTH))
    inits = pod["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["munged", "prep"]
    assert inits[0]["image"] == BASE["image"]
    for key in ("initContainers", "containers"):
        with pytest.raises(MalformedObject, match="munged"):
            spec_of({"spec": {key: [{"name": "munged", "image": "evil"}]}}, auth=MUNGE_AUTH)
    unchecked = dataclasses.replace(spec_of(None, auth=MUNGE_AUTH), template=json.dumps(
        {"spec": {"initContainers": [{"name": "munged", "image": "evil"}],
                  "containers": [{"name": "munged", "image": "evil"}]}}))
    pod = pod_of(unchecked)
    containers = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    assert [c["image"] for c in containers if c["name"] == "munged"] == [BASE["image"]]


def test_template_fs_group_is_refused_beside_the_munged_sidecar() -> None:
    """fsGroup makes the kubelet give the Secret's key to the group; munged refuses a
    group-readable key and would never start."""
    with pytest.raises(MalformedObject, match="fsGroup"):
        spec_of({"spec": {"securityContext": {"fsGroup": 1000}}}, auth=MUNGE_AUTH)
    assert spec_of({"spec": {"securityContext": {"fsGroup": 1000}}}).template
