"""The real kubectl 1.32 against the Kubernetes API emulator, typed as a user would.

kubectl is an independent client: if it accepts the emulator's discovery, Tables,
OpenAPI, patches, eviction and watch streams, the emulator is faithful where kubectl looks.
No `--validate=false` anywhere. Each test gets its own emulator, kubeconfig and
discovery cache directory (KUBECACHEDIR) — the cache dir is needed only because
emulators on reused ports would otherwise meet a stale 6-hour discovery cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sunkd.testbed.kubeapi import KubeAPIEmulator
from tests.conftest import require
from tests.integration.kubeapi_support import node, pod

pytestmark = pytest.mark.kubectl
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Kubectl:
    def __init__(self, tmp: Path, api: KubeAPIEmulator) -> None:
        self.api = api
        self.env = dict(os.environ)
        self.env["KUBECONFIG"] = str(api.write_kubeconfig(tmp / "kubeconfig"))
        # Per-test discovery cache (needed only because this is an emulator; see docstring).
        self.env["KUBECACHEDIR"] = str(tmp / "kube-cache")
        self.env["HOME"] = str(tmp)

    async def __call__(self, *args: str, ok: bool = True, stdin: str | None = None,
                       wait: float = 60.0) -> Result:
        process = await asyncio.create_subprocess_exec(
            "kubectl", *args, env=self.env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(
            process.communicate(stdin.encode() if stdin else None), wait)
        result = Result(process.returncode or 0, out.decode(), err.decode())
        if ok:
            assert result.rc == 0, f"kubectl {' '.join(args)} failed: {result.err}"
        return result

    async def spawn(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            "kubectl", *args, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)


@pytest.fixture
async def api() -> AsyncIterator[KubeAPIEmulator]:
    require(shutil.which("kubectl") is not None, "kubectl missing")
    async with KubeAPIEmulator() as emu:
        yield emu


@pytest.fixture
def kubectl(tmp_path: Path, api: KubeAPIEmulator) -> Kubectl:
    return Kubectl(tmp_path, api)


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


async def test_version_and_get_nodes(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    api.create(ready_node("node-a", {"pool": "gpu-a"}))
    api.create(ready_node("node-b"))
    version = await kubectl("version", "-o", "json")
    assert json.loads(version.out)["serverVersion"]["minor"] == "32"
    listed = json.loads((await kubectl("get", "nodes", "-o", "json")).out)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["node-a", "node-b"]
    table = (await kubectl("get", "nodes")).out.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert table[1].split()[:3] == ["node-a", "Ready", "<none>"]
    selected = await kubectl("get", "nodes", "-l", "pool in (gpu-a),!missing", "-o", "name")
    assert selected.out.split() == ["node/node-a"]
    missing = await kubectl("get", "node", "nope", ok=False)
    assert missing.rc == 1
    assert 'Error from server (NotFound): nodes "nope" not found' in missing.err


async def test_get_nodes_watch_sees_a_change(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    api.create(ready_node("node-a"))
    process = await kubectl.spawn("get", "nodes", "-w", "--output-watch-events")
    assert process.stdout is not None
    try:
        header = await asyncio.wait_for(process.stdout.readline(), 20)
        assert header.decode().split()[:3] == ["EVENT", "NAME", "STATUS"]
        added = await asyncio.wait_for(process.stdout.readline(), 20)
        assert added.decode().split()[:3] == ["ADDED", "node-a", "Ready"]
        # The watch may not be open yet when the list line is printed: wait for it.
        for _ in range(200):
            if api.open_watch_count():
                break
            await asyncio.sleep(0.02)
        api.patch("nodes", "node-a", {"spec": {"unschedulable": True}})
        changed = await asyncio.wait_for(process.stdout.readline(), 20)
        assert changed.decode().split()[:3] == ["MODIFIED", "node-a",
                                                "Ready,SchedulingDisabled"]
    finally:
        process.kill()
        await process.wait()


async def test_cordon_taint_label_annotate(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    api.create(ready_node("node-a"))
    out = await kubectl("cordon", "node-a")
    assert "node/node-a cordoned" in out.out
    assert api.get("nodes", "node-a")["spec"]["unschedulable"] is True
    await kubectl("taint", "node", "node-a", "sunkd.io/owner=slurm:NoSchedule")
    await kubectl("taint", "node", "node-a", "other=x:NoExecute")
    taints = api.get("nodes", "node-a")["spec"]["taints"]
    assert {(t["key"], t["effect"]) for t in taints} == {
        ("sunkd.io/owner", "NoSchedule"), ("other", "NoExecute")}
    await kubectl("taint", "node", "node-a", "other-")
    assert [t["key"] for t in api.get("nodes", "node-a")["spec"]["taints"]] == [
        "sunkd.io/owner"]
    await kubectl("label", "node", "node-a", "sunkd.io/owner=slurm")
    await kubectl("annotate", "node", "node-a", "sunkd.io/cordoned-by=sunkd")
    meta = api.get("nodes", "node-a")["metadata"]
    assert meta["labels"]["sunkd.io/owner"] == "slurm"
    assert meta["annotations"]["sunkd.io/cordoned-by"] == "sunkd"
    await kubectl("label", "node", "node-a", "sunkd.io/owner-")
    assert "sunkd.io/owner" not in api.get("nodes", "node-a")["metadata"].get("labels", {})
    out = await kubectl("uncordon", "node-a")
    assert "node/node-a uncordoned" in out.out
    assert not api.get("nodes", "node-a")["spec"].get("unschedulable")


async def test_apply_crd_and_nodeset(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    await kubectl("get", "nodes")  # warm the discovery cache before the CRD exists
    out = await kubectl("apply", "-f", str(ROOT / "manifests" / "crds"))
    assert "customresourcedefinition.apiextensions.k8s.io/nodesets.sunkd.io created" in out.out
    example = ROOT / "manifests" / "examples" / "nodeset.yaml"
    out = await kubectl("apply", "-f", str(example))
    assert "nodeset.sunkd.io/gpu-a created" in out.out
    api.patch("nodesets", "gpu-a", {"status": {"counts": {
        "nodes": 8, "slurm": 5, "kubernetes": 2, "moving": 1, "held": 0}}}, "sunkd",
        subresource="status")
    table = (await kubectl("get", "nds", "-n", "sunkd")).out.splitlines()
    assert table[0].split() == ["NAME", "SLURM", "K8S", "MOVING", "HELD", "AGE"]
    assert table[1].split()[:5] == ["gpu-a", "5", "2", "1", "0"]
    wide = (await kubectl("get", "nodesets.sunkd.io", "-n", "sunkd", "-o", "wide")).out
    assert wide.splitlines()[0].split() == [
        "NAME", "SLURM", "K8S", "MOVING", "HELD", "NODES", "MODE", "AGE"]
    # Re-apply unchanged, then with a change (client-side apply: merge patch for CRs).
    out = await kubectl("apply", "-f", str(example))
    assert "nodeset.sunkd.io/gpu-a unchanged" in out.out
    changed = example.read_text().replace("minSlurm: 2", "minSlurm: 3")
    out = await kubectl("apply", "-f", "-", stdin=changed)
    assert "nodeset.sunkd.io/gpu-a configured" in out.out
    got = api.get("nodesets", "gpu-a", "sunkd")
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


async def test_describe_node_shows_events(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    created = api.create(ready_node("node-a"))
    # An Event as sunkd emits it: core/v1, involvedObject = the node, in `default`.
    api.create({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "node-a.17a0b1c2d3e4f5a6", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "node-a",
                           "uid": created["metadata"]["uid"], "apiVersion": "v1"},
        "reason": "LentToKubernetes", "message": "sunkd: node lent to Kubernetes (tx 42)",
        "type": "Normal", "source": {"component": "sunkd"}, "count": 1,
    })
    out = (await kubectl("describe", "node", "node-a")).out
    events = out[out.index("Events:"):]
    row = next(line.split() for line in events.splitlines() if "LentToKubernetes" in line)
    # Type, Reason, Age, From, Message
    assert row[0] == "Normal" and row[1] == "LentToKubernetes" and row[3] == "sunkd"
    assert " ".join(row[4:]) == "sunkd: node lent to Kubernetes (tx 42)"


async def test_drain_blocked_by_pdb_then_allowed(api: KubeAPIEmulator,
                                                 kubectl: Kubectl) -> None:
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


async def test_get_lease(api: KubeAPIEmulator, kubectl: Kubectl) -> None:
    manifest = json.dumps({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "sunkd-leader", "namespace": "kube-system"},
        "spec": {"holderIdentity": "sunkd-0_4f2a", "leaseDurationSeconds": 15,
                 "renewTime": "2026-01-01T00:00:00.000000Z"}})
    out = await kubectl("apply", "-f", "-", stdin=manifest)
    assert "lease.coordination.k8s.io/sunkd-leader created" in out.out
    table = (await kubectl("get", "lease", "-n", "kube-system")).out.splitlines()
    assert table[0].split() == ["NAME", "HOLDER", "AGE"]
    assert table[1].split()[:2] == ["sunkd-leader", "sunkd-0_4f2a"]
    api.patch("leases", "sunkd-leader", {"spec": {"holderIdentity": "sunkd-1_9c"}},
              "kube-system")
    got = await kubectl("get", "lease", "sunkd-leader", "-n", "kube-system", "-o",
                        "jsonpath={.spec.holderIdentity}")
    assert got.out == "sunkd-1_9c"
