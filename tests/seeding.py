"""A seeded history for the read-model, audit, Grafana, API and status-page tests.

Events go through the real `EventLog.append` (COPY on PostgreSQL, the SQLite insert),
only the clock is ours: `ClockedLog` stamps `recorded_at` from `clock` instead of the
database's clock, so every test can state exact expected durations.

The scenario (`seed_pool_history`, times relative to `start` = T0), pool default/gpu:
- T0: sources fresh; leader sunkd-a (epoch 1); n1..n5 observed in Slurm (IDLE, gpu)
  and Kubernetes (k-n1..k-n5, label sunkd.io/pool=gpu); `other-1` only in Kubernetes.
- T0+60s: n1..n5 adopted for Slurm (adopt-nX started + completed).
- T0+1h: lend n1 (t-lend-1, "kubernetes demand: 2 pending pods"); drain a-1 requested,
  succeeded 2 s later; completed T0+1h10m.
- T0+1h: lend n2 (t-lend-2); completed T0+1h20m; T0+2h30m reclaim n2 (t-reclaim-2,
  "slurm demand: 3 pending nodes"), resume a-6 requested T0+2h40m, succeeded +4 s;
  completed T0+2h45m.
- T0+1h30m: lend n4 (t-lend-4), completed T0+1h40m; T0+3h50m k-n4 NotReady (HELD).
- T0+2h: lend n3 (t-lend-3), drain a-4 requested, never finishes; aborted T0+2h30m
  "Slurm drain not finished within drain_timeout (1800s)"; T0+3h lend n3 again
  (t-lend-3b), still open (TO_K8S).
- T0+3h: lend n5 (t-lend-5): drain a-2 fails at +1 s (retryable), a-3 succeeds at +3 s
  (requested +2 s); completed T0+3h25m.
- T0+3h55m: the last event (a pin of n2 to slurm by alice).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    Event,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    OperatorPinned,
    Payload,
    SlurmNodeObserved,
    SourceHealth,
    Taint,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.store.eventlog import EventLog

POOL = "default/gpu"
POOL_LABEL = Label("sunkd.io/pool", "gpu")
WORKLOAD_LABEL = Label("app", "serverless")
NODES = ("n1", "n2", "n3", "n4", "n5")
T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
DRAIN_TIMEOUT_REASON = "Slurm drain not finished within drain_timeout (1800s)"


class ClockedLog(EventLog):
    """An EventLog whose appends are stamped with `clock` (tests only)."""

    clock: datetime = T0

    async def _lock_for_append(self, connection: Any) -> tuple[int, int, datetime]:
        epoch, last_seq, _now = await super()._lock_for_append(connection)
        return epoch, last_seq, self.clock

    async def _db_now(self, connection: Any) -> datetime:
        return self.clock


async def open_clocked(url: str, start: datetime = T0) -> ClockedLog:
    log = await ClockedLog.open(url, migrate=True)
    assert isinstance(log, ClockedLog)
    log.clock = start
    return log


def _k8s(name: str, *, ready: bool = True, pool: bool = True, tainted: bool = True
         ) -> K8sNodeObserved:
    return K8sNodeObserved(
        node=f"k-{name}" if pool else name, slurm_node=name if pool else "", ready=ready,
        labels=(POOL_LABEL,) if pool else (),
        taints=(Taint("sunkd.io/owner", "NoSchedule", "slurm"),) if tainted else (),
        cpu_millis=64000, memory_bytes=256 << 30, gpus=8)


def _tx(kind: type[TransitionStarted | TransitionCompleted | TransitionAborted], tid: str,
        node: str, src: str, dst: str, reason: str) -> TransitionStarted | TransitionCompleted \
        | TransitionAborted:
    return kind(transition_id=tid, node=node, pool=POOL, from_owner=src, to_owner=dst,
                reason=reason)


async def seed_pool_history(log: ClockedLog, start: datetime = T0) -> int:
    """Append the scenario above; returns the leader epoch used."""
    log.clock = start
    lease = await log.acquire("sunkd-a")
    assert lease is not None
    epoch = lease.epoch

    async def at(offset: timedelta, *items: tuple[str, Payload]) -> None:
        log.clock = start + offset
        await log.append([Event(subject, payload) for subject, payload in items], epoch)

    def m(minutes: float, seconds: float = 0) -> timedelta:
        return timedelta(minutes=minutes, seconds=seconds)

    await at(m(0),
             ("slurm", SourceHealth(source="slurm", status="fresh")),
             ("kubernetes", SourceHealth(source="kubernetes", status="fresh")),
             (POOL, K8sNodesetObserved(pool=POOL, generation=1, node_selector=(POOL_LABEL,),
                                       partitions=("gpu",),
                                       workload_selector=(WORKLOAD_LABEL,))),
             *[(n, SlurmNodeObserved(node=n, state="IDLE", partitions=("gpu",), cpus=64))
               for n in NODES],
             *[(f"k-{n}", _k8s(n)) for n in NODES],
             ("other-1", _k8s("other-1", pool=False, tainted=False)),
             # The source reports every Node's pods with the Node (none here).
             *[(f"k-{n}", K8sWorkloadObserved(node=f"k-{n}")) for n in NODES],
             ("other-1", K8sWorkloadObserved(node="other-1")))
    for n in NODES:
        await at(m(1), (n, _tx(TransitionStarted, f"adopt-{n}", n, "none", "slurm",
                               "adopt: first seen IDLE in Slurm; nodes start Slurm-owned")),
                 (n, _tx(TransitionCompleted, f"adopt-{n}", n, "none", "slurm",
                         "adopted: usable in Slurm and tainted")))
    lend_why = "kubernetes demand: 2 pending pods"
    await at(m(60), ("n1", _tx(TransitionStarted, "t-lend-1", "n1", "slurm", "kubernetes",
                               lend_why)),
             ("n1", ActionRequested(action_id="a-1", transition_id="t-lend-1", side="slurm",
                                    verb="drain", node="n1", reason="lend")),
             ("n2", _tx(TransitionStarted, "t-lend-2", "n2", "slurm", "kubernetes", lend_why)))
    await at(m(60, 2), ("n1", ActionSucceeded(action_id="a-1", transition_id="t-lend-1",
                                              side="slurm", verb="drain", node="n1")))
    drained = "drained in Slurm and untainted"
    await at(m(70), ("n1", _tx(TransitionCompleted, "t-lend-1", "n1", "slurm", "kubernetes",
                               drained)))
    await at(m(80), ("n2", _tx(TransitionCompleted, "t-lend-2", "n2", "slurm", "kubernetes",
                               drained)))
    await at(m(90), ("n4", _tx(TransitionStarted, "t-lend-4", "n4", "slurm", "kubernetes",
                               lend_why)))
    await at(m(100), ("n4", _tx(TransitionCompleted, "t-lend-4", "n4", "slurm", "kubernetes",
                                drained)))
    await at(m(120), ("n3", _tx(TransitionStarted, "t-lend-3", "n3", "slurm", "kubernetes",
                                lend_why)),
             ("n3", ActionRequested(action_id="a-4", transition_id="t-lend-3", side="slurm",
                                    verb="drain", node="n3", reason="lend")))
    await at(m(150), ("n3", _tx(TransitionAborted, "t-lend-3", "n3", "slurm", "kubernetes",
                                DRAIN_TIMEOUT_REASON)),
             ("n2", _tx(TransitionStarted, "t-reclaim-2", "n2", "kubernetes", "slurm",
                        "slurm demand: 3 pending nodes")))
    await at(m(160), ("n2", ActionRequested(action_id="a-6", transition_id="t-reclaim-2",
                                            side="slurm", verb="resume", node="n2",
                                            reason="reclaim")))
    await at(m(160, 4), ("n2", ActionSucceeded(action_id="a-6", transition_id="t-reclaim-2",
                                               side="slurm", verb="resume", node="n2")))
    await at(m(165), ("n2", _tx(TransitionCompleted, "t-reclaim-2", "n2", "kubernetes", "slurm",
                                "resumed in Slurm and tainted")))
    await at(m(180), ("n3", _tx(TransitionStarted, "t-lend-3b", "n3", "slurm", "kubernetes",
                                lend_why)),
             ("n5", _tx(TransitionStarted, "t-lend-5", "n5", "slurm", "kubernetes", lend_why)),
             ("n5", ActionRequested(action_id="a-2", transition_id="t-lend-5", side="slurm",
                                    verb="drain", node="n5", reason="lend")))
    await at(m(180, 1), ("n5", ActionFailed(action_id="a-2", transition_id="t-lend-5",
                                            side="slurm", verb="drain", node="n5",
                                            error="slurmrestd: HTTP 500", retryable=True)))
    await at(m(180, 2), ("n5", ActionRequested(action_id="a-3", transition_id="t-lend-5",
                                               side="slurm", verb="drain", node="n5",
                                               attempt=2, reason="lend")))
    await at(m(180, 5), ("n5", ActionSucceeded(action_id="a-3", transition_id="t-lend-5",
                                               side="slurm", verb="drain", node="n5",
                                               attempt=2)))
    await at(m(205), ("n5", _tx(TransitionCompleted, "t-lend-5", "n5", "slurm", "kubernetes",
                                drained)))
    await at(m(230), ("k-n4", _k8s("n4", ready=False, tainted=False)))
    await at(m(235), ("n2", OperatorPinned(node="n2", to="slurm", who="alice",
                                           why="maintenance window on the k8s side")))
    return epoch


async def all_events(log: EventLog) -> list[Any]:
    events: list[Any] = []
    position = 0
    while True:
        batch = await log.read(position, 1000)
        if not batch:
            return events
        events.extend(batch)
        position = batch[-1].seq
