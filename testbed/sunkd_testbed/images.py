"""Container images for the test bed's real kubelet Nodes, made here without a registry,
a daemon or an image builder.

An image is one directory packed as one layer in the `docker save` format
(docker-archive: `manifest.json`, `<config digest>.json`, `<layer digest>/layer.tar`);
`ctr -n k8s.io images import` accepts it and names it by its RepoTags, and the CRI then
runs it with `imagePullPolicy: Never`. References are `localhost/...`, so nothing ever
tries a registry.

- `localhost/sunkd-pause:<kube version>-r<recipe>`: upstream's `build/pause/linux/pause.c`
  from the pinned k8s.io/kubernetes module in Go's module cache, `gcc -static`;
- `localhost/sunkd-busybox:<digest>-r<recipe>`: Debian's busybox-static and a few applet links;
- `localhost/sunkd-slurmd:<Slurm release>-<key>`: a Debian root of
  `scripts/prepare-slurm-root.sh` (bookworm 22.05, trixie 24.11, sid 26.05), the packages
  the Slurm harness runs from.

Tars are cached in `${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/kubelet-images/`, named after
their reference, whose tag is a key of what they are made from (the Kubernetes pin, the
busybox binary, the root's stamp, RECIPE); each is written to a temporary file and renamed
into place under a lock, so a half-written tar is never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sunkd_testbed.kubernetes import KUBE_VERSION, cache_root
from sunkd_testbed.slurm import SLURM_GENERATIONS, root_dir, root_stamp

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Left out of every layer: the runtime mounts the first four; a root's munge.key is not
# wanted (a slurmd pod authenticates through its cluster's munged socket); apt's lists,
# docs and locales are more than half of a root and only slow every import down.
_EXCLUDE = (
    "./dev/*", "./proc/*", "./sys/*", "./run/*", "./tmp/*", "./etc/munge/munge.key",
    "./var/lib/apt/lists/*", "./var/cache/apt/*", "./usr/share/doc/*", "./usr/share/man/*",
    "./usr/share/locale/*",
)  # fmt: skip
# Part of every cached tar's key: bump it when what goes into an image changes.
RECIPE = 2


class ImageError(RuntimeError):
    """An image could not be made (a missing input says how to get it)."""


@dataclass(frozen=True)
class Image:
    ref: str
    tar: Path


def image_cache() -> Path:
    return cache_root() / "kubelet-images"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _mounts_under(path: Path) -> list[str]:
    """Mount points strictly below `path` (a root in use has proc, dev and clusters' dirs)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(f"{path}/"):
            points.append(point)
    return points


def write_docker_archive(
    rootfs: Path,
    ref: str,
    out: Path,
    *,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
    user: str = "",
) -> Path:
    """Pack `rootfs` as a one-layer image named `ref` into `out` (written atomically)."""
    if not rootfs.is_dir():
        raise ImageError(f"{rootfs}: not a directory")
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:
        repo, tag = ref, "latest"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".image.", dir=out.parent) as work_dir:
        work = Path(work_dir)
        layer = work / "layer.tar"
        excludes = [f"--exclude={p}" for p in _EXCLUDE]
        # Whatever is mounted below a root (a running cluster's directory) is not the root's.
        excludes += [f"--exclude=.{p[len(str(rootfs)) :]}" for p in _mounts_under(rootfs)]
        result = subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(rootfs),
             *excludes, "-cf", str(layer), "."],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        # GNU tar exits 1 when a file changed while it read it: not for a root at rest.
        if result.returncode != 0:
            raise ImageError(f"tar of {rootfs}: rc={result.returncode}: {result.stderr[-500:]}")
        layer_digest = _sha256(layer)
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": {
                "Env": [DEFAULT_PATH],
                "Entrypoint": list(entrypoint) if entrypoint else None,
                "Cmd": list(cmd) if cmd else None,
                "WorkingDir": "/",
                "User": user,
            },
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [{"created": created, "created_by": f"sunkd_testbed.images {rootfs}"}],
        }
        config_bytes = json.dumps(config, separators=(",", ":")).encode()
        config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
        (work / config_name).write_bytes(config_bytes)
        manifest = [
            {"Config": config_name, "RepoTags": [f"{repo}:{tag}"],
             "Layers": [f"{layer_digest}/layer.tar"]}
        ]  # fmt: skip
        (work / "manifest.json").write_text(json.dumps(manifest))
        (work / "repositories").write_text(json.dumps({repo: {tag: layer_digest}}))
        partial = work / "image.tar"
        with tarfile.open(partial, "w") as archive:
            archive.add(layer, arcname=f"{layer_digest}/layer.tar")
            for name in (config_name, "manifest.json", "repositories"):
                archive.add(work / name, arcname=name)
        os.replace(partial, out)
    return out


@contextlib.contextmanager
def _cache_lock() -> Iterator[Path]:
    cache = image_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield cache


def _tar_path(cache: Path, ref: str) -> Path:
    """The cached tar of `ref`, named after it: a tar never holds another tag."""
    return cache / f"{ref.removeprefix('localhost/').replace(':', '_')}.tar"


def _go_module_dir(module: str) -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    try:
        gomodcache = subprocess.run(
            [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        raise ImageError(f"cannot ask Go for its module cache: {error}") from error
    return Path(gomodcache) / module


def pause_image(version: str = KUBE_VERSION) -> Image:
    """The pod sandbox image: upstream's pause.c, from the pinned k8s.io/kubernetes module."""
    ref = f"localhost/sunkd-pause:{version}-r{RECIPE}"
    with _cache_lock() as cache:
        out = _tar_path(cache, ref)
        if out.exists():
            return Image(ref, out)
        source = _go_module_dir(f"k8s.io/kubernetes@{version}") / "build/pause/linux/pause.c"
        if not source.is_file():
            raise ImageError(
                f"{source} missing: the Go module cache lacks k8s.io/kubernetes@{version} "
                "(scripts/build-kubernetes.sh downloads it)"
            )
        with tempfile.TemporaryDirectory(prefix=".pause.", dir=cache) as rootfs:
            binary = Path(rootfs) / "pause"
            for command in (
                ["gcc", "-Os", "-static", f"-DVERSION={version}", "-o", str(binary), str(source)],
                ["strip", str(binary)],
            ):
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise ImageError(f"{command[0]}: {done.stderr.strip()} (gcc, libc6-dev)")
            write_docker_archive(Path(rootfs), ref, out, entrypoint=["/pause"], user="65535:65535")
        return Image(ref, out)


BUSYBOX_APPLETS = ("sh", "sleep", "cat", "ls", "echo", "id", "hostname", "ps", "grep", "env")


def busybox_image() -> Image:
    """A shell for plain pods: Debian's static busybox and a few applet links."""
    source = Path("/bin/busybox")
    if not source.is_file():
        raise ImageError("/bin/busybox missing (Debian package busybox-static)")
    digest = _sha256(source)[:12]
    ref = f"localhost/sunkd-busybox:{digest}-r{RECIPE}"
    with _cache_lock() as cache:
        out = _tar_path(cache, ref)
        if out.exists():
            return Image(ref, out)
        with tempfile.TemporaryDirectory(prefix=".busybox.", dir=cache) as work:
            rootfs = Path(work)
            for sub in ("bin", "etc", "tmp", "root", "proc", "sys", "dev"):
                (rootfs / sub).mkdir()
            shutil.copy2(source, rootfs / "bin" / "busybox")
            for applet in BUSYBOX_APPLETS:
                (rootfs / "bin" / applet).symlink_to("busybox")
            (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
            (rootfs / "etc" / "group").write_text("root:x:0:\n")
            rootfs.chmod(0o755)
            write_docker_archive(rootfs, ref, out, cmd=["/bin/sh"])
        return Image(ref, out)


def slurm_image(version: str) -> Image:
    """slurmd (and the Slurm client tools) of generation `version`, from its Debian root."""
    suite = SLURM_GENERATIONS.get(version)
    if suite is None:
        raise ImageError(f"Slurm {version}: not one of {', '.join(SLURM_GENERATIONS)}")
    root, stamp = root_dir(suite), root_stamp(suite)
    if stamp is None or not os.access(root / "usr" / "sbin" / "slurmd", os.X_OK):
        raise ImageError(
            f"no Slurm {version} root at {root}: run `scripts/prepare-slurm-root.sh {suite}` "
            "as root (`make slurm-roots` does)"
        )
    release = str(stamp.get("slurm"))
    key = hashlib.sha256(json.dumps([RECIPE, stamp], sort_keys=True).encode()).hexdigest()[:12]
    ref = f"localhost/sunkd-slurmd:{release}-{key}"
    with _cache_lock() as cache:
        out = _tar_path(cache, ref)
        if not out.exists():
            for old in cache.glob(f"sunkd-slurmd_{version}.*.tar"):  # an older root's image
                old.unlink()
            write_docker_archive(root, ref, out, cmd=["slurmd", "-D"])
        return Image(ref, out)


def main() -> int:
    """`python -m sunkd_testbed.images [VERSION...]`: make (or find) the images, list them."""
    import sys

    images = [pause_image(), busybox_image()]
    for version in sys.argv[1:]:
        images.append(slurm_image(version))
    for image in images:
        print(f"{image.ref}\t{image.tar}\t{image.tar.stat().st_size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
