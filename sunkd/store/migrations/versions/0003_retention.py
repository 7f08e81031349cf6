"""Retention: `events` partitioned by seq on PostgreSQL, the archive's maintenance path on
SQLite, and `events_restored` for audits of an archived range.

Why: the log is append-only and grows forever. `sunkd log archive` writes an
old range to files and then removes it from the database, which the append-only
triggers must allow for the archive and for nothing else:

* PostgreSQL: `events` becomes declaratively partitioned by RANGE of seq, 1,000,000
  seqs a partition (`PARTITION_SIZE`, the default of `sunkd_partitioning`). Removing a
  range is then `DETACH PARTITION` + `DROP TABLE`, which no row or TRUNCATE trigger
  sees and which only the table's owner
  (the maintenance role) may run; the daemon's role has no DELETE, TRUNCATE or
  ownership at all (docs/operations.md, "Database roles"). Why 1,000,000: a partition
  is the unit of removal, so it should be small next to a 30-day retention, yet few
  enough that a year stays at hundreds of partitions (the PostgreSQL manual, "Table
  Partitioning, Best Practices": many thousands of partitions cost planning time and
  memory). At the issue's target of events proportional to state changes that is hours
  to days of log, some 0.3-0.5 GB, per partition.
* `sunkd_partitioning` holds the size of the partitions created from then on.
* Who creates the next partition: the daemon never runs DDL. `sunkd_events_extend(seq)`
  (a function created here) creates every partition up to `seq` and is called by the
  migration and by the maintenance commands (`sunkd log partitions`, `sunkd log
  archive`); a DEFAULT partition takes any append beyond the last partition, so a late
  maintenance run never fails an append: the next run moves those rows into their
  range partitions. Row triggers on a partitioned table are cloned onto every partition
  (PostgreSQL manual, CREATE TRIGGER), statement-level TRUNCATE triggers are not, so
  `sunkd_events_extend` gives each new partition its own.
* SQLite: no partitions. The DELETE trigger refuses unless the deleting transaction
  has first written a row to `sunkd_maintenance` naming a seq at or above the row's;
  only the archive writes that table, inserting and deleting its row inside the same
  `BEGIN IMMEDIATE` transaction, so no other connection ever sees it.
* `events_restored` holds ranges `sunkd log restore` brings back for audit (never into
  `events`: the live log must stay the one the daemon folds). The read models of 0002
  are recreated over `sunkd_event_history` (events UNION ALL events_restored), reusing
  0002's SQL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

PARTITION_SIZE = 1_000_000
# Partitions created ahead of the append point by the migration (and, by default, by
# `sunkd log partitions`).
PARTITIONS_AHEAD = 4

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
SeqType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

HISTORY_VIEW = "sunkd_event_history"
_COLUMNS = "seq, recorded_at, kind, subject, epoch, causation_seq, payload"

# Partitions are contiguous ranges [lower, lower + size) named events_s<lower>, each with
# its own TRUNCATE trigger; `size` is read from `sunkd_partitioning` when a partition is
# created (so a test can use small ones). Rows that landed in events_default (maintenance
# ran late) are moved into their partitions: a range partition cannot be created while
# the DEFAULT partition holds rows of its range (PostgreSQL manual, CREATE TABLE,
# PARTITION OF).
EXTEND_FUNCTION = """
CREATE OR REPLACE FUNCTION sunkd_events_extend(through_seq bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  size bigint;
  lower_seq bigint;
  target bigint := through_seq;
  name text;
  created integer := 0;
  moving boolean;
BEGIN
  LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE;
  SELECT partition_size INTO size FROM sunkd_partitioning;
  SELECT coalesce(max((regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                    'TO \\(''?(-?[0-9]+)''?\\)'))[1]::bigint), 1)
    INTO lower_seq
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
   WHERE i.inhparent = 'events'::regclass
     AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT';
  moving := EXISTS (SELECT 1 FROM events_default);
  IF moving THEN
    SELECT greatest(target, max(seq)) INTO target FROM events_default;
    ALTER TABLE events DETACH PARTITION events_default;
    ALTER TABLE events_default RENAME TO events_default_moving;
  END IF;
  WHILE lower_seq <= target LOOP
    name := 'events_s' || lower_seq::text;
    EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%s) TO (%s)',
                   name, lower_seq, lower_seq + size);
    EXECUTE format('CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON %I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only()', name);
    created := created + 1;
    lower_seq := lower_seq + size;
  END LOOP;
  IF moving THEN
    CREATE TABLE events_default PARTITION OF events DEFAULT;
    CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events_default
      FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only();
    INSERT INTO events SELECT * FROM events_default_moving;
    DROP TABLE events_default_moving;
  END IF;
  RETURN created;
END;
$$
"""

SQLITE_DELETE_TRIGGER = """
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM sunkd_maintenance m
                 WHERE m.operation = 'archive' AND OLD.seq <= m.upto_seq)
BEGIN SELECT RAISE(ABORT, 'sunkd: the events table is append-only (DELETE rejected)'); END
"""
SQLITE_PLAIN_DELETE_TRIGGER = """
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'sunkd: the events table is append-only (DELETE rejected)'); END
"""


def _read_models() -> ModuleType:
    """Migration 0002, whose view SQL is reused (a file name Python cannot import)."""
    path = Path(__file__).with_name("0002_read_models.py")
    spec = importlib.util.spec_from_file_location("sunkd_migration_0002", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recreate_views(dialect: str, source: str) -> None:
    """Drop the 0002 views and create them again reading `source` instead of events."""
    models = _read_models()
    for name in reversed(models.VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    bodies = models._sql(dialect)
    for name in models.VIEWS:
        body = re.sub(r"\bevents e\b", f"{source} e", bodies[name].strip())
        op.execute(f"CREATE VIEW {name} AS {body}")


def _create_restored() -> None:
    op.create_table(
        "events_restored",
        sa.Column("seq", SeqType, primary_key=True, autoincrement=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("causation_seq", sa.BigInteger, nullable=True),
        sa.Column("payload", JSONType, nullable=False),
    )
    op.create_index("ix_events_restored_kind_seq", "events_restored", ["kind", "seq"])


def _partition_postgres() -> None:
    op.execute("ALTER TABLE events RENAME TO events_unpartitioned")
    op.execute("ALTER TABLE events_unpartitioned RENAME CONSTRAINT events_pkey "
               "TO events_unpartitioned_pkey")
    op.execute("""
CREATE TABLE events (
  seq bigint NOT NULL,
  recorded_at timestamptz NOT NULL,
  kind text NOT NULL,
  subject text NOT NULL,
  epoch bigint NOT NULL,
  causation_seq bigint,
  payload jsonb NOT NULL,
  CONSTRAINT events_pkey PRIMARY KEY (seq)
) PARTITION BY RANGE (seq)""")
    op.execute("CREATE TABLE events_default PARTITION OF events DEFAULT")
    op.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events_default "
               "FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only()")
    op.execute("CREATE TABLE sunkd_partitioning (partition_size bigint NOT NULL "
               "CHECK (partition_size > 0))")
    op.execute(f"INSERT INTO sunkd_partitioning VALUES ({PARTITION_SIZE})")
    op.execute(EXTEND_FUNCTION)
    # Partitions for the existing rows and PARTITIONS_AHEAD more, then the rows.
    op.execute(f"SELECT sunkd_events_extend((SELECT coalesce(max(seq), 0) "
               f"FROM events_unpartitioned) + {PARTITIONS_AHEAD * PARTITION_SIZE})")
    op.execute(f"INSERT INTO events ({_COLUMNS}) SELECT {_COLUMNS} FROM events_unpartitioned")
    op.execute("DROP TABLE events_unpartitioned")
    op.create_index("ix_events_subject_seq", "events", ["subject", "seq"])
    op.create_index("ix_events_kind_seq", "events", ["kind", "seq"])
    op.execute("CREATE INDEX ix_events_transition_node ON events "
               "((payload->>'node'), seq) WHERE kind LIKE 'transition.%'")
    # The 0001 triggers, on the partitioned table: the row trigger is cloned onto every
    # partition, present and future; the TRUNCATE trigger covers `TRUNCATE events`.
    op.execute("CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events "
               "FOR EACH ROW EXECUTE FUNCTION sunkd_events_append_only()")
    op.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
               "FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only()")


def _unpartition_postgres() -> None:
    op.execute("ALTER TABLE events RENAME TO events_partitioned")
    op.execute("ALTER TABLE events_partitioned RENAME CONSTRAINT events_pkey "
               "TO events_partitioned_pkey")
    op.execute("ALTER INDEX ix_events_subject_seq RENAME TO ix_events_partitioned_subject")
    op.execute("ALTER INDEX ix_events_kind_seq RENAME TO ix_events_partitioned_kind")
    op.execute("ALTER INDEX ix_events_transition_node RENAME TO ix_events_partitioned_node")
    op.create_table(
        "events",
        sa.Column("seq", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("causation_seq", sa.BigInteger, nullable=True),
        sa.Column("payload", JSONB(), nullable=False),
    )
    op.execute(f"INSERT INTO events ({_COLUMNS}) SELECT {_COLUMNS} FROM events_partitioned")
    op.execute("DROP TABLE events_partitioned CASCADE")
    op.execute("DROP FUNCTION IF EXISTS sunkd_events_extend(bigint)")
    op.execute("DROP TABLE IF EXISTS sunkd_partitioning")
    op.create_index("ix_events_subject_seq", "events", ["subject", "seq"])
    op.create_index("ix_events_kind_seq", "events", ["kind", "seq"])
    op.execute("CREATE INDEX ix_events_transition_node ON events "
               "((payload->>'node'), seq) WHERE kind LIKE 'transition.%'")
    op.execute("CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events "
               "FOR EACH ROW EXECUTE FUNCTION sunkd_events_append_only()")
    op.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
               "FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only()")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    models = _read_models()
    for name in reversed(models.VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    _create_restored()
    if dialect == "postgresql":
        _partition_postgres()
    else:
        op.create_table(
            "sunkd_maintenance",
            sa.Column("operation", sa.Text, nullable=False),
            sa.Column("upto_seq", sa.Integer, nullable=False),
        )
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
        op.execute(SQLITE_DELETE_TRIGGER)
    op.execute(f"CREATE VIEW {HISTORY_VIEW} AS SELECT {_COLUMNS} FROM events "
               f"UNION ALL SELECT {_COLUMNS} FROM events_restored")
    _recreate_views(dialect, HISTORY_VIEW)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    models = _read_models()
    for name in reversed(models.VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.execute(f"DROP VIEW IF EXISTS {HISTORY_VIEW}")
    if dialect == "postgresql":
        _unpartition_postgres()
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
        op.execute(SQLITE_PLAIN_DELETE_TRIGGER)
        op.drop_table("sunkd_maintenance")
    op.drop_index("ix_events_restored_kind_seq", table_name="events_restored")
    op.drop_table("events_restored")
    _recreate_views(dialect, "events")
