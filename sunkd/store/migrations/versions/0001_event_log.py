"""Event log, leadership lease and snapshots.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
SeqType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# The log is the system of record: on PostgreSQL the database itself refuses to
# rewrite history, whatever a buggy or malicious client sends.
APPEND_ONLY_FUNCTION = """
CREATE OR REPLACE FUNCTION sunkd_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'sunkd: the events table is append-only (% rejected)', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$
"""


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("seq", SeqType, sa.Identity(always=False), primary_key=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("causation_seq", sa.BigInteger, nullable=True),
        sa.Column("payload", JSONType, nullable=False),
    )
    op.create_index("ix_events_subject_seq", "events", ["subject", "seq"])
    op.create_index("ix_events_kind_seq", "events", ["kind", "seq"])
    op.create_table(
        "leadership",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("holder", sa.Text, nullable=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_seconds", sa.Float, nullable=False),
    )
    # One row, created here so that every append can lock it (fencing + ordering).
    op.execute("INSERT INTO leadership (id, holder, epoch, renewed_at, lease_seconds) "
               "VALUES (1, NULL, 0, NULL, 15)")
    op.create_table(
        "snapshots",
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", JSONType, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_ONLY_FUNCTION)
        op.execute("CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events "
                   "FOR EACH ROW EXECUTE FUNCTION sunkd_events_append_only()")
        op.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
                   "FOR EACH STATEMENT EXECUTE FUNCTION sunkd_events_append_only()")
    else:
        # SQLite has no TRUNCATE; UPDATE and DELETE get the same refusal.
        for operation in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER events_no_{operation.lower()} BEFORE {operation} ON events "
                       f"BEGIN SELECT RAISE(ABORT, 'sunkd: the events table is append-only "
                       f"({operation} rejected)'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_no_truncate ON events")
        op.execute("DROP TRIGGER IF EXISTS events_no_update_delete ON events")
        op.execute("DROP FUNCTION IF EXISTS sunkd_events_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_update")
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
    op.drop_table("snapshots")
    op.drop_table("leadership")
    op.drop_index("ix_events_kind_seq", table_name="events")
    op.drop_index("ix_events_subject_seq", table_name="events")
    op.drop_table("events")
