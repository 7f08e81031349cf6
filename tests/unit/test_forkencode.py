"""The snapshot encoder's forked child: the same text as in-process, and every way the
child can go wrong falls back to a thread without touching the parent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from sunkd.domain.snapshot import state_from_json, state_to_json_text
from sunkd.domain.state import ClusterState, NodeState, UnpooledNode
from sunkd.runtime.forkencode import encode_in_child
from sunkd.store.eventlog import dumps_json

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def state_with_nodes(count: int) -> ClusterState:
    return ClusterState(
        nodes={f"gpu{i}": NodeState(name=f"gpu{i}", k8s_name=f"gpu{i}.example")
               for i in range(count)},
        unpooled={f"cpu{i}": UnpooledNode(None, None, None, i, 0, False, False, None, None, {})
                  for i in range(count)},
        last_seq=count * 7,
    )


async def test_the_child_hands_back_the_same_text() -> None:
    state = state_with_nodes(300)
    expected = state_to_json_text(state, dumps_json)

    encoded = await encode_in_child(lambda: state_to_json_text(state, dumps_json))

    assert encoded.in_child
    assert encoded.text == expected
    assert state_from_json(json.loads(encoded.text)) == state
    assert encoded.child_private_mb is not None and encoded.child_private_mb > 0


async def test_a_long_non_ascii_text_crosses_the_pipe_whole() -> None:
    text = "é☃𝄞-" * 1_000_000  # 11 MB of UTF-8: many pipe buffers, multi-byte characters

    encoded = await encode_in_child(lambda: text)

    assert encoded.in_child and encoded.text == text


def _only_in_child(parent: int, action: object) -> str:
    if os.getpid() != parent:
        if callable(action):
            action()
        raise RuntimeError("the child fails")
    return "from the thread"


async def test_a_failing_child_falls_back_to_a_thread() -> None:
    parent = os.getpid()

    encoded = await encode_in_child(lambda: _only_in_child(parent, None))

    assert (encoded.in_child, encoded.text) == (False, "from the thread")


async def test_a_stalled_child_is_killed_and_a_thread_takes_over() -> None:
    parent = os.getpid()
    started = time.monotonic()

    encoded = await encode_in_child(lambda: _only_in_child(parent, lambda: time.sleep(60)),
                                    child_timeout=0.5)

    assert (encoded.in_child, encoded.text) == (False, "from the thread")
    assert time.monotonic() - started < 10


async def test_a_signal_to_the_child_never_reaches_the_parents_loop() -> None:
    """asyncio's signal handlers work through a wakeup fd the child inherits: a SIGTERM
    the child gets must not be written there, or the daemon would shut itself down."""
    parent = os.getpid()
    loop = asyncio.get_running_loop()
    received: list[int] = []
    loop.add_signal_handler(signal.SIGTERM, received.append, 1)
    try:
        def terminate_self() -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the default action ends the child before this does

        encoded = await encode_in_child(lambda: _only_in_child(parent, terminate_self))
        await asyncio.sleep(0.2)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)

    assert (encoded.in_child, encoded.text) == (False, "from the thread")
    assert received == []
