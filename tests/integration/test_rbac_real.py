"""RBAC proven on the real API server: sunkd with a bound token of its ServiceAccount and
exactly the rights manifests/base/rbac.yaml gives it (ClusterRole `sunkd`, Role
`sunkd-leader-election`), kube-apiserver with `--authorization-mode=Node,RBAC` and an
audit log (sunkd_testbed.kubernetes).

`exercise` drives every Kubernetes call sunkd makes, through sunkd's own components (the
source's list-then-watch of Nodes, Pods and Nodesets; the actuator's taint, cordon,
annotate, evict, Events and Nodeset status; the Lease elector) with the ServiceAccount's
client. The audit log says which requests were made and which were refused:

- with the manifest as shipped, nothing is refused and the calls made are exactly
  `API_CALLS` (so the list the ClusterRole is checked against, test_manifests.py, is what
  sunkd really does);
- with each verb of each rule removed in turn (a rule with one verb: the rule), exactly that
  call is refused: every rule, and every verb in it, is needed.

The opt-in rights for a Nodeset's slurmd pods (`SLURMD_API_CALLS`, granted by
manifests/components/slurmd-pods and the chart's `rbac.slurmdPods`) are proven the same
way: `exercise_slurmd` creates, labels (keeping the Nodeset's PodDisruptionBudget, put
back after an edit), unlabels and deletes a slurmd pod through sunkd's own
`SlurmdPods`; without the component each of those calls is refused, with it none is, and
with each verb of its rules removed in turn exactly that call is refused.

The daemon itself runs on the same kind of token in test_e2e_real_kube.py (no 403 there).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmdSpec
from sunkd.domain.policy.slurmd import SlurmdNodeset
from sunkd.domain.policy.slurmdfinalizer import VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE
from sunkd.domain.ports import ActionError
from sunkd.kubernetes.actuator import API_CALLS, SLURMD_API_CALLS, KubernetesActuator
from sunkd.kubernetes.client import (
    LEASES,
    NODES,
    NODESETS,
    PDBS,
    PODS,
    KubeApiError,
    KubeClient,
    nodesets,
)
from sunkd.kubernetes.lease import LeaseElector
from sunkd.kubernetes.slurmd_actuator import SlurmdPods, pdb_name
from sunkd.kubernetes.slurmd_finalizer import NodesetFinalizer
from sunkd.kubernetes.source import KubernetesSource
from sunkd_testbed.kubernetes import KubeControlPlane
from tests.integration.kube_backends import (
    RBAC_MANIFEST,
    ROOT,
    SUNKD_NAMESPACE,
    SUNKD_USER,
    sunkd_kubeconfig,
    sunkd_plane,
)
from tests.integration.kube_helpers import (
    ListSink,
    create_node,
    create_pod,
    ensure_namespace,
    nodeset_body,
    set_pod_phase,
)

pytestmark = pytest.mark.slow

Call = tuple[str, str, str]  # (verb, API group, resource[/subresource])
WORK = "rbac-work"  # the pool's namespace
LEASE = "rbac-probe"
RUNS = itertools.count(1)
DOCS = [d for d in yaml.safe_load_all(RBAC_MANIFEST.read_text()) if d]
ROLES = {(d["kind"], d["metadata"]["name"]): d for d in DOCS if d["kind"] in ("ClusterRole",
                                                                               "Role")}
SLURMD_MANIFEST = ROOT / "manifests" / "components" / "slurmd-pods" / "rbac.yaml"
SLURMD_DOCS = [d for d in yaml.safe_load_all(SLURMD_MANIFEST.read_text()) if d]
SLURMD_ROLE = next(d for d in SLURMD_DOCS if d["kind"] == "ClusterRole")
SLURMD_NODE = "rbac-slurmd"  # the Node the slurmd pod is bound to (no pool pod there)
SLURMD_POD = "pool-rbac-slurmd"


@dataclass
class Env:
    plane: KubeControlPlane
    admin: KubeClient
    sunkd: KubeClient


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    with sunkd_plane(audit=True, scheduler=False) as control_plane:
        yield control_plane


@pytest.fixture
async def env(plane: KubeControlPlane, tmp_path: Path) -> AsyncIterator[Env]:
    admin = await KubeClient.connect(str(plane.kubeconfig))
    sunkd = await KubeClient.connect(str(sunkd_kubeconfig(plane, tmp_path / "sa.kubeconfig")))
    try:
        await ensure_namespace(admin, WORK)
        with contextlib.suppress(KubeApiError):  # 409: an earlier test made it
            await admin.create(nodesets(), nodeset_body(
                WORK, "pool", node_selector={"pool": "rbac"}, workload_selector={"app": "w"},
                group=NODESETS.group, version=NODESETS.version), WORK)
        with contextlib.suppress(KubeApiError):
            await create_node(admin, "rbac-n1", {"pool": "rbac"})
        yield Env(plane, admin, sunkd)
    finally:
        await sunkd.close()
        await admin.close()


async def prepare(admin: KubeClient) -> None:
    """A running pool pod to evict, and no Lease yet (so the elector creates one)."""
    with contextlib.suppress(KubeApiError):
        await admin.delete(PODS, "victim", WORK, grace_period_seconds=0)
    with contextlib.suppress(KubeApiError):
        await admin.delete(LEASES, LEASE, SUNKD_NAMESPACE)
    async with asyncio.timeout(20):
        while True:
            try:
                await create_pod(admin, WORK, "victim", {"app": "w"}, node="rbac-n1")
                break
            except KubeApiError as error:
                if error.status != 409:  # the old one still being deleted
                    raise
                await asyncio.sleep(0.05)
    await set_pod_phase(admin, WORK, "victim", "Running",
                        [{"type": "Ready", "status": "True"}])


async def exercise(client: KubeClient) -> None:
    """Every call sunkd makes, through its own components, errors ignored (the audit log
    is the record of what was allowed and what was refused)."""
    source = KubernetesSource(client, ListSink(), nodeset_resource=NODESETS)
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    with contextlib.suppress(TimeoutError):
        await source.wait_synced(3)
        await asyncio.sleep(0.3)  # the watches open after the lists
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 10)

    actuator = KubernetesActuator(client, nodeset_resource=NODESETS)
    steps = [
        actuator.lock("rbac-n1"),
        actuator.hold("rbac-n1", "rbac probe"),
        actuator.annotate("rbac-n1", {"sunkd.io/slurm-state": "IDLE"}),
        actuator.release("rbac-n1"),
        actuator.unlock("rbac-n1"),
        actuator.record_event("rbac-n1", "SunkdProbe", "the same words"),
        actuator.record_event("rbac-n1", "SunkdProbe", "the same words"),  # patch: count 2
        actuator.evict(WORK, "victim"),
        # A new value each run: an unchanged status is not written at all.
        actuator.update_nodeset_status(WORK, "pool", {"counts": {"nodes": next(RUNS)}}),
    ]
    for step in steps:
        with contextlib.suppress(ActionError, KubeApiError):
            await step
    elector = LeaseElector(client, namespace=SUNKD_NAMESPACE, name=LEASE, identity="probe",
                           lease_duration=15, renew_deadline=10, retry_period=2)
    for attempt in (elector.try_acquire_or_renew(), elector.try_acquire_or_renew(),
                    elector.release()):
        with contextlib.suppress(KubeApiError, ActionError):
            await attempt


async def prepare_slurmd(admin: KubeClient) -> SlurmdNodeset:
    """The Node a slurmd pod may go to (sunkd's owner taint on, nothing running there), no
    slurmd pod and no PodDisruptionBudget yet; the pool Nodeset with its uid (the pod's
    and the budget's controller owner)."""
    with contextlib.suppress(KubeApiError):
        await create_node(admin, SLURMD_NODE, {"pool": "rbac-slurmd"})
    await admin.merge_patch(NODES, SLURMD_NODE, {"spec": {"taints": [
        {"key": wk.TAINT_OWNER, "value": wk.OWNER_SLURM, "effect": wk.TAINT_OWNER_EFFECT}]}})
    # No kubelet here confirms a graceful deletion: a grace period of 0 removes it now.
    with contextlib.suppress(KubeApiError):
        await admin.delete(PODS, SLURMD_POD, WORK, grace_period_seconds=0)
    nodeset = await admin.get(NODESETS, "pool", WORK)
    spec = SlurmdSpec(image="registry.example/slurmd:22.05", termination_grace_seconds=5)
    ns = SlurmdNodeset("pool", WORK, nodeset["metadata"]["uid"], spec)
    with contextlib.suppress(KubeApiError):
        await admin.delete(PDBS, pdb_name(ns), WORK)
    async with asyncio.timeout(20):
        while True:
            try:
                await admin.get(PODS, SLURMD_POD, WORK)
            except KubeApiError as error:
                if error.status == 404:
                    break
                raise
            await asyncio.sleep(0.05)
    return ns


async def exercise_slurmd(client: KubeClient, admin: KubeClient, nodeset: SlurmdNodeset
                          ) -> None:
    """Every call sunkd makes for a Nodeset's slurmd pods, through `SlurmdPods` (the
    actuator's verbs): create the pod, label it busy (creating the budget), label it again
    after someone edited the budget (put back), unlabel, delete. Errors ignored (the audit
    log is the record)."""
    pods = SlurmdPods(client, lambda what: None)
    where = {"slurm_node": "rbac-slurmd", "k8s_node": SLURMD_NODE, "name": SLURMD_POD}
    with contextlib.suppress(ActionError):
        await pods.create(nodeset=nodeset, spec=nodeset.spec, **where)
    uid = ""
    with contextlib.suppress(KubeApiError):
        uid = (await admin.get(PODS, SLURMD_POD, WORK))["metadata"]["uid"]
    with contextlib.suppress(ActionError):
        await pods.label(nodeset=nodeset, uid=uid, busy=True, **where)
    with contextlib.suppress(KubeApiError):  # someone edits the budget: sunkd puts it back
        await admin.merge_patch(PDBS, pdb_name(nodeset), {"spec": {"minAvailable": 1}}, WORK)
    for busy in (True, False):
        with contextlib.suppress(ActionError):
            await pods.label(nodeset=nodeset, uid=uid, busy=busy, **where)
    with contextlib.suppress(ActionError):
        await pods.delete(nodeset=nodeset, uid=uid, grace_seconds=5, **where)
    # sunkd's finalizer on the Nodeset (it has spec.slurmd for this), then off again: the
    # removal is refused while the deleted pod terminates (no kubelet confirms it here),
    # so the admin takes it off, and spec.slurmd with it, for the next run.
    await admin.merge_patch(NODESETS, "pool", {"spec": {"slurmd": {
        "image": nodeset.spec.image}}}, WORK)
    finalizer = NodesetFinalizer(client, NODESETS, lambda what: None)
    args = {"nodeset": f"{WORK}/pool", "nodeset_uid": nodeset.uid}
    try:
        for verb in (VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE):
            with contextlib.suppress(ActionError):
                await finalizer.act(verb, args)
    finally:
        await admin.merge_patch(NODESETS, "pool", {"metadata": {"finalizers": None},
                                                   "spec": {"slurmd": None}}, WORK)


def audited(plane: KubeControlPlane, since: int) -> tuple[set[Call], set[Call]]:
    """(calls made, calls refused with 403) by sunkd's ServiceAccount in the audit events
    after the first `since`."""
    made: set[Call] = set()
    refused: set[Call] = set()
    for event in plane.audit_events(SUNKD_USER)[since:]:
        ref = event.get("objectRef") or {}
        if not ref.get("resource"):
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        call = (str(event["verb"]), str(ref.get("apiGroup") or ""), resource)
        made.add(call)
        if (event.get("responseStatus") or {}).get("code") == 403:
            refused.add(call)
    return made, refused


async def run_exercise(env: Env) -> tuple[set[Call], set[Call]]:
    await prepare(env.admin)
    since = len(env.plane.audit_events(SUNKD_USER))
    await exercise(env.sunkd)
    await asyncio.sleep(0.2)  # the audit backend writes at ResponseComplete
    return audited(env.plane, since)


async def run_slurmd_exercise(env: Env) -> tuple[set[Call], set[Call]]:
    nodeset = await prepare_slurmd(env.admin)
    since = len(env.plane.audit_events(SUNKD_USER))
    await exercise_slurmd(env.sunkd, env.admin, nodeset)
    await asyncio.sleep(0.2)
    return audited(env.plane, since)


async def can(admin: KubeClient, verb: str, group: str, resource: str,
              namespace: str) -> bool:
    """A SubjectAccessReview for sunkd's ServiceAccount (what the authorizer now says)."""
    plural, _, sub = resource.partition("/")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": SUNKD_USER,
                       "groups": ["system:serviceaccounts", "system:serviceaccounts:sunkd",
                                  "system:authenticated"],
                       "resourceAttributes": {"verb": verb, "group": group,
                                              "resource": plural, "subresource": sub,
                                              "namespace": namespace}}}
    answer = await admin.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                 body=review)
    return bool(answer["status"].get("allowed"))


def role_path(kind: str, name: str) -> str:
    if kind == "ClusterRole":
        return f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"
    return f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SUNKD_NAMESPACE}/roles/{name}"


async def put_rules(admin: KubeClient, kind: str, name: str, rules: list[Any]) -> None:
    path = role_path(kind, name)
    current = await admin.request("GET", path)
    current["rules"] = rules
    await admin.request("PUT", path, body=current)


async def until_authorizer_says(admin: KubeClient, allowed: bool, call: Call,
                                namespace: str) -> None:
    deadline = time.monotonic() + 15
    while await can(admin, *call, namespace=namespace) != allowed:
        assert time.monotonic() < deadline, f"RBAC never said {allowed} to {call}"
        await asyncio.sleep(0.05)


def removals() -> list[tuple[str, str, int, str]]:
    """(role kind, role name, rule index, verb) for every verb of every rule."""
    return [(kind, name, index, verb)
            for (kind, name), role in sorted(ROLES.items())
            for index, rule in enumerate(role["rules"])
            for verb in rule["verbs"]]


def calls_of(rule: dict[str, Any], verb: str) -> set[Call]:
    return {(verb, group, resource) for group in rule["apiGroups"]
            for resource in rule["resources"]}


LISTED: set[Call] = {(c.verb, c.group, c.resource) for c in API_CALLS}
SLURMD_LISTED: set[Call] = {(c.verb, c.group, c.resource) for c in SLURMD_API_CALLS}


async def test_the_shipped_rbac_allows_exactly_what_sunkd_does(env: Env) -> None:
    made, refused = await run_exercise(env)
    assert refused == set()
    assert made == LISTED, (f"made but not listed: {sorted(made - LISTED)}; "
                            f"listed but not made: {sorted(LISTED - made)}")


@pytest.mark.parametrize(("kind", "name", "index", "verb"), removals(),
                         ids=[f"{name}-{index}-{verb}" for _, name, index, verb in removals()])
async def test_every_rule_is_needed(env: Env, kind: str, name: str, index: int,
                                    verb: str) -> None:
    role = ROLES[(kind, name)]
    rule = role["rules"][index]
    rules = copy.deepcopy(role["rules"])
    if len(rule["verbs"]) == 1:
        del rules[index]
    else:
        rules[index]["verbs"] = [v for v in rule["verbs"] if v != verb]
    removed = calls_of(rule, verb)
    namespace = SUNKD_NAMESPACE if kind == "Role" else WORK
    probe = next(iter(removed))
    await put_rules(env.admin, kind, name, rules)
    try:
        await until_authorizer_says(env.admin, False, probe, namespace)
        _made, refused = await run_exercise(env)
        assert refused == removed, f"without {verb} on {rule['resources']}: refused {refused}"
    finally:
        await put_rules(env.admin, kind, name, role["rules"])
        await until_authorizer_says(env.admin, True, probe, namespace)


# ------------------------------------------------------------------ slurmd pods (opt-in)


@pytest.fixture
async def slurmd_rbac(env: Env) -> AsyncIterator[Env]:
    """components/slurmd-pods applied as shipped; removed after (the other tests run on
    manifests/base/rbac.yaml alone)."""
    env.plane.kubectl("apply", "-f", str(SLURMD_MANIFEST))
    probe = next(iter(SLURMD_LISTED))
    try:
        await until_authorizer_says(env.admin, True, probe, WORK)
        yield env
    finally:
        env.plane.kubectl("delete", "-f", str(SLURMD_MANIFEST), "--ignore-not-found")
        await until_authorizer_says(env.admin, False, probe, WORK)


async def test_slurmd_calls_are_refused_without_the_component(env: Env) -> None:
    """manifests/base/rbac.yaml alone grants none of SLURMD_API_CALLS: the authorizer says
    no to each, and sunkd's attempt to create a slurmd pod is refused (nothing after it
    is reached), and so is its finalizer on the Nodeset."""
    for call in sorted(SLURMD_LISTED):
        assert not await can(env.admin, *call, namespace=WORK), call
    _made, refused = await run_slurmd_exercise(env)
    assert refused == {("create", "", "pods"), ("patch", "sunkd.io", "nodesets")}, refused


async def test_the_slurmd_pods_component_allows_exactly_what_sunkd_does(
        slurmd_rbac: Env) -> None:
    env = slurmd_rbac
    for call in sorted(SLURMD_LISTED):
        assert await can(env.admin, *call, namespace=WORK), call
    made, refused = await run_slurmd_exercise(env)
    assert refused == set()
    assert SLURMD_LISTED <= made, f"not made: {sorted(SLURMD_LISTED - made)}"
    unlisted = made - LISTED - SLURMD_LISTED
    assert not unlisted, f"made but not listed: {sorted(unlisted)}"
    # Nothing else the component grants: its ClusterRole is exactly SLURMD_API_CALLS.
    assert {(v, g, r) for rule in SLURMD_ROLE["rules"] for v in rule["verbs"]
            for g in rule["apiGroups"] for r in rule["resources"]} == SLURMD_LISTED


def slurmd_removals() -> list[tuple[int, str]]:
    return [(index, verb) for index, rule in enumerate(SLURMD_ROLE["rules"])
            for verb in rule["verbs"]]


@pytest.mark.parametrize(("index", "verb"), slurmd_removals(),
                         ids=[f"{SLURMD_ROLE['rules'][i]['resources'][0]}-{v}"
                              for i, v in slurmd_removals()])
async def test_every_slurmd_rule_is_needed(slurmd_rbac: Env, index: int, verb: str) -> None:
    env = slurmd_rbac
    name = SLURMD_ROLE["metadata"]["name"]
    rule = SLURMD_ROLE["rules"][index]
    rules = copy.deepcopy(SLURMD_ROLE["rules"])
    if len(rule["verbs"]) == 1:
        del rules[index]
    else:
        rules[index]["verbs"] = [v for v in rule["verbs"] if v != verb]
    removed = calls_of(rule, verb)
    probe = next(iter(removed))
    await put_rules(env.admin, "ClusterRole", name, rules)
    try:
        await until_authorizer_says(env.admin, False, probe, WORK)
        _made, refused = await run_slurmd_exercise(env)
        assert refused == removed, f"without {verb} on {rule['resources']}: refused {refused}"
    finally:
        await put_rules(env.admin, "ClusterRole", name, SLURMD_ROLE["rules"])
        await until_authorizer_says(env.admin, True, probe, WORK)


# ------------------------------------------------------------------ kubeconfig on the wire


async def test_exec_plugin_token_and_a_401_refresh_on_the_real_server(
        plane: KubeControlPlane, tmp_path: Path) -> None:
    """An exec credential plugin (client.authentication.k8s.io/v1) answers with a token the
    server refuses, then with the ServiceAccount's: sunkd runs it again after the 401, the
    request goes through, and the credential is kept for the next (kubeconfig.py)."""
    token = plane.service_account_token(SUNKD_NAMESPACE, "sunkd")
    runs = tmp_path / "runs"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"""#!{sys.executable}
import json, os
with open({str(runs)!r}, "a") as f:
    f.write("x")
first = len(open({str(runs)!r}).read()) == 1
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": "revoked" if first else {token!r}}}}}))
""")
    plugin.chmod(0o700)
    path = plane.write_kubeconfig(tmp_path / "exec.kubeconfig", token="unused")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                           "command": str(plugin), "interactiveMode": "Never"}}
    path.write_text(yaml.safe_dump(config))
    client = await KubeClient.connect(str(path))
    try:
        await client.list(PODS, namespace=WORK)
        await client.list(PODS, namespace=WORK)
    finally:
        await client.close()
    assert runs.read_text() == "xx"  # once refused, once again after the 401, then kept


async def test_client_certificate_files_and_tls_server_name_on_the_real_server(
        plane: KubeControlPlane, tmp_path: Path) -> None:
    """Certificate files named relative to the kubeconfig, and `tls-server-name` checked
    against the server's certificate (one of its names, then a name it does not have)."""
    (tmp_path / "pki").mkdir()
    for name in ("ca.crt", "admin.crt", "admin.key"):
        shutil.copy(plane.pki / name, tmp_path / "pki" / name)
    path = tmp_path / "files.kubeconfig"

    def write(server_name: str) -> None:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "files",
            "clusters": [{"name": "c", "cluster": {
                "server": plane.url, "certificate-authority": "pki/ca.crt",
                "tls-server-name": server_name}}],
            "users": [{"name": "u", "user": {"client-certificate": "pki/admin.crt",
                                             "client-key": "pki/admin.key"}}],
            "contexts": [{"name": "files", "context": {"cluster": "c", "user": "u"}}]}))

    write("kubernetes.default.svc")
    client = await KubeClient.connect(str(path))
    try:
        await client.list(NODES)
    finally:
        await client.close()
    write("not-the-apiserver.example")
    client = await KubeClient.connect(str(path))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.list(NODES)
    finally:
        await client.close()
