"""The Kubernetes source's observation payloads, built from its caches: a Node as
sunkd sees it (`K8sNodeObserved`), every Node's whole pod list (`K8sWorkloadObserved`)
and a pool's pending pods (`K8sDemandObserved`).

`Payloads` reads the Node and pod caches of the watches, the pod index and the Nodeset
view; it keeps no state of its own, so the same caches always give the same payloads
(the source compares them with what it emitted last: that comparison keeps the log
quiet).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    PendingPod,
    PodRef,
    Taint,
)
from sunkd.domain.gres import expected_gres
from sunkd.kubernetes.client import JSON
from sunkd.kubernetes.listwatch import ListWatch
from sunkd.kubernetes.nodesetview import NodesetView
from sunkd.kubernetes.normalize import (
    GPU_RESOURCE,
    PodFacts,
    clean_text,
    node_quantity,
    slurm_node_name,
)
from sunkd.kubernetes.podindex import PodIndex

log = structlog.get_logger("sunkd.kubernetes.source")



class Payloads:
    """The payloads of the current caches (a relist replaces a watch's cache: it is
    read through the watch each time)."""

    def __init__(self, pods: ListWatch[PodFacts], index: PodIndex,
                 view: NodesetView, gres_type_map: Mapping[str, str] | None = None) -> None:
        # Not None: every Node's observation carries the GRES Slurm must report for it
        # (`[gres] check`; the map turns GPU product labels into Slurm's type names).
        self._gres_type_map = gres_type_map
        self._pods = pods
        self.index = index
        self.view = view

    @property
    def pods(self) -> dict[str, PodFacts]:
        return self._pods.cache

    def node(
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
        pool = self.view.pool_of(labels, nodesets)
        slurm_node = slurm_node_name(name, labels, pool.node_name_label if pool else None)
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
        pin = annotations.get(wk.ANNOTATION_PIN)
        quantities = {key: node_quantity(allocatable, key, scale) for key, scale in
                      (("cpu", 1000), ("memory", 1), (GPU_RESOURCE, 1))}
        unparsed = tuple(key for key, value in quantities.items() if value is None)
        if unparsed:
            log.warning("kubernetes.node_quantity_unparsed", node=clean_text(name),
                        resources=list(unparsed), values=[
                            clean_text(repr(allocatable.get(key)))[:100] for key in unparsed],
                        treated_as="unknown capacity")
        return K8sNodeObserved(
            node=name,
            slurm_node=slurm_node,
            ready=ready,
            unschedulable=bool(spec.get("unschedulable")),
            # sunkd's own hold is its taint; the annotation proves nothing (see events.py).
            held_by_sunkd=any(t.key == wk.TAINT_HOLD for t in taints),
            taints=taints,
            labels=tuple(
                Label(k, str(v))
                for k, v in sorted(labels.items())
                if k in relevant_keys or k.startswith(wk.PREFIX)
            ),
            pin=str(pin) if pin else None,
            cpu_millis=quantities["cpu"] or 0,
            memory_bytes=quantities["memory"] or 0,
            gpus=quantities[GPU_RESOURCE] or 0,
            unparsed=unparsed,
            gres=(None if self._gres_type_map is None
                  else expected_gres(node, self._gres_type_map)),
        )

    def workload(
        self, node: str, labels: Mapping[str, Any], nodesets: Mapping[str, K8sNodesetObserved]
    ) -> K8sWorkloadObserved:
        """Every Node's whole pod list, whatever attributes the Node to a pool (a Nodeset
        selector, partitions, a config-file pool, a transition in flight) or none: the
        fold treats a Node without a report as unknown, never as empty, so every Node
        is reported. `pool_pod` tells the pods of the Nodeset that selects the Node."""
        pool = self.view.pool_of(labels, nodesets)
        refs = []
        for key in self.index.on(node):
            pod = self.pods.get(key)
            if pod is None or pod.node != node:
                continue
            if pod.node_local:
                continue  # DaemonSet and mirror pods stay with the node, whoever owns it
            slurmd, owner = slurmd_node(pod, nodesets)
            refs.append(
                PodRef(
                    pod.namespace,
                    pod.name,
                    pod.phase,
                    uid=pod.uid or "",
                    pool_pod=not slurmd and pool is not None
                    and self.view.workload_match(pool.pool, pod.labels),
                    slurmd=slurmd,
                    slurmd_nodeset=owner,
                    deleting=pod.deleting,
                    started_at=pod.started_at if slurmd else None,
                    slurmd_busy=bool(slurmd) and pod.labels.get(wk.LABEL_SLURMD_BUSY)
                    == wk.SLURMD_BUSY_VALUE,
                    slurmd_revision=pod.slurmd_revision if slurmd else "",
                )
            )
        return K8sWorkloadObserved(
            node=node, pool="", pods=tuple(sorted(refs, key=lambda r: (r.namespace, r.name)))
        )

    def demand(self, nodeset: K8sNodesetObserved) -> K8sDemandObserved:
        pending = []
        for key in self.index.pending:
            pod = self.pods.get(key)
            if pod is None:
                continue
            if self.view.workload_match(nodeset.pool, pod.labels):
                cpu, memory, gpus = pod.requests
                pending.append(
                    PendingPod(
                        pod.namespace,
                        pod.name,
                        cpu,
                        memory,
                        gpus,
                    )
                )
        return K8sDemandObserved(
            pool=nodeset.pool, pending=tuple(sorted(pending, key=lambda p: (p.namespace, p.name)))
        )


def slurmd_node(pod: PodFacts,
                nodesets: Mapping[str, K8sNodesetObserved]) -> tuple[str, str]:
    """(the Slurm node `pod` is sunkd's slurmd pod for, the uid of the Nodeset that owns
    it): its claim names a Nodeset of its own namespace that the source knows, by that
    Nodeset's uid. ("", "") otherwise (impostors too)."""
    claim = pod.slurmd_claim
    if claim is None:
        return "", ""
    uid, name, node = claim
    nodeset = nodesets.get(f"{pod.namespace}/{name}")
    if nodeset is not None and nodeset.uid and nodeset.uid == uid:
        return node, uid
    return "", ""
