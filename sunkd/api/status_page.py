"""The status page at `/`: where every node is, how it got there, whether sources are
fresh - readable in a browser with no front-end build step.

Server-rendered HTML with an inline SVG timeline (one row per node, one rectangle per
ownership interval from the `ownership_intervals` read model), pool counters and
source health from the live state, and busy/idle node-hours per pool and owner over the
last 24 hours (`sunkd.store.utilization.RollingUtilization`: the fold `sunkd audit` uses,
over the log, read once per process and then incrementally).
Everything user-controlled is HTML-escaped.
"""

from __future__ import annotations

import time
import weakref
from datetime import UTC, datetime, timedelta
from html import escape
from typing import TYPE_CHECKING

from sunkd.store.eventlog import EventLog
from sunkd.store.projections import Interval
from sunkd.store.utilization import RollingUtilization

if TYPE_CHECKING:
    from sunkd.api.app import DaemonView

PAGE_NODES = 100
PHASE_COLOURS = {
    "SLURM": "#2b6cb0",
    "TO_K8S": "#90cdf4",
    "KUBERNETES": "#2f855a",
    "TO_SLURM": "#9ae6b4",
    "HELD": "#c05621",
    "UNKNOWN": "#a0aec0",
}
_ROW = 22
_LABEL = 150
_WIDTH = 1100
UTILIZATION_HOURS = 24
_ROLLING: weakref.WeakKeyDictionary[EventLog, RollingUtilization] = weakref.WeakKeyDictionary()


def rolling_utilization(event_log: EventLog) -> RollingUtilization:
    """The process's rolling busy/idle fold over `event_log` (made on first use)."""
    rolling = _ROLLING.get(event_log)
    if rolling is None:
        rolling = _ROLLING[event_log] = RollingUtilization(event_log, UTILIZATION_HOURS)
    return rolling


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


async def render_status(view: DaemonView, *, hours: float, offset: int) -> str:
    from sunkd.api.app import node_json, pool_summaries, visible_nodes

    state = view.state()
    pools = view.pools()
    now = time.time()
    now_dt = datetime.fromtimestamp(now, tz=UTC)
    start_dt = now_dt - timedelta(hours=hours)
    names = visible_nodes(state)
    page = names[offset:offset + PAGE_NODES]
    from sunkd.domain.policy import membership

    members = membership(state, [p.spec for p in pools]) if pools else {}
    leader = "leader" if view.is_leader() else "standby"
    ready, ready_reason = view.is_ready()

    parts: list[str] = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>sunkd status</title><style>",
        "body{font-family:sans-serif;margin:20px;color:#1a202c;background:#fff}",
        "table{border-collapse:collapse;margin:8px 0 20px}",
        "td,th{border:1px solid #cbd5e0;padding:3px 8px;text-align:left;font-size:13px}",
        "th{background:#edf2f7}.bad{color:#c53030;font-weight:bold}.ok{color:#2f855a}",
        "</style></head><body>",
        f"<h1>sunkd status</h1><p>This process: <b>{leader}</b>, "
        f"epoch {state.leader_epoch} (leader {escape(state.leader_identity or '-')}); "
        f"<span class={'ok' if ready else 'bad'}>{'ready' if ready else 'not ready'}</span>: "
        f"{escape(ready_reason)}. Folded up to seq {state.last_seq}. Now {_fmt(now)} UTC.</p>",
        "<h2>Sources</h2><table><tr><th>source</th><th>status</th><th>cause</th>"
        "<th>since</th><th>last fresh</th><th>detail</th></tr>",
    ]
    for source in sorted(state.sources):
        health = state.sources[source]
        css = "ok" if health.status == "fresh" else "bad"
        parts.append(
            f"<tr><td>{escape(source)}</td><td class={css}>{escape(health.status)}</td>"
            f"<td>{escape(health.cause or '')}</td><td>{_fmt(health.since)}</td>"
            f"<td>{_fmt(health.last_fresh_at)}</td><td>{escape(health.detail or '')}</td></tr>")
    if not state.sources:
        parts.append("<tr><td colspan=6>no source has reported yet</td></tr>")
    parts.append("</table><h2>Pools</h2><table><tr><th>pool</th>")
    phases = list(PHASE_COLOURS)
    parts.extend(f"<th>{phase}</th>" for phase in phases)
    parts.append("<th>Slurm pending nodes</th><th>Kubernetes pending pods</th></tr>")
    for summary in pool_summaries(state, pools, now):
        parts.append(f"<tr><td>{escape(summary.name)}</td>")
        parts.extend(f"<td>{summary.counts.get(phase, 0)}</td>" for phase in phases)
        parts.append(f"<td>{summary.slurm_pending_nodes}</td>"
                     f"<td>{summary.k8s_pending_pods}</td></tr>")
    parts.append("</table>")

    # ---------------------------------------------------------- utilization
    event_log = view.event_log
    parts.append(f"<h2>Utilization (last {UTILIZATION_HOURS} h)</h2>")
    if event_log is None:
        parts.append("<p>utilization unavailable: no event log</p>")
    else:
        window, usage = await rolling_utilization(event_log).rows(
            now_dt, [pool.spec for pool in pools])
        parts.append(f"<p>Node-hours since {window:%Y-%m-%d %H:%M} UTC.</p>"
                     "<table><tr><th>pool</th><th>owner</th><th>busy h</th>"
                     "<th>idle h</th><th>busy share</th></tr>")
        for use in usage:
            share = "-" if use.busy_share is None else f"{100 * use.busy_share:.1f} %"
            parts.append(
                f"<tr><td>{escape(use.pool)}</td><td>{escape(use.owner)}</td>"
                f"<td>{use.busy_s / 3600:.2f}</td><td>{use.idle_s / 3600:.2f}</td>"
                f"<td>{share}</td></tr>")
        if not usage:
            parts.append("<tr><td colspan=5>no node observed in this period</td></tr>")
        parts.append("</table><p>Busy: a Slurm allocation or a Running pool pod. A node "
                     "in transit counts for the side it comes from.</p>")

    # ------------------------------------------------------------- timeline
    intervals: list[Interval] = []
    if event_log is not None and page:
        intervals = await event_log.read_models.intervals(
            nodes=page, since=start_dt, until=now_dt, limit=100_000)
    by_node: dict[str, list[Interval]] = {}
    for interval in intervals:
        by_node.setdefault(interval.node, []).append(interval)
    if intervals:
        # A history younger than the window is zoomed in on (at least 5 minutes shown):
        # a demo's first minute would otherwise be a sliver at the right edge.
        earliest = min(interval.from_at for interval in intervals)
        start_dt = max(start_dt, min(earliest, now_dt - timedelta(minutes=5)))
    span = max((now_dt - start_dt).total_seconds(), 1.0)
    parts.append(f"<h2>Ownership since {start_dt:%Y-%m-%d %H:%M:%S} UTC "
                 f"(at most the last {hours:g} hours)</h2>")
    scale = (_WIDTH - _LABEL - 10) / span
    height = _ROW * (len(page) + 1) + 10
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
           f'role="img" aria-label="ownership timeline">']
    for tick in range(5):
        x = _LABEL + (_WIDTH - _LABEL - 10) * tick / 4
        label = (start_dt + timedelta(seconds=span * tick / 4)).strftime(
            "%H:%M" if span > 3600 else "%H:%M:%S")
        svg.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 14}" '
                   f'stroke="#e2e8f0"/><text x="{x:.1f}" y="{height - 2}" font-size="10" '
                   f'text-anchor="middle">{label}</text>')
    for row, name in enumerate(page):
        y = row * _ROW + 4
        svg.append(f'<text x="0" y="{y + 14}" font-size="12">{escape(name)}</text>')
        for interval in by_node.get(name, []):
            begin = max(interval.from_at, start_dt)
            end = min(interval.to_at or now_dt, now_dt)
            if end <= begin:
                continue
            x = _LABEL + (begin - start_dt).total_seconds() * scale
            width = max((end - begin).total_seconds() * scale, 1.0)
            colour = PHASE_COLOURS.get(interval.phase, "#718096")
            title = (f"{name}: {interval.phase} (owner {interval.owner}) from "
                     f"{begin:%H:%M:%S} to {end:%H:%M:%S}: {interval.reason or ''}")
            svg.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{_ROW - 6}" '
                       f'fill="{colour}"><title>{escape(title)}</title></rect>')
    svg.append("</svg>")
    if event_log is None:
        parts.append("<p>history unavailable: no event log</p>")
    parts.extend(svg)
    parts.append("<p>")
    parts.extend(f'<span style="background:{colour};color:#fff;padding:2px 6px;'
                 f'margin-right:4px">{phase}</span>' for phase, colour in PHASE_COLOURS.items())
    parts.append("</p>")
    if len(names) > offset + PAGE_NODES:
        parts.append(f'<p><a href="/?offset={offset + PAGE_NODES}&hours={hours:g}">'
                     "next nodes</a></p>")

    # --------------------------------------------------------------- nodes
    parts.append("<h2>Nodes</h2><table><tr><th>node</th><th>pool</th><th>owner</th>"
                 "<th>phase</th><th>since</th><th>why</th></tr>")
    for name in page:
        info = node_json(state, state.nodes[name], members.get(name), now)
        reasons = info["holdReasons"] or info["unknownReasons"]
        why = "; ".join(reasons) if reasons else (
            info["transition"]["reason"] if info["transition"] else "")
        if info["pin"] is not None and info["pin"]["problem"]:
            why = "; ".join(filter(None, (why, info["pin"]["problem"])))
        if info["sunkdMarks"]:
            why = "; ".join(filter(None, (why, "in no pool, carries sunkd's "
                                          + "; ".join(info["sunkdMarks"]))))
        parts.append(
            f"<tr><td>{escape(name)}</td><td>{escape(info['pool'] or '-')}</td>"
            f"<td>{escape(info['owner'])}</td><td>{escape(info['phase'])}</td>"
            f"<td>{escape(info['since'] or '-')}</td><td>{escape(why)}</td></tr>")
    parts.append("</table></body></html>")
    return "".join(parts)
