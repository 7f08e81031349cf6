"""Kubernetes' side of a node: GPU, CPU and memory left, and best-fit packing.

A node has `gpus` GPUs of 1000 milli-GPU each. A pod asking for whole GPUs (gpu_milli
1000) needs that many GPUs with nothing on them; a pod sharing a GPU (gpu_milli < 1000,
as OpenB's GPU-sharing pods do) needs that share free on each of its `gpus` GPUs, and
takes the fullest GPUs where it fits. CPU and memory must fit too. Among the nodes where a
pod fits, the scheduler picks the one left with the least free GPU, then CPU (best fit:
the bin-packing score of OpenB's paper, simplified), then the lowest node index.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sunkd.simulate.workload import SimPod

GPU_MILLI = 1000


@dataclass(slots=True)
class Capacity:
    """What is left on a node for pods."""

    gpu_free: list[int]  # milli-GPU free per GPU
    cpu_free: int
    memory_free: int
    total_gpu: int = field(init=False)
    full_gpus: int = field(init=False)  # GPUs with nothing on them

    def __post_init__(self) -> None:
        self.total_gpu = sum(self.gpu_free)
        self.full_gpus = sum(1 for free in self.gpu_free if free == GPU_MILLI)

    @classmethod
    def empty(cls, gpus: int, cpu_milli: int, memory_mib: int) -> Capacity:
        return cls([GPU_MILLI] * gpus, cpu_milli, memory_mib)

    def fits(self, pod: SimPod) -> bool:
        if pod.cpu_milli > self.cpu_free or pod.memory_mib > self.memory_free:
            return False
        if pod.gpu_milli >= GPU_MILLI:
            return self.full_gpus >= pod.gpus
        if self.total_gpu < pod.gpus * pod.gpu_milli:
            return False
        return sum(1 for free in self.gpu_free if free >= pod.gpu_milli) >= pod.gpus

    def take(self, pod: SimPod) -> tuple[int, ...]:
        """Place `pod` (which fits); the GPU indices it got."""
        need = min(pod.gpu_milli, GPU_MILLI)
        # Fullest GPUs first (best fit inside the node); whole-GPU pods take empty ones.
        order = sorted((free, index) for index, free in enumerate(self.gpu_free)
                       if free >= need)
        chosen = tuple(index for _free, index in order[: pod.gpus])
        for index in chosen:
            if self.gpu_free[index] == GPU_MILLI:
                self.full_gpus -= 1
            self.gpu_free[index] -= need
        self.total_gpu -= need * len(chosen)
        self.cpu_free -= pod.cpu_milli
        self.memory_free -= pod.memory_mib
        return chosen

    def give_back(self, pod: SimPod, gpus: tuple[int, ...]) -> None:
        need = min(pod.gpu_milli, GPU_MILLI)
        for index in gpus:
            self.gpu_free[index] += need
            if self.gpu_free[index] == GPU_MILLI:
                self.full_gpus += 1
        self.total_gpu += need * len(gpus)
        self.cpu_free += pod.cpu_milli
        self.memory_free += pod.memory_mib

    def score_after(self, pod: SimPod) -> tuple[int, int]:
        """(GPU milli, CPU milli) left if `pod` were placed here: lower is a better fit."""
        return (self.total_gpu - pod.gpus * min(pod.gpu_milli, GPU_MILLI),
                self.cpu_free - pod.cpu_milli)


def best_fit(pod: SimPod, candidates: Iterable[tuple[int, Capacity]]) -> int | None:
    """The index of the candidate node `pod` fits best on, or None."""
    best: tuple[int, int, int] | None = None
    for index, capacity in candidates:
        if capacity.fits(pod):
            gpu_left, cpu_left = capacity.score_after(pod)
            key = (gpu_left, cpu_left, index)
            if best is None or key < best:
                best = key
    return None if best is None else best[2]


Shape = tuple[int, int, int, int]


def shape_of(pod: SimPod) -> Shape:
    return (pod.gpus, pod.gpu_milli, pod.cpu_milli, pod.memory_mib)


class PendingQueue:
    """Pending pods in queue order, bucketed by shape: a node that frees up is offered
    the earliest pod that fits it after one fit check per shape, not per pod (OpenB has
    125 shapes; a starved pool has thousands of pending pods)."""

    def __init__(self) -> None:
        self.buckets: dict[Shape, deque[tuple[int, Any]]] = {}
        self.order: dict[int, Any] = {}  # queue seq -> item, in queue order
        self.view: Callable[[Any], Any] | None = None  # what an observer keeps per item
        self.views: dict[int, Any] = {}  # queue seq -> view(item), in queue order
        self.seq = 0

    def __len__(self) -> int:
        return len(self.order)

    def push(self, pod: SimPod, item: Any) -> int:
        self.seq += 1
        self.buckets.setdefault(shape_of(pod), deque()).append((self.seq, item))
        self.order[self.seq] = item
        if self.view is not None:
            self.views[self.seq] = self.view(item)
        return self.seq

    def items(self) -> list[Any]:
        return list(self.order.values())

    def clear(self) -> list[Any]:
        items = self.items()
        self.buckets.clear()
        self.order.clear()
        self.views.clear()
        return items

    def earliest_fitting(self, fits: Callable[[SimPod], bool],
                         pod_of: Callable[[Any], SimPod]) -> Any | None:
        """Remove and return the earliest queued item whose pod `fits`, or None."""
        best: tuple[int, Shape] | None = None
        for shape, bucket in self.buckets.items():
            seq, item = bucket[0]
            if (best is None or seq < best[0]) and fits(pod_of(item)):
                best = (seq, shape)
        if best is None:
            return None
        bucket = self.buckets[best[1]]
        seq, item = bucket.popleft()
        if not bucket:
            del self.buckets[best[1]]
        del self.order[seq]
        self.views.pop(seq, None)
        return item
