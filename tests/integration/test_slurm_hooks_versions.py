"""Slurm hooks on the newer Slurm generations (24.11 from Debian 13, 26.05 from sid), run
as slurmctld runs them there: inside the generation's Debian root, as its SlurmUser, with
the root's own python3 (the hook is standard library only), configured as these versions
allow (several `PrologSlurmctld=`/`EpilogSlurmctld=` lines: the site's script, then the
hook's, no `--chain`). The host's 22.05 is covered,
with the fence and the confirm reads, by test_slurm_hooks.py; here each generation shows
that its slurmctld runs the prolog and epilog, that both reach sunkd well before a poll
could, and that a refusing prolog still keeps a job from running (what the fence needs).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunkd.domain.events import SlurmHookReceived
from sunkd_testbed.hooks import HookScripts as Hooks
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import start_cluster
from tests.integration.test_e2e import migrated_database, read_all, reset_slurm
from tests.integration.test_slurm_hooks import (
    BOUND,
    HOOK_BOUND,
    NODES,
    _busy,
    _free,
    _until,
    a_refusing_prolog_keeps_the_job_from_running,
    hooked_sunkd,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


@pytest.fixture(scope="module", params=["24.11", "26.05"])
def hooked_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[SlurmCluster, Hooks]]:
    version: str = request.param
    base = Path(tempfile.mkdtemp(prefix="sunkd-slurm-"))
    try:
        # In the cluster's directory (the root sees it at the same path), run with the
        # root's python3 as its SlurmUser, on slurm.conf lines of their own.
        hooks = Hooks.for_slurm(version, base, chain=False)
        for cluster in start_cluster(NODES, partitions={"gpu": NODES}, version=version,
                                     base_dir=base, extra_conf=hooks.conf_lines):
            yield cluster, hooks
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_job_start_and_end_reach_sunkd_from_the_roots_slurmctld(
    hooked_cluster: tuple[SlurmCluster, Hooks]
) -> None:
    cluster, hooks = hooked_cluster
    reset_slurm(cluster)
    hooks.site_exit(0)
    async with migrated_database() as database_url:
        async with hooked_sunkd(database_url, cluster, hooks) as daemon:
            await asyncio.sleep(0.5)  # the first poll settles: the next is 30 s away
            job = cluster.sbatch(wrap="sleep 2", nodelist="hk2", partition="gpu")
            start = await _until(lambda: _busy(daemon, "hk2"), BOUND, "job start observed")
            end = await _until(lambda: _free(daemon, "hk2"), 2 + BOUND,
                               "job end observed (COMPLETING over)")
        events = await read_all(database_url)
    records = [e for e in events if isinstance(e.payload, SlurmHookReceived)
               and e.payload.job_id == job]
    assert {r.payload.event for r in records} == {"prolog-slurmctld", "epilog-slurmctld"}
    for record in records:
        assert isinstance(record.payload, SlurmHookReceived)
        assert record.payload.sent_at is not None
        assert record.recorded_at.timestamp() - record.payload.sent_at < HOOK_BOUND
    assert start < BOUND and end < 2 + BOUND
    # The site's own script (its own slurm.conf line) ran inside the root with Slurm's
    # environment.
    assert (hooks.marks / f"site.{job}").read_text().strip() == "hk2"


async def test_a_refusing_prolog_keeps_the_job_from_running(
    hooked_cluster: tuple[SlurmCluster, Hooks]
) -> None:
    await a_refusing_prolog_keeps_the_job_from_running(*hooked_cluster)
