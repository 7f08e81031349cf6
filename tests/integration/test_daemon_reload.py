"""SIGHUP reloads the config file's pools without a restart (and a broken file keeps
the running config)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from sunkd.runtime.config import load_settings
from sunkd.runtime.daemon import Daemon


async def test_sighup_reloads_pools_and_survives_a_broken_file(tmp_path: Path) -> None:
    config = tmp_path / "sunkd.toml"
    config.write_text(f"""
database_url = "sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}"
listen = "127.0.0.1:0"
[kubernetes]
enabled = false
[[pools]]
name = "gpu-a"
partitions = ["gpu"]
""")
    daemon = Daemon(load_settings(config, env={}), config_path=config)
    task = asyncio.create_task(daemon.run())
    try:
        deadline = time.monotonic() + 20
        while daemon.reconciler is None or not daemon.reconciler.config_pools:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        assert [p.name for p in daemon.reconciler.config_pools] == ["gpu-a"]
        # The leader records its config pools in the log: the fold knows every pool.
        while daemon.state().configured_pools is None:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        assert [p.name for p in daemon.state().configured_pools or ()] == ["gpu-a"]

        config.write_text(config.read_text() + '[[pools]]\nname = "cpu-b"\nmax_in_flight = 3\n')
        os.kill(os.getpid(), signal.SIGHUP)
        while [p.name for p in daemon.reconciler.config_pools] != ["gpu-a", "cpu-b"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert daemon.reconciler.config_pools[1].ownership.max_in_flight == 3
        while [p.name for p in daemon.state().configured_pools or ()] != ["cpu-b", "gpu-a"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

        config.write_text("[[pools]]\nname = 'x'\nprefer = 'Nobody'\n")  # invalid
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.3)
        assert [p.name for p in daemon.reconciler.config_pools] == ["gpu-a", "cpu-b"]
    finally:
        daemon.stop_event.set()
        assert await asyncio.wait_for(task, 30) == 0
