"""A real, private Slurm cluster on this machine, for tests, benchmarks and the demo.

sunkd's Slurm side is only worth something if it holds against real slurmctld,
slurmd and slurmrestd, so this harness starts them from Debian's packages in a private
temporary directory: its own munged (own key and socket), slurmctld, N x
`slurmd -N <name>` (Debian builds Slurm with MULTIPLE_SLURMD), and two slurmrestd (a
unix socket with rest_auth/local and 127.0.0.1:<free port> with rest_auth/jwt). Every
port is picked free, so two clusters run side by side. Bring-up takes about a second.

Three Slurm generations, one API (`SlurmCluster(..., version="24.11")`):

| version | from | REST |
| --- | --- | --- |
| 22.05 | the host's Debian 12 packages | v0.0.36-38, read-only for nodes |
| 24.11 | a Debian 13 (trixie) root | v0.0.40-42 |
| 26.05 | a Debian sid root | v0.0.42-45 |

`version=None` means whatever the host has installed. A version the host does not have
runs from a Debian root made once per machine by `scripts/prepare-slurm-root.sh SUITE`
(debootstrap + apt, cached outside the clone in `$SUNKD_SLURM_ROOT_CACHE`, default
/var/cache/sunkd/slurm-root-SUITE). The root shares the host's network, so its daemons
answer on 127.0.0.1 and the host's sunkd talks to them directly; the cluster's private
directory is bind-mounted into the root at the same path, so every path in slurm.conf
means the same inside and outside. Daemons and the Slurm CLI run as
`chroot ROOT env -i ...` (no host environment leaks in); `scontrol_path` is a wrapper
script doing that, for code that wants an `scontrol` binary.

Teardown stops exactly the processes this object started (it holds their `Popen`s,
never kills by name; `chroot` and `env` exec, so the PID is the daemon's), after
cancelling jobs; it also kills leftover `slurmstepd` of *this* cluster only (identified
by SLURM_CONF in their environment), since a stepd outlives its slurmd by design. Then
it unmounts what it mounted: its private directory in the root, and proc, dev, sys and
etc/hosts when no other cluster uses the root any more (`_RootMounts` counts users by
holder files whose owner PIDs are checked, so a crashed run's mounts are removed by the
next). It runs after a failed start too.

Facts this relies on (measured on Debian 12, Slurm 22.05.8; Debian 13, 24.11.5; sid,
26.05.5): munged must run as the munge user; slurmrestd refuses root and binds its unix
socket after dropping privileges (`-u nobody` on the host; 26.05 refuses `nobody`, so a
root uses its own `slurmrest` system user); 22.05's slurmrestd aborts without slurmdbd
unless `-s` names only the `openapi/v0.0.3x` plugins, 23.02+ take `-s openapi/slurmctld`
and serve one REST version per `data_parser_v0_0_4x` plugin present; slurmd 24.11+ in a
root stops with "No filesystem mounted on /sys/fs/cgroup" unless cgroup.conf says
`CgroupPlugin=disabled`; slurmd's detected hardware must match the config unless
`SlurmdParameters=config_overrides`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar

import structlog

from sunkd.domain.hostlist import expand
from sunkd.slurm.auth import mint_jwt
from sunkd.slurm.client import SUPPORTED_VERSIONS
from sunkd_testbed.lifecycle import Service

log = structlog.get_logger(__name__)

T = TypeVar("T")

REQUIRED_BINARIES = ("slurmctld", "slurmd", "slurmrestd", "scontrol", "sbatch", "munged")


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or a command against it failed."""


def _which(binary: str) -> str | None:
    return shutil.which(binary) or (
        f"/usr/sbin/{binary}" if os.access(f"/usr/sbin/{binary}", os.X_OK) else None
    )


# Slurm generation -> the Debian suite whose own packages ship it. The host's packages
# are used when they are that generation (Debian 12: 22.05); otherwise a root.
SLURM_GENERATIONS: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
SLURM_VERSIONS: tuple[str, ...] = tuple(SLURM_GENERATIONS)
# Must match RECIPE in scripts/prepare-slurm-root.sh: an older root is rebuilt, not used.
ROOT_RECIPE = 2
DEFAULT_ROOT_CACHE = Path("/var/cache/sunkd")
ROOT_CACHE_ENV = "SUNKD_SLURM_ROOT_CACHE"
_ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Slurm CLI tools the harness and its wrapper scripts run (inside the root, if any).
CLIENT_TOOLS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel")


def root_cache() -> Path:
    return Path(os.environ.get(ROOT_CACHE_ENV) or DEFAULT_ROOT_CACHE)


def root_dir(suite: str) -> Path:
    """Where `scripts/prepare-slurm-root.sh SUITE` puts the root."""
    return root_cache() / f"slurm-root-{suite}"


def root_stamp(suite: str) -> dict[str, object] | None:
    """The root's `.sunkd-root.json` (suite, Slurm release, packages), or None."""
    try:
        data = json.loads((root_dir(suite) / ".sunkd-root.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_HOST_RELEASE: list[str | None] = []


def host_release() -> str | None:
    """The host's Slurm release (`slurmctld -V`: `slurm-wlm 22.05.8`), or None."""
    if not _HOST_RELEASE:
        binary = _which("slurmctld")
        release: str | None = None
        if binary is not None:
            try:
                out = subprocess.run(
                    [binary, "-V"], capture_output=True, text=True, timeout=15, check=False
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            match = re.search(r"(\d+\.\d+\.\d+)", out)
            release = match.group(1) if match else None
        _HOST_RELEASE.append(release)
    return _HOST_RELEASE[0]


def _generation(release: str | None) -> str | None:
    """`24.11.5` -> `24.11`."""
    if release is None:
        return None
    return ".".join(release.split(".")[:2])


@dataclass(frozen=True)
class SlurmRuntime:
    """Where a generation's binaries come from: the host (`root` None) or a Debian root."""

    version: str | None
    release: str | None
    root: Path | None = None
    suite: str | None = None


def resolve_runtime(version: str | None = None) -> SlurmRuntime:
    """The host's packages or a prepared root for `version`; SlurmClusterError says how to
    get one when neither is there."""
    if os.geteuid() != 0:
        raise SlurmClusterError(
            "the Slurm harness needs root (munged as munge, slurmd as root, chroot, mount)"
        )
    host = host_release()
    if version is None or _generation(host) == version:
        missing = [b for b in REQUIRED_BINARIES if _which(b) is None]
        if missing:
            raise SlurmClusterError(
                f"Slurm binaries missing: {', '.join(missing)} (scripts/ensure-system-deps.sh)"
            )
        for user in ("munge", "nobody"):
            if not _has_user(user):
                raise SlurmClusterError(f"user {user!r} missing (munge package / base system)")
        return SlurmRuntime(version or _generation(host), host)
    suite = SLURM_GENERATIONS.get(version)
    if suite is None:
        raise SlurmClusterError(
            f"Slurm {version}: not installed here (host: {host or 'none'}) and not one of the "
            f"generations a root can be made for ({', '.join(SLURM_VERSIONS)})"
        )
    root = root_dir(suite)
    stamp = root_stamp(suite)
    how = f"run `scripts/prepare-slurm-root.sh {suite}` as root (`make test` does)"
    if stamp is None or not os.access(root / "usr" / "sbin" / "slurmrestd", os.X_OK):
        raise SlurmClusterError(f"no Slurm {version} root at {root}: {how}")
    if stamp.get("recipe") != ROOT_RECIPE:
        raise SlurmClusterError(
            f"the Slurm {version} root at {root} was made by recipe {stamp.get('recipe')}, "
            f"this harness needs {ROOT_RECIPE}: {how}"
        )
    release = stamp.get("slurm")
    if not isinstance(release, str) or _generation(release) != version:
        raise SlurmClusterError(
            f"the {suite} root at {root} has Slurm {release}, not {version} (the suite moved "
            "on; pin another generation in SLURM_GENERATIONS)"
        )
    for tool in ("chroot", "mount", "umount"):
        if shutil.which(tool) is None:
            raise SlurmClusterError(f"{tool} missing on the host (coreutils / util-linux)")
    return SlurmRuntime(version, release, root, suite)


def in_root(version: str | None) -> bool:
    """Does a cluster of Slurm `version` (None: the host's) run from a Debian root, i.e. is
    it not the generation of the host's packages? (`resolve_runtime`'s choice.)"""
    return version is not None and _generation(host_release()) != version


def available(version: str | None = None) -> tuple[bool, str]:
    """Can a cluster of `version` (None: the host's packages) start here?"""
    try:
        resolve_runtime(version)
    except SlurmClusterError as error:
        return False, str(error)
    return True, "ok"


def root_user(version: str, name: str) -> tuple[int, int] | None:
    """(uid, gid) of `name` inside the root of Slurm `version`, or None (no root, no such
    user): files its daemons read must be owned as they see it."""
    suite = SLURM_GENERATIONS.get(version)
    if suite is None:
        return None
    try:
        return _passwd(root_dir(suite)).get(name)
    except OSError:
        return None


def _passwd(root: Path) -> dict[str, tuple[int, int]]:
    """name -> (uid, gid) from ROOT/etc/passwd (a root's users differ from the host's)."""
    users: dict[str, tuple[int, int]] = {}
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
            users[fields[0]] = (int(fields[2]), int(fields[3]))
    return users


# ------------------------------------------------------------------------------ mounts


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace (octal escapes decoded)."""
    points: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _is_mounted(path: Path) -> bool:
    return str(path) in _mount_points()


def _run_tool(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


def _umount(path: Path) -> None:
    """Unmount one mount point; lazily when busy (a leftover process), never recursively."""
    if not _is_mounted(path):
        return
    result = _run_tool("umount", str(path))
    if result.returncode != 0:
        log.warning("harness.slurm.umount_lazy", path=str(path), error=result.stderr.strip())
        _run_tool("umount", "-l", str(path))


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: with the PID, identifies a process across PID reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class _RootMounts:
    """proc, dev, sys and etc/hosts in a root, shared by every cluster running from it,
    and one private directory per cluster, bind-mounted at the same path inside the root.

    Users are holder files in ROOT/run/sunkd-harness/ (owner PID and start time, the
    mount point, the directories created for it), changed under a flock. The first user
    mounts the shared ones (only those not mounted already, and records which); the last
    one unmounts exactly those. A holder whose process is gone is cleaned up by the
    next user, so a killed test run leaves nothing mounted for long.
    """

    # etc/hosts: the host's, so the host name resolves inside (without it every few
    # RPCs of 24.11 waited 5 s for a DNS timeout).
    SHARED = ("proc", "dev", "sys", "etc/hosts")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "run" / "sunkd-harness"
        self.holder: Path | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _holders(self) -> list[Path]:
        return sorted(self.dir.glob("holder-*.json"))

    def _release_holder(self, holder: Path) -> None:
        try:
            data = json.loads(holder.read_text())
        except (OSError, ValueError):
            data = {}
        point = data.get("mount_point")
        if isinstance(point, str):
            _umount(Path(point))
        for created in reversed(data.get("created", [])):
            with contextlib.suppress(OSError):
                Path(created).rmdir()  # only if empty: never recursive inside a root
        holder.unlink(missing_ok=True)

    def _reap_stale(self) -> None:
        for holder in self._holders():
            try:
                data = json.loads(holder.read_text())
                pid, started = int(data["pid"]), str(data["start"])
            except (OSError, ValueError, KeyError, TypeError):
                pid, started = -1, ""
            if pid > 0 and _start_time(pid) == started:
                continue
            log.warning("harness.slurm.stale_mounts", holder=holder.name, pid=pid)
            self._release_holder(holder)

    def _shared_file(self) -> Path:
        return self.dir / "shared.json"

    def acquire(self, private: Path) -> None:
        """Mount the shared ones if needed and `private` at ROOT/`private`."""
        with self._locked():
            self._reap_stale()
            if not self._holders():
                mounted: list[str] = []
                try:
                    for name in self.SHARED:
                        target = self.root / name
                        if _is_mounted(target) or not Path(f"/{name}").exists():
                            continue
                        if name == "etc/hosts" and not target.exists():
                            target.touch()  # a file mount point
                        args = ["-t", "proc", "proc"] if name == "proc" else ["--bind", f"/{name}"]
                        result = _run_tool("mount", *args, str(target))
                        if result.returncode != 0:
                            raise SlurmClusterError(
                                f"mount {' '.join(args)} {target}: {result.stderr.strip()}"
                            )
                        mounted.append(str(target))
                except BaseException:
                    for done in reversed(mounted):
                        _umount(Path(done))
                    raise
                self._shared_file().write_text(json.dumps({"mounted": mounted}))
            point = self.root / private.relative_to("/")
            created: list[str] = []
            missing = [p for p in (point, *point.parents) if not p.exists()]
            for directory in reversed(missing):
                directory.mkdir()
                created.append(str(directory))
            holder = self.dir / f"holder-{uuid.uuid4().hex}.json"
            data = {
                "pid": os.getpid(),
                "start": _start_time(os.getpid()),
                "private": str(private),
                "mount_point": str(point),
                "created": created,
            }
            holder.write_text(json.dumps(data))
            self.holder = holder
            result = _run_tool("mount", "--bind", str(private), str(point))
            if result.returncode != 0:
                self._release_holder(holder)
                self.holder = None
                self._release_shared_if_unused()
                raise SlurmClusterError(f"mount --bind {private} {point}: {result.stderr.strip()}")

    def _release_shared_if_unused(self) -> None:
        if self._holders():
            return
        try:
            mounted = json.loads(self._shared_file().read_text()).get("mounted", [])
        except (OSError, ValueError):
            mounted = []
        for done in reversed(mounted):
            _umount(Path(done))
        self._shared_file().unlink(missing_ok=True)

    def release(self) -> None:
        """Unmount this cluster's directory, and the shared ones if nobody else uses them."""
        if self.holder is None:
            return
        with self._locked():
            self._release_holder(self.holder)
            self.holder = None
            self._reap_stale()
            self._release_shared_if_unused()


def _free_ports(count: int) -> list[int]:
    """Distinct free TCP ports (slurmctld and slurmd bind 0.0.0.0, so check there)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("0.0.0.0", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _proc_state(pid: int) -> str | None:
    """`R`, `S`, `Z` ... or None if gone (PID 1 here reaps orphans late; a zombie is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def _children_of(pid: int) -> list[int]:
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    result: list[int] = []
    stack = [pid]
    while stack:
        for child in _children_of(stack.pop()):
            result.append(child)
            stack.append(child)
    return result


@dataclass(frozen=True)
class Daemon:
    name: str
    process: subprocess.Popen[bytes]


class SlurmCluster(Service):
    """A private Slurm cluster. Use as a (async) context manager or start()/stop().

    `nodes` is a hostlist (`"gpu-a[001-004]"`). `partitions` maps partition name to a
    hostlist (default: one partition `debug` with all nodes). `cpus` is per node.
    GPUs: 22.05's slurmd reports 0 for count-only gpu GRES (no device files) and
    slurmctld then sets the node INVAL, so `gpus` (`{"g1": ("fake", 2)}`) gives a node
    fake devices instead: character devices 195/0..N-1 (the NVIDIA driver's numbers) made
    with mknod in `dev/<node>/`, a gres.conf `File=` line and `Gres=gpu:TYPE:N` on its
    NodeName line (`GresTypes=gpu`). Nothing opens them; Slurm only counts and exports them.
    `version` picks the Slurm generation (`SLURM_VERSIONS`; None: the host's packages);
    `rest_user` defaults to `nobody` on the host and `slurmrest` in a root.
    `extra_conf` lines are added to slurm.conf before the nodes (`TopologyPlugin=...`,
    `PrologSlurmctld=...`) and `config_files` are written beside it
    (`{"topology.conf": ...}`): Slurm reads its other config files from slurm.conf's
    directory. `auth="slurm"` (Slurm 23.11+) runs the cluster with `AuthType=auth/slurm`
    and `CredType=cred/slurm` and no munged: a random `slurm.key` beside slurm.conf (mode
    0600, SlurmUser's: auth/slurm refuses a key any other user may read), `slurm_key`.
    """

    def __init__(
        self,
        nodes: str = "node[1-4]",
        *,
        partitions: Mapping[str, str] | None = None,
        cpus: int = 2,
        slurmd_timeout: int = 5,
        return_to_service: int = 1,
        rest_user: str | None = None,
        version: str | None = None,
        base_dir: Path | None = None,
        keep_dir: bool = False,
        start_timeout: float = 30.0,
        extra_conf: Sequence[str] = (),
        config_files: Mapping[str, str] | None = None,
        gpus: Mapping[str, tuple[str, int]] | None = None,
        auth: str = "munge",
    ) -> None:
        if auth not in ("munge", "slurm"):
            raise ValueError(f"auth {auth!r}: munge or slurm")
        self.auth = auth
        self.gpus = dict(gpus or {})
        self.extra_conf = tuple(extra_conf)
        self.config_files = dict(config_files or {})
        self.node_names: tuple[str, ...] = tuple(expand(nodes))
        if not self.node_names:
            raise ValueError("a cluster needs at least one node")
        self.nodes_hostlist = nodes
        self.partitions: dict[str, str] = dict(partitions or {"debug": nodes})
        self.cpus = cpus
        self.slurmd_timeout = slurmd_timeout
        self.return_to_service = return_to_service
        self._rest_user_arg = rest_user
        self.rest_user = rest_user or "nobody"
        self.version = version
        self.runtime: SlurmRuntime | None = None
        self.root: Path | None = None
        self._users: dict[str, tuple[int, int]] = {}
        self._mounts: _RootMounts | None = None
        self.slurm_user = "root"
        self._base_dir_arg = base_dir
        self.keep_dir = keep_dir
        self.start_timeout = start_timeout
        self.base: Path = Path("/nonexistent")
        self._daemons: dict[str, Daemon] = {}
        self._started = False
        self.ctld_port = 0
        self.rest_port = 0
        self.startup_seconds = 0.0
        self.node_ports: dict[str, int] = {}
        self.openapi_plugins: tuple[str, ...] = ()
        self.rest_version: str | None = None
        self.slurm_version: str | None = None

    # ------------------------------------------------------------------ paths/env

    @property
    def slurm_conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def jwt_key_path(self) -> Path:
        return self.base / "etc" / "jwt_hs256.key"

    @property
    def slurm_key(self) -> Path:
        """auth/slurm's key (`auth="slurm"`): `slurm.key` beside slurm.conf."""
        return self.base / "etc" / "slurm.key"

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "run" / "munge.socket.2"

    @property
    def rest_socket(self) -> Path:
        return self.base / "rest" / "slurmrestd.sock"

    @property
    def rest_unix_url(self) -> str:
        return f"unix:{self.rest_socket}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm CLI tools against this cluster (with a root, PATH starts
        with the wrapper scripts in `bin/`, which run the root's tools)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))
        }
        env["SLURM_CONF"] = str(self.slurm_conf)
        if self.root is not None:
            env["PATH"] = f"{self.base / 'bin'}:{env.get('PATH', _ROOT_PATH)}"
        return env

    @property
    def scontrol_path(self) -> str:
        """An `scontrol` for this cluster: the host's, or a wrapper that runs the root's
        (for `SlurmActuator(scontrol=...)`; a 22.05 scontrol cannot talk to 24.11+)."""
        if self.root is not None:
            return str(self.base / "bin" / "scontrol")
        return _which("scontrol") or "scontrol"

    def _command(
        self,
        cmd: Sequence[str],
        *,
        user: str | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """argv and environment to run `cmd` for this cluster: as it is on the host, or
        `chroot [--userspec] ROOT env -i PATH=... SLURM_CONF=... cmd` for a root."""
        if self.root is None:
            env = self.env
            env.update(extra_env or {})
            return list(cmd), env
        argv = ["chroot"]
        if user is not None:
            uid, gid = self._users[user]
            argv += [f"--userspec={uid}:{gid}", f"--groups={gid}"]
        argv += [str(self.root), "/usr/bin/env", "-i", "-C", str(self.base)]
        argv += [f"PATH={_ROOT_PATH}", "HOME=/", "LC_ALL=C", f"SLURM_CONF={self.slurm_conf}"]
        argv += [f"{k}={v}" for k, v in (extra_env or {}).items()]
        return argv + list(cmd), {"PATH": os.environ.get("PATH", _ROOT_PATH)}

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        """A JWT slurmctld accepts for `user` (signed with this cluster's key)."""
        return mint_jwt(self.jwt_key_path.read_bytes(), user, lifespan)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SlurmCluster:
        if self._started:
            return self
        self.runtime = resolve_runtime(self.version)
        self.root = self.runtime.root
        if self.root is not None:
            self._users = _passwd(self.root)
            for user in ("munge", "slurmrest"):
                if user not in self._users:
                    raise SlurmClusterError(
                        f"user {user!r} missing in {self.root}: rebuild it with "
                        f"scripts/prepare-slurm-root.sh --force {self.runtime.suite}"
                    )
            self.rest_user = self._rest_user_arg or "slurmrest"
        started = time.monotonic()
        try:
            self._prepare()
            if self.auth == "munge":
                self._start_munged()
            self._write_config()
            self._detect_plugins()
            self.start_slurmctld()
            for node in self.node_names:
                self.start_slurmd(node, wait=False)
            self.wait_for(self._all_idle, timeout=self.start_timeout, what="all nodes IDLE")
            self._start_slurmrestd()
        except BaseException as error:
            logs = self._log_tails()
            self.stop()
            if isinstance(error, SlurmClusterError):
                raise SlurmClusterError(f"{error}\n{logs}") from error
            raise
        self._started = True
        self.startup_seconds = time.monotonic() - started
        log.info(
            "harness.slurm.up",
            base=str(self.base),
            nodes=self.nodes_hostlist,
            rest=self.rest_url,
            version=self.rest_version,
            slurm=self.slurm_version,
            root=str(self.root) if self.root else None,
            seconds=round(self.startup_seconds, 2),
        )
        return self

    def stop(self) -> None:
        """Stop everything this object started; safe to call twice or after a failure."""
        ctld = self._daemons.get("slurmctld")
        if ctld is not None and ctld.process.poll() is None:
            self._cancel_jobs()
        for name in [n for n in self._daemons if n.startswith("slurmrestd")]:
            self._stop_daemon(name)
        for name in [n for n in self._daemons if n.startswith("slurmd-")]:
            self._stop_daemon(name)
        self._kill_own_stepds()
        self._stop_daemon("slurmctld")
        self._stop_daemon("munged")
        self._started = False
        if self._mounts is not None:
            self._mounts.release()
            self._mounts = None
        if not self.keep_dir and self._base_dir_arg is None and self.base != Path("/nonexistent"):
            shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ control

    def kill_slurmd(self, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill one node's slurmd (SIGKILL by default: a crash, nothing tells slurmctld)."""
        self._stop_daemon(f"slurmd-{node}", sig=sig)

    def start_slurmd(self, node: str, *, wait: bool = True) -> None:
        if node not in self.node_names:
            raise ValueError(f"{node!r} is not a node of this cluster")
        name = f"slurmd-{node}"
        if name in self._daemons and self._daemons[name].process.poll() is None:
            return
        (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(name, ["slurmd", "-D", "-N", node])
        if wait:
            self.wait_for(
                lambda: "NOT_RESPONDING" not in self.node_flags(node),
                timeout=self.start_timeout,
                what=f"{node} responding",
            )

    def start_dynamic_slurmd(self, node: str, conf: str) -> None:
        """`slurmd -D -Z -N <node> --conf <conf>` on the host (a dynamic node, slurmd(8)):
        slurmctld creates the node from it, or, when `node` exists already, takes it as
        that node's slurmd. It listens on `SlurmdPort` (the first node's port: stop that
        node's slurmd first). Stopped with the cluster (`kill_slurmd(node)` too)."""
        (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-Z", "-N", node, "--conf", conf])

    def stop_slurmctld(self) -> None:
        self._stop_daemon("slurmctld", sig=signal.SIGTERM)

    def start_slurmctld(self) -> None:
        if "slurmctld" in self._daemons and self._daemons["slurmctld"].process.poll() is None:
            return
        # -i: ignore unreadable state files; a restart recovers nodes and jobs from
        # StateSaveLocation ("Recovered state of N nodes").
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self.wait_for(self._ctld_up, timeout=self.start_timeout, what="slurmctld answering ping")

    def scontrol(self, *args: str, check: bool = True, timeout: float = 30.0) -> str:
        return self.run("scontrol", *args, check=check, timeout=timeout)

    def sbatch(
        self,
        *args: str,
        wrap: str = "sleep 600",
        nodelist: str | None = None,
        cpus: int | None = None,
        partition: str | None = None,
    ) -> int:
        """Submit a batch job; returns its id. Output goes to /dev/null."""
        cmd = [
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            f"--chdir={self.base / 'jobs'}",
        ]
        if nodelist:
            cmd.append(f"--nodelist={nodelist}")
        if cpus is not None:
            cmd.append(f"--cpus-per-task={cpus}")
        if partition:
            cmd.append(f"--partition={partition}")
        cmd.extend(args)
        cmd.append(f"--wrap={wrap}")
        out = self.run(*cmd)
        return int(out.strip().split(";")[0])

    def scancel(self, *job_ids: int) -> None:
        if job_ids:
            self.run("scancel", *(str(j) for j in job_ids), check=False)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30.0) -> str:
        """Run a Slurm CLI tool against this cluster; stdout, or SlurmClusterError."""
        argv, env = self._command(cmd)
        try:
            result = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise SlurmClusterError(f"{' '.join(cmd)}: timed out after {timeout} s") from error
        if check and result.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(cmd)}: rc={result.returncode}: "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result.stdout

    def node_states(self) -> dict[str, str]:
        """`sinfo %T` per node (`idle`, `draining`, `idle*` ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15)
        states: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def node_flags(self, node: str) -> str:
        """The `State=` field of `scontrol show node` (e.g. `IDLE+DRAIN`)."""
        out = self.scontrol("show", "node", node, check=False, timeout=15)
        match = re.search(r"\bState=(\S+)", out)
        return match.group(1) if match else "UNKNOWN+NOT_RESPONDING"

    def wait_for(
        self, predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timeout ({timeout:.0f} s) waiting for: {what}")
            time.sleep(interval)

    def rest_get(
        self, path: str, *, user: str = "root", token: str | None = None
    ) -> tuple[int, bytes]:
        """A synchronous GET on the JWT endpoint (for checks; sunkd uses its own client)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=30)
        try:
            connection.request(
                "GET",
                path,
                headers={
                    "X-SLURM-USER-NAME": user,
                    "X-SLURM-USER-TOKEN": token or self.token(user, 600),
                },
            )
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def daemon_pids(self) -> dict[str, int]:
        return {
            name: d.process.pid for name, d in self._daemons.items() if d.process.poll() is None
        }

    # ------------------------------------------------------------------ internals

    def _prepare(self) -> None:
        if self._base_dir_arg is not None:
            self.base = self._base_dir_arg
            self.base.mkdir(parents=True, exist_ok=True)
        else:
            self.base = Path(tempfile.mkdtemp(prefix="sunkd-slurm-"))
        # munged, slurm and nobody must traverse it.
        self.base.chmod(0o755)
        for sub in (
            "etc",
            "log",
            "state",
            "spool",
            "jobs",
            "rest",
            "munge/run",
            "munge/lib",
            "munge/log",
        ):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "jobs").chmod(0o1777)
        if self.root is not None:
            self.slurm_user = "slurm" if "slurm" in self._users else "root"
        else:
            self.slurm_user = "slurm" if _has_user("slurm") else "root"
        for sub in ("state", "log"):
            self._chown(self.base / sub, self.slurm_user)
        # slurmrestd creates its socket after setuid(rest_user).
        self._chown(self.base / "rest", self.rest_user)
        ports = _free_ports(2 + len(self.node_names))
        self.ctld_port, self.rest_port = ports[0], ports[1]
        self.node_ports = dict(zip(self.node_names, ports[2:], strict=True))
        if self.root is not None:
            self._mounts = _RootMounts(self.root)
            self._mounts.acquire(self.base)
            self._write_wrappers()

    def _chown(self, path: Path, user: str) -> None:
        """chown to `user` as the daemons will see it (a root has its own uids)."""
        if self.root is None:
            entry = pwd.getpwnam(user)
            uid, gid = entry.pw_uid, entry.pw_gid
        else:
            uid, gid = self._users[user]
        os.chown(path, uid, gid)

    def _write_wrappers(self) -> None:
        """bin/scontrol, bin/sinfo ... run the root's tool against this cluster."""
        assert self.root is not None
        bin_dir = self.base / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in CLIENT_TOOLS:
            argv, _ = self._command([tool])
            line = " ".join(shlex.quote(part) for part in argv)
            wrapper = bin_dir / tool
            wrapper.write_text(
                f'#!/bin/sh\n# {tool} of {self.root}, for this cluster\nexec {line} "$@"\n'
            )
            wrapper.chmod(0o755)

    def _start_munged(self) -> None:
        munge = self.base / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (munge, *munge.rglob("*")):
            self._chown(path, "munge")
        (munge / "lib").chmod(0o700)
        (munge / "log").chmod(0o700)
        (munge / "run").chmod(0o755)
        munge.chmod(0o755)
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={munge / 'run' / 'munged.pid'}",
                f"--seed-file={munge / 'lib' / 'munged.seed'}",
                f"--log-file={munge / 'log' / 'munged.log'}",
            ],
            user="munge",
        )
        self.wait_for(self.munge_socket.exists, timeout=10, what="munged socket")

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        etc = self.base / "etc"
        jwt_key = self.jwt_key_path
        jwt_key.write_bytes(os.urandom(32))
        jwt_key.chmod(0o600)
        self._chown(jwt_key, self.slurm_user)
        (etc / "plugstack.conf").write_text("")
        if self.root is not None:
            # slurmd 24.11+ in a root: "No filesystem mounted on /sys/fs/cgroup" otherwise
            # (the root's /sys is a non-recursive bind of the host's).
            (etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        lines = [
            "# generated by sunkd_testbed.slurm - private single-host multi-slurmd cluster",
            "ClusterName=sunkd",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.node_ports[self.node_names[0]]}",
            *(
                [
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                ]
                if self.auth == "munge"
                else ["AuthType=auth/slurm", "CredType=cred/slurm"]
            ),
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={jwt_key}",
            f"StateSaveLocation={self.base / 'state'}",
            f"SlurmdSpoolDir={self.base / 'spool'}/%n",
            f"SlurmctldPidFile={self.base / 'log' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.base / 'log'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.base / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.base / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={etc / 'plugstack.conf'}",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # Nodes are declared with our CPU/GPU counts, not what slurmd -C detects.
            "SlurmdParameters=config_overrides",
            # 1: an admin DOWN stays DOWN; a node DOWN for "Not responding" comes back
            # by itself (2 would also undo admin DOWNs, docs/slurm.md, "Measured behaviour").
            f"ReturnToService={self.return_to_service}",
            # Small, so a killed slurmd shows NOT_RESPONDING/DOWN within seconds.
            f"SlurmdTimeout={self.slurmd_timeout}",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=300",
        ]
        lines += self.extra_conf  # e.g. PrologSlurmctld=... (sunkd hook, docs/slurm.md)
        if self.gpus:
            lines.append("GresTypes=gpu")
            (etc / "gres.conf").write_text(self._fake_gpus())
            (etc / "gres.conf").chmod(0o644)
        for node in self.node_names:
            gres = ""
            if node in self.gpus:
                kind, count = self.gpus[node]
                gres = f" Gres=gpu:{kind}:{count}"
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={self.node_ports[node]} CPUs={self.cpus} Boards=1 SocketsPerBoard=1 "
                f"CoresPerSocket={self.cpus} ThreadsPerCore=1 "
                f"RealMemory=1000{gres} State=UNKNOWN"
            )
        for i, (name, hostlist) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            lines.append(
                f"PartitionName={name} Nodes={hostlist} Default={default} MaxTime=INFINITE State=UP"
            )
        self.slurm_conf.write_text("\n".join(lines) + "\n")
        self.slurm_conf.chmod(0o644)
        if self.auth == "slurm":
            self.slurm_key.write_bytes(os.urandom(1024))
            self.slurm_key.chmod(0o600)
            self._chown(self.slurm_key, self.slurm_user)
        for name, text in self.config_files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"config file {name!r}: a plain file name beside slurm.conf")
            (etc / name).write_text(text)
            (etc / name).chmod(0o644)

    def _fake_gpus(self) -> str:
        """mknod the fake devices; the gres.conf that lists them."""
        lines = []
        for node, (kind, count) in sorted(self.gpus.items()):
            if node not in self.node_names or count < 1:
                raise ValueError(f"gpus: {node!r} is not a node of this cluster or has no GPU")
            directory = self.base / "dev" / node
            directory.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                device = directory / f"nvidia{index}"
                if not device.exists():
                    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(195, index))
            files = f"{directory}/nvidia{'0' if count == 1 else f'[0-{count - 1}]'}"
            lines.append(f"NodeName={node} Name=gpu Type={kind} File={files}")
        return "\n".join(lines) + "\n"

    def _detect_plugins(self) -> None:
        """`slurmrestd -s list`: 22.05 has openapi/v0.0.3x (+ dbv0.0.3x, which abort
        without slurmdbd); 23.11+ has openapi/slurmctld serving v0.0.40+."""
        argv, env = self._command(["slurmrestd", "-u", self.rest_user, "-s", "list"])
        result = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        names = re.findall(r"openapi/([\w.]+)", result.stdout + result.stderr)
        if "slurmctld" in names:
            plugins = ["openapi/slurmctld"]
        else:
            plugins = [f"openapi/{n}" for n in names if re.fullmatch(r"v0\.0\.\d+", n)]
        if not plugins:
            raise SlurmClusterError(
                "slurmrestd -s list offered no usable openapi plugin: "
                f"{result.stderr.strip()[:300]}"
            )
        plugins.sort(
            key=lambda p: [int(x) if x.isdigit() else 0 for x in re.findall(r"\d+|\D+", p)]
        )
        self.openapi_plugins = tuple(plugins)

    def _start_slurmrestd(self) -> None:
        plugins = ",".join(self.openapi_plugins)
        self._spawn(
            "slurmrestd-local",
            [
                "slurmrestd",
                "-u",
                self.rest_user,
                "-a",
                "rest_auth/local",
                "-s",
                plugins,
                self.rest_unix_url,
            ],
        )
        self._spawn(
            "slurmrestd-jwt",
            [
                "slurmrestd",
                "-u",
                self.rest_user,
                "-a",
                "rest_auth/jwt",
                "-s",
                plugins,
                f"127.0.0.1:{self.rest_port}",
            ],
            extra_env={"SLURM_JWT": "daemon"},
        )
        token = self.token("root", 600)

        def probe() -> bool:
            for version in SUPPORTED_VERSIONS:
                try:
                    status, body = self.rest_get(f"/slurm/{version}/ping", token=token)
                except OSError:
                    return False
                if status == 200:
                    self.rest_version = version
                    try:
                        meta = json.loads(body).get("meta", {})
                        info = meta.get("slurm") or meta.get("Slurm") or {}
                        self.slurm_version = info.get("release")
                    except ValueError:
                        pass
                    return True
                if status != 404:
                    return False
            return False

        self.wait_for(
            probe, timeout=self.start_timeout, what="slurmrestd (jwt) /ping", interval=0.05
        )
        self.wait_for(
            self._unix_rest_up, timeout=self.start_timeout, what="slurmrestd (unix) /ping"
        )

    def _unix_rest_up(self) -> bool:
        if not self.rest_socket.exists() or self.rest_version is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(self.rest_socket))
                sock.sendall(
                    f"GET /slurm/{self.rest_version}/ping HTTP/1.1\r\nHost: localhost\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                head = sock.recv(64)
        except OSError:
            return False
        return head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))

    def _ctld_up(self) -> bool:
        ctld = self._daemons.get("slurmctld")
        if ctld is None or ctld.process.poll() is not None:
            raise SlurmClusterError("slurmctld exited during start")
        argv, env = self._command(["scontrol", "ping"])
        result = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        return result.returncode == 0 and "UP" in result.stdout

    def _all_idle(self) -> bool:
        states = self.node_states()
        return len(states) == len(self.node_names) and all(s == "idle" for s in states.values())

    def _spawn(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        user: str | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        argv, env = self._command(cmd, user=user, extra_env=extra_env)
        # In a root, chroot --userspec switches users (the root's uids).
        popen_user = user if self.root is None else None
        logfile: TextIO = open(self.base / "log" / f"{name}.stdout", "ab")  # type: ignore[assignment]
        try:
            process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,  # our signals to the test runner don't reach it
                user=popen_user,
                group=popen_user,
                extra_groups=[] if popen_user else None,
            )
        finally:
            logfile.close()
        self._daemons[name] = Daemon(name, process)

    def _stop_daemon(self, name: str, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        daemon = self._daemons.pop(name, None)
        if daemon is None:
            return
        process = daemon.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("harness.slurm.kill", daemon=name, pid=process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=5)

    def _cancel_jobs(self) -> None:
        try:
            out = self.run("squeue", "-h", "-o", "%i", check=False, timeout=15)
            jobs = out.split()
            if not jobs:
                return
            self.run("scancel", *jobs, check=False, timeout=15)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                left = self.run(
                    "squeue", "-h", "-t", "R,CG,PD,CF", "-o", "%i", check=False, timeout=5
                )
                if not left.strip():
                    return
                time.sleep(0.1)
        except SlurmClusterError as error:
            log.warning("harness.slurm.cancel_failed", error=str(error))

    def _kill_own_stepds(self) -> None:
        """slurmstepd outlives slurmd by design; kill only ours (SLURM_CONF in environ)."""
        marker = f"SLURM_CONF={self.slurm_conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != "slurmstepd":
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker not in environ:
                continue
            pid = int(entry.name)
            for target in [pid, *_descendants(pid)]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, signal.SIGKILL)
            log.info("harness.slurm.killed_stepd", pid=pid)

    def _log_tails(self) -> str:
        parts: list[str] = []
        for path in sorted((self.base / "log").glob("*")) if self.base.exists() else []:
            if path.is_file() and path.suffix in (".log", ".stdout"):
                try:
                    lines = path.read_text(errors="replace").splitlines()[-8:]
                except OSError:
                    continue
                if lines:
                    parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@contextlib.contextmanager
def slurm_cluster(**kwargs: object) -> Iterator[SlurmCluster]:
    """`with slurm_cluster(nodes="n[1-2]") as cluster:` - started and always stopped."""
    cluster = SlurmCluster(**kwargs)  # type: ignore[arg-type]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


# ------------------------------------------------------------------------------ CLI


def _main(argv: Sequence[str] | None = None) -> int:
    """`python -m sunkd_testbed.slurm up --dir D` runs a cluster in the foreground until
    interrupted (Ctrl-C or `down`), printing an env file; `down --dir D` stops it."""
    parser = argparse.ArgumentParser(prog="python -m sunkd_testbed.slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it running until SIGINT/SIGTERM")
    up.add_argument("--nodes", default="node[1-4]")
    up.add_argument("--cpus", type=int, default=2)
    up.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "sunkd-slurm")
    up.add_argument(
        "--version",
        choices=SLURM_VERSIONS,
        default=None,
        help="Slurm generation (default: the host's packages)",
    )
    down = sub.add_parser("down", help="stop the cluster started by `up --dir D`")
    down.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "sunkd-slurm")
    args = parser.parse_args(argv)
    pidfile = args.dir / "harness.pid"
    if args.command == "down":
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            print(f"no harness running for {args.dir}", file=sys.stderr)
            return 1
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            if _proc_state(pid) in (None, "Z"):
                return 0
            time.sleep(0.1)
        return 1
    cluster = SlurmCluster(
        args.nodes, cpus=args.cpus, base_dir=args.dir, keep_dir=True, version=args.version
    )
    stop = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    cluster.start()
    try:
        pidfile.write_text(str(os.getpid()))
        env_text = (
            f"export SLURM_CONF={cluster.slurm_conf}\n"
            f"export SUNKD_SLURM_URL={cluster.rest_url}\n"
            f"export SUNKD_SLURM_UNIX_URL={cluster.rest_unix_url}\n"
            f"export SUNKD_SLURM_JWT_KEY_FILE={cluster.jwt_key_path}\n"
        )
        if cluster.root is not None:  # the root's scontrol, sinfo ... first
            env_text += f"export PATH={cluster.base / 'bin'}:$PATH\n"
        (args.dir / "env.sh").write_text(env_text)
        print(env_text, end="", flush=True)
        while not stop:
            time.sleep(0.2)
    finally:
        cluster.stop()
        pidfile.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
