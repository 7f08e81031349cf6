"""Which nodes the pools name, as the fold sees it.

In a pool-aware fold (the log records the config-file pools) a node that no pool, pin
or open transition names is kept as a compact `UnpooledNode` record, and a node with
sunkd history that leaves every pool starts the clock after which the policy forgets
that history (`node.forgotten`). The rules are the same as `policy.membership`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from sunkd.domain.events import ConfiguredPool, K8sNodesetObserved
from sunkd.domain.state import OWNER_NONE, NodeState, Phase

if TYPE_CHECKING:
    from sunkd.domain.fold.builder import NodeDraft


def without_history(node: NodeState | NodeDraft) -> bool:
    """Nothing but observations: sunkd never owned, moved, pinned or acted on it (or
    forgot all that). Such a node is exactly its `UnpooledNode` record."""
    return (node.owner == OWNER_NONE and node.phase == Phase.UNKNOWN and node.since is None
            and node.last_move_at is None and node.transition is None and node.pin is None
            and not node.open_actions and not node.outcomes
            and node.unpooled_since is None
            and node.drain_mark is None and node.hold_mark is None)


class PoolMatch(NamedTuple):
    """One pool's membership rule (the same as `policy.membership`'s)."""

    name: str
    partitions: frozenset[str]
    selector: frozenset[tuple[str, str]]
    nodes: frozenset[str]


def pool_rules(nodesets: Mapping[str, K8sNodesetObserved],
                configured: tuple[ConfiguredPool, ...]) -> tuple[PoolMatch, ...]:
    """The effective pools (a Nodeset wins a name clash, as in `effective_pools`)."""
    rules = {pool.name: PoolMatch(pool.name, frozenset(pool.partitions),
                                   frozenset((lb.key, lb.value) for lb in pool.node_selector),
                                   frozenset(pool.nodes)) for pool in configured}
    for nodeset in nodesets.values():
        if not nodeset.deleted:
            rules[nodeset.pool] = PoolMatch(
                nodeset.pool, frozenset(nodeset.partitions),
                frozenset((lb.key, lb.value) for lb in nodeset.node_selector), frozenset())
    return tuple(rules[name] for name in sorted(rules))


def in_a_pool(rules: tuple[PoolMatch, ...], node: NodeState | NodeDraft) -> bool:
    """A pool, a pin or an open transition names the node (membership keeps a moving
    node in its transition's pool)."""
    if node.transition is not None or node.pin is not None:
        return True
    labels: frozenset[tuple[str, str]] | None = None
    for rule in rules:
        if node.name in rule.nodes:
            return True
        if rule.selector:
            if node.k8s is None:
                continue
            if labels is None:
                labels = frozenset((label.key, label.value) for label in node.k8s.labels)
            if rule.selector <= labels:
                return True
            continue
        if rule.nodes or not rule.partitions or node.slurm is None:
            continue
        if not rule.partitions.isdisjoint(node.slurm.partitions):
            return True
    return False
