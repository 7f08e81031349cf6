"""Keeps every Nodeset's status current (counters, nodes, conditions) while leading.

The status is built from the folded state by `kubernetes/nodeset_status.py`; a
condition's `lastTransitionTime` is the policy's clock (the database's, as every time
the policy and the log use), not this host's. Only what changed since the last write
is written; a failed write is retried on the next round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from sunkd.domain.policy import PoolSpec
from sunkd.domain.state import ClusterState
from sunkd.runtime.ports import NodesetStatusWriter

log = structlog.get_logger(__name__)

NODESET_STATUS_INTERVAL = 2.0


async def write_nodeset_status(writer: NodesetStatusWriter, *,
                               state: Callable[[], ClusterState],
                               pools: Callable[[], tuple[PoolSpec, ...]],
                               may_act: Callable[[], bool], clock: Callable[[], float],
                               interval: float = NODESET_STATUS_INTERVAL,
                               conditions: Callable[[], Sequence[Mapping[str, str]]]
                               = tuple) -> None:
    """Every `interval` while acting, write the statuses that changed (forever).
    `conditions`: cluster-wide ones every Nodeset carries (the topology delivery's
    `TopologyApplied`)."""
    from sunkd.domain.policy.model import membership
    from sunkd.kubernetes.nodeset_status import build_nodeset_status

    # What was written, by pool: a status document as the API server takes it.
    written: dict[str, dict[str, Any]] = {}
    while True:
        await asyncio.sleep(interval)
        if not may_act():
            continue
        current, current_pools, extra = state(), pools(), conditions()
        member_of: dict[str, str] | None = None
        for pool_name, nodeset in sorted(current.nodesets.items()):
            if nodeset.deleted or "/" not in pool_name:
                continue
            namespace, name = pool_name.split("/", 1)
            previous = written.get(pool_name, {})
            if member_of is None:
                member_of = membership(current, current_pools)
            status = build_nodeset_status(
                current, current_pools, pool_name, nodeset.generation, clock(),
                {c["type"]: c for c in previous.get("conditions", [])}, member_of,
                extra_conditions=extra)
            if status == previous:
                continue
            try:
                await writer.update_nodeset_status(namespace, name, status)
                written[pool_name] = status
            except Exception as error:  # retried on the next round
                log.warning("nodeset.status_failed", pool=pool_name, error=str(error))
