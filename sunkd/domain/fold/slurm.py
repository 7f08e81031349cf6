"""The fold of Slurm's observations: a node as `scontrol`/slurmrestd reports it, a node
Slurm no longer lists, and a partition's demand (its head job and the nodes it waits
for, which start the policy's reservation clock)."""

from __future__ import annotations

from typing import Any

from sunkd.domain import authorship as marks
from sunkd.domain.events import (
    RecordedEvent,
    SlurmDemandObserved,
    SlurmNodeObserved,
    SlurmNodeVanished,
)
from sunkd.domain.fold.builder import Builder, event_time
from sunkd.domain.slurmnode import slurm_unhealthy

_HEALTHY_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED"})


def _on_slurm_node(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    # The hottest path of a replay: keep it to a few attribute stores.
    name = p.node or event.subject
    d = b.drafts.get(name) or b.quiet_draft(name)
    if b.aware and (d.slurm is None or d.slurm.partitions != p.partitions):
        b.touched.append(name)  # a partition pool may match it now, or no longer
    if (p.flags or p.state not in _HEALTHY_STATES) and slurm_unhealthy(p):
        if d.slurm_unhealthy_since is None:
            d.slurm_unhealthy_since = event_time(event)
    elif d.slurm_unhealthy_since is not None:
        d.slurm_unhealthy_since = None
    if d.drain_mark is not None:
        d.drain_mark = marks.follow_drain(d.drain_mark, p, event_time(event))
    d.slurm = p
    d.slurm_seq = seq
    d.slurm_missing = False
    d.gone_since = None


def _on_slurm_vanished(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    d = b.draft(p.node or subject)
    d.slurm = None
    d.slurm_seq = seq
    d.slurm_missing = True
    d.slurm_unhealthy_since = None
    d.drain_mark = None
    if d.k8s is None:
        d.gone_since = event_time(event)
    name = d.name
    for uid, names in list(b.created().items()):
        if name in names:  # the record sunkd's pod made is gone: a new one is not proven
            b.set_created(uid, tuple(n for n in names if n != name))


def _on_slurm_demand(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    if b.slurm_demand is None:
        b.slurm_demand = dict(b.base.slurm_demand)
    partition = p.partition or subject
    b.slurm_demand[partition] = p
    # The reservation clock: it starts with the first head job reported and runs, across
    # head jobs, while anything waits for nodes. A new head job is the previous one
    # started (it gathered its nodes) and the next in line: the partition has waited
    # all along (counted per job, heads changing more often than the bound would never
    # reach it).
    since = b.slurm_head_since if b.slurm_head_since is not None else b.base.slurm_head_since
    waiting = p.head_job > 0 or p.pending_nodes > 0
    if (p.head_job > 0 and partition not in since) or (not waiting and partition in since):
        if b.slurm_head_since is None:
            b.slurm_head_since = dict(b.base.slurm_head_since)
        if waiting:
            b.slurm_head_since[partition] = event_time(event)
        else:
            del b.slurm_head_since[partition]


HANDLERS: dict[type, Any] = {
    SlurmNodeObserved: _on_slurm_node,
    SlurmNodeVanished: _on_slurm_vanished,
    SlurmDemandObserved: _on_slurm_demand,
}
