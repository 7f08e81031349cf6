"""The event log refuses appends while everything else works: readiness must say so.

With INSERT on `events` revoked from the daemon's role (PostgreSQL's privileges, the
roles `sunkd log grants` prints), every poll's append fails while the lease still
renews (an UPDATE of the leadership row). `/readyz` used to stay 200 "ready: leader",
`sunkd_source_fresh{source="slurm"}` 1, and the leader kept its lease, so a healthy
standby never took over. Slurm here is the fake slurmrestd of testbed/sunkd_testbed (the fault
is the database's, and PostgreSQL is real)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from sqlalchemy.engine import make_url

from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.store import archive, migrations_api
from sunkd.store.eventlog import create_engine
from sunkd_testbed.slurmrestd import FakeSlurmrestd
from tests.conftest import fresh_postgres_database
from tests.contract.test_roles import _PASSWORD, _admin, _as

pytestmark = pytest.mark.timeout(180)


@contextlib.asynccontextmanager
async def _roles() -> AsyncIterator[tuple[str, str, str]]:
    """A fresh database with the daemon and maintenance roles: (url, daemon, maintenance)."""
    suffix = uuid.uuid4().hex[:10]
    daemon, maintenance = f"sunkd_t_d_{suffix}", f"sunkd_t_m_{suffix}"
    created = False
    try:
        async with fresh_postgres_database() as url:
            database = make_url(url).database
            assert database is not None
            setup, after = archive.grants_sql(database, daemon, maintenance)
            created = True
            await _admin(setup, url)
            await _admin(f"ALTER ROLE {daemon} PASSWORD '{_PASSWORD}';"
                         f"ALTER ROLE {maintenance} PASSWORD '{_PASSWORD}'", url)
            engine = create_engine(_as(url, maintenance))
            try:
                await migrations_api.upgrade(engine)
            finally:
                await engine.dispose()
            await _admin(after, _as(url, maintenance))
            yield url, daemon, maintenance
    finally:
        if created:
            for role in (daemon, maintenance):
                await _admin(f'DROP ROLE IF EXISTS "{role}"')


def _settings(url: str, identity: str, slurm_url: str) -> Settings:
    return Settings(database_url=url, listen="127.0.0.1:0", lease_seconds=3,
                    identity=identity, slurm=SlurmSettings(url=slurm_url, poll_interval=0.2),
                    kubernetes=KubernetesSettings(enabled=False))


async def _until(what: str, check: Callable[[], object], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"not within {within} s: {what}")


async def test_refused_appends_make_readyz_503_and_the_leader_step_down() -> None:
    async with FakeSlurmrestd() as fake, _roles() as (url, role, maintenance), \
            aiohttp.ClientSession() as http:
        leader = Daemon(_settings(_as(url, role), "refused", fake.url))
        standby = Daemon(_settings(_as(url, maintenance), "healthy", fake.url))
        tasks = [asyncio.create_task(leader.run())]
        seen: dict[str, object] = {}

        async def probe(expect: int, fresh: float) -> bool:
            if leader.http_port is None:
                return False
            base = f"http://127.0.0.1:{leader.http_port}"
            async with http.get(f"{base}/readyz") as response:
                seen["readyz"] = (response.status, await response.text())
                status = response.status
            async with http.get(f"{base}/metrics") as response:
                metric = math.nan
                for line in (await response.text()).splitlines():
                    if line.startswith('sunkd_source_fresh{source="slurm"}'):
                        metric = float(line.split()[-1])
                seen["fresh"] = metric
            return status == expect and metric == fresh

        try:
            await _until("the leader ready and slurm fresh", lambda: probe(200, 1.0), 30)
            assert leader.is_leader()
            tasks.append(asyncio.create_task(standby.run()))
            await _until("the standby following", lambda: standby.http_port is not None, 30)

            await _admin(f"REVOKE INSERT ON events FROM {role}", _as(url, maintenance))
            fake.nodes[1]["state"] = ["ALLOCATED"]  # a change: every poll appends it
            await _until("/readyz 503 and slurm not fresh", lambda: probe(503, 0.0), 20)
            body = str(seen["readyz"])
            assert "append" in body and "permission denied" in body, body
            # A leader that cannot append for a lease's length gives up the lease...
            leadership = leader.leadership
            assert leadership is not None
            await _until("the refused leader stepping down",
                         lambda: not leadership.leading(), 30)
            assert leader.metrics.terms_ended.labels(
                cause="appends_refused")._value.get() == 1
            # ... and the healthy standby takes over and records the change.
            await _until("the standby leading", standby.is_leader, 30)
            # (No pools are configured: the nodes are folded as unpooled records.)
            await _until("the standby folding the change", lambda: (
                (node := standby.state().unpooled.get("gpu-a002")) is not None
                and node.slurm is not None and node.slurm.state == "ALLOCATED"), 30)
            assert leader.fatal_error is None, leader.fatal_error  # alive, a standby now
        finally:
            for daemon in (leader, standby):
                daemon.stop_event.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
