"""Test plumbing for the domain: an in-memory event log and a tiny simulated world.

`Log` stamps payloads with seq and recorded_at like the real event log. `World` is a
deliberately small model of one shared pool (Slurm node states, jobs, drains;
Kubernetes readiness, cordons, the owner taint, pool pods) that executes the actions
`decide` requests the way the actuators promise to (idempotent, refusing foreign
drains and cordons) and reports observations only when they change, like the sources.
`Simulation` closes the loop: fold -> decide -> append -> execute -> observe.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Label,
    OperatorPinned,
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
from sunkd.domain.ownership import is_ours
from sunkd.domain.policy import Decision, PoolSpec, decide, decision_to_event, stale_action
from sunkd.domain.state import EMPTY, ClusterState, OpenAction

POOL = "default/gpu"
PARTITION = "gpu"
POOL_LABEL = Label("sunkd.io/pool", "gpu")


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class Log:
    """An append-only list of RecordedEvents with gap-free seq.

    Like the Kubernetes source, which reports every Node's pods with the Node, a Node's
    first observation is followed by an (empty) pod report unless the test reports its
    pods itself; `auto_pods = False` leaves a Node's pods unknown."""

    def __init__(self) -> None:
        self.events: list[RecordedEvent] = []
        self.auto_pods = True
        self._reported: set[str] = set()

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    def add(self, payload: Payload, now: float, subject: str = "", epoch: int = 1) -> RecordedEvent:
        event = RecordedEvent(
            seq=self.last_seq + 1,
            recorded_at=at(now),
            epoch=epoch,
            subject=subject or getattr(payload, "node", "") or "",
            payload=payload,
        )
        self.events.append(event)
        if isinstance(payload, K8sWorkloadObserved):
            self._reported.add(payload.node)
        elif isinstance(payload, K8sNodeVanished):  # its report goes with it
            self._reported.discard(payload.node)
        elif (isinstance(payload, K8sNodeObserved) and self.auto_pods
              and payload.node not in self._reported):
            self._reported.add(payload.node)
            self.add(K8sWorkloadObserved(node=payload.node, pods=()), now, epoch=epoch)
        return event

    def state(self) -> ClusterState:
        return fold(self.events)


def sunkd_drained(log: Log, node: str, reason: str, now: float) -> None:
    """sunkd's drain of `node` with `reason`, requested and succeeded (the log's proof
    that a later `sunkd:` drain with that text is sunkd's: `sunkd.domain.authorship`)."""
    action_id = f"act-drain-{node}-{log.last_seq + 1}"
    log.add(ActionRequested(action_id=action_id, side="slurm", verb="drain", node=node,
                            reason="drain", args=(Label("reason", reason),)), now)
    log.add(ActionSucceeded(action_id=action_id, side="slurm", verb="drain", node=node), now)


def sunkd_held(log: Log, node: str, now: float) -> None:
    """sunkd's hold taint on `node`, requested and succeeded."""
    action_id = f"act-cordon-{node}-{log.last_seq + 1}"
    log.add(ActionRequested(action_id=action_id, side="kubernetes", verb="cordon", node=node,
                            reason="hold"), now)
    log.add(ActionSucceeded(action_id=action_id, side="kubernetes", verb="cordon", node=node),
            now)


# By default Slurm hears a slurmd that started after every pod of a test world
# (`slurmdgone.heard_since`); a test of a stale contact passes an earlier time.
SLURMD_STARTED = 1e9


def slurm_obs(
    node: str,
    state: str = "IDLE",
    flags: tuple[str, ...] = (),
    reason: str | None = None,
    alloc_cpus: int = 0,
    slurmd_start_time: float | None = SLURMD_STARTED,
) -> SlurmNodeObserved:
    return SlurmNodeObserved(
        node=node,
        state=state,
        flags=tuple(sorted(flags)),
        reason=reason,
        cpus=64,
        alloc_cpus=alloc_cpus,
        partitions=(PARTITION,),
        slurmd_start_time=slurmd_start_time,
    )


def k8s_obs(
    node: str,
    *,
    ready: bool | None = True,
    tainted: bool = True,
    unschedulable: bool = False,
    held_by_sunkd: bool = False,
    hold_tainted: bool = False,
    pin: str | None = None,
) -> K8sNodeObserved:
    taints = [Taint(wk.TAINT_OWNER, "NoSchedule", "slurm")] if tainted else []
    if hold_tainted:
        taints.append(Taint(wk.TAINT_HOLD, "NoSchedule", "slurm"))
    return K8sNodeObserved(
        node=node,
        slurm_node=node,
        ready=ready,
        unschedulable=unschedulable,
        held_by_sunkd=held_by_sunkd,
        taints=tuple(taints),
        labels=(POOL_LABEL,),
        pin=pin,
        cpu_millis=64000,
        memory_bytes=512 * 2**30,
        gpus=8,
    )


def pool_spec(**knobs: object) -> PoolSpec:
    from sunkd.domain.events import OwnershipSpec

    return PoolSpec(
        name=POOL,
        partitions=(PARTITION,),
        node_selector=(POOL_LABEL,),
        ownership=OwnershipSpec(**knobs),  # type: ignore[arg-type]
    )


# ----------------------------------------------------------------------------- world


@dataclass
class SimNode:
    name: str
    slurm_state: str = "IDLE"
    flags: set[str] = field(default_factory=set)
    reason: str | None = None
    job_ends_at: float | None = None
    ready: bool = True
    unschedulable: bool = False
    hold_tainted: bool = False  # sunkd's own hold (the mirror of a Slurm hold)
    tainted: bool = False
    pin: str | None = None
    pods: list[str] = field(default_factory=list)
    reason_time: float | None = None  # when the reason was set (Slurm's reason time)
    # The truth the fold must find from the log alone: whether the drain (reason) and the
    # hold taint on the node now are the very ones sunkd wrote.
    drain_by_sunkd: bool = False
    hold_by_sunkd: bool = False

    def slurm_payload(self) -> SlurmNodeObserved:
        busy = self.job_ends_at is not None
        state = self.slurm_state
        if state in ("IDLE", "ALLOCATED"):
            state = "ALLOCATED" if busy else "IDLE"
        payload = slurm_obs(self.name, state, tuple(self.flags), self.reason,
                            64 if busy else 0)
        if self.reason_time is None:
            return payload
        return replace(payload, reason_time=self.reason_time)

    def k8s_payload(self) -> K8sNodeObserved:
        return k8s_obs(
            self.name,
            ready=self.ready,
            tainted=self.tainted,
            unschedulable=self.unschedulable,
            hold_tainted=self.hold_tainted,
            pin=self.pin,
        )

    def workload_payload(self) -> K8sWorkloadObserved:
        return K8sWorkloadObserved(
            node=self.name,
            pool=POOL,
            pods=tuple(PodRef("serving", pod, "Running") for pod in sorted(self.pods)),
        )

    def slurm_schedulable(self) -> bool:
        return (
            self.slurm_state == "IDLE"
            and "DRAIN" not in self.flags
            and "NOT_RESPONDING" not in self.flags
            and self.job_ends_at is None
        )

    def k8s_schedulable(self) -> bool:
        return (self.ready and not self.unschedulable and not self.tainted
                and not self.hold_tainted and len(self.pods) < 2)


@dataclass
class World:
    """The outside world: what Slurm and Kubernetes would report and do."""

    nodes: dict[str, SimNode]
    pending_jobs: int = 0
    pending_pods: list[str] = field(default_factory=list)
    fresh: dict[str, bool] = field(default_factory=lambda: {"slurm": True, "kubernetes": True})
    pod_counter: int = 0
    warnings: list[tuple[str, str]] = field(default_factory=list)  # Warning Events seen
    now: float = 0.0  # the last `advance`: when actions are carried out
    sunkd_reasons: set[str] = field(default_factory=set)  # every reason sunkd wrote

    @classmethod
    def of(cls, count: int) -> World:
        return cls({f"n{i:03d}": SimNode(f"n{i:03d}") for i in range(count)})

    # the actuators' contract
    def execute(
        self, action: OpenAction, rng: random.Random | None, chaos: bool
    ) -> ActionSucceeded | ActionFailed:
        def failed(error: str, retryable: bool) -> ActionFailed:
            return ActionFailed(
                action_id=action.action_id,
                transition_id=action.transition_id,
                side=action.side,
                verb=action.verb,
                node=action.node,
                attempt=action.attempt,
                error=error,
                retryable=retryable,
            )

        if not self.fresh[action.side]:
            return failed("timeout", True)
        if chaos and rng is not None and rng.random() < 0.1:
            return failed("injected failure", rng.random() < 0.7)
        node = self.nodes[action.node]
        args = {label.key: label.value for label in action.args}
        changed = True
        if action.verb == "drain":
            foreign = bool(node.reason) and not is_ours(node.reason)
            live = "DRAIN" in node.flags or node.slurm_state == "DOWN" or "FAIL" in node.flags
            if foreign and live:
                return failed("refused: foreign drain", False)
            changed = "DRAIN" not in node.flags or node.reason != args["reason"]
            if changed:  # Slurm keeps the reason time when the same reason is set again
                node.reason_time = self.now
            node.flags.add("DRAIN")
            node.reason = args["reason"]
            node.drain_by_sunkd = True
            self.sunkd_reasons.add(args["reason"])
        elif action.verb == "resume":  # UNDRAIN: clears DRAIN only (DOWN, FAIL stay)
            if "DRAIN" not in node.flags:
                changed = False
            elif not is_ours(node.reason):
                return failed("refused: foreign drain", False)
            elif args.get("expect_reason") and args["expect_reason"] != node.reason:
                return failed("refused: reason changed since the decision", False)
            elif (args.get("expect_reason_time") and node.reason_time is not None
                  and abs(float(args["expect_reason_time"]) - node.reason_time) > 1.0):
                return failed("refused: reason set again since the decision", False)
            else:
                node.flags.discard("DRAIN")
                node.reason, node.reason_time, node.drain_by_sunkd = None, None, False
        elif action.verb == "warn":
            self.warnings.append((action.node, args.get("message", "")))
        elif action.verb == "lock":
            changed = not node.tainted
            node.tainted = True
        elif action.verb == "unlock":
            changed = node.tainted
            node.tainted = False
        elif action.verb == "cordon":  # sunkd's hold taint; spec.unschedulable is never touched
            changed = not node.hold_tainted
            node.hold_tainted = node.hold_by_sunkd = True
        elif action.verb == "uncordon":
            changed = node.hold_tainted
            node.hold_tainted = node.hold_by_sunkd = False
        elif action.verb == "evict":
            if chaos and rng is not None and rng.random() < 0.3:
                return failed("429: disruption budget", True)
            evict = {a.value.split("/", 1)[1] for a in action.args if a.key == "pod"}
            node.pods = [pod for pod in node.pods if pod not in evict]
        else:
            return failed(f"unknown verb {action.verb}", False)
        return ActionSucceeded(
            action_id=action.action_id,
            transition_id=action.transition_id,
            side=action.side,
            verb=action.verb,
            node=action.node,
            attempt=action.attempt,
            changed=changed,
        )

    def advance(self, now: float, rng: random.Random) -> None:
        """Jobs end, new jobs and pods get scheduled where the schedulers allow."""
        self.now = now
        for node in self.nodes.values():
            if node.job_ends_at is not None and now >= node.job_ends_at:
                node.job_ends_at = None
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            if self.pending_jobs > 0 and node.slurm_schedulable():
                node.job_ends_at = now + rng.uniform(10, 400)
                self.pending_jobs -= 1
            while self.pending_pods and node.k8s_schedulable():
                node.pods.append(self.pending_pods.pop(0))
        for node in self.nodes.values():
            if node.pods and rng.random() < 0.05:
                node.pods.pop(0)

    def demand(self) -> list[Payload]:
        return [
            SlurmDemandObserved(
                partition=PARTITION, pending_jobs=self.pending_jobs,
                pending_nodes=self.pending_jobs,
            ),
            K8sDemandObserved(
                pool=POOL,
                pending=tuple(PendingPod("serving", pod) for pod in self.pending_pods),
            ),
        ]


class Simulation:
    """fold -> decide -> append -> execute -> observe, with change-only observations."""

    def __init__(self, world: World, pools: list[PoolSpec], start: float = 1_000_000.0) -> None:
        self.world = world
        self.pools = pools
        self.now = start
        self.log = Log()
        self.state = EMPTY
        self.rounds: list[tuple[ClusterState, float, list[Decision]]] = []
        self.last_payloads: dict[tuple[str, str], Payload] = {}
        self.health: dict[str, bool] = {}

    def _emit(self, key: tuple[str, str], payload: Payload) -> None:
        if self.last_payloads.get(key) != payload:
            self.last_payloads[key] = payload
            self.log.add(payload, self.now)

    def observe(self) -> None:
        for source, fresh in self.world.fresh.items():
            if self.health.get(source) != fresh:
                self.health[source] = fresh
                status = "fresh" if fresh else "stale"
                self.log.add(SourceHealth(source=source, status=status, cause=None), self.now,
                             subject=source)
        for node in self.world.nodes.values():
            if self.world.fresh["slurm"]:
                self._emit((node.name, "slurm"), node.slurm_payload())
            if self.world.fresh["kubernetes"]:
                self._emit((node.name, "k8s"), node.k8s_payload())
                self._emit((node.name, "workload"), node.workload_payload())
        for payload in self.world.demand():
            if isinstance(payload, SlurmDemandObserved) and not self.world.fresh["slurm"]:
                continue
            if isinstance(payload, K8sDemandObserved) and not self.world.fresh["kubernetes"]:
                continue
            self._emit((payload.kind, ""), payload)

    def pin(self, node: str, to: str) -> None:
        self.log.add(OperatorPinned(node=node, to=to, who="op", why="test"), self.now)

    def refold(self) -> ClusterState:
        new = [e for e in self.log.events if e.seq > self.state.last_seq]
        self.state = fold(new, self.state)
        return self.state

    def step(self, rng: random.Random, chaos: bool = False, dt: float = 10.0) -> list[Decision]:
        self.now += dt
        self.world.advance(self.now, rng)
        self.observe()
        state = self.refold()
        decisions = decide(state, self.pools, self.now)
        self.rounds.append((state, self.now, decisions))
        for decision in decisions:
            event = decision_to_event(decision)
            self.log.add(event.payload, self.now, event.subject)
        state = self.refold()
        for action in state.pending_actions():
            if chaos and rng.random() < 0.3:
                continue  # the outbox is slow: leave it open for a while
            stale = stale_action(action, state.nodes.get(action.node))
            if stale is not None:  # closed, never run, as the engine does
                self.log.add(ActionFailed(
                    action_id=action.action_id, transition_id=action.transition_id,
                    side=action.side, verb=action.verb, node=action.node,
                    attempt=action.attempt, error=stale), self.now)
                continue
            self.log.add(self.world.execute(action, rng, chaos), self.now)
        self.observe()
        self.refold()
        return decisions
