"""The fold of Kubernetes' observations: Nodes and which Slurm node each claims (a
second claimant is a rival, never a takeover), the per-Node pod reports (a node's pods
are its claimant's report, unknown when the source could not list them), a pool's
pending pods (the starvation clock and the forecast) and the Nodesets that define pools."""

from __future__ import annotations

from typing import Any

from sunkd.domain import authorship as marks
from sunkd.domain import forecast
from sunkd.domain.events import (
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    PodRef,
    RecordedEvent,
)
from sunkd.domain.fold.builder import Builder, NodeDraft, event_time
from sunkd.domain.fold.decisions import pin
from sunkd.domain.state import STARVATION_BOUND_SECONDS


def _on_k8s_node(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    observation: K8sNodeObserved = p
    k8s_name = observation.node or event.subject
    name = observation.slurm_node or k8s_name
    names = b.k8s_names if b.k8s_names is not None else b.base.k8s_names
    old_name = names.get(k8s_name)
    if old_name != name:
        if b.k8s_names is None:
            b.k8s_names = dict(b.base.k8s_names)
        b.k8s_names[k8s_name] = name
        if old_name is not None:
            _release_claim(b, b.draft(old_name), k8s_name, seq)
    d = b.drafts.get(name) or b.quiet_draft(name)
    if d.k8s is not None and d.k8s_name not in (None, k8s_name):
        # A second Node claims this Slurm name: an identity conflict, never a takeover.
        rivals = dict(d.k8s_rivals)
        rivals[k8s_name] = observation
        d.k8s_rivals = rivals
        return
    previous = d.k8s
    if b.aware and (previous is None or previous.labels != observation.labels):
        b.touched.append(name)  # a selector may match it now, or no longer
    d.gone_since = None
    if observation.pin != (previous.pin if previous is not None else None):
        d.pin = pin(observation.pin, "annotation", f"annotation sunkd.io/pin on {k8s_name}",
                     "", event_time(event))
    if d.k8s_name != k8s_name:  # a new claimant: its own report, or unknown
        d.pods = b.reports().get(k8s_name) if d.k8s_name is None else None
    if d.hold_mark is not None:
        d.hold_mark = marks.follow_hold(d.hold_mark, observation, event_time(event))
    d.k8s = observation
    d.k8s_name = k8s_name
    d.k8s_seq = seq
    d.k8s_missing = False


def _release_claim(b: Builder, d: NodeDraft, k8s_name: str, seq: int) -> None:
    """`k8s_name` no longer claims this Slurm node (deleted or relabelled). The pods the
    node holds follow the claim: a successor's own report, or unknown."""
    if k8s_name in d.k8s_rivals:
        rivals = dict(d.k8s_rivals)
        del rivals[k8s_name]
        d.k8s_rivals = rivals
        return
    if d.k8s_name != k8s_name:
        return
    d.hold_mark = None  # another Node object (or none) is the node's Kubernetes side now
    if d.k8s_rivals:  # the remaining claimant is the node's Kubernetes side now
        rivals = dict(d.k8s_rivals)
        successor = sorted(rivals)[0]
        d.k8s, d.k8s_name = rivals.pop(successor), successor
        d.k8s_rivals = rivals
        d.k8s_seq = seq
        # Unknown until the successor reports after the hand-over (the Kubernetes source
        # reports every claimant again when a claim is released): what the departed
        # claimant ran is not vouched for by a report the successor made before.
        d.pods = None
        return
    d.k8s = None
    d.k8s_seq = seq
    d.k8s_missing = True
    d.pods = None


def _on_k8s_vanished(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    k8s_name = p.node or subject
    if k8s_name in b.reports():  # its pods went with it
        del b.writable_reports()[k8s_name]
    d = b.draft(b.slurm_name_of(k8s_name))
    if d.k8s_name is None or d.k8s_name == k8s_name or k8s_name in d.k8s_rivals:
        _release_claim(b, d, k8s_name, seq)
        if d.k8s is None:
            d.k8s_missing = True
    else:  # older logs: a vanish for the node's only name
        d.k8s = None
        d.k8s_seq = seq
        d.k8s_missing = True
        d.pods = None
        d.hold_mark = None
    if d.k8s is None and d.slurm is None:
        d.gone_since = event_time(event)


def _on_workload(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    """A Kubernetes Node's whole pod list (reports before per-Node reports named a pool;
    each already listed every pod on the Node, so the last one is the whole list too).
    It replaces the Node's report; it becomes the Slurm node's pods only when that Node
    is the node's claimant: a rival's report never touches the claimed node's pods."""
    observation: K8sWorkloadObserved = p
    k8s_name = observation.node or event.subject
    pods: tuple[PodRef, ...] | None = observation.pods
    if observation.pool:
        # The forecast's reading: nodes running the pool's pods, counted on change (a
        # Node whose report is dropped or unknown stops counting when next reported).
        was = _runs_pods(b.reports().get(k8s_name))
        now = observation.complete and _runs_pods(observation.pods)
        if was != now:
            summary = b.history(observation.pool)
            b.set_history(observation.pool, forecast.observe(
                summary, event_time(event), busy=summary.busy + (1 if now else -1)))
    if observation.complete:
        b.writable_reports()[k8s_name] = observation.pods
    else:  # the source could not record them: unknown, not none
        pods = None
        if k8s_name in b.reports():
            del b.writable_reports()[k8s_name]
    name = b.slurm_name_of(k8s_name)
    d = b.drafts.get(name)
    if d is None:
        if name in b.forgotten or (name not in b.base.nodes and name not in b.base.unpooled):
            return  # no node claims it yet: its report waits in `pod_reports`
        d = b.quiet_draft(name)
    if d.k8s_name == k8s_name and d.k8s is not None:
        d.pods = pods
        if observation.pool:
            summary = b.history(observation.pool)
            sized = forecast.observe_node(summary, d.k8s.gpus, d.k8s.cpu_millis)
            if sized is not summary:
                b.set_history(observation.pool, sized)


def _runs_pods(pods: tuple[PodRef, ...] | None) -> bool:
    return bool(pods) and any(pod.phase not in ("Succeeded", "Failed") for pod in pods or ())


def _on_k8s_demand(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    if b.k8s_demand is None:
        b.k8s_demand = dict(b.base.k8s_demand)
    pool = p.pool or subject
    b.k8s_demand[pool] = p
    b.set_history(pool, forecast.observe(b.history(pool), event_time(event),
                                         pending=_pending_nodes(b, p)))
    since = b.k8s_pending_since if b.k8s_pending_since is not None else b.base.k8s_pending_since
    if bool(p.pending) != (pool in since):
        if b.k8s_pending_since is None:
            b.k8s_pending_since = dict(b.base.k8s_pending_since)
        if p.pending:
            b.k8s_pending_since[pool] = event_time(event)
        else:
            started, ended = b.k8s_pending_since.pop(pool), event_time(event)
            if ended - started >= STARVATION_BOUND_SECONDS:
                if b.k8s_pending_last is None:
                    b.k8s_pending_last = dict(b.base.k8s_pending_last)
                b.k8s_pending_last[pool] = (started, ended)


def _pending_nodes(b: Builder, demand: K8sDemandObserved) -> int:
    """Nodes the pending pods need, by their GPU and CPU requests against the largest
    Kubernetes node the pool's history has seen (one per pod until one is seen)."""
    pending = demand.pending
    summary = b.history(demand.pool)
    return forecast.pending_nodes(sum(max(p.gpus, 0) for p in pending),
                                  sum(max(p.cpu_millis, 0) for p in pending),
                                  summary.node_gpus, summary.node_cpu_millis, len(pending))


def _on_nodeset(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    nodeset: K8sNodesetObserved = p
    if b.nodesets is None:
        b.nodesets = dict(b.base.nodesets)
    pool = nodeset.pool or subject
    if nodeset.deleted:
        gone = b.nodesets.pop(pool, None)
        for uid in {nodeset.uid, gone.uid if gone is not None else ""} - {""}:
            if uid in b.created():
                b.set_created(uid, ())  # its pods went with it: no record is its any more
    else:
        b.nodesets[pool] = nodeset
    b.repool(event_time(event))


HANDLERS: dict[type, Any] = {
    K8sNodeObserved: _on_k8s_node,
    K8sNodeVanished: _on_k8s_vanished,
    K8sWorkloadObserved: _on_workload,
    K8sDemandObserved: _on_k8s_demand,
    K8sNodesetObserved: _on_nodeset,
}
