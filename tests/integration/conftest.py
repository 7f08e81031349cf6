"""Fixtures shared by the Kubernetes API emulator tests: `api` (a running emulator) and
`raw` (a thin HTTP client to it). A module may override `api` (e.g. a short history)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sunkd.testbed.kubeapi import KubeAPIEmulator
from tests.integration.kubeapi_support import Raw, emulator, raw_client


@pytest.fixture
async def api() -> AsyncIterator[KubeAPIEmulator]:
    async for emu in emulator():
        yield emu


@pytest.fixture
async def raw(api: KubeAPIEmulator) -> AsyncIterator[Raw]:
    async for client in raw_client(api):
        yield client
