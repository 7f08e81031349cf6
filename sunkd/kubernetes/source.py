"""Kubernetes source: Nodes, Pods and Nodesets in, normalized observation events out.

Three list-then-watch loops (`sunkd.kubernetes.listwatch.ListWatch`) keep caches of stripped-down
objects; after every change the source recomputes the payloads that can depend on it and hands
the ones whose normalized content changed to the `EventSink`. Comparing normalized payloads
(not resourceVersions) is what keeps the log quiet: a kubelet heartbeat bumps a Node's
resourceVersion every 10 s but changes nothing sunkd cares about.

Nothing is emitted before all three resources have been listed once: a node observed before its
Nodesets are known would carry the wrong pool labels and Slurm name and be corrected a moment
later, and a previously seen node missing from an incomplete view would be reported vanished.
After that first sync, anything the seed (payloads from the fold) knows but the cluster no
longer has is reported gone: `K8sNodeVanished`, a Nodeset with `deleted=True`, an empty
workload or demand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    Event,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    OwnershipSpec,
    Payload,
    PendingPod,
    PodRef,
    SourceHealth,
    Taint,
)
from sunkd.domain.ports import EventSink
from sunkd.kubernetes.client import (
    JSON,
    NODES,
    NODESETS,
    PODS,
    KubeClient,
    ResourceType,
    parse_quantity,
)
from sunkd.kubernetes.listwatch import (
    ListWatch,
    Relisted,
    WatchEvent,
    WatchItem,
    WatchRecovered,
    WatchTrouble,
)

log = structlog.get_logger("sunkd.kubernetes.source")

SOURCE = "kubernetes"
ANNOTATION_CORDONED_BY = wk.ANNOTATION_CORDONED_BY
ANNOTATION_PIN = wk.ANNOTATION_PIN
LABEL_SLURM_NODE_NAME = wk.LABEL_SLURM_NODE_NAME
SUNKD_PREFIX = wk.PREFIX
GPU_RESOURCE = "nvidia.com/gpu"


# ------------------------------------------------------------------------ transforms
# The caches keep only what the payloads read; a 50k-pod relist then costs a fraction of the
# memory, and the relist diff (resourceVersion equality) still works.


def slim_node(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(SUNKD_PREFIX)
    }
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": spec.get("taints")},
        "status": {
            "allocatable": dict(status.get("allocatable") or {}),
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
        },
    }


def _requests(containers: Any) -> list[dict[str, Any]]:
    out = []
    for container in containers or []:
        resources = container.get("resources") or {}
        out.append({"resources": {"requests": dict(resources.get("requests") or {})}})
    return out


def slim_pod(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": _requests(spec.get("containers")),
            "initContainers": _requests(spec.get("initContainers")),
            "overhead": dict(spec.get("overhead") or {}),
        },
        "status": {
            "phase": status.get("phase") or "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": c.get("status"), "reason": c.get("reason")}
                for c in scheduled
            ],
        },
    }


# -------------------------------------------------------------------------- parsing


def _labels(mapping: Any) -> tuple[Label, ...]:
    if not isinstance(mapping, Mapping):
        return ()
    return tuple(Label(str(k), str(v)) for k, v in sorted(mapping.items()))


def _selector_map(value: Any) -> dict[str, str]:
    """A selector given as a plain label map or as a LabelSelector's `matchLabels`."""
    if not isinstance(value, Mapping):
        return {}
    if "matchLabels" in value or "matchExpressions" in value:
        value = value.get("matchLabels") or {}
    return {str(k): str(v) for k, v in value.items()}


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, default: float) -> float:
    """Seconds from a number or a Go-style duration string ("90s", "5m", "1h30m")."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in _DURATION_UNITS or not number:
            raise ValueError(f"not a duration: {value!r}")
        total += float(number) * _DURATION_UNITS[unit]
        number = ""
        i += len(unit)
    if number:
        total += float(number)  # bare number: seconds
    return total


def _int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    return int(value)


def parse_ownership(raw: Any) -> OwnershipSpec:
    if not isinstance(raw, Mapping):
        return OwnershipSpec()
    d = OwnershipSpec()

    def pick(*names: str) -> Any:
        for name in names:
            if name in raw:
                return raw[name]
        return None

    max_k8s = pick("maxKubernetes")
    return OwnershipSpec(
        mode=str(pick("mode") or d.mode),
        min_slurm=_int(pick("minSlurm"), d.min_slurm),
        min_kubernetes=_int(pick("minKubernetes"), d.min_kubernetes),
        max_kubernetes=None if max_k8s is None else int(max_k8s),
        prefer=str(pick("prefer") or d.prefer),
        dwell_seconds=parse_duration(pick("dwellSeconds", "dwell"), d.dwell_seconds),
        max_in_flight=_int(pick("maxInFlight"), d.max_in_flight),
        drain_timeout_seconds=parse_duration(
            pick("drainTimeoutSeconds", "drainTimeout"), d.drain_timeout_seconds
        ),
        reclaim_grace_seconds=parse_duration(
            pick("reclaimGraceSeconds", "reclaimGrace"), d.reclaim_grace_seconds
        ),
    )


def pool_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def parse_nodeset(obj: JSON, *, deleted: bool = False) -> K8sNodesetObserved:
    spec = obj.get("spec") or {}
    slurm = spec.get("slurm") or {}
    partitions = slurm.get("partitions", spec.get("partitions")) or []
    if isinstance(partitions, str):
        partitions = [partitions]
    node_name_label = slurm.get("nodeNameLabel") or spec.get("nodeNameLabel")
    return K8sNodesetObserved(
        pool=pool_name(obj),
        generation=_int((obj.get("metadata") or {}).get("generation"), 0),
        node_selector=_labels(_selector_map(spec.get("nodeSelector"))),
        partitions=tuple(str(p) for p in partitions),
        node_name_label=str(node_name_label) if node_name_label else None,
        workload_selector=_labels(_selector_map(spec.get("workloadSelector"))),
        ownership=parse_ownership(spec.get("ownership")),
        deleted=deleted,
    )


def workload_selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """metav1.LabelSelector (matchLabels + matchExpressions) or a plain label map.

    An empty or missing selector matches nothing here (like a PDB's nil selector): a Nodeset
    without a workload selector must not claim every pod in the cluster. This is the one
    deliberate difference from the API server's label selectors (where an empty selector
    selects everything), hence its own name; the emulator's `label_selector_matches` in
    sunkd/testbed/kubeapi/selectors.py follows the API server."""
    if not isinstance(selector, Mapping) or not selector:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        return all(labels.get(str(k)) == str(v) for k, v in selector.items())
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(str(k)) != str(v) for k, v in match_labels.items()):
        return False
    for expression in expressions:
        key = str(expression.get("key"))
        operator = expression.get("operator")
        values = {str(v) for v in expression.get("values") or []}
        present = key in labels
        if operator == "In" and not (present and str(labels[key]) in values):
            return False
        if operator == "NotIn" and present and str(labels[key]) in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown operator: match nothing rather than everything
    return True


def _matches(selector: tuple[Label, ...], labels: Mapping[str, Any]) -> bool:
    """Equality selector match; an empty selector matches nothing (like a PDB's nil selector):
    a Nodeset without a selector must not claim every node or every pod in the cluster."""
    if not selector:
        return False
    return all(labels.get(label.key) == label.value for label in selector)


def _decimal_or_zero(value: Any) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError:
        return Decimal(0)


def pod_requests(pod: JSON) -> tuple[int, int, int]:
    """Effective (cpu millis, memory bytes, GPUs): max(sum(containers), max(init)) + overhead,
    the scheduler's rule (k/k pkg/api/v1/resource helpers)."""
    spec = pod.get("spec") or {}
    totals = {"cpu": Decimal(0), "memory": Decimal(0), GPU_RESOURCE: Decimal(0)}
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for name in totals:
            totals[name] += _decimal_or_zero(requests.get(name, 0))
    for container in spec.get("initContainers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for name in totals:
            totals[name] = max(totals[name], _decimal_or_zero(requests.get(name, 0)))
    for name, value in (spec.get("overhead") or {}).items():
        if name in totals:
            totals[name] += _decimal_or_zero(value)
    return (
        int((totals["cpu"] * 1000).to_integral_value(rounding="ROUND_CEILING")),
        int(totals["memory"].to_integral_value(rounding="ROUND_CEILING")),
        int(totals[GPU_RESOURCE].to_integral_value(rounding="ROUND_CEILING")),
    )


def pod_is_pending_unschedulable(pod: JSON) -> bool:
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return False
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return True
    return not (pod.get("spec") or {}).get("nodeName")


# --------------------------------------------------------------------------- source


def _family(payload: Payload) -> tuple[str, str] | None:
    """(family, subject) under which the last emitted payload is remembered."""
    if isinstance(payload, K8sNodeObserved | K8sNodeVanished):
        return ("node", payload.node)
    if isinstance(payload, K8sWorkloadObserved):
        return ("workload", payload.node)
    if isinstance(payload, K8sDemandObserved):
        return ("demand", payload.pool)
    if isinstance(payload, K8sNodesetObserved):
        return ("nodeset", payload.pool)
    if isinstance(payload, SourceHealth) and payload.source == SOURCE:
        return ("health", SOURCE)
    return None


def _subject(payload: Payload) -> str:
    family = _family(payload)
    assert family is not None
    return family[1]


@dataclass(slots=True)
class _Dirty:
    nodes: set[str] = field(default_factory=set)
    pools: set[str] = field(default_factory=set)
    everything: bool = False

    def clear(self) -> None:
        self.nodes.clear()
        self.pools.clear()
        self.everything = False


class KubernetesSource:
    """Watches the cluster and emits observation events to `sink`.

    `previous` are the last observation payloads sunkd knows (from the fold); only changes
    against them are emitted. Call `run(stop_event)`; tests await `wait_synced()`, then
    `wait_idle()` to know every change received so far has reached the sink.

    A failing sink (e.g. the event log refusing a stale leader's epoch) ends `run()` with that
    error: payloads are remembered as emitted only once the sink accepted them, so a new
    source seeded from the log's fold picks up exactly where the log is.
    """

    def __init__(
        self,
        client: KubeClient,
        sink: EventSink,
        *,
        previous: Iterable[Payload] = (),
        nodeset_resource: ResourceType = NODESETS,
        nodeset_namespace: str | None = None,
        watch_timeout: int = 300,
        idle_timeout: float = 90.0,
        page_size: int = 500,
        stale_after_failures: int = 2,
        lost_after: float = 60.0,
    ) -> None:
        self.client = client
        self.sink = sink
        self.stale_after_failures = stale_after_failures
        self.lost_after = lost_after
        self._last: dict[tuple[str, str], Payload] = {}
        for payload in previous:
            family = _family(payload)
            if family is not None:
                self._last[family] = payload

        def make(rt: ResourceType, namespace: str | None, transform: Any) -> ListWatch:
            return ListWatch(
                client,
                rt,
                namespace=namespace,
                watch_timeout=watch_timeout,
                idle_timeout=idle_timeout,
                page_size=page_size,
                transform=transform,
            )

        self.watches: dict[str, ListWatch] = {
            "nodes": make(NODES, None, slim_node),
            "pods": make(PODS, None, slim_pod),
            "nodesets": make(nodeset_resource, nodeset_namespace, None),
        }
        self._synced_once: set[str] = set()
        self._synced = asyncio.Event()
        self._trouble: dict[str, WatchTrouble] = {}
        self._unhealthy_since: float | None = None
        self._dirty = _Dirty()
        # Indexes over the ListWatch caches.
        self._pods_by_node: dict[str, set[str]] = {}
        self._pod_node: dict[str, str] = {}
        self._pending: set[str] = set()
        self._lock = asyncio.Lock()
        self._nodeset_cache: dict[str, K8sNodesetObserved] | None = None
        self._workload_selectors: dict[str, Any] = {}
        self._received = 0
        self._flushed = 0
        self._idle = asyncio.Condition()
        self.emitted = 0

    # -- views ----------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, JSON]:
        return self.watches["nodes"].cache

    @property
    def pods(self) -> dict[str, JSON]:
        return self.watches["pods"].cache

    @property
    def nodeset_objects(self) -> dict[str, JSON]:
        return self.watches["nodesets"].cache

    def last_payloads(self) -> list[Payload]:
        """What the source believes the log says (the seed plus everything it emitted)."""
        return list(self._last.values())

    # -- running --------------------------------------------------------------------

    async def run(self, stop_event: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._consume(name, lw)) for name, lw in self.watches.items()
            ]
            tasks.append(group.create_task(self._health_ticker()))
            await stop_event.wait()
            for task in tasks:
                task.cancel()

    async def wait_synced(self, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            await self._synced.wait()

    async def wait_idle(self, within: float = 30.0) -> None:
        """Until every watch item received so far has been processed and flushed."""
        async with asyncio.timeout(within):
            async with self._idle:
                await self._idle.wait_for(lambda: self._flushed >= self._received)

    async def _consume(self, name: str, lw: ListWatch) -> None:
        async for item in lw.items():
            self._received += 1
            try:
                async with self._lock:
                    await self._handle(name, item)
            finally:
                self._flushed += 1
                async with self._idle:
                    self._idle.notify_all()

    async def _health_ticker(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            async with self._lock:
                await self._emit_health()

    # -- handling --------------------------------------------------------------------

    async def _handle(self, name: str, item: WatchItem) -> None:
        if isinstance(item, WatchTrouble):
            self._trouble[name] = item
            if self._unhealthy_since is None:
                self._unhealthy_since = time.monotonic()
            await self._emit_health()
            return
        if isinstance(item, WatchRecovered):
            self._trouble.pop(name, None)
            if not self._trouble:
                self._unhealthy_since = None
            await self._emit_health()
            return
        if isinstance(item, Relisted):
            self._trouble.pop(name, None)
            if not self._trouble:
                self._unhealthy_since = None
            for event in item.events:
                self._note(name, event)
            if name not in self._synced_once:
                self._synced_once.add(name)
                if len(self._synced_once) == len(self.watches):
                    self._dirty.everything = True
            await self._flush()
            if len(self._synced_once) == len(self.watches):
                await self._emit_health()
                self._synced.set()
            return
        self._note(name, item)
        await self._flush()

    def _note(self, name: str, event: WatchEvent) -> None:
        """Update indexes and mark what the change can affect."""
        if name == "nodesets":
            self._dirty.everything = True
            self._nodeset_cache = None
            return
        if name == "nodes":
            self._dirty.nodes.add(event.key)
            return
        key = event.key
        old_node = self._pod_node.pop(key, None)
        if old_node is not None:
            members = self._pods_by_node.get(old_node)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._pods_by_node[old_node]
            self._dirty.nodes.add(old_node)
        was_pending = key in self._pending
        self._pending.discard(key)
        pod = event.object
        if event.type != "DELETED":
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                self._pod_node[key] = node
                self._pods_by_node.setdefault(node, set()).add(key)
                self._dirty.nodes.add(node)
            if pod_is_pending_unschedulable(pod):
                self._pending.add(key)
        if was_pending or key in self._pending:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            for pool in self._nodesets():
                if self._workload_match(pool, labels):
                    self._dirty.pools.add(pool)

    def _nodesets(self) -> dict[str, K8sNodesetObserved]:
        """Parsed Nodesets by pool, cached until a Nodeset changes."""
        if self._nodeset_cache is None:
            parsed: dict[str, K8sNodesetObserved] = {}
            selectors: dict[str, Any] = {}
            for obj in self.nodeset_objects.values():
                nodeset = parse_nodeset(obj)
                parsed[nodeset.pool] = nodeset
                selectors[nodeset.pool] = (obj.get("spec") or {}).get("workloadSelector")
            self._nodeset_cache = parsed
            self._workload_selectors = selectors
        return self._nodeset_cache

    def _workload_match(self, pool: str, labels: Mapping[str, Any]) -> bool:
        self._nodesets()
        return workload_selector_matches(self._workload_selectors.get(pool), labels)

    # -- payloads ----------------------------------------------------------------------

    def _pool_of(
        self, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sNodesetObserved | None:
        # A node matched by several Nodesets belongs to the first by name: deterministic,
        # and the overlap is a configuration error the Nodeset status should report.
        for pool in sorted(nodesets):
            if _matches(nodesets[pool].node_selector, labels):
                return nodesets[pool]
        return None

    def _node_payload(
        self,
        node: JSON,
        nodesets: Mapping[str, K8sNodesetObserved],
        relevant_keys: frozenset[str],
    ) -> K8sNodeObserved:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        name = str(meta.get("name") or "")
        labels: dict[str, Any] = meta.get("labels") or {}
        annotations: dict[str, Any] = meta.get("annotations") or {}
        ready: bool | None = None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Ready":
                ready = {"True": True, "False": False}.get(str(condition.get("status")))
        pool = self._pool_of(labels, nodesets)
        slurm_node = ""
        if pool is not None and pool.node_name_label:
            slurm_node = str(labels.get(pool.node_name_label) or "")
        slurm_node = slurm_node or str(labels.get(LABEL_SLURM_NODE_NAME) or "") or name
        allocatable = status.get("allocatable") or {}
        taints = tuple(
            sorted(
                (
                    Taint(
                        str(t.get("key") or ""),
                        str(t.get("effect") or ""),
                        str(t.get("value") or ""),
                    )
                    for t in spec.get("taints") or []
                ),
                key=lambda t: (t.key, t.effect, t.value),
            )
        )
        pin = annotations.get(ANNOTATION_PIN)
        return K8sNodeObserved(
            node=name,
            slurm_node=slurm_node,
            ready=ready,
            unschedulable=bool(spec.get("unschedulable")),
            cordoned_by_sunkd=annotations.get(ANNOTATION_CORDONED_BY) == "sunkd",
            taints=taints,
            labels=tuple(
                Label(k, str(v))
                for k, v in sorted(labels.items())
                if k in relevant_keys or k.startswith(SUNKD_PREFIX)
            ),
            pin=str(pin) if pin else None,
            cpu_millis=int(
                (_decimal_or_zero(allocatable.get("cpu", 0)) * 1000).to_integral_value()
            ),
            memory_bytes=int(_decimal_or_zero(allocatable.get("memory", 0)).to_integral_value()),
            gpus=int(_decimal_or_zero(allocatable.get(GPU_RESOURCE, 0)).to_integral_value()),
        )

    def _workload_payload(
        self, node: str, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sWorkloadObserved | None:
        pool = self._pool_of(labels, nodesets)
        if pool is None:
            return None
        refs = []
        for key in self._pods_by_node.get(node, ()):
            pod = self.pods.get(key)
            if pod is None:
                continue
            meta = pod.get("metadata") or {}
            if self._workload_match(pool.pool, meta.get("labels") or {}):
                refs.append(
                    PodRef(
                        str(meta.get("namespace") or ""),
                        str(meta.get("name") or ""),
                        str((pod.get("status") or {}).get("phase") or "Pending"),
                    )
                )
        return K8sWorkloadObserved(
            node=node, pool=pool.pool, pods=tuple(sorted(refs, key=lambda r: (r.namespace, r.name)))
        )

    def _demand_payload(self, nodeset: K8sNodesetObserved) -> K8sDemandObserved:
        pending = []
        for key in self._pending:
            pod = self.pods.get(key)
            if pod is None:
                continue
            meta = pod.get("metadata") or {}
            if self._workload_match(nodeset.pool, meta.get("labels") or {}):
                cpu, memory, gpus = pod_requests(pod)
                pending.append(
                    PendingPod(
                        str(meta.get("namespace") or ""),
                        str(meta.get("name") or ""),
                        cpu,
                        memory,
                        gpus,
                    )
                )
        return K8sDemandObserved(
            pool=nodeset.pool, pending=tuple(sorted(pending, key=lambda p: (p.namespace, p.name)))
        )

    async def _flush(self) -> None:
        if len(self._synced_once) < len(self.watches):
            return  # no partial views: see the module docstring
        nodesets = self._nodesets()
        relevant = frozenset(label.key for ns in nodesets.values() for label in ns.node_selector)
        out: list[Payload] = []
        dirty = self._dirty
        if dirty.everything:
            node_names: set[str] = set(self.nodes) | {
                s for (f, s) in self._last if f in ("node", "workload")
            }
            pools: set[str] = set(nodesets) | {
                s for (f, s) in self._last if f in ("demand", "nodeset")
            }
            for pool in sorted(pools):
                if pool in nodesets:
                    out.append(nodesets[pool])
                else:
                    last = self._last.get(("nodeset", pool))
                    if isinstance(last, K8sNodesetObserved) and not last.deleted:
                        out.append(_replace_deleted(last))
        else:
            node_names = set(dirty.nodes)
            pools = set(dirty.pools)
        for name in sorted(node_names):
            node = self.nodes.get(name)
            if node is None:
                out.append(K8sNodeVanished(node=name))
                last_workload = self._last.get(("workload", name))
                if isinstance(last_workload, K8sWorkloadObserved) and last_workload.pods:
                    out.append(K8sWorkloadObserved(node=name, pool=last_workload.pool, pods=()))
                continue
            out.append(self._node_payload(node, nodesets, relevant))
            labels = (node.get("metadata") or {}).get("labels") or {}
            workload = self._workload_payload(name, labels, nodesets)
            if workload is not None:
                out.append(workload)
            else:
                last_workload = self._last.get(("workload", name))
                if isinstance(last_workload, K8sWorkloadObserved) and last_workload.pods:
                    out.append(K8sWorkloadObserved(node=name, pool="", pods=()))
        for pool in sorted(pools):
            nodeset = nodesets.get(pool)
            if nodeset is not None:
                out.append(self._demand_payload(nodeset))
            else:
                last_demand = self._last.get(("demand", pool))
                if isinstance(last_demand, K8sDemandObserved) and last_demand.pending:
                    out.append(K8sDemandObserved(pool=pool, pending=()))
        dirty.clear()
        await self._emit(out)

    async def _emit(self, payloads: list[Payload]) -> None:
        events: list[Event] = []
        for payload in payloads:
            family = _family(payload)
            assert family is not None
            last = self._last.get(family)
            if isinstance(payload, K8sNodeVanished) and not isinstance(last, K8sNodeObserved):
                continue  # never seen, or already reported gone
            if last == payload:
                continue
            events.append(Event(subject=_subject(payload), payload=payload))
        if not events:
            return
        await self.sink(events)
        # Remember only after the sink accepted them: if the append fails, the next flush
        # retries instead of believing the log already has them.
        for event in events:
            family = _family(event.payload)
            assert family is not None
            self._last[family] = event.payload
        self.emitted += len(events)

    async def _emit_health(self) -> None:
        if self._trouble:
            worst = max(self._trouble.values(), key=lambda t: t.consecutive)
            since = self._unhealthy_since or time.monotonic()
            if time.monotonic() - since >= self.lost_after:
                status = "lost"
            elif worst.consecutive >= self.stale_after_failures:
                status = "stale"
            else:
                return  # a single blip: the loop is already retrying
            health = SourceHealth(
                source=SOURCE, status=status, cause=worst.cause, detail=worst.detail[:300]
            )
        elif len(self._synced_once) == len(self.watches):
            health = SourceHealth(source=SOURCE, status="fresh")
        else:
            return
        last = self._last.get(("health", SOURCE))
        # Detail text varies from retry to retry; only status and cause make a new event.
        if isinstance(last, SourceHealth) and (last.status, last.cause) == (
            health.status,
            health.cause,
        ):
            return
        await self._emit([health])


def _replace_deleted(last: K8sNodesetObserved) -> K8sNodesetObserved:
    return replace(last, deleted=True)
