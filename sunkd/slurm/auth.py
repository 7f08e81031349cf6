"""slurmrestd authentication: HS256 JWTs minted from `jwt_hs256.key` (as `scontrol token`
does), or a fixed token / token file, refreshed before expiry."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

from sunkd.slurm.model import SlurmAuthError

# ------------------------------------------------------------------------------- JWT

TOKEN_ENV = "SUNKD_SLURM_TOKEN"
DEFAULT_TOKEN_LIFESPAN = 900  # seconds; Slinky uses 15 min too


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint_jwt(
    key: bytes, user: str, lifespan: int = DEFAULT_TOKEN_LIFESPAN, *, now: float | None = None
) -> str:
    """An HS256 token slurmctld accepts (`jwt.shtml`: claims iat, exp, sun; the key is
    the raw bytes of `jwt_hs256.key`). Same as `scontrol token`, without a subprocess."""
    issued = int(time.time() if now is None else now)
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"exp": issued + int(lifespan), "iat": issued, "sun": user}
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode("ascii")
    signature = _b64url(hmac.new(key, signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{signature}"


def jwt_expiry(token: str) -> float | None:
    """`exp` of a JWT, without verifying it (for refresh decisions and hints only)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, int | float) else None
    except (IndexError, ValueError, AttributeError):
        return None


class TokenSource:
    """Where the JWT comes from: a fixed token, a token file (re-read when its mtime
    changes, so an external rotator works), or minted from the key file."""

    def __init__(
        self,
        *,
        user: str,
        token: str | None,
        token_file: Path | None,
        jwt_key_file: Path | None,
        lifespan: int,
    ) -> None:
        self.user = user
        self._token = token or os.environ.get(TOKEN_ENV) or None
        self._token_file = token_file
        self._key_file = jwt_key_file
        self._lifespan = lifespan
        self._file_mtime: float | None = None
        self._file_token: str | None = None
        self._minted: str | None = None
        self._minted_at = 0.0
        if self._token:
            self.mode = "jwt-token"
        elif token_file is not None:
            self.mode = "jwt-token-file"
        elif jwt_key_file is not None:
            self.mode = "jwt-key"
        else:
            self.mode = "none"

    def current(self) -> str | None:
        if self._token:
            return self._token
        if self._token_file is not None:
            return self._read_file(self._token_file)
        if self._key_file is not None:
            # Re-mint at half the lifespan: slurmctld checks exp on every RPC, and a
            # clock skew of minutes must not make us send an expired token.
            if self._minted is None or time.time() - self._minted_at > self._lifespan / 2:
                try:
                    key = self._key_file.read_bytes()
                except OSError as error:
                    raise SlurmAuthError(
                        f"cannot read the Slurm JWT key {self._key_file}: {error.strerror}"
                    ) from error
                self._minted = mint_jwt(key, self.user, self._lifespan)
                self._minted_at = time.time()
            return self._minted
        return None

    def invalidate(self) -> None:
        """Forget cached tokens so the next request re-reads or re-mints."""
        self._minted = None
        self._file_mtime = None

    def _read_file(self, path: Path) -> str:
        try:
            mtime = path.stat().st_mtime
            if self._file_token is None or mtime != self._file_mtime:
                text = path.read_text().strip()
                # Accept `scontrol token` output verbatim: "SLURM_JWT=eyJ...".
                if text.startswith("SLURM_JWT="):
                    text = text[len("SLURM_JWT=") :]
                self._file_token = text
                self._file_mtime = mtime
        except OSError as error:
            raise SlurmAuthError(
                f"cannot read the Slurm token file {path}: {error.strerror}"
            ) from error
        return self._file_token

    def hint(self) -> str:
        token = None
        try:
            token = self.current()
        except SlurmAuthError as error:
            return str(error)
        if self.mode == "none":
            return (
                "no JWT configured: set slurm.token, slurm.token_file or slurm.jwt_key_file "
                "(TCP slurmrestd needs rest_auth/jwt), or use a unix: URL with rest_auth/local"
            )
        expiry = jwt_expiry(token) if token else None
        if expiry is not None and expiry < time.time():
            return f"the token ({self.mode}) expired {int(time.time() - expiry)} s ago"
        if self.mode == "jwt-key":
            return (
                f"the token minted from {self._key_file} for user {self.user!r} was rejected: "
                "is it the key in slurm.conf AuthAltParameters=jwt_key=, and is "
                "AuthAltTypes=auth/jwt set?"
            )
        return (
            f"the token ({self.mode}) for user {self.user!r} was rejected: expired, for another "
            "user, or signed with another key (22.05 reports all of these as HTTP 500)"
        )
