"""The bridge: sunkd's real fold and policy driving the simulated world.

Each instant, after the world's schedulers ran, the bridge does what the daemon does:
the sources' observations of what changed become events (Kubernetes at once, as its
watch would; Slurm at the next `poll` boundary, as the poller would; both only on
change), they are folded into the `ClusterState`, `decide(state, pools, now)` runs, its
decisions are appended and folded, and every requested action is carried out on the
world after its latency (the actuators' contract: idempotent, refusing foreign drains),
its outcome appended in turn. `decide` runs again whenever the log grew, and at the
moments its time-based rules can change the answer (dwell ending, drain timeout,
reclaim grace, retry backoff, the wait for an observation after a success; a fallback
tick while a transition is open), so a run needs far fewer rounds than the daemon's 1 s
tick and gives the same decisions.

Nothing here reads a clock or draws a random number: virtual time is `EPOCH + t`, ids
come from the policy (from log positions), so a run is a pure function of its inputs.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sWorkloadObserved,
    Label,
    LeaderElected,
    OwnershipSpec,
    Payload,
    PendingPod,
    PodRef,
    RecordedEvent,
    SlurmDemandObserved,
    SlurmNodeObserved,
    SourceHealth,
    Taint,
)
from sunkd.domain.fold import fold
from sunkd.domain.forecast import HOUR
from sunkd.domain.ownership import UNHEALTHY_GRACE_SECONDS
from sunkd.domain.policy import (
    KUBERNETES_WAIT_BOUND_SECONDS,
    OBSERVATION_CATCHUP_SECONDS,
    REFUSED_RETRY_SECONDS,
    SLURM_HEAD_WAIT_BOUND_SECONDS,
    AbortTransition,
    CompleteTransition,
    PoolSpec,
    StartTransition,
    decide,
    decision_to_event,
    lead_seconds,
    reclaim_grace_started_at,
    retry_backoff,
    stale_action,
    starvation_held_until,
)
from sunkd.domain.policy.ahead import FORECAST_SETTLE_SECONDS, MAX_HORIZON_SECONDS
from sunkd.domain.policy.blocks import block_now
from sunkd.domain.state import EMPTY, OWNER_NONE, ClusterState, OpenAction
from sunkd.simulate.actuate import carry_out
from sunkd.simulate.checks import check_in_flight, check_round
from sunkd.simulate.quiet import quiet, slurm_outweighs
from sunkd.simulate.records import PodRecord, SimNode, pod_name
from sunkd.simulate.world import ACTION, World

EPOCH = 1_700_000_000.0  # virtual time 0, as a unix time
POOL = "sim/gpu"
PARTITION = "gpu"
POOL_LABEL = Label(wk.LABEL_POOL, "gpu")
NAMESPACE = "serving"
OWNER_TAINT = Taint(wk.TAINT_OWNER, wk.TAINT_OWNER_EFFECT, wk.OWNER_SLURM)
HOLD_TAINT = Taint(wk.TAINT_HOLD, wk.TAINT_OWNER_EFFECT, wk.OWNER_SLURM)
MAX_ROUNDS_PER_INSTANT = 8


@dataclass(frozen=True, slots=True)
class Latencies:
    """What moves cost in the model, in seconds."""

    slurm_action: float = 1.0  # a drain or resume through slurmrestd
    k8s_action: float = 0.5  # a taint patch, an eviction request
    poll: float = 5.0  # Slurm poll interval (Kubernetes is watched: no delay)
    pod_termination: float = 30.0  # an evicted pod's graceful termination
    move_cost: float = 0.0  # added to the last step of every move (unlock, resume)
    tick: float = 300.0  # fallback round interval while a transition is open


def pool_spec(ownership: OwnershipSpec) -> PoolSpec:
    return PoolSpec(name=POOL, partitions=(PARTITION,), node_selector=(POOL_LABEL,),
                    ownership=ownership)


@dataclass(slots=True)
class BridgeStats:
    decide_calls: int = 0
    skipped: int = 0  # rounds `quiet` showed could not decide anything
    events: int = 0
    lends: int = 0
    reclaims: int = 0
    adoptions: int = 0
    aborted: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    failed_actions: int = 0
    problems: list[str] = field(default_factory=list)
    digest: str = ""


class SunkdController:
    """Called by the world after every instant (`world.controller`)."""

    def __init__(self, world: World, ownership: OwnershipSpec,
                 latencies: Latencies = Latencies(), check: bool = False,
                 exact: bool = False, reference: bool = False) -> None:
        self.world = world
        self.pool = pool_spec(ownership)
        self.pools = (self.pool,)
        self.latencies = latencies
        self.check = check
        self.exact = exact  # decide on every change (no `quiet` shortcut)
        # What the daemon does: decide on every change and on a 1 s tick (slow; tests
        # compare the default rounds against it).
        self.reference = reference
        self.decided_nothing = False
        self.outweighs: bool | None = None  # slurm_outweighs since the last decide
        self.by_name = {node.name: node for node in world.nodes}
        self.state: ClusterState = EMPTY
        self.seq = 0
        self.new: list[RecordedEvent] = []
        self.last: dict[tuple[str, str], Payload] = {}
        self.dispatched: set[str] = set()
        self.poll_at: float | None = None
        self.timer: float | None = None  # when to wake the world for `due`
        self.due: float | None = None  # the next moment a time-based rule comes due (unix)
        self.timers_dirty = True
        self.stats = BridgeStats()
        self._hash = hashlib.sha256()
        self._stamp_t = -1.0
        self._stamp = datetime.fromtimestamp(EPOCH, tz=UTC)
        world.controller = self
        world.pending.view = self._pending_pod
        world.wakeup = self.wakeup
        world.slurm_changed.update(range(len(world.nodes)))
        world.k8s_changed.update(range(len(world.nodes)))
        self._append(LeaderElected(epoch=1, identity="simulate"), "simulate", 0.0)
        for source in (wk.OWNER_SLURM, "kubernetes"):
            self._append(SourceHealth(source=source, status="fresh"), source, 0.0)
        for node in world.nodes:
            if node.drain and node.reason:  # lent before the run: by sunkd, says its log
                self._lent_before(node)

    def _lent_before(self, node: SimNode) -> None:
        """The drain request and success an earlier sunkd logged for a node the world
        starts lent: what proves the drain sunkd's (`sunkd.domain.authorship`)."""
        action_id = f"act-start-{node.name}"
        self._append(ActionRequested(action_id=action_id, side=wk.OWNER_SLURM, verb="drain",
                                     node=node.name, reason="lent before the run",
                                     args=(Label("reason", node.reason or ""),)),
                     node.name, 0.0)
        self._append(ActionSucceeded(action_id=action_id, side=wk.OWNER_SLURM, verb="drain",
                                     node=node.name), node.name, 0.0)

    # ------------------------------------------------------------------- log

    def _append(self, payload: Payload, subject: str, t: float) -> None:
        if t != self._stamp_t:
            self._stamp_t, self._stamp = t, datetime.fromtimestamp(EPOCH + t, tz=UTC)
        self.seq += 1
        self.new.append(RecordedEvent(self.seq, self._stamp, 1, subject, payload))
        self.stats.events += 1

    def _emit(self, key: tuple[str, str], payload: Payload, t: float) -> None:
        if self.last.get(key) != payload:
            self.last[key] = payload
            self._append(payload, key[1], t)

    # ---------------------------------------------------------- observations

    def _slurm_node(self, node: SimNode) -> SlurmNodeObserved:
        world = self.world
        busy = node.job is not None
        job_end = None
        if node.job is not None:  # its job's expected end, as GET /jobs reports it
            job, _nodes, start = world.running[node.job]
            job_end = EPOCH + start + job.estimate
        return SlurmNodeObserved(
            node=node.name, state="ALLOCATED" if busy else "IDLE",
            flags=("DRAIN",) if node.drain else (),
            reason=node.reason if node.drain else None,
            reason_time=None if node.reason_time is None else EPOCH + node.reason_time,
            cpus=world.shape.cpu_milli // 1000,
            alloc_cpus=world.shape.cpu_milli // 1000 if busy else 0,
            gpus_total=world.shape.gpus, gpus_used=world.shape.gpus if busy else 0,
            partitions=(PARTITION,), jobs=1 if busy else 0, job_end=job_end)

    def _slurm_demand(self) -> SlurmDemandObserved:
        world = self.world
        return SlurmDemandObserved(
            partition=PARTITION, pending_jobs=len(world.queue),
            pending_nodes=sum(job.nodes for job in world.queue),
            running_jobs=len(world.running),
            # FIFO: the queue's first job is the one Slurm reports waiting on `Resources`.
            head_nodes=world.queue[0].nodes if world.queue else 0,
            head_job=world.queue[0].job_id if world.queue else 0)

    def _k8s_node(self, node: SimNode) -> K8sNodeObserved:
        shape = self.world.shape
        taints: tuple[Taint, ...] = (OWNER_TAINT,) if node.tainted else ()
        if node.hold:
            taints += (HOLD_TAINT,)
        return K8sNodeObserved(
            node=node.name, slurm_node=node.name, ready=True, taints=taints,
            labels=(POOL_LABEL,), cpu_millis=shape.cpu_milli,
            memory_bytes=shape.memory_mib * 2**20, gpus=shape.gpus)

    def _observe(self, t: float) -> None:
        world = self.world
        for index in sorted(world.k8s_changed):
            node = world.nodes[index]
            self._emit(("k8s", node.name), self._k8s_node(node), t)
            pods = tuple(PodRef(NAMESPACE, name, "Running", name) for name in sorted(node.pods))
            self._emit(("workload", node.name),
                       K8sWorkloadObserved(node=node.name, pool=POOL, pods=pods), t)
        world.k8s_changed.clear()
        if world.pending_changed:
            world.pending_changed = False
            pending = tuple(world.pending.views.values())
            key = ("k8s-demand", POOL)
            last = self.last.get(key)
            if not isinstance(last, K8sDemandObserved) or last.pending != pending:
                before = last.pending if isinstance(last, K8sDemandObserved) else ()
                if bool(pending) != bool(before):
                    self.timers_dirty = True  # the pending clock (re)starts or stops
                payload = K8sDemandObserved(pool=POOL, pending=pending)
                self.last[key] = payload
                self._append(payload, POOL, t)
        if (world.slurm_changed or world.queue_changed) and self.poll_at is None:
            poll = self.latencies.poll
            self.poll_at = math.ceil(t / poll) * poll if poll > 0 else t
            if self.poll_at > t:
                world.push(self.poll_at, ACTION, lambda at: None)
        if self.poll_at is not None and self.poll_at <= t:
            self.poll_at = None
            for index in sorted(world.slurm_changed):
                node = world.nodes[index]
                self._emit(("slurm", node.name), self._slurm_node(node), t)
            world.slurm_changed.clear()
            if world.queue_changed:
                world.queue_changed = False
                demand = self._slurm_demand()
                last_demand = self.last.get(("slurm-demand", PARTITION))
                if not isinstance(last_demand, SlurmDemandObserved) or \
                        last_demand.head_job != demand.head_job:
                    self.timers_dirty = True  # the head job's clock (re)starts or stops
                self._emit(("slurm-demand", PARTITION), demand, t)

    @staticmethod
    def _pending_pod(record: PodRecord) -> PendingPod:
        pod = record.pod
        return PendingPod(NAMESPACE, pod_name(pod.name, record.incarnation), pod.cpu_milli,
                          pod.memory_mib * 2**20, pod.gpus)

    # -------------------------------------------------------------- deciding

    def __call__(self, world: World) -> None:
        t = world.now
        self._observe(t)
        fired = self.due is not None and EPOCH + t >= self.due - 1e-6
        if self.reference:
            pass
        elif not self.new and not fired:
            return
        elif not fired and self.decided_nothing and not self.exact and \
                quiet(self.new, self.state, lambda: self._outweighs(EPOCH + t)):
            self.state = fold(self.new, self.state)
            self.new = []
            self.stats.skipped += 1
            return
        now = EPOCH + t
        self.decided_nothing = False
        self.outweighs = None
        for _ in range(MAX_ROUNDS_PER_INSTANT):
            self.state = fold(self.new, self.state)
            self.new = []
            decisions = decide(self.state, self.pools, now)
            self.stats.decide_calls += 1
            if self.check:
                self.stats.problems += check_round(self.state, now, decisions, self.pool)
            if not decisions:
                self.decided_nothing = True
                break
            self.timers_dirty = True
            for decision in decisions:
                self._count(decision)
                event = decision_to_event(decision)
                self._append(event.payload, event.subject, t)
            self.state = fold(self.new, self.state)
            self.new = []
            if self.check:
                self.stats.problems += check_in_flight(self.state, self.pool)
            self._dispatch(t)
        if fired or self.timers_dirty:
            self.timers_dirty = False
            self.due = self._next_due(now)
            # At the first whole second at or after it, as the daemon's 1 s tick notices it.
            self.timer = None if self.due is None else float(
                max(math.ceil(self.due - EPOCH - 1e-6), math.floor(t) + 1))

    def _outweighs(self, now: float) -> bool:
        if self.outweighs is None:
            self.outweighs = slurm_outweighs(self.state, self.pool, now)
        return self.outweighs

    def _count(self, decision: object) -> None:
        self._hash.update(repr(decision).encode())
        stats = self.stats
        if isinstance(decision, StartTransition) and decision.from_owner == OWNER_NONE:
            stats.adoptions += 1
        elif isinstance(decision, CompleteTransition) and decision.from_owner != OWNER_NONE:
            if decision.to_owner == wk.OWNER_SLURM:
                stats.reclaims += 1
            else:
                stats.lends += 1
        elif isinstance(decision, AbortTransition):
            stats.aborted[decision.reason.split(" (")[0].split(":")[0]] += 1

    def digest(self) -> str:
        return self._hash.hexdigest()[:16]

    def wakeup(self) -> float | None:
        if self.reference:
            return float(math.floor(self.world.now) + 1)
        return self.timer

    def _next_due(self, now: float) -> float | None:
        """The next moment a time-based rule of the policy may change its answer."""
        spec = self.pool.ownership
        best = math.inf

        def consider(at: float) -> None:
            nonlocal best
            if now < at < best:
                best = at

        pending_since = self.state.k8s_pending_since.get(self.pool.name)
        if pending_since is not None:
            consider(pending_since + KUBERNETES_WAIT_BOUND_SECONDS)
        consider(starvation_held_until(self.state, self.pool))  # the hysteresis ends
        if spec.forecast:
            # The forecast's window [now, now + lead] crosses into another hour.
            summary = self.state.demand_history.get(self.pool.name)
            lead = 0.0 if summary is None else \
                lead_seconds(summary, spec.forecast_horizon_seconds)
            # The recent-peak hold's window [now, now + horizon] likewise.
            horizon = now + min(max(spec.forecast_horizon_seconds, 0.0), MAX_HORIZON_SECONDS)
            consider((math.floor(horizon / HOUR) + 1) * HOUR - (horizon - now))
            for edge in (now, now + lead):
                consider((math.floor(edge / HOUR) + 1) * HOUR - (edge - now))
                # ... and the fresh forecast has settled (policy/ahead.py).
                for crossed in (math.floor(edge / HOUR), math.floor(edge / HOUR) + 1):
                    consider(crossed * HOUR + FORECAST_SETTLE_SECONDS - (edge - now))
            # The day's block starts going back to Kubernetes (policy/blocks.py); its
            # window's edges are hours' edges, considered above.
            block = block_now(summary, spec, now)
            if block is not None:
                consider(block.returns_at)
        for head_since in self.state.slurm_head_since.values():
            consider(head_since + SLURM_HEAD_WAIT_BOUND_SECONDS)
        for node in self.state.nodes.values():
            if node.last_move_at is not None:
                consider(node.last_move_at + spec.dwell_seconds)
            transition = node.transition
            if transition is not None:
                if transition.direction == "lend":
                    consider(transition.started_at + spec.drain_timeout_seconds)
                elif transition.direction == "reclaim":
                    consider(reclaim_grace_started_at(node, transition)
                             + spec.reclaim_grace_seconds)
                consider(now + self.latencies.tick)
            if node.slurm_unhealthy_since is not None:
                consider(node.slurm_unhealthy_since + UNHEALTHY_GRACE_SECONDS)
            for key, outcome in node.outcomes.items():
                if outcome.succeeded:
                    seen = node.slurm_seq if key.startswith(wk.OWNER_SLURM) else node.k8s_seq
                    if seen < outcome.seq:
                        consider(outcome.at + OBSERVATION_CATCHUP_SECONDS)
                elif outcome.retryable:
                    consider(outcome.at + retry_backoff(outcome.attempt))
                else:
                    consider(outcome.at + REFUSED_RETRY_SECONDS)
        return None if math.isinf(best) else best

    # -------------------------------------------------------------- actions

    def _dispatch(self, t: float) -> None:
        latencies = self.latencies
        for action in self.state.pending_actions():
            if action.action_id in self.dispatched:
                continue
            self.dispatched.add(action.action_id)
            delay = latencies.slurm_action if action.side == wk.OWNER_SLURM else \
                latencies.k8s_action
            if action.verb in ("unlock", "resume"):
                delay += latencies.move_cost
            self.world.push(t + delay, ACTION,
                            lambda at, action=action: self._execute(action, at))

    def _execute(self, action: OpenAction, t: float) -> None:
        world = self.world
        node = self.by_name[action.node]
        args = {label.key: label.value for label in action.args}
        self.dispatched.discard(action.action_id)
        stale = stale_action(action, self.state.nodes.get(action.node))
        if stale is not None:  # its transition ended meanwhile: closed, never run
            self._append(ActionFailed(
                action_id=action.action_id, transition_id=action.transition_id,
                side=action.side, verb=action.verb, node=action.node,
                attempt=action.attempt, error=stale), action.node, t)
            self.timers_dirty = True
            return
        self.stats.actions[action.verb] += 1
        error, retryable, changed = carry_out(world, node, action, args, t,
                                              self.latencies.pod_termination)
        if action.verb == "warn":  # sunkd saw a job and a pod on one node: never expected
            self.stats.problems.append(f"{t:.0f}: {node.name}: Warning {args.get('message')}")
        outcome: ActionFailed | ActionSucceeded
        if error:
            self.stats.failed_actions += 1
            outcome = ActionFailed(
                action_id=action.action_id, transition_id=action.transition_id,
                side=action.side, verb=action.verb, node=action.node, attempt=action.attempt,
                error=error, retryable=retryable)
        else:
            outcome = ActionSucceeded(
                action_id=action.action_id, transition_id=action.transition_id,
                side=action.side, verb=action.verb, node=action.node, attempt=action.attempt,
                changed=changed)
        self._append(outcome, action.node, t)
        self.timers_dirty = True
        world.touch(node)
