"""The topology file sunkd writes for slurmctld, and the `scontrol reconfigure` after it.

Slurm reads `topology.conf` (`topology.yaml` from 25.05) from slurm.conf's directory at
start and again on `scontrol reconfigure`; no REST call does either. What to write and
when is decided in `sunkd.domain.topology_plan`; this adapter only writes it safely:
- it refuses text with no node line, and a topology.conf holding both SwitchName and
  BlockName lines (one plugin reads the file; the domain never renders either);
- the file is replaced atomically (a temporary file in the same directory, fsync,
  rename), so slurmctld never reads half a file;
- when the reconfigure fails, the previous file is put back (and slurmctld asked once
  more to read it): the last good topology stays what Slurm has.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from sunkd.domain.ports import ActionError, RefusedError
from sunkd.domain.topology import conf_kind
from sunkd.slurm.scontrol import SCONTROL_TIMEOUT, run_scontrol

log = structlog.get_logger(__name__)

__all__ = ["TopologyFile"]


def _check(text: str, yaml: bool) -> None:
    if yaml:
        if "nodes:" not in text:
            raise RefusedError("topology.yaml without any node: not written (an empty "
                               "topology can stop slurmctld)")
        return
    kind = conf_kind(text)
    if kind == "mixed":
        raise RefusedError("topology.conf with both SwitchName and BlockName lines: not "
                           "written (tree and block are two plugins)")
    if "Nodes=" not in text:
        raise RefusedError("topology.conf without any node: not written (an empty topology "
                           "can stop slurmctld)")


class TopologyFile:
    """`apply(text)` writes the file and reconfigures slurmctld; `current()` reads it."""

    def __init__(self, path: Path, *, scontrol: str = "scontrol",
                 scontrol_env: Mapping[str, str] | None = None,
                 write_timeout: float = SCONTROL_TIMEOUT,
                 may_write: Callable[[], bool] | None = None) -> None:
        self.path = path
        self._scontrol = scontrol
        self._env = scontrol_env
        self._timeout = write_timeout
        self._may_write = may_write
        self._yaml = path.suffix == ".yaml"

    def current(self) -> str | None:
        """The file as it is now (None when absent); ActionError when it cannot be read."""
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ActionError(f"cannot read {self.path}: {error}", retryable=True) from error

    async def apply(self, text: str) -> None:
        """Replace the file with `text` and `scontrol reconfigure`. Raises RefusedError
        for text that must not reach Slurm, ActionError when the write or the reconfigure
        failed (the previous file is back in place then)."""
        _check(text, self._yaml)
        if self._may_write is not None and not self._may_write():
            raise ActionError("topology: not (or no longer safely) the leader; not writing",
                              retryable=True)
        previous = self.current()
        self._replace(text)
        try:
            await self._reconfigure()
        except ActionError as error:
            self._restore(previous)
            try:
                await self._reconfigure()
            except ActionError as again:
                log.warning("slurm.topology_restore_reconfigure_failed", path=str(self.path),
                            error=str(again))
            raise ActionError(f"{error}; the previous {self.path.name} is back in place",
                              retryable=error.retryable) from error
        log.info("slurm.topology_applied", path=str(self.path), bytes=len(text))

    def _replace(self, text: str) -> None:
        directory = self.path.parent
        try:
            fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        except OSError as error:
            raise ActionError(f"cannot write in {directory}: {error}", retryable=False) from error
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o644)  # slurmctld runs as SlurmUser, not necessarily us
            os.replace(temporary, self.path)
        except OSError as error:
            Path(temporary).unlink(missing_ok=True)
            raise ActionError(f"cannot write {self.path}: {error}", retryable=False) from error

    def _restore(self, previous: str | None) -> None:
        try:
            if previous is None:
                self.path.unlink(missing_ok=True)
            else:
                self._replace(previous)
        except (OSError, ActionError) as error:
            log.error("slurm.topology_restore_failed", path=str(self.path), error=str(error))

    async def _reconfigure(self) -> None:
        await run_scontrol(self._scontrol, ["reconfigure"], what="scontrol reconfigure",
                           env=self._env, limit=self._timeout,
                           missing=" (no REST call reconfigures: install slurm-client)")
