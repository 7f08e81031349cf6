"""Real kubelet Nodes (sunkd_testbed.kubelet) against the real control plane, running real
pods: a busybox shell and slurmd, from images built here (sunkd_testbed.images).

One module-scoped bed: the control plane, three kubelets (Nodes 127.0.0.10-12, each with
its own containerd) and the images imported into each. The slurmd pods join clusters of
the repo's Slurm harness: the host's 22.05 across all three Nodes (`srun -N3` runs one step
in each Node's cgroup tree), and 22.05/24.11/26.05 one pod each from the Debian roots.
Missing peers (the kubelet, containerd, a Slurm root) skip with how to get them, and fail
under SUNKD_TEST_STRICT=1. The fixture's teardown checks nothing is left: no process of
the bed, no cgroup, the kubelet's sysctls restored.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunkd_testbed import images as images_mod
from sunkd_testbed.containerd import pids_with_arg
from sunkd_testbed.images import Image, ImageError
from sunkd_testbed.kubelet import (
    SYSCTLS,
    KubeletNodes,
    available,
    cgroup_hierarchies,
    host_network_pod,
    slurmd_pod,
    sysctl_path,
)
from sunkd_testbed.kubernetes import KUBE_VERSION, KubeControlPlane
from sunkd_testbed.kubernetes import available as plane_available
from sunkd_testbed.slurm import SlurmCluster
from tests.conftest import require
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.kubelet]
NODES = 3
slurm_cluster = contextlib.contextmanager(start_cluster)


def _image(make: object, *args: str) -> Image:
    try:
        image: Image = make(*args)  # type: ignore[operator]
    except ImageError as error:
        require(False, str(error))
        raise
    return image


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    for ok, why in (plane_available(), available()):  # both before anything starts
        require(ok, why)
    with KubeControlPlane(kubelet_client=True) as control_plane:
        yield control_plane


@pytest.fixture(scope="module")
def busybox() -> Image:
    return _image(images_mod.busybox_image)


@pytest.fixture(scope="module")
def bed(plane: KubeControlPlane, busybox: Image) -> Iterator[KubeletNodes]:
    ok, why = available()
    require(ok, why)
    pause = _image(images_mod.pause_image)
    nodes = KubeletNodes(plane, NODES, pause=pause, images=[busybox])
    nodes.start()  # the kubelet and containerd are here: a failure, never a skip
    # Read by the bed under the host lock: read here, before start() waits for the lock,
    # another bed's kubelet (a concurrent run on this host) could still be setting them.
    sysctls = dict(nodes.sysctls_found)
    assert set(sysctls) == set(SYSCTLS)
    base, roots = nodes.base, [n.cgroup_root for n in nodes.nodes]
    sockets = [str(n.containerd.socket) for n in nodes.nodes]
    pids = [p.pid for n in nodes.nodes for p in (n.process, n.containerd.process) if p]
    try:
        yield nodes
    finally:
        nodes.stop()
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
    assert [p for s in sockets for p in pids_with_arg(s)] == [], "shims left"
    assert pids_with_arg(str(base)) == []
    left = [
        str(h / r.lstrip("/"))
        for h in cgroup_hierarchies()
        for r in roots
        if (h / r.lstrip("/")).exists()
    ]
    assert left == [], "cgroups left"
    assert {n: sysctl_path(n).read_text().strip() for n in SYSCTLS} == sysctls
    assert not base.exists()


def _node_json(plane: KubeControlPlane, name: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(plane.kubectl("get", "node", name, "-o", "json").stdout)
    return result


def test_real_kubelets_register_as_ready_nodes(bed: KubeletNodes, plane: KubeControlPlane) -> None:
    assert bed.names == [f"127.0.0.{10 + i}" for i in range(NODES)]
    for name in bed.names:
        node = _node_json(plane, name)
        info = node["status"]["nodeInfo"]  # type: ignore[index]
        assert info["kubeletVersion"] == KUBE_VERSION
        assert info["containerRuntimeVersion"].startswith("containerd://")
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}  # type: ignore[index]
        assert addresses == {"InternalIP": name, "Hostname": name}
    memory = {n.name: n.memory() for n in bed.nodes}
    print(f"\nkubelet Nodes: registered {bed.registration_seconds} s, Ready {bed.ready_seconds} s "
          f"after each kubelet started; images imported in {bed.import_seconds} s; "
          f"RSS MiB {memory}")  # fmt: skip
    assert all(m["kubelet"] > 0 and m["containerd"] > 0 for m in memory.values())


def test_a_pod_from_a_local_image_runs_in_its_nodes_cgroups(
    bed: KubeletNodes, plane: KubeControlPlane, busybox: Image
) -> None:
    node = bed.nodes[-1]
    pod = host_network_pod(
        "shell", busybox.ref,
        # PID 1 of its namespace: SIGTERM does nothing to it without a handler.
        ["sh", "-c", "trap 'exit 0' TERM; echo hello from $(hostname); while :; do sleep 1; done"],
        node=node.name,
    )  # fmt: skip
    applied = time.monotonic()
    plane.kubectl("apply", "-f", "-", input=json.dumps(pod))
    bed.wait("pod Running", lambda: bed.phase("shell") == "Running")
    running = round(time.monotonic() - applied, 2)
    pid = bed.container_pid("shell")
    assert pid is not None
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    assert f"{node.cgroup_root}/kubepods/" in cgroups, cgroups
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "sh"
    logs = plane.kubectl("logs", "shell").stdout  # kube-apiserver -> this kubelet
    assert logs.startswith("hello from "), logs
    plane.kubectl("delete", "pod", "shell", "--wait=true", "--timeout=60s")
    assert not Path(f"/proc/{pid}").exists(), "the pod's process outlived its deletion"
    print(f"\nbusybox pod: Running {running} s after kubectl apply")


def _slurmd_started(cluster: SlurmCluster, node: str) -> str:
    """When slurmctld last heard a slurmd of `node` start (1 s resolution)."""
    found = re.search(r"\bSlurmdStartTime=(\S+)", cluster.scontrol("show", "node", node))
    return found.group(1) if found else ""


def _move_slurmds_to_pods(cluster: SlurmCluster, nodes: list[str]) -> dict[str, str]:
    """Stop the host's slurmd of each node; their start times, to tell the pods' apart."""
    before = {n: _slurmd_started(cluster, n) for n in nodes}
    for name in nodes:
        cluster.kill_slurmd(name, sig=signal.SIGTERM)  # returns once it exited
    time.sleep(1.1)  # a pod's slurmd starts in a later second than the host's
    return before


def _registered(cluster: SlurmCluster, node: str, before: str) -> bool:
    """The node is IDLE through a slurmd that started after the host's was stopped."""
    return _slurmd_started(cluster, node) not in ("", before) and (
        cluster.node_flags(node) == "IDLE"
    )


def _step_cgroups(cluster: SlurmCluster, nodes: int) -> dict[str, str]:
    """One job step per node: node name -> the step's memory cgroup."""
    out = cluster.run(
        "srun", f"-N{nodes}", "sh", "-c",
        'echo "$SLURMD_NODENAME $(grep :memory: /proc/self/cgroup | cut -d: -f3)"',
        timeout=60,
    )  # fmt: skip
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


@pytest.fixture(scope="module")
def slurm22(bed: KubeletNodes) -> Image:
    image = _image(images_mod.slurm_image, "22.05")
    bed.import_images([image])
    return image


def test_slurmd_pods_on_every_node_join_the_host_slurmctld(
    bed: KubeletNodes, plane: KubeControlPlane, slurm22: Image
) -> None:
    slurm_nodes = [f"node{i + 1}" for i in range(NODES)]
    with slurm_cluster(f"node[1-{NODES}]") as cluster:
        before = _move_slurmds_to_pods(cluster, slurm_nodes)
        pods = [
            slurmd_pod(f"slurmd-{name}", slurm22.ref, name, cluster.base, node.name)
            for name, node in zip(slurm_nodes, bed.nodes, strict=True)
        ]
        listed = json.dumps({"kind": "List", "apiVersion": "v1", "items": pods})
        applied = time.monotonic()
        plane.kubectl("apply", "-f", "-", input=listed)
        bed.wait(
            "slurmd pods IDLE",
            lambda: all(_registered(cluster, n, before[n]) for n in slurm_nodes),
        )
        idle = round(time.monotonic() - applied, 2)
        steps = _step_cgroups(cluster, NODES)
        for name, node in zip(slurm_nodes, bed.nodes, strict=True):
            assert steps[name].startswith(f"{node.cgroup_root}/kubepods/"), steps
        version = plane.kubectl("exec", "slurmd-node1", "--", "slurmd", "-V").stdout.split()
        assert version[-1] == cluster.slurm_version, (version, cluster.slurm_version)
        memory = {n.name: n.memory() for n in bed.nodes}
        pids = [bed.container_pid(f"slurmd-{name}") for name in slurm_nodes]
        assert None not in pids
        plane.kubectl("delete", "pods", "-l", "app=slurmd", "--wait=true", "--timeout=60s")
        assert [p for p in pids if Path(f"/proc/{p}").exists()] == [], "slurmd outlived its pod"
        cluster.wait_for(
            lambda: all("NOT_RESPONDING" in cluster.node_flags(n) for n in slurm_nodes),
            timeout=60, what="slurmctld notices the slurmds are gone",
        )  # fmt: skip
        print(f"\n{NODES} slurmd pods (Slurm {cluster.slurm_version}): all IDLE {idle} s after "
              f"kubectl apply; RSS MiB with the pods {memory}")  # fmt: skip


@pytest.mark.parametrize("version", slurm_test_versions())
def test_a_slurmd_pod_of_each_slurm_generation_runs_jobs(
    bed: KubeletNodes, plane: KubeControlPlane, version: str
) -> None:
    image = _image(images_mod.slurm_image, version)
    node = bed.nodes[0]
    bed.import_images([image], [node])
    with slurm_cluster("node[1-2]", version=version) as cluster:
        before = _move_slurmds_to_pods(cluster, ["node2"])
        name = f"slurmd-{version.replace('.', '-')}"
        pod = slurmd_pod(name, image.ref, "node2", cluster.base, node.name)
        applied = time.monotonic()
        plane.kubectl("apply", "-f", "-", input=json.dumps(pod))
        bed.wait(
            f"Slurm {version} node2 IDLE", lambda: _registered(cluster, "node2", before["node2"])
        )
        idle = round(time.monotonic() - applied, 2)
        script = "grep :memory: /proc/self/cgroup; cat /proc/1/comm"
        out = cluster.run("srun", "-w", "node2", "-N1", "sh", "-c", script, timeout=60)
        assert f"{node.cgroup_root}/kubepods/" in out and out.split()[-1] == "slurmd", out
        release = cluster.slurm_version or ""
        assert re.match(rf"{re.escape(version)}\.\d+$", release) and f":{release}-" in image.ref
        pid = bed.container_pid(name)
        plane.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")
        assert pid is not None and not Path(f"/proc/{pid}").exists(), "slurmd outlived its pod"
        print(f"\nSlurm {cluster.slurm_version} slurmd pod: IDLE {idle} s after kubectl apply")
