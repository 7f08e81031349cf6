"""Every number in the configuration is finite and within a bounded range;
NaN, inf and absurd values are refused naming the key (exit 2 from the CLI)."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from sunkd.domain.events import Event
from sunkd.runtime.config import ConfigError, load_settings
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.source import SlurmSource

# (TOML key, environment variable) of every number in Settings.
NUMBERS = [
    ("lease_seconds", "SUNKD_LEASE_SECONDS"),
    ("snapshot_every", "SUNKD_SNAPSHOT_EVERY"),
    ("snapshots_kept", "SUNKD_SNAPSHOTS_KEPT"),
    ("slurm.poll_interval", "SUNKD_SLURM_POLL_INTERVAL"),
    ("slurm.request_timeout", "SUNKD_SLURM_REQUEST_TIMEOUT"),
    ("slurm.max_response_bytes", "SUNKD_SLURM_MAX_RESPONSE_BYTES"),
    ("kubernetes.request_timeout", "SUNKD_KUBERNETES_REQUEST_TIMEOUT"),
]
POOL_NUMBERS = ["min_slurm", "min_kubernetes", "max_kubernetes", "dwell_seconds",
                "max_in_flight", "drain_timeout_seconds", "reclaim_grace_seconds"]
HOSTILE = ["nan", "inf", "-inf", "1e300", "-1e300"]


def _toml(key: str, value: str) -> str:
    section, _, name = key.rpartition(".")
    return (f"[{section}]\n" if section else "") + f"{name} = {value}\n"


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(("key", "env_name"), NUMBERS)
def test_hostile_number_in_environment_is_refused_naming_the_key(
        key: str, env_name: str, value: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(env={env_name: value})
    assert env_name in str(error.value) and key in str(error.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "9223372036854775807"])
@pytest.mark.parametrize(("key", "env_name"), NUMBERS)
def test_hostile_number_in_the_file_is_refused_naming_the_key(
        tmp_path: Path, key: str, env_name: str, value: str) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text(_toml(key, value))  # TOML has nan and inf literals
    with pytest.raises(ConfigError) as error:
        load_settings(config, env={})
    assert key in str(error.value)


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "-1", "9223372036854775807"])
@pytest.mark.parametrize("attr", POOL_NUMBERS)
def test_hostile_pool_number_is_refused_naming_the_key(
        tmp_path: Path, attr: str, value: str) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text(f"[[pools]]\nname = 'gpu-a'\n{attr} = {value}\n")
    with pytest.raises(ConfigError) as error:
        load_settings(config, env={})
    assert f"pools[0].{attr}" in str(error.value)


def test_sensible_numbers_are_accepted(tmp_path: Path) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text("lease_seconds = 30\nsnapshot_every = 5000\n[slurm]\npoll_interval = 0.5\n"
                      "request_timeout = 60\nmax_response_bytes = 268435456\n[kubernetes]\n"
                      "request_timeout = 10\n[[pools]]\nname = 'a'\nmax_kubernetes = 100\n"
                      "dwell_seconds = 0\ndrain_timeout_seconds = 86400\n")
    settings = load_settings(config, env={})
    assert settings.slurm.max_response_bytes == 2**28
    assert load_settings(env={}).slurm.max_response_bytes == 64 * 2**20


@pytest.mark.parametrize("value", ["nan", "inf", "1e300"])
def test_cli_exits_2_on_hostile_lease_seconds(tmp_path: Path, value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "sunkd", "events"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60,
                            env={"SUNKD_LEASE_SECONDS": value, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    assert "lease_seconds" in result.stderr and "Traceback" not in result.stderr


async def _no_sink(_events: Sequence[Event]) -> None:
    return None


@pytest.mark.parametrize("interval", [math.nan, math.inf, 0.0, -1.0])
def test_slurm_source_refuses_a_poll_interval_that_is_not_positive_and_finite(
        interval: float) -> None:
    client = SlurmRestClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="poll_interval"):
        SlurmSource(client, _no_sink, poll_interval=interval)


async def test_poll_interval_nan_does_not_poll_in_a_tight_loop() -> None:
    """Before: `max(0.0, nan - elapsed)` is 0, so a NaN interval polled back to back
    (200 requests in 0.09 s in the fault run). A NaN set after construction falls
    back to the default interval."""
    client = SlurmRestClient("http://127.0.0.1:9")  # nothing listens: each poll fails fast
    source = SlurmSource(client, _no_sink, poll_interval=5.0)
    source.poll_interval = math.nan
    polls = 0
    original = source.poll_once

    async def counting() -> list[Event]:
        nonlocal polls
        polls += 1
        return await original()

    source.poll_once = counting  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 5)
    await client.close()
    assert polls == 1
