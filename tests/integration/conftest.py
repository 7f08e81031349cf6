"""Fixtures shared by the Kubernetes API emulator tests: `api` (a running emulator) and
`raw` (a thin HTTP client to it). A module may override `api` (e.g. a short history).

Kubernetes backends: `kube` runs a test against the API emulator and against the real
control plane (`kube_backend`, module-scoped; `real_plane`); see kube_backends.py.

Slurm: `slurm_version`, a module-scoped parameter over the Slurm generations the
contract tests run against (22.05 from the host's packages, 24.11 and 26.05 from the
Debian roots of scripts/prepare-slurm-root.sh; docs/development.md). A module that
requests it (through its `cluster` fixture) runs once per version, one cluster each;
`SUNKD_TEST_SLURM_VERSIONS=22.05,24.11` narrows the list."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sunkd_testbed.kubeapi import KubeAPIEmulator
from tests.integration.kube_backends import (  # noqa: F401  (fixtures, used by name)
    kube,
    kube_backend,
    parametrize_backends,
    real_plane,
    register_marker,
)
from tests.integration.kubeapi_support import Raw, emulator, raw_client
from tests.integration.slurm_helpers import slurm_test_versions


def pytest_configure(config: pytest.Config) -> None:
    register_marker(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`kube` (tests/integration/kube_backends.py): once per Kubernetes backend, the API
    emulator and the real control plane; `@pytest.mark.emulator_only` narrows to the first."""
    parametrize_backends(metafunc)


@pytest.fixture
async def api() -> AsyncIterator[KubeAPIEmulator]:
    async for emu in emulator():
        yield emu


@pytest.fixture
async def raw(api: KubeAPIEmulator) -> AsyncIterator[Raw]:
    async for client in raw_client(api):
        yield client


@pytest.fixture(
    scope="module",
    params=[pytest.param(v, id=f"slurm-{v}") for v in slurm_test_versions()],
)
def slurm_version(request: pytest.FixtureRequest) -> str:
    """The Slurm generation this module's cluster runs (one module pass per version)."""
    version: str = request.param
    return version
