"""The topology sunkd renders, loaded by a real slurmctld and used by its scheduler.

22.05 (the host's packages): a tree topology.conf from Topograph labels, static nodes,
`TopologyPlugin=topology/tree`; `scontrol show topology` lists the switches, a job with
`--switches=1` lands under one leaf even when the lowest-numbered free nodes straddle
two, and the `root` and `unlabeled` switches keep every node schedulable.
24.11 and 26.05 (Debian roots, `make slurm-roots`): a block topology, as topology.conf
on 24.11 and topology.yaml on 26.05 (25.05+). A missing root skips (fails under
SUNKD_TEST_STRICT=1), like the other version tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sunkd.domain.hostlist import expand
from sunkd.domain.topology import (
    TOPOGRAPH_ACCELERATOR,
    TOPOGRAPH_LEAF,
    TOPOGRAPH_SPINE,
    TopologyNode,
    render,
    spec_from,
    to_conf,
    to_yaml,
)
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]


def k8s(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels)}}


# tp1-tp2 under leaf a (spine s1), tp3-tp4 under leaf b (spine s2), tp5 without labels.
TREE_NODES = [
    TopologyNode.from_kubernetes(k8s(f"tp{i}", {TOPOGRAPH_LEAF: leaf, TOPOGRAPH_SPINE: spine}))
    for i, leaf, spine in ((1, "a", "s1"), (2, "a", "s1"), (3, "b", "s2"), (4, "b", "s2"))
] + [TopologyNode.from_kubernetes(k8s("tp5", {}))]
TREE = render(TREE_NODES, [n.name for n in TREE_NODES], spec_from("tree", preset="topograph"))


def job_nodes(cluster: SlurmCluster, job: int, within: float = 20.0) -> list[str]:
    """The nodes of a job once it runs; fails with squeue's view if it does not."""
    deadline = time.monotonic() + within
    while True:
        out = cluster.run("squeue", "-h", "-j", str(job), "-o", "%T|%N|%r", check=False)
        state, _, rest = out.strip().partition("|")
        nodes = rest.partition("|")[0]
        if state == "RUNNING":
            return expand(nodes)
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} not running: {out.strip()!r}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def tree_cluster() -> Iterator[SlurmCluster]:
    if "22.05" not in slurm_test_versions():
        pytest.skip("22.05 not in SUNKD_TEST_SLURM_VERSIONS")
    yield from start_cluster(
        "tp[1-5]", extra_conf=["TopologyPlugin=topology/tree"],
        config_files={"topology.conf": to_conf(TREE)})


def test_slurm_loads_the_rendered_tree(tree_cluster: SlurmCluster) -> None:
    shown = tree_cluster.scontrol("show", "topology")
    for switch in TREE.switches:
        assert f"SwitchName={switch.name} " in shown, shown
    assert "leaf_s1_a" in shown and "Nodes=tp[1-2]" in shown
    assert "SwitchName=unlabeled" in shown and "Nodes=tp5" in shown
    assert "SwitchName=root" in shown


def test_switches_1_lands_under_one_leaf(tree_cluster: SlurmCluster) -> None:
    blocker = tree_cluster.sbatch("-N", "1", "--exclusive", nodelist="tp1")
    try:
        assert job_nodes(tree_cluster, blocker) == ["tp1"]
        # Free: tp2 (leaf a), tp3-tp4 (leaf b), tp5. Without topology Slurm takes the
        # lowest-numbered pair, tp[2-3], which straddles both leaves.
        job = tree_cluster.sbatch("-N", "2", "--exclusive", "--switches=1", "--exclude=tp5")
        try:
            assert job_nodes(tree_cluster, job) == ["tp3", "tp4"]
        finally:
            tree_cluster.scancel(job)
    finally:
        tree_cluster.scancel(blocker)


def test_root_keeps_every_node_schedulable(tree_cluster: SlurmCluster) -> None:
    # Jobs span only nodes connected by one switch fabric (topology.conf(5)): without the
    # root switch joining the spines and the unlabeled leaf this job could never start.
    tree_cluster.wait_for(lambda: set(tree_cluster.node_states().values()) == {"idle"},
                          timeout=30, what="all nodes idle")
    job = tree_cluster.sbatch("-N", "5")
    try:
        assert job_nodes(tree_cluster, job) == [f"tp{i}" for i in range(1, 6)]
    finally:
        tree_cluster.scancel(job)


# ------------------------------------------------------------------------- block

BLOCK_VERSIONS = [v for v in slurm_test_versions() if v != "22.05"]  # 23.11+ has blocks
BLOCK_NODES = [
    TopologyNode.from_kubernetes(k8s(f"bk{i}", {TOPOGRAPH_ACCELERATOR: f"r{(i - 1) // 2}"}))
    for i in range(1, 5)]
BLOCK = render(BLOCK_NODES, [n.name for n in BLOCK_NODES],
               spec_from("block", preset="topograph", block_sizes=[2]))


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}") for v in BLOCK_VERSIONS])
def block_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version: str = request.param
    # topology.yaml from 25.05 (topology.yaml(5)); topology.conf before.
    files = ({"topology.yaml": to_yaml(BLOCK)} if version >= "25.05"
             else {"topology.conf": to_conf(BLOCK)})
    extra = [] if version >= "25.05" else ["TopologyPlugin=topology/block"]
    yield from start_cluster("bk[1-4]", version=version, extra_conf=extra, config_files=files)


def test_slurm_loads_the_rendered_blocks(block_cluster: SlurmCluster) -> None:
    shown = block_cluster.scontrol("show", "topology")
    for block in BLOCK.blocks:
        assert block.name in shown, shown
    blocker = block_cluster.sbatch("-N", "1", "--exclusive", nodelist="bk1")
    try:
        assert job_nodes(block_cluster, blocker) == ["bk1"]
        job = block_cluster.sbatch("-N", "2", "--exclusive")
        try:
            assert job_nodes(block_cluster, job) == ["bk3", "bk4"]
        finally:
            block_cluster.scancel(job)
    finally:
        block_cluster.scancel(blocker)
