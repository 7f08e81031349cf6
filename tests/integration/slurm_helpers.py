"""Shared plumbing for the real-Slurm integration tests (one cluster per module), and what
differs between the Slurm generations they run against (measured live, docs/slurm.md)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator

import pytest

from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmNode
from sunkd_testbed.slurm import SLURM_VERSIONS, SlurmCluster, SlurmClusterError, available
from tests.conftest import require

VERSIONS_ENV = "SUNKD_TEST_SLURM_VERSIONS"

# The REST version sunkd negotiates: the newest each generation serves.
NEGOTIATED = {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}
# Every REST version each generation serves (slurmrestd's data_parser plugins).
SERVED = {
    "22.05": ("v0.0.36", "v0.0.37", "v0.0.38"),
    "24.11": ("v0.0.40", "v0.0.41", "v0.0.42"),
    "26.05": ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
}
# After RESUME (or UNDRAIN) 24.11 keeps the old reason on the undrained node; 22.05 and
# 26.05 clear it.
KEEPS_REASON_AFTER_RESUME = frozenset({"24.11"})


def slurm_test_versions() -> list[str]:
    """The generations to run the Slurm contract tests on (default: all three)."""
    raw = os.environ.get(VERSIONS_ENV, "")
    wanted = [v.strip() for v in raw.split(",") if v.strip()] or list(SLURM_VERSIONS)
    unknown = [v for v in wanted if v not in SLURM_VERSIONS]
    if unknown:
        raise ValueError(f"{VERSIONS_ENV}: unknown Slurm versions {unknown} ({SLURM_VERSIONS})")
    return wanted


def start_cluster(nodes: str, **kwargs: object) -> Iterator[SlurmCluster]:
    """Generator body for a module-scoped fixture: start, yield, always stop. A missing
    generation skips (fails under SUNKD_TEST_STRICT=1) with how to get it."""
    version = kwargs.get("version")
    ok, why = available(version if isinstance(version, str) else None)
    require(ok, why)
    cluster = SlurmCluster(nodes, **kwargs)  # type: ignore[arg-type]
    try:
        cluster.start()
    except SlurmClusterError as error:
        require(False, f"could not start a Slurm {version or ''} cluster: {error}")
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


def resumed_reason(version: str, old: str) -> str | None:
    """The reason a node shows right after our RESUME of a drain that had reason `old`."""
    return old if version in KEEPS_REASON_AFTER_RESUME else None


async def first_call(client: SlurmRestClient) -> None:
    """Negotiate, then one call that needs slurmctld to accept the token: 24.11+ answer
    `/ping` 200 even for a refused token, and refuse `GET /nodes` (511)."""
    await client.negotiate()
    await client.get_nodes()


