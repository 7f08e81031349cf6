"""The real Kubernetes control plane harness (sunkd_testbed.kubernetes) against itself.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from Go modules by
scripts/build-kubernetes.sh, driven with the kubectl built beside them and with the
harness kubelet. Skips when the binaries are not built (fails under SUNKD_TEST_STRICT=1).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sunkd_testbed.kubernetes import (
    KUBE_VERSION,
    HarnessKubelet,
    KubeControlPlane,
    KubeControlPlaneError,
    available,
)
from tests.conftest import require

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _assert_gone(plane: KubeControlPlane, pids: dict[str, int], base: Path) -> None:
    left = [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()]
    assert left == [], f"still running after stop(): {left}"
    assert _processes_mentioning(str(base)) == []
    assert not base.exists(), f"{base} not removed"


def _require_binaries() -> None:
    ok, why = available()
    require(ok, why)


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    _require_binaries()
    control_plane = KubeControlPlane()
    control_plane.start()  # binaries present but no plane: a failure, never a skip
    pids, base = dict(control_plane.pids), control_plane.base
    try:
        yield control_plane
    finally:
        control_plane.stop()
    _assert_gone(control_plane, pids, base)


def _json(plane: KubeControlPlane, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(plane.kubectl(*args, "-o", "json").stdout)
    return result


def test_harness_version_is_the_go_mod_pin() -> None:
    go_mod = (ROOT / "tests" / "kube" / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", go_mod, re.MULTILINE)
    assert match is not None, "tests/kube/go.mod requires no k8s.io/kubernetes"
    assert match.group(1) == KUBE_VERSION


def test_up_with_matching_kubectl(plane: KubeControlPlane) -> None:
    assert plane.startup_seconds is not None and plane.startup_seconds < 60
    assert set(plane.pids) == {"etcd", "kube-apiserver", "kube-controller-manager",
                               "kube-scheduler"}  # fmt: skip
    version = json.loads(plane.kubectl("version", "-o", "json").stdout)
    assert version["clientVersion"]["gitVersion"] == KUBE_VERSION
    assert version["serverVersion"]["gitVersion"] == KUBE_VERSION
    status, body = plane.get("/readyz")
    assert (status, body) == (200, b"ok")
    # Authentication and RBAC are on: no anonymous access, no rights for a stranger.
    can = plane.kubectl("auth", "can-i", "list", "pods", "--as=stranger", check=False)
    assert (can.returncode, can.stdout.strip()) == (1, "no")
    assert "kubernetes-admin" in plane.kubectl("auth", "whoami").stdout


async def _until(check: Any, what: str, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.25)


async def test_namespace_deployment_and_harness_node(plane: KubeControlPlane) -> None:
    kubectl = plane.kubectl
    assert "namespace/serve created" in kubectl("create", "namespace", "serve").stdout
    kubectl("-n", "serve", "create", "deployment", "web", "--image=registry.invalid/web:1",
            "--replicas=2")  # fmt: skip

    async with HarnessKubelet(plane) as kubelet:
        await kubelet.register_node("harness-w1", labels={"pool": "serve"})
        kubelet.start()
        await asyncio.to_thread(
            kubectl, "wait", "--for=condition=Ready", "node/harness-w1", "--timeout=30s"
        )
        node = _json(plane, "get", "node", "harness-w1")
        assert node["metadata"]["labels"]["pool"] == "serve"
        # Admission taints every new Node not-ready; the node-lifecycle controller lifts
        # the taint once it sees Ready=True.
        await _until(
            lambda: not _json(plane, "get", "node", "harness-w1")["spec"].get("taints"),
            "node-lifecycle controller removing the not-ready taint",
        )
        lease = _json(plane, "-n", "kube-node-lease", "get", "lease", "harness-w1")
        assert lease["spec"]["holderIdentity"] == "harness-w1"
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

        # Scheduler binds the pods to the harness node, the kubelet reports them Running.
        await asyncio.to_thread(
            kubectl, "-n", "serve", "rollout", "status", "deployment/web", "--timeout=60s"
        )
        pods = _json(plane, "-n", "serve", "get", "pods")["items"]
        assert len(pods) == 2
        assert {p["spec"]["nodeName"] for p in pods} == {"harness-w1"}
        assert {p["status"]["phase"] for p in pods} == {"Running"}

        renewed = lease["spec"]["renewTime"]
        await kubelet.renew_leases()
        lease = _json(plane, "-n", "kube-node-lease", "get", "lease", "harness-w1")
        assert lease["spec"]["renewTime"] > renewed

        # Garbage collector deletes the ReplicaSet's pods; the kubelet finalizes them.
        kubectl("-n", "serve", "delete", "deployment", "web")
        await _until(
            lambda: not _json(plane, "-n", "serve", "get", "pods")["items"], "pods finalized"
        )
        # The namespace controller empties and removes a deleted namespace.
        kubectl("delete", "namespace", "serve", "--wait=true", "--timeout=60s")


async def test_scheduler_config_from_manifests(tmp_path: Path) -> None:
    """sunkd's KubeSchedulerConfiguration (two profiles, the extender) is accepted by the
    real kube-scheduler; the extender points at a closed loopback port (ignorable)."""
    _require_binaries()
    config = ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
    plane = KubeControlPlane(scheduler_config=config, extender_url="http://127.0.0.1:9/scheduler")
    async with plane:
        pids, base = dict(plane.pids), plane.base
        written = (base / "scheduler" / "config.yaml").read_text()
        assert "http://127.0.0.1:9/scheduler" in written
        assert str(base / "scheduler.kubeconfig") in written
        leases = _json(plane, "-n", "kube-system", "get", "leases")["items"]
        assert {"kube-scheduler", "kube-controller-manager"} <= {
            lease["metadata"]["name"] for lease in leases
        }
    _assert_gone(plane, pids, base)


def test_failed_start_leaves_nothing(tmp_path: Path) -> None:
    """A component that dies during bring-up: an error naming it, and nothing left behind."""
    _require_binaries()
    bad = tmp_path / "bad-scheduler.yaml"
    bad.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                   "profiles: [{schedulerName: ''}]\n")  # fmt: skip
    plane = KubeControlPlane(scheduler_config=bad)
    with pytest.raises(KubeControlPlaneError, match="kube-scheduler exited"):
        plane.start()
    assert _processes_mentioning(str(plane.base)) == []
    assert not plane.base.exists()
