"""The simulated world: N whole nodes, a Slurm partition and Kubernetes, in virtual time.

Discrete events (job and pod arrivals and ends, action completions, wake-ups) are
processed in time order; after each instant the two schedulers run (`batch.plan` over
the nodes Slurm may use, best-fit packing over the nodes Kubernetes may use) and the
controller, if any (`bridge.SunkdController`), observes and acts.

Who may use a node, by `mode`:
- "flags" (separate clusters and sunkd's pool): Slurm uses a node without the DRAIN flag;
  Kubernetes a node without the owner (or hold) taint. Separate clusters set the flags
  once; in sunkd's pool only sunkd's actions change them.
- "ideal": every node without a job or pod is free for either side at once, no move
  cost, no preemption. With `prefer_k8s` pods take free nodes first; otherwise Slurm
  schedules first and pods may take a free node only when the head job's reservation
  keeps a node spare (a pod is a backfill job of unknown length) or nothing waits.

The world never lets a job start on a node with a pod or the DRAIN flag, nor a pod bind
to a tainted node or one running a job: `violations` records any attempt (tests expect
none). Utilization is measured over [0, horizon]; after the horizon pods stop and batch
jobs already submitted run to the end (up to `drain_limit` more seconds).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable

from sunkd.domain import wellknown as wk
from sunkd.simulate import batch
from sunkd.simulate.pods import Capacity, PendingQueue, best_fit
from sunkd.simulate.records import (
    JobRecord,
    NodeShape,
    PodRecord,
    PodRun,
    SimNode,
    pod_name,
)
from sunkd.simulate.series import Series, owners
from sunkd.simulate.workload import BatchJob, SimPod, Workload

END, ACTION, HORIZON = 0, 1, 2  # order of events at one instant


def _fits_any(usable: list[tuple[int, Capacity]]) -> Callable[[SimPod], bool]:
    return lambda pod: any(capacity.fits(pod) for _, capacity in usable)


def _pod_of(record: PodRecord) -> SimPod:
    return record.pod


class World:
    def __init__(self, workload: Workload, nodes: int, k8s_nodes: int, *,
                 shape: NodeShape | None = None, ideal: bool = False, prefer_k8s: bool = False,
                 drain_limit: float = 30 * 86400.0, names: str = "gpu-{:04d}") -> None:
        self.workload = workload
        self.shape = shape = shape or NodeShape()
        self.ideal = ideal
        self.prefer_k8s = prefer_k8s
        self.horizon = workload.horizon
        self.end_limit = self.horizon + (0.0 if workload.backlog_depth else drain_limit)
        self.nodes = [SimNode(i, names.format(i + 1),
                              Capacity.empty(shape.gpus, shape.cpu_milli, shape.memory_mib))
                      for i in range(nodes)]
        for node in self.nodes:
            node.fit_key = (node.capacity.total_gpu, node.capacity.cpu_free, node.index)
        self.fit_order = sorted(node.fit_key for node in self.nodes)
        for node in self.nodes:  # the last k8s_nodes start with Kubernetes
            if node.index >= nodes - k8s_nodes:
                node.drain, node.reason, node.last_side = True, wk.REASON_LEND, "kubernetes"
            else:
                node.tainted, node.last_side = True, "slurm"
        self.now = 0.0
        self.heap: list[tuple[float, int, int, int, object]] = []
        self.seq = 0
        self.queue: list[BatchJob] = []
        self.running: dict[int, tuple[BatchJob, tuple[int, ...], float]] = {}
        self.jobs: dict[int, JobRecord] = {}
        self.pending = PendingQueue()
        self.untried: list[PodRecord] = []
        self.gained: set[int] = set()
        self.pods: list[PodRecord] = []
        self.spare: float = math.inf  # ideal, Slurm first: free nodes pods may take
        self.violations: list[str] = []
        self.slurm_changed: set[int] = set()
        self.k8s_changed: set[int] = set()
        self.queue_changed = True
        self.pending_changed = True
        self.batch_dirty = True
        self.time_in = [0.0, 0.0, 0.0]  # node-seconds idle, busy, in transit (in horizon)
        self.gpu_seconds = 0.0
        self.batch_node_seconds = 0.0
        self.flips = 0
        self.evictions = 0
        self.controller: Callable[[World], None] | None = None
        self.wakeup: Callable[[], float | None] | None = None
        self.series: Series | None = Series()  # sampled owners and queues (--plot)
        # Stop early once `late_limit` pods have waited past `late_bound` (a size search
        # that only asks whether a pending percentile is met; `gave_up` says it stopped).
        self.late_bound = math.inf
        self.late_limit: int | None = None
        self.late = 0
        self.gave_up = False
        self._job_arrivals = list(workload.jobs)
        self._next_job = 0
        self._backlog_cycle = 0
        self._pod_arrivals = workload.pods
        self._next_pod = 0
        self.push(self.horizon, HORIZON, None)
        self.push(0.0, ACTION, lambda at: None)  # a first instant at t=0, whatever arrives

    # ------------------------------------------------------------------ events

    def push(self, at: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, kind, payload))

    def _next_arrival(self) -> float:
        """The next arrival in the window; arrivals at or after the horizon never come
        (`_step` admits none), so they must not be waited for either."""
        t = math.inf
        if not self.workload.backlog_depth and self._next_job < len(self._job_arrivals):
            t = self._job_arrivals[self._next_job].submit
        if self._next_pod < len(self._pod_arrivals):
            t = min(t, self._pod_arrivals[self._next_pod].create)
        return t if t < self.horizon else math.inf

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        """Run to the end: the horizon, then (without a backlog) until every batch job
        submitted has run, at most `drain_limit` after the horizon."""
        self._refill_backlog()
        while True:
            t = min(self.heap[0][0] if self.heap else math.inf, self._next_arrival())
            wake = self.wakeup() if self.wakeup is not None else None
            if wake is not None and self.now < wake < t:
                t = wake
            if t > self.end_limit or math.isinf(t):
                if self.queue:  # nothing more happens: they wait until the run's end
                    self.now = max(self.now, self.end_limit)
                break
            if t > self.horizon and not self.queue and not self.running:
                break  # everything submitted has run
            if self.series is not None and self.series.due(t):
                self._sample(t)
            self.now = t
            self._step(t)
            if self.late_limit is not None and self.late >= self.late_limit:
                self.gave_up = True
                break
            if self.series is not None:
                self.series.observe(len(self.queue), len(self.pending) + len(self.untried))
            if progress is not None:
                progress(t)
        self.finish(min(self.now, self.end_limit))

    def _step(self, t: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= t:
            _, kind, _, _, payload = heapq.heappop(heap)
            if kind == HORIZON:
                self._close_horizon(t)
            else:
                assert callable(payload)
                payload(t)
        if t < self.horizon:
            jobs = self._job_arrivals
            while (not self.workload.backlog_depth and self._next_job < len(jobs)
                   and jobs[self._next_job].submit <= t):
                self._submit(jobs[self._next_job], t)
                self._next_job += 1
            pods = self._pod_arrivals
            while self._next_pod < len(pods) and pods[self._next_pod].create <= t:
                record = PodRecord(pods[self._next_pod], pending_since=t)
                self.pods.append(record)
                self.untried.append(record)
                self._next_pod += 1
        self.schedule(t)
        if self.controller is not None:
            self.controller(self)

    def schedule(self, t: float) -> None:
        if self.ideal and self.prefer_k8s:
            self.spare = math.inf
            self._place_pods(t)
            self._schedule_batch(t)
        else:
            self._schedule_batch(t)
            self._place_pods(t)

    # ------------------------------------------------------------------- batch

    def _submit(self, job: BatchJob, t: float) -> None:
        self.jobs[job.job_id] = JobRecord(job, t)
        self.queue.append(job)
        self.queue_changed = self.batch_dirty = True

    def _refill_backlog(self) -> None:
        depth = self.workload.backlog_depth
        jobs = self._job_arrivals
        if not depth or not jobs or self.now >= self.horizon:
            return
        while len(self.queue) < depth:
            base = jobs[self._next_job]
            job_id = base.job_id + self._backlog_cycle * 10_000_000
            self._submit(BatchJob(job_id, self.now, base.runtime, base.nodes, base.estimate),
                         self.now)
            self._next_job += 1
            if self._next_job == len(jobs):
                self._next_job, self._backlog_cycle = 0, self._backlog_cycle + 1

    def slurm_usable(self, node: SimNode) -> bool:
        if self.ideal:
            return node.job is None and not node.pods
        return node.job is None and not node.drain

    def _schedule_batch(self, t: float) -> None:
        if not self.batch_dirty:
            return
        self.batch_dirty = False
        while self._batch_pass(t) and self.workload.backlog_depth:
            pass  # a backlog refilled the queue: the new jobs may fit too

    def _batch_pass(self, t: float) -> bool:
        """One scheduling pass; True if jobs started."""
        self._refill_backlog()
        if not self.queue:
            self.spare = math.inf
            return False
        free = [node for node in self.nodes if self.slurm_usable(node)]
        running = [batch.Running(start + job.estimate,
                                 sum(1 for i in nodes if self.ideal or not self.nodes[i].drain))
                   for job, nodes, start in self.running.values()]
        plan = batch.plan(self.queue, len(free), running, t)
        if len(plan.starts) == len(self.queue):
            self.spare = math.inf  # nothing waits
        else:
            self.spare = 0 if plan.extra is None else plan.extra
        if not plan.starts:
            return False
        started = set(plan.starts)
        position = 0
        for index in plan.starts:
            job = self.queue[index]
            chosen = free[position: position + job.nodes]
            position += job.nodes
            self._start_job(job, chosen, t)
        self.queue = [job for i, job in enumerate(self.queue) if i not in started]
        self.queue_changed = True
        return True

    def _start_job(self, job: BatchJob, nodes: list[SimNode], t: float) -> None:
        for node in nodes:
            if node.pods or node.job is not None or (node.drain and not self.ideal):
                self.violations.append(f"{t:.0f}: job {job.job_id} started on {node.name} "
                                       f"(pods {len(node.pods)}, drain {node.drain})")
            node.job = job.job_id
            if node.last_side == "kubernetes":
                self.flips += 1
            node.last_side = "slurm"
            self._account(node, t)
            self.slurm_changed.add(node.index)
        self.jobs[job.job_id].start = t
        indices = tuple(node.index for node in nodes)
        self.running[job.job_id] = (job, indices, t)
        self.push(t + job.runtime, END, lambda at, job_id=job.job_id: self._end_job(job_id, at))

    def _end_job(self, job_id: int, t: float) -> None:
        _job, indices, start = self.running.pop(job_id)
        used = max(min(t, self.horizon) - min(start, self.horizon), 0.0)
        self.gpu_seconds += used * self.shape.gpus * len(indices)
        self.batch_node_seconds += used * len(indices)
        for index in indices:
            node = self.nodes[index]
            node.job = None
            self._account(node, t)
            self.slurm_changed.add(index)
            self.gained.add(index)
        self.queue_changed = self.batch_dirty = True

    # -------------------------------------------------------------------- pods

    def k8s_usable(self, node: SimNode) -> bool:
        if self.ideal:
            return node.job is None
        return not node.tainted and not node.hold

    def _place_pods(self, t: float) -> None:
        if not (self.untried or (self.gained and len(self.pending))):
            self.gained.clear()
            return
        nodes = self.nodes
        gained = [nodes[i] for i in sorted(self.gained) if self.k8s_usable(nodes[i])]
        self.gained.clear()
        while gained and len(self.pending):
            usable = [(node.index, node.capacity) for node in gained if self._may_take(node)]
            if not usable:
                break
            record = self.pending.earliest_fitting(_fits_any(usable), _pod_of)
            if record is None:
                break
            self.pending_changed = True
            index = best_fit(record.pod, usable)
            assert index is not None
            self._bind(record, index, t)
        if self.untried:
            for record in self.untried:
                index = self._best_node(record.pod)
                if index is None:
                    self.pending.push(record.pod, record)
                    self.pending_changed = True
                else:
                    self._bind(record, index, t)
            self.untried = []

    def _best_node(self, pod: SimPod) -> int | None:
        """`best_fit` over every node Kubernetes may use, through `fit_order`: nodes sorted
        by (free GPU, free CPU, index), which is best fit's order, so the first usable node
        the pod fits on is the best one (and nodes with too little GPU are skipped)."""
        order = self.fit_order
        nodes = self.nodes
        need = pod.gpus * min(pod.gpu_milli, 1000)
        for position in range(bisect.bisect_left(order, (need, -1, -1)), len(order)):
            node = nodes[order[position][2]]
            if self.k8s_usable(node) and self._may_take(node) and node.capacity.fits(pod):
                return node.index
        return None

    def _refit(self, node: SimNode) -> None:
        """Keep `fit_order` sorted after `node`'s capacity changed."""
        order = self.fit_order
        old = node.fit_key
        del order[bisect.bisect_left(order, old)]
        capacity = node.capacity
        node.fit_key = (capacity.total_gpu, capacity.cpu_free, node.index)
        bisect.insort(order, node.fit_key)

    def _may_take(self, node: SimNode) -> bool:
        """Ideal pool, Slurm first: a pod takes a free node only if Slurm can spare it."""
        return not self.ideal or bool(node.pods) or self.spare >= 1

    def _bind(self, record: PodRecord, index: int, t: float) -> None:
        pod = record.pod
        node = self.nodes[index]
        if node.job is not None or (not self.ideal and (node.tainted or node.hold)):
            self.violations.append(f"{t:.0f}: pod {pod.name} bound to {node.name} "
                                   f"(job {node.job}, tainted {node.tainted})")
        if self.ideal and not node.pods:
            self.spare -= 1
            if node.last_side == "slurm":
                self.flips += 1
            node.last_side = "kubernetes"
            self.batch_dirty = True  # a free node is gone
        gpus = node.capacity.take(pod)
        self._refit(node)
        remaining = pod.duration - record.ran
        name = pod_name(pod.name, record.incarnation)
        run = PodRun(record, name, index, gpus, t, remaining)
        node.pods[name] = run
        assert record.pending_since is not None
        before = record.pending
        record.pending += t - record.pending_since
        if before <= self.late_bound < record.pending:
            self.late += 1
        record.pending_since = None
        record.placed = True
        self._account(node, t)
        self.k8s_changed.add(index)
        self.slurm_changed.add(index)
        self.push(t + remaining, END, lambda at, run=run: self._end_pod(run, at))

    def _end_pod(self, run: PodRun, t: float) -> None:
        node = self.nodes[run.node]
        if node.pods.get(run.name) is not run:
            return  # already gone (evicted, or stopped at the horizon)
        del node.pods[run.name]
        node.capacity.give_back(run.record.pod, run.gpus)
        self._refit(node)
        pod = run.record.pod
        self.gpu_seconds += (max(min(t, self.horizon) - min(run.started, self.horizon), 0.0)
                             * pod.gpus * min(pod.gpu_milli, 1000) / 1000)
        self._account(node, t)
        self.k8s_changed.add(run.node)
        self.slurm_changed.add(run.node)
        self.gained.add(run.node)
        if self.ideal and not node.pods:
            self.batch_dirty = True

    def evict(self, node: SimNode, names: set[str], t: float, grace: float) -> int:
        """Evict pods (the replacement is pending at once; the old pod ends after `grace`)."""
        count = 0
        for name in sorted(names):
            run = node.pods.get(name)
            if run is None or run.terminating:
                continue
            run.terminating = True
            count += 1
            record = run.record
            record.ran += t - run.started
            record.evictions += 1
            record.incarnation += 1
            self.evictions += 1
            if t < self.horizon and record.pod.duration - record.ran > 0:
                record.pending_since = t  # its replacement waits from now
                self.pending.push(record.pod, record)
                self.pending_changed = True
            self.push(t + grace, END, lambda at, run=run: self._end_pod(run, at))
        return count

    def _close_horizon(self, t: float) -> None:
        """The pod stream ends: pods stop, pods still waiting are counted as such."""
        for record in self.pending.clear() + self.untried:
            if record.pending_since is not None:
                record.pending += t - record.pending_since
                record.pending_since = None
        self.untried = []
        self.pending_changed = True
        for node in self.nodes:
            for run in list(node.pods.values()):
                self._end_pod(run, t)

    def _sample(self, t: float) -> None:
        """Record the state (unchanged since the last instant) at every grid point <= t."""
        series = self.series
        assert series is not None
        slurm, kubernetes, transit = owners(self.nodes, self.ideal)
        now = len(self.queue), len(self.pending) + len(self.untried)
        jobs, pods = series.take_peaks(*now)
        moves = series.moves() if series.moves is not None else self.flips
        while series.due(t):
            series.add(series.next_at, slurm, kubernetes, transit, jobs, pods, moves,
                       self.evictions)
            jobs, pods = now  # later grid points of a quiet gap: the queues as they are

    # -------------------------------------------------------------- accounting

    def _account(self, node: SimNode, t: float) -> None:
        if node.job is not None or node.pods:
            status = 1
        elif self.ideal or self.slurm_usable(node) or self.k8s_usable(node):
            status = 0
        else:
            status = 2
        if status != node.status:
            self.time_in[node.status] += (max(min(t, self.horizon) - node.status_since, 0.0))
            node.status, node.status_since = status, min(t, self.horizon)

    def touch(self, node: SimNode) -> None:
        """Flags changed on `node` (an action): re-account, reschedule."""
        self._account(node, self.now)
        self.batch_dirty = True
        self.gained.add(node.index)

    def finish(self, t: float) -> None:
        for node in self.nodes:
            self.time_in[node.status] += max(self.horizon - node.status_since, 0.0)
            node.status_since = self.horizon
        for _job, indices, start in self.running.values():  # still running at the end
            used = max(min(t, self.horizon) - min(start, self.horizon), 0.0)
            self.gpu_seconds += used * self.shape.gpus * len(indices)
            self.batch_node_seconds += used * len(indices)
        self.now = t
