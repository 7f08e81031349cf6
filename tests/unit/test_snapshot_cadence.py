"""Snapshots at scale: a snapshot is O(nodes) bytes, so at 10,000 nodes one every 1,000
events would write ~30 MB per 1,000 events (seen by bench/scale.py: 110 snapshots of
10-29 MB in 15 minutes). The engine waits for more events on a bigger cluster."""

from __future__ import annotations

from sunkd.domain.state import ClusterState, NodeState, UnpooledNode
from sunkd.runtime.reconciler import SNAPSHOT_EVENTS_PER_NODE, snapshot_interval


def _state(pooled: int, unpooled: int) -> ClusterState:
    return ClusterState(
        nodes={f"p{i}": NodeState(name=f"p{i}") for i in range(pooled)},
        unpooled={f"u{i}": UnpooledNode(None, None, None, 0, 0, False, False, None, None, {})
                  for i in range(unpooled)},
    )


def test_small_clusters_keep_the_configured_cadence() -> None:
    assert snapshot_interval(_state(3, 0), 50) == 50
    assert snapshot_interval(_state(0, 0), 1000) == 1000


def test_big_clusters_snapshot_once_per_events_a_node() -> None:
    # every observed node is in the snapshot, pooled or not
    assert snapshot_interval(_state(1000, 9000), 1000) == SNAPSHOT_EVENTS_PER_NODE * 10_000
    assert snapshot_interval(_state(1000, 9000), 10_000_000) == 10_000_000
