"""Where the Kubernetes API server is and how sunkd proves who it is: kubeconfig files and
the pod's service account, read the way client-go reads them.

Why sunkd's own and not kubernetes-asyncio's loader: importing that loader imports the
whole generated client (about 1,000 modules; ~40 MB of every daemon's resident memory,
measured with `/proc/self/statm` around the daemon's imports), and sunkd used nothing else
of it: its requests are its own (client.py). What a non-interactive daemon needs is small,
and it is all here:

- files: `$KUBECONFIG` may list several; maps (clusters, users, contexts) merge by name
  and the first file that sets a name or `current-context` wins; relative paths resolve
  against the file that names them (client-go `clientcmd` loading rules);
- clusters: `server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`,
  `tls-server-name`, `proxy-url`;
- users: `token`, `tokenFile` (re-read each minute and winning over `token`, as client-go's
  `BearerTokenFile`), `client-certificate(-data)`/`client-key(-data)`, `username`/
  `password`, impersonation (`as`, `as-uid`, `as-groups`), and `exec` credential plugins
  (`client.authentication.k8s.io/v1` and `v1beta1`, token credentials; the credential is
  kept until its `expirationTimestamp` or a 401);
- in a pod: `KUBERNETES_SERVICE_HOST`/`_PORT`, the projected token (re-read each minute:
  bound tokens rotate) and the CA bundle.

Refused with a message saying why: `auth-provider` (the in-tree gcp/azure/oidc providers
were removed from kubectl and client-go in 1.26; their replacements are exec plugins), and
exec plugins that must be interactive or answer with a client certificate.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml

# How often a token file is read again (client-go's cachingTokenSource for
# BearerTokenFile and in-cluster config: one minute).
TOKEN_FILE_TTL_SECONDS = 60.0
# How long an exec plugin may take (client-go has no default bound; a daemon needs one).
EXEC_TIMEOUT_SECONDS = 60.0
# An exec credential is refreshed this long before it says it expires.
EXEC_EXPIRY_MARGIN_SECONDS = 10.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeConfigError(Exception):
    """The kubeconfig (or the pod's service account) cannot give a working client. It
    will not fix itself: the message says what to change."""


class CredentialUnavailable(KubeConfigError, ConnectionError):
    """A request's credential could not be had just now: the exec plugin failed or timed
    out, the token file cannot be read. A `ConnectionError` (an `OSError`), so every
    caller retries it with backoff as it does a refused connection."""


class KubeConfigNotFound(KubeConfigError):
    """No kubeconfig where sunkd looked, and not running in a pod. The message says
    where it looked."""


def find_kubeconfig(configured: str | None, env: Mapping[str, str] | None = None) -> str:
    """The kubeconfig to load: the configured file, else `$KUBECONFIG` (a list of files
    separated by `:`), else `~/.kube/config`; client-go's default loading rules. Raises
    `KubeConfigNotFound` naming every place looked at when none of them exists."""
    env = os.environ if env is None else env
    if configured:
        if not os.path.isfile(os.path.expanduser(configured)):
            raise KubeConfigNotFound(
                f"the kubeconfig {configured} (kubernetes.kubeconfig) does not exist")
        return configured
    looked: list[str] = ["kubernetes.kubeconfig is not set"]
    listed = env.get("KUBECONFIG", "")
    if listed:
        paths = [p for p in listed.split(os.pathsep) if p]
        if any(os.path.isfile(os.path.expanduser(p)) for p in paths):
            return listed
        looked.append(f"$KUBECONFIG={listed} names no existing file")
    else:
        looked.append("$KUBECONFIG is unset")
    home = env.get("HOME")
    default = os.path.join(home, ".kube", "config") if home else \
        os.path.expanduser("~/.kube/config")
    if not listed:
        if os.path.isfile(default):
            return default
        looked.append(f"{default} does not exist")
    if not env.get("KUBERNETES_SERVICE_HOST"):
        looked.append("not in a pod (KUBERNETES_SERVICE_HOST is unset)")
    raise KubeConfigNotFound(
        "no kubeconfig found: " + "; ".join(looked) + ". Set kubernetes.kubeconfig "
        "(SUNKD_KUBERNETES_KUBECONFIG) or $KUBECONFIG, or kubernetes.enabled = false")


# ----------------------------------------------------------------------------- credentials


@dataclass
class _TokenFile:
    path: str
    fallback: str | None = None
    _value: str | None = None
    _read_at: float = -1e18

    def token(self) -> str | None:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_FILE_TTL_SECONDS:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self._value = handle.read().strip() or None
            except OSError as error:
                if self._value is None and self.fallback is None:
                    raise CredentialUnavailable(f"cannot read the token file {self.path}: "
                                                f"{error.strerror or error}") from error
                # Keep the last good token: a rotation in progress is not a reason to stop.
            self._read_at = now
        return self._value or self.fallback

    def expire(self) -> None:
        self._read_at = -1e18


@dataclass
class _ExecPlugin:
    """A client-go credential plugin: run it, keep its token until it expires."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    api_version: str
    install_hint: str
    base_dir: str
    _token: str | None = None
    _expires_at: float | None = None  # wall clock (expirationTimestamp), None: until a 401
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def token(self) -> str:
        async with self._lock:
            if self._token is not None and (
                    self._expires_at is None
                    or time.time() < self._expires_at - EXEC_EXPIRY_MARGIN_SECONDS):
                return self._token
            self._token, self._expires_at = await self._run()
            return self._token

    def expire(self) -> None:
        self._token = None

    async def _run(self) -> tuple[str, float | None]:
        command = self.command
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(self.base_dir, command)  # client-go: relative to the file
        info = {"apiVersion": self.api_version, "kind": "ExecCredential",
                "spec": {"interactive": False}}
        env = {**os.environ, **dict(self.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            process = await asyncio.create_subprocess_exec(
                command, *self.args, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as error:
            hint = f" ({self.install_hint})" if self.install_hint else ""
            raise CredentialUnavailable(f"exec plugin {self.command}: "
                                        f"{error.strerror or error}{hint}") from error
        try:
            out, err = await asyncio.wait_for(process.communicate(), EXEC_TIMEOUT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise CredentialUnavailable(f"exec plugin {self.command} did not answer within "
                                        f"{EXEC_TIMEOUT_SECONDS:g} s") from None
        if process.returncode != 0:
            tail = err.decode("utf-8", "replace").strip()[-500:]
            raise CredentialUnavailable(f"exec plugin {self.command} exited with "
                                        f"{process.returncode}: {tail}")
        return _exec_credential(self.command, out)


def _exec_credential(command: str, out: bytes) -> tuple[str, float | None]:
    """The token and its expiry from a plugin's answer; what cannot be used is refused as
    `CredentialUnavailable` too (the next run may answer better)."""
    try:
        credential = json.loads(out)
    except ValueError as error:
        raise CredentialUnavailable(f"exec plugin {command} printed no ExecCredential "
                                    f"JSON: {error}") from error
    status = credential.get("status") if isinstance(credential, dict) else None
    if not isinstance(status, dict):
        raise CredentialUnavailable(f"exec plugin {command}: the ExecCredential has no status")
    token = status.get("token")
    if not isinstance(token, str) or not token:
        if status.get("clientCertificateData"):
            raise CredentialUnavailable(f"exec plugin {command} answers with a client "
                                        "certificate, which sunkd does not support: use a "
                                        "token")
        raise CredentialUnavailable(f"exec plugin {command}: the ExecCredential has no token")
    expires = status.get("expirationTimestamp")
    if not expires:
        return token, None
    try:
        return token, datetime.fromisoformat(str(expires).replace("Z", "+00:00")).timestamp()
    except ValueError as error:
        raise CredentialUnavailable(f"exec plugin {command}: expirationTimestamp "
                                    f"{expires!r} is not RFC 3339") from error


@dataclass
class Credentials:
    """The headers that say who sunkd is, for each request."""

    headers: dict[str, str] = field(default_factory=dict)  # basic auth, impersonation
    bearer: str | None = None
    token_file: _TokenFile | None = None
    exec_plugin: _ExecPlugin | None = None

    async def authorization(self) -> dict[str, str]:
        token: str | None = self.bearer
        if self.token_file is not None:
            token = self.token_file.token()
        if self.exec_plugin is not None:
            token = await self.exec_plugin.token()
        if token:
            return {**self.headers, "Authorization": f"Bearer {token}"}
        return dict(self.headers)

    @property
    def refreshable(self) -> bool:
        """A 401 may be an expired credential that a new read or run fixes."""
        return self.token_file is not None or self.exec_plugin is not None

    def expire(self) -> None:
        if self.token_file is not None:
            self.token_file.expire()
        if self.exec_plugin is not None:
            self.exec_plugin.expire()


@dataclass
class Endpoint:
    """An API server and how to talk to it: what `KubeClient` needs."""

    server: str
    ssl_context: ssl.SSLContext | None = None  # None: plain http
    server_hostname: str | None = None
    proxy: str | None = None
    credentials: Credentials = field(default_factory=Credentials)


# ----------------------------------------------------------------------------- loading


def in_cluster(service_account_dir: str = SERVICE_ACCOUNT_DIR,
               env: Mapping[str, str] | None = None) -> Endpoint:
    """The pod's API server and service account (client-go `rest.InClusterConfig`)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST and "
                              "KUBERNETES_SERVICE_PORT must both be set")
    if ":" in host:
        host = f"[{host}]"  # an IPv6 service address
    token = _TokenFile(os.path.join(service_account_dir, "token"))
    token.token()  # a missing token is a configuration error now, not a 401 later
    ca = os.path.join(service_account_dir, "ca.crt")
    return Endpoint(f"https://{host}:{port}", _ssl_context(cafile=ca, where="in-cluster CA"),
                    credentials=Credentials(token_file=token))


def load_kubeconfig(paths: str, context: str | None = None) -> Endpoint:
    """The endpoint of `context` (default: `current-context`) from a kubeconfig, or from
    several separated by `:`."""
    merged = _merge([os.path.expanduser(p) for p in paths.split(os.pathsep) if p])
    name = context or merged.current_context
    if not name:
        raise KubeConfigError(f"{paths}: no current-context, and no context was given "
                              "(kubernetes.context)")
    if name not in merged.contexts:
        raise KubeConfigError(f"{paths}: no context named {name!r} "
                              f"(there are: {', '.join(sorted(merged.contexts)) or 'none'})")
    ctx, _ = merged.contexts[name]
    cluster_name, user_name = str(ctx.get("cluster") or ""), str(ctx.get("user") or "")
    if cluster_name not in merged.clusters:
        raise KubeConfigError(f"{paths}: context {name!r} names cluster {cluster_name!r}, "
                              "which is not defined")
    cluster, cluster_dir = merged.clusters[cluster_name]
    user, user_dir = merged.users.get(user_name, ({}, cluster_dir))
    if user_name and user_name not in merged.users:
        raise KubeConfigError(f"{paths}: context {name!r} names user {user_name!r}, "
                              "which is not defined")
    return _endpoint(cluster, cluster_dir, user, user_dir, f"{paths} (context {name!r})")


@dataclass
class _Merged:
    current_context: str | None = None
    clusters: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    users: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    contexts: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)


def _merge(paths: list[str]) -> _Merged:
    merged = _Merged()
    for path in paths:
        if not os.path.isfile(path):
            continue  # client-go skips listed files that do not exist
        try:
            with open(path, encoding="utf-8") as handle:
                document = yaml.safe_load(handle) or {}
        except (OSError, yaml.YAMLError) as error:
            raise KubeConfigError(f"cannot read the kubeconfig {path}: {error}") from error
        if not isinstance(document, dict):
            raise KubeConfigError(f"the kubeconfig {path} is not a YAML mapping")
        base = os.path.dirname(os.path.abspath(path))
        if not merged.current_context and document.get("current-context"):
            merged.current_context = str(document["current-context"])
        for key, target, inner in (("clusters", merged.clusters, "cluster"),
                                   ("users", merged.users, "user"),
                                   ("contexts", merged.contexts, "context")):
            for entry in document.get(key) or []:
                if not isinstance(entry, dict) or "name" not in entry:
                    raise KubeConfigError(f"the kubeconfig {path}: an entry of {key} has "
                                          "no name")
                body = entry.get(inner) or {}
                if not isinstance(body, dict):
                    raise KubeConfigError(f"the kubeconfig {path}: {key} {entry['name']!r} "
                                          f"has no {inner} mapping")
                target.setdefault(str(entry["name"]), (body, base))
    return merged


def _endpoint(cluster: dict[str, Any], cluster_dir: str, user: dict[str, Any],
              user_dir: str, where: str) -> Endpoint:
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise KubeConfigError(f"{where}: the cluster has no server")
    credentials = _credentials(user, user_dir, where)
    context: ssl.SSLContext | None = None
    if server.startswith("https://"):
        context = _ssl_context(
            cafile=_path(cluster.get("certificate-authority"), cluster_dir),
            cadata=_data(cluster.get("certificate-authority-data"), where),
            where=where)
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        _load_client_certificate(context, user, user_dir, where)
    elif user.get("client-certificate") or user.get("client-certificate-data"):
        raise KubeConfigError(f"{where}: a client certificate needs an https server, "
                              f"not {server}")
    return Endpoint(server, context, server_hostname=cluster.get("tls-server-name") or None,
                    proxy=cluster.get("proxy-url") or None, credentials=credentials)


def _credentials(user: dict[str, Any], base: str, where: str) -> Credentials:
    if user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeConfigError(
            f"{where}: auth-provider {provider!r} is not supported (kubectl and client-go "
            "removed the in-tree providers in 1.26): use an exec credential plugin")
    headers: dict[str, str] = {}
    if user.get("username") or user.get("password"):
        pair = f"{user.get('username') or ''}:{user.get('password') or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    if user.get("as"):
        headers["Impersonate-User"] = str(user["as"])
    if user.get("as-uid"):
        headers["Impersonate-Uid"] = str(user["as-uid"])
    groups = [str(g) for g in user.get("as-groups") or []]
    credentials = Credentials(headers=headers, bearer=user.get("token") or None)
    if groups:
        # aiohttp sends a header once per key: the groups go as one comma-separated value,
        # which the API server splits like repeated headers (RFC 9110, section 5.3).
        headers["Impersonate-Group"] = ", ".join(groups)
    if user.get("tokenFile"):
        credentials.token_file = _TokenFile(str(_path(user["tokenFile"], base)),
                                            fallback=credentials.bearer)
    if user.get("exec"):
        credentials.exec_plugin = _exec_plugin(user["exec"], base, where)
    return credentials


def _exec_plugin(spec: Any, base: str, where: str) -> _ExecPlugin:
    if not isinstance(spec, dict) or not spec.get("command"):
        raise KubeConfigError(f"{where}: exec needs a command")
    version = str(spec.get("apiVersion") or "")
    if version not in EXEC_API_VERSIONS:
        raise KubeConfigError(f"{where}: exec apiVersion {version!r} is not one of "
                              f"{', '.join(EXEC_API_VERSIONS)}")
    if spec.get("interactiveMode") == "Always":
        raise KubeConfigError(f"{where}: exec plugin {spec['command']} wants "
                              "interactiveMode Always; a daemon has no terminal")
    env = tuple((str(e["name"]), str(e.get("value", ""))) for e in spec.get("env") or [])
    return _ExecPlugin(str(spec["command"]), tuple(str(a) for a in spec.get("args") or []),
                       env, version, str(spec.get("installHint") or ""), base)


def _path(value: Any, base: str) -> str | None:
    if not value:
        return None
    path = os.path.expanduser(str(value))
    return path if os.path.isabs(path) else os.path.join(base, path)


def _data(value: Any, where: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as error:
        raise KubeConfigError(f"{where}: a *-data field is not base64: {error}") from error


def _ssl_context(*, cafile: str | None = None, cadata: bytes | None = None,
                 where: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=cafile)
        if cadata:
            context.load_verify_locations(cadata=cadata.decode("ascii", "replace"))
    except (OSError, ssl.SSLError) as error:
        raise KubeConfigError(f"{where}: cannot load the certificate authority: "
                              f"{error}") from error
    return context


def _load_client_certificate(context: ssl.SSLContext, user: dict[str, Any], base: str,
                             where: str) -> None:
    cert_path = _path(user.get("client-certificate"), base)
    key_path = _path(user.get("client-key"), base)
    cert_data = _data(user.get("client-certificate-data"), where)
    key_data = _data(user.get("client-key-data"), where)
    if not (cert_path or cert_data):
        return
    try:
        if cert_data is None and key_data is None:
            context.load_cert_chain(str(cert_path), key_path)
            return
        # The ssl module loads a certificate chain from files only: write the embedded
        # ones to a private directory, load, remove.
        with tempfile.TemporaryDirectory(prefix="sunkd-kubeconfig-") as private:
            if cert_data is not None:
                cert_path = os.path.join(private, "client.crt")
                _write_private(cert_path, cert_data)
            if key_data is not None:
                key_path = os.path.join(private, "client.key")
                _write_private(key_path, key_data)
            context.load_cert_chain(str(cert_path), key_path)
    except (OSError, ssl.SSLError) as error:
        raise KubeConfigError(f"{where}: cannot load the client certificate: "
                              f"{error}") from error


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
