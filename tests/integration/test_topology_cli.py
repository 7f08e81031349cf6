"""`sunkd topology render` as an operator runs it: from a `kubectl get nodes` file (JSON
and YAML) and from a live API server (the emulator), with exits, diffs and --json."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from sunkd.domain import wellknown as wk
from sunkd_testbed.kubeapi import KubeAPIEmulator

REPO = Path(__file__).resolve().parents[2]
LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"
NVL = "network.topology.nvidia.com/accelerator"


def k8s_node(name: str, leaf: str, spine: str, *, owner: str = wk.OWNER_SLURM,
             slurm_name: str | None = None, pool: str = "gpu") -> dict[str, Any]:
    labels = {LEAF: leaf, SPINE: spine, NVL: f"nvl-{spine}", wk.LABEL_OWNER: owner,
              wk.LABEL_POOL: pool}
    if slurm_name:
        labels[wk.LABEL_SLURM_NODE_NAME] = slurm_name
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}}}


NODES = [k8s_node(f"k{i}", f"l{i // 2}", f"s{i // 4}", slurm_name=f"gpu{i}")
         for i in range(8)] + [k8s_node("cpu1", "l9", "s9", owner=wk.OWNER_KUBERNETES)]


async def sunkd(*args: str, config: Path | None = None, stdin: bytes | None = None
                ) -> tuple[int, str, str]:
    head = ["--config", str(config)] if config else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", *head, "topology", "render", *args,
        env={k: v for k, v in os.environ.items() if not k.startswith("SUNKD_")},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(stdin), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_render_from_a_json_list_only_slurm_nodes(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": NODES}))
    code, out, err = await sunkd("--nodes", str(path))
    assert code == 0, err
    assert out.splitlines()[1:] == [
        "SwitchName=leaf_s0_l0 Nodes=gpu[0-1]", "SwitchName=leaf_s0_l1 Nodes=gpu[2-3]",
        "SwitchName=leaf_s1_l2 Nodes=gpu[4-5]", "SwitchName=leaf_s1_l3 Nodes=gpu[6-7]",
        "SwitchName=root Switches=spine_s[0-1]",
        "SwitchName=spine_s0 Switches=leaf_s0_l[0-1]",
        "SwitchName=spine_s1 Switches=leaf_s1_l[2-3]"]
    assert "cpu1" not in out  # owned by Kubernetes
    code, out, _ = await sunkd("--nodes", str(path), "--all-nodes")
    assert "SwitchName=leaf_s9_l9 Nodes=cpu1" in out


async def test_render_from_yaml_documents_and_stdin_as_yaml_blocks() -> None:
    text = yaml.safe_dump_all(NODES).encode()
    code, out, err = await sunkd("--nodes", "-", "--kind", "block", "--block-sizes", "4",
                                 "--format", "yaml", stdin=text)
    assert code == 0, err
    [doc] = yaml.safe_load(out)
    assert doc["block"] == {"block_sizes": [4], "blocks": [
        {"block": "b_nvl-s0", "nodes": "gpu[0-3]"}, {"block": "b_nvl-s1", "nodes": "gpu[4-7]"}]}


async def test_exit_2_when_empty_mixed_or_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(NODES[-1]))  # one Node, not Slurm's
    code, out, err = await sunkd("--nodes", str(path))
    assert code == 2 and out == "" and "would list no node" in err
    code, out, err = await sunkd("--nodes", str(path), "--block-label", "x", "--levels", "y")
    assert code == 2 and "mixed" in err
    code, out, _ = await sunkd("--nodes", str(path), "--json")
    assert code == 2 and json.loads(out)["ok"] is False
    path.write_text("{not: [json")
    code, _, err = await sunkd("--nodes", str(path))
    assert code == 2 and "neither JSON nor YAML" in err
    code, _, err = await sunkd("--nodes", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json" in err


async def test_diff_and_json(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "NodeList", "items": NODES}))
    code, current, _ = await sunkd("--nodes", str(path))
    conf = tmp_path / "topology.conf"
    conf.write_text(current)
    code, out, _ = await sunkd("--nodes", str(path), "--diff", str(conf))
    assert code == 0 and "up to date" in out
    moved = [*NODES[:-2], k8s_node("k7", "l0", "s0", slurm_name="gpu7")]
    path.write_text(json.dumps({"kind": "NodeList", "items": moved}))
    code, out, _ = await sunkd("--nodes", str(path), "--diff", str(conf), "--json")
    report = json.loads(out)
    assert code == 0 and report["changed"] is True
    assert "-SwitchName=leaf_s0_l0 Nodes=gpu[0-1]" in report["diff"]
    assert "+SwitchName=leaf_s0_l0 Nodes=gpu[0-1,7]" in report["diff"]
    conf.write_text("BlockName=b Nodes=gpu0\n")
    code, out, _ = await sunkd("--nodes", str(path), "--diff", str(conf), "--json")
    assert any("is block" in note for note in json.loads(out)["notes"])


async def test_live_cluster_with_a_nodeset(tmp_path: Path) -> None:
    async with KubeAPIEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        config = tmp_path / "sunkd.toml"
        config.write_text(f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n')
        emulator.create(yaml.safe_load((REPO / "manifests/crds/nodeset.yaml").read_text()))
        for obj in [*NODES, k8s_node("other", "l5", "s5", pool="cpu")]:
            emulator.create(obj)
        emulator.create({"apiVersion": wk.API_VERSION, "kind": "Nodeset",
                         "metadata": {"name": "gpu", "namespace": "default"},
                         "spec": {"nodeSelector": {wk.LABEL_POOL: "gpu"},
                                  "slurm": {"partitions": ["gpu"]}}})
        code, out, err = await sunkd("--all-nodes", config=config)
        assert code == 0, err
        assert "Nodes=other" in out and "Nodes=gpu[0-1]" in out
        code, out, err = await sunkd("--nodeset", "default/gpu", "--all-nodes", config=config)
        assert code == 0, err
        assert "other" not in out and "Nodes=cpu1" in out and "Nodes=gpu[0-1]" in out


async def test_without_label_flags_it_renders_what_the_daemon_would(tmp_path: Path) -> None:
    """No --kind/--preset/--levels/--block-*: the Nodeset's spec.topology with --nodeset,
    else [topology] of the config; flags still win; a bad spec.topology exits 2."""
    def nodeset(topology: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": wk.API_VERSION, "kind": "Nodeset",
                "metadata": {"name": "gpu", "namespace": "default"},
                "spec": {"nodeSelector": {wk.LABEL_POOL: "gpu"},
                         "slurm": {"partitions": ["gpu"]}, "topology": topology}}

    path = tmp_path / "objects.json"
    path.write_text(json.dumps({"kind": "List", "items": [
        *NODES, nodeset({"kind": "block", "blockSizes": [4]})]}))
    code, out, err = await sunkd("--nodes", str(path), "--nodeset", "default/gpu")
    assert code == 0, err
    assert out.splitlines()[1:] == ["BlockName=b_nvl-s0 Nodes=gpu[0-3]",
                                    "BlockName=b_nvl-s1 Nodes=gpu[4-7]", "BlockSizes=4"]
    code, out, _ = await sunkd("--nodes", str(path), "--nodeset", "default/gpu",
                               "--kind", "tree")
    assert code == 0 and "SwitchName=root" in out
    config = tmp_path / "sunkd.toml"
    config.write_text('[topology]\nkind = "block"\n')
    code, out, err = await sunkd("--nodes", str(path), config=config)
    assert code == 0 and out.startswith("# generated by sunkd: topology/block"), err
    path.write_text(json.dumps({"kind": "List", "items": [*NODES, nodeset({"kind": "ring"})]}))
    code, _, err = await sunkd("--nodes", str(path), "--nodeset", "default/gpu")
    assert code == 2 and "spec.topology.kind: tree or block, got 'ring'" in err
