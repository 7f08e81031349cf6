"""Settings: TOML + environment, strict validation with the key named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sunkd.runtime.config import DEFAULT_DATABASE_URL, ConfigError, load_settings


def test_defaults_are_the_embedded_setup() -> None:
    settings = load_settings(env={})
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.listen == "127.0.0.1:8080"
    assert settings.slurm.poll_interval == 5.0


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text("""
database_url = "postgresql+asyncpg://sunkd@db/sunkd"
[slurm]
url = "unix:/run/slurmrestd.sock"
poll_interval = 2
partitions = ["gpu", "cpu"]
[[pools]]
name = "gpu-a"
partitions = ["gpu"]
node_selector = { "pool" = "gpu-a" }
max_in_flight = 2
""")
    env = {"SUNKD_SLURM_POLL_INTERVAL": "7.5", "SUNKD_KUBERNETES_ENABLED": "false",
           "SUNKD_SLURM_PARTITIONS": "a, b"}
    settings = load_settings(config, env=env, listen="0.0.0.0:9000")
    assert settings.database_url == "postgresql+asyncpg://sunkd@db/sunkd"
    assert settings.slurm.url == "unix:/run/slurmrestd.sock"
    assert settings.slurm.poll_interval == 7.5
    assert settings.slurm.partitions == ("a", "b")
    assert settings.kubernetes.enabled is False
    assert settings.listen == "0.0.0.0:9000"
    assert settings.pools[0].name == "gpu-a" and settings.pools[0].max_in_flight == 2
    assert settings.pools[0].node_selector == {"pool": "gpu-a"}


@pytest.mark.parametrize(("toml", "env", "key"), [
    ("[slurm]\npoll_interval = 'fast'", {}, "slurm.poll_interval"),
    ("", {"SUNKD_SLURM_POLL_INTERVAL": "soon"}, "SUNKD_SLURM_POLL_INTERVAL"),
    ("[slurm]\nurl = 'ftp://x'", {}, "slurm.url"),
    ("[slurm]\nrequest_timeout = 5", {}, "slurm.request_timeout"),
    ("listen = 'nowhere'", {}, "listen"),
    ("log_level = 'loud'", {}, "log_level"),
    ("snapshot_encoder = 'fork'", {}, "snapshot_encoder"),
    ("", {"SUNKD_SNAPSHOT_ENCODER": "process"}, "snapshot_encoder"),
    ("typo_key = 1", {}, "typo_key"),
    ("[slurm]\nurll = 'x'", {}, "slurm.urll"),
    ("[[pools]]\nname = 'a'\nprefer = 'Nobody'", {}, "pools[0].prefer"),
    ("[[pools]]\nname = 'a'\n[[pools]]\nname = 'a'", {}, "pools"),
    # Both read what Kubernetes says of the Nodes (labels; allocatable GPUs): without
    # Kubernetes the file could never be written and every node would be unknown.
    ("[topology]\nfile = '/etc/slurm/topology.conf'\n[kubernetes]\nenabled = false", {},
     "topology.file"),
    ("[gres]\ncheck = true\n[kubernetes]\nenabled = false", {}, "gres.check"),
])
def test_invalid_settings_name_the_key(tmp_path: Path, toml: str, env: dict[str, str],
                                       key: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError) as error:
        load_settings(config, env=env)
    assert key in str(error.value)


def test_cli_exits_2_on_invalid_config(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[slurm]\npoll_interval = -1\n")
    result = subprocess.run([sys.executable, "-m", "sunkd", "--config", str(config), "events"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert "slurm.poll_interval" in result.stderr
