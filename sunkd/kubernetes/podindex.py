"""The Kubernetes source's index over its pod cache: which pods each Node runs and which
pods wait unschedulable.

The `ListWatch` cache holds the pods by key; the source needs them by Node (a Node's pod
report) and the pending ones (a pool's demand). Each change updates both from the
change's own before-and-after (`WatchEvent.previous`), so the index always equals the
cache, whatever order watches, relists and deletes of unknown pods arrive in.
"""

from __future__ import annotations

import contextlib

from sunkd.kubernetes.listwatch import WatchEvent
from sunkd.kubernetes.normalize import PodFacts


class PodIndex:
    """Pods by Node and the pending pods, kept equal to the pod cache by `note`."""

    __slots__ = ("by_node", "pending")

    def __init__(self) -> None:
        # A node's pods are a list, not a set: ~10-110 keys a node, and at 100,000 pods
        # the sets were 7 MB (docs/performance.md). The node a pod is indexed under is
        # the cached object's (`WatchEvent.previous`).
        self.by_node: dict[str, list[str]] = {}
        self.pending: set[str] = set()

    def on(self, node: str) -> list[str] | tuple[()]:
        """The keys of the pods indexed under `node`."""
        return self.by_node.get(node, ())

    def note(self, event: WatchEvent, dirty_nodes: set[str]) -> bool:
        """Apply one pod change; adds the Nodes whose report it changes to `dirty_nodes`.
        True when the pod was or is pending (a pool's demand may have changed)."""
        key = event.key
        replaced: PodFacts | None = event.previous
        old_node = replaced.node if replaced is not None else None
        if old_node is not None:
            members = self.by_node.get(old_node, [])
            with contextlib.suppress(ValueError):  # not indexed there: nothing to undo
                members.remove(key)
            if not members:
                self.by_node.pop(old_node, None)
            dirty_nodes.add(old_node)
        was_pending = key in self.pending
        self.pending.discard(key)
        pod: PodFacts = event.object
        if event.type != "DELETED":
            node = pod.node
            if node:
                members = self.by_node.setdefault(node, [])
                if key not in members:
                    members.append(key)
                dirty_nodes.add(node)
            if pod.pending_unschedulable:
                self.pending.add(key)
        return was_pending or key in self.pending
