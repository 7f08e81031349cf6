"""The daemon's collector settings (sunkd/runtime/collector.py): young collections spaced
out, the loaded state frozen out of later scans, and garbage without cycles still freed at
once."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sunkd.runtime import collector


@pytest.fixture(autouse=True)
def restore_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_spaces_young_collections_and_keeps_the_older_thresholds() -> None:
    _, middle, old = gc.get_threshold()
    assert collector.tune() == (collector.YOUNG_THRESHOLD, middle, old)
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, middle, old)


def test_a_transient_tree_is_not_promoted_under_the_tuned_threshold() -> None:
    """What the threshold is for: a decoded body that lives while ~20,000 containers are
    allocated is freed before a young collection sees it (with CPython's 700 it is
    collected-and-promoted dozens of times)."""
    collector.tune()
    gc.collect()
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        tree = [{"metadata": {"name": f"p{i}"}, "spec": {}} for i in range(6_000)]
        del tree
    finally:
        gc.callbacks.remove(seen)
    assert collections == []


class Node:
    pass


def test_freeze_moves_the_live_objects_out_and_refcounting_still_frees_them() -> None:
    state = [Node() for _ in range(1_000)]
    probe = weakref.ref(state[0])
    frozen = collector.freeze()
    assert frozen >= 1_000 and gc.get_freeze_count() == frozen
    del state
    assert probe() is None  # frozen, yet freed when its last reference goes
