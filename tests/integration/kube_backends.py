"""The Kubernetes contract suite's two backends: the API emulator and the real control plane.

A test that takes the `kube` fixture runs once per backend (`kube_backend`, a module-scoped
parameter, so pytest runs a module's emulator pass, then its real pass):

- `emulator`: a fresh `KubeAPIEmulator` per test (sunkd_testbed.kubeapi), over HTTP;
- `real`: kube-apiserver, etcd and kube-controller-manager built from Go modules
  (sunkd_testbed.kubernetes; docs/kubernetes-build.md), one plane per module (bring-up
  ~3.5 s), emptied after every test (`reset_real`): Nodes, and in every namespace Pods
  (force-deleted), Events, PDBs, Leases and Nodesets. No kube-scheduler (pods stay where a
  test puts them, as on the emulator); the controller manager runs every controller, so
  PDB status comes from the real disruption controller and Nodes get the real admission
  taints. Nodes are not marked Unknown for lack of a kubelet within a module's lifetime
  (node-monitor-grace-period 1 h).

`SUNKD_TEST_KUBE_BACKENDS=emulator` (or `real`) narrows the list. The real pass skips
when the binaries are not built, and fails in strict mode (tests/conftest.py `require`).

Some faults only the emulator can inject on demand (409s, 429/500 storms, slow responses,
forced 410s), and only it keeps a request log: those tests carry
`@pytest.mark.emulator_only("why")` and run on the emulator alone. Watch cuts and a real
410 on the real server come from `CuttingProxy` (a TCP proxy that drops connections) and
`KubeControlPlane.restart_apiserver()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sunkd.kubernetes.client import NODES, KubeApiError, KubeClient
from sunkd_testbed.kubeapi import KubeAPIEmulator
from sunkd_testbed.kubernetes import KubeControlPlane, available
from tests.conftest import require
from tests.integration.kubeapi_support import Raw

BACKENDS = ("emulator", "real")
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
MARKER = "emulator_only"


def kube_test_backends() -> list[str]:
    """The backends to run (`SUNKD_TEST_KUBE_BACKENDS`, comma separated; default both)."""
    wanted = os.environ.get("SUNKD_TEST_KUBE_BACKENDS", "")
    names = [n.strip() for n in wanted.split(",") if n.strip()] or list(BACKENDS)
    unknown = set(names) - set(BACKENDS)
    if unknown:
        raise ValueError(f"SUNKD_TEST_KUBE_BACKENDS: unknown backend(s) {sorted(unknown)}")
    return names


def parametrize_backends(metafunc: pytest.Metafunc) -> None:
    """pytest_generate_tests: `kube_backend` per backend, emulator only where marked."""
    if "kube_backend" not in metafunc.fixturenames:
        return
    only_emulator = metafunc.definition.get_closest_marker(MARKER) is not None
    backends = ["emulator"] if only_emulator else kube_test_backends()
    metafunc.parametrize("kube_backend", backends, indirect=True, scope="module")


def register_marker(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(why): needs a fault only the API emulator injects on demand (409s, "
        "429/500 storms, slow responses, forced 410s) or its request log; runs on the "
        "emulator backend alone",
    )


def real_plane_or_skip(**options: Any) -> KubeControlPlane:
    """A started control plane, or a skip (a failure under SUNKD_TEST_STRICT=1) when the
    binaries are not built. Stop it after."""
    ok, why = available()
    require(ok, why)
    return KubeControlPlane(**options).start()


# ---------------------------------------------------------------------------- the backend


@dataclass
class Kube:
    """One backend as a test sees it. `client` is sunkd's own KubeClient on it (admin
    rights on the real server); `emulator` is set on the emulator backend only."""

    backend: str
    url: str
    client: KubeClient
    emulator: KubeAPIEmulator | None = None
    plane: KubeControlPlane | None = None
    _clients: list[KubeClient] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.backend == "real"

    @property
    def faults(self) -> KubeAPIEmulator:
        """The emulator, for fault injection (tests marked emulator_only)."""
        assert self.emulator is not None, "fault injection needs the emulator backend"
        return self.emulator

    async def new_client(self) -> KubeClient:
        """Another client on the same server (closed with the fixture)."""
        if self.plane is not None:
            client = await KubeClient.connect(str(self.plane.kubeconfig))
        else:
            client = KubeClient.for_url(self.url)
        self._clients.append(client)
        return client

    @contextlib.asynccontextmanager
    async def raw(self) -> AsyncIterator[Raw]:
        """Raw HTTP (tests/integration/kubeapi_support.py) on this backend: plain HTTP to
        the emulator, TLS with the admin's client certificate to the real server."""
        connector = aiohttp.TCPConnector(
            ssl=self.plane.ssl_context() if self.plane is not None else False)
        async with aiohttp.ClientSession(connector=connector) as session:
            yield Raw(self.url, session)

    def write_kubeconfig(self, path: Path) -> Path:
        if self.plane is not None:
            return self.plane.write_kubeconfig(path)
        assert self.emulator is not None
        return self.emulator.write_kubeconfig(path)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()


@pytest.fixture(scope="module")
def kube_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def real_plane() -> Iterator[KubeControlPlane]:
    """The module's real control plane for the contract suite (see the module docstring)."""
    plane = real_plane_or_skip(
        scheduler=False,
        node_monitor_grace_period=3600,
        # A test restarts kube-apiserver: the controller manager must not lose a leader
        # election (and exit) while it is down.
        # The node-lifecycle controller looks at Nodes every second (5 s by default) and
        # taints NotReady ones at once (by default 0.1 nodes/s: one every 10 s).
        extra_args={"kube-controller-manager": [
            "--leader-elect=false", "--node-monitor-period=1s",
            "--node-eviction-rate=1000", "--secondary-node-eviction-rate=1000"]},
    )
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def kube(kube_backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Kube]:
    if kube_backend == "emulator":
        emulator = KubeAPIEmulator(**getattr(request.module, "EMULATOR_OPTIONS", {}))
        await emulator.start("127.0.0.1")
        client = KubeClient.for_url(emulator.url)
        env = Kube("emulator", emulator.url, client, emulator=emulator)
        try:
            yield env
        finally:
            await env.close()
            await client.close()
            await emulator.stop()
        return
    plane: KubeControlPlane = request.getfixturevalue("real_plane")
    client = await KubeClient.connect(str(plane.kubeconfig))
    env = Kube("real", plane.url, client, plane=plane)
    try:
        yield env
    finally:
        await env.close()
        try:
            await reset_real(client)
        finally:
            await client.close()


async def reset_real(client: KubeClient) -> None:
    """Empty the plane for the next test: every namespace's Pods (force-deleted: no kubelet
    would finish a graceful deletion), Events, PDBs, Leases and Nodesets, then every Node.
    Namespaces stay (deleting one takes the namespace controller seconds, and a test that
    re-creates it meanwhile is refused), and so does the Nodeset CRD."""
    listing = await client.request("GET", "/api/v1/namespaces")
    namespaces = [ns["metadata"]["name"] for ns in listing.get("items") or []]
    paths = ["/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/events",
             "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
             "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
             "/apis/sunkd.io/v1alpha1/namespaces/{ns}/nodesets",
             "/apis/apps/v1/namespaces/{ns}/deployments",
             "/apis/apps/v1/namespaces/{ns}/replicasets"]  # fmt: skip
    for namespace in namespaces:
        if namespace in SYSTEM_NAMESPACES:
            continue
        for path in paths:
            with contextlib.suppress(KubeApiError):  # 404: no such CRD (yet)
                await client.request("DELETE", path.format(ns=namespace),
                                     query=[("gracePeriodSeconds", "0")])  # fmt: skip
    await client.request("DELETE", NODES.collection_path())
    # Pods with finalizers (none here) or deletions still in flight: wait until none is left.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = await client.request("GET", "/api/v1/pods")
        left = [p for p in pods.get("items") or []
                if p["metadata"]["namespace"] not in SYSTEM_NAMESPACES]  # fmt: skip
        if not left:
            return
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------- sunkd's identity

ROOT = Path(__file__).resolve().parents[2]
RBAC_MANIFEST = ROOT / "manifests" / "base" / "rbac.yaml"
CRD_MANIFEST = ROOT / "manifests" / "crds" / "nodeset.yaml"
SCHEDULER_CONFIG = ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
SUNKD_NAMESPACE = "sunkd"
SUNKD_USER = "system:serviceaccount:sunkd:sunkd"


def install_sunkd(plane: KubeControlPlane) -> None:
    """What `kubectl apply -k manifests/` gives sunkd on a cluster, minus the Deployment:
    its namespace, the Nodeset CRD (established), and manifests/base/rbac.yaml as it is
    (ServiceAccount sunkd/sunkd, the ClusterRole and the leader-election Role, bound)."""
    plane.kubectl("create", "namespace", SUNKD_NAMESPACE)
    plane.kubectl("apply", "-n", SUNKD_NAMESPACE, "-f", str(RBAC_MANIFEST))
    plane.kubectl("apply", "-f", str(CRD_MANIFEST))
    plane.kubectl("wait", "--for=condition=Established", "crd/nodesets.sunkd.io",
                  "--timeout=60s")  # fmt: skip


@contextlib.contextmanager
def sunkd_plane(**options: Any) -> Iterator[KubeControlPlane]:
    """A started control plane (`real_plane_or_skip(**options)`) with sunkd installed
    (`install_sunkd`), stopped after: what a module's `plane` fixture yields."""
    control_plane = real_plane_or_skip(**options)
    try:
        install_sunkd(control_plane)
        yield control_plane
    finally:
        control_plane.stop()


def sunkd_kubeconfig(plane: KubeControlPlane, path: Path) -> Path:
    """A kubeconfig with a bound token of sunkd's ServiceAccount: sunkd then has exactly
    the rights manifests/base/rbac.yaml gives it."""
    return plane.write_kubeconfig(
        path, token=plane.service_account_token(SUNKD_NAMESPACE, "sunkd"))


def forbidden(plane: KubeControlPlane, user: str = SUNKD_USER) -> list[str]:
    """Every request of `user` the API server refused with 403, from its audit log."""
    return [f"{e.get('verb')} {e.get('requestURI')}" for e in plane.audit_events(user)
            if (e.get("responseStatus") or {}).get("code") == 403]


def calls_made(plane: KubeControlPlane, user: str = SUNKD_USER) -> set[tuple[str, str, str]]:
    """(verb, API group, resource[/subresource]) of every request `user` made."""
    made = set()
    for event in plane.audit_events(user):
        ref = event.get("objectRef") or {}
        if not ref.get("resource"):
            continue  # discovery, /version
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        made.add((str(event.get("verb")), str(ref.get("apiGroup") or ""), resource))
    return made


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------------------- bound tokens
# A bound token cannot be made to expire sooner than 10 minutes (TokenRequest's minimum
# `expirationSeconds`), so its end is had the other way the API server ends one: the token
# is bound to a Secret, and deleting the Secret makes the server refuse it (401) once its
# token authentication cache (10 s) lets go.

SECRETS = itertools.count(1)
PROBE_AGENT = "sunkd-tests-revocation-probe"


def bound_token(plane: KubeControlPlane) -> tuple[str, str]:
    """A token of sunkd's ServiceAccount bound to a new Secret: (token, secret)."""
    secret = f"sunkd-token-{next(SECRETS)}"
    plane.kubectl("-n", SUNKD_NAMESPACE, "create", "secret", "generic", secret)
    token = plane.kubectl("-n", SUNKD_NAMESPACE, "create", "token", "sunkd",
                          "--bound-object-kind=Secret", f"--bound-object-name={secret}",
                          "--duration=600s").stdout.strip()
    return token, secret


async def revoke(plane: KubeControlPlane, token: str, secret: str) -> float:
    """Delete the Secret the token is bound to; return once the server refuses the token
    (seconds it took)."""
    plane.kubectl("-n", SUNKD_NAMESPACE, "delete", "secret", secret)
    started = time.monotonic()
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    url = f"{plane.url}/api/v1/namespaces/{SUNKD_NAMESPACE}/pods"
    headers = {"Authorization": f"Bearer {token}", "User-Agent": PROBE_AGENT}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - started < 30:
            async with session.get(url, ssl=context, headers=headers) as answer:
                if answer.status == 401:
                    return time.monotonic() - started
            await asyncio.sleep(0.5)
    raise AssertionError(f"the server still accepts the token bound to {secret}")


def refused_as_unauthenticated(plane: KubeControlPlane) -> int:
    """Requests the API server answered 401, the revocation probe's aside (the audit log,
    `audit=True`; a failed authentication is audited before any ResponseComplete)."""
    seen: set[str] = set()
    try:
        lines = plane.audit_log.read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # the last line may be half written
            continue
        if (event.get("responseStatus") or {}).get("code") == 401 and \
                event.get("userAgent") != PROBE_AGENT:
            seen.add(str(event.get("auditID")))
    return len(seen)


def write_atomically(path: Path, text: str) -> None:
    """As the kubelet swaps a projected token: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


# ---------------------------------------------------------------------------- faults


class CuttingProxy:
    """A TCP proxy in front of the real API server that can cut every connection: watch
    cuts (and a server unreachable for a while) without an emulator. TLS passes through
    untouched; a kubeconfig with `url` as its server reaches the API server through it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.refusing = False
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self, *, refuse: bool = False) -> int:
        """Close every proxied connection at once (the client sees its stream end
        mid-body); with `refuse`, new connections are closed too until `resume()`."""
        self.refusing = refuse
        writers, self._writers = self._writers, set()
        for writer in writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self.cuts += 1
        return len(writers)

    def resume(self) -> None:
        self.refusing = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers.difference_update((writer, up_writer))


@contextlib.asynccontextmanager
async def proxied_client(kube: Kube, tmp_path: Path) -> AsyncIterator[tuple[CuttingProxy,
                                                                            KubeClient]]:
    """A KubeClient that reaches the real API server through a CuttingProxy."""
    assert kube.plane is not None
    async with CuttingProxy("127.0.0.1", kube.plane.apiserver_port) as proxy:
        config = kube.plane.write_kubeconfig(tmp_path / "proxied.kubeconfig", server=proxy.url)
        client = await KubeClient.connect(str(config))
        try:
            yield proxy, client
        finally:
            await client.close()
