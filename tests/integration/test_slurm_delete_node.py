"""What slurmrestd's `DELETE /slurm/vX/node/{name}` does, on 24.11 and 26.05, and that
22.05 has none: the facts sunkd's deletion of defunct Dynamic node records rests on
(docs/nodeset.md, "Defunct Dynamic records").

Through sunkd's own client and Slurm actuator (`SlurmRestClient.delete_node`,
`SlurmActuator.delete_node`):
- a dynamic node (`slurmd -Z`) whose slurmd is gone, DOWN+NOT_RESPONDING: deleted, gone
  from the node list; deleting it again is "already so" (idempotent);
- a node a job is allocated: the actuator refuses before asking (and slurmctld refuses
  too: "has jobs"), the record stays;
- a node slurm.conf defines (not DYNAMIC_NORM): refused, the record stays;
- 22.05 (v0.0.38): no delete at all; the actuator refuses with the `scontrol delete
  nodename=` line an administrator can run, and the record stays.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from sunkd.domain.ports import RefusedError
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmApiError
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
    yield from start_cluster("st1", version=version, extra_conf=lines, slurmd_timeout=5,
                             partitions={"debug": "st1", "dyn": "dyn"})


def _down_not_responding(node: object) -> bool:
    return (getattr(node, "state", "") == "DOWN"
            and "NOT_RESPONDING" in getattr(node, "flags", ()))


async def test_delete_a_defunct_dynamic_record(cluster: SlurmCluster) -> None:
    client: SlurmRestClient = jwt_client(cluster)
    async with client:
        await client.negotiate()
        actuator = SlurmActuator(client, scontrol_env=cluster.env)
        cluster.kill_slurmd("st1", sig=signal.SIGTERM)  # its port is the dynamic one's
        cluster.start_dynamic_slurmd("dyn1", "Features=dyn")
        node = await wait_node(client, "dyn1", lambda n: n.state == "IDLE", within=60)
        assert "DYNAMIC_NORM" in node.flags and "dyn" in node.features, node

        # A job on it: never deleted (the actuator refuses before slurmctld would).
        job = cluster.sbatch(nodelist="dyn1", partition="dyn", wrap="sleep 300")
        await wait_node(client, "dyn1", lambda n: n.is_busy, within=30)
        cluster.kill_slurmd("dyn1", sig=signal.SIGTERM)
        with pytest.raises(RefusedError):
            await actuator.delete_node("dyn1", feature="dyn")
        if client.can_delete_nodes:
            # slurmctld itself refuses a record with jobs.
            with pytest.raises(SlurmApiError) as refused:
                await client.delete_node("dyn1")
            print(f"slurmctld on a record with a job: {refused.value}")
        assert any(n.name == "dyn1" for n in await client.get_nodes())
        cluster.scancel(job)

        # The slurmd gone, no job: DOWN+NOT_RESPONDING after SlurmdTimeout.
        started = time.monotonic()
        down = await wait_node(client, "dyn1", _down_not_responding, within=60)
        print(f"dyn1 {down.display_state} after {time.monotonic() - started:.1f} s")
        if not client.can_delete_nodes:
            with pytest.raises(RefusedError, match="scontrol delete nodename=dyn1"):
                await actuator.delete_node("dyn1", feature="dyn")
            assert any(n.name == "dyn1" for n in await client.get_nodes())
            return
        # Not the Nodeset's feature: refused.
        with pytest.raises(RefusedError):
            await actuator.delete_node("dyn1", feature="other")
        started = time.monotonic()
        assert await actuator.delete_node("dyn1", feature="dyn") is True
        print(f"DELETE node/dyn1 took {time.monotonic() - started:.2f} s")
        assert not any(n.name == "dyn1" for n in await client.get_nodes())
        # Again: already so (slurmctld answers an unknown name with an error).
        assert await actuator.delete_node("dyn1", feature="dyn") is False
        with pytest.raises(SlurmApiError) as unknown:
            await client.delete_node("dyn1")
        print(f"slurmctld on an unknown name: {unknown.value}")

        # A node slurm.conf defines, DOWN+NOT_RESPONDING: not dynamic, refused by both.
        await wait_node(client, "st1", _down_not_responding, within=60)
        with pytest.raises(RefusedError):
            await actuator.delete_node("st1", feature="dyn")
        with pytest.raises(SlurmApiError) as static:
            await client.delete_node("st1")
        print(f"slurmctld on a static node: {static.value}")
        assert any(n.name == "st1" for n in await client.get_nodes())
