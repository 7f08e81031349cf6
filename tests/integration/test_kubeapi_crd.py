"""CustomResourceDefinitions and the Nodeset CRD, on both backends (the API emulator and
the real kube-apiserver; tests/integration/kube_backends.py), over raw HTTP.

A CRD created over HTTP is served (discovery, OpenAPI, Table columns); custom resources
get generation, structural defaults, pruning, schema validation, the status subresource
rules, and 422 for PUT without resourceVersion. The real server establishes a CRD and
publishes its OpenAPI asynchronously (the emulator at once), so the tests wait for both.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.kube_backends import Kube
from tests.integration.kubeapi_support import MERGE, Raw

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests" / "crds" / "nodeset.yaml").read_text())
EXAMPLE = [d for d in yaml.safe_load_all((ROOT / "manifests" / "examples" / "nodeset.yaml")
                                         .read_text()) if d]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
BASE = "/apis/sunkd.io/v1alpha1/namespaces/default/nodesets"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


async def until(what: str, check: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def crd_gone(raw: Raw) -> None:
    """Delete the CRD (if any) and wait until it and its endpoint are gone: on the real
    server a CRD being deleted keeps a finalizer while its resources are removed."""
    await raw.delete(f"{CRDS}/nodesets.sunkd.io")

    async def gone() -> bool:
        return (await raw.get(f"{CRDS}/nodesets.sunkd.io"))[0] == 404 and \
            (await raw.get(BASE))[0] == 404

    await until("the CRD gone", gone)


@pytest.fixture
async def raw(kube: Kube) -> AsyncIterator[Raw]:
    """Raw HTTP on the backend. On the real server the CRD outlives a test (establishing
    one takes it ~2 s; the backend's reset empties it); a test that needs it absent says so
    with `crd_gone`."""
    async with kube.raw() as client:
        yield client


def nodeset(name: str = "gpu-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"slurm": {"partitions": ["gpu"]}, "nodeSelector": {"pool": name}}
    body.update(spec)
    return {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": name}, "spec": body}


async def install(raw: Raw) -> dict[str, Any]:
    """Create the CRD (unless an earlier test on this server did) and wait until it is
    Established and its endpoint answers."""
    status, crd = await raw.post(CRDS, CRD)
    assert status in (201, 409), crd

    async def established() -> dict[str, Any] | None:
        _, got = await raw.get(f"{CRDS}/nodesets.sunkd.io")
        conditions = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions")
                      or []}
        served = (await raw.get(BASE))[0] == 200
        return got if conditions.get("Established") == "True" and served else None

    established_crd: dict[str, Any] = await until("the CRD established", established)
    return established_crd


async def test_crd_is_served(raw: Raw) -> None:
    await crd_gone(raw)
    status, body = await raw.get(BASE)
    assert (status, body) == (404, "404 page not found\n")  # Go's mux, not a Status
    status, crd = await raw.post(CRDS, CRD)
    assert status == 201, crd
    await install(raw)
    status, body = await raw.get(BASE)
    assert status == 200 and body["kind"] == "NodesetList" and body["items"] == []
    _, groups = await raw.get("/apis")
    assert any(g["name"] == "sunkd.io" for g in groups["groups"])
    status, resources = await raw.get("/apis/sunkd.io/v1alpha1")
    names = {r["name"]: r for r in resources["resources"]}
    assert names["nodesets"]["shortNames"] == ["nds"] and "nodesets/status" in names
    status, agg = await raw.request(
        "GET", "/apis", headers={"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;"
                                 "as=APIGroupDiscoveryList,application/json"})
    group = next(i for i in agg["items"] if i["metadata"]["name"] == "sunkd.io")
    resource = group["versions"][0]["resources"][0]
    assert resource["responseKind"] == {"group": "sunkd.io", "version": "v1alpha1",
                                        "kind": "Nodeset"}
    assert resource["subresources"][0]["subresource"] == "status"

    async def published() -> bool:
        _, index = await raw.get("/openapi/v3")
        return "apis/sunkd.io/v1alpha1" in index["paths"]

    await until("the CRD's OpenAPI document", published)


async def test_create_applies_defaults_and_drops_status(raw: Raw) -> None:
    await install(raw)
    body = nodeset()
    body["status"] = {"counts": {"slurm": 3}}
    status, obj = await raw.post(BASE, body)
    assert status == 201, obj
    assert obj["metadata"]["generation"] == 1
    assert "status" not in obj  # status subresource: create drops .status
    assert obj["spec"]["ownership"] == {
        "mode": "Auto", "minSlurm": 0, "minKubernetes": 0, "prefer": "Slurm",
        "dwellSeconds": 300, "maxInFlight": 1, "drainTimeoutSeconds": 1800,
        "reclaimGraceSeconds": 300, "forecast": False, "forecastHorizonSeconds": 14400,
        "headroomQuantile": 0.9, "forecastBlockHours": 0}
    status, obj = await raw.post(BASE, nodeset("b", ownership={"mode": "Slurm",
                                                               "minSlurm": 4}))
    assert obj["spec"]["ownership"]["minSlurm"] == 4
    assert obj["spec"]["ownership"]["maxInFlight"] == 1


async def test_schema_validation_and_pruning(raw: Raw) -> None:
    await install(raw)
    status, body = await raw.post(BASE, nodeset(ownership={"mode": "Sometimes",
                                                           "maxInFlight": 0}))
    assert status == 422 and body["reason"] == "Invalid"
    causes = {c["field"]: c["message"] for c in body["details"]["causes"]}
    assert causes == {  # in either order: the real server's varies
        "spec.ownership.mode":
            'Unsupported value: "Sometimes": supported values: "Auto", "Slurm", "Kubernetes"',
        "spec.ownership.maxInFlight": "Invalid value: 0: spec.ownership.maxInFlight in body "
                                      "should be greater than or equal to 1"}
    assert body["message"].startswith('Nodeset.sunkd.io "gpu-a" is invalid: [')
    assert 'spec.ownership.mode: Unsupported value: "Sometimes"' in body["message"]
    status, body = await raw.post(BASE, {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
                                         "metadata": {"name": "x"}, "spec": {}})
    assert status == 422 and body["details"]["causes"][0]["field"] == "spec.slurm"
    # Unknown fields: pruned silently, or 400 with fieldValidation=Strict (kubectl's default).
    unknown = nodeset("u", bogus=1)
    status, body = await raw.request("POST", BASE, unknown,
                                     params={"fieldValidation": "Strict"})
    assert (status, body["message"]) == (400, 'Nodeset in version "v1alpha1" cannot be '
                                         'handled as a Nodeset: strict decoding error: '
                                         'unknown field "spec.bogus"')
    status, obj = await raw.post(BASE, unknown)
    assert status == 201 and "bogus" not in obj["spec"]


async def test_status_subresource_and_generation(raw: Raw) -> None:
    await install(raw)
    _, obj = await raw.post(BASE, nodeset())
    path = f"{BASE}/gpu-a"
    rv0 = obj["metadata"]["resourceVersion"]
    # /status writes ignore spec and metadata changes, do not bump generation.
    status, st = await raw.patch(path + "/status", {
        "metadata": {"labels": {"sneaky": "1"}},
        "spec": {"nodeSelector": {"pool": "changed"}},
        "status": {"observedGeneration": 1, "counts": {"slurm": 3, "kubernetes": 1}}}, MERGE)
    assert status == 200, st
    assert st["status"]["counts"] == {"slurm": 3, "kubernetes": 1}
    assert st["spec"]["nodeSelector"] == {"pool": "gpu-a"}
    assert "labels" not in st["metadata"]
    assert st["metadata"]["generation"] == 1
    assert int(st["metadata"]["resourceVersion"]) > int(rv0)
    # Main writes ignore status; metadata-only changes keep generation; spec bumps it.
    status, m = await raw.patch(path, {"metadata": {"labels": {"x": "1"}},
                                       "status": {"counts": {"slurm": 99}}}, MERGE)
    assert m["status"]["counts"]["slurm"] == 3 and m["metadata"]["generation"] == 1
    status, m = await raw.patch(path, {"spec": {"ownership": {"minSlurm": 2}}}, MERGE)
    assert m["metadata"]["generation"] == 2
    # Table with the printer columns.
    status, table = await raw.request("GET", BASE, headers=TABLE)
    assert [c["name"] for c in table["columnDefinitions"]][:6] == [
        "Name", "Slurm", "K8s", "Moving", "Held", "Nodes"]
    row = table["rows"][0]["cells"]
    assert row[:5] == ["gpu-a", 3, 1, None, None]
    assert row[-1].endswith("s")  # Age as a human duration, not a timestamp
    _, again = await raw.get(path)
    assert again["metadata"]["generation"] == 2


async def test_custom_resource_put_needs_resource_version(raw: Raw) -> None:
    await install(raw)
    _, obj = await raw.post(BASE, nodeset())
    stale = copy.deepcopy(obj)
    obj["metadata"].pop("resourceVersion")
    status, body = await raw.put(f"{BASE}/gpu-a", obj)
    assert status == 422
    assert body["message"] == ('nodesets.sunkd.io "gpu-a" is invalid: metadata.resourceVersion: '
                               "Invalid value: 0: must be specified for an update")
    await raw.patch(f"{BASE}/gpu-a", {"metadata": {"labels": {"a": "b"}}})
    status, body = await raw.put(f"{BASE}/gpu-a", stale)
    assert status == 409


async def test_example_manifest_is_valid(raw: Raw) -> None:
    await install(raw)
    for doc in EXAMPLE:
        if doc["kind"] == "Namespace":
            status, body = await raw.post("/api/v1/namespaces", doc)
            assert status in (201, 409), body
        else:
            namespace = doc["metadata"]["namespace"]
            status, body = await raw.post(
                f"/apis/sunkd.io/v1alpha1/namespaces/{namespace}/nodesets", doc)
            assert status == 201, body
    _, got = await raw.get("/apis/sunkd.io/v1alpha1/namespaces/sunkd/nodesets/gpu-a")
    assert got["spec"]["ownership"]["minSlurm"] == 2
    assert got["spec"]["ownership"]["dwellSeconds"] == 300


async def test_deleting_the_crd_removes_the_resources(raw: Raw) -> None:
    await install(raw)
    assert (await raw.post(BASE, nodeset()))[0] == 201
    status, _ = await raw.delete(f"{CRDS}/nodesets.sunkd.io")
    assert status == 200

    async def gone() -> bool:  # the real server first removes every custom resource
        return (await raw.get(BASE))[0] == 404 and \
            (await raw.get(f"{CRDS}/nodesets.sunkd.io"))[0] == 404

    await until("the CRD and its resources gone", gone)
    await install(raw)
    _, body = await raw.get(BASE)
    assert body["items"] == []


async def test_slurmd_spec_defaults_and_validation(raw: Raw) -> None:
    """spec.slurmd is additive: a Nodeset without it is unchanged (other tests), one with it
    gets its defaults, and a registration sunkd does not run yet is refused by the schema."""
    await install(raw)
    slurmd = {"image": "localhost/sunkd-slurmd:22.05",
              "volumes": [{"name": "etc", "configMap": {"name": "slurm"}}],
              "volumeMounts": [{"name": "etc", "mountPath": "/etc/slurm"}],
              "resources": {"requests": {"cpu": "500m", "memory": 1024}},
              "updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%"}}}
    status, obj = await raw.post(BASE, nodeset("pods", slurmd=slurmd))
    assert status == 201, obj
    got = obj["spec"]["slurmd"]
    assert got["registration"] == "Static" and got["imagePullPolicy"] == "IfNotPresent"
    assert got["priorityClassName"] == "system-node-critical" and got["privileged"] is True
    assert got["terminationGracePeriodSeconds"] == 60
    assert got["updateStrategy"] == {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxUnavailable": "25%"}}
    assert got["volumes"] == slurmd["volumes"]  # core/v1 Volumes kept whole
    assert got["resources"]["requests"] == {"cpu": "500m", "memory": 1024}
    status, obj = await raw.post(BASE, nodeset("dyn", slurmd={
        "image": "i", "registration": "Dynamic", "confServer": "ctl:6817",
        "conf": "Features=a100 Weight=5"}))
    assert status == 201, obj
    assert obj["spec"]["slurmd"]["registration"] == "Dynamic"
    status, body = await raw.post(BASE, nodeset("elastic", slurmd={"image": "i",
                                                                   "registration": "Elastic"}))
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "spec.slurmd.registration"
    status, body = await raw.post(BASE, nodeset("noimage", slurmd={}))
    assert status == 422 and body["details"]["causes"][0]["field"] == "spec.slurmd.image"


async def test_slurmd_template_is_kept_whole_and_a_bad_shape_refused(raw: Raw) -> None:
    """spec.slurmd.template (a partial PodTemplateSpec): the schema keeps the PodSpec
    fields as given (x-kubernetes-preserve-unknown-fields: a full PodSpec schema is
    impractical here), sunkd parses what the server returns, and the server itself refuses
    a template of the wrong shape before sunkd ever reads it."""
    from sunkd.kubernetes.slurmd_spec import parse_slurmd

    await install(raw)
    template = {
        "metadata": {"labels": {"team": "hpc"}, "annotations": {"example.com/a": "b"}},
        "spec": {"tolerations": [{"operator": "Exists"}],
                 "serviceAccountName": "slurmd",
                 "initContainers": [{"name": "prep", "image": "busybox",
                                     "command": ["true"], "resources": {}}],
                 "containers": [{"name": "slurmd", "env": [{"name": "X", "value": "1"}],
                                 "readinessProbe": {"exec": {"command": ["true"]}}},
                                {"name": "munged", "image": "munge:1"}],
                 "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}]}}
    status, obj = await raw.post(BASE, nodeset("templated", slurmd={"image": "i",
                                                                     "template": template}))
    assert status == 201, obj
    assert obj["spec"]["slurmd"]["template"] == template
    spec = parse_slurmd(obj["spec"]["slurmd"], "templated")
    assert spec is not None and spec.template is not None
    for name, bad, field in [
        ("t-string", "pod", "spec.slurmd.template"),
        ("t-label", {"metadata": {"labels": {"a": 1}}}, "spec.slurmd.template.metadata.labels.a"),
        ("t-spec", {"spec": []}, "spec.slurmd.template.spec"),
        ("t-containers", {"spec": {"containers": {"name": "x"}}},
         "spec.slurmd.template.spec.containers"),
        ("t-noname", {"spec": {"volumes": [{"emptyDir": {}}]}},
         "spec.slurmd.template.spec.volumes[0].name"),
    ]:
        status, body = await raw.post(BASE, nodeset(name, slurmd={"image": "i",
                                                                   "template": bad}))
        assert status == 422, (name, body)
        assert body["details"]["causes"][0]["field"] == field, (name, body)
