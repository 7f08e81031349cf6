"""Bound glibc's malloc arenas before the daemon starts its threads.

Why: glibc gives each thread that allocates while another holds the main arena an arena
of its own (up to 8 per core), and an arena keeps what was freed in it for reuse. The
daemon runs its folds, decisions and snapshot reads in the asyncio executor's worker
threads (up to 6 here) and SQLite in one thread per connection, so at 10,000 nodes each
of ten threads held a 40-50 MB arena of mostly free memory, and RSS grew with every
thread that got busy (docs/performance.md, "Scale": /proc/<pid>/smaps showed the 64 MiB
aligned arena heaps). With two arenas the threads share what they free. `MALLOC_ARENA_MAX`
in the environment (glibc's own knob, read at process start) wins over this. After a
snapshot, `trim` hands the free pages of every arena back.

Only glibc has `mallopt(M_ARENA_MAX)`; elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

# glibc malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ARENAS = 2
# Blocks from this size on are mmap'ed and given back whole when freed. glibc's default
# starts at 128 KiB and rises to the largest block freed so far (up to 32 MiB), so after
# the first snapshot a 21 MB text buffer came from an arena and its pages stayed there.
MMAP_THRESHOLD = 1 << 20


@functools.cache
def _glibc() -> Any | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it; musl ignores mallopt)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's arenas and fix its mmap threshold (call before starting threads);
    True when applied. An operator's `MALLOC_ARENA_MAX` / `GLIBC_TUNABLES` wins."""
    if os.environ.get("MALLOC_ARENA_MAX") or "glibc.malloc." in os.environ.get(
            "GLIBC_TUNABLES", ""):
        return False  # the operator chose
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas)) and bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> None:
    """Give free pages of every arena back to the system (after a snapshot: SQLite's page
    cache held the whole snapshot's pages for the write)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
