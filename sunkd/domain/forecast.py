"""A pool's Kubernetes demand by time of day, learned from the log: bounded and pure.

Diurnal demand is the most predictable thing in a datacenter, and sunkd's own log holds
its history: every `k8s.workload.observed` says which nodes run pool pods, every
`k8s.demand.observed` which pods wait. The fold keeps, per pool, only this summary (never
raw history, so its size does not grow with the log):

- `wanted`: nodes the pool's pods want now (nodes running pool pods, plus the pending
  pods' nodes by their GPU or CPU requests against the largest node seen);
- the current hour's peak of `wanted`;
- per hour of the day (`BUCKETS`), an exponentially weighted mean and variance of the
  hours' peaks (`ALPHA`), and how many peaks it has seen;
- the tracked error, per hour of the day: an exponentially weighted mean of
  |peak - prediction| / prediction, each hour's peak against what the profile said
  before it learned that hour (per hour: quiet nights must not hide a peak hour that
  the profile keeps missing), counted from the hour's first miss (the mean starts at
  that miss, not at zero: cold hours do not dilute it);
- the lead time: an exponentially weighted mean of how long this pool's lends took
  (start to completion: mostly a job's remaining run time, since a drain waits for it).

`predict` reads it at a time `at`: the bucket's mean plus the headroom quantile's share
of its spread (a normal quantile: `NormalDist`), or None while the bucket has seen fewer
than `MIN_SAMPLES` peaks (a cold start changes nothing: today's behaviour) or its error
is above `ERROR_LIMIT`. Everything
is a pure function of the events' recorded times: no clock, deterministic on replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

HOUR = 3600.0
BUCKETS = 24  # hours of the day (UTC)
ALPHA = 0.3  # weight of the newest peak (about the last week counts)
MIN_SAMPLES = 2  # peaks a bucket must have seen before it predicts anything
LEAD_ALPHA = 0.3  # weight of the newest lend's duration in the lead time
# Above this tracked relative error the policy does not lend ahead: a pool whose hours
# miss their profile by a third on average is not predictable enough to drain for
# (a daily square wave learns to < 0.05; hourly random demand stays near 0.45).
ERROR_LIMIT = 0.3


@dataclass(frozen=True, slots=True)
class DemandSummary:
    """One pool's bounded demand history (see the module docstring)."""

    busy: int = 0  # nodes running pool pods (the latest workload reports)
    pending: int = 0  # nodes the pending pool pods need (the latest demand report)
    hour: int = -1  # the current hour (unix seconds // HOUR); -1: nothing seen yet
    peak: int = 0  # the current hour's peak of busy + pending
    means: tuple[float, ...] = (0.0,) * BUCKETS
    variances: tuple[float, ...] = (0.0,) * BUCKETS
    samples: tuple[int, ...] = (0,) * BUCKETS
    errors: tuple[float, ...] = (0.0,) * BUCKETS  # EWMA |peak - mean| / max(mean, 1)
    lead: float = 0.0  # EWMA of the pool's lend durations, seconds
    leads_seen: int = 0
    node_gpus: int = 0  # the largest pool node seen (sizes the pending pods' nodes)
    node_cpu_millis: int = 0

    @property
    def wanted(self) -> int:
        return self.busy + self.pending

    @property
    def error(self) -> float:
        """The mean tracked error over the hours that have one (0.0: none yet)."""
        seen = [e for e, n in zip(self.errors, self.samples, strict=True) if n >= MIN_SAMPLES]
        return sum(seen) / len(seen) if seen else 0.0


def _bucket(hour: int) -> int:
    return hour % BUCKETS


def close_hours(summary: DemandSummary, at: float) -> DemandSummary:
    """The summary with every hour before `at`'s folded into the profile (an hour with
    no event keeps the demand it ended with as its peak)."""
    hour = int(at // HOUR)
    if summary.hour < 0:
        return replace(summary, hour=hour, peak=summary.wanted)
    if hour <= summary.hour:
        return summary
    means, variances = list(summary.means), list(summary.variances)
    samples, errors = list(summary.samples), list(summary.errors)
    peak = summary.peak
    # Hours with no event at all repeat the demand the last one ended with; a gap longer
    # than a day only needs each bucket once (bounded work whatever the gap).
    for closing in range(max(summary.hour, hour - BUCKETS), hour):
        b = _bucket(closing)
        if samples[b] >= 1:
            expected = means[b]
            miss = abs(peak - expected) / max(expected, 1.0)
            # Counted from the first miss: until an hour has missed, its error is that
            # miss itself, not its ALPHA share of the zero it started from (a pool
            # that misses on its second day must not look predictable).
            errors[b] = miss if errors[b] == 0.0 else (1 - ALPHA) * errors[b] + ALPHA * miss
        if samples[b] == 0:
            means[b], variances[b] = float(peak), 0.0
        else:
            delta = peak - means[b]
            means[b] += ALPHA * delta
            variances[b] = (1 - ALPHA) * (variances[b] + ALPHA * delta * delta)
        samples[b] = min(samples[b] + 1, 1_000_000)
        peak = summary.wanted  # the next hours start from where the demand ended
    return replace(summary, hour=hour, peak=summary.wanted, means=tuple(means),
                   variances=tuple(variances), samples=tuple(samples),
                   errors=tuple(errors))


def observe(summary: DemandSummary, at: float, *, busy: int | None = None,
            pending: int | None = None) -> DemandSummary:
    """Fold a new reading of the pool's busy nodes or pending nodes at `at`."""
    summary = close_hours(summary, at)
    new = replace(summary, busy=summary.busy if busy is None else max(busy, 0),
                  pending=summary.pending if pending is None else max(pending, 0))
    return replace(new, peak=max(new.peak, new.wanted))


def observe_node(summary: DemandSummary, gpus: int, cpu_millis: int) -> DemandSummary:
    """Remember the largest pool node seen (what a pending pod's node is sized by)."""
    if gpus <= summary.node_gpus and cpu_millis <= summary.node_cpu_millis:
        return summary
    return replace(summary, node_gpus=max(summary.node_gpus, gpus),
                   node_cpu_millis=max(summary.node_cpu_millis, cpu_millis))


def observe_lend(summary: DemandSummary, seconds: float) -> DemandSummary:
    """Fold a completed lend's duration into the lead time."""
    seconds = max(seconds, 0.0)
    lead = seconds if summary.leads_seen == 0 else \
        (1 - LEAD_ALPHA) * summary.lead + LEAD_ALPHA * seconds
    return replace(summary, lead=lead, leads_seen=min(summary.leads_seen + 1, 1_000_000))


@dataclass(frozen=True, slots=True)
class Prediction:
    at: float  # the time predicted for (start of its hour)
    wanted: int  # nodes wanted then, with the headroom
    mean: float  # the profile's mean for that hour
    error: float  # the hour's tracked relative error


def predict(summary: DemandSummary, at: float, quantile: float) -> Prediction | None:
    """Nodes the pool's pods will want in `at`'s hour, at the headroom `quantile` of the
    hour's peaks (None: that hour has not been seen `MIN_SAMPLES` times, or its error is
    above `ERROR_LIMIT`)."""
    b = _bucket(int(at // HOUR))
    # `not error <= LIMIT`: an error that is not a number is no licence to predict.
    if summary.samples[b] < MIN_SAMPLES or not summary.errors[b] <= ERROR_LIMIT \
            or not math.isfinite(summary.means[b]) or not math.isfinite(summary.variances[b]):
        return None
    mean = summary.means[b]
    spread = math.sqrt(max(summary.variances[b], 0.0))
    q = min(max(quantile, 0.5), 0.999)
    wanted = math.ceil(mean + NormalDist().inv_cdf(q) * spread - 1e-9)
    return Prediction(at=float(int(at // HOUR)) * HOUR, wanted=max(wanted, 0), mean=mean,
                      error=summary.errors[b])


def pending_nodes(gpus: int, cpu_millis: int, node_gpus: int, node_cpu_millis: int,
                  pods: int) -> int:
    """Nodes `pods` pending pods asking for `gpus` GPUs and `cpu_millis` in all need on
    nodes of the given size (one per pod when the size is unknown, never more)."""
    needed = 0
    if gpus > 0 and node_gpus > 0:
        needed = max(needed, math.ceil(gpus / node_gpus))
    if cpu_millis > 0 and node_cpu_millis > 0:
        needed = max(needed, math.ceil(cpu_millis / node_cpu_millis))
    return min(needed or pods, pods)


def to_json(summary: DemandSummary) -> dict[str, object]:
    return {name: (list(value) if isinstance(value, tuple) else value)
            for name in DemandSummary.__slots__
            for value in (getattr(summary, name),)}


def from_json(raw: dict[str, object]) -> DemandSummary:
    """A summary from `to_json`; fields a snapshot lacks keep their cold-start values, and
    per-hour lists of another length, or with a value that is not a finite number, start
    cold (nothing is guessed: Python's JSON reads NaN and Infinity)."""
    fields: dict[str, object] = {}
    for name in DemandSummary.__slots__:
        if name not in raw:
            continue
        value = raw[name]
        if isinstance(value, list):
            if len(value) != BUCKETS:
                continue
            kind = int if name == "samples" else float
            parsed = tuple(kind(v) for v in value)
            if all(math.isfinite(v) for v in parsed):
                fields[name] = parsed
        elif name == "lead":
            lead = float(value)  # type: ignore[arg-type]
            if math.isfinite(lead):
                fields[name] = lead
        else:
            fields[name] = int(value)  # type: ignore[call-overload]
    return DemandSummary(**fields)  # type: ignore[arg-type]
