"""Every query in docs/audit.md runs on PostgreSQL over a seeded log and returns exactly
the expected rows. Queries are read from the markdown, so docs and tests cannot drift."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg

from tests.seeding import DRAIN_TIMEOUT_REASON, POOL, T0, open_clocked, seed_pool_history

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
SECTION = re.compile(r"^### (?P<title>.+?)\n(?P<body>.*?)(?=^### |\Z)", re.M | re.S)
SQL_BLOCK = re.compile(r"```sql\n(?P<sql>.*?)```", re.S)
PARAM = re.compile(r":'(?P<name>[a-z_]+)'")


def at(minutes: float, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for section in SECTION.finditer(DOC.read_text()):
        blocks = SQL_BLOCK.findall(section["body"])
        assert len(blocks) <= 1, f"one query per section: {section['title']}"
        if blocks:
            found[section["title"].strip()] = blocks[0]
    return found


def bind(sql: str, params: dict[str, str]) -> str:
    """psql's :'name' substitution (a quoted literal)."""
    def literal(match: re.Match[str]) -> str:
        value = params[match["name"]]
        return "'" + value.replace("'", "''") + "'"
    return PARAM.sub(literal, sql)


PERIOD = {"from": "2026-11-01T00:00:00Z", "to": "2026-11-02T12:00:00Z"}
EXPECTED: dict[str, tuple[dict[str, str], list[tuple[Any, ...]]]] = {
    "Who drained node X on a given day, and why": (
        {"node": "n3", "day": "2026-11-02"},
        [(at(120), "t-lend-3", "aborted", "sunkd-a", "kubernetes demand: 2 pending pods",
          DRAIN_TIMEOUT_REASON, "a-4", "pending", None),
         (at(180), "t-lend-3b", "open", "sunkd-a", "kubernetes demand: 2 pending pods",
          None, None, None, None)]),
    "Hours each pool spent per owner in a period": (
        PERIOD,
        # 5 pool nodes x 239 min from adoption to 12:00 = 1195 min = 765 slurm + 430 k8s.
        [(POOL, "kubernetes", Decimal("7.17")), (POOL, "none", Decimal("0.00")),
         (POOL, "slurm", Decimal("12.75"))]),
    "Transitions aborted by the drain timeout": (
        PERIOD,
        [("t-lend-3", "n3", POOL, at(120), at(150), 1800.0, DRAIN_TIMEOUT_REASON)]),
    "Slowest drains": (
        PERIOD,
        [("t-lend-3", "n3", POOL, at(120), "aborted", Decimal("30.0")),
         ("t-lend-5", "n5", POOL, at(180), "completed", Decimal("25.0")),
         ("t-lend-2", "n2", POOL, at(60), "completed", Decimal("20.0")),
         ("t-lend-1", "n1", POOL, at(60), "completed", Decimal("10.0")),
         ("t-lend-4", "n4", POOL, at(90), "completed", Decimal("10.0"))]),
    "Time to lend and to reclaim per pool": (
        PERIOD,
        # lends 600, 600, 1200, 1500 s; one reclaim of 900 s.
        [(POOL, "lend", 4, 900.0, 1410.0, 1500.0), (POOL, "reclaim", 1, 900.0, 900.0, 900.0)]),
    "Failed actions and their errors": (
        PERIOD,
        [(at(180), "n5", "slurm", "drain", 1, "slurmrestd: HTTP 500", True, "t-lend-5")]),
    "Where every node was at a given moment": (
        {"at": "2026-11-02T10:15:00Z"},
        [("n1", POOL, "kubernetes", "KUBERNETES", "t-lend-1"),
         ("n2", POOL, "kubernetes", "KUBERNETES", "t-lend-2"),
         ("n3", POOL, "slurm", "TO_K8S", "t-lend-3"),
         ("n4", POOL, "kubernetes", "KUBERNETES", "t-lend-4"),
         ("n5", POOL, "slurm", "SLURM", "adopt-n5"),
         ("other-1", None, "none", "UNKNOWN", None)]),
    "Operator pins: who pinned what, and why": (
        PERIOD,
        [(at(235), "n2", "slurm", "alice", "maintenance window on the k8s side")]),
}


def test_every_documented_query_has_an_expectation() -> None:
    assert set(queries()) == set(EXPECTED)


async def test_documented_queries_return_exact_answers(postgres_url: str) -> None:
    log = await open_clocked(postgres_url)
    try:
        await seed_pool_history(log)
    finally:
        await log.close()
    dsn = postgres_url.replace("postgresql+asyncpg://", "postgresql://")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("SET TIME ZONE 'America/New_York'")  # answers must not care
        for title, sql in queries().items():
            params, expected = EXPECTED[title]
            rows = await connection.fetch(bind(sql, params))
            got = [tuple(row.values()) for row in rows]
            assert got == expected, f"{title}:\n got {got}\nwant {expected}"
    finally:
        await connection.close()
