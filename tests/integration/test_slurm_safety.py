"""Safety scenarios 1 and 8 against a real Slurm (docs/safety.md): an administrator's
DOWN is never overwritten, sunkd removes its drains with UNDRAIN (never RESUME, which
would return a DOWN node to service), and an undrain refuses when the reason changed
since the decision."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from sunkd.domain.ports import ActionError, RefusedError
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.client import SlurmRestClient
from sunkd.testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import jwt_client, start_cluster, wait_node

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from start_cluster("ss[1-4]", slurmd_timeout=5)


@pytest.fixture
async def client(cluster: SlurmCluster) -> AsyncIterator[SlurmRestClient]:
    async with jwt_client(cluster) as c:
        yield c


@pytest.fixture
def actuator(cluster: SlurmCluster, client: SlurmRestClient) -> SlurmActuator:
    return SlurmActuator(client, scontrol_env=cluster.env)


async def test_s1_an_admin_down_is_never_overwritten(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    cluster.scontrol("update", "nodename=ss1", "state=down", "reason=bad DIMM")
    try:
        node = await wait_node(client, "ss1", lambda n: n.state == "DOWN")
        assert not node.is_drain  # DOWN carries no DRAIN flag ...
        with pytest.raises(RefusedError, match="bad DIMM"):
            await actuator.drain("ss1", "k8s NotReady")  # ... and is still not ours
        node = await wait_node(client, "ss1", lambda n: True)
        assert node.state == "DOWN" and node.reason == "bad DIMM"
    finally:
        cluster.scontrol("update", "nodename=ss1", "state=resume")
    await wait_node(client, "ss1", lambda n: n.state == "IDLE" and not n.flags)


async def test_s1_undrain_keeps_slurms_down(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    """Our drain on a node that then went DOWN (our reason kept): removing our drain must
    not return the node to service. RESUME would (ss2 back to IDLE); UNDRAIN does not."""
    assert await actuator.drain("ss2", "lent to kubernetes [tx s1]") is True
    ours = "sunkd: lent to kubernetes [tx s1]"
    cluster.scontrol("update", "nodename=ss2", "state=down", f"reason={ours}")
    try:
        await wait_node(client, "ss2", lambda n: n.state == "DOWN" and n.is_drain)
        assert await actuator.resume("ss2", expect_reason=ours) is True
        node = await wait_node(client, "ss2", lambda n: not n.is_drain)
        assert node.state == "DOWN", f"UNDRAIN must leave DOWN alone, got {node.display_state}"
    finally:
        cluster.scontrol("update", "nodename=ss2", "state=resume")
    await wait_node(client, "ss2", lambda n: n.state == "IDLE" and not n.flags)


async def test_s8_undrain_refuses_when_the_reason_changed_since_the_decision(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    assert await actuator.drain("ss3", "lent to kubernetes [tx s8]") is True
    decided_on = "sunkd: lent to kubernetes [tx s8]"
    # An admin re-drains with a reason in our format (editing ours): still not what the
    # policy decided to remove.
    cluster.scontrol("update", "nodename=ss3", "state=drain", "reason=sunkd: keep, ticket 42")
    try:
        await wait_node(client, "ss3", lambda n: n.reason == "sunkd: keep, ticket 42")
        with pytest.raises(RefusedError, match="changed since the decision"):
            await actuator.resume("ss3", expect_reason=decided_on)
        node = await wait_node(client, "ss3", lambda n: True)
        assert node.is_drain and node.reason == "sunkd: keep, ticket 42"
    finally:
        cluster.scontrol("update", "nodename=ss3", "state=resume")
    await wait_node(client, "ss3", lambda n: n.state == "IDLE" and not n.flags)


async def test_s8_writes_check_leadership_right_before_they_go_out(
    cluster: SlurmCluster, client: SlurmRestClient
) -> None:
    leading = False
    actuator = SlurmActuator(client, scontrol_env=cluster.env, may_write=lambda: leading)
    with pytest.raises(ActionError, match=r"not .*leader"):
        await actuator.drain("ss4", "lend")
    node = await wait_node(client, "ss4", lambda n: True)
    assert not node.is_drain  # nothing was written
