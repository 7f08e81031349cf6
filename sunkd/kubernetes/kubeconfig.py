"""Where the Kubernetes API server is and how sunkd proves who it is, loaded by
kubernetes-asyncio, the client the specification names.

The library does the loading (`kubernetes_asyncio.config`): `$KUBECONFIG` lists merged in
order (clusters, users and contexts by name, the first file wins), paths relative to the
file that names them, the context, `server`, `certificate-authority(-data)`,
`client-certificate(-data)`/`client-key(-data)`, `insecure-skip-tls-verify` (with or
without a CA), `tls-server-name`, `proxy-url`, `token`, `username`/`password`, exec
credential plugins (any `client.authentication.k8s.io` version the plugin answers in; a
token is kept until `expirationTimestamp` minus five minutes, a client certificate until
a 401: the library keeps no expiry for it), the `oidc` and
`gcp` auth-providers, and in a pod the service-account token (re-read each minute: bound
tokens rotate) and CA. sunkd takes from it what its own transport (client.py) needs: the
server URL, a TLS context built from the library's settings as its REST client builds it,
and the Authorization header, refreshed through the library.

What the library does not do, and sunkd does here:
- find the kubeconfig, or say where it looked (`find_kubeconfig`); the library falls back
  to in-cluster with a warning;
- `current-context` from the first file that sets one, as client-go's loading rules do
  (the library takes the last);
- a context that names an undefined user is an error (client-go's); the library would
  send no credentials; a cluster without `server` too (the library would use localhost);
- `tokenFile` re-read each minute and winning over `token` (client-go's `BearerTokenFile`;
  the library reads the file once, and `token` wins);
- impersonation (`as`, `as-uid`, `as-groups`) headers;
- an `auth-provider` other than `gcp` and `oidc` refused (the library would ignore it);
- exec plugins: a command with a `/` resolved against its kubeconfig's directory, the
  `installHint` when it is missing, `interactiveMode: Always` refused (a daemon has no
  terminal), a bound on the plugin's run time (a plugin past it is killed: the library
  would leave it running), a credential without `expirationTimestamp` kept until a 401
  (the library runs the plugin again for every request), and a failed run raised as
  `CredentialUnavailable` (retried with backoff);
- after a 401, the credential is fetched again once (the file re-read, the plugin run), and
  a rotated exec client certificate gives a new TLS context (passed per request: the
  connections of the old one are not reused).

The library's import is the whole generated client (~38 MB resident, docs/performance.md):
it is imported on first use, in a thread, so commands that never reach Kubernetes (and the
Slurm hook) do not pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib
import os
import signal
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# How often a `tokenFile` is read again (client-go's cachingTokenSource: one minute).
TOKEN_FILE_TTL_SECONDS = 60.0
# How long loading credentials may take, exec plugin included (client-go has no default
# bound; a daemon needs one).
EXEC_TIMEOUT_SECONDS = 60.0
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


async def _import_library() -> None:
    """Import kubernetes-asyncio's loaders in a thread: ~1,000 modules, about a second of
    CPU that the event loop should not wait on."""
    await asyncio.to_thread(importlib.import_module, "kubernetes_asyncio.config")


# ----------------------------------------------------------------------------- credentials


@dataclass
class _TokenFile:
    path: str
    _value: str | None = None
    _read_at: float = -1e18

    def token(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_FILE_TTL_SECONDS:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self._value = handle.read().strip() or self._value
            except OSError as error:
                if self._value is None:
                    raise CredentialUnavailable(f"cannot read the token file {self.path}: "
                                                f"{error.strerror or error}") from error
                # Keep the last good token: a rotation in progress is not a reason to stop.
            self._read_at = now
        if self._value is None:
            raise CredentialUnavailable(f"the token file {self.path} is empty")
        return self._value

    def expire(self) -> None:
        self._read_at = -1e18


@dataclass
class _Reload:
    """The library's kubeconfig loader, run again when its credential expires (exec
    plugin, oidc) or after a 401."""

    loader: Any  # kubernetes_asyncio.config.kube_config.KubeConfigLoader
    configuration: Any  # kubernetes_asyncio.client.Configuration
    fetcher: str  # "exec plugin <command>", "auth-provider <name>"
    install_hint: str
    where: str
    command: str  # the exec plugin's, as the library runs it ("": none)
    forced: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def due(self) -> bool:
        if self.forced:
            return True
        expiry = getattr(self.loader, "exec_plugin_expiry", None)
        if not isinstance(expiry, datetime.datetime):
            return False  # no expiry: until a 401 (client-go's exec authenticator)
        from kubernetes_asyncio.config.kube_config import EXPIRY_SKEW_PREVENTION_DELAY
        return datetime.datetime.now(datetime.UTC) >= expiry - EXPIRY_SKEW_PREVENTION_DELAY

    async def run(self) -> None:
        async with self._lock:
            if not self.due():
                return  # another request refreshed it meanwhile
            if self.forced:
                with contextlib.suppress(AttributeError):
                    del self.loader.exec_plugin_expiry  # the library runs the plugin again
            await _load(self.loader, self.configuration, self.fetcher, self.install_hint,
                        self.where, self.command)
            self.forced = False


async def _load(loader: Any, configuration: Any, fetcher: str, install_hint: str,
                where: str, command: str = "") -> None:
    """`loader.load_and_set(configuration)`, bounded. A failure while an exec plugin or an
    auth-provider (`fetcher`) fetches the credential is `CredentialUnavailable` (the next
    try may work: the identity provider may be back); any other a `KubeConfigError`."""
    try:
        await asyncio.wait_for(loader.load_and_set(configuration), EXEC_TIMEOUT_SECONDS)
    except TimeoutError:
        if command:
            _kill_plugin(command)
        raise CredentialUnavailable(f"{where}: loading the credentials took more than "
                                    f"{EXEC_TIMEOUT_SECONDS:g} s"
                                    + (f" ({fetcher})" if fetcher else "")) \
            from None
    except Exception as error:  # the library raises ConfigException, OSError, ValueError...
        if not fetcher:
            raise KubeConfigError(f"{where}: {error}") from error
        hint = f" ({install_hint})" if install_hint and isinstance(
            error, FileNotFoundError) else ""
        raise CredentialUnavailable(f"{where}: {fetcher}: "
                                    f"{_describe(error)}{hint}") from error


def _kill_plugin(command: str) -> None:
    """Kill this process's children running the exec plugin `command`. The library holds
    the plugin's process and leaves it running when its run is cancelled; a plugin that
    hangs would otherwise pile up one process per retry. Found in /proc (Linux): a child
    whose argv[0] is the command, or argv[1] for a script run by its interpreter."""
    me, name = os.getpid(), os.path.basename(command)
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
                if ppid != me:
                    continue
                with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                    argv = [a.decode(errors="replace") for a in cmdline.read().split(b"\0")]
                if any(a == command or os.path.basename(a) == name for a in argv[:2]):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not ours to read


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


@dataclass
class Credentials:
    """The headers that say who sunkd is, for each request, and the TLS context (a client
    certificate is a credential too, and an exec plugin may rotate it)."""

    headers: dict[str, str] = field(default_factory=dict)  # impersonation
    bearer: str | None = None  # a fixed token (`KubeClient.for_url`)
    configuration: Any = None  # the library's Configuration: its api_key and refresh hook
    token_file: _TokenFile | None = None
    reload: _Reload | None = None
    in_cluster: Any = None  # the library's InClusterConfigLoader
    ssl_context: ssl.SSLContext | None = None  # None: plain http
    source: str = "none"  # how sunkd proves who it is, for `sunkd doctor` (no secret)

    async def authorization(self) -> dict[str, str]:
        value: str | None = f"Bearer {self.bearer}" if self.bearer else None
        if self.reload is not None and self.reload.due():
            cert = (self.configuration.cert_file, self.configuration.key_file)
            await self.reload.run()
            if (self.configuration.cert_file, self.configuration.key_file) != cert:
                try:
                    self.ssl_context = _ssl_context(self.configuration, self.reload.where)
                except KubeConfigError as error:  # the plugin's next answer may be good
                    self.reload.forced = True
                    raise CredentialUnavailable(str(error)) from error
        if self.configuration is not None:
            try:
                # In a pod, the library's hook re-reads the token file when a minute passed.
                value = await self.configuration.get_api_key_with_prefix("BearerToken")
            except Exception as error:
                raise CredentialUnavailable(f"cannot read the service account token: "
                                            f"{_describe(error)}") from error
        if self.token_file is not None:
            value = f"Bearer {self.token_file.token()}"
        if value:
            return {**self.headers, "Authorization": value.strip()}
        return dict(self.headers)

    @property
    def refreshable(self) -> bool:
        """A 401 may be an expired credential that a new read or run fixes."""
        return (self.token_file is not None or self.reload is not None
                or self.in_cluster is not None)

    def expire(self) -> None:
        if self.token_file is not None:
            self.token_file.expire()
        if self.reload is not None:
            self.reload.forced = True
        if self.in_cluster is not None:
            self.in_cluster.token_expires_at = datetime.datetime.min


@dataclass
class Endpoint:
    """An API server and how to talk to it: what `KubeClient` needs."""

    server: str
    server_hostname: str | None = None
    proxy: str | None = None
    credentials: Credentials = field(default_factory=Credentials)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.credentials.ssl_context


def _ssl_context(configuration: Any, where: str) -> ssl.SSLContext:
    """The TLS context kubernetes-asyncio's REST client (`client/rest.py`,
    `RESTClientObject`) builds from the same settings."""
    try:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    except (OSError, ssl.SSLError) as error:
        raise KubeConfigError(f"{where}: cannot load the certificate authority or the "
                              f"client certificate: {error}") from error
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


# ----------------------------------------------------------------------------- loading


async def in_cluster(service_account_dir: str = SERVICE_ACCOUNT_DIR,
                     env: Mapping[str, str] | None = None) -> Endpoint:
    """The pod's API server and service account (the library's `load_incluster_config`,
    client-go `rest.InClusterConfig`)."""
    env = os.environ if env is None else env
    if not env.get("KUBERNETES_SERVICE_HOST") or not env.get("KUBERNETES_SERVICE_PORT"):
        raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST and "
                              "KUBERNETES_SERVICE_PORT must both be set")
    await _import_library()
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

    token = os.path.join(service_account_dir, "token")
    loader = InClusterConfigLoader(token_filename=token,
                                   cert_filename=os.path.join(service_account_dir, "ca.crt"),
                                   environ=dict(env))
    configuration = Configuration()
    try:
        loader.load_and_set(configuration)
    except Exception as error:  # ConfigException, or OSError reading the files
        raise KubeConfigError(f"in a pod ({service_account_dir}): {_describe(error)}") \
            from error
    where = "in-cluster CA"
    return Endpoint(str(configuration.host), credentials=Credentials(
        configuration=configuration, in_cluster=loader,
        ssl_context=_ssl_context(configuration, where),
        source=f"service account token {token} (in a pod)"))


async def load_kubeconfig(paths: str, context: str | None = None) -> Endpoint:
    """The endpoint of `context` (default: the first file's `current-context`) from a
    kubeconfig, or from several separated by `:`."""
    await _import_library()
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.exec_provider import ExecProvider
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger

    try:
        merger = KubeConfigMerger(paths)
    except Exception as error:  # yaml.YAMLError, OSError, a document that is no mapping
        raise KubeConfigError(f"cannot read the kubeconfig {paths}: {error}") from error
    if merger.config is None:
        raise KubeConfigError(f"the kubeconfig {paths} names no existing file")
    name = context or next((str(doc["current-context"]) for doc in merger.config_files.values()
                            if isinstance(doc, dict) and doc.get("current-context")), None)
    if not name:
        raise KubeConfigError(f"{paths}: no current-context, and no context was given "
                              "(kubernetes.context)")
    where = f"{paths} (context {name!r})"
    try:
        loader = KubeConfigLoader(config_dict=merger.config, active_context=name,
                                  config_base_path=None)
    except Exception as error:  # ConfigException: a context or cluster not defined
        raise KubeConfigError(f"{where}: {error}") from error
    context_body: dict[str, Any] = (loader.current_context or {}).get("context") or {}
    cluster = _section(merger.config, "clusters", "cluster", context_body.get("cluster"))
    if not (cluster or {}).get("server"):
        # The library would go on with its default, http://localhost.
        raise KubeConfigError(f"{where}: cluster {context_body.get('cluster')!r} has no "
                              "server")
    user: dict[str, Any] = {}
    if context_body.get("user"):
        found = _section(merger.config, "users", "user", context_body["user"])
        if found is None:
            # client-go refuses; the library would send no credentials
            raise KubeConfigError(f"{where}: the context names user "
                                  f"{context_body['user']!r}, which is not defined")
        user = found
    fetcher, hint, command = "", "", ""
    provider = user.get("auth-provider")
    if isinstance(provider, dict):
        if provider.get("name") not in ("gcp", "oidc"):
            # The library would ignore it and send no credentials.
            raise KubeConfigError(
                f"{where}: auth-provider {provider.get('name')!r} is not supported (only gcp "
                "and oidc are, and client-go removed the in-tree providers in 1.26): use the "
                "provider's exec credential plugin")
        fetcher = f"auth-provider {provider['name']}"
    elif isinstance(user.get("exec"), dict):
        spec = user["exec"]
        try:
            ExecProvider(_node(spec, where))  # the library's checks of the section
        except Exception as error:
            raise KubeConfigError(f"{where}: {error}") from error
        if spec.get("interactiveMode") == "Always":
            raise KubeConfigError(f"{where}: exec plugin {spec['command']} wants "
                                  "interactiveMode Always; a daemon has no terminal")
        command, hint = str(spec["command"]), str(spec.get("installHint") or "")
        fetcher = f"exec plugin {command}"
        if os.sep in command and not os.path.isabs(command):
            # client-go: a path is relative to the kubeconfig that names it
            spec["command"] = command = os.path.join(_base(merger, loader), command)
    configuration = Configuration()
    await _load(loader, configuration, fetcher, hint, where, command)
    credentials = Credentials(configuration=configuration, headers=_impersonation(user),
                              source=_source(user, configuration))
    if fetcher:
        credentials.reload = _Reload(loader, configuration, fetcher, hint, where, command)
    if user.get("tokenFile"):
        path = os.path.join(_base(merger, loader),
                            os.path.expanduser(str(user["tokenFile"])))
        credentials.token_file = _TokenFile(path)
    server = str(configuration.host or "")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where}: the cluster's server {server!r} is not an http(s) "
                              "URL")
    if server.startswith("https://"):
        credentials.ssl_context = _ssl_context(configuration, where)
    elif user.get("client-certificate") or user.get("client-certificate-data"):
        raise KubeConfigError(f"{where}: a client certificate needs an https server, "
                              f"not {server}")
    return Endpoint(server, server_hostname=configuration.tls_server_name or None,
                    proxy=configuration.proxy or None, credentials=credentials)


def _node(value: dict[str, Any], where: str) -> Any:
    from kubernetes_asyncio.config.kube_config import ConfigNode
    return ConfigNode(where, value)


def _section(config: Any, kind: str, inner: str, name: Any) -> dict[str, Any] | None:
    """The `inner` mapping of the entry `name` of the merged config's `kind` list (None:
    no such entry; {}: an entry without one)."""
    entries = config.safe_get(kind)
    if not isinstance(entries, list):
        return None
    for entry in entries:
        value = getattr(entry, "value", entry)  # the merger wraps entries in ConfigNode
        if isinstance(value, dict) and value.get("name") == name:
            body = value.get(inner)
            return body if isinstance(body, dict) else {}
    return None


def _base(merger: Any, loader: Any) -> str:
    """The directory of the file that defined the context's user."""
    name = loader.current_context["context"].get("user")
    entry = merger.config["users"].get_with_name(name, safe=True)
    path = getattr(entry, "path", None)
    return os.path.dirname(os.path.abspath(path)) if path else os.getcwd()


def _source(user: dict[str, Any], configuration: Any) -> str:
    """What proves sunkd's identity, in the order the library tries them."""
    provider = user.get("auth-provider")
    if isinstance(provider, dict):
        return f"auth-provider {provider.get('name')}"
    if isinstance(user.get("exec"), dict):
        return f"exec plugin {user['exec'].get('command')}"
    if user.get("tokenFile"):
        return f"token file {user['tokenFile']}"
    if user.get("token"):
        return "token"
    if configuration.cert_file:
        return "client certificate"
    if user.get("username") and user.get("password"):
        return f"basic auth (user {user['username']})"
    return "none"


def _impersonation(user: dict[str, Any]) -> dict[str, str]:
    headers: dict[str, str] = {}
    if user.get("as"):
        headers["Impersonate-User"] = str(user["as"])
    if user.get("as-uid"):
        headers["Impersonate-Uid"] = str(user["as-uid"])
    groups = [str(g) for g in user.get("as-groups") or []]
    if groups:
        # aiohttp sends a header once per key: the groups go as one comma-separated value,
        # which the API server splits like repeated headers (RFC 9110, section 5.3).
        headers["Impersonate-Group"] = ", ".join(groups)
    return headers
