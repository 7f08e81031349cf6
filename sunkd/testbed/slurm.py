"""A real, private Slurm cluster on this machine, for tests, benchmarks and the demo.

sunkd's Slurm side is only worth something if it holds against real slurmctld,
slurmd and slurmrestd, so this harness starts them from Debian's packages in a private
temporary directory: its own munged (own key and socket), slurmctld, N x
`slurmd -N <name>` (Debian builds Slurm with MULTIPLE_SLURMD), and two slurmrestd (a
unix socket with rest_auth/local and 127.0.0.1:<free port> with rest_auth/jwt). Every
port is picked free, so two clusters run side by side. Bring-up takes about a second.

Teardown stops exactly the processes this object started (it holds their `Popen`s,
never kills by name), after cancelling jobs; it also kills leftover `slurmstepd` of
*this* cluster only (identified by SLURM_CONF in their environment), since a stepd
outlives its slurmd by design. It runs after a failed start too.

Facts this relies on (measured on Debian 12, Slurm 22.05.8): munged must run as the
munge user; slurmrestd refuses root (`-u nobody`) and binds its unix socket after
dropping privileges; 22.05's slurmrestd aborts without slurmdbd unless `-s` names only
the `openapi/v0.0.3x` plugins (24.11 uses `openapi/slurmctld`); slurmd's detected
hardware must match the config unless `SlurmdParameters=config_overrides`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TextIO, TypeVar

import structlog

from sunkd.domain.hostlist import expand
from sunkd.slurm.auth import mint_jwt
from sunkd.slurm.client import SUPPORTED_VERSIONS

log = structlog.get_logger(__name__)

T = TypeVar("T")

REQUIRED_BINARIES = ("slurmctld", "slurmd", "slurmrestd", "scontrol", "sbatch", "munged")


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or a command against it failed."""


def _which(binary: str) -> str | None:
    return shutil.which(binary) or (
        f"/usr/sbin/{binary}" if os.access(f"/usr/sbin/{binary}", os.X_OK) else None
    )


def available() -> tuple[bool, str]:
    """Can a cluster start here? (root, the Debian packages, the munge and nobody users)."""
    if os.geteuid() != 0:
        return False, "the Slurm harness needs root (munged as munge, slurmd as root)"
    missing = [b for b in REQUIRED_BINARIES if _which(b) is None]
    if missing:
        return (
            False,
            f"Slurm binaries missing: {', '.join(missing)} (scripts/ensure-system-deps.sh)",
        )
    for user in ("munge", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return False, f"user {user!r} missing (munge package / base system)"
    return True, "ok"


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


class SlurmCluster:
    """A private Slurm cluster. Use as a (async) context manager or start()/stop().

    `nodes` is a hostlist (`"gpu-a[001-004]"`). `partitions` maps partition name to a
    hostlist (default: one partition `debug` with all nodes). `cpus` is per node.
    No GPUs: 22.05's slurmd reports 0 for count-only gpu GRES (no device files) and
    slurmctld then sets the node INVAL, so GPU accounting is covered by fixtures.
    """

    def __init__(
        self,
        nodes: str = "node[1-4]",
        *,
        partitions: Mapping[str, str] | None = None,
        cpus: int = 2,
        slurmd_timeout: int = 5,
        return_to_service: int = 1,
        rest_user: str = "nobody",
        base_dir: Path | None = None,
        keep_dir: bool = False,
        start_timeout: float = 30.0,
    ) -> None:
        self.node_names: tuple[str, ...] = tuple(expand(nodes))
        if not self.node_names:
            raise ValueError("a cluster needs at least one node")
        self.nodes_hostlist = nodes
        self.partitions: dict[str, str] = dict(partitions or {"debug": nodes})
        self.cpus = cpus
        self.slurmd_timeout = slurmd_timeout
        self.return_to_service = return_to_service
        self.rest_user = rest_user
        self._base_dir_arg = base_dir
        self.keep_dir = keep_dir
        self.start_timeout = start_timeout
        self.base: Path = Path("/nonexistent")
        self._daemons: dict[str, Daemon] = {}
        self._started = False
        self.ctld_port = 0
        self.rest_port = 0
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
        """Environment for Slurm CLI tools against this cluster."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))
        }
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        """A JWT slurmctld accepts for `user` (signed with this cluster's key)."""
        return mint_jwt(self.jwt_key_path.read_bytes(), user, lifespan)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SlurmCluster:
        ok, why = available()
        if not ok:
            raise SlurmClusterError(why)
        if self._started:
            return self
        started = time.monotonic()
        try:
            self._prepare()
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
        log.info(
            "harness.slurm.up",
            base=str(self.base),
            nodes=self.nodes_hostlist,
            rest=self.rest_url,
            version=self.rest_version,
            seconds=round(time.monotonic() - started, 2),
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
        if not self.keep_dir and self._base_dir_arg is None and self.base != Path("/nonexistent"):
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> SlurmCluster:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

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
        try:
            result = subprocess.run(
                list(cmd),
                env=self.env,
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
        self.slurm_user = "slurm" if _has_user("slurm") else "root"
        for sub in ("state", "log"):
            shutil.chown(self.base / sub, self.slurm_user, self.slurm_user)
        # slurmrestd creates its socket after setuid(nobody).
        shutil.chown(self.base / "rest", self.rest_user)
        ports = _free_ports(2 + len(self.node_names))
        self.ctld_port, self.rest_port = ports[0], ports[1]
        self.node_ports = dict(zip(self.node_names, ports[2:], strict=True))

    def _start_munged(self) -> None:
        munge = self.base / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (munge, *munge.rglob("*")):
            shutil.chown(path, "munge", "munge")
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
        shutil.chown(jwt_key, self.slurm_user, self.slurm_user)
        (etc / "plugstack.conf").write_text("")
        lines = [
            "# generated by sunkd.testbed.slurm - private single-host multi-slurmd cluster",
            "ClusterName=sunkd",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.node_ports[self.node_names[0]]}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
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
        for node in self.node_names:
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={self.node_ports[node]} CPUs={self.cpus} Boards=1 SocketsPerBoard=1 "
                f"CoresPerSocket={self.cpus} ThreadsPerCore=1 "
                f"RealMemory=1000 State=UNKNOWN"
            )
        for i, (name, hostlist) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            lines.append(
                f"PartitionName={name} Nodes={hostlist} Default={default} MaxTime=INFINITE State=UP"
            )
        self.slurm_conf.write_text("\n".join(lines) + "\n")
        self.slurm_conf.chmod(0o644)

    def _detect_plugins(self) -> None:
        """`slurmrestd -s list`: 22.05 has openapi/v0.0.3x (+ dbv0.0.3x, which abort
        without slurmdbd); 23.11+ has openapi/slurmctld serving v0.0.40+."""
        result = subprocess.run(
            ["slurmrestd", "-u", self.rest_user, "-s", "list"],
            env=self.env,
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
        result = subprocess.run(
            ["scontrol", "ping"],
            env=self.env,
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
        env = self.env
        if extra_env:
            env.update(extra_env)
        logfile: TextIO = open(self.base / "log" / f"{name}.stdout", "ab")  # type: ignore[assignment]
        try:
            process = subprocess.Popen(
                list(cmd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,  # our signals to the test runner don't reach it
                user=user,
                group=user,
                extra_groups=[] if user else None,
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
    """`python -m sunkd.testbed.slurm up --dir D` runs a cluster in the foreground until
    interrupted (Ctrl-C or `down`), printing an env file; `down --dir D` stops it."""
    parser = argparse.ArgumentParser(prog="python -m sunkd.testbed.slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it running until SIGINT/SIGTERM")
    up.add_argument("--nodes", default="node[1-4]")
    up.add_argument("--cpus", type=int, default=2)
    up.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "sunkd-slurm")
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
    cluster = SlurmCluster(args.nodes, cpus=args.cpus, base_dir=args.dir, keep_dir=True)
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
