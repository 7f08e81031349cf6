"""The Kubernetes manifests (manifests/): rendered with the real `kubectl kustomize`, every
object validated against the Kubernetes 1.32 OpenAPI schemas (kubernetes-validate, bundled
schemas, offline), the example Nodeset against the CRD's own schema, the CRD and example
applied with kubectl to the API emulator, and the RBAC rules checked against every API call
sunkd's code makes (`sunkd.kubernetes.actuator.API_CALLS`, cross-checked by a scan of the
code), in both directions. The opt-in component components/slurmd-pods is rendered as a
site adds it to an overlay (production with it) and checked the same way against
`API_CALLS` + `SLURMD_API_CALLS`.

ServiceMonitor and PrometheusRule have no schema here (the Prometheus Operator CRDs are not
shipped by any installable package): they are checked structurally, and every alert
expression is parsed with a PromQL parser.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
VARIANTS = {
    "base": MANIFESTS,
    "dev": MANIFESTS / "overlays" / "dev",
    "production": MANIFESTS / "overlays" / "production",
}
SLURMD_PODS = MANIFESTS / "components" / "slurmd-pods"
# Overlays a site writes from ours: a variant with components added (kustomize refuses
# absolute paths, so the kustomization is written in a temporary directory naming both by
# relative path). Each is checked like the variants above.
COMPOSED: dict[str, tuple[str, tuple[Path, ...]]] = {
    "production+slurmd-pods": ("production", (SLURMD_PODS,)),
}
ALL_VARIANTS = [*VARIANTS, *COMPOSED]
# The variants that grant what a Nodeset's slurmd pods need (SLURMD_API_CALLS).
SLURMD_VARIANTS = {name for name, (_, parts) in COMPOSED.items() if SLURMD_PODS in parts}
K8S_VERSION = "1.32.0"
NAMESPACE = "sunkd"
# Kinds whose schema kubernetes-validate cannot know (CRDs), checked by the tests below.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("sunkd.io/v1alpha1", "Nodeset"),
}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    require(path is not None, "kubectl is not installed")
    assert path is not None
    return path


def render(directory: Path) -> list[Obj]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert docs, f"kubectl kustomize {directory} rendered nothing"
    return docs


def compose(directory: Path, variant: str, components: tuple[Path, ...]) -> Path:
    """A kustomization in `directory` building `variant` with `components`."""
    def rel(path: Path) -> str:
        return os.path.relpath(path, directory)

    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel(VARIANTS[variant])],
        "components": [rel(c) for c in components]}))
    return directory


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    docs = {name: render(path) for name, path in VARIANTS.items()}
    for name, (variant, components) in COMPOSED.items():
        docs[name] = render(compose(tmp_path_factory.mktemp("overlay"), variant, components))
    return docs


def find(docs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [d for d in docs
            if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def deployment(docs: list[Obj]) -> Obj:
    return one(docs, "Deployment", "sunkd")


def container(docs: list[Obj], name: str = "sunkd", init: bool = False) -> Obj:
    spec = deployment(docs)["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers" if init else "containers"] if c["name"] == name)


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_renders_well_formed_objects(rendered: dict[str, list[Obj]], variant: str) -> None:
    docs = rendered[variant]
    identities = set()
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        name = doc["metadata"]["name"]
        identity = (doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"), name)
        assert identity not in identities, f"duplicate object {identity}"
        identities.add(identity)
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], f"cluster-scoped {identity} has a namespace"
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{identity} not in {NAMESPACE}"
    assert [d["metadata"]["name"] for d in find(docs, "Namespace")] == [NAMESPACE]
    ns_labels = one(docs, "Namespace")["metadata"]["labels"]
    assert ns_labels["pod-security.kubernetes.io/enforce"] == "restricted"
    kinds = {d["kind"] for d in docs}
    for needed in ("CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                   "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "Service",
                   "ServiceMonitor", "PrometheusRule", "ConfigMap"):
        assert needed in kinds, f"{variant} lacks a {needed}"
    # Secret values are never committed: sunkd only references Secrets the user creates.
    assert not find(docs, "Secret"), f"{variant} renders a Secret"


def test_overlay_differences(rendered: dict[str, list[Obj]]) -> None:
    assert deployment(rendered["base"])["spec"]["replicas"] == 2
    assert deployment(rendered["production"])["spec"]["replicas"] == 2
    assert deployment(rendered["dev"])["spec"]["replicas"] == 1
    # One pod at a time on SQLite: Recreate, never two pods on one file.
    assert deployment(rendered["dev"])["spec"]["strategy"]["type"] == "Recreate"
    assert find(rendered["base"], "Nodeset") and find(rendered["dev"], "Nodeset")
    assert not find(rendered["production"], "Nodeset"), "production must not ship the example"
    pdb = one(rendered["production"], "PodDisruptionBudget", "sunkd")
    pod_labels = deployment(rendered["production"])["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    spread = deployment(rendered["production"])["spec"]["template"]["spec"][
        "topologySpreadConstraints"]
    assert [c["whenUnsatisfiable"] for c in spread] == ["DoNotSchedule"]


# ------------------------------------------------------------- schemas (Kubernetes 1.32)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_objects_valid_against_kubernetes_openapi(rendered: dict[str, list[Obj]],
                                                  variant: str) -> None:
    import kubernetes_validate

    skipped = set()
    for doc in rendered[variant]:
        key = (doc["apiVersion"], doc["kind"])
        if key in CUSTOM_KINDS:
            skipped.add(key)
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{variant}: {doc['kind']}/{doc['metadata']['name']} is invalid for "
                        f"Kubernetes {K8S_VERSION}: {error.message} at {list(error.path)}")
    assert skipped <= CUSTOM_KINDS


def test_openapi_validation_can_fail(rendered: dict[str, list[Obj]]) -> None:
    """The validator really rejects a broken Deployment (guards against a no-op check)."""
    import kubernetes_validate

    broken = copy.deepcopy(deployment(rendered["base"]))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = "y"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def crd_schema(docs: list[Obj]) -> tuple[Obj, Obj]:
    crd = one(docs, "CustomResourceDefinition", "nodesets.sunkd.io")
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    return crd, version["schema"]["openAPIV3Schema"]


def test_example_nodeset_valid_against_crd_schema(rendered: dict[str, list[Obj]]) -> None:
    crd, schema = crd_schema(rendered["base"])
    validator = jsonschema.Draft7Validator(schema)
    nodesets = find(rendered["base"], "Nodeset")
    assert nodesets
    for nodeset in nodesets:
        group_version = f"{crd['spec']['group']}/" + next(
            v["name"] for v in crd["spec"]["versions"] if v["served"])
        assert nodeset["apiVersion"] == group_version
        assert nodeset["kind"] == crd["spec"]["names"]["kind"]
        errors = sorted(validator.iter_errors(nodeset), key=lambda e: list(e.path))
        assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
    # ... and the schema does reject a wrong one.
    broken = copy.deepcopy(nodesets[0])
    broken["spec"]["ownership"]["mode"] = "Sometimes"
    assert list(validator.iter_errors(broken))


# ------------------------------------------------------------------------- Deployment


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_deployment_security_and_probes(rendered: dict[str, list[Obj]], variant: str) -> None:
    docs = rendered[variant]
    pod = deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    sa = one(docs, "ServiceAccount", pod["serviceAccountName"])
    assert sa["metadata"]["namespace"] == NAMESPACE
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        assert sc.get("privileged", False) is False
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
        image = c["image"]
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" in name, f"unpinned image {image}"
        volumes = {v["name"] for v in pod["volumes"]}
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{c['name']} mounts unknown volume {mount['name']}"
    main = container(docs)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"http": 8080}
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert main[probe]["httpGet"]["port"] in ("http", 8080)
    # The Deployment's own /tmp is writable (read-only root filesystem elsewhere).
    assert "/tmp" in {m["mountPath"] for m in main["volumeMounts"]}


def test_image_tag_is_the_project_version(rendered: dict[str, list[Obj]]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for c in (container(rendered["base"]), container(rendered["base"], "migrate", init=True)):
        assert c["image"].endswith(f":{version}"), c["image"]


def env_of(c: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in c.get("env", [])}


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_command_line_and_config_are_valid_for_sunkd(rendered: dict[str, list[Obj]],
                                                     variant: str, tmp_path: Path) -> None:
    """The container arguments parse with sunkd's own CLI parser, and the mounted TOML
    loads with sunkd's own settings loader under the environment the pod gets."""
    from sunkd.cli.main import build_parser
    from sunkd.runtime.config import load_settings, parse_listen

    docs = rendered[variant]
    pod = deployment(docs)["spec"]["template"]["spec"]
    main, migrate = container(docs), container(docs, "migrate", init=True)
    parser = build_parser()
    args = parser.parse_args(main["args"])
    assert args.command == "run"
    assert parse_listen(args.listen) == ("0.0.0.0", 8080)
    assert parser.parse_args(migrate["args"]).command == "migrate"

    config_path = Path(args.config)
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(config_path))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    toml_text = config_map["data"][mount["subPath"]]
    (tmp_path / "sunkd.toml").write_text(toml_text)

    env: dict[str, str] = {}
    for name, entry in env_of(main).items():
        assert name.startswith("SUNKD_"), name
        if "value" in entry:
            env[name] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("sunkd-database", "url")
            env[name] = "postgresql+asyncpg://sunkd:secret@db.example:5432/sunkd"
        else:
            env[name] = "sunkd-0"
    settings = load_settings(tmp_path / "sunkd.toml", env=env)
    if variant == "dev":
        assert "SUNKD_DATABASE_URL" not in env
        assert settings.database_url == "sqlite+aiosqlite:////var/lib/sunkd/sunkd.db"
        state = next(m for m in main["volumeMounts"] if m["mountPath"] == "/var/lib/sunkd")
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == state["name"])
    else:
        assert settings.database_url.startswith("postgresql+asyncpg://")
        assert env_of(migrate)["SUNKD_DATABASE_URL"] == env_of(main)["SUNKD_DATABASE_URL"]
    assert settings.kubernetes.enabled and settings.kubernetes.lease
    # The Slurm JWT key file lies inside the mounted Secret.
    key_file = settings.slurm.jwt_key_file
    assert key_file is not None
    secret_mount = next(m for m in main["volumeMounts"]
                        if key_file.is_relative_to(m["mountPath"]))
    secret = next(v for v in pod["volumes"] if v["name"] == secret_mount["name"])["secret"]
    assert secret["secretName"] == "sunkd-slurm"
    assert secret.get("optional", False) is (variant == "dev")


# ----------------------------------------------------------- Service and monitoring


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_service_and_servicemonitor_select_sunkd(rendered: dict[str, list[Obj]],
                                                 variant: str) -> None:
    docs = rendered[variant]
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    selector = deployment(docs)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = one(docs, "Service", "sunkd")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container(docs)["ports"]}
    http = next(p for p in service["spec"]["ports"] if p["name"] == "http")
    assert http["targetPort"] in port_names
    monitor = one(docs, "ServiceMonitor", "sunkd")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    endpoints = monitor["spec"]["endpoints"]
    assert endpoints and all(e["port"] in {p["name"] for p in service["spec"]["ports"]}
                             for e in endpoints)
    assert {e.get("path", "/metrics") for e in endpoints} == {"/metrics"}


def promql_selectors(node: Any) -> Iterator[Any]:
    """Every VectorSelector in a parsed PromQL expression."""
    if type(node).__name__ == "VectorSelector":
        yield node
    for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is None:
            continue
        for item in child if isinstance(child, list) else [child]:
            yield from promql_selectors(item)


def declared_metrics() -> dict[str, set[str]] | None:
    """Metric names (as exposed) and label names declared in sunkd/api/metrics.py, read
    from its prometheus_client constructor calls; None while the module does not exist."""
    path = ROOT / "sunkd" / "api" / "metrics.py"
    if not path.exists():
        return None
    metrics: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        if func not in ("Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"):
            continue
        labels: set[str] = set()
        label_arg = next((k.value for k in node.keywords if k.arg == "labelnames"),
                         node.args[2] if len(node.args) > 2 else None)
        if isinstance(label_arg, ast.List | ast.Tuple):
            labels = {e.value for e in label_arg.elts if isinstance(e, ast.Constant)}
        name = node.args[0].value
        exposed = {"Counter": [f"{name.removesuffix('_total')}_total"],
                   "Histogram": [f"{name}_bucket", f"{name}_sum", f"{name}_count"],
                   "Summary": [f"{name}_sum", f"{name}_count"],
                   "Info": [f"{name}_info"]}.get(func, [name])
        for exposed_name in exposed:
            metrics[exposed_name] = labels
    return metrics


def test_prometheus_rules(rendered: dict[str, list[Obj]]) -> None:
    import promql_parser

    rule = one(rendered["base"], "PrometheusRule", "sunkd")
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    used: dict[str, set[str]] = {}
    by_metric: dict[str, list[str]] = {}
    for alert in alerts:
        assert re.fullmatch(r"Sunkd[A-Z][A-Za-z]+", alert["alert"]), alert
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert re.fullmatch(r"\d+[smh]", alert["for"])
        expression = promql_parser.parse(alert["expr"])  # raises on a syntax error
        for selector in promql_selectors(expression):
            used.setdefault(selector.name, set()).update(
                m.name for m in selector.matchers.matchers)
            by_metric.setdefault(selector.name, []).append(alert["alert"])
    # The four conditions the alerts must cover, by the metric each one watches.
    for metric in ("sunkd_source_seconds_since_success", "sunkd_transitions_open",
                   "sunkd_actions_total", "sunkd_leader"):
        assert metric in by_metric, f"no alert watches {metric}"
    declared = declared_metrics()
    assert declared is not None, "sunkd/api/metrics.py must declare the metrics"
    for metric, labels in used.items():
        assert metric in declared, f"alerts {by_metric[metric]} use {metric}, which " \
            f"sunkd/api/metrics.py does not declare (it has {sorted(declared)})"
        assert labels <= declared[metric], f"{metric}: labels {labels - declared[metric]} " \
            "are not declared"


def test_scheduler_extender_configuration(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["base"]
    config_map = one(docs, "ConfigMap", next(
        d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"
        and d["metadata"]["name"].startswith("sunkd-scheduler-config")))
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert "sunkd-scheduler" in [p["schedulerName"] for p in config["profiles"]]
    service = one(docs, "Service", "sunkd")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    (extender,) = config["extenders"]
    match = re.fullmatch(r"http://([^:/]+):(\d+)(/.*)", extender["urlPrefix"])
    assert match, extender["urlPrefix"]
    host, url_port, path = match.groups()
    assert host.split(".")[:3] == [service["metadata"]["name"], NAMESPACE, "svc"]
    assert int(url_port) == port
    assert (path.rstrip("/"), extender["filterVerb"], extender["prioritizeVerb"]) == (
        "/scheduler", "filter", "prioritize")
    # kube-scheduler's validateExtenders: a prioritizing extender needs a positive weight.
    assert extender["weight"] > 0
    assert re.fullmatch(r"\d+(ms|s)", extender["httpTimeout"])


# ----------------------------------------------------------------------------- RBAC

VERB_OF_METHOD = {"get": "get", "create": "create", "replace": "update",
                  "merge_patch": "patch", "patch": "patch", "delete": "delete",
                  "list": "list", "watch": "watch"}


def scan_code_for_api_calls() -> set[tuple[str, str, str]]:
    """(verb, group, resource) of every KubeClient call in sunkd's code, found by reading
    the source: `<x>.client.<method>(RESOURCE, ..., subresource="...")` and the list+watch
    informers (`ListWatch(RESOURCE, ...)` or a local helper wrapping it)."""
    from sunkd.kubernetes import client as kube

    constants = {name: value for name, value in vars(kube).items()
                 if isinstance(value, kube.ResourceType)}
    found: set[tuple[str, str, str]] = set()
    for path in sorted((ROOT / "sunkd").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        generic = ("sunkd/kubernetes/client.py", "sunkd/kubernetes/listwatch.py")
        if rel.startswith("testbed/sunkd_testbed/") or rel in generic:
            continue
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            aliases = {t.id: n.value for n in ast.walk(function) if isinstance(n, ast.Assign)
                       for t in n.targets if isinstance(t, ast.Name)}
            for node in ast.walk(function):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                informer = isinstance(func, ast.Name) and func.id in ("ListWatch", "make")
                client_call = (isinstance(func, ast.Attribute) and func.attr in VERB_OF_METHOD
                               and isinstance(func.value, ast.Attribute)
                               and func.value.attr == "client")
                if not (informer or client_call):
                    continue
                target = node.args[0]
                if isinstance(target, ast.Name) and target.id in aliases:
                    target = aliases[target.id]
                if isinstance(target, ast.Name) and target.id in constants:
                    rt = constants[target.id]
                    group, resource = rt.group, rt.plural
                elif isinstance(target, ast.Name | ast.Attribute) and "nodeset" in (
                        getattr(target, "id", "") + getattr(target, "attr", "")):
                    group, resource = kube.NODESETS.group, kube.NODESETS.plural
                elif informer:
                    continue  # a helper named `make` that is not about resources
                else:
                    pytest.fail(f"{rel}:{node.lineno}: cannot tell which resource this "
                                "Kubernetes call is on; extend scan_code_for_api_calls")
                if informer:
                    found |= {("list", group, resource), ("watch", group, resource)}
                    continue
                sub = next((k.value.value for k in node.keywords if k.arg == "subresource"
                            and isinstance(k.value, ast.Constant)), None)
                found.add((VERB_OF_METHOD[func.attr], group,
                           f"{resource}/{sub}" if sub else resource))
    return found


def api_calls(*, slurmd: bool = False) -> set[tuple[str, str, str]]:
    """What every installation grants; with `slurmd`, also what slurmd pods need."""
    from sunkd.kubernetes.actuator import API_CALLS, SLURMD_API_CALLS

    calls = API_CALLS + (SLURMD_API_CALLS if slurmd else ())
    return {(call.verb, call.group, call.resource) for call in calls}


def granted(role: Obj) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {role['metadata']['name']}: {rule}"
        out |= {(verb, group, resource) for verb in rule["verbs"]
                for group in rule["apiGroups"] for resource in rule["resources"]}
    return out


def test_code_scan_agrees_with_api_calls() -> None:
    scanned = scan_code_for_api_calls()
    assert len(scanned) >= 10, f"the scan found too little to be trusted: {scanned}"
    missing = scanned - api_calls(slurmd=True)
    assert not missing, f"the code makes calls API_CALLS does not list: {sorted(missing)}"


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_rbac_grants_exactly_the_api_calls(rendered: dict[str, list[Obj]], variant: str) -> None:
    docs = rendered[variant]
    sa_name = deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}
    cluster_grants: set[tuple[str, str, str]] = set()
    for binding in find(docs, "ClusterRoleBinding"):
        if subject in binding["subjects"]:
            assert binding["roleRef"]["kind"] == "ClusterRole"
            cluster_grants |= granted(one(docs, "ClusterRole", binding["roleRef"]["name"]))
    namespace_grants: set[tuple[str, str, str]] = set()
    for binding in find(docs, "RoleBinding"):
        if subject in binding["subjects"]:
            assert binding["metadata"]["namespace"] == NAMESPACE
            assert binding["roleRef"]["kind"] == "Role", "no ClusterRole bound per namespace"
            namespace_grants |= granted(one(docs, "Role", binding["roleRef"]["name"]))
    for role in find(docs, "Role") + find(docs, "ClusterRole"):
        assert any(b["roleRef"]["name"] == role["metadata"]["name"]
                   for b in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")), \
            f"{role['kind']} {role['metadata']['name']} is bound to nothing"

    needed = api_calls(slurmd=variant in SLURMD_VARIANTS)
    # The leader-election Lease lives in sunkd's own namespace: granted there only.
    lease_calls = {c for c in needed if c[1] == "coordination.k8s.io"}
    assert lease_calls and lease_calls <= namespace_grants
    assert not {c for c in cluster_grants if c[2] == "leases"}, "Leases granted cluster-wide"
    everything = cluster_grants | namespace_grants
    assert needed <= everything, f"RBAC misses calls the code makes: {sorted(needed - everything)}"
    assert everything <= needed, f"RBAC grants more than the code uses: " \
        f"{sorted(everything - needed)}"
    assert not {c for c in everything if c[2] in ("secrets", "configmaps")}


def test_slurmd_pods_component_adds_only_its_rbac(rendered: dict[str, list[Obj]]) -> None:
    """components/slurmd-pods adds one ClusterRole granting exactly SLURMD_API_CALLS,
    bound to sunkd's ServiceAccount, and changes nothing else of the overlay; no variant
    we ship grants any of it (test_rbac_grants_exactly_the_api_calls)."""
    def by_identity(docs: list[Obj]) -> dict[tuple[str, str], Obj]:
        return {(d["kind"], d["metadata"]["name"]): d for d in docs}

    plain = by_identity(rendered["production"])
    composed = by_identity(rendered["production+slurmd-pods"])
    added = set(composed) - set(plain)
    assert added == {("ClusterRole", "sunkd-slurmd-pods"),
                     ("ClusterRoleBinding", "sunkd-slurmd-pods")}, added
    assert {k: composed[k] for k in plain} == plain
    slurmd_only = api_calls(slurmd=True) - api_calls()
    assert slurmd_only and granted(composed[("ClusterRole", "sunkd-slurmd-pods")]) == slurmd_only
    binding = composed[("ClusterRoleBinding", "sunkd-slurmd-pods")]
    sa_name = deployment(rendered["production"])["spec"]["template"]["spec"][
        "serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name,
                                    "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == "sunkd-slurmd-pods"
    for name in VARIANTS:
        assert not (granted_to_sunkd(rendered[name]) & slurmd_only), name


def granted_to_sunkd(docs: list[Obj]) -> set[tuple[str, str, str]]:
    """Everything a variant's ClusterRoles and Roles grant (bound or not)."""
    out: set[tuple[str, str, str]] = set()
    for role in find(docs, "ClusterRole") + find(docs, "Role"):
        out |= granted(role)
    return out


# ---------------------------------------------------- kubectl against the API emulator


def test_kubectl_applies_crd_and_example_to_emulator(rendered: dict[str, list[Obj]],
                                                     tmp_path: Path) -> None:
    kubectl_bin = kubectl()
    docs = rendered["dev"]
    first = [d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")]
    nodesets = find(docs, "Nodeset")
    assert len(first) == 2 and nodesets
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump_all(first))
    (tmp_path / "example.yaml").write_text(yaml.safe_dump_all(nodesets))

    async def scenario() -> None:
        from sunkd_testbed.kubeapi import KubeAPIEmulator

        api = KubeAPIEmulator()
        await api.start("127.0.0.1", 0)
        try:
            kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}

            async def run(*argv: str) -> str:
                process = await asyncio.create_subprocess_exec(
                    kubectl_bin, *argv, env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
                out, err = await asyncio.wait_for(process.communicate(), 60)
                assert process.returncode == 0, f"kubectl {' '.join(argv)}: {err.decode()}"
                return out.decode()

            await run("apply", "-f", str(tmp_path / "crd.yaml"))
            await run("wait", "--for=condition=Established", "--timeout=20s",
                      "crd/nodesets.sunkd.io")
            await run("apply", "-f", str(tmp_path / "example.yaml"))
            listed = yaml.safe_load(await run("get", "nodesets", "-n", NAMESPACE, "-o", "yaml"))
            names = sorted(item["metadata"]["name"] for item in listed["items"])
            assert names == sorted(n["metadata"]["name"] for n in nodesets)
            for item in listed["items"]:
                expected = next(n for n in nodesets
                                if n["metadata"]["name"] == item["metadata"]["name"])
                assert expected["spec"]["nodeSelector"] == item["spec"]["nodeSelector"]
        finally:
            await api.stop()

    asyncio.run(scenario())


# ------------------------------------------------------------- scheduler and Grafana


def test_scheduler_extender_matches_the_reference_configuration(
        rendered: dict[str, list[Obj]]) -> None:
    """The second-scheduler config in the base and manifests/scheduler/ (the default
    scheduler's, kept by observability) register the same extender."""
    reference_path = MANIFESTS / "scheduler" / "kube-scheduler-config.yaml"
    reference = yaml.safe_load(reference_path.read_text())
    config_map = next(d for d in rendered["base"] if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"].startswith("sunkd-scheduler-config"))
    ours = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    defaults = {"enableHTTPS": False, "ignorable": False, "nodeCacheCapable": False}
    assert [{**defaults, **e} for e in ours["extenders"]] == \
        [{**defaults, **e} for e in reference["extenders"]]
    assert {p["schedulerName"] for p in ours["profiles"]} <= {
        p["schedulerName"] for p in reference["profiles"]}


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_grafana_configmaps_carry_the_files(rendered: dict[str, list[Obj]],
                                            variant: str) -> None:
    grafana = MANIFESTS / "grafana"
    dashboards = sorted(grafana.glob("*.json"))
    assert dashboards, "manifests/grafana has no dashboards"
    docs = rendered[variant]
    board_map = one(docs, "ConfigMap", "sunkd-grafana-dashboards")
    assert board_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(board_map["data"]) == {p.name for p in dashboards}
    for path in dashboards:
        assert board_map["data"][path.name] == path.read_text()
    source_map = one(docs, "ConfigMap", "sunkd-grafana-datasources")
    assert source_map["metadata"]["labels"]["grafana_datasource"] == "1"
    assert source_map["data"]["datasources.yaml"] == (grafana / "datasources.yaml").read_text()
