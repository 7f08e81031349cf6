"""sunkd/domain/topology.py: labels -> topology.conf / topology.yaml, pinned by examples
and by properties (order-free, every node under one leaf or block, never empty, one
node's churn stays local)."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.hostlist import expand
from sunkd.domain.topology import (
    COREWEAVE_LEAFGROUP,
    COREWEAVE_SUPERPOD,
    MAX_NAME,
    PRESETS,
    TOPOGRAPH_ACCELERATOR,
    TOPOGRAPH_CORE,
    TOPOGRAPH_LEAF,
    TOPOGRAPH_SPINE,
    Topology,
    TopologyError,
    TopologyNode,
    conf_kind,
    render,
    spec_from,
    to_conf,
    to_yaml,
)

TREE = spec_from("tree", preset="topograph")
BLOCK = spec_from("block", preset="topograph")


def node(name: str, leaf: str = "", spine: str = "", core: str = "", nvl: str = ""
         ) -> TopologyNode:
    labels = {k: v for k, v in ((TOPOGRAPH_LEAF, leaf), (TOPOGRAPH_SPINE, spine),
                                (TOPOGRAPH_CORE, core), (TOPOGRAPH_ACCELERATOR, nvl)) if v}
    return TopologyNode(name, labels)


def everyone(nodes: list[TopologyNode]) -> list[str]:
    return [n.name for n in nodes]


def conf_lines(text: str) -> dict[str, str]:
    """SwitchName/BlockName -> its line."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"(?:SwitchName|BlockName)=(\S+)", line)
        if match:
            out[match.group(1)] = line
    return out


# ------------------------------------------------------------------------ examples


def test_tree_two_spines_under_a_root() -> None:
    nodes = [node(f"n{i}", leaf=f"l{i // 2}", spine=f"s{i // 4}") for i in range(8)]
    text = to_conf(render(nodes, everyone(nodes), TREE))
    assert text.splitlines()[1:] == [
        "SwitchName=leaf_s0_l0 Nodes=n[0-1]",
        "SwitchName=leaf_s0_l1 Nodes=n[2-3]",
        "SwitchName=leaf_s1_l2 Nodes=n[4-5]",
        "SwitchName=leaf_s1_l3 Nodes=n[6-7]",
        "SwitchName=root Switches=spine_s[0-1]",
        "SwitchName=spine_s0 Switches=leaf_s0_l[0-1]",
        "SwitchName=spine_s1 Switches=leaf_s1_l[2-3]",
    ]


def test_one_top_switch_gets_no_root() -> None:
    nodes = [node("a", leaf="l1", spine="s"), node("b", leaf="l2", spine="s")]
    names = [s.name for s in render(nodes, everyone(nodes), TREE).switches]
    assert "root" not in names and "spine_s" in names


def test_same_leaf_value_under_two_superpods_is_two_switches() -> None:
    spec = spec_from("tree", preset="coreweave")
    nodes = [TopologyNode(f"n{i}", {COREWEAVE_LEAFGROUP: "1", COREWEAVE_SUPERPOD: str(i)})
             for i in range(2)]
    leaves = [s for s in render(nodes, everyone(nodes), spec).switches if s.nodes]
    assert [(s.name, s.nodes) for s in leaves] == [("leafgroup_0_1", ("n0",)),
                                                    ("leafgroup_1_1", ("n1",))]


def test_unlabeled_nodes_stay_schedulable_under_their_own_leaf() -> None:
    nodes = [node("a", leaf="l"), node("b")]
    topology = render(nodes, everyone(nodes), TREE)
    assert {s.name: s.nodes for s in topology.switches if s.nodes} == {
        "leaf_l": ("a",), "unlabeled": ("b",)}
    assert [s.switches for s in topology.switches if s.name == "root"] == [
        ("leaf_l", "unlabeled")]


def test_long_or_odd_switch_names_are_hashed_stably() -> None:
    long = "x" * 80
    nodes = [node("a", leaf=long), node("b", leaf="has space")]
    first = render(nodes, everyone(nodes), TREE)
    second = render(list(reversed(nodes)), everyone(nodes), TREE)
    names = [s.name for s in first.switches if s.nodes]
    assert names == [s.name for s in second.switches if s.nodes]
    assert all(re.fullmatch(r"leaf__[0-9a-f]{16}", n) for n in names)
    text = to_conf(first)
    assert f"# {names[0]}: " in text or f"# {names[1]}: " in text
    assert '"has space"' not in text and "has space" in text  # the comment says what


def test_only_included_nodes_are_listed() -> None:
    nodes = [node("a", leaf="l"), node("b", leaf="l")]
    assert render(nodes, ["a", "zzz"], TREE).nodes == ("a",)


def test_never_empty() -> None:
    with pytest.raises(TopologyError, match="no node"):
        render([node("a", leaf="l")], [], TREE)
    with pytest.raises(TopologyError, match="no node"):
        render([node("a", leaf="l")], ["a"], BLOCK)  # no accelerator label


def test_slurm_name_from_label_then_node_name() -> None:
    obj = {"metadata": {"name": "k8s-1", "labels": {wk.LABEL_SLURM_NODE_NAME: "gpu1"}}}
    assert TopologyNode.from_kubernetes(obj).name == "gpu1"
    assert TopologyNode.from_kubernetes({"metadata": {"name": "k8s-2"}}).name == "k8s-2"
    obj["metadata"]["labels"]["pool/name"] = "p1"  # type: ignore[index]
    assert TopologyNode.from_kubernetes(obj, "pool/name").name == "p1"


def test_two_nodes_claiming_one_slurm_name_are_left_out() -> None:
    nodes = [node("a", leaf="l1"), node("a", leaf="l2"), node("b", leaf="l1")]
    topology = render(nodes, ["a", "b"], TREE)
    assert topology.nodes == ("b",)
    assert [n for n, _ in topology.unplaced] == ["a"]


def test_bad_node_names_are_left_out() -> None:
    nodes = [node("a=b", leaf="l"), node("c d", leaf="l"), node("ok", leaf="l")]
    topology = render(nodes, everyone(nodes), TREE)
    assert topology.nodes == ("ok",) and len(topology.unplaced) == 2


def test_blocks_and_block_sizes() -> None:
    nodes = [node(f"n{i}", nvl=f"rack{i // 4}") for i in range(10)]  # rack2 has 2 nodes
    spec = spec_from("block", preset="topograph", block_sizes=[4, 8])
    topology = render(nodes, everyone(nodes), spec)
    assert to_conf(topology).splitlines()[1:] == [
        "BlockName=b_rack0 Nodes=n[0-3]", "BlockName=b_rack1 Nodes=n[4-7]",
        "BlockSizes=4,8"]
    assert sorted(n for n, _ in topology.unplaced) == ["n8", "n9"]


@pytest.mark.parametrize("sizes", [[0], [4, 6], [4, 4], [8, 4], [3, 9]])
def test_bad_block_sizes_are_refused(sizes: list[int]) -> None:
    with pytest.raises(TopologyError, match="block size"):
        spec_from("block", preset="topograph", block_sizes=sizes)


def test_tree_and_block_are_never_mixed() -> None:
    with pytest.raises(TopologyError, match="mixed"):
        spec_from("tree", preset="topograph", block_label="x")
    with pytest.raises(TopologyError, match="mixed"):
        spec_from("block", levels=["x"], block_label="y")
    assert conf_kind("SwitchName=s Nodes=a\nBlockName=b Nodes=c\n") == "mixed"
    assert conf_kind("# only a comment\n") == "empty"
    assert conf_kind("switchname=s nodes=a") == "tree"


def test_presets_and_errors() -> None:
    assert set(PRESETS) == {"topograph", "coreweave", "nebius", "aws", "gcp"}
    with pytest.raises(TopologyError, match="no block label"):
        spec_from("block", preset="aws")
    with pytest.raises(TopologyError, match="unknown preset"):
        spec_from("tree", preset="nope")
    custom = spec_from("tree", levels=["rack", "row"])
    assert custom.tags == ("t0", "t1")


def test_yaml_is_what_the_conf_says() -> None:
    nodes = [node(f"n{i}", leaf=f"l{i // 2}", spine="s", nvl=f"r{i // 2}") for i in range(4)]
    tree = render(nodes, everyone(nodes), TREE)
    [doc] = yaml.safe_load(to_yaml(tree))
    assert doc["cluster_default"] is True
    assert {s["switch"]: s.get("nodes") or s.get("children") for s in doc["tree"]["switches"]} \
        == {"leaf_s_l0": "n[0-1]", "leaf_s_l1": "n[2-3]", "spine_s": "leaf_s_l[0-1]"}
    block = render(nodes, everyone(nodes), spec_from("block", preset="topograph",
                                                     block_sizes=[2]))
    [doc] = yaml.safe_load(to_yaml(block))
    assert doc["block"]["block_sizes"] == [2]
    assert [b["nodes"] for b in doc["block"]["blocks"]] == ["n[0-1]", "n[2-3]"]


# ---------------------------------------------------------------------- properties

VALUES = st.sampled_from(["a", "b", "c", "x" * 70, "sp ace", "1"])
LABELS = st.fixed_dictionaries({}, optional={
    TOPOGRAPH_LEAF: VALUES, TOPOGRAPH_SPINE: VALUES, TOPOGRAPH_CORE: VALUES,
    TOPOGRAPH_ACCELERATOR: VALUES})
NODES = st.dictionaries(st.from_regex(r"[a-z]{1,3}[0-9]{0,2}", fullmatch=True), LABELS,
                        min_size=1, max_size=12)
KINDS = st.sampled_from([TREE, BLOCK])


def _render(labels: dict[str, dict[str, str]], spec: object, order: list[str] | None = None
            ) -> Topology | None:
    names = order if order is not None else list(labels)
    try:
        return render([TopologyNode(n, labels[n]) for n in names], list(labels), spec)  # type: ignore[arg-type]
    except TopologyError:
        return None


@settings(max_examples=200)
@given(NODES, KINDS, st.randoms())
def test_input_order_does_not_matter(labels: dict[str, dict[str, str]], spec: object,
                                     random: object) -> None:
    order = list(labels)
    random.shuffle(order)  # type: ignore[attr-defined]
    first, second = _render(labels, spec), _render(labels, spec, order)
    assert first == second
    if first is not None:
        assert to_conf(first) == to_conf(second)  # type: ignore[arg-type]


@settings(max_examples=200)
@given(NODES, KINDS)
def test_every_listed_node_under_exactly_one_leaf_or_block(
        labels: dict[str, dict[str, str]], spec: object) -> None:
    topology = _render(labels, spec)
    if topology is None:
        assert spec is BLOCK  # a tree always places every node (the unlabeled leaf)
        return
    text = to_conf(topology)
    listed = [n for line in text.splitlines() if " Nodes=" in line
              for n in expand(line.split(" Nodes=")[1])]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == list(topology.nodes)
    assert set(topology.nodes) | {n for n, _ in topology.unplaced} == set(labels)
    if spec is TREE:
        assert set(topology.nodes) == set(labels)
        names = [s.name for s in topology.switches]
        assert len(names) == len(set(names)) and all(len(n) <= MAX_NAME for n in names)
        assert all(not (s.nodes and s.switches) for s in topology.switches)
        children = [c for s in topology.switches for c in s.switches]
        assert len(children) == len(set(children))  # every switch has one parent
        assert len(set(names) - set(children)) == 1  # ... and one root joins them all
    assert conf_kind(text) == topology.kind


@settings(max_examples=200)
@given(NODES, KINDS, LABELS, st.data())
def test_churn_on_one_node_changes_only_its_lines(
        labels: dict[str, dict[str, str]], spec: object, churned: dict[str, str],
        data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(sorted(labels)))
    before = _render(labels, spec)
    after = _render({**labels, victim: churned}, spec)
    if before is None or after is None:
        return
    old, new = conf_lines(to_conf(before)), conf_lines(to_conf(after))
    for name in set(old) | set(new):
        if old.get(name) == new.get(name):
            continue
        # A changed line names the victim, or is a switch line whose children changed
        # because a switch holding the victim appeared or went away.
        holds_victim = any(victim in expand(line.split(" Nodes=")[1])
                           for line in (old.get(name), new.get(name))
                           if line and " Nodes=" in line)
        assert holds_victim or " Switches=" in (old.get(name) or new.get(name) or ""), name
    unchanged = set(labels) - {victim}
    for other in unchanged:
        def leaf(t: Topology, n: str = other) -> str:
            pool = t.switches if t.kind == "tree" else t.blocks
            return next((s.name for s in pool if n in s.nodes), "")
        assert leaf(before) == leaf(after)
