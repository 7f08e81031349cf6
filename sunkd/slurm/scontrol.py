"""Running `scontrol` for the writes slurmrestd cannot do: one command, bounded in time.

22.05's REST API cannot update nodes and no version can reconfigure, so the actuator's
drain/undrain on 22.05 and the topology file's `scontrol reconfigure` go through the CLI.
This module finds the binary, runs it without a shell, kills it at the timeout, and turns
its failures into `ActionError`s that say whether a retry can help.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence

from sunkd.domain.ports import ActionError

__all__ = ["SCONTROL_TIMEOUT", "run_scontrol"]

# scontrol blocks ~9 s when slurmctld is down before failing (docs/slurm.md, "Measured behaviour").
SCONTROL_TIMEOUT = 30.0


def _binary(scontrol: str) -> str | None:
    return shutil.which(scontrol) or (scontrol if os.access(scontrol, os.X_OK) else None)


async def run_scontrol(scontrol: str, args: Sequence[str], *, what: str,
                       env: Mapping[str, str] | None = None,
                       limit: float = SCONTROL_TIMEOUT, missing: str = "") -> str:
    """`scontrol ARGS...`; its stdout. `what` names the command in errors; `missing` is
    added when the binary is not installed (what the caller could use instead)."""
    binary = _binary(scontrol)
    if binary is None:
        raise ActionError(f"cannot {what}: {scontrol!r} is not installed{missing}",
                          retryable=False)
    try:
        process = await asyncio.create_subprocess_exec(
            binary, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(env) if env is not None else None)
    except OSError as error:
        raise ActionError(f"cannot run {binary}: {error}", retryable=False) from error
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), limit)
    except TimeoutError as error:
        process.kill()
        await process.wait()
        raise ActionError(f"{what} timed out after {limit:g} s", retryable=True) from error
    if process.returncode == 0:
        return stdout.decode(errors="replace")
    message = (stderr or stdout).decode(errors="replace").strip()
    retryable, hint = _classify(message)
    raise ActionError(f"{what}: rc={process.returncode}: {message}{hint}", retryable=retryable)


def _classify(message: str) -> tuple[bool, str]:
    lowered = message.lower()
    if "unable to contact slurm controller" in lowered or "connection" in lowered:
        return True, ""
    if "munge" in lowered or "auth" in lowered:
        return False, " (scontrol needs munge with the cluster's key, and SLURM_CONF)"
    if "invalid user id" in lowered or "access/permission denied" in lowered:
        return False, " (this needs SlurmUser, root or AdminLevel=Operator)"
    if "could not establish a configuration source" in lowered:
        return False, " (set SLURM_CONF for scontrol)"
    return False, ""
