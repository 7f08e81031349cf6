"""Encode a big snapshot in a forked child, so the daemon's heap never holds the transient.

Why: turning a 10,000-node state into JSON text builds millions of short-lived dicts,
lists and strings (a traced peak of ~43 MB for 21 MB of text). CPython's small-object
allocator keeps an arena as long as one live object is in it, and objects the daemon
keeps (new fold state, decoded events) land between the transients, so RSS rose with
every snapshot and did not come back (docs/performance.md, "Scale": at 2,000 nodes,
+28 % over a churn run with snapshots, +5 % with them off).

A forked child sees the parent's memory as it was at the fork (copy-on-write), so it
encodes a consistent state (the fold never mutates a `ClusterState`; each fold builds a
new one) without any lock, writes the UTF-8 text to a pipe and exits. The parent only
allocates one buffer of the text's size, a single block the C allocator hands back
whole. Where `os.fork` does not exist, fails (EAGAIN, ENOMEM) or the child dies or
stalls, the text is encoded in a worker thread as before: a snapshot is a cache of the
fold, so the fallback costs memory, never correctness.

What it costs: while the child lives (about as long as the encoding, ~0.5 s at 10,000
nodes), the pages it touches are copied (reading an object writes its reference count), so
the machine briefly holds the daemon's memory plus the child's own, which the snapshot log
line reports (`child_private_mb`) and a memory limit must leave room for
(docs/operations.md). In return nothing of it stays behind in the daemon.

The child runs only the encoder: it resets the signal wakeup fd and handlers first (a
signal delivered to the child must not be written into the parent's event-loop
self-pipe, which the child shares), never logs, never touches a connection, and leaves
through `os._exit` so no atexit hook, finalizer or buffered stream of the parent runs
twice. POSIX allows only async-signal-safe calls after forking a multi-threaded process;
CPython re-initialises its own locks in the child (`PyOS_AfterFork_Child`) and glibc its
malloc locks, and the encoder takes no other lock.
"""

from __future__ import annotations

import asyncio
import gc
import os
import select
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

# The text's length in bytes, and the child's private memory in KiB when it was done.
_HEADER = struct.Struct("!QQ")
_CHUNK = 1 << 20
# A 10,000-node state encodes in ~0.4 s here; a child that has not answered in this long
# is stuck (or starved) and is killed.
CHILD_TIMEOUT_S = 120.0


class ChildEncodeError(Exception):
    """The child did not hand back a whole text (it failed, died or stalled)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    text: str
    in_child: bool
    child_private_mb: float | None  # the child's own memory when done (`_private_kib`)


async def encode_in_child(encode: Callable[[], str], *,
                          child_timeout: float = CHILD_TIMEOUT_S) -> Encoded:
    """`encode()`'s text, computed in a forked child when possible, else in a thread."""
    if hasattr(os, "fork"):
        try:
            pid, read_fd = _fork(encode)
        except OSError as error:
            log.warning("snapshot.fork_failed", error=str(error), fallback="thread")
        else:
            try:
                text, private_mb = await asyncio.to_thread(_collect, pid, read_fd, child_timeout)
                return Encoded(text, True, private_mb)
            except ChildEncodeError as error:
                log.warning("snapshot.child_failed", error=str(error), fallback="thread")
    return Encoded(await asyncio.to_thread(encode), False, None)


def _fork(encode: Callable[[], str]) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_fd)
            _quiet_signals()
            gc.disable()  # short-lived: a collection would only copy pages
            data = encode().encode()
            _write_all(write_fd, _HEADER.pack(len(data), _private_kib()))
            _write_all(write_fd, data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _private_kib() -> int:
    """The child's own memory (pages it copied on write, plus what the encoder allocated):
    what a snapshot adds to the daemon's memory while the child lives, and what a cgroup
    limit must leave room for (0 where /proc/self/smaps_rollup does not exist)."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as rollup:
            fields = dict(line.split(b":", 1) for line in rollup if b":" in line)
        return sum(int(fields[name].split()[0])
                   for name in (b"Private_Clean", b"Private_Dirty") if name in fields)
    except (OSError, ValueError):
        return 0


def _quiet_signals() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: nothing was set from here
        return
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_CHUNK]):]


def _collect(pid: int, read_fd: int, timeout: float) -> tuple[str, float | None]:
    """Read the child's text (blocking: runs in a worker thread) and reap it."""
    deadline = time.monotonic() + timeout
    try:
        header = _read_exactly(read_fd, _HEADER.size, deadline)
        length, private_kib = _HEADER.unpack(header)
        body = _read_exactly(read_fd, length, deadline)
        text = str(body, "utf-8")
    except (ChildEncodeError, OSError) as error:
        _kill(pid)
        raise ChildEncodeError(str(error)) from error
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise ChildEncodeError(f"child exited with {os.waitstatus_to_exitcode(status)}")
    return text, (round(private_kib / 1024, 1) if private_kib else None)


def _read_exactly(fd: int, length: int, deadline: float) -> bytearray:
    buffer = bytearray(length)
    view = memoryview(buffer)
    filled = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while filled < length:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise ChildEncodeError(f"no answer within the deadline ({filled}/{length} bytes)")
        count = os.readv(fd, [view[filled:filled + _CHUNK]])
        if count == 0:
            raise ChildEncodeError(f"child closed the pipe after {filled}/{length} bytes")
        filled += count
    return buffer


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
