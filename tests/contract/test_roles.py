"""The daemon's database role can only SELECT and INSERT on `events`
(UPDATE, DELETE, TRUNCATE, DETACH and DROP are refused by PostgreSQL's privileges, before
any trigger), while everything the daemon does works under it; the maintenance role,
which ran the migrations, can archive. The roles are made by the SQL `sunkd log grants`
prints, with unique names (roles are cluster-wide)."""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from sunkd.domain.events import Event, SlurmNodeObserved
from sunkd.store import archive, migrations_api
from sunkd.store.eventlog import EventLog, create_engine
from tests.conftest import fresh_postgres_database, postgres_base_url

# Loopback logins other than `postgres` need a password on a stock Debian cluster
# (pg_hba.conf: scram-sha-256), as they should in production: one per test run.
_PASSWORD = uuid.uuid4().hex


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role, password=_PASSWORD).render_as_string(
        hide_password=False)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(sql: str, url: str | None = None) -> None:
    connection = await asyncpg.connect(_dsn(url or postgres_base_url()), timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def test_daemon_role_cannot_rewrite_history(tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:10]
    daemon, maintenance = f"sunkd_t_d_{suffix}", f"sunkd_t_m_{suffix}"
    created = False
    try:
        async with fresh_postgres_database() as url:
            database = make_url(url).database
            assert database is not None
            setup, after = archive.grants_sql(database, daemon, maintenance)
            created = True
            await _admin(setup, url)  # as the superuser, on the new database
            await _admin(f"ALTER ROLE {daemon} PASSWORD '{_PASSWORD}';"
                         f"ALTER ROLE {maintenance} PASSWORD '{_PASSWORD}'", url)

            # The maintenance role migrates (so owns the tables) and grants.
            engine = create_engine(_as(url, maintenance))
            try:
                await migrations_api.upgrade(engine)
            finally:
                await engine.dispose()
            await _admin(after, _as(url, maintenance))
            # Small partitions (two seqs), made by their owner before the first append.
            await _admin("DO $$ DECLARE r record; BEGIN FOR r IN SELECT c.relname FROM "
                         "pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE "
                         "i.inhparent = 'events'::regclass AND c.relname <> 'events_default'"
                         " LOOP EXECUTE format('DROP TABLE %I', r.relname); END LOOP; END $$;"
                         "UPDATE sunkd_partitioning SET partition_size = 2;"
                         "SELECT sunkd_events_extend(2)", _as(url, maintenance))

            # The daemon's normal work, under its role.
            log = await EventLog.open(_as(url, daemon), migrate=False)
            try:
                lease = await log.acquire("daemon")
                assert lease is not None
                await log.append([Event("n1", SlurmNodeObserved(node="n1", state="IDLE"))
                                  for _ in range(3)], lease.epoch)
                lease = await log.renew(lease)
                for seq in (2, 3, 4):
                    await log.save_snapshot(seq, {"seq": seq}, keep=2)  # prunes: DELETE
                assert await log.snapshot_seqs() == [3, 4]
                assert len(await log.read()) == 4
                assert await log.origin() is not None
                await log.release(lease)
            finally:
                await log.close()

            connection = await asyncpg.connect(_dsn(_as(url, daemon)), timeout=5)
            try:
                parts = await connection.fetch(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = 'events'::regclass")
                first = parts[0]["relname"]
                for sql in ("UPDATE events SET kind = 'x'", "DELETE FROM events",
                            "TRUNCATE events", f'TRUNCATE "{first}"',
                            f'DELETE FROM "{first}"',
                            f'ALTER TABLE events DETACH PARTITION "{first}"',
                            f'DROP TABLE "{first}"', "DELETE FROM events_restored",
                            "SELECT sunkd_events_extend(100000000)",
                            "CREATE TABLE sneaky (x int)"):
                    # Refused by privileges (42501 permission denied / must be owner),
                    # not by the append-only trigger (whose message names sunkd).
                    with pytest.raises(asyncpg.InsufficientPrivilegeError) as refused:
                        await connection.execute(sql)
                    message = str(refused.value)
                    assert "append-only" not in message, (sql, message)
                    assert "permission denied" in message or "must be owner" in message, \
                        (sql, message)
                assert await connection.fetchval("SELECT count(*) FROM events") == 4
            finally:
                await connection.close()

            # The maintenance role archives (the partitions it created, two seqs each).
            log = await EventLog.open(_as(url, maintenance), migrate=False)
            try:
                result = await archive.archive(log, tmp_path, upto_seq=3)
                assert result is not None and result.partitions_dropped == ["events_s1"]
                assert (result.from_seq, result.upto_seq) == (1, 2)
                assert await log.live_range() == (3, 5)
            finally:
                await log.close()
    finally:
        if created:  # after the database (which held their objects) is dropped
            for role in (daemon, maintenance):
                await _admin(f'DROP ROLE IF EXISTS "{role}"')
