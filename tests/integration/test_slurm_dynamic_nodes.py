"""What Slurm does with a dynamic slurmd (`slurmd -Z -N <name> --conf ...`), on 22.05,
24.11 and 26.05, and what sunkd reads of it through slurmrestd: the facts Dynamic
registration of a Nodeset rests on (docs/nodeset.md, "Dynamic registration").

- a name Slurm does not know: slurmctld creates the node from the registration, with the
  `--conf` features and weight, DYNAMIC_NORM, in the partition of its NodeSet; sunkd's
  normalization reads the feature and the flag (SlurmNodeObserved.features);
- the name of a node slurm.conf defines: the slurmd is taken as that node's, IDLE, and
  `--conf` is ignored (no feature, its own weight, its own partition). Without the
  Nodeset's feature it is someone else's node (`slurmdgone.has_feature`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import (
    jwt_client,
    slurm_test_versions,
    start_cluster,
    wait_node,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@pytest.fixture(params=[pytest.param(v, id=f"slurm-{v}") for v in slurm_test_versions()])
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version: str = request.param
    lines = ["SlurmctldParameters=enable_configless", "MaxNodeCount=4",
             "NodeSet=dyn Feature=dyn"]
    if version.startswith("22."):
        lines.append("TreeWidth=65533")
    yield from start_cluster("st1", version=version, extra_conf=lines,
                             partitions={"debug": "st1", "dyn": "dyn"})


async def test_a_new_name_is_created_with_its_features_an_existing_one_ignores_them(
        cluster: SlurmCluster) -> None:
    client: SlurmRestClient = jwt_client(cluster)
    async with client:
        await client.negotiate()
        # st1's slurmd listens on SlurmdPort, the port a dynamic slurmd takes.
        cluster.kill_slurmd("st1", sig=signal.SIGTERM)
        cluster.start_dynamic_slurmd("dyn1", "Features=dyn Weight=5")
        node = await wait_node(client, "dyn1", lambda n: n.state == "IDLE", within=60)
        assert "dyn" in node.features and "DYNAMIC_NORM" in node.flags, node
        assert "dyn" in node.partitions
        observed = node.to_observed()
        assert "dyn" in observed.features
        cluster.kill_slurmd("dyn1", sig=signal.SIGTERM)
        # The name of a node slurm.conf defines: taken as that node, --conf ignored.
        cluster.start_dynamic_slurmd("st1", "Features=dyn Weight=5")
        static = await wait_node(client, "st1", lambda n: n.state == "IDLE"
                                 and "NOT_RESPONDING" not in n.flags, within=60)
        assert "dyn" not in static.features, static
        assert "DYNAMIC_NORM" not in static.flags and static.partitions == ("debug",), static
        shown = cluster.scontrol("show", "node", "st1")
        assert "Weight=1" in shown, shown
