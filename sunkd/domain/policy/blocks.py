"""Daily blocks behind the forecast: move the trough's nodes once, not one burst at a time.

A pool whose Kubernetes demand swings by tens of nodes a day moves about twice that many
nodes a day when it follows each burst and each of Slurm's jobs node by node (the
forecast's hold either follows the curve or keeps everything: docs/evaluation.md). With
`forecast_block_hours` > 0 (and `forecast` on) the pool plans, from its own seasonal
profile (domain/forecast.py: the per-hour statistics the fold keeps), one block a day:

- the window: the contiguous hours of the day (UTC, wrapping at midnight), at least
  `forecast_block_hours` long, where Kubernetes' forecast demand (each hour's mean plus
  the headroom quantile of its spread) stays furthest below the day's: the block's
  size is the median forecast of the hours outside the window (`Block.level`, the
  day's level: a peak hour or two does not set it) less the largest inside it
  (`Block.keep`), the window chosen to maximise nodes x hours;
- in the window (the trough), Slurm's demand takes back, beyond what its next job lacks,
  every Kubernetes node above the window's forecast (`Block.keep`), and only nodes
  running no pool pod (the block does not evict); pending pods lend only beyond the
  forecast's error bound for those hours (damped: small overshoots wait for Kubernetes'
  own nodes); nothing is lent ahead;
- `lead` before the window ends (the pool's measured lend time, times the rounds
  `max_in_flight` needs for the block's nodes), the block goes back: Kubernetes is lent
  up to the day's level, nodes whose jobs end soonest first, and only nodes drained by
  the end of the hour after the window (as a lend ahead does for its peak's hour); a
  return's lend in flight is kept while the return runs when the room for lends shrinks
  (Slurm's next job heads the queue), never beyond `max_kubernetes`
  (policy/pool.py `_surplus_lends`);
- outside the window (the day), the pool lends up to the day's level when it holds
  less (only nodes drained within the hour), pending pods lend as without blocks, and
  Slurm's demand takes back only what its next job lacks: what Kubernetes holds in the
  day it keeps until the next trough. A node moves about twice a day, not with each
  burst.

No block is planned (the forecast alone acts, as without blocks) while any hour of the
day is unseen (fewer than `forecast.MIN_SAMPLES` peaks) or the window's mean tracked
error is above `forecast.ERROR_LIMIT`; a flat profile plans none (its block would have
no nodes). The peak hours' own errors do not stop a block (a peak whose pods wait out
the starvation bound misses its profile: docs/evaluation.md): their spread raises the
day's level.
Pure: a function of the summary and the time it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from statistics import NormalDist

from sunkd.domain import forecast
from sunkd.domain.events import OwnershipSpec

TROUGH, RETURN, DAY = "trough", "return", "day"
# What a return's lends say (`BlockNow.return_why`): while the window's return runs, such
# a lend in flight is not "demand gone" when the room for lends shrinks.
RETURN_MARK = " back to Kubernetes ahead of the rise at "

# The longest window (hours): a third of the day stays outside the block, so that the
# day's level is the median of at least 8 hours (a window that left out only the peak
# hour or two would be "the trough" of a day that is all peak).
MAX_BLOCK_HOURS = 16


@dataclass(frozen=True, slots=True)
class Block:
    """One day's block, in hours of the day (UTC)."""

    start: int  # first hour of the window (0-23)
    hours: int  # its length
    keep: int  # nodes Kubernetes is forecast to want at most in the window
    level: int  # the median outside it: the day's level (what goes back for the rise)
    error: float  # the window's hours' mean tracked error

    @property
    def nodes(self) -> int:
        return self.level - self.keep

    @property
    def end(self) -> int:
        return (self.start + self.hours) % forecast.BUCKETS

    def label(self) -> str:
        return f"{self.start:02d}:00-{self.end:02d}:00"


_PLANS: dict[tuple[object, ...], Block | None] = {}
_PLANS_MAX = 4096


def profile(summary: forecast.DemandSummary, quantile: float) -> list[int] | None:
    """Each hour's forecast demand at the headroom quantile, whatever its tracked error
    (None: some hour of the day has seen fewer than `forecast.MIN_SAMPLES` peaks)."""
    z = NormalDist().inv_cdf(min(max(quantile, 0.5), 0.999))
    hours: list[int] = []
    for mean, variance, samples in zip(summary.means, summary.variances, summary.samples,
                                       strict=True):
        if samples < forecast.MIN_SAMPLES or not (math.isfinite(mean)
                                                  and math.isfinite(variance)):
            return None
        hours.append(max(math.ceil(mean + z * math.sqrt(max(variance, 0.0)) - 1e-9), 0))
    return hours


def plan_block(summary: forecast.DemandSummary, quantile: float,
               min_hours: float) -> Block | None:
    """The day's best block from the profile (None: blocks off, a cold hour, no window
    predictable enough, or none would lend a node). Deterministic: ties go to the
    earliest start, then the shortest window."""
    if not min_hours > 0:  # 0, negative or NaN: blocks are off
        return None
    key = (summary.means, summary.variances, summary.samples, summary.errors,
           quantile, min_hours)
    if key in _PLANS:
        return _PLANS[key]
    best: Block | None = None
    wanted = profile(summary, quantile)
    if wanted is not None:
        best = _best_window(wanted, summary.errors, max(math.ceil(min_hours - 1e-9), 1))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = best
    return best


def _median(values: list[int]) -> int:
    """The upper median: a peak hour or two (pods waiting out the starvation bound
    inflate an hour's peak) does not set the day's level; above it pods lend as usual."""
    return sorted(values)[len(values) // 2]


def _best_window(wanted: list[int], errors: tuple[float, ...], shortest: int) -> Block | None:
    buckets = forecast.BUCKETS
    best: Block | None = None
    best_score = 0
    for start in range(buckets):
        keep = -1
        error_sum = 0.0
        for hours in range(1, MAX_BLOCK_HOURS + 1):
            keep = max(keep, wanted[(start + hours - 1) % buckets])
            error_sum += errors[(start + hours - 1) % buckets]
            error = error_sum / hours
            # `not error <= LIMIT`: an error that is not a number plans no block.
            if hours < shortest or not error <= forecast.ERROR_LIMIT:
                continue
            level = _median([wanted[(start + hours + i) % buckets]
                             for i in range(buckets - hours)])
            score = (level - keep) * hours
            if level > keep and score > best_score:
                best_score = score
                best = Block(start, hours, keep, level, error)
    return best


@dataclass(frozen=True, slots=True)
class BlockNow:
    """Where the pool stands in the day's block at a time."""

    block: Block
    began: float  # the current or next occurrence of the window, unix seconds
    ends: float
    returns_at: float  # when the block starts going back to Kubernetes
    phase: str  # TROUGH, RETURN (from `returns_at` to `ends`) or DAY (outside the window)

    @property
    def returning(self) -> bool:
        return self.phase == RETURN

    @property
    def level(self) -> int:
        """What Kubernetes keeps from Slurm's demand now (beyond Slurm's next job)."""
        return self.block.keep if self.phase == TROUGH else self.block.level

    @property
    def slack(self) -> int:
        """Nodes of pending pods the trough lets wait: the forecast's error bound."""
        return math.ceil(self.block.keep * self.block.error - 1e-9)

    def trough_why(self, nodes: int) -> str:
        return (f"block: {nodes} node(s) to Slurm for the trough {self.block.label()} UTC "
                f"(Kubernetes forecast to want at most {self.block.keep}, "
                f"{self.block.level} by day)")

    def day_why(self, nodes: int) -> str:
        return (f"block: {nodes} node(s) to Kubernetes for the day's level of "
                f"{self.block.level} (trough {self.block.label()} UTC)")

    def return_why(self, nodes: int, lead: float) -> str:
        rise = datetime.fromtimestamp(self.ends, tz=UTC).strftime("%H:%M")
        return (f"block: {nodes} node(s){RETURN_MARK}{rise} UTC "
                f"(trough {self.block.label()}, {self.block.level} wanted then, "
                f"lead {lead / 60:.0f} min)")


def is_return_lend(reason: str) -> bool:
    """Whether a lend's reason is a block's return (`BlockNow.return_why`)."""
    return reason.startswith("block: ") and RETURN_MARK in reason


def block_now(summary: forecast.DemandSummary | None, spec: OwnershipSpec,
              now: float) -> BlockNow | None:
    """Where `now` falls in the day's block (None: blocks off, or no block planned)."""
    if not spec.forecast or summary is None or not spec.forecast_block_hours > 0:
        return None
    summary = forecast.close_hours(summary, now)
    block = plan_block(summary, spec.headroom_quantile, spec.forecast_block_hours)
    if block is None:
        return None
    hour = int(now // forecast.HOUR)
    offset = (hour - block.start) % forecast.BUCKETS
    if offset >= block.hours:  # the day: the next window
        began = (hour + forecast.BUCKETS - offset) * forecast.HOUR
    else:
        began = (hour - offset) * forecast.HOUR
    ends = began + block.hours * forecast.HOUR
    returns_at = ends - return_lead(summary, spec, block)
    phase = DAY if offset >= block.hours else RETURN if now >= returns_at else TROUGH
    return BlockNow(block, began, ends, returns_at, phase)


def return_lead(summary: forecast.DemandSummary, spec: OwnershipSpec, block: Block) -> float:
    """How long before the window's end the block starts going back: the pool's measured
    lend time (a drain waits for a job to end) for each round of `max_in_flight` lends
    the block's nodes take, at most half the window."""
    lead = summary.lead if summary.leads_seen else 0.0
    if not math.isfinite(lead):
        lead = 0.0
    rounds = math.ceil(block.nodes / max(spec.max_in_flight, 1))
    return min(max(lead, 0.0) * rounds, block.hours * forecast.HOUR / 2)
