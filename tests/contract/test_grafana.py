"""The Grafana dashboard: every SQL panel runs on PostgreSQL over a seeded log (Grafana
macros replaced by concrete SQL) with the expected columns, every PromQL expression
names only metrics sunkd exports, and the provisioning files point at the uids used."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from sunkd.api.metrics import Metrics
from sunkd.domain.events import RecordedEvent, SlurmNodeObserved
from sunkd.domain.fold import fold
from tests.seeding import T0, open_clocked, seed_pool_history

GRAFANA = Path(__file__).resolve().parents[2] / "manifests" / "grafana"
FROM, TO = "'2026-11-02T08:00:00Z'", "'2026-11-02T12:00:00Z'"
TABLE_COLUMNS = {
    "Transitions in range": ["direction", "outcome", "transitions", "avg_seconds"],
    "Slowest drains in range": ["transition_id", "node", "pool", "started_at", "outcome",
                                "duration_s", "abort_reason"],
    "Failed actions in range": ["requested_at", "node", "side", "verb", "attempt", "error",
                                "retryable"],
    "Current ownership": ["node", "pool", "owner", "phase", "since", "reason"],
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "or", "and",
                "unless", "bool", "offset"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / "sunkd-ownership.json").read_text())
    return loaded


def targets(kind: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            if target["datasource"]["type"] == kind:
                found.append((panel["title"], target))
    return found


def expand_macros(sql: str) -> str:
    sql = re.sub(r"\$__timeFilter\((\w+)\)", rf"\1 BETWEEN {FROM} AND {TO}", sql)
    sql = sql.replace("$__timeFrom()", FROM).replace("$__timeTo()", TO)
    assert "$__" not in sql, f"unhandled Grafana macro in {sql}"
    return sql


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names inside {...}/by (...), or durations inside [...]."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if match.group(2) or match.group(1) in PROMQL_WORDS:
            continue
        names.add(match.group(1))
    return names


def test_panels_are_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "sunkd-ownership"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    kinds = {panel["type"] for panel in board["panels"]}
    assert "state-timeline" in kinds
    for panel in board["panels"]:
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]


def test_promql_names_only_exported_metrics() -> None:
    exported = Metrics().metric_names()
    expressions = targets("prometheus")
    assert len(expressions) >= 10
    for title, target in expressions:
        names = promql_metrics(target["expr"])
        assert names, f"{title}: no metric in {target['expr']}"
        unknown = names - exported
        assert not unknown, f"{title}: {sorted(unknown)} not exported by sunkd"


def test_utilization_panels_query_the_node_seconds_counter() -> None:
    """The busy/idle panels read `sunkd_node_seconds_total`, which a Metrics fed with
    events really exports with the labels the panels group by."""
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}
    for title in ("Busy / idle node-hours per owner", "Busy share per pool and owner (range)"):
        [target] = panels[title]["targets"]
        assert promql_metrics(target["expr"]) == {"sunkd_node_seconds_total"}, title
    assert "by (owner, state)" in panels["Busy / idle node-hours per owner"]["targets"][0]["expr"]
    metrics = Metrics()
    at = T0.timestamp()
    metrics.observe_event(RecordedEvent(1, T0, 1, "n1", SlurmNodeObserved(
        node="n1", state="ALLOCATED", alloc_cpus=1)))
    metrics.set_state(fold([]), at + 60)
    text = metrics.render().decode()
    assert 'sunkd_node_seconds_total{owner="none",pool="none",state="busy"} 60.0' in text


def test_promql_checker_catches_unknown_metrics() -> None:
    names = promql_metrics('sum by (le) (rate(sunkd_nope_bucket{a="b"}[5m])) or vector(0)')
    assert names == {"sunkd_nope_bucket"}
    assert "sunkd_nope_bucket" not in Metrics().metric_names()


def test_provisioning_points_at_the_dashboard_datasources() -> None:
    datasources = yaml.safe_load((GRAFANA / "datasources.yaml").read_text())
    uids = {source["uid"]: source["type"] for source in datasources["datasources"]}
    used = {target["datasource"]["uid"]: target["datasource"]["type"]
            for panel in dashboard()["panels"] for target in panel["targets"]}
    assert used == uids
    providers = yaml.safe_load((GRAFANA / "dashboards.yaml").read_text())
    assert providers["providers"][0]["options"]["path"]


async def test_sql_panels_run_with_expected_columns(postgres_url: str) -> None:
    log = await open_clocked(postgres_url)
    try:
        await seed_pool_history(log)
    finally:
        await log.close()
    connection = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg://",
                                                            "postgresql://"))
    try:
        queries = targets("grafana-postgresql-datasource")
        assert len(queries) == 6
        for title, target in queries:
            statement = await connection.prepare(expand_macros(target["rawSql"]))
            columns = [attribute.name for attribute in statement.get_attributes()]
            rows = await statement.fetch()
            assert rows, f"{title}: no rows on the seeded log"
            if target["format"] == "time_series":
                assert columns == ["time", "metric", "value"], title
                assert all(row["time"] is not None for row in rows)
            else:
                assert columns == TABLE_COLUMNS[title], title
        timeline = next(t for title, t in queries if title == "Ownership timeline per node")
        rows = await connection.fetch(expand_macros(timeline["rawSql"]))
        n3 = [(row["time"].isoformat(), row["value"]) for row in rows if row["metric"] == "n3"]
        assert n3 == [("2026-11-02T08:00:00+00:00", "UNKNOWN"),
                      ("2026-11-02T08:01:00+00:00", "SLURM"),
                      ("2026-11-02T10:00:00+00:00", "TO_K8S"),
                      ("2026-11-02T10:30:00+00:00", "SLURM"),
                      ("2026-11-02T11:00:00+00:00", "TO_K8S")]
        owners = next(t for title, t in queries if title == "Nodes per owner over time")
        at_10_15 = {row["metric"]: row["value"]
                    for row in await connection.fetch(expand_macros(owners["rawSql"]))
                    if row["time"].isoformat() == "2026-11-02T10:15:00+00:00"}
        assert at_10_15 == {"kubernetes": 3, "slurm": 2}
    finally:
        await connection.close()
