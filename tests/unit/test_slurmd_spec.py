"""Nodeset `spec.slurmd`: parsed into the domain's SlurmdSpec, every bad field named, the
event round-trips through the log's codec, and absent means no pods (today's behaviour)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import K8sNodesetObserved, Label, SlurmdSpec
from sunkd.kubernetes.normalize import parse_nodeset, slim_nodeset
from sunkd.kubernetes.slurmd_spec import parse_slurmd
from sunkd.kubernetes.wire import MalformedObject


def nodeset(slurmd: Any = None, name: str = "gpu") -> dict[str, Any]:
    spec: dict[str, Any] = {"slurm": {"partitions": ["gpu"]}, "nodeSelector": {"pool": "gpu"}}
    if slurmd is not None:
        spec["slurmd"] = slurmd
    return {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": name, "namespace": "slurm", "uid": "u-1", "generation": 3},
            "spec": spec}


FULL = {
    "image": "localhost/sunkd-slurmd:22.05.8",
    "imagePullPolicy": "Never",
    "confServer": "ctl:6817",
    "args": ["-f", "/etc/slurm/slurm.conf"],
    "env": [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}],
    "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": 2}},
    "volumes": [{"name": "etc", "configMap": {"name": "slurm-conf"}},
                {"name": "home", "persistentVolumeClaim": {"claimName": "home"}}],
    "volumeMounts": [{"name": "etc", "mountPath": "/etc/slurm"}],
    "terminationGracePeriodSeconds": 90,
    "updateStrategy": {"type": "OnDelete", "rollingUpdate": {"maxUnavailable": "25%"}},
    "maxConcurrentStartup": 4,
}


def test_absent_is_none_and_today_behaviour() -> None:
    parsed = parse_nodeset(nodeset())
    assert parsed.slurmd is None and parsed.uid == "u-1"


def test_every_field_parses() -> None:
    spec = parse_nodeset(slim_nodeset(nodeset(FULL))).slurmd
    assert spec is not None
    assert spec.image == FULL["image"] and spec.image_pull_policy == "Never"
    assert spec.registration == "Static" and spec.conf_server == "ctl:6817"
    assert spec.args == ("-f", "/etc/slurm/slurm.conf")
    assert spec.env == (Label("SLURM_CONF", "/etc/slurm/slurm.conf"),)
    assert spec.requests == (Label("cpu", "500m"), Label("memory", "256Mi"))
    assert spec.limits == (Label("cpu", "2"),)
    assert [json.loads(v)["name"] for v in spec.volumes] == ["etc", "home"]
    assert json.loads(spec.volume_mounts[0]) == {"name": "etc", "mountPath": "/etc/slurm"}
    assert spec.termination_grace_seconds == 90 and spec.privileged
    assert (spec.update_strategy, spec.max_unavailable) == ("OnDelete", "25%")
    assert spec.max_concurrent_startup == 4
    assert spec.priority_class_name == "system-node-critical"


def test_dynamic_registration_parses_with_its_conf_server_and_conf() -> None:
    spec = parse_slurmd({"image": "i", "registration": "Dynamic", "confServer": "ctl:6817",
                         "conf": "Features=a100  Weight=5"}, "gpu")
    assert spec is not None
    assert (spec.registration, spec.conf_server, spec.conf) == (
        "Dynamic", "ctl:6817", "Features=a100  Weight=5")


def test_a_dynamic_nodeset_needs_a_node_selector() -> None:
    # Selected by partition, a Dynamic node would be a member only once Slurm lists it,
    # i.e. once the pod sunkd would never create registered it.
    dynamic = {"image": "i", "registration": "Dynamic", "confServer": "c"}
    obj = nodeset(dynamic)
    del obj["spec"]["nodeSelector"]
    with pytest.raises(MalformedObject) as raised:
        slim_nodeset(obj)
    assert raised.value.field == "spec.nodeSelector"
    assert parse_nodeset(nodeset(dynamic)).slurmd is not None
    static = nodeset({"image": "i"})
    del static["spec"]["nodeSelector"]
    assert parse_nodeset(static).slurmd is not None


def test_defaults() -> None:
    spec = parse_slurmd({"image": "i"}, "gpu")
    assert spec == SlurmdSpec(image="i")
    assert (spec.update_strategy, spec.max_unavailable) == ("RollingUpdate", "1")


@pytest.mark.parametrize(("slurmd", "field", "why"), [
    ({}, "spec.slurmd.image", "missing"),
    ("x", "spec.slurmd", "not an object"),
    ({"image": "i", "registration": "Elastic"}, "spec.slurmd.registration", "Static, Dynamic"),
    ({"image": "i", "registration": "Dynamic"}, "spec.slurmd.confServer", "required for Dynamic"),
    ({"image": "i", "registration": "Dynamic", "confServer": "c", "conf": "NodeName=x"},
     "spec.slurmd.conf", "NodeName is not allowed"),
    ({"image": "i", "registration": "Dynamic", "confServer": "c", "conf": "Weight"},
     "spec.slurmd.conf", "not a Key=Value"),
    ({"image": "i", "registration": "Dynamic", "confServer": "c", "conf": "A='b c'"},
     "spec.slurmd.conf", "not a Key=Value"),
    ({"image": "i", "args": ["--conf", "x"]}, "spec.slurmd.args", "sunkd's to set"),
    ({"image": "i", "args": ["--conf-server=h:1"]}, "spec.slurmd.args", "sunkd's to set"),
    ({"image": "i", "conf": "Features=a"}, "spec.slurmd.conf", "Dynamic registration only"),
    ({"image": "i", "args": ["-N", "x"]}, "spec.slurmd.args", "sunkd's to set"),
    ({"image": "i", "args": "-v"}, "spec.slurmd.args", "not a list"),
    ({"image": "i", "env": [{"name": "A", "valueFrom": {}}]}, "spec.slurmd.env[0]", "valueFrom"),
    ({"image": "i", "env": [{"name": "1 bad"}]}, "spec.slurmd.env[0]", "valid name"),
    ({"image": "i", "resources": {"requests": {"cpu": "lots"}}},
     "spec.slurmd.resources.requests.cpu", "not a quantity"),
    ({"image": "i", "volumes": [{"configMap": {}}]}, "spec.slurmd.volumes[0].name", "missing"),
    ({"image": "i", "volumeMounts": [{"name": "a"}]},
     "spec.slurmd.volumeMounts[0].mountPath", "missing"),
    ({"image": "i", "terminationGracePeriodSeconds": -1},
     "spec.slurmd.terminationGracePeriodSeconds", "integer"),
    ({"image": "i", "updateStrategy": {"type": "Surge"}}, "spec.slurmd.updateStrategy.type",
     "RollingUpdate"),
    ({"image": "i", "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}},
     "spec.slurmd.updateStrategy.rollingUpdate.maxUnavailable", "positive"),
    ({"image": "i", "privileged": "yes"}, "spec.slurmd.privileged", "boolean"),
    ({"image": "i", "maxConcurrentStartup": 0}, "spec.slurmd.maxConcurrentStartup", "integer"),
    ({"image": "i", "imagePullPolicy": "Sometimes"}, "spec.slurmd.imagePullPolicy", "one of"),
    ({"image": "i", "bogus": 1}, "spec.slurmd", "unknown field(s): bogus"),
])
def test_bad_input_names_the_field(slurmd: Any, field: str, why: str) -> None:
    with pytest.raises(MalformedObject) as raised:
        slim_nodeset(nodeset(slurmd))
    assert raised.value.field == field and why in raised.value.why, str(raised.value)


def test_a_nodeset_name_that_cannot_label_its_pods_is_refused() -> None:
    with pytest.raises(MalformedObject, match="DNS label"):
        slim_nodeset(nodeset({"image": "i"}, name="x" * 64))
    parse_nodeset(nodeset(name="x" * 64))  # without spec.slurmd any name is fine


def test_the_event_round_trips_through_the_codec() -> None:
    observed = parse_nodeset(nodeset(FULL))
    assert isinstance(observed, K8sNodesetObserved)
    assert decode_payload(observed.kind, encode_payload(observed)) == observed


def test_an_older_row_without_the_fields_decodes_to_no_pods() -> None:
    body = encode_payload(parse_nodeset(nodeset()))
    del body["slurmd"], body["uid"]
    decoded = decode_payload("k8s.nodeset.observed", body)
    assert isinstance(decoded, K8sNodesetObserved)
    assert decoded.slurmd is None and decoded.uid == ""


@settings(suppress_health_check=[HealthCheck.too_slow])  # 2 shared cores
@given(st.dictionaries(st.sampled_from([*sorted(FULL), "registration", "conf", "privileged"]),
                       st.none() | st.integers(-2, 3) | st.text(max_size=4)
                       | st.sampled_from(["Dynamic", "Static", "Features=x Weight=2"])
                       | st.lists(st.text(max_size=3), max_size=2)
                       | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)))
def test_any_input_parses_or_is_refused_with_a_field(raw: dict[str, Any]) -> None:
    try:
        spec = parse_slurmd(raw, "gpu")
    except MalformedObject as error:
        assert error.field.startswith("spec.slurmd")
    else:
        assert spec is not None and spec.image
