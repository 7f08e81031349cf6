"""The real Kubernetes control plane as bench/scale.py's Kubernetes (`--real-apiserver`).

`RealKube` starts `sunkd_testbed.kubernetes.KubeControlPlane` with only what the benchmark
needs, so the world stays as it was populated:
- etcd (no fsync; `--quota-backend-bytes` 8 GiB, as 100,000 pods and their status writes
  outgrow the default 2 GiB before the API server's compaction runs);
- kube-apiserver (the harness's flags, nothing added: the admin user is in system:masters,
  which API Priority and Fairness exempts, and 32-64 writes in flight are far below
  `--max-mutating-requests-inflight`'s 200);
- kube-controller-manager with only `serviceaccount-controller`, `serviceaccount-token-controller`
  and `namespace-controller` (pods are admitted only once their namespace has its `default`
  ServiceAccount). Not run: `node-lifecycle-controller` (with no kubelet renewing Leases it
  would mark every Node Unknown, taint it and evict its pods after a few minutes), the
  pod garbage collector, the taint-eviction controller, and every other controller;
- no kube-scheduler (the 1 % pending pods stay unbound, as on the emulator), no kubelet
  (the Nodes' Ready status is written once by the population, not renewed).

`populate()` writes the same world as `bench/kube_watch.populate` does in the emulator, over
HTTPS with the admin client certificate, `concurrency` requests in flight: the Nodeset CRD
(manifests/crds/nodeset.yaml), namespace `ml`, the 10 Nodesets, N Nodes (a status PATCH
after the create if the server dropped the status the create carried) and M pods; a bound
pod's status is then PATCHed (status subresource) to the emulator population's Running with
PodScheduled=True, since kube-apiserver resets a new pod's status to Pending.

`create()`, `delete_pod()` and `node_status()` are the writes of the benchmark's churn and
restart steps (the same calls work on the emulator through `EmulatorWrites`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kube_watch import crd_object, node_object, nodeset_objects, pod_object

from sunkd_testbed.kubernetes import KUBE_VERSION, KubeAPIError, KubeControlPlane

CONTROLLERS = "serviceaccount-controller,serviceaccount-token-controller,namespace-controller"
ETCD_QUOTA = 8 * 2**30
MERGE = "application/merge-patch+json"
NAMESPACE = "ml"


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


class KubeWrites(Protocol):
    """The writes bench/scale.py makes to Kubernetes after the population."""

    async def create(self, obj: dict[str, Any], namespace: str | None = None) -> None: ...

    async def delete_pod(self, name: str) -> None: ...

    async def node_status(self, name: str, status: dict[str, Any]) -> None: ...


class EmulatorWrites:
    """`KubeWrites` on the in-process emulator (`KubeAPIEmulator`): in-process calls."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def create(self, obj: dict[str, Any], namespace: str | None = None) -> None:
        self.api.create(obj, namespace)

    async def delete_pod(self, name: str) -> None:
        self.api.delete("pods", name, NAMESPACE)

    async def node_status(self, name: str, status: dict[str, Any]) -> None:
        self.api.patch("nodes", name, {"status": status}, subresource="status")


def _collection(obj: dict[str, Any], namespace: str | None) -> str:
    """The collection path a create of `obj` POSTs to (the kinds this benchmark writes)."""
    kind = obj["kind"]
    plural = {"Node": "nodes", "Pod": "pods", "Namespace": "namespaces", "Nodeset": "nodesets",
              "CustomResourceDefinition": "customresourcedefinitions"}[kind]
    version = obj["apiVersion"]
    prefix = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    if namespace is not None:
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"


def _ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


class RealKube:
    """A real control plane (see the module docstring) and an admin HTTPS session."""

    def __init__(self, concurrency: int = 48) -> None:
        self.concurrency = concurrency
        self.plane = KubeControlPlane(
            scheduler=False, controllers=CONTROLLERS,
            extra_args={"etcd": [f"--quota-backend-bytes={ETCD_QUOTA}"]})
        self.session: aiohttp.ClientSession | None = None
        self.node_status_patches = 0

    @property
    def version(self) -> str:
        return self.plane.server_version or KUBE_VERSION

    async def start(self) -> None:
        await asyncio.to_thread(self.plane.start)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.plane.ssl_context(),
                                           limit=self.concurrency),
            timeout=aiohttp.ClientTimeout(total=120))

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
        await asyncio.to_thread(self.plane.stop)

    def write_kubeconfig(self, path: Path) -> Path:
        return self.plane.write_kubeconfig(path)

    def rss(self) -> dict[str, float]:
        """Each component's RSS in MB (etcd, kube-apiserver, kube-controller-manager)."""
        return {name: rss_mb(pid) for name, pid in self.plane.pids.items()}

    # ------------------------------------------------------------------ HTTP

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                      content_type: str = "application/json",
                      ok: Iterable[int] = (200, 201)) -> dict[str, Any]:
        assert self.session is not None, "RealKube.start() first"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(5):
            async with self.session.request(
                    method, self.plane.url + path, data=data,
                    headers={"Content-Type": content_type, "Accept": "application/json"},
            ) as response:
                text = await response.text()
                if response.status in set(ok):
                    result: dict[str, Any] = json.loads(text) if text else {}
                    return result
                # 429 (APF) or 5xx under load: back off and retry; anything else is a bug.
                retry = response.status == 429 or response.status >= 500
                if not retry or attempt == 4:
                    raise KubeAPIError(method, path, response.status, text)
            await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def create(self, obj: dict[str, Any], namespace: str | None = None) -> None:
        """Create `obj` and keep the status it carries, as the emulator's create does:
        kube-apiserver resets a new pod's status to Pending, so a bound pod's status is
        PATCHed after (status subresource); a Node created without a Ready status too."""
        created = await self._create(obj, namespace)
        status = obj.get("status")
        if not status:
            return
        name = obj["metadata"]["name"]
        if obj["kind"] == "Node" and not _ready(created):
            await self.node_status(name, status)
            self.node_status_patches += 1
        elif obj["kind"] == "Pod" and obj["spec"].get("nodeName") and \
                (created.get("status") or {}).get("phase") != status.get("phase"):
            await self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                               {"status": status}, content_type=MERGE)

    async def _create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return await self.request("POST", _collection(obj, namespace), obj)

    async def delete_pod(self, name: str) -> None:
        # Grace 0: there is no kubelet to finalize a graceful deletion.
        await self.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                           {"apiVersion": "v1", "kind": "DeleteOptions",
                            "gracePeriodSeconds": 0}, ok=(200, 202, 404))

    async def node_status(self, name: str, status: dict[str, Any]) -> None:
        await self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                           content_type=MERGE)

    # ------------------------------------------------------------------ population

    async def _run_all(self, jobs: Iterator[Callable[[], Awaitable[None]]]) -> None:
        """Run the jobs with `concurrency` in flight (workers share one iterator)."""
        async def worker() -> None:
            for job in jobs:
                await job()

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def _job(self, obj: dict[str, Any],
             namespace: str | None = None) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            await self.create(obj, namespace)
        return job

    async def _wait_namespace_ready(self, crd: dict[str, Any], within: float = 60) -> None:
        """The CRD established and namespace `ml`'s default ServiceAccount made."""
        group, version = crd["spec"]["group"], crd["spec"]["versions"][0]["name"]
        deadline = time.monotonic() + within
        while True:
            try:
                await self.request("GET", f"/apis/{group}/{version}/namespaces/{NAMESPACE}/"
                                   f"{crd['spec']['names']['plural']}")
                await self.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/"
                                   "default")
                return
            except KubeAPIError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def populate(self, nodes: int, pods: int) -> dict[str, float]:
        """The emulator population's world (module docstring); returns seconds per part."""
        started = time.perf_counter()
        crd = crd_object()
        await self._create(crd)
        await self._create({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": NAMESPACE}})
        await self._wait_namespace_ready(crd)
        for nodeset in nodeset_objects(crd):
            await self._create(nodeset, NAMESPACE)
        setup = time.perf_counter()

        await self._run_all(self._job(node_object(n)) for n in range(nodes))
        nodes_done = time.perf_counter()
        await self._run_all(self._job(pod_object(i, nodes), NAMESPACE) for i in range(pods))
        done = time.perf_counter()
        return {"setup_s": round(setup - started, 1), "nodes_s": round(nodes_done - setup, 1),
                "pods_s": round(done - nodes_done, 1), "total_s": round(done - started, 1)}
