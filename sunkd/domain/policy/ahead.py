"""Headroom ahead of the peak: lend before the pods arrive, from the pool's own forecast.

sunkd otherwise reacts to pending pods after they are pending, and a lend takes a job's
remaining run time (the drain waits for it). With `forecast` on, a pool whose demand
summary (domain/forecast.py, folded from its own log) predicts more nodes wanted within
the lead time than Kubernetes holds lends the difference now, so the drains end by
the time the pods come; and Slurm's demand takes back only what its next job lacks
and what the forecast does not want within the horizon (the recent-peak hold: a node
given back for a peak that recurs within it would be lent straight back). The lead
time is what this pool's lends took (their drains), capped by
`forecast_horizon_seconds`.

Bounds, all of them the ones demand already obeys: never for an hour whose tracked
error is above `forecast.ERROR_LIMIT` or that has not been seen (cold start: today's
behaviour); never the nodes Slurm's next job needs; under `prefer: Slurm` never beyond
Kubernetes' fair share; `max_kubernetes`, `min_slurm`, pins, holds, dwell and
`max_in_flight` apply as to every lend (`pool._moves_wanted`, `lend.can_lend`), and a
lend still hands a node over only once Slurm reports it drained: the forecast only
starts a drain earlier, it never skips a check. And a lend ahead never picks a node whose
jobs end after the peak's hour (or the horizon, or whose end is unknown): that drain
would not be done when the pods come (`drained_by`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sunkd.domain import forecast
from sunkd.domain.policy.fairness import fair_share, holdings, slurm_claim
from sunkd.domain.policy.model import PREFER_KUBERNETES, PoolSpec
from sunkd.domain.state import ClusterState, NodeState

# How long a fresh forecast settles before it lends: the window [now, now + lead] reads
# other hours once either end crosses an hour's edge, and that is when the hour that
# ended is folded into the profile while the new hour's first readings (its pods, bound
# or pending) are still arriving from the sources. Lending on the edge itself would act
# on a forecast the next readings change; pods pending meanwhile still lend at once.
FORECAST_SETTLE_SECONDS = 5.0


def settling(now: float, lead: float) -> bool:
    """Either end of the forecast's window crossed an hour's edge less than
    `FORECAST_SETTLE_SECONDS` ago."""
    return any(edge % forecast.HOUR < FORECAST_SETTLE_SECONDS for edge in (now, now + lead))


# The longest window the forecast reads (a longer horizon reads this far: the config
# file bounds the knob to 30 days, a Nodeset's value is not bounded there).
MAX_HORIZON_SECONDS = 30 * 86400.0


@dataclass(frozen=True, slots=True)
class Ahead:
    """What the forecast asks of a pool now."""

    wanted: int  # nodes the forecast wants Kubernetes to hold within the lead time
    target: int  # lends it justifies (comparable with `PoolDemand.lend_target`)
    why: str  # for the decision log and `sunkd status`
    by: float  # a node lent for it must be drained by then (its jobs ended: `drained_by`)


def lead_seconds(summary: forecast.DemandSummary, horizon: float) -> float:
    return min(summary.lead if summary.leads_seen else 0.0, max(horizon, 0.0))


def forecast_wanted(state: ClusterState, pool: PoolSpec, now: float, *,
                    horizon: bool = False) -> tuple[forecast.Prediction, float] | None:
    """The largest prediction from now to now + lead time (`horizon`: to now +
    `forecast_horizon_seconds`), and the lead (None: the forecast is off, cold, or its
    error too high in every hour of the window)."""
    spec = pool.ownership
    summary = state.demand_history.get(pool.name)
    if not spec.forecast or summary is None:
        return None
    summary = forecast.close_hours(summary, now)  # hours no event has closed yet
    lead = lead_seconds(summary, spec.forecast_horizon_seconds)
    span = max(spec.forecast_horizon_seconds, 0.0) if horizon else lead
    if not 0.0 <= span:  # NaN: no forecast (and a loop that ends)
        return None
    span = min(span, MAX_HORIZON_SECONDS)
    best: forecast.Prediction | None = None
    at = now
    while True:
        found = forecast.predict(summary, at, spec.headroom_quantile)
        if found is not None and (best is None or found.wanted > best.wanted):
            best = found
        if at >= now + span:
            break
        at = min(at + forecast.HOUR, now + span)
    return None if best is None else (best, lead)


def ahead(state: ClusterState, pool: PoolSpec, members: Sequence[NodeState],
          now: float) -> Ahead | None:
    """Lends the forecast justifies now, within the bounds above (None: none)."""
    found = forecast_wanted(state, pool, now)
    if found is None:
        return None
    prediction, lead = found
    # Lends in flight count as Slurm's here, as for the starvation bound: the target
    # includes them (a lend the forecast started must not be surplus the round after).
    k8s, slurm = holdings(members, moving_counts_for="from")
    room = slurm - slurm_claim(state, pool)
    if pool.ownership.prefer != PREFER_KUBERNETES:
        room = min(room, fair_share(len(members)) - k8s)
    target = min(prediction.wanted - k8s, room)
    if target <= 0 and prediction.wanted < k8s:
        return None
    if settling(now, lead):
        target = 0  # no lend yet; what the forecast keeps from Slurm it keeps
    peak = datetime.fromtimestamp(prediction.at, tz=UTC).strftime("%H:%M")
    why = (f"lent ahead of the forecast peak at {peak} UTC: {prediction.wanted} node(s) "
           f"wanted, {k8s} held (lead {lead / 60:.0f} min, error {prediction.error:.2f})")
    return Ahead(prediction.wanted, max(target, 0), why, drained_by(prediction, pool, now))


def drained_by(prediction: forecast.Prediction, pool: PoolSpec, now: float) -> float:
    """When a node lent ahead must be drained to serve the peak: the end of the peak's
    hour, and never later than the horizon. A drain waits for the node's jobs to end
    (Slurm's DRAIN lets running jobs finish: the node is DRAINED only once they have),
    so a node whose jobs end later would be drained for nothing at the peak and cost
    Slurm that node the whole time: the lend ahead skips it (`pool._start_demand_lends`)."""
    return min(prediction.at + forecast.HOUR,
               now + max(pool.ownership.forecast_horizon_seconds, 0.0))


def forecast_surplus(state: ClusterState, pool: PoolSpec, members: Sequence[NodeState],
                     now: float) -> int | None:
    """The recent-peak hold: how many of the nodes Kubernetes holds (or is being lent)
    the forecast does not want back within `forecast_horizon_seconds` (None: no
    forecast). Slurm's demand takes back only those, beyond what its next job lacks:
    a node given back for a peak that recurs within the horizon would be lent again
    for it (two moves, a drain's wait for a job to end, and a reclaim's eviction, for
    a few hours of batch work)."""
    found = forecast_wanted(state, pool, now, horizon=True)
    if found is None:
        return None
    k8s, _slurm = holdings(members, moving_counts_for="to")
    return max(k8s - found[0].wanted, 0)
