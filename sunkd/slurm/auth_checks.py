"""Whether slurmctld authenticates the way a Nodeset's slurmd pods will (`spec.slurmd.auth`),
read from `scontrol show config`, with the slurm.conf lines to add. `sunkd doctor` prints
them; sunkd never edits slurm.conf.

A slurmd whose AuthType is not the controller's cannot register (every message is signed
by the AuthType plugin and checked by the receiver's, slurm.conf(5) AuthType); CredType
signs job credentials slurmctld hands slurmd, so it must be one the pod can check too:
`cred/munge` needs munged in the pod, `cred/slurm` the slurm.key. Slurm's rules
(slurm.conf(5), the authentication guide):
- `AuthType=auth/slurm` and `CredType=cred/slurm` exist from Slurm 23.11; they need no
  munged, only the same `slurm.key` on every host (the pod's comes from the Secret);
- with munge, slurmd finds munged at `AuthInfo=socket=PATH`, else munge's compiled-in
  default `/run/munge/munge.socket.2`; sunkd's munged sidecar listens at
  `<mungeSocketDir>/munge.socket.2`, so slurm.conf must name that path or leave AuthInfo's
  socket unset with the default directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sunkd.slurm.prerequisites import Finding

AUTH_SLURM_SINCE = (23, 11)
MUNGE_DEFAULT_SOCKET = "/run/munge/munge.socket.2"
_NULL = "(null)"


def _release(config: Mapping[str, str]) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", config.get("SLURM_VERSION", ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _munge_socket(auth_info: str | None) -> str | None:
    """The `socket=` of AuthInfo (comma-separated options), None when not set."""
    for option in (auth_info or "").split(","):
        key, _, value = option.strip().partition("=")
        if key.strip().lower() == "socket" and value.strip():
            return value.strip()
    return None


def _socket_path(path: str) -> str:
    # /var/run is /run on every current distribution; slurm.conf often still says it.
    return "/run/" + path[len("/var/run/"):] if path.startswith("/var/run/") else path


def auth_findings(auth_type: str, config: Mapping[str, str] | None, *,
                  munge_socket_dir: str | None = None) -> list[Finding]:
    """AuthType and CredType as the Nodeset's `auth.type` needs them, Slurm 23.11+ for
    auth/slurm, and (sunkd's munged sidecar: `munge_socket_dir` given) AuthInfo's socket.
    `config` None: not read, every finding unknown."""
    want_auth, want_cred = f"auth/{auth_type}", f"cred/{auth_type}"
    why_auth = (f"the Nodeset's slurmd pods use {want_auth} (spec.slurmd.auth.type); "
                "slurmd cannot register with another AuthType")
    why_cred = (f"job credentials must be ones the pod can check: {want_cred}"
                + (" (no munged in an auth/slurm pod)" if auth_type == "slurm"
                   else " (its munged)"))
    if config is None:
        unknown = "unknown (slurmctld's configuration was not read)"
        return [Finding("AuthType", None, unknown, why_auth),
                Finding("CredType", None, unknown, why_cred)]
    found_auth = config.get("AuthType") or "unknown"
    found_cred = config.get("CredType") or "unknown"
    findings = [
        Finding("AuthType", None if found_auth == "unknown" else found_auth == want_auth,
                found_auth, why_auth, f"AuthType={want_auth}"),
        Finding("CredType", None if found_cred == "unknown" else found_cred == want_cred,
                found_cred, why_cred, f"CredType={want_cred}"),
    ]
    if auth_type == "slurm":
        release = _release(config)
        version = config.get("SLURM_VERSION") or "unknown"
        findings.append(Finding(
            "Slurm version", None if release is None else release >= AUTH_SLURM_SINCE,
            version, "auth/slurm and cred/slurm exist from Slurm 23.11: upgrade Slurm, or "
            "use spec.slurmd.auth.type munge", None))
    elif munge_socket_dir is not None:
        info = config.get("AuthInfo")
        socket = _munge_socket(None if info == _NULL else info)
        want = f"{munge_socket_dir}/munge.socket.2"
        seen = _socket_path(socket) if socket else MUNGE_DEFAULT_SOCKET
        findings.append(Finding(
            "AuthInfo socket", seen == want, info or "unknown",
            f"sunkd's munged sidecar listens at {want} (spec.slurmd.auth.mungeSocketDir); "
            f"slurmd asks for {seen}",
            None if want == MUNGE_DEFAULT_SOCKET and socket is None
            else f"AuthInfo=socket={want}"))
    return findings
