"""The package layout of docs/architecture.md, checked: who may import whom, and where the
well-known names are spelled. Reads the source with `ast` (static imports, including
imports inside functions), so a lazy import cannot slip past."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sunkd"

# Top-level subpackages of sunkd and what each may import from sunkd (besides itself).
ALLOWED: dict[str, set[str]] = {
    "domain": set(),
    "store": {"domain"},
    "slurm": {"domain"},
    "kubernetes": {"domain"},
    "api": {"domain", "store", "runtime"},
    "runtime": {"domain", "store", "slurm", "kubernetes", "api"},
    "cli": {"domain", "store", "slurm", "kubernetes", "api", "runtime", "simulate"},
    "simulate": {"domain"},
}
# Third-party modules the pure domain may not import (it does no I/O, keeps no clock).
IO_MODULES = {"aiohttp", "asyncio", "asyncpg", "aiosqlite", "sqlalchemy", "kubernetes_asyncio",
              "structlog", "prometheus_client", "socket", "subprocess", "time", "random",
              "os", "orjson", "uuid", "secrets"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    # `__import__("sunkd.x", ...)` and `_optional("sunkd.x", ...)` name modules in strings.
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"sunkd(\.\w+)+|sunkd_testbed(\.\w+)*", node.value):
                found.append(node.value)
    return found


def _package_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def test_every_subpackage_is_in_the_table() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ALLOWED), "docs/architecture.md and this table list the packages"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    package = _package_of(path)
    if package is None:  # sunkd/__init__.py, __main__.py
        return
    for module in _imports(path):
        if not module.startswith("sunkd."):
            continue
        target = module.split(".")[1]
        if target == package or target not in ALLOWED:
            continue
        assert target in ALLOWED[package], f"{path.name} in {package}/ imports {module}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_test_bed_commands_import_the_test_bed(path: Path) -> None:
    """The test bed is a separate distribution (testbed/, `sunkd[testbed]`) that the
    production wheel and image do not hold: only `sunkd demo` and `sunkd sim`, in cli/main,
    reach for it, and they say how to install it when it is missing."""
    allowed = path == PACKAGE / "cli" / "main.py"
    for module in _imports(path):
        if module.split(".")[0] == "sunkd_testbed":
            assert allowed, f"{path.relative_to(PACKAGE)} imports {module}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "domain").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_domain_does_no_io(path: Path) -> None:
    for module in _imports(path):
        root = module.split(".")[0]
        assert root not in IO_MODULES, f"domain/{path.name} imports {module}"
        if root not in {"sunkd", "__future__"}:
            assert root in sys.stdlib_module_names, f"domain/{path.name} imports {module}"


def test_well_known_names_are_spelled_once() -> None:
    """`grep -rn '"sunkd.io/' sunkd | grep -v wellknown` finds nothing."""
    offenders = []
    for path in _modules():
        if path.name == "wellknown.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""["']sunkd\.io/""", line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


# The store owns the database: outside it, the event log is its methods (and the
# read-model and retention functions that take it), never SQLAlchemy or its engine. The
# testbed (test tooling, leaving the package) is not held to it.
_BEYOND_THE_STORE = sorted(p for p in _modules()
                           if _package_of(p) not in ("store", "testbed"))


@pytest.mark.parametrize("path", _BEYOND_THE_STORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_database_driver_stays_in_the_store(path: Path) -> None:
    for module in _imports(path):
        assert module.split(".")[0] != "sqlalchemy", \
            f"{path.relative_to(PACKAGE)} imports {module}"
    # `x.engine` of anything but `self`: the log's SQLAlchemy engine (`self.engine` is an
    # object's own field, e.g. the runtime's).
    tree = ast.parse(path.read_text(), filename=str(path))
    used = [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "engine"
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert used == [], f"{path.relative_to(PACKAGE)} reaches for a database engine at " \
                       f"line(s) {used}: give the store a method instead"
