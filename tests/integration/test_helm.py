"""The Helm chart (charts/sunkd), with helm built from Go modules (scripts/build-helm.sh,
pin in tests/helm/go.mod) and kubectl.

- `helm lint --strict` with the default, production and dev values;
- `helm template` of each, compared object by object with `kubectl kustomize` of the
  matching kustomize directory (manifests/, overlays/production, overlays/dev): the same
  kinds and names, RBAC rules, security contexts, probes, volumes, the same settings as
  sunkd loads them. Every difference the chart may have is named in `ALLOWED` with its
  reason, and each named difference must still occur (the list cannot rot);
- RBAC checked against `sunkd.kubernetes.actuator.API_CALLS` in both directions;
- bad values fail with the schema's message (values.schema.json);
- installed on the real control plane (sunkd_testbed.kubernetes): `helm install`, the
  objects and the CRD, the ServiceAccount's rights with `kubectl auth can-i` (every API
  call sunkd makes yes, others no), the pods admitted under Pod Security "restricted"
  (they stay Pending: there is no kubelet), `helm upgrade` with changed values, then
  `helm uninstall`.

Skips when helm or the Kubernetes binaries are not built; fails instead under
SUNKD_TEST_STRICT=1 (tests/conftest.py `require`).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sunkd_testbed.kubernetes import KubeControlPlane, available, cache_root, default_bin_dir
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sunkd"
MANIFESTS = ROOT / "manifests"
RELEASE = NAMESPACE = "sunkd"
BUILD_COMMAND = "scripts/build-helm.sh"
# chart values file -> the kustomize directory it corresponds to
VARIANTS: dict[str, tuple[Path | None, Path]] = {
    "default": (None, MANIFESTS),
    "production": (CHART / "values-production.yaml", MANIFESTS / "overlays" / "production"),
    "dev": (CHART / "ci" / "dev-values.yaml", MANIFESTS / "overlays" / "dev"),
}
# Labels the chart puts on every object besides kustomize's (app.kubernetes.io/name,
# part-of, component).
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "app.kubernetes.io/name",
               "app.kubernetes.io/part-of")
INSTANCE = "app.kubernetes.io/instance"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"

Obj = dict[str, Any]


# --------------------------------------------------------------------------- binaries


def helm_version_pin() -> str:
    go_mod = (ROOT / "tests" / "helm" / "go.mod").read_text()
    match = re.search(r"^\s*helm\.sh/helm/v\d+ (v\S+)", go_mod, re.MULTILINE)
    assert match is not None, "tests/helm/go.mod requires no helm.sh/helm"
    return match.group(1)


def helm_path() -> Path:
    """Where scripts/build-helm.sh puts helm (`SUNKD_HELM` overrides)."""
    override = os.environ.get("SUNKD_HELM")
    if override:
        return Path(override)
    return cache_root() / f"helm-{helm_version_pin()}" / "bin" / "helm"


def helm_bin() -> Path:
    path = helm_path()
    require(path.is_file() and os.access(path, os.X_OK),
            f"helm {helm_version_pin()} is not built at {path} (run `{BUILD_COMMAND}`, "
            "about 1.5 min cold; SUNKD_KUBE_CACHE or SUNKD_HELM point elsewhere)")
    return path


def kubectl_bin() -> str:
    built = default_bin_dir() / "kubectl"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("kubectl")
    require(found is not None, "no kubectl: neither built (scripts/build-kubernetes.sh) "
                               "nor installed")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """helm's own directories (cache, config, data) in a private place, never ~/."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    env.update(HOME=str(home), HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"),
               KUBECACHEDIR=str(home / "kube-cache"))
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    else:
        env["KUBECONFIG"] = str(home / "no-cluster")
    return env


def run_helm(home: Path, *args: str, kubeconfig: Path | None = None, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_bin()), *args], env=helm_env(home, kubeconfig),
                            capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert result.returncode == 0, \
            f"helm {' '.join(args)}: rc={result.returncode}\n{result.stderr}{result.stdout}"
    return result


def docs_of(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def template(home: Path, *args: str) -> list[Obj]:
    out = run_helm(home, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                   "--include-crds", *args).stdout
    return docs_of(out)


def values_args(values: Path | None) -> list[str]:
    return ["-f", str(values)] if values is not None else []


@pytest.fixture(scope="module")
def chart(helm_home: Path) -> dict[str, list[Obj]]:
    return {name: template(helm_home, *values_args(values))
            for name, (values, _) in VARIANTS.items()}


@pytest.fixture(scope="module")
def kustomize() -> dict[str, list[Obj]]:
    rendered = {}
    for name, (_, directory) in VARIANTS.items():
        result = subprocess.run([kubectl_bin(), "kustomize", str(directory)],
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
        rendered[name] = docs_of(result.stdout)
    return rendered


def find(docs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [d for d in docs
            if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# ------------------------------------------------------------------ the chart's files


def test_helm_is_the_go_mod_pin(helm_home: Path) -> None:
    version = run_helm(helm_home, "version", "--template", "{{.Version}}").stdout.strip()
    assert version == helm_version_pin()


def test_app_version_is_the_package_version() -> None:
    import sunkd

    chart_yaml = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart_yaml["appVersion"] == package == sunkd.__version__
    assert chart_yaml["apiVersion"] == "v2" and chart_yaml["name"] == "sunkd"


def test_default_image_is_the_app_version(chart: dict[str, list[Obj]]) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    pod = one(chart["default"], "Deployment", RELEASE)["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        assert c["image"] == f"ghcr.io/sunkd/sunkd:{version}", c["name"]


@pytest.mark.parametrize(("copy_in_chart", "original"), [
    ("crds/nodeset.yaml", "crds/nodeset.yaml"),
    ("files/prometheusrule.yaml", "base/prometheusrule.yaml"),
    ("files/grafana/datasources.yaml", "grafana/datasources.yaml"),
    *[(f"files/grafana/{p.name}", f"grafana/{p.name}")
      for p in sorted((MANIFESTS / "grafana").glob("*.json"))],
])
def test_chart_files_are_copies_of_the_manifests(copy_in_chart: str, original: str) -> None:
    """Helm reads nothing outside the chart directory, so the CRD, the alert rules and the
    Grafana files are copies; they must stay byte-identical to manifests/."""
    ours, theirs = CHART / copy_in_chart, MANIFESTS / original
    assert ours.read_bytes() == theirs.read_bytes(), \
        f"{ours.relative_to(ROOT)} differs from {theirs.relative_to(ROOT)}: cp {theirs} {ours}"


def test_every_grafana_dashboard_is_in_the_chart() -> None:
    assert {p.name for p in (MANIFESTS / "grafana").glob("*.json")} == \
        {p.name for p in (CHART / "files" / "grafana").glob("*.json")}


# ----------------------------------------------------------------------- lint, render


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lint(helm_home: Path, variant: str) -> None:
    values, _ = VARIANTS[variant]
    result = run_helm(helm_home, "lint", "--strict", str(CHART), *values_args(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_template_renders_well_formed_objects(chart: dict[str, list[Obj]],
                                              variant: str) -> None:
    docs = chart[variant]
    seen = set()
    for doc in docs:
        identity = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        assert identity not in seen, f"duplicate {identity}"
        seen.add(identity)
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], identity
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, identity
    # Secret values are never in values or git: the chart only references Secrets.
    assert not find(docs, "Secret")
    assert not find(docs, "Namespace")


def test_names_follow_the_release(helm_home: Path) -> None:
    """Another release name and namespace: every name and reference follows."""
    out = run_helm(helm_home, "template", "batch", str(CHART), "--namespace", "hpc").stdout
    docs = docs_of(out)
    pod = one(docs, "Deployment", "batch-sunkd")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "batch-sunkd"
    assert one(docs, "ClusterRoleBinding", "batch-sunkd")["subjects"] == [
        {"kind": "ServiceAccount", "name": "batch-sunkd", "namespace": "hpc"}]
    assert one(docs, "RoleBinding", "batch-sunkd-leader-election")["metadata"][
        "namespace"] == "hpc"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "batch-sunkd-config"
    scheduler = yaml.safe_load(
        one(docs, "ConfigMap", "batch-sunkd-scheduler-config")["data"]["scheduler-config.yaml"])
    assert scheduler["extenders"][0]["urlPrefix"] == \
        "http://batch-sunkd.hpc.svc.cluster.local:8080/scheduler"
    assert scheduler["leaderElection"]["resourceNamespace"] == "hpc"
    assert {d["metadata"].get("namespace") for d in docs} == {"hpc", None}
    override = template(helm_home, "--set", "fullnameOverride=pools")
    assert one(override, "Deployment", "pools")["spec"]["template"]["spec"][
        "serviceAccountName"] == "pools"


# ------------------------------------------------------- the chart against kustomize


@dataclass(frozen=True)
class Difference:
    """One way the chart may differ from kustomize: `where` are (kind, name, path, how)
    patterns (fnmatch per element; how is "chart only", "kustomize only" or "differs";
    path () is the whole object)."""

    reason: str
    where: tuple[tuple[str, str, tuple[str, ...], str], ...]
    variants: tuple[str, ...] = tuple(VARIANTS)


def _label_paths(*keys: str) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
    return tuple(
        (kind, "*", (*path, key), "chart only")
        for key in keys
        for kind, path in (("*", ("metadata", "labels")),
                           ("Deployment", ("spec", "template", "metadata", "labels"))))


SELECTORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Deployment", ("spec", "selector", "matchLabels")),
    ("Deployment", ("spec", "template", "spec", "topologySpreadConstraints", "0",
                    "labelSelector", "matchLabels")),
    ("Service", ("spec", "selector")),
    ("NetworkPolicy", ("spec", "podSelector", "matchLabels")),
    ("PodDisruptionBudget", ("spec", "selector", "matchLabels")),
    ("ServiceMonitor", ("spec", "selector", "matchLabels")),
)

ALLOWED: dict[str, Difference] = {
    "namespace": Difference(
        "kustomize declares the Namespace (with Pod Security `restricted`); a Helm release "
        "lives in a namespace that exists first (`--create-namespace`) and that Helm must "
        "not own, or `helm uninstall` would delete everything in it. docs/deploy.md and "
        "NOTES.txt say to label it restricted.",
        (("Namespace", NAMESPACE, (), "kustomize only"),)),
    "example-pool": Difference(
        "manifests/ ships the example Nodeset gpu-a; the chart creates the Nodesets listed "
        "in `nodesets`, none by default (ci/dev-values.yaml has the example).",
        (("Nodeset", "gpu-a", (), "kustomize only"),), ("default",)),
    "monitoring-optional": Difference(
        "ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs; without "
        "them `helm install` fails, so the chart makes them opt-in (on in "
        "values-production.yaml); kustomize says to delete them in an overlay instead.",
        (("ServiceMonitor", RELEASE, (), "kustomize only"),
         ("PrometheusRule", RELEASE, (), "kustomize only")), ("default", "dev")),
    "helm-labels": Difference(
        "the chart puts Helm's standard labels (helm.sh/chart, app.kubernetes.io/instance, "
        "version, managed-by) on every object and pod, and name/part-of also where "
        "kustomize's `labels` transformer does not reach (pod template, Nodesets); it never "
        "changes or drops one of kustomize's labels.",
        _label_paths(*HELM_LABELS)),
    "instance-selector": Difference(
        "selectors also match app.kubernetes.io/instance, so two releases in one "
        "namespace never select each other's pods.",
        tuple((kind, "*", (*path, INSTANCE), "chart only") for kind, path in SELECTORS)),
    "config-checksum": Difference(
        "kustomize rolls the pods on a config change by the ConfigMap's name hash; the chart "
        "keeps the name fixed and puts the config's checksum in a pod annotation.",
        (("Deployment", RELEASE, ("spec", "template", "metadata", "annotations",
                                  "checksum/config"), "chart only"),)),
    "crd-labels": Difference(
        "Helm installs crds/ verbatim (the same file as manifests/crds/nodeset.yaml): "
        "no templating, so no labels; kustomize adds its common labels.",
        (("CustomResourceDefinition", "nodesets.sunkd.io", ("metadata", "labels", "*"),
          "kustomize only"),)),
}


def _strip_generator_hash(docs: list[Obj]) -> tuple[list[Obj], dict[str, str]]:
    """kustomize's configMapGenerator names (sunkd-config-<10 chars>) -> the plain name, in
    the ConfigMaps and in the Deployment's references. Returns the renames."""
    docs = copy.deepcopy(docs)
    renames = {}
    for doc in docs:
        name = doc["metadata"]["name"]
        # kustomize's hash: 10 characters of its alphabet (no vowels, no 0, 1, 3)
        match = re.fullmatch(r"(.+)-[2456789bcdfghkmt]{10}", name)
        if doc["kind"] == "ConfigMap" and match:
            renames[name] = match.group(1)
            doc["metadata"]["name"] = match.group(1)
    for deployment in find(docs, "Deployment"):
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in volume and volume["configMap"]["name"] in renames:
                volume["configMap"]["name"] = renames[volume["configMap"]["name"]]
    return docs, renames


def _settings_of(toml_text: str, tmp: Path) -> Obj:
    """sunkd.toml as sunkd loads it (defaults filled in), under a pod's environment minus
    the database URL, so two files that mean the same compare equal."""
    from sunkd.runtime.config import load_settings

    path = tmp / "sunkd.toml"
    path.write_text(toml_text)
    settings = load_settings(path, env={"SUNKD_IDENTITY": "sunkd-0"})
    return json.loads(json.dumps(dataclasses.asdict(settings), default=str))


def _normalize(doc: Obj, tmp: Path) -> Obj:
    """Parse the embedded files, turn lists of named items into maps (order is not
    meaning), drop what only the API server or Helm's comments care about."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "ConfigMap":
        data = doc.get("data", {})
        if "sunkd.toml" in data:
            data["sunkd.toml"] = _settings_of(data["sunkd.toml"], tmp)
        if "scheduler-config.yaml" in data:
            data["scheduler-config.yaml"] = yaml.safe_load(data["scheduler-config.yaml"])

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            # An empty list is the same as none (`env: []` left by a kustomize $patch).
            return {k: walk(v) for k, v in value.items() if v != []}
        if isinstance(value, list):
            if value and all(isinstance(v, dict) and "name" in v for v in value):
                return {f"name={v['name']}": walk(v) for v in value}
            return {str(i): walk(v) for i, v in enumerate(value)}
        return value

    return walk(doc)


def _diff(ours: Any, theirs: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                 str]]:
    """(path, how) for every leaf where the chart (ours) and kustomize (theirs) differ; a
    map only one side has is walked down to its leaves (an empty map is a leaf: an empty
    namespaceSelector means something)."""
    missing = object()
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            a, b = ours.get(key, missing), theirs.get(key, missing)
            if a is not missing and b is not missing:
                yield from _diff(a, b, (*path, key))
            elif b is missing and isinstance(a, dict) and a:
                yield from _diff(a, {}, (*path, key))
            elif a is missing and isinstance(b, dict) and b:
                yield from _diff({}, b, (*path, key))
            else:
                yield (*path, key), "chart only" if b is missing else "kustomize only"
    elif ours != theirs:
        yield path, "differs"


def _compare(chart_docs: list[Obj], kustomize_docs: list[Obj], tmp: Path,
             variant: str) -> tuple[list[tuple[str, str, tuple[str, ...], str]], dict[str, str]]:
    theirs_docs, renames = _strip_generator_hash(kustomize_docs)
    ours = {(d["kind"], d["metadata"]["name"]): _normalize(d, tmp) for d in chart_docs}
    theirs = {(d["kind"], d["metadata"]["name"]): _normalize(d, tmp) for d in theirs_docs}
    found = []
    for key in sorted(set(ours) | set(theirs)):
        if key not in theirs:
            found.append((*key, (), "chart only"))
        elif key not in ours:
            found.append((*key, (), "kustomize only"))
        else:
            found += [(*key, path, how) for path, how in _diff(ours[key], theirs[key])]
    return found, renames


def _allowed_by(found: tuple[str, str, tuple[str, ...], str], variant: str) -> list[str]:
    kind, name, path, how = found
    names = []
    for label, difference in ALLOWED.items():
        if variant not in difference.variants:
            continue
        for p_kind, p_name, p_path, p_how in difference.where:
            if (fnmatch.fnmatchcase(kind, p_kind) and fnmatch.fnmatchcase(name, p_name)
                    and how == p_how and len(path) == len(p_path)
                    and all(fnmatch.fnmatchcase(a, b) for a, b in zip(path, p_path,
                                                                      strict=True))):
                names.append(label)
                break
    return names


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chart_matches_kustomize(chart: dict[str, list[Obj]], kustomize: dict[str, list[Obj]],
                                 variant: str, tmp_path: Path) -> None:
    """The same kinds, names, RBAC rules, security contexts, probes, volumes, env, spread,
    config (as sunkd loads it), scheduler extender, alerts, dashboards and CRD; the only
    differences are the named ones in ALLOWED, and each of those still occurs."""
    found, renames = _compare(chart[variant], kustomize[variant], tmp_path, variant)
    # kustomize's generated ConfigMap names carry a content hash (see "config-checksum").
    assert set(renames.values()) == {"sunkd-config", "sunkd-scheduler-config"}, renames
    unexplained = [f for f in found if not _allowed_by(f, variant)]
    assert not unexplained, (
        f"{variant}: chart and kustomize differ where no ALLOWED entry says why:\n"
        + "\n".join(f"  {k}/{n} {'.'.join(p) or '(object)'}: {how}"
                    for k, n, p, how in unexplained))
    used = {label for f in found for label in _allowed_by(f, variant)}
    expected = {label for label, d in ALLOWED.items() if variant in d.variants}
    assert used == expected, f"{variant}: ALLOWED entries that no longer occur (remove " \
        f"them, or their variants): {sorted(expected - used)}"
    # Same kinds on both sides, but for the named whole-object differences.
    kinds = {d["kind"] for d in chart[variant]}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "Role", "RoleBinding", "Deployment", "Service", "ConfigMap",
            "NetworkPolicy"} <= kinds


def test_comparison_notices_a_difference(chart: dict[str, list[Obj]],
                                         kustomize: dict[str, list[Obj]],
                                         tmp_path: Path) -> None:
    """Guards against a comparison that can never fail."""
    broken = copy.deepcopy(chart["production"])
    pod = one(broken, "Deployment", RELEASE)["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    one(broken, "ClusterRole", RELEASE)["rules"][0]["verbs"].append("delete")
    found, _ = _compare(broken, kustomize["production"], tmp_path, "production")
    unexplained = {(k, n, ".".join(p)) for k, n, p, _ in found if not _allowed_by(
        (k, n, p, _), "production")}
    assert ("Deployment", RELEASE, "spec.template.spec.containers.name=sunkd."
            "securityContext.readOnlyRootFilesystem") in unexplained
    assert ("ClusterRole", RELEASE, "rules.0.verbs.4") in unexplained


# ------------------------------------------------------------------------------ RBAC


def api_calls() -> set[tuple[str, str, str]]:
    from sunkd.kubernetes.actuator import API_CALLS

    return {(call.verb, call.group, call.resource) for call in API_CALLS}


def granted(role: Obj) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {role['metadata']['name']}: {rule}"
        out |= {(verb, group, resource) for verb in rule["verbs"]
                for group in rule["apiGroups"] for resource in rule["resources"]}
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rbac_grants_exactly_the_api_calls(chart: dict[str, list[Obj]], variant: str) -> None:
    docs = chart[variant]
    sa = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}
    cluster, namespaced = set(), set()
    for binding in find(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [subject]
        cluster |= granted(one(docs, "ClusterRole", binding["roleRef"]["name"]))
    for binding in find(docs, "RoleBinding"):
        assert binding["subjects"] == [subject] and binding["roleRef"]["kind"] == "Role"
        namespaced |= granted(one(docs, "Role", binding["roleRef"]["name"]))
    needed = api_calls()
    lease_calls = {c for c in needed if c[1] == "coordination.k8s.io"}
    assert lease_calls and lease_calls == namespaced, "Leases: in the release namespace only"
    assert cluster | namespaced == needed, (
        f"missing: {sorted(needed - cluster - namespaced)}; "
        f"more than sunkd uses: {sorted((cluster | namespaced) - needed)}")


def test_slurmd_pods_rbac_is_opt_in(helm_home: Path) -> None:
    """`rbac.slurmdPods` adds exactly SLURMD_API_CALLS (pods create, delete and
    patch; PDBs get, create and patch; nodesets patch, the finalizer) to the
    ClusterRole; the default grants none of it (test_rbac_grants_exactly_the_api_calls)."""
    from sunkd.kubernetes.actuator import SLURMD_API_CALLS

    docs = template(helm_home, "--set", "rbac.slurmdPods=true")
    role = one(docs, "ClusterRole", RELEASE)
    slurmd = {(c.verb, c.group, c.resource) for c in SLURMD_API_CALLS}
    assert granted(role) == (api_calls() - {c for c in api_calls()
                                            if c[1] == "coordination.k8s.io"}) | slurmd


def _rules(role: Obj) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
                  for r in role["rules"])


def test_slurmd_pods_rbac_equals_the_kustomize_component(helm_home: Path) -> None:
    """`rbac.slurmdPods: true` adds to the chart's ClusterRole exactly the rules of the
    kustomize component manifests/components/slurmd-pods (rule for rule, not only the
    calls), and the component binds them to the same ServiceAccount kustomize's base
    deploys; tests/integration/test_rbac_real.py proves each rule on a real API server."""
    without = _rules(one(template(helm_home), "ClusterRole", RELEASE))
    with_pods = _rules(one(template(helm_home, "--set", "rbac.slurmdPods=true"),
                           "ClusterRole", RELEASE))
    added = list(with_pods)
    for rule in without:
        added.remove(rule)
    component = docs_of((MANIFESTS / "components" / "slurmd-pods" / "rbac.yaml").read_text())
    role = one(component, "ClusterRole")
    assert added == _rules(role)
    binding = one(component, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    base = docs_of((MANIFESTS / "base" / "rbac.yaml").read_text()) \
        if (MANIFESTS / "base" / "rbac.yaml").is_file() else []
    base_subjects = [b["subjects"] for b in find(base, "ClusterRoleBinding")]
    assert not base_subjects or binding["subjects"] in base_subjects


def test_no_rbac_without_rbac_create(helm_home: Path) -> None:
    docs = template(helm_home, "--set", "rbac.create=false")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role",
                                                 "RoleBinding")]


# -------------------------------------------------------------------- values -> sunkd


def _pod_env(container: Obj) -> dict[str, str]:
    env = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom", {})
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in source:
            env[entry["name"]] = "postgresql+asyncpg://sunkd:secret@db.example:5432/sunkd"
        else:
            env[entry["name"]] = "sunkd-0"
    return env


def _loaded_settings(docs: list[Obj], tmp: Path) -> Any:
    from sunkd.cli.main import build_parser
    from sunkd.runtime.config import load_settings

    pod = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "sunkd")
    args = build_parser().parse_args(main["args"])
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(args.config))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    text = one(docs, "ConfigMap", volume["configMap"]["name"])["data"][mount["subPath"]]
    (tmp / "sunkd.toml").write_text(text)
    return load_settings(tmp / "sunkd.toml", env=_pod_env(main)), main, pod


def test_values_reach_sunkd_settings(helm_home: Path, tmp_path: Path) -> None:
    """Every `config` value lands in sunkd.toml as sunkd reads it (the TOML is rendered
    by templates; sunkd's own loader checks it)."""
    values = {
        "config": {
            "logLevel": "warning", "leaseSeconds": 20.5, "snapshotEvery": 500,
            "snapshotsKept": 5,
            "snapshotEncoder": "thread",
            "slurm": {"url": "https://slurm.example:6820", "user": "sunkd",
                      "pollInterval": 2, "requestTimeout": 17.5, "partitions": ["gpu", "cpu"]},
            "kubernetes": {"lease": False, "requestTimeout": 12},
            "pools": [{"name": "gpu-a", "partitions": ["gpu"],
                       "node_selector": {"pool": "gpu-a", "zone": "a \"quoted\" \\ zone"},
                       "workload_selector": {"app": "inference"}, "mode": "Kubernetes",
                       "min_slurm": 1, "max_kubernetes": 4, "dwell_seconds": 60}],
        },
        "slurm": {"credentials": {"auth": "token", "existingSecret": "slurm-token"}},
        "database": {"existingSecret": "db", "secretKey": "dsn"},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    docs = template(helm_home, "-f", str(values_file))
    settings, main, pod = _loaded_settings(docs, tmp_path)
    assert (settings.log_level, settings.lease_seconds, settings.snapshot_every,
            settings.snapshots_kept, settings.snapshot_encoder) == ("warning", 20.5, 500, 5,
                                                                    "thread")
    assert settings.slurm.url == "https://slurm.example:6820"
    assert (settings.slurm.user, settings.slurm.poll_interval,
            settings.slurm.request_timeout) == ("sunkd", 2.0, 17.5)
    assert settings.slurm.partitions == ("gpu", "cpu")
    assert settings.slurm.token_file == Path("/etc/sunkd/slurm/token")
    assert settings.slurm.jwt_key_file is None
    assert settings.kubernetes.enabled and not settings.kubernetes.lease
    assert settings.kubernetes.request_timeout == 12
    [pool] = settings.pools
    assert (pool.name, pool.partitions, pool.mode, pool.min_slurm, pool.max_kubernetes,
            pool.dwell_seconds) == ("gpu-a", ("gpu",), "Kubernetes", 1, 4, 60.0)
    assert pool.node_selector == {"pool": "gpu-a", "zone": "a \"quoted\" \\ zone"}
    assert pool.workload_selector == {"app": "inference"}
    assert settings.database_url.startswith("postgresql+asyncpg://")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in main["env"]
            if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"SUNKD_DATABASE_URL": {"name": "db", "key": "dsn"}}
    secret = next(v for v in pod["volumes"] if v["name"] == "slurm-credentials")["secret"]
    assert secret["secretName"] == "slurm-token"


def test_topology_values_reach_sunkd_settings(helm_home: Path, tmp_path: Path) -> None:
    """config.topology lands in [topology] as sunkd reads it, and topologyVolume is
    mounted at the file's directory; without values there is no [topology] at all."""
    values = {
        "config": {"topology": {
            "file": "/etc/slurm/topology.conf", "kind": "block", "preset": "coreweave",
            "blockLabel": "example.com/nvl", "blockSizes": [4, 8], "minIntervalSeconds": 120,
            "scontrol": "/usr/bin/scontrol"}},
        "topologyVolume": {"persistentVolumeClaim": {"claimName": "slurm-etc"}},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    settings, main, pod = _loaded_settings(template(helm_home, "-f", str(values_file)),
                                           tmp_path)
    topology = settings.topology
    assert (topology.file, topology.kind, topology.preset, topology.block_label,
            topology.block_sizes, topology.min_interval_seconds, topology.scontrol) == (
        Path("/etc/slurm/topology.conf"), "block", "coreweave", "example.com/nvl", (4, 8),
        120.0, "/usr/bin/scontrol")
    [mount] = [m for m in main["volumeMounts"] if m["name"] == "slurm-topology"]
    assert mount["mountPath"] == "/etc/slurm"
    [volume] = [v for v in pod["volumes"] if v["name"] == "slurm-topology"]
    assert volume["persistentVolumeClaim"] == {"claimName": "slurm-etc"}
    docs = template(helm_home)
    text = one(docs, "ConfigMap", f"{RELEASE}-config")["data"]["sunkd.toml"]
    assert "[topology]" not in text
    settings, main, _ = _loaded_settings(docs, tmp_path)
    assert settings.topology.file is None
    assert not any(m["name"] == "slurm-topology" for m in main["volumeMounts"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shipped_values_load_in_sunkd(chart: dict[str, list[Obj]], variant: str,
                                      tmp_path: Path) -> None:
    settings, main, _ = _loaded_settings(chart[variant], tmp_path)
    assert settings.kubernetes.enabled and settings.kubernetes.lease
    if variant == "dev":
        assert settings.database_url == "sqlite+aiosqlite:////var/lib/sunkd/sunkd.db"
        assert "SUNKD_DATABASE_URL" not in _pod_env(main)
    else:
        assert settings.database_url.startswith("postgresql+asyncpg://")
    key_file = settings.slurm.jwt_key_file
    assert key_file is not None
    assert any(key_file.is_relative_to(m["mountPath"]) for m in main["volumeMounts"]
               if m["name"] == "slurm-credentials")


SLURMD_VALUES: Obj = {
    "rbac": {"slurmdPods": True},
    "slurmdDefaults": {"image": {"repository": "registry.example/slurmd", "tag": "24.11.5"},
                       "confServer": "slurmctld.slurm:6817",
                       "resources": {"requests": {"cpu": "500m"}},
                       "volumes": [{"name": "munge", "hostPath": {"path": "/run/munge"}}],
                       "volumeMounts": [{"name": "munge", "mountPath": "/run/munge"}]},
    "nodesets": [
        {"name": "cpu", "spec": {"slurm": {"partitions": ["cpu"]}}},
        {"name": "gpu",
         "spec": {"nodeSelector": {"sunkd.io/pool": "gpu"}, "slurm": {"partitions": ["gpu"]}},
         "slurmd": {"registration": "Dynamic", "conf": "Gres=gpu:8",
                    "resources": {"limits": {"memory": "4Gi"}},
                    "updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%"}},
                    "maxConcurrentStartup": 4,
                    "template": {"metadata": {"labels": {"team": "hpc"}},
                                 "spec": {"containers": [{"name": "munged",
                                                          "image": "munge:1"}]}}}},
        {"name": "static",
         "spec": {"slurm": {"partitions": ["debug"]}},
         "slurmd": {"image": "registry.example/slurmd:22.05.8", "confServer": None,
                    "env": [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}]}},
    ],
}


def _slurmd_values(tmp: Path, values: Obj) -> Path:
    path = tmp / "slurmd-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_nodesets_slurmd_values_render_spec_slurmd(helm_home: Path, tmp_path: Path) -> None:
    """A `nodesets` entry's typed `slurmd` values, over `slurmdDefaults`, become its
    spec.slurmd (an image from repository and tag, maps merged, the entry's values win, a
    null drops a default); an entry without `slurmd` runs no pods; and sunkd's own check
    (the parse the daemon runs on every Nodeset it reads) accepts each."""
    from sunkd.kubernetes.normalize import parse_nodeset

    docs = template(helm_home, "-f", str(_slurmd_values(tmp_path, SLURMD_VALUES)))
    nodesets = {d["metadata"]["name"]: d for d in find(docs, "Nodeset")}
    assert "slurmd" not in nodesets["cpu"]["spec"]
    gpu = nodesets["gpu"]["spec"]["slurmd"]
    assert gpu == {
        "image": "registry.example/slurmd:24.11.5", "confServer": "slurmctld.slurm:6817",
        "registration": "Dynamic", "conf": "Gres=gpu:8",
        "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "4Gi"}},
        "volumes": [{"name": "munge", "hostPath": {"path": "/run/munge"}}],
        "volumeMounts": [{"name": "munge", "mountPath": "/run/munge"}],
        "updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%"}},
        "maxConcurrentStartup": 4,
        "template": {"metadata": {"labels": {"team": "hpc"}},
                     "spec": {"containers": [{"name": "munged", "image": "munge:1"}]}}}
    static = nodesets["static"]["spec"]["slurmd"]
    assert static["image"] == "registry.example/slurmd:22.05.8"
    assert "confServer" not in static  # the entry's null drops the default
    assert static["env"] == [{"name": "SLURM_CONF", "value": "/etc/slurm/slurm.conf"}]
    for name, obj in nodesets.items():
        observed = parse_nodeset({**obj, "metadata": {**obj["metadata"], "uid": "u"}})
        assert (observed.slurmd is None) == (name == "cpu"), name
    parsed = parse_nodeset({**nodesets["gpu"], "metadata": {"name": "gpu", "uid": "u",
                                                            "namespace": NAMESPACE}})
    assert parsed.slurmd is not None and parsed.slurmd.registration == "Dynamic"
    assert parsed.slurmd.template is not None and parsed.slurmd.max_concurrent_startup == 4
    # A digest pins the image.
    digest = "sha256:" + "a" * 64
    pinned = copy.deepcopy(SLURMD_VALUES)
    pinned["slurmdDefaults"]["image"] = {"repository": "r/slurmd", "digest": digest}
    docs = template(helm_home, "-f", str(_slurmd_values(tmp_path, pinned)))
    assert one(docs, "Nodeset", "gpu")["spec"]["slurmd"]["image"] == f"r/slurmd@{digest}"


def test_config_change_rolls_the_pods(helm_home: Path) -> None:
    def checksum(*args: str) -> str:
        deployment = one(template(helm_home, *args), "Deployment", RELEASE)
        value: str = deployment["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]
        return value

    assert checksum() == checksum("--set", "replicaCount=3")
    assert checksum() != checksum("--set", "config.logLevel=debug")


def test_image_digest_pins(helm_home: Path) -> None:
    digest = "sha256:" + "ab" * 32
    docs = template(helm_home, "--set", f"image.digest={digest}", "--set", "image.tag=0.1.0")
    pod = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == \
        {f"ghcr.io/sunkd/sunkd:0.1.0@{digest}"}


# Schema paths of the numeric settings -> sunkd's key in sunkd.runtime.config._BOUNDS.
SCHEMA_BOUNDS = {
    ("config", "leaseSeconds"): "lease_seconds",
    ("config", "maxClockSkewSeconds"): "max_clock_skew_seconds",
    ("config", "snapshotEvery"): "snapshot_every",
    ("config", "snapshotsKept"): "snapshots_kept",
    ("config", "slurm", "pollInterval"): "slurm.poll_interval",
    ("config", "slurm", "requestTimeout"): "slurm.request_timeout",
    ("config", "kubernetes", "requestTimeout"): "kubernetes.request_timeout",
    ("config", "topology", "minIntervalSeconds"): "topology.min_interval_seconds",
    **{("config", "pools", "*", key): f"pools.{key}" for key in (
        "min_slurm", "min_kubernetes", "max_kubernetes", "max_in_flight", "dwell_seconds",
        "drain_timeout_seconds", "reclaim_grace_seconds", "forecast_horizon_seconds",
        "headroom_quantile", "forecast_block_hours")},
}


def test_schema_bounds_are_sunkds() -> None:
    """values.schema.json refuses exactly the numbers sunkd's own loader refuses, so a bad
    number fails `helm install` instead of crash-looping the pods."""
    from sunkd.runtime.config import _BOUNDS

    schema = json.loads((CHART / "values.schema.json").read_text())
    for path, key in SCHEMA_BOUNDS.items():
        node = schema
        for part in path:
            node = node["items"] if part == "*" else node["properties"][part]
        low, high, low_open = _BOUNDS[key]
        assert node.get("exclusiveMinimum" if low_open else "minimum") == low, key
        assert node.get("maximum") == high, key
    exposed = {key for key in _BOUNDS if key.startswith(("pools.", "slurm.", "kubernetes.",
                                                         "topology.")) or "." not in key}
    # Not in the chart: the response cap (an internal guard), and the Slurm hooks, whose
    # token Secret the chart does not mount yet (docs/slurm.md, "Hooks": a systemd or
    # config-file setting for now).
    assert exposed - set(SCHEMA_BOUNDS.values()) == {"slurm.max_response_bytes",
                                                     "slurm.hook_rate"}, \
        "a sunkd setting with bounds the chart does not expose: add it to config and here"


# ------------------------------------------------------------------------ bad values


BAD_VALUES: list[tuple[str, str, str]] = [
    # (values YAML, what the message must say, why it is wrong)
    ("replicaCount: two", "at '/replicaCount': got string, want integer", "type"),
    ("replicaCount: 0", "at '/replicaCount': minimum: got 0, want 1", "range"),
    ("replicas: 3", "additional properties 'replicas' not allowed", "typo at the top"),
    ("image: {tag: 0.1}", "at '/image/tag': got number, want string", "unquoted tag"),
    ("image: {digest: abc}", "at '/image/digest'", "not a digest"),
    ("config: {logLevel: loud}", "at '/config/logLevel': value must be one of", "enum"),
    ("config: {leaseSeconds: 1}", "at '/config/leaseSeconds': minimum: got 1, want 3",
     "sunkd refuses it at start"),
    ("config: {slurm: {url: 'ftp://slurm'}}", "at '/config/slurm/url'", "scheme"),
    ("config: {slurm: {requestTimeout: 5}}",
     "at '/config/slurm/requestTimeout': exclusiveMinimum: got 5, want 10", "sunkd's bound"),
    ("config: {pools: [{nmae: gpu}]}", "at '/config/pools/0': missing property 'name'",
     "pool without a name"),
    ("slurm: {credentials: {auth: password}}", "at '/slurm/credentials/auth'", "enum"),
    ("database: {existingSecret: Bad_Name}", "at '/database/existingSecret'",
     "not a Secret name"),
    ("topologySpread: {whenUnsatisfiable: Sometimes}", "at '/topologySpread/whenUnsatisfiable'",
     "enum"),
    ("database: {sqlite: {enabled: true}}",
     "database.sqlite.enabled needs replicaCount 1, not 2", "two pods on one SQLite file"),
    ("serviceAccount: {create: false}",
     "serviceAccount.name is required when serviceAccount.create is false", "no account"),
    ("nodesets: [{name: gpu, spec: {slurm: {partitions: [gpu]}}, "
     "slurmd: {image: i, registration: Elastic}}]",
     "at '/nodesets/0/slurmd/registration'", "slurmd registration enum"),
    ("nodesets: [{name: gpu, spec: {slurm: {partitions: [gpu]}}, slurmd: {imag: i}}]",
     "additional properties 'imag' not allowed", "slurmd typo"),
    ("nodesets: [{name: gpu, spec: {slurm: {partitions: [gpu]}}, slurmd: {confServer: c}}]",
     "nodesets[gpu].slurmd.image: missing (here or in slurmdDefaults)", "slurmd no image"),
    ("nodesets: [{name: gpu, spec: {slurm: {partitions: [gpu]}}, "
     "slurmd: {image: {repository: r}}}]",
     "nodesets[gpu].slurmd.image: needs a tag or a digest", "slurmd image without tag"),
    ("nodesets: [{name: gpu, spec: {slurm: {partitions: [gpu]}, slurmd: {image: i}}, "
     "slurmd: {image: i}}]", "nodesets[gpu]: give slurmd or spec.slurmd, not both",
     "slurmd twice"),
    ("nodesets: [{name: gpu.a, spec: {slurm: {partitions: [gpu]}}, slurmd: {image: i}}]",
     "needs a name that is a DNS label", "slurmd nodeset name"),
    ("slurmdDefaults: {terminationGracePeriodSeconds: -1}",
     "at '/slurmdDefaults/terminationGracePeriodSeconds'", "slurmd grace"),
    ("slurmdDefaults: {template: {metadata: {name: x}}}",
     "additional properties 'name' not allowed", "slurmd template metadata"),
    ("slurmdDefaults: {updateStrategy: {rollingUpdate: {maxUnavailable: 0}}}",
     "at '/slurmdDefaults/updateStrategy/rollingUpdate/maxUnavailable'", "slurmd update"),
]


@pytest.mark.parametrize(("values", "message", "why"), BAD_VALUES,
                         ids=[why for _, _, why in BAD_VALUES])
def test_bad_values_fail_with_a_clear_message(helm_home: Path, tmp_path: Path, values: str,
                                              message: str, why: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(values + "\n")
    result = run_helm(helm_home, "template", RELEASE, str(CHART), "-n", NAMESPACE, "-f",
                      str(path), check=False)
    assert result.returncode != 0, f"{values!r} ({why}) was accepted"
    assert message in result.stderr, result.stderr


# ------------------------------------------------------------- the real control plane


def _example_pool() -> Obj:
    docs = docs_of((MANIFESTS / "examples" / "nodeset.yaml").read_text())
    nodeset = one(docs, "Nodeset")
    return {"name": nodeset["metadata"]["name"], "spec": nodeset["spec"]}


# Stand-ins for the Prometheus Operator's CRDs (no package ships them): enough for the API
# server to store ServiceMonitor and PrometheusRule objects, so the upgrade can turn the
# monitoring on as values-production.yaml does.
MONITORING_CRDS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.monitoring.coreos.com"},
     "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
              "names": {"kind": kind, "plural": plural, "singular": plural[:-1],
                        "listKind": f"{kind}List"},
              "versions": [{"name": "v1", "served": True, "storage": True,
                            "schema": {"openAPIV3Schema": {
                                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for kind, plural in (("ServiceMonitor", "servicemonitors"),
                         ("PrometheusRule", "prometheusrules"))
]


@dataclass
class Installed:
    plane: KubeControlPlane
    home: Path
    values: Path
    notes: str = ""
    install_seconds: float = 0.0

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_helm(self.home, *args, kubeconfig=self.plane.kubeconfig, check=check,
                        timeout=180)

    def get(self, *args: str) -> Obj:
        result: Obj = json.loads(self.plane.kubectl(*args, "-o", "json").stdout)
        return result

    def exists(self, *args: str) -> bool:
        return self.plane.kubectl("get", *args, check=False).returncode == 0

    def can(self, *args: str) -> bool:
        result = self.plane.kubectl("auth", "can-i", *args, f"--as={SERVICE_ACCOUNT}",
                                    check=False)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), f"auth can-i {args}: {result.stderr}{result.stdout}"
        return answer == "yes"


def _until(check: Callable[[], Any], what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A real control plane (no kube-scheduler, no kubelet) with the chart installed as
    release "sunkd" in namespace "sunkd", labelled Pod Security restricted as docs/deploy.md
    says, with the default values plus the example pool."""
    helm_bin()
    ok, why = available()
    require(ok, why)
    home = tmp_path_factory.mktemp("helm-real")
    values = home / "install-values.yaml"
    values.write_text(yaml.safe_dump({"nodesets": [_example_pool(), SLURMD_VALUES["nodesets"][1]],
                                      "slurmdDefaults": SLURMD_VALUES["slurmdDefaults"]}))
    plane = KubeControlPlane(scheduler=False).start()
    try:
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("label", "namespace", NAMESPACE,
                      "pod-security.kubernetes.io/enforce=restricted",
                      "pod-security.kubernetes.io/enforce-version=latest")
        release = Installed(plane, home, values)
        started = time.monotonic()
        result = release.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                              "-f", str(values), "--timeout", "120s")
        release.install_seconds = time.monotonic() - started
        release.notes = result.stdout
        yield release
        release.helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)
    finally:
        plane.stop()


@pytest.mark.slow
def test_install_creates_the_objects_and_the_crd(installed: Installed) -> None:
    status = json.loads(installed.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    notes = installed.notes
    assert "sunkd --config /etc/sunkd/sunkd.toml doctor" in notes and "/readyz" in notes
    assert installed.install_seconds < 60

    crd = installed.get("get", "crd", "nodesets.sunkd.io")
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == \
        "True"
    # The Nodeset from the same install (its CRD came from crds/ first), with the CRD's
    # defaults applied by the API server.
    nodeset = installed.get("-n", NAMESPACE, "get", "nodeset", "gpu-a")
    assert nodeset["spec"]["ownership"]["dwellSeconds"] == 300
    assert nodeset["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # The typed slurmd values became a spec.slurmd the API server took (the CRD's schema,
    # its defaults applied, the pod template kept whole), and sunkd's own check accepts it.
    from sunkd.kubernetes.normalize import parse_nodeset

    gpu = installed.get("-n", NAMESPACE, "get", "nodeset", "gpu")
    slurmd = gpu["spec"]["slurmd"]
    assert slurmd["image"] == "registry.example/slurmd:24.11.5"
    assert slurmd["imagePullPolicy"] == "IfNotPresent" and slurmd["privileged"] is True
    assert slurmd["template"] == SLURMD_VALUES["nodesets"][1]["slurmd"]["template"]
    observed = parse_nodeset(gpu)
    assert observed.slurmd is not None and observed.slurmd.template is not None
    assert "WARNING: Nodeset gpu runs slurmd pods, but rbac.slurmdPods is false" in notes

    ns = ("-n", NAMESPACE)
    for kind, name in (("serviceaccount", RELEASE), ("deployment", RELEASE),
                       ("service", RELEASE), ("configmap", f"{RELEASE}-config"),
                       ("configmap", f"{RELEASE}-scheduler-config"),
                       ("configmap", f"{RELEASE}-grafana-dashboards"),
                       ("configmap", f"{RELEASE}-grafana-datasources"),
                       ("networkpolicy", RELEASE), ("role", f"{RELEASE}-leader-election"),
                       ("rolebinding", f"{RELEASE}-leader-election")):
        obj = installed.get(*ns, "get", kind, name)
        assert obj["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE, kind
    for kind in ("clusterrole", "clusterrolebinding"):
        assert installed.get("get", kind, RELEASE)["metadata"]["labels"][
            "app.kubernetes.io/instance"] == RELEASE
    assert not installed.exists(*ns, "poddisruptionbudget", RELEASE)

    # What the API server stored is what the chart rendered (defaults aside).
    rendered = template(installed.home, "-f", str(installed.values))
    want = one(rendered, "Deployment", RELEASE)["spec"]["template"]["spec"]
    got = installed.get(*ns, "get", "deployment", RELEASE)["spec"]["template"]["spec"]
    assert got["securityContext"] == want["securityContext"]
    for ours, stored in zip(want["initContainers"] + want["containers"],
                            got["initContainers"] + got["containers"], strict=True):
        assert stored["securityContext"] == ours["securityContext"], ours["name"]
        assert stored["args"] == ours["args"] and stored["image"] == ours["image"]


@pytest.mark.slow
def test_pods_are_admitted_under_pod_security_restricted(installed: Installed) -> None:
    """The namespace enforces `restricted`: the ReplicaSet's pods are created at all only
    if the pod spec passes it. They stay Pending (no scheduler, no kubelet)."""
    def pods() -> list[Obj]:
        items: list[Obj] = installed.get("-n", NAMESPACE, "get", "pods", "-l",
                                         f"{INSTANCE}={RELEASE}")["items"]
        return items if len(items) == 2 else []

    found = _until(pods, "the Deployment's two pods", 60)
    assert {p["status"]["phase"] for p in found} == {"Pending"}
    assert {p["spec"]["serviceAccountName"] for p in found} == {RELEASE}
    events = installed.get("-n", NAMESPACE, "get", "events")["items"]
    refused = [e["message"] for e in events if e["reason"] == "FailedCreate"]
    assert not refused, refused


def _can_i_args(verb: str, group: str, resource: str) -> list[str]:
    base, _, sub = resource.partition("/")
    args = [verb, f"{base}.{group}" if group else base]
    if sub:
        args.append(f"--subresource={sub}")
    if base == "leases":
        args += ["-n", NAMESPACE]
    elif base != "nodes":
        args.append("--all-namespaces")
    return args


@pytest.mark.slow
def test_service_account_may_do_exactly_what_sunkd_needs(installed: Installed) -> None:
    from sunkd.kubernetes.actuator import API_CALLS

    denied = [c for c in API_CALLS
              if not installed.can(*_can_i_args(c.verb, c.group, c.resource))]
    assert not denied, f"the chart's ServiceAccount may not: {denied}"
    # Node Events live in namespace "default".
    assert installed.can("create", "events", "-n", "default")
    must_not = [
        ("get", "secrets", "-n", NAMESPACE), ("list", "secrets", "--all-namespaces"),
        ("list", "configmaps", "-n", NAMESPACE), ("delete", "nodes"), ("update", "nodes"),
        ("create", "nodes"), ("create", "pods", "-n", "default"),
        ("delete", "pods", "--all-namespaces"), ("patch", "pods", "--all-namespaces"),
        ("create", "nodesets.sunkd.io", "-n", NAMESPACE),
        ("delete", "nodesets.sunkd.io", "--all-namespaces"),
        ("patch", "nodesets.sunkd.io", "--all-namespaces"),
        ("update", "nodesets.sunkd.io", "--subresource=status", "--all-namespaces"),
        ("get", "leases.coordination.k8s.io", "-n", "default"),
        ("create", "leases.coordination.k8s.io", "-n", "kube-system"),
        ("delete", "leases.coordination.k8s.io", "-n", NAMESPACE),
        ("create", "pods", "--subresource=exec", "-n", NAMESPACE),
        ("*", "*", "--all-namespaces"),
    ]
    allowed = [args for args in must_not if installed.can(*args)]
    assert not allowed, f"the chart's ServiceAccount may also: {allowed}"

    # And nothing else: what the API server lists for the account in its namespace,
    # less what any ServiceAccount there has without the chart (system:basic-user,
    # system:discovery, ClusterTrustBundle reading, ...), is exactly API_CALLS.
    def rights(user: str) -> set[tuple[str, str, str]]:
        listed = installed.plane.kubectl("auth", "can-i", "--list", "-n", NAMESPACE,
                                         f"--as={user}", "--no-headers").stdout
        found = set()
        for line in listed.splitlines():
            resource, _, rest = line.strip().partition(" ")
            verbs = re.search(r"\[([^\]]*)\]\s*$", rest)
            assert verbs is not None, line
            if not resource or resource.startswith("["):
                continue  # nonResourceURLs (/healthz, /version, /api, ...)
            resource, _, sub = resource.partition("/")
            name, _, group = resource.partition(".")
            name = f"{name}/{sub}" if sub else name
            found |= {(verb, group, name) for verb in verbs.group(1).split()}
        return found

    baseline = rights(f"system:serviceaccount:{NAMESPACE}:no-chart")
    ours = rights(SERVICE_ACCOUNT)
    assert baseline <= ours
    assert ours - baseline == api_calls()


@pytest.mark.slow
def test_bad_values_fail_helm_install_and_leave_nothing(installed: Installed) -> None:
    result = installed.helm("install", "bad", str(CHART), "-n", NAMESPACE, "--set",
                            "replicaCount=two", check=False)
    assert result.returncode != 0
    assert "at '/replicaCount': got string, want integer" in result.stderr
    # Refused before anything was stored: no release record, not even a failed one.
    missing = installed.helm("status", "bad", "-n", NAMESPACE, check=False)
    assert missing.returncode != 0 and "not found" in missing.stderr
    listed = json.loads(installed.helm("list", "-n", NAMESPACE, "-o", "json").stdout)
    assert [r["name"] for r in listed] == [RELEASE]


@pytest.mark.slow
def test_upgrade_with_changed_values_then_uninstall(installed: Installed) -> None:
    ns = ("-n", NAMESPACE)
    before = installed.get(*ns, "get", "deployment", RELEASE)
    installed.plane.kubectl("apply", "-f", "-",
                            input="\n---\n".join(json.dumps(c) for c in MONITORING_CRDS))
    for crd in MONITORING_CRDS:
        installed.plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                                f"crd/{crd['metadata']['name']}")
    installed.helm("upgrade", RELEASE, str(CHART), *ns, "-f", str(installed.values),
                   "-f", str(CHART / "values-production.yaml"),
                   "--set", "config.logLevel=debug", "--timeout", "120s")
    status = json.loads(installed.helm("status", RELEASE, *ns, "-o", "json").stdout)
    assert status["version"] == 2 and status["info"]["status"] == "deployed"

    config = installed.get(*ns, "get", "configmap", f"{RELEASE}-config")
    assert 'log_level = "debug"' in config["data"]["sunkd.toml"]
    after = installed.get(*ns, "get", "deployment", RELEASE)
    template_before = before["spec"]["template"]
    template_after = after["spec"]["template"]
    assert template_after["metadata"]["annotations"]["checksum/config"] != \
        template_before["metadata"]["annotations"]["checksum/config"]
    main = next(c for c in template_after["spec"]["containers"] if c["name"] == "sunkd")
    assert main["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    assert [c["whenUnsatisfiable"] for c in
            template_after["spec"]["topologySpreadConstraints"]] == ["DoNotSchedule"]
    pdb = installed.get(*ns, "get", "poddisruptionbudget", RELEASE)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert installed.exists(*ns, "servicemonitor", RELEASE)
    rules = installed.get(*ns, "get", "prometheusrule", RELEASE)
    assert "SunkdNoLeader" in {r["alert"] for g in rules["spec"]["groups"]
                               for r in g["rules"]}
    # The changed pod template rolled out as a new ReplicaSet.
    _until(lambda: len(installed.get(*ns, "get", "replicasets", "-l",
                                     f"{INSTANCE}={RELEASE}")["items"]) == 2,
           "a second ReplicaSet after the upgrade", 60)

    installed.helm("uninstall", RELEASE, *ns, "--wait", "--timeout", "120s")
    for kind, name in (("deployment", RELEASE), ("serviceaccount", RELEASE),
                       ("service", RELEASE), ("configmap", f"{RELEASE}-config"),
                       ("networkpolicy", RELEASE), ("poddisruptionbudget", RELEASE),
                       ("servicemonitor", RELEASE), ("prometheusrule", RELEASE),
                       ("role", f"{RELEASE}-leader-election"), ("nodeset", "gpu-a"),
                       ("nodeset", "gpu")):
        assert not installed.exists(*ns, kind, name), f"{kind}/{name} left after uninstall"
    for kind in ("clusterrole", "clusterrolebinding"):
        assert not installed.exists(kind, RELEASE), f"{kind}/{RELEASE} left after uninstall"
    # Helm never deletes what crds/ installed (the Nodesets of every release would go
    # with it): the CRD stays, as docs/deploy.md says.
    assert installed.exists("crd", "nodesets.sunkd.io")
    assert json.loads(installed.helm("list", *ns, "-o", "json").stdout) == []
