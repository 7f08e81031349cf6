"""The Debian roots behind Slurm 24.11 and 26.05 (scripts/prepare-slurm-root.sh): what the
harness mounts into them is unmounted again, after a failed start too, and a crashed
run's mounts are removed by the next user of the root."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from sunkd_testbed.slurm import (
    SLURM_GENERATIONS,
    SlurmCluster,
    SlurmClusterError,
    _RootMounts,
    available,
    resolve_runtime,
    root_dir,
)
from tests.conftest import require
from tests.integration.slurm_helpers import slurm_test_versions

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

ROOT_VERSIONS = [v for v in slurm_test_versions() if v != "22.05"]


def _mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def _root(version: str) -> Path:
    ok, why = available(version)
    require(ok, why)
    runtime = resolve_runtime(version)
    assert runtime.root is not None, f"{version} runs from the host here"
    return runtime.root


@pytest.fixture(params=[pytest.param(v, id=f"slurm-{v}") for v in ROOT_VERSIONS])
def version(request: pytest.FixtureRequest) -> str:
    _root(request.param)
    return str(request.param)


def test_a_missing_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SUNKD_SLURM_ROOT_CACHE", str(tmp_path))
    assert root_dir("trixie") == tmp_path / "slurm-root-trixie"
    ok, why = available("24.11")
    assert not ok
    assert f"no Slurm 24.11 root at {tmp_path}/slurm-root-trixie" in why
    assert "scripts/prepare-slurm-root.sh trixie" in why
    with pytest.raises(SlurmClusterError, match=r"prepare-slurm-root\.sh sid"):
        SlurmCluster("x1", version="26.05").start()
    with pytest.raises(SlurmClusterError, match="not one of the generations"):
        resolve_runtime("21.08")
    assert set(SLURM_GENERATIONS) == {"22.05", "24.11", "26.05"}


def test_failed_start_unmounts_and_stops_everything(version: str) -> None:
    root = _root(version)
    # slurmctld cannot answer within 1 ms: the start fails after munged and slurmctld ran.
    cluster = SlurmCluster("fs[1-2]", version=version, start_timeout=0.001)
    with pytest.raises(SlurmClusterError, match="timeout"):
        cluster.start()
    point = root / cluster.base.relative_to("/")
    assert str(point) not in _mounts()
    assert not point.exists() and not cluster.base.exists()
    assert cluster.daemon_pids() == {}
    assert not [h for h in (root / "run" / "sunkd-harness").glob("holder-*.json")
                if str(cluster.base) in h.read_text()]  # fmt: skip


def test_a_dead_runs_mounts_are_removed_by_the_next(version: str) -> None:
    root = _root(version)
    mounts = _RootMounts(root)
    with tempfile.TemporaryDirectory(prefix="sunkd-stale-") as stale_dir:
        stale = Path(stale_dir)
        point = root / stale.relative_to("/")
        # A run that mounted its directory and was killed: its PID is gone.
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        point.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(stale), str(point)], check=True)
        holder = mounts.dir / f"holder-{uuid.uuid4().hex}.json"
        mounts.dir.mkdir(parents=True, exist_ok=True)
        holder.write_text(json.dumps({
            "pid": int(dead.stdout), "start": "0", "private": str(stale),
            "mount_point": str(point), "created": [str(point)],
        }))  # fmt: skip
        try:
            with tempfile.TemporaryDirectory(prefix="sunkd-next-") as next_dir:
                mounts.acquire(Path(next_dir))
                try:
                    assert not holder.exists()
                    assert str(point) not in _mounts() and not point.exists()
                    mine = root / Path(next_dir).relative_to("/")
                    assert str(mine) in _mounts()
                    for shared in ("proc", "dev", "sys"):
                        assert str(root / shared) in _mounts()
                finally:
                    mounts.release()
                assert str(mine) not in _mounts() and not mine.exists()
        finally:
            if str(point) in _mounts():
                subprocess.run(["umount", str(point)], check=False)
            holder.unlink(missing_ok=True)
            if point.exists():
                point.rmdir()


def test_two_roots_at_once_unmount_only_their_own() -> None:
    roots = {v: _root(v) for v in ROOT_VERSIONS}
    require(len(roots) == 2, "needs both roots")
    clusters = [SlurmCluster("tr[1-2]", version=v) for v in roots]
    try:
        for cluster in clusters:
            cluster.start()
        a, b = clusters
        assert a.root != b.root and a.slurm_version != b.slurm_version
        b.stop()
        assert str(b.root / b.base.relative_to("/")) not in _mounts()
        assert str(a.root / a.base.relative_to("/")) in _mounts()
        assert a.node_states() == {"tr1": "idle", "tr2": "idle"}
    finally:
        for cluster in clusters:
            cluster.stop()


def test_the_root_recipes_plugin_check_accepts_slurm_22_05() -> None:
    """A bookworm root (Slurm 22.05: REST through openapi/v0.0.3x, no openapi/slurmctld)
    passes the recipe's plugin check, shown on the host's own 22.05 plugin directory."""
    plugdirs = sorted(Path("/usr/lib").glob("*/slurm-wlm"))
    require(bool(plugdirs) and (plugdirs[0] / "openapi_v0_0_38.so").exists(), "no host Slurm 22.05")
    script = Path(__file__).resolve().parents[2] / "scripts" / "prepare-slurm-root.sh"
    result = subprocess.run(
        [str(script), "--check-plugins", str(plugdirs[0])], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    empty = tempfile.mkdtemp()
    result = subprocess.run([str(script), "--check-plugins", empty], capture_output=True, text=True)
    assert result.returncode == 1 and "auth_munge.so missing" in result.stderr
