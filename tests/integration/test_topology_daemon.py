"""`sunkd run` keeps slurmctld's topology in step with the Kubernetes labels when
`[topology] file` is set: the leader writes the file from the Nodes' labels (Slurm-owned,
registered nodes only), slurmctld reconfigures and shows the tree, a label change moves
a node to another leaf, and every Nodeset's status says `TopologyApplied`. The host's
Slurm 22.05 (static nodes, TopologyPlugin=topology/tree); the renderer and the file
adapter are checked on 24.11 and 26.05 by test_slurm_topology_delivery.py."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from sunkd.domain.topology import TOPOGRAPH_LEAF, TOPOGRAPH_SPINE
from sunkd.runtime.config import TopologySettings
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import start_cluster
from tests.integration.test_e2e import migrated_database, running_sunkd, start_emulator

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

NODES = ("tp1", "tp2", "tp3")
# slurmctld needs a topology at start with TopologyPlugin=topology/tree: one switch.
START = "SwitchName=start Nodes=tp[1-3]\n"


def _leaves(cluster: SlurmCluster) -> dict[str, str]:
    """Leaf label -> the leaf switch's nodes, as slurmctld shows them (sunkd names a
    switch by its path, `leaf_<spine>_<leaf>`, so equal leaf labels under two spines stay
    two switches)."""
    shown = cluster.scontrol("show", "topology")
    found = {}
    for line in shown.splitlines():
        name = re.search(r"SwitchName=(\S+)", line)
        nodes = re.search(r"\bNodes=(\S+)", line)
        if name and nodes and "Switches=" not in line.replace("Switches=(null)", ""):
            found[name.group(1).rsplit("_", 1)[-1]] = nodes.group(1)
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from start_cluster("tp[1-3]", extra_conf=["TopologyPlugin=topology/tree"],
                             config_files={"topology.conf": START})


async def test_the_leader_keeps_slurms_topology_with_the_labels(cluster: SlurmCluster) -> None:
    path = cluster.slurm_conf.parent / "topology.conf"
    async with migrated_database() as database_url:
        emulator = await start_emulator(cluster)
        for index, name in enumerate(NODES):
            emulator.patch("nodes", name, {"metadata": {"labels": {
                TOPOGRAPH_LEAF: "leaf-a" if index < 2 else "leaf-b",
                TOPOGRAPH_SPINE: "spine-1"}}})
        settings = TopologySettings(file=path, preset="topograph", min_interval_seconds=1.0)

        def applied() -> bool:
            status = emulator.get("nodesets", "pool", "sunkd").get("status") or {}
            return any(c.get("type") == "TopologyApplied" and c.get("status") == "True"
                       for c in status.get("conditions", []))

        async with running_sunkd(database_url, cluster, emulator, topology=settings) as sunkd:
            await sunkd.until("slurmctld shows the labels' two leaves",
                              lambda: set(_leaves(cluster)) == {"leaf-a", "leaf-b"}, 60)
            assert "leaf-a" in path.read_text() and "start" not in path.read_text()
            emulator.patch("nodes", "tp3", {"metadata": {"labels": {TOPOGRAPH_LEAF: "leaf-a"}}})
            await sunkd.until("tp3 moved under leaf-a",
                              lambda: set(_leaves(cluster)) == {"leaf-a"}, 60)
            await sunkd.until("the Nodeset says TopologyApplied", applied, 30)
            metrics = sunkd.daemon.metrics.render().decode()
        await emulator.stop()
    assert "sunkd_topology_applied 1.0" in metrics
