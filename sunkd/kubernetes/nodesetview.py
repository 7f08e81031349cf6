"""The Kubernetes source's view of the Nodesets: parsed once per change, and the two
questions every payload asks of them (which pool a Node's labels select, whether a pod
is a pool's workload), memoized for the length of one flush.

sunkd itself writes every Nodeset's status every few seconds: a MODIFIED event that
changes nothing the payloads read. `changed()` tells the source whether the parsed
Nodesets or their workload selectors really changed, so it rebuilds every payload only
then (at 10,000 nodes a rebuild is ~1 s of the event loop).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog

from sunkd.domain.events import K8sNodesetObserved
from sunkd.kubernetes.client import JSON
from sunkd.kubernetes.listwatch import ListWatch
from sunkd.kubernetes.normalize import parse_nodeset, selector_matches, workload_selector_matches

log = structlog.get_logger("sunkd.kubernetes.source")


class NodesetView:
    """Parsed Nodesets by pool over the Nodeset watch's cache (a relist replaces the
    cache: it is read through the watch each time)."""

    def __init__(self, watch: ListWatch[JSON]) -> None:
        self._watch = watch
        self._parsed: dict[str, K8sNodesetObserved] | None = None
        self._workload_selectors: dict[str, Any] = {}
        self._memo: _FlushMemo | None = None  # only while a flush builds its payloads

    def parsed(self) -> dict[str, K8sNodesetObserved]:
        """Parsed Nodesets by pool, cached until a Nodeset changes."""
        if self._parsed is None:
            parsed: dict[str, K8sNodesetObserved] = {}
            selectors: dict[str, Any] = {}
            for obj in self._watch.cache.values():
                try:  # slim_nodeset already refused what does not parse
                    nodeset = parse_nodeset(obj)
                except (ValueError, TypeError, ArithmeticError, AttributeError) as error:
                    log.warning("kubernetes.nodeset_rejected", error=str(error)[:300])
                    continue
                parsed[nodeset.pool] = nodeset
                selectors[nodeset.pool] = (obj.get("spec") or {}).get("workloadSelector")
            self._parsed = parsed
            self._workload_selectors = selectors
        return self._parsed

    def changed(self) -> bool:
        """A Nodeset changed in the cache: whether what the payloads read of them did."""
        before = (self._parsed, self._workload_selectors)
        self._parsed = None
        return before[0] is None or before != (self.parsed(), self._workload_selectors)

    @contextmanager
    def flush_memo(self, nodesets: Mapping[str, K8sNodesetObserved]) -> Iterator[None]:
        """Memoize selector answers while one flush builds its payloads."""
        self._memo = _FlushMemo(nodesets)
        try:
            yield
        finally:
            self._memo = None

    def workload_match(self, pool: str, labels: Mapping[str, Any]) -> bool:
        self.parsed()
        memo = self._memo
        if memo is None:
            return workload_selector_matches(self._workload_selectors.get(pool), labels)
        key = (pool, id(labels))
        hit = memo.pods.get(key)
        if hit is None or hit[0] is not labels:
            hit = (labels, workload_selector_matches(self._workload_selectors.get(pool), labels))
            memo.pods[key] = hit
        return hit[1]

    def pool_of(
        self, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sNodesetObserved | None:
        # A node matched by several Nodesets belongs to the first by name: deterministic,
        # and the overlap is a configuration error the Nodeset status should report.
        memo = self._memo
        if memo is None or memo.nodesets is not nodesets:
            return _first_match(labels, [nodesets[pool] for pool in sorted(nodesets)])
        hit = memo.pools.get(id(labels))
        if hit is None or hit[0] is not labels:
            hit = (labels, _first_match(labels, memo.ordered))
            memo.pools[id(labels)] = hit
        return hit[1]


class _FlushMemo:
    """Selector answers for one flush, keyed by the identity of a label map. Pods (and
    nodes) with equal labels share one map (`PodFacts`, `shared_labels`), so a flush at
    100,000 pods evaluates each selector once per distinct map, not once per pod. Each
    entry holds its map, so an id cannot be reused while the memo lives; the memo lives
    only while a flush's payload building runs, which never yields, so no map changes under it."""

    __slots__ = ("nodesets", "ordered", "pods", "pools")

    def __init__(self, nodesets: Mapping[str, K8sNodesetObserved]) -> None:
        self.nodesets = nodesets
        self.ordered = [nodesets[pool] for pool in sorted(nodesets)]
        self.pods: dict[tuple[str, int], tuple[Mapping[str, Any], bool]] = {}
        self.pools: dict[int, tuple[Mapping[str, Any], K8sNodesetObserved | None]] = {}


def _first_match(labels: Mapping[str, Any],
                 ordered: list[K8sNodesetObserved]) -> K8sNodesetObserved | None:
    for nodeset in ordered:
        if selector_matches(nodeset.node_selector, labels):
            return nodeset
    return None
