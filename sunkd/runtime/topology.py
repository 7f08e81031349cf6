"""Keeping slurmctld's topology file in step with the Kubernetes labels, in the leader.

One round: read the Kubernetes Nodes' labels (a LIST: the fold keeps only pool labels),
ask the domain what to write (`sunkd.domain.topology_plan`: Slurm-owned, registered
nodes only; never empty; rate-limited), write it and `scontrol reconfigure` through the
Slurm adapter (`sunkd.slurm.topology`), then report `TopologyApplied` as a metric
(`sunkd_topology_applied`), a counter of reconfigures by result and a log line whenever
the condition changes. A failed write leaves the previous file in place.

Meant to run in the leader only (`may_write` on the file fences each write) when
`[topology] file` is set: each term starts `run` (runtime/term.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from sunkd.domain.ports import ActionError, RefusedError
from sunkd.domain.state import ClusterState
from sunkd.domain.topology_plan import Format, TopologyPlan, plan_for
from sunkd.runtime.config import TopologySettings, topology_spec
from sunkd.slurm.topology import TopologyFile

log = structlog.get_logger(__name__)

__all__ = ["TopologyDelivery"]

ListNodes = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]


class TopologyDelivery:
    """`round()` once; `run(stop)` every `every` seconds until `stop` is set."""

    def __init__(self, settings: TopologySettings, file: TopologyFile, list_nodes: ListNodes,
                 state: Callable[[], ClusterState], *, clock: Callable[[], float] = time.time,
                 registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.file = file
        self._list_nodes = list_nodes
        self._state = state
        self._clock = clock
        self._spec = topology_spec(settings)  # the default; Nodesets may replace it
        self._format: Format = "yaml" if file.path.suffix == ".yaml" else "conf"
        # What Slurm has: the file as found now and at each term's start (`run`; None:
        # absent or unreadable, so the next round writes rather than report "unchanged").
        self.last_text: str | None = self._read()
        self.last_write_at: float | None = None
        self.last: TopologyPlan | None = None
        registry = registry if registry is not None else CollectorRegistry()
        self._applied = Gauge("sunkd_topology_applied", "1 when slurmctld has the topology "
                              "sunkd renders from the labels (TopologyApplied)",
                              registry=registry)
        self._writes = Counter("sunkd_topology_reconfigures", "Topology writes followed by "
                               "scontrol reconfigure, by result", ["result"],
                               registry=registry)

    def _read(self) -> str | None:
        try:
            return self.file.current()
        except ActionError as error:
            log.warning("topology.unreadable", path=str(self.file.path), error=str(error))
            return None

    async def round(self) -> TopologyPlan:
        now = self._clock()
        state = self._state()
        try:
            objects = await self._list_nodes()
        except Exception as error:  # any failure to read the labels: keep what Slurm has
            plan = TopologyPlan(None, False, "LabelsUnknown",
                                f"cannot list the Kubernetes Nodes: {error}; the last good "
                                "file stays")
            return self._report(plan)
        plan = plan_for(
            state, objects, self._spec, fmt=self._format, last_text=self.last_text,
            last_write_at=self.last_write_at, now=now,
            min_interval=self.settings.min_interval_seconds, name=self.settings.name)
        if plan.write is not None:
            self.last_write_at = now
            try:
                await self.file.apply(plan.write)
            except (ActionError, RefusedError) as error:
                self._writes.labels(result="failed").inc()
                plan = replace(plan, write=None, reason="WriteFailed",
                               message=f"{error}; the last good file stays")
            else:
                self._writes.labels(result="applied").inc()
                self.last_text = plan.write
                plan = replace(plan, applied=True, reason="Applied")
        return self._report(plan)

    def _report(self, plan: TopologyPlan) -> TopologyPlan:
        self._applied.set(1 if plan.applied else 0)
        before = self.last
        if before is None or (before.applied, before.reason) != (plan.applied, plan.reason):
            emit = log.info if plan.applied or plan.reason == "RateLimited" else log.warning
            emit("topology.condition", path=str(self.file.path), applied=plan.applied,
                 reason=plan.reason, message=plan.message)
        self.last = plan
        return plan

    async def run(self, stop: asyncio.Event, every: float = 5.0) -> None:
        # A term starts from the file as it is: another leader or an operator may have
        # written it since this process last did.
        self.last_text = self._read()
        while not stop.is_set():
            await self.round()
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass
