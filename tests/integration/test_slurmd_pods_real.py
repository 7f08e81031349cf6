"""A Nodeset with spec.slurmd on real kubelet Nodes: sunkd's plan and actuators bring up one
slurmd pod per Slurm-owned node that registers with a real slurmctld (22.05, 24.11, 26.05),
and a lent node loses its pod only once Slurm reports it drained, idle and in contact.

Real: the control plane and three kubelets with their containerds (sunkd_testbed.kubelet),
the Nodeset CRD from manifests/, the Nodeset read back and parsed by sunkd's normalization,
sunkd's KubeClient, KubernetesActuator (lock = the owner taint) and ActuatorExecutor
(which asks slurmrestd again before a delete), slurmctld and slurmrestd of each generation.
Not the daemon: the test drives `policy.slurmd.plan` and the executor itself, with each
node's ownership phase given (SLURM, then TO_K8S for the lend), to look at the plan and
the actuators alone; test_slurmd_daemon_real.py runs `sunkd run` on the same bed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.slurmd import (
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    SlurmdNode,
    SlurmdNodeset,
    SlurmdStep,
    plan,
    slurmd_args,
)
from sunkd.domain.ports import ActionError
from sunkd.domain.state import OpenAction, Phase
from sunkd.kubernetes.actuator import KubernetesActuator
from sunkd.kubernetes.client import NODES, NODESETS, PODS, KubeClient
from sunkd.kubernetes.normalize import parse_nodeset, slim_nodeset
from sunkd.kubernetes.slurmd_pod import seen_pod
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed import images as images_mod
from sunkd_testbed.images import Image, ImageError
from sunkd_testbed.kubelet import KubeletNodes, available
from sunkd_testbed.kubernetes import KubeControlPlane
from sunkd_testbed.kubernetes import available as plane_available
from sunkd_testbed.slurm import SlurmCluster
from sunkd_testbed.slurmdpods import install_nodeset_crd, slurmd_nodeset, slurmd_started
from tests.conftest import require
from tests.integration.slurm_helpers import jwt_client, slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.kubelet]
ROOT = Path(__file__).resolve().parents[2]
NODES_N = 3
SLURM_NODES = [f"node{i + 1}" for i in range(NODES_N)]


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    for ok, why in (plane_available(), available()):
        require(ok, why)
    with KubeControlPlane(kubelet_client=True) as control_plane:
        yield control_plane


def _image(version: str) -> Image:
    try:
        return images_mod.slurm_image(version)
    except ImageError as error:
        require(False, str(error))
        raise


@pytest.fixture(scope="module")
def bed(plane: KubeControlPlane) -> Iterator[KubeletNodes]:
    nodes = KubeletNodes(plane, NODES_N, pause=images_mod.pause_image())
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(params=slurm_test_versions())
def generation(request: pytest.FixtureRequest, bed: KubeletNodes) -> Iterator[
        tuple[SlurmCluster, Image]]:
    """A Slurm cluster of one generation (22.05: the host's packages; 24.11 and 26.05 from
    their Debian roots) and its slurmd image, imported into every Node."""
    version: str = request.param
    image = _image(version)
    bed.import_images([image])
    yield from ((cluster, image) for cluster in start_cluster(
        f"node[1-{NODES_N}]", version=version))


_slurmd_started = slurmd_started


def _registered(cluster: SlurmCluster, node: str, before: str) -> bool:
    """IDLE through a slurmd that started after the host's was stopped (the pod's)."""
    return _slurmd_started(cluster, node) not in ("", before) and \
        cluster.node_flags(node) == "IDLE"


# A pod template (docs/nodeset.md, "Pod template"): an extra label, an init container from
# the same image writing into an emptyDir the slurmd container mounts (the template's
# volume and the merge onto the `slurmd` container).
TEMPLATE = {
    "metadata": {"labels": {"example.com/team": "hpc"}},
    "spec": {
        "initContainers": [{"name": "prep", "command": ["sh", "-c", "echo ok > /scratch/ready"],
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        "containers": [{"name": "slurmd",
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
}


def _nodeset(image: Image, cluster: SlurmCluster) -> dict[str, object]:
    obj = slurmd_nodeset(image, cluster)
    template = json.loads(json.dumps(TEMPLATE))
    for init in template["spec"]["initContainers"]:
        init.update(image=image.ref, imagePullPolicy="Never")
    obj["spec"]["slurmd"]["template"] = template  # type: ignore[index]
    return obj


async def _views(client: KubeClient, slurm: SlurmRestClient, bed: KubeletNodes,
                 phases: dict[str, Phase]) -> list[SlurmdNode]:
    """What the plan sees, read now from the API server and slurmrestd."""
    observed = {n.name: n.to_observed() for n in await slurm.get_nodes()}
    views = []
    for slurm_node, k8s in zip(SLURM_NODES, bed.names, strict=True):
        node = await client.get(NODES, k8s)
        taints = (node.get("spec") or {}).get("taints") or []
        pods, _ = await client.list(PODS, field_selector=f"spec.nodeName={k8s}")
        views.append(SlurmdNode(
            slurm_node, k8s, phases[slurm_node], observed.get(slurm_node),
            any(t.get("key") == "sunkd.io/owner" for t in taints),
            tuple(seen_pod(p) for p in pods)))
    return views


def _action(step: SlurmdStep, nodeset: SlurmdNodeset) -> OpenAction:
    return OpenAction(f"a-{step.verb}-{step.node}", None, wk.OWNER_KUBERNETES, step.verb,
                      step.node, 1, step.reason, slurmd_args(step, nodeset), time.time(), 0)


async def test_nodeset_slurmd_pods_register_and_a_lend_deletes_only_after_the_drain(
    bed: KubeletNodes, plane: KubeControlPlane, generation: tuple[SlurmCluster, Image]
) -> None:
    cluster, image = generation
    install_nodeset_crd(plane)
    before = {n: _slurmd_started(cluster, n) for n in SLURM_NODES}
    for name in SLURM_NODES:  # the host's slurmds go; the pods' take over
        cluster.kill_slurmd(name, sig=signal.SIGTERM)
    await asyncio.sleep(1.1)  # a pod's slurmd starts in a later second than the host's
    applied = time.monotonic()
    plane.kubectl("apply", "-f", "-", input=json.dumps(_nodeset(image, cluster)))
    async with await KubeClient.connect(str(plane.kubeconfig)) as client, \
            jwt_client(cluster) as slurm:
        obj = await client.get(NODESETS, "pods", "default")
        observed = parse_nodeset(slim_nodeset(obj))  # sunkd's own normalization
        assert observed.slurmd is not None and observed.uid
        nodeset = SlurmdNodeset("pods", "default", observed.uid, observed.slurmd)
        actuator = KubernetesActuator(client)
        executor = ActuatorExecutor(None, actuator, slurm_reader=slurm)
        phases = dict.fromkeys(SLURM_NODES, Phase.SLURM)
        for k8s in bed.names:
            await actuator.lock(k8s)  # a Slurm-owned node carries sunkd's owner taint
        steps = plan(nodeset, await _views(client, slurm, bed, phases), time.time(),
                     sources_fresh=True)
        assert [s.verb for s in steps] == [VERB_SLURMD_CREATE] * NODES_N, steps
        created = time.monotonic()
        for step in steps:
            assert await executor.execute(_action(step, nodeset), None) is True
        assert await executor.execute(_action(steps[0], nodeset), None) is False  # idempotent
        bed.wait("slurmd pods registered",
                 lambda: all(_registered(cluster, n, before[n]) for n in SLURM_NODES))
        registered = round(time.monotonic() - applied, 2)
        from_create = round(time.monotonic() - created, 2)
        for slurm_node in SLURM_NODES:  # the template's label and init container, run
            got = await client.get(PODS, f"pods-{slurm_node}", "default")
            assert got["metadata"]["labels"]["example.com/team"] == "hpc"
            (init,) = got["status"]["initContainerStatuses"]
            assert init["name"] == "prep" and init["state"]["terminated"]["exitCode"] == 0
            assert [c["name"] for c in got["spec"]["containers"]] == ["slurmd"]
            assert got["spec"]["nodeName"] in bed.names and got["spec"]["hostNetwork"] is True
        again = plan(nodeset, await _views(client, slurm, bed, phases), time.time(),
                     sources_fresh=True)
        assert [s.verb for s in again] == [""] * NODES_N
        assert all("registered" in s.reason for s in again), again

        # Lend node1 while a job runs there: no delete until Slurm reports it drained.
        job = cluster.sbatch(nodelist="node1", wrap="sleep 300")
        cluster.wait_for(lambda: cluster.node_flags("node1") in ("ALLOCATED", "MIXED"),
                         timeout=30, what="the job on node1")
        cluster.scontrol("update", "nodename=node1", "state=drain",
                         "reason=sunkd: lent to kubernetes [test]")
        phases["node1"] = Phase.TO_K8S
        busy = plan(nodeset, await _views(client, slurm, bed, phases), time.time(),
                    sources_fresh=True)
        assert [s.verb for s in busy] == [""] * NODES_N
        assert "drained, idle and in contact" in busy[0].reason, busy[0]
        pod = next(p for p in (await _views(client, slurm, bed, phases))[0].pods or ())
        forced = SlurmdStep("node1", VERB_SLURMD_DELETE, "test: a stale plan",
                            bed.names[0], pod.key, pod.uid)
        with pytest.raises(ActionError, match="not drained"):  # the executor asks Slurm
            await executor.execute(_action(forced, nodeset), None)
        assert bed.phase("pods-node1") == "Running"
        cluster.scancel(job)
        cluster.wait_for(lambda: cluster.node_flags("node1") == "IDLE+DRAIN", timeout=60,
                         what="node1 drained and idle")
        drained = time.monotonic()
        steps = plan(nodeset, await _views(client, slurm, bed, phases), time.time(),
                     sources_fresh=True)
        assert [s.verb for s in steps] == [VERB_SLURMD_DELETE, "", ""], steps
        assert steps[0].uid == pod.uid
        assert await executor.execute(_action(steps[0], nodeset), None) is True
        bed.wait("node1's slurmd pod gone", lambda: bed.phase("pods-node1") is None)
        deleted = round(time.monotonic() - drained, 2)
        assert bed.phase("pods-node2") == bed.phase("pods-node3") == "Running"
        cluster.wait_for(lambda: "NOT_RESPONDING" in cluster.node_flags("node1"),
                         timeout=60, what="slurmctld notices node1's slurmd is gone")
        print(f"\nNodeset spec.slurmd, Slurm {cluster.slurm_version}: {NODES_N} nodes "
              f"registered (IDLE) {registered} s after kubectl apply of the Nodeset "
              f"({from_create} s after the creates); a "
              f"lent node's pod gone {deleted} s after Slurm reported it drained")
        plane.kubectl("delete", "nodeset", "pods", "--wait=true", "--timeout=60s")
        # The garbage collector deletes the Nodeset's pods (its dependents).
        bed.wait("the Nodeset's pods gone",
                 lambda: all(bed.phase(f"pods-{n}") is None for n in SLURM_NODES))



@pytest.mark.parametrize(("auth", "version"), [
    ("munge", "22.05"), ("slurm", "24.11"), ("slurm", "26.05")])
async def test_slurmd_pod_authenticates_with_a_key_from_a_secret(
    bed: KubeletNodes, plane: KubeControlPlane, auth: str, version: str
) -> None:
    """`spec.slurmd.auth.keySecret` on the real kubelet: the cluster's key in a Secret, and
    the pod sunkd renders authenticates with it alone. munge (22.05): the pod runs its own
    munged as a native sidecar, the host's munged socket hidden from slurmd (an emptyDir
    over the cluster's munge directory). auth/slurm (24.11, 26.05; the cluster runs
    `AuthType=auth/slurm CredType=cred/slurm` and no munged): slurmd reads the Secret's
    key (SLURM_SACK_KEY), none beside its slurm.conf. Either way slurmd registers and
    `srun` runs in the pod."""
    from sunkd.kubernetes.slurmd_auth import SLURM_KEY_PATH
    from sunkd.kubernetes.slurmd_pod import render
    from sunkd.kubernetes.slurmd_spec import parse_slurmd
    from sunkd_testbed.slurmdpods import slurmd_spec

    require(version in slurm_test_versions(), f"Slurm {version} not selected")
    image = _image(version)
    node = bed.nodes[0]
    bed.import_images([image], [node])
    with contextlib.contextmanager(start_cluster)("node[1-3]", version=version,
                                                  auth=auth) as cluster:
        base = str(cluster.base)
        # slurmd's own configuration directory: the cluster's files but no slurm.key
        # (auth/slurm would read one beside slurm.conf), munged's socket where the
        # sidecar puts it (slurmctld logs a different config hash, nothing more).
        pod_etc = cluster.base / "pod-etc"
        shutil.copytree(cluster.base / "etc", pod_etc,
                        ignore=shutil.ignore_patterns("slurm.key"))
        (pod_etc / "slurm.conf").write_text(re.sub(
            r"(?m)^AuthInfo=socket=.*$", "AuthInfo=socket=/run/munge/munge.socket.2",
            cluster.slurm_conf.read_text()))
        key = cluster.slurm_key if auth == "slurm" else cluster.base / "munge" / "munge.key"
        plane.kubectl("create", "secret", "generic", "cluster-key",
                      f"--from-file={key.name}={key}")
        raw = slurmd_spec(image, cluster)
        raw["env"] = [{"name": "SLURM_CONF", "value": f"{pod_etc}/slurm.conf"}]
        if auth == "munge":
            raw["volumes"].append({"name": "no-host-munge", "emptyDir": {}})
            raw["volumeMounts"].append({"name": "no-host-munge",
                                        "mountPath": f"{base}/munge"})
        raw["auth"] = {"type": auth, "keySecret": {"name": "cluster-key"}}
        # Through the CRD on the real API server (its schema keeps `auth`), read back and
        # parsed as sunkd does; selecting no Node, nothing else acts on it.
        install_nodeset_crd(plane)
        nodeset = slurmd_nodeset(image, cluster, name="auth", selector={"none": "none"})
        nodeset["spec"]["slurmd"] = raw
        plane.kubectl("apply", "-f", "-", input=json.dumps(nodeset))
        async with await KubeClient.connect(str(plane.kubeconfig)) as client:
            spec = parse_nodeset(slim_nodeset(await client.get(NODESETS, "auth",
                                                               "default"))).slurmd
        plane.kubectl("delete", "nodeset", "auth")
        assert spec is not None and spec.auth is not None and spec.auth.type == auth
        assert spec == parse_slurmd(raw, "auth")
        pod = render(spec, nodeset="auth", namespace="default", nodeset_uid="not-a-nodeset",
                     slurm_node="node1", k8s_node=node.name, name="auth-node1")
        pod["metadata"].pop("ownerReferences")  # no Nodeset here: the pod alone
        before = slurmd_started(cluster, "node1")
        cluster.kill_slurmd("node1", sig=signal.SIGTERM)
        await asyncio.sleep(1.1)  # the pod's slurmd starts in a later second
        applied = time.monotonic()
        plane.kubectl("apply", "-f", "-", input=json.dumps(pod))
        try:
            bed.wait("node1 IDLE through the pod's slurmd",
                     lambda: _registered(cluster, "node1", before), timeout=120)
            registered = round(time.monotonic() - applied, 2)
            seen = bed.pod("auth-node1") or {}
            sidecars = seen["status"].get("initContainerStatuses") or []
            if auth == "munge":  # the sidecar runs; the host's socket is hidden, its own there
                assert [(s["name"], s["started"], "running" in s["state"])
                        for s in sidecars] == [("munged", True, True)], sidecars
                check = (f"test ! -e {base}/munge/run/munge.socket.2"
                         " && test -S /run/munge/munge.socket.2")
            else:  # no munged anywhere; the Secret's key is the only one slurmd can read
                assert sidecars == [] and "munged" not in cluster.daemon_pids()
                check = f"test ! -e {pod_etc}/slurm.key && test -r {SLURM_KEY_PATH}"
            # The step runs in slurmd's container (its PID 1).
            out = cluster.run("srun", "-w", "node1", "-N1", "sh", "-c",
                              f"{check} && cat /proc/1/comm", timeout=60)
            assert out.split()[-1] == "slurmd", out
        finally:
            plane.kubectl("delete", "pod", "auth-node1", "--wait=true", "--timeout=60s")
            plane.kubectl("delete", "secret", "cluster-key")
        print(f"\nslurmd pod, auth {auth} with the key from a Secret, Slurm "
              f"{cluster.slurm_version}: IDLE {registered} s after kubectl apply")
