"""A Slurm partition's scheduler: FIFO with EASY backfill, whole-node jobs.

One pass, at a moment, over the waiting jobs in submission order (`plan`):
1. jobs start from the head of the queue while they fit on the free nodes;
2. the first job that does not fit gets a reservation at the "shadow time": the earliest
   moment at which the nodes that will come back to this partition (free now, or running
   a job that ends by then) suffice; the nodes beyond its need at that moment are `extra`;
3. later jobs start now if they fit and either end (by their estimate) before the shadow
   time or use no more than `extra` nodes (which they then consume).

Nodes that will not come back to the partition (drained for Kubernetes) do not count. If
the head job cannot get a reservation at all (fewer usable nodes than it needs), Slurm's
backfill plans nothing for it and every later job that fits may start: this is how a
drained partition starves a wide job, and the model keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sunkd.simulate.workload import BatchJob


@dataclass(frozen=True, slots=True)
class Running:
    """A running job, as the scheduler sees it."""

    expected_end: float  # start + estimate
    returning_nodes: int  # its nodes that come back to the partition when it ends


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[int, ...]  # indices into the queue, in start order
    shadow: float | None  # the head job's reservation time
    # Nodes still spare at the shadow time after this pass's backfill; None: no reservation
    # possible (queue empty, or the head job cannot fit on the nodes coming back).
    extra: int | None


def plan(queue: Sequence[BatchJob], free: int, running: Sequence[Running],
         now: float) -> Plan:
    """Which queued jobs start now on `free` nodes (FIFO + EASY backfill)."""
    starts: list[int] = []
    index = 0
    count = len(queue)
    while index < count and queue[index].nodes <= free:
        starts.append(index)
        free -= queue[index].nodes
        index += 1
    if index == count:
        return Plan(tuple(starts), None, None)
    head = queue[index]
    # The head job's reservation: running jobs come back in order of their expected end.
    # Jobs started in this pass run from `now` with their estimates.
    ends = sorted((r.expected_end, r.returning_nodes) for r in running)
    ends += [(now + queue[i].estimate, queue[i].nodes) for i in starts]
    ends.sort()
    available = free
    shadow: float | None = None
    extra: int | None = None
    if available >= head.nodes:  # cannot happen (it would have started); kept total
        shadow, extra = now, available - head.nodes
    else:
        for end, nodes in ends:
            available += nodes
            if available >= head.nodes:
                shadow, extra = max(end, now), available - head.nodes
                break
    if free == 0:
        return Plan(tuple(starts), shadow, extra)
    limit = math.inf if shadow is None else shadow
    spare = math.inf if extra is None else extra
    for later in range(index + 1, count):
        job = queue[later]
        if job.nodes > free:
            continue
        if now + job.estimate <= limit:
            pass
        elif job.nodes <= spare:
            spare -= job.nodes
        else:
            continue
        starts.append(later)
        free -= job.nodes
        if free == 0:
            break
    return Plan(tuple(starts), shadow, None if extra is None else int(spare))
