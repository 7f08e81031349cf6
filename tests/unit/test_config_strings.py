"""Strings in the configuration that sunkd writes into its log or compares: a pool name
must name something, a pool's Kubernetes bounds must not contradict each other, and the
identity written into the shared leadership row must be a short printable name. Each is
refused naming the key (exit 2 from the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sunkd.runtime.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def _load(tmp_path: Path, toml: str, **env: str) -> None:
    path = tmp_path / "sunkd.toml"
    path.write_text(toml)
    load_settings(path, env=env)


@pytest.mark.parametrize("name", ["", "   ", "a\x00b", "pool\nname", "x" * 300])
def test_a_pool_name_that_names_nothing_is_refused(tmp_path: Path, name: str) -> None:
    escaped = name.replace("\x00", "\\u0000").replace("\n", "\\n")
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f'[[pools]]\nname = "{escaped}"\n')
    assert caught.value.key == "pools[0].name"


def test_min_kubernetes_above_max_kubernetes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, '[[pools]]\nname = "a"\nmin_kubernetes = 5\nmax_kubernetes = 2\n')
    assert caught.value.key == "pools[0].min_kubernetes"
    assert "max_kubernetes" in caught.value.problem


def test_sensible_pools_are_accepted(tmp_path: Path) -> None:
    _load(tmp_path, '[[pools]]\nname = "gpu-a100"\nmin_kubernetes = 2\nmax_kubernetes = 2\n'
                    '[[pools]]\nname = "b"\nmin_kubernetes = 3\n')


@pytest.mark.parametrize("identity", ["", "  ", "host\x00-1", "host\n-1", "x" * 100_000])
def test_an_identity_that_is_not_a_short_printable_name_is_refused(
        tmp_path: Path, identity: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "", SUNKD_IDENTITY=identity)
    assert caught.value.key.startswith("identity")
    assert len(str(caught.value)) < 400, "the error does not echo 100 KB"


def test_a_sensible_identity_is_accepted(tmp_path: Path) -> None:
    _load(tmp_path, "", SUNKD_IDENTITY="sunkd-0.sunkd.svc-12345")


@pytest.mark.parametrize("env", [{"SUNKD_IDENTITY": ""}, {"SUNKD_IDENTITY": "x" * 100_000}])
def test_cli_exits_2_on_a_bad_identity(tmp_path: Path, env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sunkd", "events"], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "SUNKD_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/x.db",
             **env}, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "invalid configuration" in result.stderr and "identity" in result.stderr
