"""The SQL read models (migration 0002) on SQLite and PostgreSQL, on a seeded log."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sunkd.domain.events import Event, TransitionAborted, TransitionCompleted, TransitionStarted
from sunkd.domain.fold import fold
from sunkd.store import migrations_api, projections
from tests.seeding import (
    DRAIN_TIMEOUT_REASON,
    POOL,
    T0,
    all_events,
    open_clocked,
    seed_pool_history,
)


def _at(minutes: float, seconds: float = 0) -> Any:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


async def _rows(log: Any, sql: str) -> list[dict[str, Any]]:
    rows = await projections.rows(log.engine, sql)
    for row in rows:
        for key, value in row.items():
            if key.endswith("_at") or key == "since":
                row[key] = projections.as_utc(value)
    return rows


async def test_views_on_seeded_history(database_url: str) -> None:
    log = await open_clocked(database_url)
    try:
        await seed_pool_history(log)
        transitions = await _rows(log, "SELECT * FROM transitions WHERE direction <> 'adopt' "
                                       "ORDER BY start_seq")
        assert [(t["transition_id"], t["node"], t["direction"], t["outcome"], t["duration_s"])
                for t in transitions] == [
            ("t-lend-1", "n1", "lend", "completed", 600.0),
            ("t-lend-2", "n2", "lend", "completed", 1200.0),
            ("t-lend-4", "n4", "lend", "completed", 600.0),
            ("t-lend-3", "n3", "lend", "aborted", 1800.0),
            ("t-reclaim-2", "n2", "reclaim", "completed", 900.0),
            ("t-lend-3b", "n3", "lend", "open", None),
            ("t-lend-5", "n5", "lend", "completed", 1500.0),
        ]
        aborted = transitions[3]
        assert aborted["abort_reason"] == DRAIN_TIMEOUT_REASON
        assert aborted["reason"] == "kubernetes demand: 2 pending pods"
        assert aborted["started_at"] == _at(120) and aborted["ended_at"] == _at(150)
        assert aborted["decided_by"] == "sunkd-a" and aborted["pool"] == POOL
        assert transitions[5]["ended_at"] is None and transitions[5]["abort_reason"] is None
        adopts = await _rows(log, "SELECT outcome, from_owner FROM transitions "
                                  "WHERE direction = 'adopt'")
        assert adopts == [{"outcome": "completed", "from_owner": "none"}] * 5

        n2 = await _rows(log, "SELECT owner, phase, from_at, to_at, duration_s, cause, "
                              "transition_id FROM ownership_intervals WHERE node = 'n2' "
                              "ORDER BY seq")
        assert [(r["owner"], r["phase"], r["from_at"], r["to_at"], r["duration_s"], r["cause"])
                for r in n2] == [
            ("none", "UNKNOWN", _at(0), _at(1), 60.0, "observed"),
            ("none", "TO_SLURM", _at(1), _at(1), 0.0, "started"),
            ("slurm", "SLURM", _at(1), _at(60), 3540.0, "completed"),
            ("slurm", "TO_K8S", _at(60), _at(80), 1200.0, "started"),
            ("kubernetes", "KUBERNETES", _at(80), _at(150), 4200.0, "completed"),
            ("kubernetes", "TO_SLURM", _at(150), _at(165), 900.0, "started"),
            ("slurm", "SLURM", _at(165), None, None, "completed"),
        ]
        other = await _rows(log, "SELECT node, owner, phase, pool FROM ownership_intervals "
                                 "WHERE node = 'other-1'")
        assert other == [{"node": "other-1", "owner": "none", "phase": "UNKNOWN", "pool": None}]

        current = await _rows(log, "SELECT node, owner, phase, since, transition_id "
                                   "FROM node_ownership ORDER BY node")
        assert [(r["node"], r["owner"], r["phase"], r["since"], r["transition_id"])
                for r in current] == [
            ("n1", "kubernetes", "KUBERNETES", _at(70), "t-lend-1"),
            ("n2", "slurm", "SLURM", _at(165), "t-reclaim-2"),
            ("n3", "slurm", "TO_K8S", _at(180), "t-lend-3b"),
            ("n4", "kubernetes", "KUBERNETES", _at(100), "t-lend-4"),
            ("n5", "kubernetes", "KUBERNETES", _at(205), "t-lend-5"),
            ("other-1", "none", "UNKNOWN", _at(0), None),
        ]
        # The view and the fold agree on every node.
        state = fold(await all_events(log))
        for row in current:
            node = state.nodes[row["node"]]
            assert (node.owner, node.phase.value) == (row["owner"], row["phase"])
            assert node.since is None or node.since == row["since"].timestamp()

        actions = await _rows(log, "SELECT * FROM action_latency ORDER BY request_seq")
        assert [(a["action_id"], a["verb"], a["outcome"], a["latency_s"], a["error"])
                for a in actions] == [
            ("a-1", "drain", "succeeded", 2.0, None),
            ("a-4", "drain", "pending", None, None),
            ("a-6", "resume", "succeeded", 4.0, None),
            ("a-2", "drain", "failed", 1.0, "slurmrestd: HTTP 500"),
            ("a-3", "drain", "succeeded", 3.0, None),
        ]
        assert bool(actions[3]["retryable"]) is True and actions[4]["attempt"] == 2
        assert actions[2]["transition_id"] == "t-reclaim-2"
        await log.read_models.rebuild()  # views: nothing to do, but they exist
    finally:
        await log.close()


async def test_end_events_the_fold_ignores_are_ignored(database_url: str) -> None:
    """A stale end (wrong id), a duplicate end and a superseded start, as the fold sees them."""
    log = await open_clocked(database_url)
    try:
        def tx(kind: Any, tid: str, src: str = "slurm", dst: str = "kubernetes") -> Event:
            return Event("x1", kind(transition_id=tid, node="x1", pool="p", from_owner=src,
                                    to_owner=dst, reason=tid))
        steps = [tx(TransitionStarted, "a"), tx(TransitionCompleted, "zzz"),
                 tx(TransitionCompleted, "a"), tx(TransitionAborted, "a"),
                 tx(TransitionStarted, "b", "kubernetes", "slurm"),
                 tx(TransitionStarted, "c", "kubernetes", "slurm"), tx(TransitionAborted, "c")]
        for index, step in enumerate(steps):
            log.clock = _at(index)
            await log.append([step], 0)
        rows = await _rows(log, "SELECT transition_id, outcome, ended_at FROM transitions "
                                "ORDER BY start_seq")
        assert [(r["transition_id"], r["outcome"], r["ended_at"]) for r in rows] == [
            ("a", "completed", _at(2)), ("b", "superseded", _at(5)), ("c", "aborted", _at(6))]
        phases = await _rows(log, "SELECT phase, owner FROM ownership_intervals ORDER BY seq")
        assert [(r["phase"], r["owner"]) for r in phases] == [
            ("TO_K8S", "slurm"), ("KUBERNETES", "kubernetes"), ("TO_SLURM", "kubernetes"),
            ("TO_SLURM", "kubernetes"), ("KUBERNETES", "kubernetes")]
        node = fold(await all_events(log)).nodes["x1"]
        assert (node.owner, node.phase.value) == ("kubernetes", "KUBERNETES")
    finally:
        await log.close()


async def test_downgrade_drops_the_views_and_upgrade_restores_them(database_url: str) -> None:
    log = await open_clocked(database_url)
    try:
        await seed_pool_history(log)
        await migrations_api.downgrade(log.engine, "0001")
        assert await migrations_api.current_revision(log.engine) == "0001"
        with pytest.raises(Exception, match="read model"):
            await log.read_models.rebuild()
        await migrations_api.upgrade(log.engine)
        rows = await projections.rows(log.engine, "SELECT count(*) AS n FROM node_ownership")
        assert rows == [{"n": 6}]
    finally:
        await log.close()


async def test_read_models_answer_the_queries_callers_ask(database_url: str) -> None:
    """`EventLog.read_models`, what history, audit, the API and `replay --check` ask: the
    same answers on both databases, timestamps as aware UTC datetimes."""
    log = await open_clocked(database_url)
    try:
        await seed_pool_history(log)
        models = log.read_models
        n2 = await models.intervals(node="n2")
        assert [(i.owner, i.phase, i.from_at, i.to_at, i.cause) for i in n2][-3:] == [
            ("kubernetes", "KUBERNETES", _at(80), _at(150), "completed"),
            ("kubernetes", "TO_SLURM", _at(150), _at(165), "started"),
            ("slurm", "SLURM", _at(165), None, "completed"),
        ]
        assert n2[-1].decided_by == "sunkd-a" and n2[-1].transition_id == "t-reclaim-2"
        window = await models.intervals(nodes=["n1", "n2"], since=_at(100), until=_at(160))
        assert [(i.node, i.phase) for i in window] == [
            ("n1", "KUBERNETES"), ("n2", "KUBERNETES"), ("n2", "TO_SLURM")]
        assert await models.intervals(nodes=[]) == []
        assert [i.phase for i in await models.intervals(node="n2", limit=2, offset=1)] == [
            "TO_SLURM", "SLURM"]

        moves = await models.transitions(_at(60), _at(150))  # t-reclaim-2 starts at 150
        assert [(m["transition_id"], m["outcome"]) for m in moves] == [
            ("t-lend-1", "completed"), ("t-lend-2", "completed"), ("t-lend-4", "completed"),
            ("t-lend-3", "aborted")]
        assert (moves[3]["started_at"], moves[3]["ended_at"]) == (_at(120), _at(150))
        failed = await models.failed_actions(_at(0), _at(300))
        assert [(a["action_id"], a["error"]) for a in failed] == [
            ("a-2", "slurmrestd: HTTP 500")]
        assert failed[0]["requested_at"].tzinfo is not None
        assert await models.failed_actions(_at(300), _at(400)) == []

        state = fold(await all_events(log))
        assert await models.check_against_state(state) == []
        n1 = state.nodes["n1"]
        assert await models.check_against_state(replace(state, nodes={
            **state.nodes, "n1": replace(n1, owner="slurm")})) == [
            "node_ownership says n1 is owned by 'kubernetes', the fold says 'slurm'"]
        await models.rebuild()
    finally:
        await log.close()
