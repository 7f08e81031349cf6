"""A Nodeset's slurmd pods on real kubelet Nodes: what the real-pod tests
(tests/integration/test_slurmd_pods_real.py, test_slurmd_daemon_real.py) and
`sunkd demo --slurmd-pods` share, so the demo runs exactly the bed the tests check.

- `slurmd_spec` / `slurmd_nodeset`: a Nodeset `spec.slurmd` for a testbed `SlurmCluster`:
  its slurmd image (sunkd_testbed.images), the cluster's directory (slurm.conf, munged's
  socket, spool, logs) mounted at the same path, `SLURM_CONF` pointing there. The cluster
  already has the lines a Static Nodeset needs: `ReturnToService=1`, one `NodeName=` line
  per node with `NodeAddr=127.0.0.1` and its own `Port=` (the pods are on the host
  network), `KillWait=2` (below the pods' 10 s grace).
- `hand_over`: the host's slurmds go so the pods' take over; the Nodes get the pool's
  labels and the Slurm node name.
- `slurm_nodes`: one `scontrol -o show node` read: each node's State and SlurmdStartTime.
- `memory`: RSS of every kubelet, containerd, shim and slurmd (from /proc).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd_testbed.containerd import rss_mib
from sunkd_testbed.images import Image
from sunkd_testbed.kubelet import KubeletNodes
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.slurm import SlurmCluster


def install_nodeset_crd(plane: KubeControlPlane) -> None:
    """Apply the repository's Nodeset CRD and wait until the API server serves it."""
    from sunkd_testbed.demo import MANIFESTS

    plane.kubectl("apply", "-f", str(MANIFESTS / "crds" / "nodeset.yaml"))
    plane.kubectl("wait", "--for=condition=Established", "crd/nodesets.sunkd.io",
                  "--timeout=60s")


def delete_nodeset(plane: KubeControlPlane, name: str, *, check: bool = False,
                   namespace: str = "default") -> None:
    """Delete a Nodeset once sunkd no longer runs: sunkd's finalizer taken off first, as
    docs/nodeset.md tells an operator (no sunkd left to remove its pods the drained way;
    the garbage collector then deletes them)."""
    plane.kubectl("patch", "nodeset", name, "-n", namespace, "--type=merge", "-p",
                  '{"metadata":{"finalizers":null}}', check=False)
    plane.kubectl("delete", "nodeset", name, "-n", namespace, "--wait=true",
                  "--timeout=60s", check=check)


def slurmd_started(cluster: SlurmCluster, node: str) -> str:
    """The node's SlurmdStartTime as Slurm prints it ("" when none)."""
    found = re.search(r"\bSlurmdStartTime=(\S+)", cluster.scontrol("show", "node", node))
    return found.group(1) if found else ""


def slurmd_spec(image: Image, cluster: SlurmCluster) -> dict[str, Any]:
    """`spec.slurmd` running `image`'s slurmd against `cluster` (Static registration)."""
    base = str(cluster.base)
    return {
        "image": image.ref, "imagePullPolicy": "Never",
        "env": [{"name": "SLURM_CONF", "value": f"{base}/etc/slurm.conf"}],
        "volumes": [{"name": "cluster", "hostPath": {"path": base, "type": "Directory"}}],
        "volumeMounts": [{"name": "cluster", "mountPath": base}],
        "terminationGracePeriodSeconds": 10,
    }  # fmt: skip


def slurmd_nodeset(
    image: Image,
    cluster: SlurmCluster,
    *,
    name: str = "pods",
    namespace: str = "default",
    partitions: Sequence[str] = ("debug",),
    selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Nodeset over the Nodes labelled `selector` whose pods run `cluster`'s slurmd."""
    return {
        "apiVersion": wk.API_VERSION, "kind": "Nodeset",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"slurm": {"partitions": list(partitions)},
                 "nodeSelector": dict(selector or {"pool": "pods"}),
                 "slurmd": slurmd_spec(image, cluster)},
    }  # fmt: skip


def hand_over(
    plane: KubeControlPlane,
    bed: KubeletNodes,
    cluster: SlurmCluster,
    slurm_nodes: Sequence[str],
    labels: Mapping[str, str],
) -> dict[str, str]:
    """Label each Node (`labels` and its Slurm node name, no pin), stop the host's slurmd
    of each Slurm node; the SlurmdStartTime each had (a pod's slurmd shows a later one)."""
    for slurm_node, k8s in zip(slurm_nodes, bed.names, strict=True):
        plane.kubectl("label", "node", k8s, "--overwrite",
                      *(f"{k}={v}" for k, v in labels.items()),
                      f"{wk.LABEL_SLURM_NODE_NAME}={slurm_node}")  # fmt: skip
        plane.kubectl("annotate", "node", k8s, f"{wk.ANNOTATION_PIN}-")
    before = {n: slurmd_started(cluster, n) for n in slurm_nodes}
    for name in slurm_nodes:  # the host's slurmds go; the pods' take over
        cluster.kill_slurmd(name, sig=signal.SIGTERM)
    time.sleep(1.1)  # a pod's slurmd starts in a later second than the host's
    return before


@dataclass(frozen=True)
class SlurmView:
    """One node as `scontrol -o show node` printed it."""

    state: str  # e.g. IDLE, IDLE+DRAIN, DOWN+DRAIN+NOT_RESPONDING
    slurmd_started: float | None  # epoch seconds (Slurm prints local time, whole seconds)

    @property
    def words(self) -> set[str]:
        return set(self.state.split("+"))


def _epoch(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # "None", "Unknown"
        return None


def slurm_nodes(cluster: SlurmCluster) -> dict[str, SlurmView]:
    """Every node of `cluster` in one `scontrol -o show node`."""
    out = cluster.scontrol("-o", "show", "node", check=False, timeout=15)
    views: dict[str, SlurmView] = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" in fields:
            views[fields["NodeName"]] = SlurmView(
                fields.get("State", "UNKNOWN"), _epoch(fields.get("SlurmdStartTime", "")))
    return views


def memory(bed: KubeletNodes, pods: Mapping[str, str], namespace: str = "default") -> dict[
        str, Any]:
    """VmRSS (MiB, /proc/PID/status) of each Node's kubelet, containerd and that
    containerd's shims, and of each slurmd pod's slurmd (`pods`: Slurm node -> pod name;
    its container's main process, i.e. slurmd itself: not the pause container, not the
    shim, not job steps)."""
    slurmd = {}
    for node, pod in pods.items():
        pid = bed.container_pid(pod, namespace)
        if pid is not None:
            slurmd[node] = rss_mib(pid)
    return {"nodes": {n.name: n.memory() for n in bed.nodes}, "slurmd": slurmd}
