"""Where a hook-driven reaction's time goes: in-process timestamps for `bench/hooks.py --trace`.

The benchmark's figure is one number (Slurm's moment -> `action.succeeded`); to cut it one
must know its parts. This wraps, for the benchmark's process only, the steps a reaction
passes through and records the wall time of each: the hook reaching the daemon's
receiver, slurmrestd's `GET /nodes` answers, each log append (its start, the write lock
taken, the commit), the folds, the decides, the executor's runs of actions. `steps`
lines them up for one reaction, working back from the first decide that decided
something: the observations committed last before it (the read that answered them, the
append's lock and commit), their fold, then forwards to the decisions' commit and fold
and the action that ends the reaction. With SUNKD_BENCH_DUMP=1 the raw records of each
reaction are printed too.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

Record = tuple[float, str, Any]

STEPS = ("prolog", "hook", "sent", "received", "read", "append", "locked", "committed",
         "folded", "decide", "decided", "decision_committed", "decision_folded", "execute",
         "executed", "done")
LABELS = {
    "prolog": "PrologSlurmctld/EpilogSlurmctld starts (wrapper script)",
    "hook": "site script ran (the benchmark's moment; chained: in the hook, interpreter up)",
    "sent": "hook sends its POST (separate lines: after slurmctld started it)",
    "received": "sunkd's receiver has the hook",
    "read": "slurmrestd answered the read that showed the change (GET /nodes)",
    "append": "its append starts (diff done)",
    "locked": "append holds the write lock (gate + BEGIN IMMEDIATE)",
    "committed": "append of the observations committed",
    "folded": "fold of them done (read back from the log)",
    "decide": "decide starts (the first decide with decisions after the fold)",
    "decided": "decide returns",
    "decision_committed": "append of the decisions committed",
    "decision_folded": "fold of the decisions done",
    "execute": "executor starts the action",
    "executed": "executor done (Kubernetes PATCH / Slurm update returned)",
    "done": "action.succeeded recorded_at",
}
OBSERVED = frozenset({"slurm.node.observed", "slurm.demand.observed"})


class Trace:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.sent: list[float] = []  # the hooks' own sent_at
        self.starts: list[dict[str, float]] = []  # steps of each start -> taint
        self.ends: list[dict[str, float]] = []  # ... of each end -> lend step
        self._undo: list[Callable[[], None]] = []

    def note(self, label: str, info: Any = None) -> None:
        self.records.append((time.time(), label, info))

    def install(self) -> None:
        from sunkd.runtime import reconciler as reconciler_module
        from sunkd.runtime.executor import ActuatorExecutor
        from sunkd.store.eventlog import EventLog

        trace = self

        def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            setattr(owner, name, make(original))
            self._undo.append(lambda: setattr(owner, name, original))

        def receive(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(receiver: Any, hook: Any, **kwargs: Any) -> Any:
                trace.note("received", hook.event)
                if hook.sent_at:
                    trace.sent.append(hook.sent_at)
                return await original(receiver, hook, **kwargs)
            return wrapper

        def nodes_read(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(client: Any, *args: Any, **kwargs: Any) -> Any:
                nodes = await original(client, *args, **kwargs)
                trace.note("nodes_read")
                return nodes
            return wrapper

        def locked(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(log: Any, connection: Any) -> Any:
                result = await original(log, connection)
                trace.note("locked")
                return result
            return wrapper

        def append(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(log: Any, batch: Sequence[Any], epoch: int) -> Any:
                kinds = {item.kind for item in batch}
                trace.note("append", kinds)
                seqs = await original(log, batch, epoch)
                trace.note("appended", (kinds, seqs[-1] if seqs else 0))
                return seqs
            return wrapper

        def apply(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(engine: Any, batch: Any) -> Any:
                result = await original(engine, batch)
                trace.note("fold", batch[-1].seq if batch else 0)
                return result
            return wrapper

        def decide(original: Any) -> Any:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                trace.note("decide")
                decisions = original(*args, **kwargs)
                trace.note("decided", len(decisions))
                return decisions
            return wrapper

        def execute(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(executor: Any, action: Any, node: Any) -> Any:
                trace.note("execute", (action.verb, action.node))
                try:
                    return await original(executor, action, node)
                finally:
                    trace.note("executed", (action.verb, action.node))
            return wrapper

        def observe(label: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                @functools.wraps(original)
                async def wrapper(source: Any, *args: Any, **kwargs: Any) -> Any:
                    trace.note(label, args[0] if args else None)
                    events = await original(source, *args, **kwargs)
                    trace.note(label + "ed", [_summary(e) for e in events])
                    return events
                return wrapper
            return make

        from sunkd.runtime.hooks import HookReceiver
        from sunkd.slurm.client import SlurmRestClient
        from sunkd.slurm.source import SlurmSource
        wrap(SlurmSource, "observe_nodes", observe("observe"))
        wrap(SlurmSource, "poll_once", observe("poll"))
        wrap(HookReceiver, "receive", receive)
        wrap(SlurmRestClient, "get_nodes", nodes_read)
        wrap(EventLog, "_lock_for_append", locked)
        wrap(EventLog, "append", append)
        wrap(reconciler_module.Reconciler, "_apply", apply)
        wrap(reconciler_module, "decide", decide)
        wrap(ActuatorExecutor, "execute", execute)

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def steps(self, prolog: float | None, hook: float, done: float) -> dict[str, float] | None:
        """Wall times of one reaction's steps, or None when they cannot be lined up."""
        at: dict[str, float] = {"hook": hook}
        if prolog is not None:
            at["prolog"] = prolog
        sent = min((t for t in self.sent if t >= hook), default=None)
        if sent is not None:
            at["sent"] = sent
        records = [r for r in self.records if hook - 0.01 <= r[0] <= done + 0.01]

        def first(after: float, match: Callable[[Record], bool]) -> Record | None:
            return next((r for r in records if r[0] >= after and match(r)), None)

        received = first(hook, lambda r: r[1] == "received")
        if received is None:
            return None
        at["received"] = received[0]
        decided = first(received[0], lambda r: r[1] == "decided" and r[2] > 0)
        if decided is None:
            return None
        decide = max((r for r in records if r[1] == "decide" and r[0] <= decided[0]),
                     key=lambda r: r[0])

        def last(before: float, match: Callable[[Record], bool]) -> Record | None:
            return max((r for r in records if received[0] <= r[0] <= before and match(r)),
                       key=lambda r: r[0], default=None)

        # What the decision acted on: the last observations committed before it.
        committed = last(decide[0], lambda r: r[1] == "appended" and bool(OBSERVED & r[2][0]))
        if committed is None:
            return None
        begun = last(committed[0], lambda r: r[1] == "append" and r[2] == committed[2][0])
        if begun is None:
            return None
        read = last(begun[0], lambda r: r[1] == "nodes_read")
        if read is not None:
            at["read"] = read[0]
        lock = last(committed[0], lambda r: r[1] == "locked" and r[0] >= begun[0])
        if lock is not None:
            at["locked"] = lock[0]
        at["append"], at["committed"] = begun[0], committed[0]
        seq = committed[2][1]
        folded = first(committed[0], lambda r: r[1] == "fold" and r[2] >= seq)
        if folded is not None and folded[0] <= decide[0]:
            at["folded"] = folded[0]
        at["decide"], at["decided"] = decide[0], decided[0]
        appended = first(decided[0], lambda r: r[1] == "appended"
                         and "action.requested" in r[2][0])
        if appended is None:
            return None
        at["decision_committed"] = appended[0]
        refolded = first(appended[0], lambda r: r[1] == "fold" and r[2] >= appended[2][1])
        if refolded is not None:
            at["decision_folded"] = refolded[0]
        executed = [r for r in records if r[1] == "executed" and r[0] <= done]
        if executed:
            end = executed[-1]
            start = max((r for r in records if r[1] == "execute" and r[2] == end[2]
                         and r[0] <= end[0]), key=lambda r: r[0])
            at["execute"], at["executed"] = start[0], end[0]
        at["done"] = done
        return at


def _summary(event: Any) -> str:
    payload = event.payload
    if event.kind == "slurm.node.observed":
        return (f"{payload.node} {payload.state} {'+'.join(sorted(payload.flags))} "
                f"jobs={payload.jobs} alloc_cpus={payload.alloc_cpus} "
                f"reason={payload.reason!r} last_busy={payload.last_busy}")
    return event.kind


def dump(records: Sequence[Record], since: float, until: float) -> list[str]:
    """The raw records between two moments, ms after `since` (for reading one reaction)."""
    return [f"{(at - since) * 1000:9.1f} {label} {info}" for at, label, info in records
            if since - 0.2 <= at <= until + 0.05]


def table(reactions: Sequence[dict[str, float]]) -> list[dict[str, Any]]:
    """Per step: the median and max of its duration since the step before it (ms)."""
    spans: dict[tuple[str, str], list[float]] = {}
    for reaction in reactions:
        present = [step for step in STEPS if step in reaction]
        for previous, step in itertools.pairwise(present):
            spans.setdefault((previous, step), []).append(
                (reaction[step] - reaction[previous]) * 1000)
    order = {step: index for index, step in enumerate(STEPS)}
    return [{"step": f"{previous} -> {step}", "what": LABELS[step], "n": len(values),
             "median_ms": round(statistics.median(values), 1),
             "max_ms": round(max(values), 1)}
            for (previous, step), values in sorted(spans.items(),
                                                   key=lambda item: order[item[0][1]])]
