"""SQLAlchemy table definitions for the event log, the leadership lease and snapshots.

The schema itself is owned by the Alembic migrations (sunkd/store/migrations); these
Core tables mirror it for queries. JSON payloads are JSONB on PostgreSQL (indexable
for audits) and JSON text on SQLite.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    Identity,
    Integer,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

# JSONB on PostgreSQL, JSON (text) elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# BIGINT on PostgreSQL; on SQLite only "INTEGER PRIMARY KEY" is the rowid alias.
SeqType = BigInteger().with_variant(Integer(), "sqlite")



def _event_columns() -> list[Column[Any]]:
    """An event row's columns after `seq` (`events` and `events_restored` share them)."""
    return [
        Column("recorded_at", DateTime(timezone=True), nullable=False),
        Column("kind", Text, nullable=False),
        Column("subject", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("causation_seq", BigInteger, nullable=True),
        Column("payload", JSONType, nullable=False),
    ]


events = Table(
    "events",
    metadata,
    Column("seq", SeqType, Identity(always=False), primary_key=True),
    *_event_columns(),
)

leadership = Table(
    "leadership",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("holder", Text, nullable=True),
    Column("epoch", BigInteger, nullable=False),
    Column("renewed_at", DateTime(timezone=True), nullable=True),
    Column("lease_seconds", Float, nullable=False),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("seq", BigInteger, primary_key=True),
    Column("taken_at", DateTime(timezone=True), nullable=False),
    Column("state", JSONType, nullable=False),
)

# Ranges `sunkd log restore` brought back for audit (migration 0003): the columns of
# `events`, read by the audit views through `sunkd_event_history`, never by the fold.
events_restored = Table(
    "events_restored",
    metadata,
    Column("seq", SeqType, primary_key=True, autoincrement=False),
    *_event_columns(),
)

# SQLite only (migration 0003): the archive's permission to delete, written and removed
# inside the archive's own transaction; the DELETE trigger on `events` checks it.
sunkd_maintenance = Table(
    "sunkd_maintenance",
    metadata,
    Column("operation", Text, nullable=False),
    Column("upto_seq", Integer, nullable=False),
)

# The single leadership row's id.
LEADERSHIP_ROW = 1
