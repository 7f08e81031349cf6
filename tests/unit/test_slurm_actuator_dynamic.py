"""The Slurm actuator's return to service of a dynamic node (`slurmd -Z`): slurmctld marks
every node a dynamic registration created DYNAMIC_NORM for its whole life
(`NODE_STATE_DYNAMIC_NORM`, `create_dynamic_reg_node` in src/slurmctld/node_mgr.c;
`scontrol show node` prints `State=DOWN+DRAIN+DYNAMIC_NORM`). That flag says what kind of
node it is, not that anything is wrong: a reclaimed Dynamic node left DOWN under sunkd's
drain is returned to service like a Static one, and NOT_RESPONDING beside it still
refuses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from sunkd.domain.ports import RefusedError
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.model import SlurmNode

OURS = "sunkd: lent to kubernetes [tx d1]"


@dataclass
class FakeClient:
    """slurmrestd as the actuator uses it: reads answer `nodes` in turn, updates are kept."""

    nodes: list[SlurmNode]
    updates: list[tuple[str, str]] = field(default_factory=list)
    can_update_nodes: bool = True

    async def get_node(self, name: str) -> SlurmNode:
        return self.nodes.pop(0) if len(self.nodes) > 1 else self.nodes[0]

    async def update_node(self, name: str, *, state: str, reason: str | None) -> None:
        self.updates.append((name, state))


def node(state: str, *flags: str) -> SlurmNode:
    return SlurmNode("dyn1", state, frozenset(flags), OURS, "root", 100.0, cpus=2,
                     features=("dyn",))


def resume(client: FakeClient) -> bool:
    actuator = SlurmActuator(client)  # type: ignore[arg-type]
    return asyncio.run(actuator.resume("dyn1", expect_reason=OURS, expect_reason_time=100.0,
                                       return_to_service=True))


def test_a_dynamic_node_down_under_sunkds_drain_is_returned_to_service() -> None:
    client = FakeClient([node("DOWN", "DRAIN", "DYNAMIC_NORM"), node("IDLE", "DYNAMIC_NORM")])
    assert resume(client) is True
    assert client.updates == [("dyn1", "RESUME")]


def test_a_dynamic_node_slurm_does_not_hear_is_still_refused() -> None:
    client = FakeClient([node("DOWN", "DRAIN", "DYNAMIC_NORM", "NOT_RESPONDING")])
    with pytest.raises(RefusedError, match="NOT_RESPONDING"):
        resume(client)
    assert client.updates == []
