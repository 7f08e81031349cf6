"""What the runtime's objects need of the things they drive, as types.

The concrete adapters (`slurm/`, `kubernetes/`, `store/`) are imported lazily and
built per leadership term; the objects in `runtime/` name what they use of them here,
so a reader sees each port's surface in one place and mypy checks every call through it.
The Slurm and Kubernetes *clients* are the concrete `SlurmRestClient` and `KubeClient`:
the sources and actuators that take them are typed on those classes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from sunkd.store.eventlog import Lease


class LeaseStore(Protocol):
    """The database lease: the event log's leadership row."""

    async def acquire(self, identity: str, lease_seconds: float = ...) -> Lease | None: ...
    async def renew(self, lease: Lease) -> Lease: ...
    async def release(self, lease: Lease) -> None: ...


class KubeElector(Protocol):
    """The coordination.k8s.io Lease held beside the database lease (`kubernetes.lease`)."""

    def holds_lease(self) -> bool: ...
    async def acquire(self, stop_event: asyncio.Event | None = None) -> bool: ...
    async def renew_until_lost(self, stop_event: asyncio.Event | None = None) -> bool: ...
    async def release(self) -> bool: ...


class Source(Protocol):
    """A source of observations: runs until `stop`, appending through its sink."""

    async def run(self, stop: asyncio.Event, /) -> None: ...


class NodesetStatusWriter(Protocol):
    """Writes a Nodeset's status subresource (the Kubernetes actuator does)."""

    async def update_nodeset_status(self, namespace: str, name: str,
                                    status: Mapping[str, object]) -> bool: ...


class Fatal(Protocol):
    """Stop the process, loudly, with why (and the log position when one is known)."""

    def __call__(self, why: str, *, seq: int | None = None, hint: str = ...) -> int: ...
