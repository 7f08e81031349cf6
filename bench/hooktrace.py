"""Where a hook-driven reaction's time goes: in-process timestamps for `bench/hooks.py --trace`.

The benchmark's figure is one number (Slurm's moment -> `action.succeeded`); to cut it one
must know its parts. This wraps, for the benchmark's process only, the steps a reaction
passes through and records the wall time of each: the hook's HTTP request arriving, the
append carrying the `slurm.hook` record (its start is when the targeted slurmrestd read
returned, its end the commit), the fold of that seq, the decide that acted on it, the
append of the decisions, their fold, the executor's run of the action. `steps` lines
them up for one reaction, each step the first of its kind after the previous one.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

Record = tuple[float, str, Any]

STEPS = ("prolog", "hook", "sent", "received", "read", "hook_committed", "folded", "decide",
         "decided", "decision_committed", "decision_folded", "execute", "executed", "done")
LABELS = {
    "prolog": "PrologSlurmctld/EpilogSlurmctld starts (wrapper script)",
    "hook": "hook's interpreter up, site script ran (the benchmark's moment)",
    "sent": "hook sends its POST",
    "received": "sunkd's handler has the request",
    "read": "targeted slurmrestd read returned (hook append starts)",
    "hook_committed": "log append of slurm.hook (+changes) committed",
    "folded": "fold of it done",
    "decide": "decide starts (first decide with decisions after the fold)",
    "decided": "decide returns",
    "decision_committed": "append of the decisions committed",
    "decision_folded": "fold of the decisions done",
    "execute": "executor starts the action",
    "executed": "executor done (Kubernetes PATCH / Slurm update returned)",
    "done": "action.succeeded recorded_at",
}


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
        from sunkd.api.hooks import HookEndpoint
        from sunkd.runtime import reconciler as reconciler_module
        from sunkd.runtime.executor import ActuatorExecutor
        from sunkd.store.eventlog import EventLog

        trace = self

        def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            setattr(owner, name, make(original))
            self._undo.append(lambda: setattr(owner, name, original))

        def handle(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(endpoint: Any, request: Any) -> Any:
                trace.note("received")
                return await original(endpoint, request)
            return wrapper

        def append(original: Any) -> Any:
            @functools.wraps(original)
            async def wrapper(log: Any, batch: Sequence[Any], epoch: int) -> Any:
                kinds = {item.kind for item in batch}
                trace.sent.extend(item.payload.sent_at for item in batch
                                  if item.kind == "slurm.hook" and item.payload.sent_at)
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

        from sunkd.slurm.source import SlurmSource
        wrap(SlurmSource, "observe_nodes", observe("observe"))
        wrap(SlurmSource, "poll_once", observe("poll"))
        wrap(HookEndpoint, "handle", handle)
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
        read = first(received[0], lambda r: r[1] == "append" and "slurm.hook" in r[2])
        committed = first(received[0], lambda r: r[1] == "appended" and "slurm.hook" in r[2][0])
        if read is None or committed is None:
            return None
        at["read"], at["hook_committed"] = read[0], committed[0]
        seq = committed[2][1]
        folded = first(committed[0], lambda r: r[1] == "fold" and r[2] >= seq)
        if folded is None:
            return None
        at["folded"] = folded[0]
        decided = first(folded[0], lambda r: r[1] == "decided" and r[2] > 0)
        if decided is None:
            return None
        decide = max((r for r in records if r[1] == "decide" and r[0] <= decided[0]),
                     key=lambda r: r[0])
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
