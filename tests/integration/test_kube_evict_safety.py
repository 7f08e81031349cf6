"""Safety scenario 10 on the API: an eviction is for one pod on one node, not for a name.

A StatefulSet pod is re-created under the same name, possibly on another node, between
the decision and the eviction. sunkd evicts only the pod it decided on (its uid, sent as
`deleteOptions.preconditions.uid`) and only while it still runs on the node being
reclaimed (`spec.nodeName`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sunkd.kubernetes.actuator import KubernetesActuator
from sunkd.kubernetes.client import PODS, KubeClient
from tests.integration.kube_helpers import (
    create_node,
    create_pod,
    ensure_namespace,
    running_emulator,
)


@pytest.fixture
async def kube() -> AsyncIterator[tuple[Any, KubeClient]]:
    async with running_emulator() as emulator:
        client = KubeClient.for_url(emulator.url)
        try:
            yield emulator, client
        finally:
            await client.close()


async def test_s10_a_pod_recreated_elsewhere_under_the_same_name_is_not_evicted(
    kube: tuple[Any, KubeClient],
) -> None:
    _, client = kube
    await ensure_namespace(client, "db")
    await create_node(client, "reclaimed")
    await create_node(client, "elsewhere")
    old = await create_pod(client, "db", "pg-0", {"app": "pg"}, node="reclaimed")
    old_uid = old["metadata"]["uid"]
    # The StatefulSet controller re-creates pg-0 on another node before the eviction runs.
    await client.delete(PODS, "pg-0", "db", grace_period_seconds=0)
    new = await create_pod(client, "db", "pg-0", {"app": "pg"}, node="elsewhere")
    assert new["metadata"]["uid"] != old_uid

    actuator = KubernetesActuator(client)
    assert await actuator.evict("db", "pg-0", uid=old_uid, node="reclaimed") is False
    assert await actuator.evict("db", "pg-0", node="reclaimed") is False  # wrong node
    pod = await client.get(PODS, "pg-0", "db")
    assert pod["metadata"].get("deletionTimestamp") is None  # the new pg-0 runs on


async def test_s10_the_decided_pod_on_the_reclaimed_node_is_evicted(
    kube: tuple[Any, KubeClient],
) -> None:
    _, client = kube
    await ensure_namespace(client, "db")
    await create_node(client, "reclaimed")
    pod = await create_pod(client, "db", "pg-1", {"app": "pg"}, node="reclaimed")
    actuator = KubernetesActuator(client)
    assert await actuator.evict("db", "pg-1", uid=pod["metadata"]["uid"], node="reclaimed")
