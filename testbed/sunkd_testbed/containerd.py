"""A private containerd for one real kubelet Node (sunkd_testbed.kubelet).

Debian 12's containerd 1.6 with runc, its own socket, state and config under a directory
of the test bed and its own root (imported images, unpacked), so it never touches
/var/lib/containerd or a system containerd's socket. Its CRI settings are the ones this
machine kind needs: the sandbox image is a locally imported pause image (no registry);
`restrict_oom_score_adj = true`, because root here lacks CAP_SYS_RESOURCE and the CRI's
oom_score_adj -998 for the pause container makes runc fail ("can't get final child's PID
from pipe: EOF"); a loopback-only CNI config, so the runtime reports NetworkReady (pods use
the host network; without any config the kubelet keeps its Node NotReady with "cni plugin
not initialized"); cgroupfs, not systemd.

Stopping it removes every container it still has (the kubelet's stopped sandboxes
included), stops the daemon by its PID and then kills, by PID, the shims it started: a shim
outlives containerd by design, and these are recognised by this containerd's socket path.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from sunkd_testbed.images import Image

CNI_BIN_DIR = Path("/usr/lib/cni")


class ContainerdError(RuntimeError):
    """containerd did not start, or a ctr command failed."""


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def pids_with_arg(needle: str) -> list[int]:
    """Live processes whose command line contains `needle` (a socket path of ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def stop_process(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class Containerd:
    """A private containerd: state, socket and config under `directory`; its root (images,
    snapshots) in `root`, kept between runs so images are unpacked once per machine."""

    def __init__(self, directory: Path, root: Path, pause_ref: str) -> None:
        self.dir = directory
        self.root = root
        self.pause_ref = pause_ref
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    def _config(self) -> str:
        cni_conf = self.dir / "cni-conf"
        cni_conf.mkdir(parents=True, exist_ok=True)
        # No pod network: the loopback plugin alone makes the CRI report NetworkReady.
        (cni_conf / "00-loopback.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": "sunkd-loopback", "plugins": [{"type": "loopback"}]}
        ))  # fmt: skip
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.root}"
state = "{self.dir / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
{cri}]
  sandbox_image = "{self.pause_ref}"
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
"""

    def ctr(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        command = ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def answers(self) -> bool:
        """`ctr version` reaches the daemon (it prints the client's part either way)."""
        command = ["ctr", "--address", str(self.socket), "version"]
        return subprocess.run(command, capture_output=True, timeout=10).returncode == 0

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "config.toml"
        config.write_text(self._config())
        with (self.dir / "containerd.log").open("ab") as handle:
            self.process = subprocess.Popen(
                ["containerd", "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise ContainerdError(f"containerd did not come up; log: {self.dir}/containerd.log")
            time.sleep(0.1)
        self._remove_containers()  # a crashed run's, kept in the root

    def _remove_containers(self) -> None:
        for cid in self.ctr("containers", "ls", "-q", check=False, timeout=30).split():
            self.ctr("tasks", "kill", "-s", "KILL", cid, check=False, timeout=30)
            self.ctr("tasks", "rm", "-f", cid, check=False, timeout=30)
            self.ctr("containers", "rm", cid, check=False, timeout=30)

    def import_images(self, images: Iterable[Image]) -> None:
        """Import the images this containerd does not have yet."""
        present = set(self.ctr("images", "ls", "-q", timeout=30).split())
        for image in images:
            if image.ref not in present:
                self.ctr("images", "import", str(image.tar), timeout=300)

    def tasks(self) -> dict[str, int]:
        """Running containers: id -> host PID."""
        out = self.ctr("tasks", "ls", check=False, timeout=30)
        tasks = {}
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                tasks[parts[0]] = int(parts[1])
        return tasks

    def shim_pids(self) -> list[int]:
        pid = self.process.pid if self.process is not None else -1
        return [p for p in pids_with_arg(f"-address {self.socket}") if p != pid]

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            # Sandboxes the kubelet stopped are still containers: remove every one, so
            # their shims exit and their snapshots are unmounted.
            self._remove_containers()
        shims = self.shim_pids()
        stop_process(self.process)
        for pid in shims:  # a shim outlives containerd by design; these are ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
