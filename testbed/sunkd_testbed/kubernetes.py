"""The real Kubernetes control plane on this machine, for tests, benchmarks and the demo.

The API emulator (`sunkd_testbed.kubeapi`) answers as Kubernetes should; this harness runs
Kubernetes itself: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built
from Go modules by `scripts/build-kubernetes.sh` (pins in tests/kube/go.mod) into
`${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/kubernetes-<version>/bin`, with the matching kubectl.

`KubeControlPlane` starts them in a private temporary directory: etcd on two free loopback
ports (client, peer; no fsync, the data is thrown away), a CA made with the openssl CLI
(serving cert for 127.0.0.1/localhost, client certs for the admin in system:masters, the
controller manager and the scheduler, an ECDSA service-account signing key), kube-apiserver
with `--authorization-mode=Node,RBAC` and the default admission plugins on a free secure
port, kube-controller-manager with every on-by-default controller (`--root-ca-file`, the
signing key; by default all controllers share its own identity, in system:masters, which
brings the plane up in ~3 s instead of ~9 s; `service_account_credentials=True` gives each
controller its own ServiceAccount as kubeadm does), kube-scheduler
(optionally with a KubeSchedulerConfiguration file, e.g. manifests/scheduler/) and an admin
kubeconfig. Bring-up waits for `/readyz`, both components' `/healthz` and the `default`
ServiceAccount, and is timed (`startup_seconds`).

For tests: `scheduler=False` runs no kube-scheduler; `audit=True` writes an audit log of
every request (`audit_events()`); `write_kubeconfig(path, server=, token=)` writes a
kubeconfig for another server URL (a proxy) or a bearer token, and `service_account_token()`
gets a ServiceAccount's bound token (TokenRequest); `restart_apiserver()` kills and restarts
kube-apiserver on the same port and etcd (its new watch cache answers older resourceVersions
with 410 Expired).

Teardown stops exactly the processes this object started (it holds their `Popen`s, never
kills by name): SIGTERM, a wait, SIGKILL if needed, in reverse order of start; then it
removes the directory. It runs after a failed start too.

There is no kubelet. `HarnessKubelet` stands in for it over the API: it registers Nodes
with a Ready status, renews their Leases in kube-node-lease, reports pods bound to its
nodes Running and Ready, and finalizes pods being deleted (gracePeriodSeconds=0), which is
what a kubelet's API traffic amounts to. No container runs and no address but 127.0.0.1 is
ever given to a node.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import structlog
import yaml

from sunkd_testbed.lifecycle import Service

log = structlog.get_logger(__name__)

# Must match k8s.io/kubernetes in tests/kube/go.mod (tests/integration/test_kube_real_harness.py
# checks it); the cache directory is keyed by it.
KUBE_VERSION = "v1.37.2"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
BUILD_COMMAND = "scripts/build-kubernetes.sh"
DEFAULT_CACHE_ROOT = Path("/var/cache/sunkd")
_LOOPBACK = "127.0.0.1"


class KubeControlPlaneError(RuntimeError):
    """The control plane could not be started, or a command against it failed."""


class KubeBinariesMissing(KubeControlPlaneError):
    """A binary of the control plane is not in the cache directory."""


# ---------------------------------------------------------------------------- binaries


def cache_root() -> Path:
    return Path(os.environ.get("SUNKD_KUBE_CACHE") or DEFAULT_CACHE_ROOT)


def default_bin_dir(version: str = KUBE_VERSION) -> Path:
    """Where scripts/build-kubernetes.sh puts the binaries (`SUNKD_KUBE_BIN` overrides)."""
    override = os.environ.get("SUNKD_KUBE_BIN")
    if override:
        return Path(override)
    return cache_root() / f"kubernetes-{version}" / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Each binary's path, or KubeBinariesMissing naming the missing ones and the fix."""
    directory = bin_dir if bin_dir is not None else default_bin_dir()
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in BINARIES:
        path = directory / name
        if path.is_file() and os.access(path, os.X_OK):
            found[name] = path
        else:
            missing.append(name)
    if missing:
        raise KubeBinariesMissing(
            f"Kubernetes {KUBE_VERSION} binaries missing from {directory}: "
            f"{', '.join(missing)} (build them with `{BUILD_COMMAND}`, 6-8 minutes cold; "
            "SUNKD_KUBE_CACHE or SUNKD_KUBE_BIN point elsewhere)"
        )
    return found


def available(bin_dir: Path | None = None) -> tuple[bool, str]:
    """Can a control plane start here? (the built binaries and the openssl CLI)."""
    try:
        find_binaries(bin_dir)
    except KubeBinariesMissing as error:
        return False, str(error)
    if shutil.which("openssl") is None:
        return False, "the openssl CLI is missing (Debian package openssl)"
    return True, "ok"


# ---------------------------------------------------------------------------- helpers


def free_ports(count: int) -> list[int]:
    """Distinct free loopback TCP ports."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_LOOPBACK, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    """A metav1.MicroTime (Lease renewTime)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass(frozen=True)
class _Identity:
    """A client (or serving) certificate to issue from the harness CA."""

    file: str
    common_name: str
    organization: str | None = None
    usage: str = "clientAuth"
    alt_names: tuple[str, ...] = ()


_SERVING = _Identity(
    "serving",
    "kube-apiserver",
    usage="serverAuth",
    alt_names=(
        f"IP:{_LOOPBACK}",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ),
)
_ADMIN = _Identity("admin", "kubernetes-admin", organization="system:masters")
_SCHEDULER = _Identity("scheduler", "system:kube-scheduler")


def _controller_manager(own_credentials: bool) -> _Identity:
    # Controllers running on the manager's own credentials need every controller's
    # permissions, which its bootstrap ClusterRole does not grant.
    group = "system:masters" if own_credentials else None
    return _Identity("controller-manager", "system:kube-controller-manager", organization=group)


# ---------------------------------------------------------------------------- control plane


class KubeControlPlane(Service):
    """A private, real Kubernetes control plane. A (async) context manager, or start()/stop().

    `scheduler_config` is a KubeSchedulerConfiguration file (manifests/scheduler/...); its
    `clientConnection.kubeconfig` is pointed at this plane and, when `extender_url` is
    given, every extender's `urlPrefix` is replaced by it. `extra_args` adds flags per
    component (`{"kube-apiserver": ["--v=4"]}`). `node_monitor_grace_period` is the
    controller manager's (seconds before a node whose Lease stops is marked Unknown).
    `service_account_credentials` is kube-controller-manager's
    `--use-service-account-credentials` (off by default: bring-up ~3 s instead of ~9 s).
    `scheduler=False` runs no kube-scheduler (pods stay unbound unless a test binds them,
    as on the API emulator). `audit=True` has kube-apiserver write every request at level
    Metadata to `audit_log` (`audit_events()` reads it: who did what, and the answer's code).
    `kubelet_client=True` has kube-apiserver present the admin certificate to kubelets
    (`kubectl logs`/`exec` on real kubelet Nodes, sunkd_testbed.kubelet).
    """

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        base_dir: Path | None = None,
        keep_dir: bool = False,
        scheduler_config: Path | None = None,
        extender_url: str | None = None,
        controllers: str = "*",
        service_account_credentials: bool = False,
        node_monitor_grace_period: int = 50,
        scheduler: bool = True,
        audit: bool = False,
        kubelet_client: bool = False,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        start_timeout: float = 90.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self._bin_dir_arg = bin_dir
        self._base_dir_arg = base_dir
        self.keep_dir = keep_dir
        self.scheduler_config = scheduler_config
        self.extender_url = extender_url
        self.controllers = controllers
        self.service_account_credentials = service_account_credentials
        self.node_monitor_grace_period = node_monitor_grace_period
        self.run_scheduler = scheduler
        self.audit = audit
        self.kubelet_client = kubelet_client
        self.extra_args: dict[str, list[str]] = {k: list(v) for k, v in (extra_args or {}).items()}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.binaries: dict[str, Path] = {}
        self.base: Path = Path("/nonexistent")
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self.controller_manager_port = 0
        self.scheduler_port = 0
        self.startup_seconds: float | None = None
        self.stop_seconds: float | None = None
        self.server_version: str | None = None
        self._components: list[_Component] = []
        self._started = False
        self._ssl: ssl.SSLContext | None = None

    # ------------------------------------------------------------------ paths and clients

    @property
    def url(self) -> str:
        return f"https://{_LOOPBACK}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.etcd_port}"

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters; certificates embedded, so it can be copied)."""
        return self.base / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def pids(self) -> dict[str, int]:
        return {c.name: c.process.pid for c in self._components}

    @property
    def env(self) -> dict[str, str]:
        """Environment for kubectl (or anything reading KUBECONFIG) against this plane."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["KUBECACHEDIR"] = str(self.base / "kube-cache")
        return env

    def log_path(self, component: str) -> Path:
        return self.base / "logs" / f"{component}.log"

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the harness CA and presents the admin client certificate."""
        if self._ssl is None:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ssl = context
        return self._ssl

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (same version as the server) against this plane."""
        command = [str(self.binaries["kubectl"]), *args]
        try:
            result = subprocess.run(
                command,
                env=self.env,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise KubeControlPlaneError(f"kubectl {' '.join(args)}: timed out") from error
        if check and result.returncode != 0:
            raise KubeControlPlaneError(
                f"kubectl {' '.join(args)}: rc={result.returncode}: "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result

    def get(self, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET on the API server as the admin: (status, body)."""
        return self._https_get(self.apiserver_port, path, timeout=timeout)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KubeControlPlane:
        if self._started:
            return self
        self.binaries = find_binaries(self._bin_dir_arg)
        if shutil.which("openssl") is None:
            raise KubeControlPlaneError("the openssl CLI is missing (Debian package openssl)")
        started = time.monotonic()
        try:
            self._prepare()
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            if self.run_scheduler:
                self._start_scheduler()
            self._wait_for(
                lambda: self._healthy(self.controller_manager_port, "/healthz"),
                "kube-controller-manager /healthz",
            )
            if self.run_scheduler:
                self._wait_for(
                    lambda: self._healthy(self.scheduler_port, "/healthz"),
                    "kube-scheduler /healthz",
                )
            # Pods need their ServiceAccount (admission rejects them before the controller
            # made it), so "up" includes the serviceaccount controller's first pass.
            self._wait_for(
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                "the default ServiceAccount",
            )
        except BaseException as error:
            logs = self._log_tails()
            self.stop()
            if isinstance(error, KubeControlPlaneError):
                raise KubeControlPlaneError(f"{error}\n{logs}") from error
            raise
        self.startup_seconds = round(time.monotonic() - started, 2)
        self._started = True
        log.info(
            "harness.kubernetes.up",
            base=str(self.base),
            url=self.url,
            version=self.server_version,
            seconds=self.startup_seconds,
        )
        return self

    def stop(self) -> None:
        """Stop every process this object started, newest first; safe to call twice."""
        started = time.monotonic()
        for component in reversed(self._components):
            try:
                self._stop_component(component)
            except subprocess.TimeoutExpired:  # not even SIGKILL reaped it: say so, go on
                log.error("harness.kubernetes.unkillable", component=component.name,
                          pid=component.process.pid)  # fmt: skip
        self._components.clear()
        self._started = False
        self._ssl = None
        self.stop_seconds = round(time.monotonic() - started, 2)
        if not self.keep_dir and self._base_dir_arg is None and self.base != Path("/nonexistent"):
            shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ more for tests

    @property
    def audit_log(self) -> Path:
        return self.log_path("audit")

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The audit log's events (stage ResponseComplete), optionally of one user."""
        events: list[dict[str, Any]] = []
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return events
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # the last line may be half written
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            if user is not None and (event.get("user") or {}).get("username") != user:
                continue
            events.append(event)
        return events

    def write_kubeconfig(
        self, path: Path, *, server: str | None = None, token: str | None = None
    ) -> Path:
        """A kubeconfig for this plane: the admin's certificate, or a bearer `token`;
        `server` replaces the API server's URL (a proxy in front of it)."""
        user: dict[str, str]
        if token is not None:
            user = {"token": token}
        else:
            user = {
                "client-certificate-data": _b64(self.pki / "admin.crt"),
                "client-key-data": _b64(self.pki / "admin.key"),
            }
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "harness",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority-data": _b64(self.ca_file),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": "user"}}],
            "current-context": "harness",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token for the ServiceAccount (the TokenRequest API, `kubectl create token`)."""
        result = self.kubectl(
            "-n", namespace, "create", "token", name, f"--duration={seconds}s"
        )  # fmt: skip
        return result.stdout.strip()

    def restart_apiserver(self) -> float:
        """Kill kube-apiserver (SIGKILL: a crash; a graceful stop with the controller manager
        still connected takes it ~15 s) and start it again on the same port and etcd: every
        open connection drops, and the new server's watch cache starts at the current
        revision, so older resourceVersions are 410 Expired. Returns the seconds it was down."""
        index, component = next(
            (i, c) for i, c in enumerate(self._components) if c.name == "kube-apiserver"
        )
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            component.process.kill()
        component.process.wait(timeout=self.stop_timeout)
        del self._components[index]
        self._start_apiserver()
        # Back in its place, so stop() still stops it after the controllers (stopping it
        # first makes its graceful shutdown wait for them, ~15 s).
        self._components.insert(index, self._components.pop())
        return round(time.monotonic() - started, 2)

    def _kubelet_client_flags(self) -> list[str]:
        if not self.kubelet_client:
            return []
        return [
            f"--kubelet-client-certificate={self.pki / 'admin.crt'}",
            f"--kubelet-client-key={self.pki / 'admin.key'}",
        ]

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.base / "apiserver" / "audit-policy.yaml"
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
            "rules:\n  - level: Metadata\n"
        )
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxbackup=1",
        ]

    # ------------------------------------------------------------------ bring-up steps

    def _prepare(self) -> None:
        if self._base_dir_arg is not None:
            self.base = self._base_dir_arg
            self.base.mkdir(parents=True, exist_ok=True)
        else:
            self.base = Path(tempfile.mkdtemp(prefix="sunkd-kube-"))
        for sub in ("pki", "logs", "etcd", "kube-cache", "apiserver", "scheduler"):
            (self.base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        (
            self.etcd_port,
            self.etcd_peer_port,
            self.apiserver_port,
            self.controller_manager_port,
            self.scheduler_port,
        ) = free_ports(5)
        self._make_pki()
        for identity in self._clients():
            self._write_kubeconfig(self.base / f"{identity.file}.kubeconfig", identity.file)

    def _clients(self) -> tuple[_Identity, ...]:
        own = not self.service_account_credentials
        return (_ADMIN, _controller_manager(own), _SCHEDULER)

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(
            ["openssl", *args], capture_output=True, text=True, check=False, timeout=30
        )
        if result.returncode != 0:
            raise KubeControlPlaneError(f"openssl {args[0]}: {result.stderr.strip()}")

    def _make_pki(self) -> None:
        """CA, serving and client certificates (P-256) and the service-account key."""
        pki = self.pki
        (pki / "ca.cnf").write_text(
            "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n"
            "[dn]\nCN = sunkd-harness-ca\n"
            "[ext]\nbasicConstraints = critical,CA:TRUE\n"
            "keyUsage = critical,keyCertSign,cRLSign,digitalSignature\n"
            "subjectKeyIdentifier = hash\n"
        )
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl(
            "req", "-x509", "-config", str(pki / "ca.cnf"), *ec,
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"), "-days", "30",
        )  # fmt: skip
        for identity in (_SERVING, *self._clients()):
            subject = f"CN = {identity.common_name}\n"
            if identity.organization:
                subject = f"O = {identity.organization}\n" + subject
            alt = f"subjectAltName = {','.join(identity.alt_names)}\n" if identity.alt_names else ""
            config = pki / f"{identity.file}.cnf"
            config.write_text(
                "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n"
                f"[dn]\n{subject}"
                "[ext]\nbasicConstraints = critical,CA:FALSE\n"
                "keyUsage = critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage = {identity.usage}\n{alt}"
                "authorityKeyIdentifier = keyid\n"
            )
            self._openssl(
                "req", "-x509", "-config", str(config), *ec,
                "-keyout", str(pki / f"{identity.file}.key"),
                "-out", str(pki / f"{identity.file}.crt"), "-days", "30",
                "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            )  # fmt: skip
        self._openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(pki / "sa.key"),
        )  # fmt: skip
        self._openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))

    def _write_kubeconfig(self, path: Path, identity: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "harness",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": _b64(self.ca_file),
                    },
                }
            ],
            "users": [
                {
                    "name": identity,
                    "user": {
                        "client-certificate-data": _b64(self.pki / f"{identity}.crt"),
                        "client-key-data": _b64(self.pki / f"{identity}.key"),
                    },
                }
            ],
            "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": identity}}],
            "current-context": "harness",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _spawn(self, name: str, args: Sequence[str]) -> _Component:
        log_path = self.log_path(name)
        with log_path.open("a") as handle:
            process = subprocess.Popen(
                [str(self.binaries[name]), *args, *self.extra_args.get(name, [])],
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                # Own session: a Ctrl-C at the terminal reaches the test runner, whose
                # teardown stops these in order, rather than every process at once.
                start_new_session=True,
            )
        component = _Component(name, process, log_path)
        self._components.append(component)
        return component

    def _start_etcd(self) -> None:
        client = f"http://{_LOOPBACK}:{self.etcd_port}"
        peer = f"http://{_LOOPBACK}:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=harness",
                f"--data-dir={self.base / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=harness={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # throwaway data: no fsync, much faster on CI disks
                "--log-level=warn",
            ],
        )
        self._wait_for(self._etcd_healthy, "etcd /health")

    def _start_apiserver(self) -> None:
        pki = self.pki
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={_LOOPBACK}",
                f"--advertise-address={_LOOPBACK}",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.base / 'apiserver'}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                # Endpoints may not hold a loopback address, and there is no other here.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *self._audit_flags(),
                *self._kubelet_client_flags(),
            ],
        )
        self._wait_for(
            lambda: self._healthy(self.apiserver_port, "/readyz"), "kube-apiserver /readyz"
        )
        status, body = self.get("/version")
        if status == 200:
            self.server_version = str(json.loads(body).get("gitVersion"))

    def _component_flags(self, identity: str, port: int) -> list[str]:
        kubeconfig = self.base / f"{identity}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={_LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}",
            "--profiling=false",
            "--v=1",
        ]

    def _start_controller_manager(self) -> None:
        pki = self.pki
        self._spawn(
            "kube-controller-manager",
            [
                *self._component_flags("controller-manager", self.controller_manager_port),
                f"--controllers={self.controllers}",
                "--use-service-account-credentials="
                + ("true" if self.service_account_credentials else "false"),
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--cluster-name=sunkd-harness",
                f"--node-monitor-grace-period={self.node_monitor_grace_period}s",
            ],
        )

    def _start_scheduler(self) -> None:
        args = self._component_flags("scheduler", self.scheduler_port)
        if self.scheduler_config is not None:
            # With --config, kube-scheduler ignores --kubeconfig: the file must name it.
            loaded = yaml.safe_load(self.scheduler_config.read_text())
            if not isinstance(loaded, dict):
                raise KubeControlPlaneError(f"{self.scheduler_config}: not a mapping")
            config: dict[str, Any] = loaded
            connection = config.setdefault("clientConnection", {})
            connection["kubeconfig"] = str(self.base / "scheduler.kubeconfig")
            if self.extender_url is not None:
                for extender in config.get("extenders") or []:
                    extender["urlPrefix"] = self.extender_url
            path = self.base / "scheduler" / "config.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            args = [a for a in args if not a.startswith("--kubeconfig=")]
            args.append(f"--config={path}")
        self._spawn("kube-scheduler", args)

    # ------------------------------------------------------------------ waiting and probing

    def _wait_for(self, check: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else self.start_timeout)
        delay = 0.05
        while True:
            for component in self._components:
                code = component.process.poll()
                if code is not None:
                    raise KubeControlPlaneError(
                        f"{component.name} exited with status {code} while waiting for {what}"
                    )
            try:
                if check():
                    return
            except (OSError, http.client.HTTPException, ValueError):
                pass
            if time.monotonic() > deadline:
                raise KubeControlPlaneError(f"timed out waiting for {what}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _etcd_healthy(self) -> bool:
        connection = http.client.HTTPConnection(_LOOPBACK, self.etcd_port, timeout=2)
        try:
            connection.request("GET", "/health")
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        return response.status == 200 and json.loads(body).get("health") == "true"

    def _https_get(self, port: int, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(
            _LOOPBACK, port, timeout=timeout, context=self.ssl_context()
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def _healthy(self, port: int, path: str) -> bool:
        status, _ = self._https_get(port, path, timeout=2.0)
        return status == 200

    def _stop_component(self, component: _Component) -> None:
        process = component.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("harness.kubernetes.kill", component=component.name, pid=process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=self.stop_timeout)
        else:
            process.wait()

    def _log_tails(self) -> str:
        parts = []
        for component in self._components:
            tail = _tail(component.log_path)
            if tail:
                parts.append(f"--- {component.name} ({component.log_path}):\n{tail}")
        return "\n".join(parts)


def start_kubernetes(**kwargs: Any) -> KubeControlPlane:
    """Start a control plane (see KubeControlPlane for the arguments); stop() it after."""
    return KubeControlPlane(**kwargs).start()


# ---------------------------------------------------------------------------- kubelet stand-in


class KubeAPIError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


@dataclass
class PodSync:
    """What one `HarnessKubelet.sync_pods()` pass did (`namespace/name` each)."""

    started: list[str] = field(default_factory=list)
    finalized: list[str] = field(default_factory=list)


_MERGE = "application/merge-patch+json"


class HarnessKubelet:
    """A kubelet's API traffic for nodes that have no kubelet. Use `async with`.

    `register_node()` creates a Node (Ready, with capacity, address 127.0.0.1) and its
    Lease; `renew_leases()` renews every registered, unpaused node's Lease;
    `sync_pods()` reports pods bound to registered nodes Running and Ready and finalizes
    pods carrying a deletionTimestamp. `start()` does both in a background task
    (`interval` for pods, `lease_interval` for Leases, as a kubelet's 10 s); `pause(node)`
    stops one node's Leases, as a dead kubelet would.
    """

    def __init__(
        self,
        plane: KubeControlPlane,
        *,
        interval: float = 0.5,
        lease_interval: float = 10.0,
        lease_duration: int = 40,
    ) -> None:
        self.plane = plane
        self.interval = interval
        self.lease_interval = lease_interval
        self.lease_duration = lease_duration
        self.nodes: dict[str, str] = {}  # name -> uid
        self.paused: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_lease = 0.0

    async def __aenter__(self) -> HarnessKubelet:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.plane.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=30),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ HTTP

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: Iterable[int] = (200, 201, 202),
    ) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("HarnessKubelet is used as `async with HarnessKubelet(plane)`")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self._session.request(
            method, self.plane.url + path, data=data, params=params, headers=headers
        ) as response:
            text = await response.text()
            if response.status not in set(ok):
                raise KubeAPIError(method, path, response.status, text)
            result: dict[str, Any] = json.loads(text) if text else {}
            return result

    # ------------------------------------------------------------------ nodes

    @staticmethod
    def _conditions(ready: bool) -> list[dict[str, str]]:
        now = _now()

        def condition(kind: str, status: str, reason: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "harness kubelet",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        return [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition(
                "Ready",
                "True" if ready else "False",
                "KubeletReady" if ready else "KubeletNotReady",
            ),
        ]

    def _node_status(self, name: str, cpu: str, memory: str, pods: str) -> dict[str, Any]:
        resources = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"}
        return {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": _LOOPBACK},
                {"type": "Hostname", "address": name},
            ],
            "conditions": self._conditions(ready=True),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "sunkd harness",
                "containerRuntimeVersion": "harness://0",
                "kubeletVersion": self.plane.server_version or KUBE_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
    ) -> dict[str, Any]:
        """Create the Node (Ready) and its Lease; an existing Node gets its status reported."""
        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        status = self._node_status(name, cpu, memory, pods)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": all_labels,
                "annotations": dict(annotations or {}),
            },
            "spec": {"taints": [dict(t) for t in taints], "unschedulable": unschedulable},
            "status": status,
        }
        try:
            node = await self.request("POST", "/api/v1/nodes", body=body)
        except KubeAPIError as error:
            if error.status != 409:
                raise
            node = await self.request(
                "PATCH", f"/api/v1/nodes/{name}/status", body={"status": status},
                content_type=_MERGE,
            )  # fmt: skip
        self.nodes[name] = str(node["metadata"]["uid"])
        self.paused.discard(name)
        await self._renew_lease(name)
        return node

    async def set_ready(self, name: str, ready: bool) -> None:
        """Report the node's Ready condition True or False (as a kubelet would)."""
        await self.request(
            "PATCH", f"/api/v1/nodes/{name}/status",
            body={"status": {"conditions": self._conditions(ready)}}, content_type=_MERGE,
        )  # fmt: skip

    def pause(self, name: str) -> None:
        """Stop renewing this node's Lease (its kubelet died); `resume()` undoes it."""
        self.paused.add(name)

    async def resume(self, name: str) -> None:
        self.paused.discard(name)
        await self._renew_lease(name)

    async def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": self.lease_duration,
            "renewTime": _micro_now(),
        }
        try:
            await self.request("PATCH", path, body={"spec": spec}, content_type=_MERGE)
            return
        except KubeAPIError as error:
            if error.status != 404:
                raise
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self.nodes[name]}
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [owner]},
            "spec": spec,
        }
        await self.request(
            "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body=lease
        )

    async def renew_leases(self) -> None:
        for name in list(self.nodes):
            if name not in self.paused:
                await self._renew_lease(name)
        self._last_lease = time.monotonic()

    # ------------------------------------------------------------------ pods

    def _running_status(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        now = _now()
        spec = pod.get("spec") or {}
        uid = pod["metadata"]["uid"]

        def container_status(container: Mapping[str, Any], running: bool) -> dict[str, Any]:
            state: dict[str, Any] = (
                {"running": {"startedAt": now}}
                if running
                else {"terminated": {"exitCode": 0, "reason": "Completed",
                                     "startedAt": now, "finishedAt": now}}
            )  # fmt: skip
            return {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "containerID": f"harness://{uid}/{container['name']}",
                "ready": running,
                "started": running,
                "restartCount": 0,
                "state": state,
            }

        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready",
                         "ContainersReady", "PodScheduled")
        ]  # fmt: skip
        status: dict[str, Any] = {
            "phase": "Running",
            "hostIP": _LOOPBACK,
            "hostIPs": [{"ip": _LOOPBACK}],
            "startTime": (pod.get("status") or {}).get("startTime") or now,
            "conditions": conditions,
            "containerStatuses": [container_status(c, True) for c in spec.get("containers", [])],
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [
                container_status(c, False) for c in spec["initContainers"]
            ]
        return status

    @staticmethod
    def _is_running_ready(pod: Mapping[str, Any]) -> bool:
        status = pod.get("status") or {}
        if status.get("phase") != "Running":
            return False
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    async def sync_pods(self) -> PodSync:
        """One pass over the pods bound to registered nodes (see the class docstring)."""
        result = PodSync()
        if not self.nodes:
            return result
        listing = await self.request("GET", "/api/v1/pods")
        for pod in listing.get("items") or []:
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in self.nodes or node in self.paused:
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            if meta.get("deletionTimestamp"):
                options = {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": meta["uid"]},
                }
                try:
                    await self.request("DELETE", path, body=options)
                    result.finalized.append(key)
                except KubeAPIError as error:
                    if error.status not in (404, 409):
                        raise
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if not self._is_running_ready(pod):
                try:
                    await self.request(
                        "PATCH", f"{path}/status",
                        body={"status": self._running_status(pod)}, content_type=_MERGE,
                    )  # fmt: skip
                    result.started.append(key)
                except KubeAPIError as error:
                    if error.status not in (404, 409):
                        raise
        return result

    # ------------------------------------------------------------------ background loop

    async def run(self) -> None:
        """Renew Leases every `lease_interval` and sync pods every `interval`, forever."""
        while True:
            try:
                if time.monotonic() - self._last_lease >= self.lease_interval:
                    await self.renew_leases()
                await self.sync_pods()
            except (KubeAPIError, aiohttp.ClientError, TimeoutError) as error:
                log.warning("harness.kubelet.error", error=str(error))
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="harness-kubelet")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sunkd_testbed.kubernetes`: bring a plane up, print its kubeconfig, wait."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--scheduler-config", type=Path)
    parser.add_argument("--keep-dir", action="store_true")
    args = parser.parse_args(argv)
    plane = KubeControlPlane(scheduler_config=args.scheduler_config, keep_dir=args.keep_dir)
    try:
        plane.start()
    except KubeControlPlaneError as error:
        print(error)
        return 1
    print(f"up in {plane.startup_seconds} s: {plane.url}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"kubectl: {plane.binaries['kubectl']}  (Ctrl-C stops it)")

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
