"""sunkd keeps a running slurmctld's topology in step with the labels: written, then
`scontrol reconfigure`, then `scontrol show topology` shows the new tree; an empty
render, a refused write and a second change inside the rate limit leave Slurm's file as
it was.

22.05 (host packages, static nodes, topology.conf + TopologyPlugin=topology/tree), 24.11
(topology.conf) and 26.05 (topology.yaml, read without TopologyPlugin from 25.05): a
missing Debian root skips (fails under SUNKD_TEST_STRICT=1), like the other version tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmNodeObserved
from sunkd.domain.state import ClusterState, NodeState
from sunkd.domain.topology import TOPOGRAPH_LEAF, TOPOGRAPH_SPINE, TopologyNode, render
from sunkd.domain.topology_plan import text_of
from sunkd.runtime.config import TopologySettings, topology_spec
from sunkd.runtime.topology import TopologyDelivery
from sunkd.slurm.topology import TopologyFile
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

NODES = ("td1", "td2", "td3", "td4")
SETTINGS = TopologySettings(min_interval_seconds=60.0)


def k8s(name: str, leaf: str, spine: str) -> dict[str, Any]:
    # Kubernetes Node k-<name>, named for Slurm by the fold's k8s_names.
    return {"metadata": {"name": f"k-{name}",
                         "labels": {TOPOGRAPH_LEAF: leaf, TOPOGRAPH_SPINE: spine}}}


def world(owner: str = wk.OWNER_SLURM, state: str = "IDLE") -> ClusterState:
    nodes = {n: NodeState(n, k8s_name=f"k-{n}", owner=owner,
                          slurm=SlurmNodeObserved(node=n, state=state)) for n in NODES}
    return ClusterState(nodes=nodes, k8s_names={f"k-{n}": n for n in NODES})


FIRST = [k8s(n, "a", "s1") for n in NODES]  # one leaf
SECOND = [k8s("td1", "a", "s1"), k8s("td2", "a", "s1"),
          k8s("td3", "b", "s2"), k8s("td4", "b", "s2")]  # two leaves, two spines
THIRD = [k8s(n, "c", "s3") for n in NODES]


def initial(fmt: str) -> str:
    nodes = [TopologyNode(n, o["metadata"]["labels"]) for n, o in zip(NODES, FIRST, strict=True)]
    return text_of(render(nodes, NODES, topology_spec(SETTINGS)), "yaml" if fmt == "yaml"
                   else "conf")


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}")
                                        for v in slurm_test_versions()])
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version: str = request.param
    yaml = version >= "25.05"  # topology.yaml(5): read instead of topology.conf from 25.05
    files = {"topology.yaml": initial("yaml")} if yaml else {"topology.conf": initial("conf")}
    extra = [] if yaml else ["TopologyPlugin=topology/tree"]
    yield from start_cluster("td[1-4]", version=version, extra_conf=extra, config_files=files)


class Labels:
    """What the Kubernetes LIST answers, changed by the test."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    async def __call__(self) -> list[Mapping[str, Any]]:
        return list(self.objects)


def switches(cluster: SlurmCluster) -> set[str]:
    shown = cluster.scontrol("show", "topology")
    return {word.split("=", 1)[1] for word in shown.split() if word.startswith("SwitchName=")}


async def test_write_reconfigure_and_keep_the_last_good(cluster: SlurmCluster) -> None:
    name = "topology.yaml" if cluster.version and cluster.version >= "25.05" else \
        "topology.conf"
    path = cluster.slurm_conf.parent / name
    assert switches(cluster) == {"leaf_s1_a", "spine_s1"}
    now = [1000.0]
    labels = Labels(SECOND)
    current = [world()]
    registry = CollectorRegistry()
    delivery = TopologyDelivery(
        SETTINGS, TopologyFile(path, scontrol=cluster.scontrol_path, scontrol_env=cluster.env),
        labels, lambda: current[0], clock=lambda: now[0], registry=registry)

    plan = await delivery.round()
    assert (plan.applied, plan.reason) == (True, "Applied"), plan.message
    assert switches(cluster) == {"leaf_s1_a", "leaf_s2_b", "spine_s1", "spine_s2", "root"}
    assert registry.get_sample_value("sunkd_topology_applied") == 1
    good = path.read_text()

    # A second change within the rate limit waits; the file and Slurm stay.
    labels.objects = THIRD
    now[0] += 10
    plan = await delivery.round()
    assert (plan.applied, plan.reason, plan.retry_at) == (False, "RateLimited", 1060.0)
    assert path.read_text() == good

    # No node is Slurm's any more: the render is empty, the last good file stays.
    current[0] = world(owner=wk.OWNER_KUBERNETES)
    now[0] += 100
    plan = await delivery.round()
    assert (plan.applied, plan.reason) == (False, "Empty"), plan.message
    assert path.read_text() == good
    assert registry.get_sample_value("sunkd_topology_applied") == 0
    # Registered is required too: nodes Slurm has not heard from are never listed.
    current[0] = world(state="UNKNOWN")
    assert (await delivery.round()).reason == "Empty"
    assert switches(cluster) == {"leaf_s1_a", "leaf_s2_b", "spine_s1", "spine_s2", "root"}

    # The labels are back to Slurm's: unchanged, applied again without a write.
    current[0] = world()
    labels.objects = SECOND
    plan = await delivery.round()
    assert (plan.applied, plan.reason) == (True, "Unchanged")
    assert registry.get_sample_value(
        "sunkd_topology_reconfigures_total", {"result": "applied"}) == 1


async def test_a_failed_reconfigure_puts_the_previous_file_back(cluster: SlurmCluster) -> None:
    name = "topology.yaml" if cluster.version and cluster.version >= "25.05" else \
        "topology.conf"
    path = cluster.slurm_conf.parent / name
    before = path.read_text()
    shown = switches(cluster)
    delivery = TopologyDelivery(
        SETTINGS, TopologyFile(path, scontrol="/bin/false"), Labels(THIRD), world)
    plan = await delivery.round()
    assert (plan.applied, plan.reason) == (False, "WriteFailed"), plan.message
    assert "previous" in plan.message and path.read_text() == before
    assert switches(cluster) == shown
