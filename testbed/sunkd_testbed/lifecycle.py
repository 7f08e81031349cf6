"""What every test-bed service shares: used as a context manager (plain or async), it
starts on entry and always stops on exit; `start()` and `stop()` are the service's own."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self


class Service:
    """Base of the test bed's services (a Slurm cluster, a control plane, kubelet Nodes):
    `with service:` / `async with service:` run `start()` and, whatever happens, `stop()`
    (in a thread for `async with`: both block)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)
