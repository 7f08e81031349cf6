"""Kubernetes API emulator: a protocol-faithful stand-in for kube-apiserver in tests.

No kube-apiserver (nor k3s, kwok or envtest) can run where sunkd is built and tested, so
sunkd's Kubernetes side and the real `kubectl` are exercised against this aiohttp
emulator. See `docs/kubernetes.md` ("API emulator") for what it implements and what it
does not. It is an emulator, not a Kubernetes API server.
"""

from __future__ import annotations

from .cli import main, run_cli, sync_main
from .errors import KubeAPIError
from .server import KubeAPIEmulator, RecordedRequest, load_manifests, running_emulator
from .store import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH

__all__ = [
    "APPLY_PATCH",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "KubeAPIEmulator",
    "KubeAPIError",
    "RecordedRequest",
    "load_manifests",
    "main",
    "run_cli",
    "running_emulator",
    "sync_main",
]
