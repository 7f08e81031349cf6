"""Snapshots are pruned to the newest few (they were never pruned: ~10 MB
each at 10,000 nodes, one every `snapshot_every` events), and the newest is the one
loaded."""

from __future__ import annotations

from typing import Any

import pytest

from sunkd.store.eventlog import SNAPSHOTS_KEPT, EventLog


async def test_only_the_newest_snapshots_are_kept(database_url: str) -> None:
    log = await EventLog.open(database_url, migrate=True)
    try:
        for seq in range(1, 8):
            await log.save_snapshot(seq * 10, {"seq": seq})
        assert await log.snapshot_seqs() == [50, 60, 70][-SNAPSHOTS_KEPT:]
        latest = await log.latest_snapshot()
        assert latest is not None and latest[0] == 70 and latest[1] == {"seq": 7}
        await log.save_snapshot(80, {"seq": 8}, keep=1)
        assert await log.snapshot_seqs() == [80]
    finally:
        await log.close()


async def test_the_engine_keeps_the_configured_number(database_url: str) -> None:
    """`snapshots_kept` (config, Helm `config.snapshotsKept`) reaches the pruning."""
    from dataclasses import replace

    from sunkd.domain.state import EMPTY
    from sunkd.runtime.reconciler import Reconciler

    log = await EventLog.open(database_url, migrate=True)
    try:
        engine = Reconciler(log, snapshot_every=1, snapshots_kept=2)
        for seq in (5, 9, 14, 20):
            await engine._maybe_snapshot(replace(EMPTY, last_seq=seq))
        assert await log.snapshot_seqs() == [14, 20]
        # Stored from pre-encoded text (a node at a time), read back as the same JSON.
        from sunkd.domain.snapshot import state_to_json
        latest = await log.latest_snapshot()
        assert latest is not None
        assert latest[1] == state_to_json(replace(EMPTY, last_seq=20))
    finally:
        await log.close()


@pytest.mark.parametrize("in_child", [True, False])
async def test_a_big_snapshot_is_encoded_where_configured(
        database_url: str, in_child: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`snapshot_encoder` (config, Helm `config.snapshotEncoder`): "child" forks from
    OFFLOAD_NODES nodes on, "thread" never does; both store the same snapshot."""
    from dataclasses import replace

    from sunkd.domain.snapshot import state_to_json
    from sunkd.domain.state import EMPTY, NodeState
    from sunkd.runtime import reconciler as reconciler_module

    forks: list[int] = []
    real_encode_in_child = reconciler_module.encode_in_child

    async def counting(encode: Any) -> Any:
        forks.append(1)
        return await real_encode_in_child(encode)

    monkeypatch.setattr(reconciler_module, "encode_in_child", counting)
    nodes = {f"n{i:04d}": NodeState(name=f"n{i:04d}")
             for i in range(reconciler_module.OFFLOAD_NODES)}
    state = replace(EMPTY, nodes=nodes, last_seq=10 * len(nodes))
    log = await EventLog.open(database_url, migrate=True)
    try:
        engine = reconciler_module.Reconciler(log, snapshot_every=1, snapshot_in_child=in_child)
        await engine._maybe_snapshot(state)
        assert forks == ([1] if in_child else [])
        latest = await log.latest_snapshot()
        assert latest is not None and latest[1] == state_to_json(state)
    finally:
        await log.close()


async def test_a_written_snapshot_is_not_kept_alive(database_url: str) -> None:
    """Once stored, the snapshot's text is the database's, not the process's: at 10,000
    nodes the first one (~24 MB) stayed referenced for the daemon's life by SQLAlchemy's
    compiled-statement cache, which keeps the first statement it compiled, values and all
    (bench/scale.py --memstats found it)."""
    import gc
    import types

    from sunkd.store.eventlog import JSONText

    log = await EventLog.open(database_url, migrate=True)
    try:
        for seq in (10, 20):  # the second one is compiled from the cache
            text = JSONText(f'{{"seq": {seq}, "pad": "{"x" * 1000}"}}')
            await log.save_snapshot(seq, text)
            gc.collect()
            holders = [r for r in gc.get_referrers(text)
                       if not isinstance(r, types.FrameType)]
            assert holders == [], [type(r).__name__ for r in holders]
            del text
    finally:
        await log.close()


_HELD_AFTER_A_SNAPSHOT = """
import asyncio, ctypes, gc, os, sys
from sunkd.runtime import malloc
from sunkd.store.eventlog import EventLog, JSONText

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
malloc.limit_arenas()  # as `sunkd run` does: blocks of 1 MiB and more are mmap'ed

def mapped() -> int:  # bytes in mmap'ed blocks now (each is unmapped when freed)
    gc.collect()
    return libc.mallinfo2().hblkhd

async def main() -> None:
    log = await EventLog.open(os.environ["SNAPSHOT_TEST_URL"], migrate=True)
    try:
        before = mapped()
        for seq in (10, 20):
            text = JSONText('{"pad": "' + "x" * 16_000_000 + '"}')
            await log.save_snapshot(seq, text)
            del text
        print(mapped() - before)
    finally:
        await log.close()

asyncio.run(main())
"""


def test_a_written_snapshot_leaves_no_copy_in_the_driver(database_url: str) -> None:
    """Below Python too: Python's sqlite3 resets a cached statement without clearing its
    bindings, and SQLite keeps its own copy of bound text, so each pooled connection that
    wrote a snapshot held that snapshot's text (~26 MB at 10,000 nodes; the daemon's
    mmap'ed blocks grew by one per connection: bench/scale.py --memstats)."""
    import ctypes
    import os
    import subprocess
    import sys

    try:
        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018  (glibc 2.33 and later)
    except (OSError, AttributeError):
        pytest.skip("needs glibc's mallinfo2 to see the driver's memory")
    result = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_A_SNAPSHOT], capture_output=True, text=True,
        env={**os.environ, "SNAPSHOT_TEST_URL": database_url}, timeout=120, check=True)
    held = int(result.stdout.strip().splitlines()[-1])
    assert held < 4_000_000, f"{held:,} bytes of mmap'ed blocks left after the snapshots"
