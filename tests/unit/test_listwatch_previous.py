"""ListWatch events carry what the cache held before them (`WatchEvent.previous`): the
Kubernetes source unindexes a pod by it instead of keeping a key -> node map of its own."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.kubernetes.client import PODS
from sunkd.kubernetes.listwatch import ListWatch
from sunkd.kubernetes.normalize import PodFacts, slim_pod
from sunkd.kubernetes.source import KubernetesSource


def pod(name: str, node: str | None, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}-{rv}",
                         "resourceVersion": rv},
            "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running"}}


def watch() -> ListWatch[PodFacts]:
    return ListWatch(None, PODS, transform=slim_pod,  # type: ignore[arg-type]
                     version=lambda p: p.resource_version)


def test_watch_events_name_the_object_they_replace() -> None:
    lw = watch()
    added = lw._apply("ADDED", pod("a", None, "1"))
    assert added is not None and added.previous is None
    bound = lw._apply("MODIFIED", pod("a", "n1", "2"))
    assert bound is not None and bound.previous is added.object
    assert bound.object.node == "n1"
    assert lw._apply("MODIFIED", pod("a", "n1", "2")) is None  # a replay: no event
    gone = lw._apply("DELETED", pod("a", "n1", "3"))
    assert gone is not None and gone.previous is bound.object
    assert lw._apply("DELETED", pod("a", "n1", "3")) is None


def test_a_relist_names_what_each_object_replaced() -> None:
    lw = watch()
    first = lw._reconcile_now([lw._admit(pod("a", "n1", "1")), lw._admit(pod("b", "n1", "1"))],
                              "10", True)
    assert {e.key: e.previous for e in first.events} == {"ml/a": None, "ml/b": None}
    held = dict(lw.cache)
    # While the watch was down: a was re-created on n2, b deleted, c created.
    again = lw._reconcile_now([lw._admit(pod("a", "n2", "5")), lw._admit(pod("c", "n2", "6"))],
                              "20", False)
    by_key = {e.key: e for e in again.events}
    assert by_key["ml/a"].type == "MODIFIED" and by_key["ml/a"].previous is held["ml/a"]
    assert by_key["ml/a"].previous.node == "n1" and by_key["ml/a"].object.node == "n2"
    assert by_key["ml/b"].type == "DELETED" and by_key["ml/b"].previous is held["ml/b"]
    assert by_key["ml/c"].type == "ADDED" and by_key["ml/c"].previous is None


# ------------------------------------------- the source's pod index, over any history

ops = st.lists(st.tuples(
    st.sampled_from(["ADDED", "MODIFIED", "DELETED", "relist"]),
    st.sampled_from(["a", "b", "c"]),  # pod
    st.sampled_from([None, "n1", "n2"]),  # node
), max_size=30)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_pod_index_is_the_cache_after_any_history(history: list[Any]) -> None:
    """Adversarial orders included: deletes of unknown pods, replays, a pod re-created on
    another node behind a relist, watch events that move a bound pod."""
    source = KubernetesSource(None, lambda batch: None)  # type: ignore[arg-type]
    lw = source.watches["pods"]
    world: dict[str, tuple[str | None, int]] = {}
    for step, (op, name, node) in enumerate(history, start=1):
        if op == "relist":
            world[name] = (node, step)  # and everyone else as the world has them
            items = [lw._admit(pod(n, where, str(rv))) for n, (where, rv) in world.items()]
            relisted = lw._reconcile_now(items, str(step), False)
            for event in relisted.events:
                source._note("pods", event)
            continue
        event = lw._apply(op, pod(name, node, str(step)))
        if op == "DELETED":
            world.pop(name, None)
        else:
            world[name] = (node, step)
        if event is not None:
            source._note("pods", event)
    expected: dict[str, list[str]] = {}
    for key, facts in lw.cache.items():
        if facts.node:
            expected.setdefault(facts.node, []).append(key)
    assert {n: sorted(keys) for n, keys in source.pod_index.by_node.items()} == {
        n: sorted(keys) for n, keys in expected.items()}
