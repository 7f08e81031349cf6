"""Shared plumbing for the Kubernetes integration tests: the emulator over real HTTP, object
builders that go through the API (never the emulator's internals), and a fold of observation
events back into a cluster view."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

from sunkd.domain.events import (
    Event,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    Payload,
    SourceHealth,
)
from sunkd.kubernetes.client import NODES, PODS, KubeApiError, KubeClient, ResourceType

CRD_PATH = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "nodeset.yaml"


def node_body(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    ready: bool = True,
    cpu: str = "8",
    memory: str = "32Gi",
    gpus: str | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_body(
    namespace: str,
    name: str,
    labels: dict[str, str] | None = None,
    *,
    node: str | None = None,
    cpu: str = "1",
    memory: str = "1Gi",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/app:1",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


async def create_node(client: KubeClient, name: str, labels: dict[str, str] | None = None,
                      **kwargs: Any) -> dict[str, Any]:
    """Create a Node and report its status. On the real API server the TaintNodesByCondition
    admission plugin gives every new Node `node.kubernetes.io/not-ready:NoSchedule`, which
    the node-lifecycle controller lifts once it sees Ready=True (within ~50 ms here), or
    joins with `not-ready:NoExecute` when it sees Ready=False (within its monitor period):
    this returns once the controller is done with the new Node, so a test's watch never
    meets the controller's late writes."""
    body = node_body(name, labels, **kwargs)
    return await create_node_object(client, body, ready=kwargs.get("ready", True))


async def create_node_object(client: KubeClient, body: dict[str, Any], *,
                             ready: bool = True) -> dict[str, Any]:
    """`create_node` for a whole Node object (its status is written after the create)."""
    name = body["metadata"]["name"]
    created = await client.create(NODES, body)
    # Node status is a subresource: a create may drop it, so write it the way the kubelet does.
    if body.get("status"):
        await client.merge_patch(NODES, name, {"status": body["status"]}, subresource="status")

    def taints(node: dict[str, Any]) -> set[tuple[str, str]]:
        return {(str(t.get("key")), str(t.get("effect")))
                for t in (node.get("spec") or {}).get("taints") or []}

    if (NOT_READY_TAINT, "NoSchedule") not in taints(created):
        return created  # no admission taint: the API emulator, nothing will follow
    async with asyncio.timeout(20):
        if ready:
            while NOT_READY_TAINT in {key for key, _ in taints(created)}:
                await asyncio.sleep(0.02)
                created = await client.get(NODES, name)
        else:
            # A NotReady node also gets the NoExecute taint once the controller saw it.
            while (NOT_READY_TAINT, "NoExecute") not in taints(created):
                await asyncio.sleep(0.05)
                created = await client.get(NODES, name)
    return created


async def create_pod(client: KubeClient, namespace: str, name: str,
                     labels: dict[str, str] | None = None, *, node: str | None = None,
                     phase: str | None = None, **kwargs: Any) -> dict[str, Any]:
    created = await client.create(PODS, pod_body(namespace, name, labels, node=node, **kwargs),
                                  namespace)
    if phase is not None:
        await set_pod_phase(client, namespace, name, phase)
    return created


async def set_pod_phase(client: KubeClient, namespace: str, name: str, phase: str,
                        conditions: list[dict[str, Any]] | None = None) -> None:
    status: dict[str, Any] = {"phase": phase}
    if conditions is not None:
        status["conditions"] = conditions
    await client.merge_patch(PODS, name, {"status": status}, namespace, subresource="status")


async def mark_unschedulable(client: KubeClient, namespace: str, name: str) -> None:
    await set_pod_phase(client, namespace, name, "Pending", [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available"}])


def nodeset_body(namespace: str, name: str, *, node_selector: dict[str, str],
                 workload_selector: dict[str, str], partitions: Sequence[str] = ("batch",),
                 node_name_label: str | None = None, group: str, version: str,
                 ownership: dict[str, Any] | None = None) -> dict[str, Any]:
    slurm: dict[str, Any] = {"partitions": list(partitions)}
    if node_name_label:
        slurm["nodeNameLabel"] = node_name_label
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "Nodeset",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": node_selector,
            "workloadSelector": {"matchLabels": workload_selector},
            "slurm": slurm,
            "ownership": ownership or {"mode": "Auto"},
        },
    }


SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)


async def ensure_namespace(client: KubeClient, namespace: str) -> None:
    """Create the namespace (if needed). On a real API server also wait for its `default`
    ServiceAccount: the ServiceAccount admission plugin refuses pods until the controller
    made it (the emulator serves no ServiceAccounts and admits every pod)."""
    ns = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
    try:
        await client.create(ns, {"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": namespace}})
    except KubeApiError as error:
        if error.status != 409:
            raise
    async with asyncio.timeout(30):
        while True:
            try:
                await client.get(SERVICE_ACCOUNTS, "default", namespace)
                return
            except KubeApiError as error:
                if error.status != 404:
                    raise
                if error.reason != "NotFound" or not error.body.get("details"):
                    return  # the server serves no ServiceAccounts at all (the emulator)
            await asyncio.sleep(0.05)


class ListSink:
    """An EventSink that keeps every batch (used where a real log adds nothing)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.batches = 0
        self._changed = asyncio.Condition()

    async def __call__(self, batch: Sequence[Event]) -> None:
        self.events.extend(batch)
        self.batches += 1
        async with self._changed:
            self._changed.notify_all()

    def payloads(self, kind: type[Payload] | None = None) -> list[Payload]:
        return [e.payload for e in self.events if kind is None or isinstance(e.payload, kind)]

    async def wait_for(self, predicate: Any, within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))


def family(payload: Payload) -> tuple[str, str] | None:
    if isinstance(payload, K8sNodeObserved | K8sNodeVanished):
        return ("node", payload.node)
    if isinstance(payload, K8sWorkloadObserved):
        return ("workload", payload.node)
    if isinstance(payload, K8sDemandObserved):
        return ("demand", payload.pool)
    if isinstance(payload, K8sNodesetObserved):
        return ("nodeset", payload.pool)
    if isinstance(payload, SourceHealth):
        return ("health", payload.source)
    return None


def fold(payloads: Iterable[Payload]) -> dict[tuple[str, str], Payload]:
    """The cluster view the observation events describe: last payload per subject, with
    vanished nodes (and their pod reports), deleted Nodesets and empty workloads/demands
    removed."""
    state: dict[tuple[str, str], Payload] = {}
    for payload in payloads:
        key = family(payload)
        if key is None or key[0] == "health":
            continue
        gone = (
            isinstance(payload, K8sNodeVanished)
            or (isinstance(payload, K8sNodesetObserved) and payload.deleted)
            or (isinstance(payload, K8sWorkloadObserved) and not payload.pods)
            or (isinstance(payload, K8sDemandObserved) and not payload.pending)
        )
        if gone:
            state.pop(key, None)
            if isinstance(payload, K8sNodeVanished):  # its pod report goes with it
                state.pop(("workload", payload.node), None)
        else:
            state[key] = payload
    return state


def duplicates(payloads: Iterable[Payload]) -> list[Payload]:
    """Observations equal to the previous one for the same subject (must never happen)."""
    last: dict[tuple[str, str], Payload] = {}
    dups = []
    for payload in payloads:
        key = family(payload)
        if key is None:
            continue
        if last.get(key) == payload:
            dups.append(payload)
        last[key] = payload
    return dups


# ------------------------------------------------------------------------ emulator + CRD

CRDS = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                    "CustomResourceDefinition", namespaced=False)


def nodeset_crd() -> dict[str, Any]:
    """The project's Nodeset CRD (manifests/crds/nodeset.yaml)."""
    import yaml

    with CRD_PATH.open() as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    return next(d for d in docs if d.get("kind") == "CustomResourceDefinition")


def nodeset_resource() -> ResourceType:
    crd = nodeset_crd()
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage", True))
    return ResourceType(spec["group"], version, spec["names"]["plural"], spec["names"]["kind"],
                        namespaced=spec.get("scope", "Namespaced") == "Namespaced")


async def install_crd(client: KubeClient) -> ResourceType:
    """Create the CRD through the API (as `kubectl apply -f manifests/crds` would) and wait
    until the new endpoint answers."""
    try:
        await client.create(CRDS, nodeset_crd())
    except KubeApiError as error:
        if error.status != 409:
            raise
    rt = nodeset_resource()
    async with asyncio.timeout(10):
        while True:
            try:
                await client.list(rt)
                return rt
            except KubeApiError:
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_source(client: KubeClient, rt: ResourceType) -> AsyncIterator[
        tuple[Any, ListSink]]:
    """sunkd's KubernetesSource running on `client`, synced and idle; stopped on exit."""
    from sunkd.kubernetes.source import KubernetesSource

    sink = ListSink()
    source = KubernetesSource(client, sink, nodeset_resource=rt)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await source.wait_synced(10)
        await source.wait_idle(10)
        yield source, sink
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def running_emulator(**options: Any) -> AsyncIterator[Any]:
    from sunkd_testbed.kubeapi import KubeAPIEmulator

    emulator = KubeAPIEmulator(**options)
    await emulator.start("127.0.0.1")
    try:
        yield emulator
    finally:
        await emulator.stop()


async def retrying(factory: Any, attempts: int = 20) -> Any:
    """Run an admin call through injected faults (500s, 429s, dropped connections)."""
    import aiohttp

    for attempt in range(attempts):
        try:
            return await factory()
        except KubeApiError as error:
            if error.status < 500 and error.status != 429:
                raise
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.02 * (attempt + 1))
    return await factory()


def token_plugin(path: Path, token: str, *, fail_while: Path | None = None) -> Path:
    """An exec credential plugin at `path` answering with `token` in the apiVersion it is
    asked for (KUBERNETES_EXEC_INFO); it fails (exit 1) while `fail_while` exists."""
    failing = "" if fail_while is None else (
        f"if os.path.exists({str(fail_while)!r}):\n"
        "    sys.exit('cannot reach the identity provider')\n")
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n{failing}"
                    "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
                    "print(json.dumps({'apiVersion': info['apiVersion'], "
                    f"'kind': 'ExecCredential', 'status': {{'token': {token!r}}}}}))\n")
    path.chmod(0o755)
    return path


def write_exec_kubeconfig(emulator: Any, path: Path, plugin: Path,
                          api_version: str = "client.authentication.k8s.io/v1") -> Path:
    """The emulator's kubeconfig with a user whose credential comes from `plugin`."""
    config = emulator.kubeconfig()
    config["users"][0]["user"] = {"exec": {"apiVersion": api_version, "command": str(plugin)}}
    path.write_text(json.dumps(config))
    return path
