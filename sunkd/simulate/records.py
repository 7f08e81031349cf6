"""The world's records: node shape and state, jobs' and pods' histories, pod runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from sunkd.simulate.pods import Capacity
from sunkd.simulate.workload import BatchJob, SimPod


@dataclass(frozen=True, slots=True)
class NodeShape:
    gpus: int = 8
    cpu_milli: int = 128_000
    memory_mib: int = 786_432


@dataclass(slots=True)
class JobRecord:
    job: BatchJob
    submit: float
    start: float | None = None


@dataclass(slots=True)
class PodRecord:
    pod: SimPod
    pending: float = 0.0
    pending_since: float | None = None
    placed: bool = False
    evictions: int = 0
    incarnation: int = 0
    ran: float = 0.0  # run time done by evicted incarnations


@dataclass(slots=True)
class PodRun:
    record: PodRecord
    name: str  # this incarnation's pod name
    node: int
    gpus: tuple[int, ...]
    started: float
    remaining: float  # run time left at `started`
    terminating: bool = False


@dataclass(slots=True)
class SimNode:
    index: int
    name: str
    capacity: Capacity
    job: int | None = None
    pods: dict[str, PodRun] = field(default_factory=dict)
    drain: bool = False
    reason: str | None = None
    reason_time: float | None = None
    tainted: bool = False
    hold: bool = False
    status: int = 0  # 0 idle and usable, 1 busy, 2 idle and usable by neither side
    status_since: float = 0.0
    last_side: str = ""
    fit_key: tuple[int, int, int] = (0, 0, 0)  # its entry in World.fit_order


def pod_name(name: str, incarnation: int) -> str:
    """The name of a pod's n-th replacement (after evictions)."""
    return name if incarnation == 0 else f"{name}-{incarnation}"
