"""End to end: a real Slurm cluster, the Kubernetes API emulator, the real PostgreSQL,
and sunkd's daemon, driven like production.

Every test ends with `assert_log_safe`, which checks the safety invariants on the
whole log: no node was unlocked for Kubernetes unless its last Slurm observation
showed it drained, no transition id was started twice or ended twice, and sunkd never
resumed a drain or lifted a cordon that was not its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    LeaderElected,
    RecordedEvent,
    SlurmNodeObserved,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.ownership import has_hold_taint, slurm_drained
from sunkd.domain.state import ClusterState
from sunkd.kubernetes.client import KubeClient
from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
from sunkd.runtime.daemon import Daemon
from sunkd.slurm.client import SlurmRestClient
from sunkd.store.eventlog import EventLog
from sunkd_testbed.demo import KubeStandIn, nodeset_object, pod_object, populate
from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.conftest import fresh_postgres_database, require

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES = "e2e[1-4]"


@pytest.fixture(scope="module")
def slurm_cluster() -> Any:
    from sunkd_testbed.slurm import SlurmCluster

    cluster = SlurmCluster(NODES, partitions={"gpu": NODES}, slurmd_timeout=5)
    try:
        cluster.start()
    except Exception as error:
        require(False, f"cannot start a real Slurm cluster: {error}")
    yield cluster
    cluster.stop()


def reset_slurm(cluster: Any) -> None:
    """Cancel jobs and clear every drain, so each test starts from idle nodes."""
    with contextlib.suppress(Exception):
        cluster.run("scancel", "--partition=gpu", check=False)
    for name in cluster.node_names:
        cluster.scontrol("update", f"nodename={name}", "state=resume", check=False)
    deadline = time.time() + 20
    while time.time() < deadline:
        states = cluster.node_states()
        if all(state.lower().startswith("idle") and "drain" not in state.lower()
               for state in states.values()):
            return
        time.sleep(0.2)


async def start_emulator(cluster: Any) -> KubeAPIEmulator:
    emulator = KubeAPIEmulator()
    await emulator.start()
    populate(emulator, cluster.node_names, nodeset_object(
        "pool", dwellSeconds=1.0, maxInFlight=2, drainTimeoutSeconds=120,
        reclaimGraceSeconds=2))
    return emulator


def settings_for(database_url: str, cluster: Any, **overrides: Any) -> Settings:
    return replace(
        Settings(database_url=database_url, listen="127.0.0.1:0", lease_seconds=3,
                 snapshot_every=50),
        slurm=SlurmSettings(url=cluster.rest_unix_url, poll_interval=1.0),
        kubernetes=KubernetesSettings(namespace="sunkd"),
        **overrides,
    )


class Running:
    """An in-process daemon plus the scheduler stand-in, with helpers to wait."""

    def __init__(self, daemon: Daemon, emulator: KubeAPIEmulator, cluster: Any,
                 task: asyncio.Task[int]) -> None:
        self.daemon = daemon
        self.task = task
        self.emulator = emulator
        self.cluster = cluster
        self.stand_in = KubeStandIn(emulator)

    def state(self) -> ClusterState:
        return self.daemon.state()

    async def until(self, what: str, predicate: Callable[[], bool], within: float = 60) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.task.done():
                raise AssertionError(f"the daemon stopped while waiting for {what}: "
                                     f"{self.task.result()!r}")
            self.stand_in.step()
            if predicate():
                return
            await asyncio.sleep(0.2)
        owners = {n: (s.owner, s.phase, s.slurm.state if s.slurm else None,
                      s.slurm.flags if s.slurm else None) for n, s in self.state().nodes.items()}
        raise AssertionError(f"timed out waiting for {what}; nodes: {owners}")

    def owner(self, node: str) -> str | None:
        found = self.state().nodes.get(node)
        return found.owner if found else None


@contextlib.asynccontextmanager
async def migrated_database() -> AsyncIterator[str]:
    """A fresh PostgreSQL database at the schema head (production never auto-migrates
    PostgreSQL: `sunkd migrate` runs first)."""
    async with fresh_postgres_database() as database_url:
        event_log = await EventLog.open(database_url, migrate=True)
        await event_log.close()
        yield database_url


@contextlib.asynccontextmanager
async def running_sunkd(database_url: str, cluster: Any, emulator: KubeAPIEmulator,
                        **overrides: Any) -> AsyncIterator[Running]:
    """The daemon on `settings_for` (with `overrides`, e.g. config-file `pools`)."""
    settings = settings_for(database_url, cluster, **overrides)
    slurm_client = SlurmRestClient.from_settings(settings.slurm)
    kube_client = KubeClient.for_url(emulator.url)
    daemon = Daemon(settings, slurm_client=slurm_client, kube_client=kube_client,
                    slurm_env=cluster.env)
    task = asyncio.create_task(daemon.run())
    running = Running(daemon, emulator, cluster, task)
    try:
        await running.until("all nodes adopted by Slurm", lambda: len(running.state().nodes)
                            == len(cluster.node_names) and all(
                                n.owner == "slurm" and n.transition is None
                                for n in running.state().nodes.values()), within=40)
        yield running
    finally:
        daemon.stop_event.set()
        try:
            async with asyncio.timeout(30):
                assert await task == 0
        finally:
            await slurm_client.close()
            await kube_client.close()


async def read_all(database_url: str) -> list[RecordedEvent]:
    event_log = await EventLog.open(database_url)
    try:
        return [event async for batch in event_log.read_range() for event in batch]
    finally:
        await event_log.close()


async def current_state(database_url: str) -> ClusterState:
    from sunkd.runtime.reconciler import load_state

    event_log = await EventLog.open(database_url)
    try:
        return (await load_state(event_log, from_snapshot=True))[0]
    finally:
        await event_log.close()


def decision_story(events: list[RecordedEvent], last: int = 60) -> str:
    """The last `last` decisions, actions and elections of a log, one per line: what a
    failed end-to-end assertion prints so the run says why, not only that, it failed."""
    lines = []
    for event in events:
        payload = event.payload
        if isinstance(payload, TransitionStarted | TransitionCompleted | TransitionAborted):
            lines.append(f"{event.seq} e{event.epoch} {payload.kind} {payload.node} "
                         f"{payload.from_owner}->{payload.to_owner}: {payload.reason}")
        elif isinstance(payload, ActionRequested):
            lines.append(f"{event.seq} e{event.epoch} {payload.side} {payload.verb} "
                         f"{payload.node} {payload.args}: {payload.reason}")
        elif isinstance(payload, ActionFailed):
            lines.append(f"{event.seq} e{event.epoch} failed {payload.verb} {payload.node}: "
                         f"{payload.error}")
        elif isinstance(payload, LeaderElected):
            lines.append(f"{event.seq} e{event.epoch} leader {payload.identity}")
    return "\n".join(lines[-last:])


def assert_log_safe(events: list[RecordedEvent]) -> None:
    last_slurm: dict[str, SlurmNodeObserved] = {}
    started: set[str] = set()
    ended: set[str] = set()
    for event in events:
        payload = event.payload
        if isinstance(payload, SlurmNodeObserved):
            last_slurm[payload.node] = payload
        elif isinstance(payload, TransitionStarted):
            assert payload.transition_id not in started, f"duplicate start {payload}"
            started.add(payload.transition_id)
        elif isinstance(payload, TransitionCompleted | TransitionAborted):
            assert payload.transition_id in started, f"end without start {payload}"
            assert payload.transition_id not in ended, f"ended twice {payload}"
            ended.add(payload.transition_id)
        elif isinstance(payload, ActionRequested):
            observed = last_slurm.get(payload.node)
            if payload.side == "kubernetes" and payload.verb == "unlock":
                assert slurm_drained(observed), (
                    f"seq {event.seq}: unlock of {payload.node} while Slurm said {observed}")
            if payload.side == "slurm" and payload.verb == "resume":
                assert observed is not None and (observed.reason or "").startswith("sunkd:"), (
                    f"seq {event.seq}: resume of a drain that is not ours: {observed}")


def pending_pods(emulator: KubeAPIEmulator, count: int) -> list[str]:
    names = []
    for index in range(count):
        pod = pod_object(f"inference-{index}-{random.randrange(10**6)}")
        names.append(emulator.create(pod, "default")["metadata"]["name"])
    return names


async def test_nodes_move_both_ways_and_pdbs_are_honoured(slurm_cluster: Any) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                # Kubernetes demand: one pending pool pod -> one node is lent.
                [pod] = pending_pods(emulator, 1)
                await sunkd.until("the pod runs on a lent node", lambda: bool(
                    emulator.get("pods", pod, "default")["spec"].get("nodeName")))
                lent = emulator.get("pods", pod, "default")["spec"]["nodeName"]
                # The stand-in may bind the pod the moment the taint is gone, a moment
                # before sunkd records the completed lend.
                await sunkd.until("the lend is recorded",
                                  lambda: sunkd.owner(lent) == "kubernetes", within=10)
                # /metrics: the Slurm poller's last good poll is recent, the lend counted.
                import aiohttp

                async with aiohttp.ClientSession() as session, session.get(
                        f"http://127.0.0.1:{sunkd.daemon.http_port}/metrics") as response:
                    metrics = await response.text()
                since = [line for line in metrics.splitlines() if line.startswith(
                    'sunkd_source_seconds_since_success{source="slurm"}')]
                assert since and float(since[0].split()[-1]) < 5, since
                assert "sunkd_leader 1.0" in metrics
                # The Nodeset status tells the same story to `kubectl get nds`.
                await sunkd.until("the Nodeset status counts the lent node", lambda: (
                    emulator.get("nodesets", "pool", "sunkd").get("status") or {}
                ).get("counts", {}).get("kubernetes") == 1, within=15)
                status = emulator.get("nodesets", "pool", "sunkd")["status"]
                entry = next(e for e in status["nodes"] if e["name"] == lent)
                assert (entry["owner"], entry["phase"]) == ("Kubernetes", "Kubernetes")
                assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
                flags = slurm_cluster.node_flags(lent)
                assert "DRAIN" in flags.upper()
                assert "sunkd:" in slurm_cluster.scontrol("show", "node", lent)
                # A PDB that allows no disruption blocks the eviction...
                emulator.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                 "metadata": {"name": "inference", "namespace": "default"},
                                 "spec": {"minAvailable": 1,
                                          "selector": {"matchLabels": {"app": "inference"}}}})
                # ...when Slurm wants every node back.
                for _ in slurm_cluster.node_names:
                    slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")
                await sunkd.until("eviction refused by the PDB", lambda: any(
                    key == "kubernetes/evict" and not o.succeeded and o.retryable
                    for key, o in sunkd.state().nodes[lent].outcomes.items()), within=60)
                assert emulator.get("pods", pod, "default")  # still there
                assert sunkd.owner(lent) == "kubernetes"
                # Relax the PDB: the eviction goes through, the node returns to Slurm.
                emulator.patch("poddisruptionbudgets", "inference",
                               {"spec": {"minAvailable": 0}}, "default")
                await sunkd.until("the node is back in Slurm",
                                  lambda: sunkd.owner(lent) == "slurm", within=90)
                assert not [p for p in emulator.list("pods", "default")
                            if p["metadata"]["name"] == pod]
                await sunkd.until("a job runs on the reclaimed node", lambda: "ALLOCATED" in
                                  slurm_cluster.node_states().get(lent, "").upper()
                                  or "MIXED" in slurm_cluster.node_states().get(lent, "").upper(),
                                  within=30)
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)
    kinds = [type(e.payload).__name__ for e in events]
    assert "TransitionCompleted" in kinds


async def test_busy_node_is_lent_only_after_its_job_ends(slurm_cluster: Any) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                busy = slurm_cluster.node_names[0]
                job = slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 8",
                                           nodelist=busy, partition="gpu")
                await sunkd.until("Slurm shows the job", lambda: (
                    s := sunkd.state().nodes[busy].slurm) is not None
                    and s.state in ("ALLOCATED", "MIXED"))
                # Demand for every node: the busy one must wait for its job.
                pending_pods(emulator, len(slurm_cluster.node_names))
                await sunkd.until("the busy node is draining", lambda: (
                    s := sunkd.state().nodes[busy].slurm) is not None and "DRAIN" in s.flags
                    and s.state in ("ALLOCATED", "MIXED"), within=30)
                assert sunkd.owner(busy) == "slurm"
                await sunkd.until("the busy node is lent after its job", lambda:
                                  sunkd.owner(busy) == "kubernetes", within=60)
                assert job > 0
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)


async def test_foreign_drain_and_not_ready_are_held_and_mirrored(slurm_cluster: Any) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        try:
            async with running_sunkd(database_url, slurm_cluster, emulator) as sunkd:
                drained, not_ready = slurm_cluster.node_names[0], slurm_cluster.node_names[1]
                slurm_cluster.scontrol("update", f"nodename={drained}", "state=drain",
                                       "reason=admin: bad DIMM")
                await sunkd.until("the foreign drain is mirrored as sunkd's hold taint", lambda: (
                    k := sunkd.state().nodes[drained].k8s) is not None and has_hold_taint(k)
                    and not k.unschedulable)
                node = emulator.get("nodes", drained)
                assert node["metadata"]["annotations"]["sunkd.io/slurm-reason"] == "admin: bad DIMM"
                emulator.patch("nodes", not_ready, {"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletDown"}]}},
                    subresource="status", patch_type="strategic")
                await sunkd.until("NotReady mirrored as a sunkd drain in Slurm", lambda: (
                    s := sunkd.state().nodes[not_ready].slurm) is not None and "DRAIN" in s.flags
                    and (s.reason or "").startswith("sunkd: k8s"))
                # The admin's drain is never touched by sunkd; lifting it lifts our cordon.
                await asyncio.sleep(3)
                assert "bad DIMM" in slurm_cluster.scontrol("show", "node", drained)
                slurm_cluster.scontrol("update", f"nodename={drained}", "state=resume")
                emulator.patch("nodes", not_ready, {"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}},
                    subresource="status", patch_type="strategic")
                await sunkd.until("both holds cleared", lambda: not has_hold_taint(
                    sunkd.state().nodes[drained].k8s)
                    and "DRAIN" not in (sunkd.state().nodes[not_ready].slurm
                                        or SlurmNodeObserved()).flags, within=60)
        finally:
            await emulator.stop()
        events = await read_all(database_url)
    assert_log_safe(events)


# ------------------------------------------------------------- separate processes


def write_config(path: Path, database_url: str, cluster: Any, kubeconfig: Path) -> Path:
    path.write_text(f"""
database_url = "{database_url}"
listen = "127.0.0.1:0"
lease_seconds = 3
snapshot_every = 40
[slurm]
url = "{cluster.rest_unix_url}"
poll_interval = 1
[kubernetes]
kubeconfig = "{kubeconfig}"
namespace = "sunkd"
""")
    return path


async def spawn(config: Path, cluster: Any, identity: str) -> asyncio.subprocess.Process:
    """`sunkd run` as its own process; its log goes to IDENTITY.log beside the config (in
    pytest's kept tmp_path, so a failed run leaves each daemon's own account)."""
    env = {**os.environ, **cluster.env, "SUNKD_IDENTITY": identity, "SUNKD_LOG_FORMAT": "json"}
    log_fd = os.open(config.parent / f"{identity}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o600)
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sunkd", "--config", str(config), "run",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log_fd)
    finally:
        os.close(log_fd)


async def test_kill_9_at_random_points_converges(slurm_cluster: Any, tmp_path: Path) -> None:
    reset_slurm(slurm_cluster)
    rng = random.Random(20261129)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        config = write_config(tmp_path / "sunkd.toml", database_url, slurm_cluster, kubeconfig)
        stand_in = KubeStandIn(emulator)
        process: asyncio.subprocess.Process | None = None
        kills = kills_moving = 0
        still: list[str] = []
        try:
            for round_index in range(20):
                # Flip demand every round so transitions are always in flight.
                if round_index % 2 == 0:
                    pending_pods(emulator, 2)
                else:
                    # A job for every node: each node Kubernetes holds is wanted back, so a
                    # reclaim starts however the last round's moves ended.
                    for pod in stand_in.pool_pods():
                        emulator.delete("pods", pod["metadata"]["name"], "default")
                    for _ in slurm_cluster.node_names:
                        slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 3",
                                             partition="gpu")
                identity = f"crash-{round_index}"
                process = await spawn(config, slurm_cluster, identity)
                # Kill it only once it leads, at a random moment while a transition
                # (or a requested action) is open. A new term decides nothing until both
                # sources have reported in it (docs/safety.md, I3): allow for that.
                deadline = time.monotonic() + 20
                moving = False
                while time.monotonic() < deadline:
                    stand_in.step()
                    state = await current_state(database_url)
                    if state.leader_identity == identity:
                        moving = any(n.transition is not None for n in state.nodes.values()) \
                            or bool(state.pending_actions())
                        if moving:
                            break
                    await asyncio.sleep(0.05)
                assert state.leader_identity == identity, f"{identity} never became leader"
                await asyncio.sleep(rng.uniform(0.0, 0.6))
                process.send_signal(signal.SIGKILL)
                await process.wait()
                kills += 1
                kills_moving += moving
                if not moving:
                    still.append(f"round {round_index}: nodes "
                                 f"{ {n: (s.owner, s.phase) for n, s in state.nodes.items()} }")
            # Stable demand, one last daemon: everything must settle. Slurm's queue is
            # emptied and two pods are wanted, replaced when evicted as their ReplicaSet
            # would: a reclaim a killed daemon started may still evict what lands on its
            # node before the taint does (that is the reclaim, not a failure to settle).
            slurm_cluster.run("scancel", "--partition=gpu", check=False)
            for pod in stand_in.pool_pods():
                emulator.delete("pods", pod["metadata"]["name"], "default")
            pending_pods(emulator, 2)
            process = await spawn(config, slurm_cluster, "final")
            settled = False
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not settled:
                pending_pods(emulator, 2 - len(stand_in.pool_pods()))
                stand_in.step()
                await asyncio.sleep(1)
                state = await current_state(database_url)
                running = [p for p in stand_in.pool_pods() if p["spec"].get("nodeName")]
                settled = (state.leader_identity == "final"
                           and len(running) == 2 and not state.pending_actions()
                           and all(n.transition is None for n in state.nodes.values()))
            assert settled, ("the cluster did not converge after the crashes:\n"
                             + decision_story(await read_all(database_url)))
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0
            process = None
        finally:
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
            await emulator.stop()
        events = await read_all(database_url)
    assert kills == 20
    # Most kills land mid-transition; the story says what the others saw.
    assert kills_moving >= 15, (kills_moving, still, decision_story(events, last=200))
    assert_log_safe(events)
    epochs = {e.epoch for e in events if e.epoch}
    assert len(epochs) == 21  # every killed process had led: 20 terms + the final one


async def test_two_daemons_one_database_exactly_one_acts(slurm_cluster: Any,
                                                         tmp_path: Path) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        emulator = await start_emulator(slurm_cluster)
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        config = write_config(tmp_path / "sunkd.toml", database_url, slurm_cluster, kubeconfig)
        first = await spawn(config, slurm_cluster, "first")
        second = await spawn(config, slurm_cluster, "second")
        try:
            await asyncio.sleep(8)
            pending_pods(emulator, 1)
            stand_in = KubeStandIn(emulator)
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                stand_in.step()
                await asyncio.sleep(0.2)
            events = await read_all(database_url)
            elected = [e.payload for e in events if e.kind == "leader.elected"]
            assert len(elected) == 1, elected
            writers = {e.epoch for e in events if e.epoch}
            assert writers == {elected[0].epoch}  # type: ignore[attr-defined]
            assert any(e.kind == "action.succeeded" for e in events)
            # The standby takes over when the leader dies.
            leader_identity = elected[0].identity  # type: ignore[attr-defined]
            victim, survivor = (first, second) if leader_identity == "first" else (second, first)
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                events = await read_all(database_url)
                if len([e for e in events if e.kind == "leader.elected"]) == 2:
                    break
                await asyncio.sleep(0.5)
            elected = [e.payload for e in events if e.kind == "leader.elected"]
            assert len(elected) == 2
            assert elected[1].identity != leader_identity  # type: ignore[attr-defined]
            survivor.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(survivor.wait(), 30) == 0
        finally:
            for process in (first, second):
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await emulator.stop()
    assert_log_safe(events)
