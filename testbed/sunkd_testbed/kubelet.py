"""Real kubelet Nodes on this machine, for the tests that need pods with processes in them.

`HarnessKubelet` (sunkd_testbed.kubernetes) only writes what a kubelet would write; the
slurmd-pod tests need the real thing. `KubeletNodes(plane, count)` runs `count` real
kubelets (v1.37.2, `scripts/build-kubelet.sh`, the control plane's own Go module pins),
each with its own containerd (Debian 12's 1.6 and runc 1.1: two kubelets on one
containerd would each kill the other's pods as orphans), against a `KubeControlPlane`
started with `kubelet_client=True`. Node i is named `127.0.0.(10+i)`: a kubelet whose
`--hostname-override` is an IP reports it as both InternalIP and Hostname unvalidated
(upstream `pkg/kubelet/nodestatus/setters.go`), binds there, and kube-apiserver reaches it
on loopback; no /etc/hosts entry is needed. Images are imported from local tars
(sunkd_testbed.images) and pods use `imagePullPolicy: Never` and `hostNetwork: true`
(there is no pod network: a loopback-only CNI config makes the runtime NetworkReady).

What this host kind needs, each learnt the hard way (docs/kubernetes-build.md):
- cgroup v1: v1.37's KubeletConfiguration defaults `failCgroupV1` to true; set false,
  with `cgroupDriver: cgroupfs`; each Node gets its own existing `cgroupRoot`.
- root without CAP_SYS_RESOURCE, no pod network: see sunkd_testbed.containerd.
- `makeIPTablesUtilChains: false`, else KUBE-FIREWALL and friends stay in the host's
  iptables after the kubelet stops.
- The kubelet rewrites vm.overcommit_memory, kernel.panic and kernel.panic_on_oops
  (KernelTunableModify) and writes fixed host paths whatever its flags say
  (/var/lib/kubelet/device-plugins/kubelet.sock, /var/log/containers, containerd's
  /run/containerd/{s,runc,fifo}): a host-wide lock serializes test beds, and teardown
  restores the sysctls and removes the paths it created.

Teardown (also after a failed start): delete the pods on its Nodes and wait for their
processes, SIGTERM each kubelet, remove the containers left in each containerd and stop it,
kill the shims of *its* containerds (identified by their socket path) by PID, unmount what
is left under its directory, rmdir its cgroup roots in every hierarchy, remove the host
paths it created, restore the sysctls, release the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import structlog
import yaml

from sunkd_testbed.containerd import CNI_BIN_DIR, Containerd, rss_mib, stop_process
from sunkd_testbed.images import Image
from sunkd_testbed.kubernetes import KUBE_VERSION, KubeControlPlane, cache_root, free_ports
from sunkd_testbed.lifecycle import Service

log = structlog.get_logger(__name__)

BUILD_COMMAND = "scripts/build-kubelet.sh"
HOST_LOCK = Path("/run/lock/sunkd-kubelet.lock")
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
# Created by a kubelet or containerd whatever their flags say (see the module docstring).
HOST_PATHS = ("/var/log/containers", "/var/lib/kubelet", "/run/containerd")
_CGROUP_FS = Path("/sys/fs/cgroup")
# Every kubelet's device manager empties this directory of sockets, then listens on this
# fixed path (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go, Start: the
# registration handler's CleanupPluginDirectory, then net.Listen): two kubelets starting
# at once can interleave, and the loser exits "bind: address already in use". Each Node's
# kubelet starts once the previous one has bound it.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


class KubeletError(RuntimeError):
    """A kubelet Node could not be started, or a step against it failed."""


def _inode(path: Path) -> tuple[int, int] | None:
    """The file at `path` told from one created there before (an inode number may be
    reused, its change time moves with it)."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_ctime_ns


def _await_new_socket(node: KubeletNode, before: tuple[int, int] | None, timeout: float,
                      path: Path = DEVICE_PLUGIN_SOCKET) -> None:
    """Wait until `node`'s kubelet has bound its device-plugin socket (a socket at `path`
    other than the one `before` named); a kubelet that exits first fails the start."""
    deadline = time.monotonic() + timeout
    while True:
        inode = _inode(path)
        if inode is not None and inode != before and stat.S_ISSOCK(path.stat().st_mode):
            return
        if node.process is not None and node.process.poll() is not None:
            raise KubeletError(f"kubelet {node.name} exited ({node.process.returncode}) "
                               f"before it listened on {path}")
        if time.monotonic() > deadline:
            raise KubeletError(f"kubelet {node.name} did not listen on {path} in "
                               f"{timeout:.0f} s")
        time.sleep(0.05)


def kubelet_binary() -> Path:
    """Where scripts/build-kubelet.sh puts the kubelet (`SUNKD_KUBELET` overrides)."""
    override = os.environ.get("SUNKD_KUBELET")
    if override:
        return Path(override)
    return cache_root() / f"kubelet-{KUBE_VERSION}" / "bin" / "kubelet"


def containerd_roots() -> Path:
    """The Nodes' containerd roots (imported images, unpacked), kept between runs: the
    slurmd image is unpacked once per machine, not per run. Remove the directory to reclaim
    the space; images are keyed by content, so a stale one is never used."""
    return cache_root() / "kubelet-containerd"


def available() -> tuple[bool, str]:
    """Can real kubelet Nodes start here? (root, the built kubelet, containerd, runc, CNI)."""
    if os.geteuid() != 0:
        return False, "real kubelet Nodes need root (cgroups, mounts, containerd)"
    binary = kubelet_binary()
    if not os.access(binary, os.X_OK):
        return False, f"no kubelet at {binary}: run `{BUILD_COMMAND}` (make kube-binaries)"
    for tool in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "openssl", "tar"):
        if shutil.which(tool) is None:
            return False, f"{tool} missing (scripts/ensure-system-deps.sh installs it)"
    if not (CNI_BIN_DIR / "loopback").is_file():
        return False, f"{CNI_BIN_DIR}/loopback missing (Debian package containernetworking-plugins)"
    if not (_CGROUP_FS / "memory").is_dir() and not (_CGROUP_FS / "cgroup.controllers").exists():
        return False, f"no cgroup hierarchy under {_CGROUP_FS}"
    return True, "ok"


def _mounts_under(path: Path) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(path) or point.startswith(f"{path}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def cgroup_hierarchies() -> list[Path]:
    """The cgroup hierarchies: each v1 mount (and a hybrid host's `unified`), or the
    single v2 tree."""
    if (_CGROUP_FS / "cgroup.controllers").exists():
        return [_CGROUP_FS]
    return [p for p in _CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink()]


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


class KubeletNode:
    """One kubelet and its containerd: Node `127.0.0.(10+index)`."""

    def __init__(self, base: Path, index: int, pause_ref: str) -> None:
        self.index = index
        self.name = f"127.0.0.{10 + index}"
        self.dir = base / f"node-{index}"
        self.containerd = Containerd(
            base / f"containerd-{index}", containerd_roots() / f"node-{index}", pause_ref
        )
        self.cgroup_root = f"/sunkd-kubelet-{os.getpid()}-{index}"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def log_path(self) -> Path:
        return self.dir / "kubelet.log"

    def _make_cgroup_root(self) -> None:
        for hierarchy in cgroup_hierarchies():
            if hierarchy.name == "unified":  # runc makes it there itself
                continue
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset takes no task until both are set
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((hierarchy / knob).read_text())

    def remove_cgroup_root(self) -> list[str]:
        """rmdir the Node's tree in every hierarchy (runc makes it in `unified` too);
        what could not be removed (a process still in it)."""
        left = []
        for hierarchy in cgroup_hierarchies():
            root = hierarchy / self.cgroup_root.lstrip("/")
            if not root.is_dir():
                continue
            subs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for sub in [*subs, root]:
                try:
                    sub.rmdir()
                except OSError:
                    left.append(str(sub))
        return left

    def _client_cert(self, plane: KubeControlPlane) -> tuple[Path, Path]:
        """O=system:nodes, CN=system:node:<name>: the Node authorizer and NodeRestriction
        accept it as this Node's kubelet (no bootstrap token, no CSR to approve)."""
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        cnf = pki / "client.cnf"
        cnf.write_text(
            "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n"
            f"[dn]\nO = system:nodes\nCN = system:node:{self.name}\n"
            "[ext]\nbasicConstraints = critical,CA:FALSE\n"
            "keyUsage = critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage = clientAuth\nauthorityKeyIdentifier = keyid\n"
        )
        crt, key = pki / "client.crt", pki / "client.key"
        result = subprocess.run(
            ["openssl", "req", "-x509", "-config", str(cnf), "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(crt),
             "-days", "30", "-CA", str(plane.ca_file), "-CAkey", str(plane.pki / "ca.key")],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if result.returncode != 0:
            raise KubeletError(f"openssl: {result.stderr.strip()}")
        return crt, key

    def config(self, plane: KubeControlPlane) -> dict[str, Any]:
        port, healthz = free_ports(2)
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # v1.37 refuses cgroup v1 hosts unless told otherwise
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,  # else its chains stay in the host's iptables
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.containerd.socket}",
            "address": self.name,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(plane.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            # The disk is shared with other work: evict only when it is nearly full.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "2%",
                "imagefs.available": "2%",
            },
            "imageGCHighThresholdPercent": 99,
            "imageGCLowThresholdPercent": 98,
        }

    def start_kubelet(self, plane: KubeControlPlane, binary: Path, verbosity: int) -> None:
        self._make_cgroup_root()
        crt, key = self._client_cert(plane)
        kubeconfig = self.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "harness", "cluster": {
                "server": plane.url, "certificate-authority": str(plane.ca_file)}}],
            "users": [{"name": "kubelet", "user": {
                "client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": "kubelet"}}],
            "current-context": "harness",
        }, sort_keys=False))  # fmt: skip
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(self.config(plane), sort_keys=False))
        args = [
            str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.dir / 'root'}", f"--cert-dir={self.dir / 'pki'}",
            f"--hostname-override={self.name}", f"--v={verbosity}",
        ]  # fmt: skip
        with self.log_path.open("ab") as handle:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def memory(self) -> dict[str, float]:
        """RSS in MiB of the kubelet, its containerd and that containerd's shims."""
        return {
            "kubelet": rss_mib(self.process.pid) if self.process else 0.0,
            "containerd": rss_mib(self.containerd.process.pid) if self.containerd.process else 0.0,
            "shims": round(sum(rss_mib(p) for p in self.containerd.shim_pids()), 1),
        }


class KubeletNodes(Service):
    """`count` real kubelet Nodes against `plane` (a context manager, or start()/stop()).

    `images` are imported into every Node's containerd (the pause image is added);
    `registration_seconds` / `ready_seconds` are per Node, from its kubelet's start.
    """

    def __init__(
        self,
        plane: KubeControlPlane,
        count: int = 2,
        *,
        pause: Image,
        images: Sequence[Image] = (),
        base_dir: Path | None = None,
        verbosity: int = 1,
        ready_timeout: float = 120.0,
        lock_timeout: float = 900.0,
    ) -> None:
        if not 1 <= count <= 100:
            raise ValueError("count: 1..100 Nodes")
        self.plane = plane
        self.pause = pause
        self.images = [pause, *images]
        self._base_dir_arg = base_dir
        self.base = base_dir or Path("/nonexistent")
        self.count = count
        self.verbosity = verbosity
        self.ready_timeout = ready_timeout
        self.lock_timeout = lock_timeout
        self.nodes: list[KubeletNode] = []
        self.registration_seconds: dict[str, float] = {}
        self.ready_seconds: dict[str, float] = {}
        self.import_seconds = 0.0
        self.stop_seconds: dict[str, float] = {}
        self._lock: IO[str] | None = None
        self._sysctls: dict[str, str] = {}
        # What the host had, read under the host lock before this bed's kubelets started
        # (a reading taken before the lock can see another bed's kubelet values).
        self.sysctls_found: dict[str, str] = {}
        self._host_paths_before: set[str] = set()

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def _acquire_host_lock(self) -> None:
        HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
        handle = HOST_LOCK.open("w")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise KubeletError(
                        f"{HOST_LOCK} held by another test bed for {self.lock_timeout:.0f} s"
                    ) from None
                time.sleep(0.5)
        self._lock = handle

    def start(self) -> KubeletNodes:
        ok, why = available()
        if not ok:
            raise KubeletError(why)
        binary = kubelet_binary()
        self._acquire_host_lock()
        try:
            self._sysctls = {n: sysctl_path(n).read_text().strip() for n in SYSCTLS}
            self.sysctls_found = dict(self._sysctls)
            self._host_paths_before = {p for p in HOST_PATHS if os.path.lexists(p)}
            if self._base_dir_arg is None:
                self.base = Path(tempfile.mkdtemp(prefix="sunkd-kubelet-"))
            self.base.mkdir(parents=True, exist_ok=True)
            self.nodes = [KubeletNode(self.base, i, self.pause.ref) for i in range(self.count)]
            started = time.monotonic()
            for node in self.nodes:
                node.containerd.start()
            self.import_images(self.images)
            self.import_seconds = round(time.monotonic() - started, 2)
            for node in self.nodes:
                before = _inode(DEVICE_PLUGIN_SOCKET)
                node.start_kubelet(self.plane, binary, self.verbosity)
                _await_new_socket(node, before, self.ready_timeout)
            self._wait_ready()
        except BaseException as error:
            tails = "\n".join(f"{n.log_path}:\n{_tail(n.log_path)}" for n in self.nodes)
            self.stop()
            if not isinstance(error, Exception):  # Ctrl-C: stopped, and on its way
                raise
            raise KubeletError(f"kubelet Nodes did not come up: {error}\n{tails}") from error
        log.info("harness.kubelet.up", nodes=self.names, ready=self.ready_seconds)
        return self

    def _node(self, name: str) -> dict[str, Any] | None:
        status, body = self.plane.get(f"/api/v1/nodes/{name}")
        return json.loads(body) if status == 200 else None

    def _wait_ready(self) -> None:
        pending = {n.name: n for n in self.nodes}
        deadline = time.monotonic() + self.ready_timeout
        while pending:
            for name, node in list(pending.items()):
                if node.process is not None and node.process.poll() is not None:
                    raise KubeletError(f"kubelet {name} exited ({node.process.returncode})")
                found = self._node(name)
                if found is None:
                    continue
                elapsed = round(time.monotonic() - node.started_at, 2)
                self.registration_seconds.setdefault(name, elapsed)
                conditions = found.get("status", {}).get("conditions") or []
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                # The not-ready taint is lifted by the node lifecycle controller after Ready.
                tainted = any(t.get("key") == "node.kubernetes.io/not-ready"
                              for t in found.get("spec", {}).get("taints") or [])  # fmt: skip
                if ready and not tainted:
                    self.ready_seconds[name] = elapsed
                    del pending[name]
            if time.monotonic() > deadline:
                raise KubeletError(
                    f"Nodes not Ready after {self.ready_timeout:.0f} s: {sorted(pending)}"
                )
            time.sleep(0.1)

    def import_images(self, images: Sequence[Image], nodes: Sequence[KubeletNode] = ()) -> None:
        """Import `images` into the containerd of `nodes` (default: every Node), in parallel."""
        targets = list(nodes or self.nodes)
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            list(pool.map(lambda n: n.containerd.import_images(images), targets))

    def node_of(self, name: str) -> KubeletNode:
        return next(n for n in self.nodes if n.name == name)

    def container_pids(self) -> dict[str, int]:
        """Every running container on these Nodes (pause containers included): id -> PID."""
        pids: dict[str, int] = {}
        for node in self.nodes:
            if node.containerd.process is not None and node.containerd.process.poll() is None:
                pids.update(node.containerd.tasks())
        return pids

    def _delete_pods(self) -> None:
        if not self.nodes or any(
            n.process is None or n.process.poll() is not None for n in self.nodes
        ):
            return  # without a live kubelet nothing would finalize them; containerd.stop() kills
        for node in self.nodes:
            self.plane.kubectl(
                "delete", "pods", "-A", f"--field-selector=spec.nodeName={node.name}",
                "--wait=true", "--timeout=60s", check=False, timeout=90,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while self.container_pids() and time.monotonic() < deadline:
            time.sleep(0.25)

    def stop(self) -> None:
        """Stop and remove everything this object started; safe twice or after a failure."""
        mark = time.monotonic()

        def phase(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            self.stop_seconds[name] = round(now - mark, 2)
            mark = now

        with contextlib.suppress(Exception):
            self._delete_pods()
        phase("pods")
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                stop_process(node.process)
        phase("kubelets")

        def stop_containerd(node: KubeletNode) -> None:
            try:
                node.containerd.stop()
            except Exception as error:  # the rest of the teardown still runs
                log.error("harness.kubelet.containerd_stop", node=node.name, error=str(error))

        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as pool:
            list(pool.map(stop_containerd, self.nodes))
        phase("containerds")
        if self.base != Path("/nonexistent"):
            for point in _mounts_under(self.base):
                subprocess.run(["umount", point], capture_output=True, check=False)
        phase("unmount")
        left = [path for node in self.nodes for path in node.remove_cgroup_root()]
        if left:
            log.error("harness.kubelet.cgroups_left", cgroups=left)
        phase("cgroups")
        for path in HOST_PATHS:
            if path not in self._host_paths_before and os.path.lexists(path):
                shutil.rmtree(path, ignore_errors=True)
        for name, value in self._sysctls.items():
            with contextlib.suppress(OSError):
                if sysctl_path(name).read_text().strip() != value:
                    sysctl_path(name).write_text(f"{value}\n")
        self._sysctls = {}
        phase("host")
        if self._base_dir_arg is None and self.base != Path("/nonexistent"):
            if not _mounts_under(self.base):
                shutil.rmtree(self.base, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if self.nodes:
            phase("files")
            log.info("harness.kubelet.down", seconds=self.stop_seconds)
        self.nodes = []

    # ------------------------------------------------------------------ pods

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        status, body = self.plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return json.loads(body) if status == 200 else None

    def wait(self, what: str, check: Callable[[], object], timeout: float = 90.0) -> float:
        """Poll `check` until truthy, failing early if a kubelet exits; seconds waited."""
        started = time.monotonic()
        while not check():
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise KubeletError(f"kubelet {node.name} exited waiting for {what}")
            if time.monotonic() - started > timeout:
                raise KubeletError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.05)
        return round(time.monotonic() - started, 2)

    def phase(self, name: str, namespace: str = "default") -> str | None:
        pod = self.pod(name, namespace) or {}
        phase = pod.get("status", {}).get("phase")
        return str(phase) if phase else None

    def container_pid(self, name: str, namespace: str = "default") -> int | None:
        """The host PID of the pod's first container, from its Node's containerd."""
        pod = self.pod(name, namespace) or {}
        statuses = pod.get("status", {}).get("containerStatuses") or []
        node = pod.get("spec", {}).get("nodeName")
        if not statuses or not statuses[0].get("containerID") or node not in self.names:
            return None
        cid = statuses[0]["containerID"].split("://", 1)[1]
        return self.node_of(node).containerd.tasks().get(cid)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def host_network_pod(
    name: str,
    image: str,
    command: Sequence[str],
    *,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    privileged: bool = False,
    env: dict[str, str] | None = None,
    host_paths: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod these Nodes can run: host network, a local image (never pulled), pinned to
    `node` when given; each of `host_paths` is mounted at the same path."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": list(command),
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "volumeMounts": [{"name": f"host{i}", "mountPath": p} for i, p in enumerate(host_paths)],
    }
    if privileged:
        container["securityContext"] = {"privileged": True}
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "dnsPolicy": "Default",  # there is no cluster DNS
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "containers": [container],
        "volumes": [
            {"name": f"host{i}", "hostPath": {"path": p, "type": "Directory"}}
            for i, p in enumerate(host_paths)
        ],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": dict(labels or {})},
        "spec": spec,
    }


def slurmd_pod(
    name: str, image: str, slurm_node: str, cluster_dir: Path, node: str
) -> dict[str, Any]:
    """`slurmd -D -N <slurm_node>` of a testbed SlurmCluster in a pod on `node`: its
    directory (slurm.conf, munged's socket, spool, logs) mounted at the same path."""
    return host_network_pod(
        name, image, ["slurmd", "-D", "-N", slurm_node], node=node, privileged=True,
        labels={"app": "slurmd", "slurm-node": slurm_node},
        env={"SLURM_CONF": str(cluster_dir / "etc" / "slurm.conf")},
        host_paths=[str(cluster_dir)],
    )  # fmt: skip
