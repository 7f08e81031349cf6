"""Slurm hooks end to end: slurmctld runs `sunkd hook` as PrologSlurmctld and
EpilogSlurmctld (as SlurmUser, with the system python3: the hook is standard library
only), and sunkd's daemon, polling every 30 s so that a poll cannot explain what it
sees, observes job starts and ends at once (docs/slurm.md, "Hooks").

On the host's Slurm (22.05 here); test_slurm_hooks_versions.py runs the hooks on 24.11
and 26.05 inside their Debian roots.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

import pytest

from sunkd.domain.events import RecordedEvent, SlurmHookReceived, SlurmNodeObserved
from sunkd.domain.slurmnode import slurm_busy
from sunkd.kubernetes.client import KubeClient
from sunkd.runtime.config import KubernetesSettings, PoolSettings, SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.slurm import hook
from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed.demo import KubeStandIn
from sunkd_testbed.hooks import HookScripts as Hooks
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import start_cluster
from tests.integration.test_e2e import (
    migrated_database,
    pending_pods,
    read_all,
    reset_slurm,
    settings_for,
    start_emulator,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

NODES = "hk[1-3]"
POLL = 30.0  # far longer than any bound below: only a hook explains a quick observation
# Submission -> observation (Slurm's own scheduling included) and hook sent -> its
# record in the log, on a shared 2-core test machine; both far below POLL. The benchmark
# (bench/hooks.py) measures the real figures.
BOUND = 10.0
HOOK_BOUND = 2.0


@pytest.fixture(scope="module")
def hooks() -> Iterator[Hooks]:
    made = Hooks()
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture(scope="module")
def cluster(hooks: Hooks) -> Iterator[SlurmCluster]:
    yield from start_cluster(NODES, partitions={"gpu": NODES}, slurmd_timeout=5,
                             extra_conf=hooks.conf_lines)


@contextlib.asynccontextmanager
async def hooked_sunkd(database_url: str, cluster: SlurmCluster, hooks: Hooks, *,
                       fence: bool = False) -> AsyncIterator[Daemon]:
    settings = replace(
        settings_for(database_url, cluster),
        slurm=SlurmSettings(url=cluster.rest_unix_url, poll_interval=POLL,
                            hook_token_file=hooks.token_file, hook_fence=fence),
        kubernetes=KubernetesSettings(enabled=False),
        pools=(PoolSettings(name="hooks", partitions=("gpu",), mode="Slurm"),))
    client = SlurmRestClient.from_settings(settings.slurm)
    daemon = Daemon(settings, slurm_client=client, slurm_env=cluster.env)
    task = asyncio.create_task(daemon.run())
    try:
        await _until(lambda: daemon.is_leader() and len(daemon.state().nodes) == 3
                     and daemon.http_port is not None, 40, "sunkd leads and saw the nodes")
        hooks.configure(f"http://127.0.0.1:{daemon.http_port}", fence=fence)
        yield daemon
    finally:
        daemon.stop_event.set()
        try:
            async with asyncio.timeout(30):
                assert await task == 0
        finally:
            await client.close()


async def _until(predicate: Callable[[], bool], within: float, what: str,
                 every: float = 0.005) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if predicate():
            return time.monotonic() - started
        await asyncio.sleep(every)
    raise AssertionError(f"not within {within} s: {what}")


def _job_state(cluster: SlurmCluster, job: int) -> str:
    out = cluster.scontrol("show", "job", str(job), check=False)
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else ""


def _slurm(daemon: Daemon, node: str) -> SlurmNodeObserved | None:
    state = daemon.state().nodes.get(node)
    return state.slurm if state is not None else None


def _busy(daemon: Daemon, node: str) -> bool:
    observed = _slurm(daemon, node)
    return observed is not None and observed.state in ("ALLOCATED", "MIXED")


def _free(daemon: Daemon, node: str) -> bool:
    """Free as the policy sees it (`slurm_busy`): no job, not COMPLETING, and no CPUs
    allocated (22.05 still shows them allocated right after EpilogSlurmctld)."""
    observed = _slurm(daemon, node)
    return (observed is not None and observed.state == "IDLE"
            and not slurm_busy(observed) and observed.jobs == 0)


def _hook_batches(events: list[RecordedEvent], job: int) -> dict[str, list[RecordedEvent]]:
    """Per hook event of `job`: the events appended with its record (same recorded_at
    transaction: the observations just before it)."""
    found: dict[str, list[RecordedEvent]] = {}
    for index, event in enumerate(events):
        payload = event.payload
        if isinstance(payload, SlurmHookReceived) and payload.job_id == job:
            same = [e for e in events[:index] if e.recorded_at == event.recorded_at]
            found[payload.event] = [*same, event]
    return found


async def test_job_start_and_end_reach_sunkd_within_the_bound(
    cluster: SlurmCluster, hooks: Hooks
) -> None:
    hooks.site_exit(0)
    async with migrated_database() as database_url:
        async with hooked_sunkd(database_url, cluster, hooks) as daemon:
            await asyncio.sleep(0.5)  # let the first poll settle: the next is 30 s away
            job = cluster.sbatch(wrap="sleep 2", nodelist="hk2", partition="gpu")
            start = await _until(lambda: _busy(daemon, "hk2"), BOUND, "job start observed")
            end = await _until(lambda: _free(daemon, "hk2"), 2 + BOUND,
                               "job end observed (COMPLETING over)")
            metrics = daemon.metrics.render().decode()
        events = await read_all(database_url)
    batches = _hook_batches(events, job)
    assert set(batches) == {"prolog-slurmctld", "epilog-slurmctld"}, batches
    started = [e.payload for e in batches["prolog-slurmctld"]
               if isinstance(e.payload, SlurmNodeObserved) and e.subject == "hk2"]
    assert started and started[0].state in ("ALLOCATED", "MIXED") and started[0].jobs == 1
    # The end: the node's last observation is idle, not completing, and it came from a
    # hook's read (the end hook or its confirm reads), never from a poll.
    last = [e for e in events if e.subject == "hk2" and e.kind == "slurm.node.observed"][-1]
    assert isinstance(last.payload, SlurmNodeObserved) and last.payload.state == "IDLE"
    assert "COMPLETING" not in last.payload.flags
    assert start < BOUND and end < 2 + BOUND
    for batch in batches.values():
        record = batch[-1]
        assert isinstance(record.payload, SlurmHookReceived)
        assert record.payload.sent_at is not None
        assert record.recorded_at.timestamp() - record.payload.sent_at < HOOK_BOUND
    assert 'sunkd_slurm_hook_events_total{event="prolog-slurmctld",result="accepted"} 1.0' \
        in metrics
    assert "sunkd_slurm_hook_lag_seconds_count 2.0" in metrics
    # The chained site script ran with Slurm's environment.
    assert (hooks.marks / f"site.{job}").read_text().strip() == "hk2"


async def test_a_job_cancelled_on_a_draining_node_is_seen_free_without_a_poll(
    cluster: SlurmCluster, hooks: Hooks
) -> None:
    """What a lend waits for: the last job on a draining node is cancelled. 22.05 answers
    `GET node/{name}` right after EpilogSlurmctld with no job and no COMPLETING flag but
    the CPUs still allocated, and keeps answering so to single-node reads (only a read of
    every node refreshes it); the end hook's reads must still see the node free."""
    hooks.site_exit(0)
    async with migrated_database() as database_url:
        async with hooked_sunkd(database_url, cluster, hooks) as daemon:
            await asyncio.sleep(0.5)  # let the first poll settle: the next is 30 s away
            # As bench/hooks.py: every node runs a task of one array, one node drains.
            array = cluster.sbatch("-N1", "--exclusive", "--array=0-2", wrap="sleep 600",
                                   partition="gpu")
            await _until(lambda: all(_busy(daemon, n) for n in ("hk1", "hk2", "hk3")), BOUND,
                         "the array runs everywhere")
            await asyncio.sleep(1.0)
            cluster.scontrol("update", "nodename=hk3", "state=drain", "reason=test: drain")
            task = cluster.run("squeue", "-h", "-t", "R", "-w", "hk3", "-o", "%i").split()[0]
            try:
                cluster.run("scancel", task)
                await _until(lambda: _free(daemon, "hk3"), BOUND,
                             "the node free as the policy sees it (no CPUs allocated)")
            finally:
                cluster.scancel(array)
                cluster.scontrol("update", "nodename=hk3", "state=resume", check=False)
    observed = _slurm(daemon, "hk3")
    assert observed is not None and "DRAIN" in observed.flags


async def test_a_hooks_read_carries_every_change_it_sees(
    cluster: SlurmCluster, hooks: Hooks
) -> None:
    """A hook's read answers `GET /nodes` for every node: what changed on a node the hook
    does not name (here an administrator's drain, which no hook reports) enters the log
    with the read, not with the next poll 30 s later. Two tasks of one array start at
    once; the first prolog's read then serves the second node too."""
    hooks.site_exit(0)
    async with migrated_database() as database_url:
        async with hooked_sunkd(database_url, cluster, hooks) as daemon:
            await asyncio.sleep(0.5)  # let the first poll settle: the next is 30 s away
            cluster.scontrol("update", "nodename=hk3", "state=drain", "reason=test: admin")
            try:
                job = cluster.sbatch(wrap="sleep 1", nodelist="hk1", partition="gpu")
                await _until(lambda: _busy(daemon, "hk1"), BOUND, "the job start observed")
                observed = _slurm(daemon, "hk3")
                assert observed is not None and "DRAIN" in observed.flags, observed
            finally:
                cluster.scontrol("update", "nodename=hk3", "state=resume", check=False)
        events = await read_all(database_url)
    batch = _hook_batches(events, job)["prolog-slurmctld"]
    assert {e.subject for e in batch if isinstance(e.payload, SlurmNodeObserved)} >= {
        "hk1", "hk3"}, batch


async def test_a_hook_whose_read_changes_nothing_is_recorded_with_the_next_append(
    cluster: SlurmCluster, hooks: Hooks
) -> None:
    """The `slurm.hook` record of a read that found nothing new is not a commit of its
    own (on SQLite a commit is an fsync, and the write lock it holds delays the next
    reaction's appends): it goes into the log with the next append."""
    hooks.site_exit(0)
    async with migrated_database() as database_url:
        async with hooked_sunkd(database_url, cluster, hooks) as daemon:
            await asyncio.sleep(0.5)  # let the first poll settle: the next is 30 s away
            token = hooks.token_file.read_text().strip()
            status, _ = await asyncio.to_thread(
                hook.post, f"http://127.0.0.1:{daemon.http_port}", token,
                {"event": "prolog-slurmctld", "job_id": 999_999, "nodes": "hk1",
                 "sent_at": time.time()}, 5.0)
            assert status == 200
            await asyncio.sleep(0.3)  # its read is over long before
            cluster.sbatch(wrap="sleep 1", nodelist="hk2", partition="gpu")
            await _until(lambda: _busy(daemon, "hk2"), BOUND, "the job start observed")
        events = await read_all(database_url)
    [record] = [e for e in events if isinstance(e.payload, SlurmHookReceived)
                and e.payload.job_id == 999_999]
    assert isinstance(record.payload, SlurmHookReceived) and record.payload.changed == 0
    with_it = [e for e in events if e.recorded_at == record.recorded_at and e is not record]
    assert with_it, "the record was a transaction of its own"


async def test_jobs_run_when_sunkd_is_down(cluster: SlurmCluster, hooks: Hooks) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # nothing listens once closed
    hooks.configure(f"http://127.0.0.1:{closed}", fence=True)
    hooks.site_exit(0)
    job = cluster.sbatch(wrap="sleep 1", nodelist="hk3", partition="gpu")
    await _until(lambda: (hooks.marks / f"site.{job}").exists(), 20, "the prolog ran", 0.2)
    await _until(lambda: _job_state(cluster, job) == "COMPLETED", 30, "the job completed", 0.2)


async def test_fence_refuses_a_lent_node(cluster: SlurmCluster, hooks: Hooks) -> None:
    """The hook as slurmctld runs it (SlurmUser, Slurm's environment, the system python3)
    asks a real daemon that has just lent a node to Kubernetes: a job on that node is
    refused (exit 1), a job on Slurm's nodes is not. Slurm never starts a job on a node
    sunkd drained, so the refusal is shown here on the hook; what slurmctld does with a
    refusing prolog is `test_a_refusing_prolog_keeps_the_job_from_running`."""
    reset_slurm(cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(cluster)
        stand_in = KubeStandIn(emulator)
        settings = replace(
            settings_for(database_url, cluster),
            slurm=SlurmSettings(url=cluster.rest_unix_url, poll_interval=1.0,
                                hook_token_file=hooks.token_file, hook_fence=True))
        client = SlurmRestClient.from_settings(settings.slurm)
        kube = KubeClient.for_url(emulator.url)
        daemon = Daemon(settings, slurm_client=client, kube_client=kube, slurm_env=cluster.env)
        task = asyncio.create_task(daemon.run())

        def owned_by(owner: str) -> list[str]:
            stand_in.step()
            return [n.name for n in daemon.state().nodes.values()
                    if n.owner == owner and n.transition is None]

        try:
            await _until(lambda: len(owned_by("slurm")) == 3 and daemon.http_port is not None,
                         40, "every node Slurm's", 0.1)
            hooks.configure(f"http://127.0.0.1:{daemon.http_port}", fence=True)
            pending_pods(emulator, 1)
            await _until(lambda: bool(owned_by("kubernetes")), 60, "a node lent", 0.1)
            [lent] = owned_by("kubernetes")
            slurms = owned_by("slurm")
            refused = await _prolog_as_slurmctld(hooks, 901, f"{slurms[0]},{lent}")
            allowed = await _prolog_as_slurmctld(hooks, 902, ",".join(slurms))
            metrics = daemon.metrics.render().decode()
        finally:
            daemon.stop_event.set()
            try:
                async with asyncio.timeout(30):
                    assert await task == 0
            finally:
                await client.close()
                await kube.close()
                await emulator.stop()
                reset_slurm(cluster)
        # sunkd down: the fence allows everything.
        down = await _prolog_as_slurmctld(hooks, 903, lent)
    assert refused.returncode == 1, refused.stderr
    assert f"{lent}: owned by Kubernetes" in refused.stderr
    assert allowed.returncode == 0, allowed.stderr
    assert down.returncode == 0 and "Connection refused" in down.stderr
    assert 'result="fence_refused"} 1.0' in metrics and 'result="fence_allowed"} 1.0' in metrics


async def _prolog_as_slurmctld(hooks: Hooks, job: int, nodes: str
                               ) -> subprocess.CompletedProcess[str]:
    """prolog.sh the way slurmctld runs it: as SlurmUser, with only Slurm's variables."""
    user = hooks.token_file.owner()
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": nodes,
           "SLURM_JOB_PARTITION": "gpu"}
    command = ["runuser", "-u", user, "--", "env", "-i",
               *(f"{k}={v}" for k, v in env.items()), str(hooks.dir / "prolog.sh")]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True,
                                   timeout=60)


async def test_a_refusing_prolog_keeps_the_job_from_running(
    cluster: SlurmCluster, hooks: Hooks
) -> None:
    """What the fence relies on: a PrologSlurmctld exiting non-zero (here the chained site
    script, whose status the hook keeps) stops slurmctld from running the job."""
    await a_refusing_prolog_keeps_the_job_from_running(cluster, hooks)


async def a_refusing_prolog_keeps_the_job_from_running(cluster: SlurmCluster,
                                                       hooks: Hooks) -> None:
    reset_slurm(cluster)
    hooks.configure("http://127.0.0.1:9")
    hooks.site_exit(1)
    try:
        job = cluster.sbatch(wrap="sleep 1", nodelist="hk1", partition="gpu")
        await _until(lambda: (hooks.marks / f"site.{job}").exists(), 20, "the prolog ran", 0.2)
        await asyncio.sleep(3)
        show = cluster.scontrol("show", "job", str(job))
        assert "JobState=RUNNING" not in show and "JobState=COMPLETED" not in show, show
    finally:
        hooks.site_exit(0)
        reset_slurm(cluster)
