"""Nodeset `spec.slurmd.auth`: parsed (every bad field named), rendered into the pod as munge
and Slurm require of a key, part of the pod's revision, and absent = today's pod exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import K8sNodesetObserved, SlurmdAuth
from sunkd.domain.policy.slurmd import revision, spec_from_json, spec_json
from sunkd.kubernetes.normalize import parse_nodeset, slim_nodeset
from sunkd.kubernetes.slurmd_auth import (
    MUNGE_KEY_DIR,
    MUNGED_CONTAINER,
    SLURM_KEY_ENV,
    SLURM_KEY_PATH,
    munged_script,
)
from sunkd.kubernetes.slurmd_pod import render
from sunkd.kubernetes.slurmd_spec import parse_slurmd
from sunkd.kubernetes.wire import MalformedObject

MUNGE = {"type": "munge", "keySecret": {"name": "munge-key"}}
SLURM = {"type": "slurm", "keySecret": {"name": "slurm-key", "key": "key"}}


def spec(auth: Any = None, **more: Any) -> Any:
    raw: dict[str, Any] = {"image": "img:1", **more}
    if auth is not None:
        raw["auth"] = auth
    return parse_slurmd(raw, "gpu")


def pod(auth: Any = None, **more: Any) -> dict[str, Any]:
    return render(spec(auth, **more), nodeset="gpu", namespace="slurm", nodeset_uid="u",
                  slurm_node="node1", k8s_node="k1", name="gpu-node1")


def test_absent_and_plain_munge_render_todays_pod_and_keep_its_revision() -> None:
    plain = spec({"type": "munge"})
    assert spec().auth is None and plain.auth == SlurmdAuth()
    assert pod() == pod({"type": "munge"})
    assert "initContainers" not in pod()["spec"]
    assert revision(plain) == revision(spec())
    # Not given, it is not in the spec's text (the log, the revision of pods made before).
    assert "auth" not in json.loads(spec_json(spec()))


def test_munge_with_a_key_secret_runs_munged_as_a_native_sidecar() -> None:
    rendered = pod(MUNGE)["spec"]
    (sidecar,) = rendered["initContainers"]
    assert sidecar["name"] == MUNGED_CONTAINER and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "img:1"
    assert sidecar["securityContext"]["runAsUser"] == 0  # owns the Secret's root file
    key_mount = sidecar["volumeMounts"][0]
    # A Secret volume's keys are symlinks; munged refuses one, a subPath mount is the file.
    assert key_mount == {"name": "sunkd-munge-key", "mountPath": f"{MUNGE_KEY_DIR}/munge.key",
                         "subPath": "munge.key", "readOnly": True}
    volumes = {v["name"]: v for v in rendered["volumes"]}
    secret = volumes["sunkd-munge-key"]["secret"]
    assert secret["secretName"] == "munge-key" and secret["defaultMode"] == 0o400
    assert secret["items"] == [{"key": "munge.key", "path": "munge.key", "mode": 0o400}]
    assert volumes["sunkd-munge-socket"] == {"name": "sunkd-munge-socket", "emptyDir": {}}
    socket = {"name": "sunkd-munge-socket", "mountPath": "/run/munge"}
    assert socket in sidecar["volumeMounts"]
    assert socket in rendered["containers"][0]["volumeMounts"]
    assert sidecar["startupProbe"]["exec"]["command"] == [
        "test", "-S", "/run/munge/munge.socket.2"]
    script = sidecar["command"][2]
    # The emptyDir is 0777: munged refuses it without the sticky bit, so 0755 first.
    assert script.startswith("chmod 0755 /run/munge && exec munged --foreground")
    assert f"--key-file={MUNGE_KEY_DIR}/munge.key" in script
    assert "--socket=/run/munge/munge.socket.2" in script and "--force" not in script


def test_munge_image_and_socket_dir() -> None:
    rendered = pod({**MUNGE, "mungeImage": "munge:0.5", "mungeSocketDir": "/var/run/m"})
    (sidecar,) = rendered["spec"]["initContainers"]
    assert sidecar["image"] == "munge:0.5"
    assert "--socket=/var/run/m/munge.socket.2" in sidecar["command"][2]
    assert {"name": "sunkd-munge-socket", "mountPath": "/var/run/m"} in \
        rendered["spec"]["containers"][0]["volumeMounts"]
    assert munged_script("/run/a b").startswith("chmod 0755 '/run/a b' ")


def test_auth_slurm_mounts_the_key_and_points_slurm_at_it() -> None:
    rendered = pod(SLURM)["spec"]
    assert "initContainers" not in rendered
    container = rendered["containers"][0]
    assert {"name": SLURM_KEY_ENV, "value": SLURM_KEY_PATH} in container["env"]
    assert {"name": "sunkd-slurm-key", "mountPath": "/etc/sunkd-slurm-key",
            "readOnly": True} in container["volumeMounts"]
    (volume,) = rendered["volumes"]
    assert volume["secret"]["items"] == [{"key": "key", "path": "slurm.key", "mode": 0o400}]
    assert spec({"type": "slurm", "keySecret": {"name": "k"}}).auth.key_secret_key == \
        "slurm.key"


def test_every_auth_change_is_a_new_revision() -> None:
    revisions = {revision(spec(a)) for a in (
        None, MUNGE, SLURM, {"keySecret": {"name": "munge-key", "key": "other"}},
        {**MUNGE, "mungeImage": "m"}, {**MUNGE, "mungeSocketDir": "/run/m"},
        {"type": "slurm", "keySecret": {"name": "munge-key"}})}
    assert len(revisions) == 7


@pytest.mark.parametrize("auth", [MUNGE, SLURM, {"type": "munge"}])
def test_the_spec_round_trips_through_the_log(auth: Any) -> None:
    parsed = spec(auth, volumes=[{"name": "etc", "configMap": {"name": "c"}}])
    assert spec_from_json(spec_json(parsed)) == parsed
    observed = parse_nodeset(slim_nodeset({
        "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
        "metadata": {"name": "gpu", "namespace": "slurm", "uid": "u"},
        "spec": {"nodeSelector": {"a": "b"}, "slurmd": {"image": "i", "auth": auth}}}))
    assert isinstance(observed, K8sNodesetObserved) and observed.slurmd is not None
    body = encode_payload(observed)
    assert decode_payload(observed.kind, body) == observed
    nothing = dict(body, slurmd={k: v for k, v in body["slurmd"].items() if k != "auth"})
    decoded = decode_payload(observed.kind, nothing)
    assert isinstance(decoded, K8sNodesetObserved) and decoded.slurmd is not None
    assert decoded.slurmd.auth is None  # a row written before the field


@pytest.mark.parametrize(("auth", "more", "field", "why"), [
    ("munge", {}, "spec.slurmd.auth", "not an object"),
    ({"type": "kerberos"}, {}, "spec.slurmd.auth.type", "munge, slurm"),
    ({"type": "slurm"}, {}, "spec.slurmd.auth.keySecret", "required for type slurm"),
    ({"keySecret": "munge"}, {}, "spec.slurmd.auth.keySecret", "name and key"),
    ({"keySecret": {"name": "Bad_Name"}}, {}, "spec.slurmd.auth.keySecret.name", "Secret name"),
    ({"keySecret": {"name": "k", "key": "a/b"}}, {}, "spec.slurmd.auth.keySecret.key",
     "Secret key"),
    ({"keySecret": {"name": "k", "extra": 1}}, {}, "spec.slurmd.auth.keySecret", "name and key"),
    ({"mungeImage": "m"}, {}, "spec.slurmd.auth.mungeImage", "with keySecret"),
    ({**SLURM, "mungeSocketDir": "/run/m"}, {}, "spec.slurmd.auth.mungeSocketDir",
     "type munge"),
    ({**MUNGE, "mungeSocketDir": "run/m"}, {}, "spec.slurmd.auth.mungeSocketDir", "absolute"),
    ({**MUNGE, "mungeSocketDir": "/run/../etc"}, {}, "spec.slurmd.auth.mungeSocketDir",
     "absolute"),
    ({**MUNGE, "mungeSocketDir": "/run/m;rm"}, {}, "spec.slurmd.auth.mungeSocketDir",
     "absolute"),
    ({**MUNGE, "mungeSocketDir": "/etc"}, {}, "spec.slurmd.auth.mungeSocketDir",
     "would hide the key's directory"),
    ({**MUNGE, "mungeSocketDir": "/etc/sunkd-munge/munge.key"}, {},
     "spec.slurmd.auth.mungeSocketDir", "or lie in it"),
    ({**MUNGE, "bogus": 1}, {}, "spec.slurmd.auth", "unknown field(s): bogus"),
    (MUNGE, {"volumes": [{"name": "munge", "hostPath": {"path": "/run/munge"}}],
             "volumeMounts": [{"name": "munge", "mountPath": "/run/munge/"}]},
     "spec.slurmd.volumeMounts[0].mountPath", "munged's socket directory"),
    (None, {"volumes": [{"name": "sunkd-munge-key", "emptyDir": {}}]},
     "spec.slurmd.volumes[0].name", "sunkd's"),
    (SLURM, {"env": [{"name": "SLURM_SACK_KEY", "value": "/k"}]}, "spec.slurmd.env",
     "SLURM_SACK_KEY"),
])
def test_refusals_name_the_field(auth: Any, more: dict[str, Any], field: str, why: str
                                 ) -> None:
    with pytest.raises(MalformedObject) as raised:
        spec(auth, **more)
    assert raised.value.field == field and why in raised.value.why, str(raised.value)


def test_a_site_munge_mount_is_fine_without_a_key_secret() -> None:
    mounted = spec({"type": "munge"}, volumes=[{"name": "munge", "hostPath": {"path": "/r"}}],
                   volumeMounts=[{"name": "munge", "mountPath": "/run/munge"}])
    assert mounted.auth == SlurmdAuth()


_VALUES = (st.none() | st.text(max_size=6) | st.integers(-1, 2)
           | st.sampled_from(["munge", "slurm", "/run/m", "k", "munge-key"]))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)  # 2 shared cores
@given(st.dictionaries(st.sampled_from(["type", "keySecret", "mungeImage", "mungeSocketDir",
                                        "other"]),
                       _VALUES | st.dictionaries(st.sampled_from(["name", "key", "x"]),
                                                 _VALUES, max_size=3), max_size=4))
def test_any_auth_is_refused_with_a_field_or_renders_a_consistent_pod(
        auth: dict[str, Any]) -> None:
    try:
        parsed = spec(auth)
    except MalformedObject as error:
        assert error.field.startswith("spec.slurmd")
        return
    rendered = render(parsed, nodeset="gpu", namespace="slurm", nodeset_uid="u",
                      slurm_node="node1", k8s_node="k1", name="gpu-node1")["spec"]
    names = [v["name"] for v in rendered["volumes"]]
    assert len(names) == len(set(names))
    containers = rendered["containers"] + rendered.get("initContainers", [])
    for container in containers:
        paths = [m["mountPath"] for m in container["volumeMounts"]]
        assert len(paths) == len(set(paths))
        assert all(m["name"] in names for m in container["volumeMounts"])
    assert spec_from_json(spec_json(parsed)) == parsed
    if parsed.auth is None or not parsed.auth.key_secret:
        assert revision(parsed) == revision(spec()) and "initContainers" not in rendered


@pytest.mark.parametrize("crd", ["manifests/crds/nodeset.yaml", "charts/sunkd/crds/nodeset.yaml"])
def test_both_crds_declare_every_auth_field(crd: str) -> None:
    # The API server prunes what the schema does not declare: a missing field would reach
    # sunkd as no `auth` at all.
    from pathlib import Path

    import yaml

    from sunkd.kubernetes.slurmd_auth import AUTH_TYPES, FIELDS

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / crd).read_text())
    auth = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["slurmd"]["properties"]["auth"]
    assert set(auth["properties"]) == FIELDS
    assert tuple(auth["properties"]["type"]["enum"]) == AUTH_TYPES
    assert set(auth["properties"]["keySecret"]["properties"]) == {"name", "key"}
