"""kubectl as users type it, against the real API server and the objects sunkd's daemon
writes there: the kubectl built with the control plane (v1.37.2, from the binary cache),
sunkd running on a real Slurm cluster with its ServiceAccount's token (the wiring of
tests/integration/test_e2e_real_kube.py).

- `kubectl get nds -A` (and `-o wide`): the Nodeset CRD's printer columns over the status
  sunkd keeps current;
- `kubectl describe node`: sunkd's taint, its annotations and its Events;
- `kubectl get lease -n sunkd`: sunkd's leader Lease and its holder;
- `kubectl drain`: blocked by a PodDisruptionBudget (status from the real disruption
  controller) and then, relaxed, succeeding, with a Deployment's pods moving to another node.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sunkd.kubernetes.client import NODES, PODS, nodesets
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.slurm import SlurmCluster
from tests.integration import test_e2e_real_kube as e2e_real
from tests.integration.kube_backends import SUNKD_NAMESPACE
from tests.integration.test_e2e import migrated_database, reset_slurm
from tests.integration.test_e2e_real_kube import World, running_sunkd

# The end-to-end module's fixtures (same wiring: a Slurm cluster, the harness kubelet).
plane = e2e_real.plane
slurm_cluster = e2e_real.slurm_cluster
world = e2e_real.world

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.kubectl]


def kubectl(plane: KubeControlPlane, *args: str, ok: bool = True) -> str:
    result = plane.kubectl(*args, check=False)
    if ok:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout
    assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
    return result.stderr


async def kubectl_async(plane: KubeControlPlane, *args: str, ok: bool = True) -> str:
    return await asyncio.to_thread(kubectl, plane, *args, ok=ok)


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


async def until(what: str, check: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_sunkds_objects_through_kubectl(world: World,
                                              slurm_cluster: SlurmCluster) -> None:
    reset_slurm(slurm_cluster)
    plane, admin = world.plane, world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world, lease=True) as sunkd:
            [pod] = await world.pending_pods(1)
            lent = await sunkd.until("the pod bound to a lent node",
                                     lambda: world.bound_node(pod))
            await sunkd.until("the lend recorded", lambda: sunkd.owner(lent) == "kubernetes")

            async def counted() -> bool:
                status = (await admin.get(nodesets(), "pool", SUNKD_NAMESPACE)).get("status")
                counts = (status or {}).get("counts") or {}
                return counts.get("kubernetes") == 1 and counts.get("slurm") == 3

            await until("sunkd's Nodeset status", counted)
            table = rows(await kubectl_async(plane, "get", "nds", "-A"))
            assert table[0] == ["NAMESPACE", "NAME", "SLURM", "K8S", "MOVING", "HELD", "AGE"]
            assert table[1][:6] == ["sunkd", "pool", "3", "1", "0", "0"]
            wide = rows(await kubectl_async(plane, "get", "nds", "-A", "-o", "wide"))
            assert wide[0] == ["NAMESPACE", "NAME", "SLURM", "K8S", "MOVING", "HELD", "NODES",
                               "MODE", "SLURMD", "AGE"]
            assert wide[1][:8] == ["sunkd", "pool", "3", "1", "0", "0", "4", "Auto"]
            short = await kubectl_async(plane, "get", "nodesets.sunkd.io", "-n", "sunkd",
                                        "pool", "-o", "jsonpath={.status.counts.nodes}")
            assert short == "4"

            # A node Slurm owns that an admin drained, as the operator sees it: sunkd's owner
            # taint and label, its hold taint, and the Slurm state and reason it mirrors.
            held = next(n for n in world.names if n != lent)
            slurm_cluster.scontrol("update", f"nodename={held}", "state=drain",
                                   "reason=admin: bad DIMM")

            async def mirrored() -> bool:
                node = await admin.get(NODES, held)
                keys = {t["key"] for t in node["spec"].get("taints") or []}
                return "sunkd.io/slurm-hold" in keys and "sunkd.io/slurm-reason" in (
                    node["metadata"].get("annotations") or {})

            await until("the drain mirrored", mirrored)
            described = await kubectl_async(plane, "describe", "node", held)
            assert "sunkd.io/owner=slurm:NoSchedule" in described
            assert "sunkd.io/slurm-hold=slurm:NoSchedule" in described
            assert "sunkd.io/owner=slurm" in described  # the label
            assert "sunkd.io/slurm-reason: admin: bad DIMM" in described
            assert "sunkd.io/slurm-state:" in described
            assert "Unschedulable:      false" in described  # a hold, never a cordon
            lent_described = await kubectl_async(plane, "describe", "node", lent)
            assert "sunkd.io/owner=kubernetes" in lent_described
            assert "sunkd.io/owner=slurm:NoSchedule" not in lent_described
            assert pod in lent_described[lent_described.index("Non-terminated Pods"):]

            # The leader Lease (kubernetes.lease = true) and its holder.
            leases = rows(await kubectl_async(plane, "get", "lease", "-n", SUNKD_NAMESPACE))
            assert leases[0] == ["NAME", "HOLDER", "AGE"]
            row = next(r for r in leases[1:] if r[0] == "sunkd-leader")
            assert row[1] == sunkd.daemon.settings.identity
            holder = await kubectl_async(plane, "get", "lease", "sunkd-leader", "-n",
                                         SUNKD_NAMESPACE, "-o",
                                         "jsonpath={.spec.holderIdentity}")
            assert holder == sunkd.daemon.settings.identity


async def test_describe_node_shows_sunkds_events(world: World,
                                                 slurm_cluster: SlurmCluster) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world):
            node = world.names[0]
            described = await kubectl_async(world.plane, "describe", "node", node)
            events = described[described.index("Events:"):]
            assert "SunkdLocked" in events, events


async def test_drain_blocked_by_a_pdb_then_succeeding(world: World, tmp_path: Path) -> None:
    """A Deployment's two pods on one node, a PDB that wants both: `kubectl drain` evicts
    nothing and times out. With the PDB relaxed to one, drain evicts a pod, the ReplicaSet
    replaces it on another node (the drained one is cordoned), the harness kubelet reports it
    Ready, the disruption controller allows the next eviction, and the drain completes."""
    plane, admin = world.plane, world.admin
    target, spare, *others = world.names
    for name in (spare, *others):
        await kubectl_async(plane, "cordon", name)
    await kubectl_async(plane, "create", "deployment", "web", "-n", "default",
                        "--image=registry.invalid/web:1", "--replicas=2")
    await kubectl_async(plane, "rollout", "status", "deployment/web", "-n", "default",
                        "--timeout=60s")
    pods, _ = await admin.list(PODS, namespace="default", label_selector="app=web")
    assert {p["spec"]["nodeName"] for p in pods} == {target}
    await kubectl_async(plane, "uncordon", spare)
    manifest = tmp_path / "pdb.json"
    manifest.write_text(json.dumps({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
    await kubectl_async(plane, "apply", "-f", str(manifest))

    async def counted() -> bool:
        out = await kubectl_async(plane, "get", "pdb", "web", "-n", "default", "-o",
                                  "jsonpath={.status.currentHealthy}/{.status.observedGeneration}")
        return out == "2/1"

    await until("the disruption controller counting the pods", counted)
    pdb_table = rows(await kubectl_async(plane, "get", "pdb", "-n", "default"))
    assert pdb_table[0] == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE",
                            "ALLOWED", "DISRUPTIONS", "AGE"]
    assert pdb_table[1][:4] == ["web", "2", "N/A", "0"]

    blocked = await kubectl_async(plane, "drain", target, "--ignore-daemonsets",
                                  "--timeout=3s", ok=False)
    assert "Cannot evict pod as it would violate the pod's disruption budget." in blocked
    assert "global timeout reached" in blocked
    pods, _ = await admin.list(PODS, namespace="default", label_selector="app=web")
    assert len(pods) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in pods)

    await kubectl_async(plane, "patch", "pdb", "web", "-n", "default", "--type=merge",
                        "-p", '{"spec":{"minAvailable":1}}')
    drained = await kubectl_async(plane, "drain", target, "--ignore-daemonsets",
                                  "--timeout=90s")
    assert drained.count("evicted") == 2, drained
    assert f"node/{target} drained" in drained
    pods, _ = await admin.list(PODS, namespace="default", label_selector="app=web")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert {p["spec"].get("nodeName") for p in live} <= {spare}
    kubectl(plane, "delete", "deployment", "web", "-n", "default")
