"""End to end against the real Kubernetes control plane: a real Slurm cluster, etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (built from Go modules;
sunkd_testbed.kubernetes), the real PostgreSQL, and sunkd's daemon, driven like production.

What the emulator version (test_e2e.py) fakes, this one does not: kube-scheduler places
the pool's pods (sunkd's owner taint alone keeps them off Slurm-owned nodes; the
sunkd-scheduler profile with sunkd's extender is tests/integration/test_real_scheduler.py),
the real disruption controller computes the PDB that blocks an eviction, the harness
kubelet (HarnessKubelet) reports bound pods Running and finishes evicted ones, and sunkd
talks to the API server with a bound token of its ServiceAccount, bound to
manifests/base/rbac.yaml as shipped. The API server's audit log then shows sunkd was refused
nothing (no 403) and used no verb outside API_CALLS.

Every test ends with test_e2e.assert_log_safe on the whole log.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sunkd.domain import wellknown as wk
from sunkd.domain.ownership import has_hold_taint, running_pods, slurm_drained
from sunkd.domain.state import ClusterState
from sunkd.kubernetes import kubeconfig as kubeconfig_module
from sunkd.kubernetes.actuator import API_CALLS
from sunkd.kubernetes.client import (
    NODES,
    PDBS,
    PODS,
    KubeApiError,
    KubeClient,
    ResourceType,
    nodesets,
)
from sunkd.runtime.config import KubernetesSettings
from sunkd.runtime.daemon import Daemon
from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed.demo import POOL, POOL_LABEL, nodeset_object, pod_object
from sunkd_testbed.kubernetes import HarnessKubelet, KubeControlPlane
from sunkd_testbed.slurm import SlurmCluster
from tests.conftest import require
from tests.integration.kube_backends import (
    SUNKD_NAMESPACE,
    bound_token,
    calls_made,
    forbidden,
    refused_as_unauthenticated,
    reset_real,
    revoke,
    sunkd_kubeconfig,
    sunkd_plane,
    write_atomically,
)
from tests.integration.test_e2e import (
    assert_log_safe,
    current_state,
    decision_story,
    migrated_database,
    read_all,
    reset_slurm,
    settings_for,
    spawn,
    write_config,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HOSTS = "rk[1-4]"
REPLICASETS = ResourceType("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
NAMESPACE = "default"  # the pool's pods (demo.pod_object)


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(HOSTS, partitions={"gpu": HOSTS}, slurmd_timeout=5)
    try:
        cluster.start()
    except Exception as error:
        require(False, f"cannot start a real Slurm cluster: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    with sunkd_plane(audit=True) as control_plane:
        yield control_plane


@dataclass
class World:
    """One test's Kubernetes side: the admin client, the kubelet stand-in with one Node
    per Slurm node (pool label, 2 CPUs: one pool pod each), sunkd's kubeconfig."""

    plane: KubeControlPlane
    admin: KubeClient
    kubelet: HarnessKubelet
    kubeconfig: Path
    names: list[str]

    def pod(self, name: str) -> dict[str, Any]:
        body = pod_object(name)
        body.pop("status", None)  # the scheduler writes it; a create would drop it anyway
        return body

    def replica_set(self, name: str, replicas: int) -> dict[str, Any]:
        """A ReplicaSet of the pool's pods: what serving pods come from in production."""
        template = self.pod(name)
        labels = template["metadata"]["labels"]
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": template["spec"]}}}

    async def pending_pods(self, count: int) -> list[str]:
        names = []
        for index in range(count):
            name = f"inference-{index}-{random.randrange(10**6)}"
            await self.admin.create(PODS, self.pod(name), NAMESPACE)
            names.append(name)
        return names

    async def pool_pods(self) -> list[dict[str, Any]]:
        items, _ = await self.admin.list(PODS, namespace=NAMESPACE,
                                         label_selector="app=inference")
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def bound_node(self, pod: str) -> str | None:
        try:
            got = await self.admin.get(PODS, pod, NAMESPACE)
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        node = (got.get("spec") or {}).get("nodeName")
        return str(node) if node else None


@pytest.fixture
async def world(plane: KubeControlPlane, slurm_cluster: SlurmCluster,
                tmp_path: Path) -> AsyncIterator[World]:
    admin = await KubeClient.connect(str(plane.kubeconfig))
    await reset_real(admin)
    kubelet = HarnessKubelet(plane, interval=0.2)
    await kubelet.__aenter__()
    try:
        for name in slurm_cluster.node_names:
            await kubelet.register_node(name, labels={POOL_LABEL: POOL}, cpu="2", memory="4Gi")
        kubelet.start()
        await admin.create(nodesets(), nodeset_object(
            "pool", dwellSeconds=1.0, maxInFlight=2, drainTimeoutSeconds=120,
            reclaimGraceSeconds=2), SUNKD_NAMESPACE)
        yield World(plane, admin, kubelet, sunkd_kubeconfig(plane, tmp_path / "sunkd.kubeconfig"),
                    list(slurm_cluster.node_names))
    finally:
        await kubelet.aclose()
        await reset_real(admin)
        await admin.close()


class Sunkd:
    """An in-process daemon on the real API server, with helpers to wait."""

    def __init__(self, daemon: Daemon, task: asyncio.Task[int]) -> None:
        self.daemon = daemon
        self.task = task

    def state(self) -> ClusterState:
        return self.daemon.state()

    def owner(self, node: str) -> str | None:
        found = self.state().nodes.get(node)
        return found.owner if found else None

    async def until(self, what: str, predicate: Callable[[], Any], within: float = 60) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.task.done():
                raise AssertionError(f"the daemon stopped while waiting for {what}: "
                                     f"{self.task.result()!r}")
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.2)
        owners = {n: (s.owner, s.phase, s.slurm.state if s.slurm else None,
                      s.slurm.flags if s.slurm else None) for n, s in self.state().nodes.items()}
        raise AssertionError(f"timed out waiting for {what}; nodes: {owners}")


@contextlib.asynccontextmanager
async def running_sunkd(database_url: str, cluster: SlurmCluster, world: World,
                        *, lease: bool = False, listen: str = "127.0.0.1:0",
                        **overrides: Any) -> AsyncIterator[Sunkd]:
    """The daemon on `settings_for` (with `overrides`, e.g. config-file `pools`)."""
    settings = settings_for(database_url, cluster, **overrides)
    settings = replace(settings, listen=listen,
                       kubernetes=KubernetesSettings(namespace=SUNKD_NAMESPACE,
                                                     kubeconfig=world.kubeconfig, lease=lease))
    slurm_client = SlurmRestClient.from_settings(settings.slurm)
    kube_client = await KubeClient.connect(str(world.kubeconfig))
    daemon = Daemon(settings, slurm_client=slurm_client, kube_client=kube_client,
                    slurm_env=cluster.env)
    task = asyncio.create_task(daemon.run())
    sunkd = Sunkd(daemon, task)
    try:
        await sunkd.until("all nodes adopted by Slurm", lambda: len(sunkd.state().nodes)
                          == len(cluster.node_names) and all(
                              n.owner == "slurm" and n.transition is None
                              for n in sunkd.state().nodes.values()), within=40)
        yield sunkd
    finally:
        daemon.stop_event.set()
        try:
            async with asyncio.timeout(30):
                assert await task == 0
        finally:
            await slurm_client.close()
            await kube_client.close()


def assert_rbac_sufficient(plane: KubeControlPlane) -> None:
    """sunkd's ServiceAccount was refused nothing, and used only what API_CALLS lists
    (so the ClusterRole, checked against API_CALLS by test_manifests.py, covers it)."""
    assert forbidden(plane) == []
    listed = {(c.verb, c.group, c.resource) for c in API_CALLS}
    made = calls_made(plane)
    assert made, "no request by sunkd's ServiceAccount in the audit log"
    assert made <= listed, f"calls outside API_CALLS: {sorted(made - listed)}"


async def test_lend_and_reclaim_with_the_real_scheduler_and_pdb(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    """The cycle of test_e2e.test_nodes_move_both_ways_and_pdbs_are_honoured: demand for one
    pool pod lends one node, kube-scheduler binds the pod there once sunkd untainted it; a
    PDB (status by the real disruption controller) blocks the reclaim's eviction until it
    is relaxed; then the node returns to Slurm and runs a job."""
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world) as sunkd:
            [pod] = await world.pending_pods(1)
            lent = await sunkd.until("the scheduler binds the pod to a lent node",
                                     lambda: world.bound_node(pod))
            await sunkd.until("the lend is recorded",
                              lambda: sunkd.owner(lent) == "kubernetes", within=10)
            await sunkd.until("the harness kubelet reports the pod Running", lambda: _phase(
                admin, pod), within=20)
            flags = slurm_cluster.node_flags(lent)
            assert "DRAIN" in flags.upper()
            assert slurm_drained(sunkd.state().nodes[lent].slurm)
            # The Nodeset status tells the same story to `kubectl get nds`.
            await sunkd.until("the Nodeset status counts the lent node", lambda: _counts(
                admin, "kubernetes", 1), within=15)
            # A PDB that allows no disruption blocks the eviction...
            await admin.create(PDBS, {
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "inference", "namespace": NAMESPACE},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "inference"}}},
            }, NAMESPACE)
            await sunkd.until("the disruption controller counts the pod", lambda: _pdb(
                admin, currentHealthy=1, disruptionsAllowed=0), within=20)
            # ...when Slurm wants every node back.
            for _ in slurm_cluster.node_names:
                slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")
            await sunkd.until("eviction refused by the PDB", lambda: any(
                key == "kubernetes/evict" and not o.succeeded and o.retryable
                for key, o in sunkd.state().nodes[lent].outcomes.items()), within=60)
            assert await world.bound_node(pod) == lent  # still there
            assert sunkd.owner(lent) == "kubernetes"
            # Relax the PDB: the eviction goes through, the node returns to Slurm.
            await admin.merge_patch(PDBS, "inference", {"spec": {"minAvailable": 0}}, NAMESPACE)
            await sunkd.until("the node is back in Slurm",
                              lambda: sunkd.owner(lent) == "slurm", within=90)
            assert await world.bound_node(pod) is None  # evicted, finished by the kubelet
            await sunkd.until("a job runs on the reclaimed node", lambda: any(
                word in slurm_cluster.node_states().get(lent, "").upper()
                for word in ("ALLOCATED", "MIXED")), within=30)
            node = await admin.get(NODES, lent)
            assert {(t["key"], t.get("value")) for t in node["spec"].get("taints") or []} >= {
                ("sunkd.io/owner", "slurm")}
        events = await read_all(database_url)
    assert_log_safe(events)
    assert "TransitionCompleted" in [type(e.payload).__name__ for e in events]
    assert_rbac_sufficient(world.plane)


async def test_a_pod_bound_after_the_node_left_its_nodeset_mid_reclaim_is_evicted_first(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    """Fail closed on unseen pods, against the real API server: mid-reclaim the node is
    relabelled out of its Nodeset and a pod is bound to it by spec.nodeName (no scheduler,
    tolerating every taint). sunkd still sees it (every Node's pods are reported) and
    evicts it before Slurm gets the node back."""
    from tests.integration.test_e2e_fail_closed import _evicted_before_resumed

    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world) as sunkd:
            [pod] = await world.pending_pods(1)
            lent = await sunkd.until("the scheduler binds the pod to a lent node",
                                     lambda: world.bound_node(pod))
            await sunkd.until("the lend is recorded",
                              lambda: sunkd.owner(lent) == "kubernetes", within=10)
            for _ in slurm_cluster.node_names:  # Slurm wants every node back
                slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")

            def reclaiming() -> bool:
                node = sunkd.state().nodes[lent]
                return node.transition is not None and node.transition.to_owner == "slurm"

            await sunkd.until("a reclaim starts", reclaiming, within=60)
            mark = sunkd.state().last_seq
            await admin.merge_patch(NODES, lent, {"metadata": {"labels": {POOL_LABEL: None}}})
            await admin.create(PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "late", "namespace": NAMESPACE},
                "spec": {"nodeName": lent, "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "web", "image": "web:1"}]},
            }, NAMESPACE)
            await sunkd.until("the node is back in Slurm", lambda:
                              sunkd.owner(lent) == "slurm"
                              and sunkd.state().nodes[lent].transition is None, within=120)
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, lent, f"{NAMESPACE}/late", mark)


async def _back_in_slurm(sunkd: Sunkd, node: str) -> None:
    await sunkd.until("the node is back in Slurm", lambda: sunkd.owner(node) == "slurm"
                      and sunkd.state().nodes[node].transition is None, within=120)


async def test_a_config_file_pools_lent_node_is_not_resumed_beside_its_pod(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    """Fail closed on unseen pods, against the real API server: a `[[pools]]` pool
    (partitions only, no Nodeset, so no selector attributes its Nodes). A pod bound by
    spec.nodeName to its lent node is seen, and evicted before a pin back to Slurm
    resumes the node."""
    from tests.integration.test_e2e_fail_closed import (
        _bound_pod,
        _config_pool,
        _evicted_before_resumed,
    )

    reset_slurm(slurm_cluster)
    admin = world.admin
    await admin.delete(nodesets(), "pool", SUNKD_NAMESPACE)  # the config file's pool only
    node = world.names[0]

    async def pin(to: str) -> None:
        await admin.merge_patch(NODES, node, {"metadata": {"annotations": {
            wk.ANNOTATION_PIN: to}}})

    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world,
                                 pools=(_config_pool(),)) as sunkd:
            await pin("kubernetes")
            await sunkd.until("the pinned node is lent", lambda:
                              sunkd.owner(node) == "kubernetes"
                              and sunkd.state().nodes[node].transition is None, within=60)
            body = _bound_pod("web", node)
            body.pop("status")  # the harness kubelet reports it Running
            await admin.create(PODS, body, NAMESPACE)
            await sunkd.until("sunkd sees the pod", lambda: running_pods(
                sunkd.state().nodes[node]) == [f"{NAMESPACE}/web"], within=30)
            mark = sunkd.state().last_seq
            await pin("slurm")
            await _back_in_slurm(sunkd, node)
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, node, f"{NAMESPACE}/web", mark)


async def test_an_identity_rival_fixed_later_never_erases_the_real_nodes_pod(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    """Fail closed on unseen pods, against the real API server: a second Node claims a
    lent node's Slurm name (a copy-paste typo in `sunkd.io/slurm-node-name`), reports no
    pods, and is fixed a moment later. The real Node's pod stays known and is evicted
    before Slurm gets the node back."""
    from tests.integration.test_e2e_fail_closed import _evicted_before_resumed

    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world) as sunkd:
            [pod] = await world.pending_pods(1)
            lent = await sunkd.until("the scheduler binds the pod to a lent node",
                                     lambda: world.bound_node(pod))
            await sunkd.until("sunkd sees the pod on the lent node", lambda:
                              sunkd.owner(lent) == "kubernetes" and running_pods(
                                  sunkd.state().nodes[lent]) == [f"{NAMESPACE}/{pod}"],
                              within=30)
            mark = sunkd.state().last_seq
            await world.kubelet.register_node("typo", labels={
                POOL_LABEL: POOL, wk.LABEL_SLURM_NODE_NAME: lent}, cpu="2", memory="4Gi")
            await sunkd.until("the identity conflict is seen", lambda:
                              "typo" in sunkd.state().nodes[lent].k8s_rivals, within=30)
            await asyncio.sleep(2)
            await admin.merge_patch(NODES, "typo", {"metadata": {"labels": {
                wk.LABEL_SLURM_NODE_NAME: "typo"}}})
            await sunkd.until("the rival is gone", lambda:
                              not sunkd.state().nodes[lent].k8s_rivals, within=30)
            assert running_pods(sunkd.state().nodes[lent]) == [f"{NAMESPACE}/{pod}"]
            for _ in slurm_cluster.node_names:  # Slurm wants every node back
                slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 30", partition="gpu")
            await _back_in_slurm(sunkd, lent)
        events = await read_all(database_url)
    assert_log_safe(events)
    _evicted_before_resumed(events, lent, f"{NAMESPACE}/{pod}", mark)


async def test_the_daemon_keeps_working_across_bound_token_rotations(
    world: World, slurm_cluster: SlurmCluster, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sunkd's kubeconfig names its ServiceAccount's bound token by `tokenFile`, as a pod's
    projected token is: three times the token is replaced and the old one revoked while
    the daemon leads (Lease) and watches. Each time the daemon's next request is refused
    (401), it reads the file again, and a new pool pod still gets a lent node (taints and
    annotations written, the Lease renewed, with the new token). The minute's re-read is
    pushed out of the way, so only the 401 path can find the new token."""
    monkeypatch.setattr(kubeconfig_module, "TOKEN_FILE_TTL_SECONDS", 3600.0)
    reset_slurm(slurm_cluster)
    token, secret = bound_token(world.plane)
    token_file = tmp_path / "sa-token"
    write_atomically(token_file, token)
    config = yaml.safe_load(world.kubeconfig.read_text())
    config["users"][0]["user"] = {"tokenFile": str(token_file)}
    world.kubeconfig.write_text(yaml.safe_dump(config))
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world, lease=True) as sunkd:
            refused = refused_as_unauthenticated(world.plane)
            lent: set[str] = set()
            for _ in range(3):
                new_token, new_secret = bound_token(world.plane)
                write_atomically(token_file, new_token)
                await revoke(world.plane, token, secret)
                token, secret = new_token, new_secret
                [pod] = await world.pending_pods(1)
                node = await sunkd.until("the scheduler binds the pod to a lent node",
                                         lambda: world.bound_node(pod))  # noqa: B023
                await sunkd.until("the lend is recorded", lambda: sunkd.owner(
                    node) == "kubernetes", within=10)  # noqa: B023
                lent.add(node)
            assert len(lent) == 3
            await asyncio.sleep(0.5)  # the audit backend writes in batches
            assert refused_as_unauthenticated(world.plane) - refused >= 3
        events = await read_all(database_url)
    assert_log_safe(events)
    assert_rbac_sufficient(world.plane)


async def test_busy_node_is_lent_only_after_its_job_ends(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    reset_slurm(slurm_cluster)
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world) as sunkd:
            busy = slurm_cluster.node_names[0]
            job = slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 8", nodelist=busy,
                                       partition="gpu")
            await sunkd.until("Slurm shows the job", lambda: (
                s := sunkd.state().nodes[busy].slurm) is not None
                and s.state in ("ALLOCATED", "MIXED"))
            # Demand for every node (one pod fills one node): the busy one waits for its job.
            pods = await world.pending_pods(len(slurm_cluster.node_names))
            await sunkd.until("the busy node is draining", lambda: (
                s := sunkd.state().nodes[busy].slurm) is not None and "DRAIN" in s.flags
                and s.state in ("ALLOCATED", "MIXED"), within=30)
            assert sunkd.owner(busy) == "slurm"
            assert busy not in {await world.bound_node(p) for p in pods}
            await sunkd.until("the busy node is lent after its job",
                              lambda: sunkd.owner(busy) == "kubernetes", within=60)

            async def all_bound() -> bool:
                return None not in {await world.bound_node(p) for p in pods}

            await sunkd.until("every pod bound, one per node", all_bound, within=30)
            assert {await world.bound_node(p) for p in pods} == set(world.names)
            assert job > 0
        events = await read_all(database_url)
    assert_log_safe(events)
    assert_rbac_sufficient(world.plane)


async def test_foreign_drain_and_not_ready_are_held_and_mirrored(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    reset_slurm(slurm_cluster)
    admin = world.admin
    async with migrated_database() as database_url:
        async with running_sunkd(database_url, slurm_cluster, world, lease=True) as sunkd:
            drained, not_ready = slurm_cluster.node_names[0], slurm_cluster.node_names[1]
            slurm_cluster.scontrol("update", f"nodename={drained}", "state=drain",
                                   "reason=admin: bad DIMM")
            await sunkd.until("the foreign drain is mirrored as sunkd's hold taint", lambda: (
                k := sunkd.state().nodes[drained].k8s) is not None and has_hold_taint(k)
                and not k.unschedulable)
            node = await admin.get(NODES, drained)
            assert node["metadata"]["annotations"]["sunkd.io/slurm-reason"] == "admin: bad DIMM"
            assert not node["spec"].get("unschedulable")
            # The kubelet reports NotReady (the node-lifecycle controller then taints it).
            await world.kubelet.set_ready(not_ready, False)
            await sunkd.until("NotReady mirrored as a sunkd drain in Slurm", lambda: (
                s := sunkd.state().nodes[not_ready].slurm) is not None and "DRAIN" in s.flags
                and (s.reason or "").startswith("sunkd: k8s"))
            await asyncio.sleep(3)
            assert "bad DIMM" in slurm_cluster.scontrol("show", "node", drained)
            slurm_cluster.scontrol("update", f"nodename={drained}", "state=resume")
            await world.kubelet.set_ready(not_ready, True)
            await sunkd.until("both holds cleared", lambda: not has_hold_taint(
                sunkd.state().nodes[drained].k8s)
                and "DRAIN" not in (((s := sunkd.state().nodes[not_ready].slurm) and s.flags)
                                    or ""), within=60)
        events = await read_all(database_url)
    assert_log_safe(events)
    assert_rbac_sufficient(world.plane)


async def test_kill_9_at_random_points_converges(
    world: World, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """test_e2e.s kill -9 run, shorter (6 rounds), with `sunkd run` processes on the real
    API server: killed mid-transition while they lead, the last one settles everything."""
    reset_slurm(slurm_cluster)
    rng = random.Random(20261201)
    admin = world.admin
    rounds = 6
    async with migrated_database() as database_url:
        config = write_config(tmp_path / "sunkd.toml", database_url, slurm_cluster,
                              world.kubeconfig)
        process: asyncio.subprocess.Process | None = None
        kills = kills_moving = 0
        try:
            for round_index in range(rounds):
                if round_index % 2 == 0:
                    await world.pending_pods(2)
                else:  # a job for every node: each node Kubernetes holds is wanted back
                    for pod in await world.pool_pods():
                        await admin.delete(PODS, pod["metadata"]["name"], NAMESPACE)
                    for _ in world.names:
                        slurm_cluster.sbatch("-N1", "--exclusive", wrap="sleep 3",
                                             partition="gpu")
                identity = f"crash-{round_index}"
                process = await spawn(config, slurm_cluster, identity)
                deadline = time.monotonic() + 15
                moving = False
                state = await current_state(database_url)
                while time.monotonic() < deadline:
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
            # Stable demand: Slurm's queue emptied, and two pods a real ReplicaSet keeps
            # (kube-controller-manager replaces one a reclaim the killed daemons started
            # still evicts; bare pods would be gone for good, and nothing left to settle).
            slurm_cluster.run("scancel", "--partition=gpu", check=False)
            for pod in await world.pool_pods():
                await admin.delete(PODS, pod["metadata"]["name"], NAMESPACE)
            await admin.create(REPLICASETS, world.replica_set("inference", 2), NAMESPACE)
            process = await spawn(config, slurm_cluster, "final")
            settled = False
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not settled:
                await asyncio.sleep(1)
                state = await current_state(database_url)
                running = [p for p in await world.pool_pods()
                           if (p.get("status") or {}).get("phase") == "Running"]
                settled = (state.leader_identity == "final" and len(running) == 2
                           and not state.pending_actions()
                           and all(n.transition is None for n in state.nodes.values()))
            pods = {p["metadata"]["name"]: (p["spec"].get("nodeName"),
                                            (p.get("status") or {}).get("phase"))
                    for p in await world.pool_pods()}
            nodes = {n: (s.owner, s.phase, s.transition) for n, s in state.nodes.items()}
            assert settled, (f"the cluster did not converge after the crashes: leader "
                             f"{state.leader_identity}, pods {pods}, nodes "
                             f"{nodes}, pending {state.pending_actions()}\n"
                             + decision_story(await read_all(database_url)))
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0
            process = None
        finally:
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
        events = await read_all(database_url)
    assert kills == rounds
    assert kills_moving >= rounds // 2, kills_moving
    assert_log_safe(events)
    assert len({e.epoch for e in events if e.epoch}) == rounds + 1
    assert_rbac_sufficient(world.plane)


async def _phase(admin: KubeClient, pod: str) -> bool:
    got = await admin.get(PODS, pod, NAMESPACE)
    return (got.get("status") or {}).get("phase") == "Running"


async def _counts(admin: KubeClient, owner: str, count: int) -> bool:
    nodeset = await admin.get(nodesets(), "pool", SUNKD_NAMESPACE)
    return bool(((nodeset.get("status") or {}).get("counts") or {}).get(owner) == count)


async def _pdb(admin: KubeClient, **expected: int) -> bool:
    pdb = await admin.get(PDBS, "inference", NAMESPACE)
    status = pdb.get("status") or {}
    return status.get("observedGeneration") == pdb["metadata"].get("generation") and all(
        status.get(k) == v for k, v in expected.items())
