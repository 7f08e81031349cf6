"""The GRES check against what a real slurmd registers: fake GPUs on Slurm 22.05.

g1 has two fake GPUs (character devices 195/0-1, gres.conf `File=`, `Gres=gpu:fake:2`),
g2 one; both Kubernetes Nodes say two GPUs of product NVIDIA-A100-SXM4-80GB, mapped to
Slurm's type `fake` by the type map. What slurmrestd reports goes through sunkd's own
client and normalizer into the observation the fold keeps; the pure check then holds g2
(HELD: never lent, a SunkdGresMismatch Warning, GresConsistent=False, the metric) and
leaves g1 alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sunkd.api.metrics import Metrics
from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodeObserved, Label
from sunkd.domain.gres import expected_gres
from sunkd.domain.ownership import assess
from sunkd.domain.policy import PoolSpec, decide
from sunkd.domain.policy.model import VERB_WARN, RequestAction
from sunkd.domain.state import ClusterState, NodeState, Phase, SourceState
from sunkd.kubernetes.nodeset_status import build_nodeset_status
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import jwt_client, slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

PRODUCT = "NVIDIA-A100-SXM4-80GB"
TYPE_MAP = {PRODUCT: "fake"}
POOL = PoolSpec(name="ml/gpu", partitions=("debug",),
                node_selector=(Label("pool", "gpu"),))


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    if "22.05" not in slurm_test_versions():
        pytest.skip("22.05 not in SUNKD_TEST_SLURM_VERSIONS")
    yield from start_cluster("g[1-2]", gpus={"g1": ("fake", 2), "g2": ("fake", 1)})


def k8s_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "gpu",
                                                 "nvidia.com/gpu.product": PRODUCT}},
            "status": {"allocatable": {"nvidia.com/gpu": "2"}}}


async def test_slurm_gres_is_checked_against_the_nodes_gpus(cluster: SlurmCluster) -> None:
    client = jwt_client(cluster)
    try:
        await client.negotiate()
        slurm = {n.name: n for n in await client.get_nodes()}
    finally:
        await client.close()
    # What real 22.05 registered from the fake devices, as sunkd reads it.
    assert slurm["g1"].gres is not None and slurm["g1"].gres.startswith("gpu:fake:2")
    assert slurm["g2"].gres is not None and slurm["g2"].gres.startswith("gpu:fake:1")
    assert (slurm["g1"].gpus_total, slurm["g2"].gpus_total) == (2, 1)
    # Slurm uses them: a job asking for two GPUs can only run on g1.
    job = cluster.sbatch("--gres=gpu:2", wrap="sleep 30")
    try:
        cluster.wait_for(lambda: cluster.run("squeue", "-h", "-j", str(job), "-o", "%T %N")
                         .split() == ["RUNNING", "g1"], timeout=20, what="job on g1")
    finally:
        cluster.scancel(job)

    expected = expected_gres(k8s_node("g1"), TYPE_MAP)
    assert expected == "gpu:fake:2"
    nodes = {}
    for name in ("g1", "g2"):
        k8s = K8sNodeObserved(node=name, slurm_node=name, ready=True, gpus=2,
                              labels=(Label("pool", "gpu"),),
                              gres=expected_gres(k8s_node(name), TYPE_MAP))
        nodes[name] = NodeState(name, k8s_name=name, slurm=slurm[name].to_observed(), k8s=k8s,
                                owner=wk.OWNER_SLURM, phase=Phase.SLURM, pods=())
    fresh = SourceState("fresh", None, None, 0.0, 0.0)
    state = ClusterState(nodes=nodes, k8s_names={"g1": "g1", "g2": "g2"},
                         sources={"slurm": fresh, "kubernetes": fresh})
    now = 100.0

    good, bad = assess(state, nodes["g1"], now), assess(state, nodes["g2"], now)
    assert good.gres_problem is None and good.phase == Phase.SLURM
    assert bad.phase == Phase.HELD and bad.gres_problem is not None
    assert bad.gres_problem.startswith("GRES mismatch: Slurm reports gpu:fake:1")
    assert bad.gres_problem.endswith("Kubernetes has gpu:fake:2")

    actions = [d for d in decide(state, (POOL,), now) if isinstance(d, RequestAction)]
    warned = [a for a in actions if a.node == "g2" and a.verb == VERB_WARN]
    assert warned and warned[0].arg("event_reason") == wk.EVENT_GRES_MISMATCH
    assert not [a for a in actions if a.node == "g1" and a.verb == VERB_WARN]

    status = build_nodeset_status(state, (POOL,), POOL.name, 1, now)
    [condition] = [c for c in status["conditions"] if c["type"] == wk.CONDITION_GRES_CONSISTENT]
    assert (condition["status"], condition["reason"]) == ("False", wk.REASON_GRES_MISMATCH)
    assert "g2: GRES mismatch" in condition["message"] and "g1" not in condition["message"]

    metrics = Metrics()
    metrics.set_state(state, now, (POOL,))
    assert metrics.registry.get_sample_value(
        "sunkd_nodes_gres_inconsistent", {"pool": POOL.name}) == 1
