"""kubectl, typed as a user would, on both backends (tests/integration/kube_backends.py):
the system kubectl 1.32 against the Kubernetes API emulator, and the kubectl built with
the control plane (v1.37.2) against the real kube-apiserver.

kubectl is an independent client: if it accepts the emulator's discovery, Tables,
OpenAPI, patches, eviction and watch streams, the emulator is faithful where kubectl looks;
the same assertions on the real server keep the emulator honest. No `--validate=false`
anywhere. Each test gets its own kubeconfig and discovery cache directory (KUBECACHEDIR),
needed because emulators on reused ports would otherwise meet a stale 6-hour discovery
cache. Emulator only: drain (its request log shows the eviction went through the Eviction
subresource; the real drain is tests/integration/test_kubectl_real.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sunkd.kubernetes.client import EVENTS, LEASES, NODES, KubeClient, nodesets
from sunkd_testbed.kubernetes import available, default_bin_dir
from tests.conftest import require
from tests.integration.kube_backends import Kube
from tests.integration.kube_helpers import create_node_object
from tests.integration.kubeapi_support import node, pod

pytestmark = pytest.mark.kubectl
ROOT = Path(__file__).resolve().parents[2]
CONTROLLER_TAINTS = ("node.kubernetes.io/",)  # the real node-lifecycle controller's


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Kubectl:
    def __init__(self, tmp: Path, kube: Kube, binary: str) -> None:
        self.kube = kube
        self.binary = binary
        self.env = dict(os.environ)
        self.env["KUBECONFIG"] = str(kube.write_kubeconfig(tmp / "kubeconfig"))
        # Per-test discovery cache (needed only because this is an emulator; see docstring).
        self.env["KUBECACHEDIR"] = str(tmp / "kube-cache")
        self.env["HOME"] = str(tmp)

    async def __call__(self, *args: str, ok: bool = True, stdin: str | None = None,
                       wait: float = 60.0) -> Result:
        process = await asyncio.create_subprocess_exec(
            self.binary, *args, env=self.env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(
            process.communicate(stdin.encode() if stdin else None), wait)
        result = Result(process.returncode or 0, out.decode(), err.decode())
        if ok:
            assert result.rc == 0, f"kubectl {' '.join(args)} failed: {result.err}"
        return result

    async def spawn(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            self.binary, *args, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)


def system_kubectl() -> str:
    found = shutil.which("kubectl")
    require(found is not None, "kubectl missing")
    assert found is not None
    return found


def built_kubectl() -> str:
    ok, why = available()
    require(ok, why)
    return str(default_bin_dir() / "kubectl")


@pytest.fixture
def kubectl(tmp_path: Path, kube: Kube) -> Kubectl:
    binary = built_kubectl() if kube.real else system_kubectl()
    return Kubectl(tmp_path, kube, binary)


def ready_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    n = node(name, labels)
    n["status"]["nodeInfo"] = {"kubeletVersion": "v1.32.4"}
    n["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.1"}]
    return n


def controlled_pod(name: str, node_name: str, labels: dict[str, str]) -> dict[str, Any]:
    p = pod(name, node_name, labels)
    # drain refuses pods without a controller unless --force; a ReplicaSet owner is not
    # looked up by kubectl (kubectl's drain.go, only the controller reference is checked).
    p["metadata"]["ownerReferences"] = [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs",
        "uid": "5a6e0b2c-0000-4000-8000-000000000001", "controller": True}]
    return p


async def add_node(client: KubeClient, name: str,
                   labels: dict[str, str] | None = None) -> dict[str, Any]:
    return await create_node_object(client, ready_node(name, labels))


def own_taints(node_obj: dict[str, Any]) -> set[tuple[str, str]]:
    """A Node's taints but the node-lifecycle controller's (the real server adds
    node.kubernetes.io/unschedulable to a cordoned node; the emulator has no controller)."""
    return {(t["key"], t["effect"]) for t in node_obj["spec"].get("taints") or []
            if not t["key"].startswith(CONTROLLER_TAINTS)}


async def test_version_and_get_nodes(kube: Kube, kubectl: Kubectl) -> None:
    await add_node(kube.client, "node-a", {"pool": "gpu-a"})
    await add_node(kube.client, "node-b")
    version = await kubectl("version", "-o", "json")
    assert json.loads(version.out)["serverVersion"]["minor"] == ("37" if kube.real else "32")
    listed = json.loads((await kubectl("get", "nodes", "-o", "json")).out)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["node-a", "node-b"]
    table = (await kubectl("get", "nodes")).out.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert table[1].split()[:3] == ["node-a", "Ready", "<none>"]
    assert table[1].split()[4] == "v1.32.4"
    selected = await kubectl("get", "nodes", "-l", "pool in (gpu-a),!missing", "-o", "name")
    assert selected.out.split() == ["node/node-a"]
    missing = await kubectl("get", "node", "nope", ok=False)
    assert missing.rc == 1
    assert 'Error from server (NotFound): nodes "nope" not found' in missing.err


async def test_get_nodes_watch_sees_a_change(kube: Kube, kubectl: Kubectl) -> None:
    await add_node(kube.client, "node-a")
    process = await kubectl.spawn("get", "nodes", "-w", "--output-watch-events")
    assert process.stdout is not None
    try:
        header = await asyncio.wait_for(process.stdout.readline(), 20)
        assert header.decode().split()[:3] == ["EVENT", "NAME", "STATUS"]
        added = await asyncio.wait_for(process.stdout.readline(), 20)
        assert added.decode().split()[:3] == ["ADDED", "node-a", "Ready"]
        if kube.emulator is not None:
            # The watch may not be open yet when the list line is printed: wait for it.
            for _ in range(200):
                if kube.emulator.open_watch_count():
                    break
                await asyncio.sleep(0.02)
        await kube.client.merge_patch(NODES, "node-a", {"spec": {"unschedulable": True}})
        changed = await asyncio.wait_for(process.stdout.readline(), 20)
        assert changed.decode().split()[:3] == ["MODIFIED", "node-a",
                                                "Ready,SchedulingDisabled"]
    finally:
        process.kill()
        await process.wait()


async def test_cordon_taint_label_annotate(kube: Kube, kubectl: Kubectl) -> None:
    client = kube.client
    await add_node(client, "node-a")
    out = await kubectl("cordon", "node-a")
    assert "node/node-a cordoned" in out.out
    assert (await client.get(NODES, "node-a"))["spec"]["unschedulable"] is True
    await kubectl("taint", "node", "node-a", "sunkd.io/owner=slurm:NoSchedule")
    await kubectl("taint", "node", "node-a", "other=x:NoExecute")
    assert own_taints(await client.get(NODES, "node-a")) == {
        ("sunkd.io/owner", "NoSchedule"), ("other", "NoExecute")}
    await kubectl("taint", "node", "node-a", "other-")
    assert own_taints(await client.get(NODES, "node-a")) == {("sunkd.io/owner", "NoSchedule")}
    await kubectl("label", "node", "node-a", "sunkd.io/owner=slurm")
    await kubectl("annotate", "node", "node-a", "sunkd.io/cordoned-by=sunkd")
    meta = (await client.get(NODES, "node-a"))["metadata"]
    assert meta["labels"]["sunkd.io/owner"] == "slurm"
    assert meta["annotations"]["sunkd.io/cordoned-by"] == "sunkd"
    await kubectl("label", "node", "node-a", "sunkd.io/owner-")
    meta = (await client.get(NODES, "node-a"))["metadata"]
    assert "sunkd.io/owner" not in meta.get("labels", {})
    out = await kubectl("uncordon", "node-a")
    assert "node/node-a uncordoned" in out.out
    assert not (await client.get(NODES, "node-a"))["spec"].get("unschedulable")


async def test_apply_crd_and_nodeset(kube: Kube, kubectl: Kubectl) -> None:
    client = kube.client
    await kubectl("get", "nodes")  # warm the discovery cache before the CRD exists
    out = await kubectl("apply", "-f", str(ROOT / "manifests" / "crds"))
    assert "customresourcedefinition.apiextensions.k8s.io/nodesets.sunkd.io created" in out.out
    # The real server establishes a new CRD asynchronously (the emulator at once).
    await kubectl("wait", "--for=condition=Established", "crd/nodesets.sunkd.io",
                  "--timeout=30s")
    example = ROOT / "manifests" / "examples" / "nodeset.yaml"
    out = await kubectl("apply", "-f", str(example))
    assert "nodeset.sunkd.io/gpu-a created" in out.out
    rt = nodesets()
    await client.merge_patch(rt, "gpu-a", {"status": {"counts": {
        "nodes": 8, "slurm": 5, "kubernetes": 2, "moving": 1, "held": 0}}}, "sunkd",
        subresource="status")
    table = (await kubectl("get", "nds", "-n", "sunkd")).out.splitlines()
    assert table[0].split() == ["NAME", "SLURM", "K8S", "MOVING", "HELD", "AGE"]
    assert table[1].split()[:5] == ["gpu-a", "5", "2", "1", "0"]
    wide = (await kubectl("get", "nodesets.sunkd.io", "-n", "sunkd", "-o", "wide")).out
    assert wide.splitlines()[0].split() == [
        "NAME", "SLURM", "K8S", "MOVING", "HELD", "NODES", "MODE", "SLURMD", "AGE"]
    # Re-apply unchanged, then with a change (client-side apply: merge patch for CRs).
    out = await kubectl("apply", "-f", str(example))
    assert "nodeset.sunkd.io/gpu-a unchanged" in out.out
    changed = example.read_text().replace("minSlurm: 2", "minSlurm: 3")
    out = await kubectl("apply", "-f", "-", stdin=changed)
    assert "nodeset.sunkd.io/gpu-a configured" in out.out
    got = await client.get(rt, "gpu-a", "sunkd")
    assert got["spec"]["ownership"]["minSlurm"] == 3
    assert got["metadata"]["generation"] == 2
    assert got["status"]["counts"]["slurm"] == 5  # spec writes keep status
    # Schema validation reaches the user through kubectl.
    bad = changed.replace("mode: Auto", "mode: Sometimes")
    out = await kubectl("apply", "-f", "-", stdin=bad, ok=False)
    assert out.rc != 0 and 'Unsupported value: "Sometimes"' in out.err
    # Strategic merge on a CR is refused; merge works.
    out = await kubectl("patch", "nds", "gpu-a", "-n", "sunkd", "-p",
                        '{"spec":{"nodeSelector":{"x":"y"}}}', ok=False)
    assert "is not supported by sunkd.io/v1alpha1, Kind=Nodeset" in out.err
    await kubectl("patch", "nds", "gpu-a", "-n", "sunkd", "--type=merge", "-p",
                  '{"spec":{"nodeSelector":{"x":"y"}}}')


async def test_describe_node_shows_events(kube: Kube, kubectl: Kubectl) -> None:
    created = await add_node(kube.client, "node-a")
    # An Event as sunkd emits it: core/v1, involvedObject = the node, in `default`.
    await kube.client.create(EVENTS, {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "node-a.17a0b1c2d3e4f5a6", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "node-a",
                           "uid": created["metadata"]["uid"], "apiVersion": "v1"},
        "reason": "LentToKubernetes", "message": "sunkd: node lent to Kubernetes (tx 42)",
        "type": "Normal", "source": {"component": "sunkd"}, "count": 1,
    }, "default")
    out = (await kubectl("describe", "node", "node-a")).out
    events = out[out.index("Events:"):]
    row = next(line.split() for line in events.splitlines() if "LentToKubernetes" in line)
    # Type, Reason, Age, From, Message
    assert row[0] == "Normal" and row[1] == "LentToKubernetes" and row[3] == "sunkd"
    assert " ".join(row[4:]) == "sunkd: node lent to Kubernetes (tx 42)"


@pytest.mark.emulator_only("the emulator's request log shows drain used the Eviction API; "
                           "the real drain: test_kubectl_real.py")
async def test_drain_blocked_by_pdb_then_allowed(kube: Kube, kubectl: Kubectl) -> None:
    api = kube.faults
    api.create(ready_node("node-a"))
    api.create(controlled_pod("web-1", "node-a", {"app": "web"}))
    api.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    blocked = await kubectl("drain", "node-a", "--ignore-daemonsets", "--timeout=1s", ok=False)
    assert blocked.rc == 1
    assert "Cannot evict pod as it would violate the pod's disruption budget." in blocked.err
    assert "global timeout reached" in blocked.err
    assert api.get("nodes", "node-a")["spec"]["unschedulable"] is True
    assert api.get("pods", "web-1", "default")
    # Eviction went through the subresource (not a DELETE that bypasses the PDB).
    assert any(r.path.endswith("/pods/web-1/eviction") for r in api.requests)
    await kubectl("patch", "pdb", "web", "--type=merge", "-p",
                  '{"spec":{"minAvailable":0}}')
    drained = await kubectl("drain", "node-a", "--ignore-daemonsets", "--timeout=20s")
    assert "pod/web-1 evicted" in drained.out
    assert "node/node-a drained" in drained.out
    assert api.list("pods", field_selector="spec.nodeName=node-a") == []


async def test_get_lease(kube: Kube, kubectl: Kubectl) -> None:
    manifest = json.dumps({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "sunkd-leader", "namespace": "kube-system"},
        "spec": {"holderIdentity": "sunkd-0_4f2a", "leaseDurationSeconds": 15,
                 "renewTime": "2026-01-01T00:00:00.000000Z"}})
    out = await kubectl("apply", "-f", "-", stdin=manifest)
    assert "lease.coordination.k8s.io/sunkd-leader created" in out.out
    table = (await kubectl("get", "lease", "-n", "kube-system")).out.splitlines()
    assert table[0].split() == ["NAME", "HOLDER", "AGE"]
    row = next(line.split() for line in table[1:] if line.startswith("sunkd-leader "))
    assert row[:2] == ["sunkd-leader", "sunkd-0_4f2a"]
    await kube.client.merge_patch(LEASES, "sunkd-leader", {"spec": {
        "holderIdentity": "sunkd-1_9c"}}, "kube-system")
    got = await kubectl("get", "lease", "sunkd-leader", "-n", "kube-system", "-o",
                        "jsonpath={.spec.holderIdentity}")
    assert got.out == "sunkd-1_9c"


async def test_typed_create_namespace(kube: Kube, tmp_path: Path) -> None:
    """`kubectl create namespace` sends its body as protobuf (kubectl's typed clients do).
    The real server creates it; the emulator, which has no protobuf codec, answers an honest
    415 (once an HTTP 500 with a Python traceback in its log)."""
    kubectl = Kubectl(tmp_path, kube, built_kubectl())
    result = await kubectl("create", "namespace", "serve", ok=False)
    if kube.real:
        assert (result.rc, result.out.strip()) == (0, "namespace/serve created")
        return
    assert result.rc == 1
    assert result.err.strip() == (
        "Error from server (UnsupportedMediaType): the body of the request was in an "
        "unknown format - accepted media types include: application/json, "
        "application/yaml (the sunkd API emulator has no protobuf codec)")
    assert kube.emulator is not None
    posted = [r for r in kube.emulator.requests if r.method == "POST"]
    assert posted[-1].content_type == "application/vnd.kubernetes.protobuf"
    # The same namespace as JSON (kubectl apply sends JSON) is created.
    manifest = json.dumps({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": "serve"}})
    assert "namespace/serve created" in (await kubectl("apply", "-f", "-",
                                                        stdin=manifest)).out
    assert (await kubectl("get", "pods", "-n", "serve")).rc == 0
    # apps/v1 is not emulated: a 404 from the router, before any body is read (once a 500).
    refused = await kubectl("create", "deployment", "web", "--image=registry.invalid/w",
                            ok=False)
    assert refused.rc == 1
    assert "the server could not find the requested resource" in refused.err
