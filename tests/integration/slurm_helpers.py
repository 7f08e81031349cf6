"""Shared plumbing for the real-Slurm integration tests (one cluster per module)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmNode
from sunkd.testbed.slurm import SlurmCluster, SlurmClusterError, available
from tests.conftest import require


def start_cluster(nodes: str, **kwargs: object) -> Iterator[SlurmCluster]:
    """Generator body for a module-scoped fixture: start, yield, always stop."""
    ok, why = available()
    require(ok, why)
    cluster = SlurmCluster(nodes, **kwargs)  # type: ignore[arg-type]
    try:
        cluster.start()
    except SlurmClusterError as error:
        require(False, f"could not start a Slurm cluster: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()


def jwt_client(cluster: SlurmCluster, **kwargs: object) -> SlurmRestClient:
    return SlurmRestClient(cluster.rest_url, jwt_key_file=cluster.jwt_key_path, **kwargs)  # type: ignore[arg-type]


async def wait_node(
    client: SlurmRestClient,
    name: str,
    predicate: Callable[[SlurmNode], bool],
    *,
    within: float = 20.0,
    what: str = "",
) -> SlurmNode:
    """Poll GET /nodes until `predicate(node)`; fail with the last state seen."""
    deadline = time.monotonic() + within
    last: SlurmNode | None = None
    while True:
        nodes = {n.name: n for n in await client.get_nodes()}
        last = nodes.get(name)
        if last is not None and predicate(last):
            return last
        if time.monotonic() > deadline:
            pytest.fail(
                f"{name}: timeout ({within} s) waiting for {what or predicate}; last: {last}"
            )
        await asyncio.sleep(0.1)
