"""Kubernetes API emulator: CustomResourceDefinitions and the Nodeset CRD.

A CRD created over HTTP is served at once (discovery, OpenAPI, Table columns); custom
resources get generation, structural defaults, pruning, schema validation, the status
subresource rules, and 422 for PUT without resourceVersion.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from sunkd.testbed.kubeapi import KubeAPIEmulator
from tests.integration.kubeapi_support import MERGE, Raw

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests" / "crds" / "nodeset.yaml").read_text())
EXAMPLE = [d for d in yaml.safe_load_all((ROOT / "manifests" / "examples" / "nodeset.yaml")
                                         .read_text()) if d]
BASE = "/apis/sunkd.io/v1alpha1/namespaces/default/nodesets"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


def nodeset(name: str = "gpu-a", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"slurm": {"partitions": ["gpu"]}, "nodeSelector": {"pool": name}}
    body.update(spec)
    return {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": name}, "spec": body}


async def install(raw: Raw) -> None:
    status, crd = await raw.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    assert status == 201, crd
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"


async def test_crd_is_served_at_once(raw: Raw) -> None:
    status, _ = await raw.get(BASE)
    assert status == 404
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
    _, index = await raw.get("/openapi/v3")
    assert "apis/sunkd.io/v1alpha1" in index["paths"]


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
        "reclaimGraceSeconds": 300}
    status, obj = await raw.post(BASE, nodeset("b", ownership={"mode": "Slurm",
                                                               "minSlurm": 4}))
    assert obj["spec"]["ownership"]["minSlurm"] == 4
    assert obj["spec"]["ownership"]["maxInFlight"] == 1


async def test_schema_validation_and_pruning(raw: Raw) -> None:
    await install(raw)
    status, body = await raw.post(BASE, nodeset(ownership={"mode": "Sometimes",
                                                           "maxInFlight": 0}))
    assert status == 422 and body["reason"] == "Invalid"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"spec.ownership.mode", "spec.ownership.maxInFlight"}
    assert 'Unsupported value: "Sometimes"' in body["message"]
    status, body = await raw.post(BASE, {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
                                         "metadata": {"name": "x"}, "spec": {}})
    assert status == 422 and body["details"]["causes"][0]["field"] == "spec.slurm"
    # Unknown fields: pruned silently, or 400 with fieldValidation=Strict (kubectl's default).
    unknown = nodeset("u", bogus=1)
    status, body = await raw.request("POST", BASE, unknown,
                                     params={"fieldValidation": "Strict"})
    assert status == 400 and 'unknown field "spec.bogus"' in body["message"]
    status, obj = await raw.post(BASE, unknown)
    assert status == 201 and "bogus" not in obj["spec"]


async def test_status_subresource_and_generation(api: KubeAPIEmulator, raw: Raw) -> None:
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
    # In-process reads see the same state.
    assert api.get("nodesets", "gpu-a", "default")["metadata"]["generation"] == 2


async def test_custom_resource_put_needs_resource_version(raw: Raw) -> None:
    await install(raw)
    _, obj = await raw.post(BASE, nodeset())
    stale = copy.deepcopy(obj)
    obj["metadata"].pop("resourceVersion")
    status, body = await raw.put(f"{BASE}/gpu-a", obj)
    assert status == 422
    assert "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" in \
        body["message"]
    await raw.patch(f"{BASE}/gpu-a", {"metadata": {"labels": {"a": "b"}}})
    status, body = await raw.put(f"{BASE}/gpu-a", stale)
    assert status == 409


async def test_example_manifest_is_valid(api: KubeAPIEmulator) -> None:
    api.create(CRD)
    for doc in EXAMPLE:
        api.create(doc, keep_status=False)
    got = api.get("nds", "gpu-a", "sunkd")
    assert got["spec"]["ownership"]["minSlurm"] == 2
    assert got["spec"]["ownership"]["dwellSeconds"] == 300


async def test_deleting_the_crd_removes_the_resources(api: KubeAPIEmulator, raw: Raw) -> None:
    await install(raw)
    await raw.post(BASE, nodeset())
    status, _ = await raw.delete(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodesets.sunkd.io")
    assert status == 200
    status, _ = await raw.get(BASE)
    assert status == 404
    await install(raw)
    _, body = await raw.get(BASE)
    assert body["items"] == []
