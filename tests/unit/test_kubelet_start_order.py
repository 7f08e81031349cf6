"""The test bed starts each Node's kubelet only once the previous one has bound the
device-plugin socket every kubelet puts at the same host path (two starting at once can
interleave their clean-up and listen, and the loser exits: sunkd_testbed.kubelet)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sunkd_testbed.kubelet import KubeletError, _await_new_socket, _inode


def _node(process: Any = None) -> Any:
    return SimpleNamespace(name="127.0.0.10", process=process)


def _bind_later(path: Path, delay: float) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind() -> None:
        time.sleep(delay)
        path.unlink(missing_ok=True)
        listener.bind(str(path))

    threading.Thread(target=bind, daemon=True).start()
    return listener


def test_waits_for_a_socket_bound_after_the_start(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    listener = _bind_later(path, 0.3)
    try:
        started = time.monotonic()
        _await_new_socket(_node(), None, 10.0, path)
        assert time.monotonic() - started >= 0.25 and path.is_socket()
    finally:
        listener.close()


def test_the_previous_kubelets_socket_is_not_taken_for_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(str(path))
    before = _inode(path)
    new = _bind_later(path, 0.3)  # the next kubelet removes it and binds its own
    try:
        started = time.monotonic()
        _await_new_socket(_node(), before, 10.0, path)
        assert time.monotonic() - started >= 0.25 and _inode(path) != before
    finally:
        old.close()
        new.close()


def test_a_kubelet_that_exits_first_fails_the_start(tmp_path: Path) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    exited.wait()
    with pytest.raises(KubeletError, match="exited"):
        _await_new_socket(_node(exited), None, 10.0, tmp_path / "kubelet.sock")


def test_no_socket_in_time_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(KubeletError, match="did not listen"):
        _await_new_socket(_node(), None, 0.2, tmp_path / "kubelet.sock")
