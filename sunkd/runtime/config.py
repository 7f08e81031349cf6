"""Settings: a TOML file (`--config`) overlaid by `SUNKD_*` environment variables.

Validation is strict and names the offending key, because a daemon that silently
falls back to a default for a mistyped `drain_timeout` could move nodes nobody meant
to move. Every key has an environment variable: `SUNKD_<SECTION>_<KEY>` for keys of a
section (`SUNKD_SLURM_URL`) and `SUNKD_<KEY>` at the top level (`SUNKD_DATABASE_URL`).
Pools are only configurable in the file (or as Nodeset objects in Kubernetes).
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from sunkd.domain.events import Label, OwnershipSpec
from sunkd.domain.gres import GresError, gpu_type
from sunkd.domain.policy import PoolSpec
from sunkd.domain.topology import DEFAULT_PRESET, TopologyError, TopologySpec, spec_from

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///sunkd.db"
DEFAULT_LISTEN = "127.0.0.1:8080"


class ConfigError(ValueError):
    """Invalid configuration: names the key and the problem."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class SlurmSettings:
    url: str | None = None  # http://host:port or unix:/path/to/slurmrestd.sock
    user: str = "root"
    token: str | None = None
    token_file: Path | None = None
    jwt_key_file: Path | None = None
    poll_interval: float = 5.0
    request_timeout: float = 15.0
    partitions: tuple[str, ...] = ()  # empty: every partition
    # Largest slurmrestd answer read; a bigger one makes the source stale (`too_large`).
    max_response_bytes: int = 64 * 1024 * 1024
    # Slurm hooks (`sunkd hook`, docs/slurm.md "Hooks"): accepted only when this file
    # holds their bearer token; `hook_fence` lets a PrologSlurmctld refuse a job on a node
    # being lent; at most `hook_rate` hooks a second are read (bursts of 10x pass).
    hook_token_file: Path | None = None
    hook_fence: bool = False
    hook_rate: float = 200.0


@dataclass(frozen=True)
class KubernetesSettings:
    enabled: bool = True
    kubeconfig: Path | None = None  # None: in-cluster, else ~/.kube/config
    context: str | None = None
    namespace: str = "sunkd"
    lease: bool = False  # also hold a coordination.k8s.io Lease (in-cluster HA)
    request_timeout: float = 30.0


@dataclass(frozen=True)
class TopologySettings:
    """The topology file sunkd keeps for slurmctld (docs/topology.md). Off unless `file`
    is set: sunkd then owns that file (topology.conf, or topology.yaml on Slurm 25.05+,
    by its suffix) and runs `scontrol reconfigure` after each change, at most once per
    `min_interval_seconds`. The labels: a `preset`, or `levels` (tree, leaf first) /
    `block_label` and `block_sizes` (block). A Nodeset's `spec.topology` replaces this
    default when every Nodeset that has one agrees (Slurm has one topology)."""

    file: Path | None = None
    kind: str = "tree"
    preset: str | None = DEFAULT_PRESET
    levels: tuple[str, ...] = ()
    block_label: str | None = None
    block_sizes: tuple[int, ...] = ()
    name: str = "default"  # the topology's name in topology.yaml
    min_interval_seconds: float = 60.0
    scontrol: str = "scontrol"


@dataclass(frozen=True)
class GresSettings:
    """The GPU check (docs/topology.md, "GPUs"): with `check`, a Slurm-owned node whose
    registered GRES differs from its Kubernetes Node's GPUs (count from allocatable
    `nvidia.com/gpu`, type from `nvidia.com/gpu.product`, lower case with `_`) is held.
    `type_map` maps a product label (as is, or normalised) to the type Slurm uses."""

    check: bool = False
    type_map: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolSettings:
    """A pool defined in the config file (sites without the Nodeset CRD)."""

    name: str
    partitions: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    workload_selector: Mapping[str, str] = field(default_factory=dict)
    mode: str = "Auto"
    min_slurm: int = 0
    min_kubernetes: int = 0
    max_kubernetes: int | None = None
    prefer: str = "Slurm"
    dwell_seconds: float = 300.0
    max_in_flight: int = 1
    drain_timeout_seconds: float = 1800.0
    reclaim_grace_seconds: float = 300.0
    forecast: bool = False  # lend ahead of the pool's forecast demand (docs/operations.md)
    forecast_horizon_seconds: float = 4 * 3600.0
    headroom_quantile: float = 0.9
    forecast_block_hours: float = 0.0  # daily blocks behind the forecast (0: off)


def pool_spec(pool: PoolSettings) -> PoolSpec:
    """The domain's PoolSpec for a config-file pool (the same shape a Nodeset gives)."""
    return PoolSpec(
        name=pool.name,
        partitions=pool.partitions,
        node_selector=tuple(Label(k, v) for k, v in sorted(pool.node_selector.items())),
        ownership=OwnershipSpec(
            mode=pool.mode, min_slurm=pool.min_slurm, min_kubernetes=pool.min_kubernetes,
            max_kubernetes=pool.max_kubernetes, prefer=pool.prefer,
            dwell_seconds=pool.dwell_seconds, max_in_flight=pool.max_in_flight,
            drain_timeout_seconds=pool.drain_timeout_seconds,
            reclaim_grace_seconds=pool.reclaim_grace_seconds, forecast=pool.forecast,
            forecast_horizon_seconds=pool.forecast_horizon_seconds,
            headroom_quantile=pool.headroom_quantile,
            forecast_block_hours=pool.forecast_block_hours),
    )


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    listen: str = DEFAULT_LISTEN
    log_level: str = "info"
    log_format: str = "auto"  # auto (JSON unless stdout is a TTY) | json | console
    lease_seconds: float = 15.0
    # The policy decides on the database's clock (this host's + the offset measured at
    # each lease renewal); an offset larger than this stops acting (docs/safety.md).
    max_clock_skew_seconds: float = 10.0
    snapshot_every: int = 1000
    # Snapshots kept after each save, besides an archive's base: a snapshot is
    # a cache of the fold, so fewer only means a longer replay if the newest is unreadable.
    snapshots_kept: int = 3
    # Where a snapshot of 1,000 nodes or more is encoded: "thread" (no second process; the
    # encoder's transient memory stays in the daemon) or "child" (a forked process: briefly
    # needs room for the child's copied pages, 149-225 MB at 10,000 nodes). With the
    # allocator settings (malloc.py) both end at the same daemon RSS (docs/performance.md).
    snapshot_encoder: str = "thread"
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    topology: TopologySettings = field(default_factory=TopologySettings)
    gres: GresSettings = field(default_factory=GresSettings)
    pools: tuple[PoolSettings, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)


_CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": ("debug", "info", "warning", "error"),
    "log_format": ("auto", "json", "console"),
    "snapshot_encoder": ("child", "thread"),
    "pools.mode": ("Auto", "Slurm", "Kubernetes"),
    "pools.prefer": ("Slurm", "Kubernetes"),
}


# Every number in the settings, with its allowed range [low, high] (`low_open`: low
# itself excluded). Values outside, NaN and infinities are refused naming the key: a
# NaN lease length poisoned the shared leadership row, a NaN poll interval polled in a
# tight loop. Pool keys are checked for every [[pools]] entry.
_DAY = 86400.0
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "lease_seconds": (3.0, 3600.0, False),
    "max_clock_skew_seconds": (0.1, 3600.0, False),
    "snapshot_every": (1, 10_000_000, False),
    "snapshots_kept": (1, 1000, False),
    "slurm.poll_interval": (0.1, 3600.0, False),
    # A slurmrestd whose slurmctld is down blocks ~9 s before answering (docs/slurm.md,
    # "Measured behaviour"); a shorter timeout would report a timeout instead of the
    # controller's real error.
    "slurm.request_timeout": (10.0, 3600.0, True),
    "slurm.max_response_bytes": (64 * 1024, 16 * 1024**3, False),
    "slurm.hook_rate": (1.0, 100_000.0, False),
    "kubernetes.request_timeout": (1.0, 3600.0, False),
    "topology.min_interval_seconds": (1.0, _DAY, False),
    "pools.min_slurm": (0, 1_000_000, False),
    "pools.min_kubernetes": (0, 1_000_000, False),
    "pools.max_kubernetes": (0, 1_000_000, False),
    "pools.max_in_flight": (1, 1_000_000, False),
    "pools.dwell_seconds": (0.0, 30 * _DAY, False),
    "pools.drain_timeout_seconds": (0.0, 30 * _DAY, False),
    "pools.reclaim_grace_seconds": (0.0, 30 * _DAY, False),
    "pools.forecast_horizon_seconds": (0.0, 30 * _DAY, False),
    "pools.headroom_quantile": (0.5, 0.999, False),
    "pools.forecast_block_hours": (0.0, 23.0, False),
}


def _bounds_key(key: str) -> str:
    """`pools[3].dwell_seconds (env X)` -> `pools.dwell_seconds`."""
    key = key.split(" ", 1)[0]
    if key.startswith("pools["):
        return "pools." + key.split(".", 1)[1]
    return key


def _check_number(key: str, value: Any) -> None:
    """Raise ConfigError(key) unless `value` is a finite number in the key's range."""
    bounds = _BOUNDS.get(_bounds_key(key))
    if bounds is None or value is None:
        return
    low, high, low_open = bounds
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    inside = (low < value if low_open else low <= value) and value <= high
    if not inside:
        low_text = f"above {low:g}" if low_open else f"at least {low:g}"
        raise ConfigError(key, f"must be {low_text} and at most {high:g}, got {value!r}")


def _validate_numbers(settings: Settings) -> None:
    for key in _BOUNDS:
        if key.startswith("pools."):
            attr = key.split(".", 1)[1]
            for index, pool in enumerate(settings.pools):
                _check_number(f"pools[{index}].{attr}", getattr(pool, attr))
            continue
        value: Any = settings
        for part in key.split("."):
            value = getattr(value, part)
        _check_number(key, value)


def _validate(settings: Settings) -> None:
    _validate_numbers(settings)
    for key, choices in _CHOICES.items():
        if key.startswith("pools."):
            attr = key.split(".", 1)[1]
            for index, pool in enumerate(settings.pools):
                if getattr(pool, attr) not in choices:
                    raise ConfigError(f"pools[{index}].{attr}", f"must be one of {choices}")
        elif getattr(settings, key) not in choices:
            raise ConfigError(key, f"must be one of {choices}, got {getattr(settings, key)!r}")
    if not settings.database_url.startswith(("sqlite", "postgresql")):
        raise ConfigError("database_url",
                          "must be a sqlite+aiosqlite:// or postgresql+asyncpg:// URL")
    _check_listen("listen", settings.listen)
    url = settings.slurm.url
    if url is not None and not url.startswith(("http://", "https://", "unix:")):
        raise ConfigError("slurm.url", "must start with http://, https:// or unix:")
    _check_name("identity", settings.identity)
    _check_topology(settings.topology)
    # Both are read from the Kubernetes Nodes (their labels; their allocatable GPUs):
    # without Kubernetes the file would never be written and every GPU count unknown.
    if not settings.kubernetes.enabled:
        if settings.topology.file is not None:
            raise ConfigError("topology.file", "needs kubernetes.enabled: the topology is "
                                               "rendered from the Nodes' labels")
        if settings.gres.check:
            raise ConfigError("gres.check", "needs kubernetes.enabled: the GPUs a node "
                                            "should have come from its Node")
    for product, kind in settings.gres.type_map.items():
        try:
            gpu_type(product, settings.gres.type_map)
        except GresError as error:
            raise ConfigError(f"gres.type_map.{product}", str(error)) from error
        if not kind:
            raise ConfigError(f"gres.type_map.{product}", "must not be empty")
    for index, pool in enumerate(settings.pools):
        _check_name(f"pools[{index}].name", pool.name)
        if pool.max_kubernetes is not None and pool.min_kubernetes > pool.max_kubernetes:
            raise ConfigError(f"pools[{index}].min_kubernetes",
                              f"{pool.min_kubernetes} is above max_kubernetes "
                              f"{pool.max_kubernetes}: no node count satisfies both")
    names = [pool.name for pool in settings.pools]
    if len(set(names)) != len(names):
        raise ConfigError("pools", "pool names must be unique")


def topology_spec(topology: TopologySettings) -> TopologySpec:
    """The renderer's spec from the `[topology]` settings (ConfigError when invalid)."""
    if topology.kind not in ("tree", "block"):
        raise ConfigError("topology.kind", f"must be tree or block, got {topology.kind!r}")
    try:
        return spec_from("tree" if topology.kind == "tree" else "block",
                         preset=topology.preset, levels=topology.levels,
                         block_label=topology.block_label, block_sizes=topology.block_sizes)
    except TopologyError as error:
        raise ConfigError("topology", str(error)) from error


def _check_topology(topology: TopologySettings) -> None:
    topology_spec(topology)
    if topology.file is not None and topology.file.name not in (
            "topology.conf", "topology.yaml"):
        raise ConfigError("topology.file", f"{topology.file}: Slurm reads topology.conf "
                                           "or topology.yaml beside slurm.conf")
    _check_name("topology.name", topology.name)


# Names sunkd writes into its log and shows people (the leader's identity in the shared
# leadership row, a pool's name in every decision): as long as a DNS name (RFC 1123), and
# printable, so a row or a table line stays one readable line.
MAX_NAME_LENGTH = 253


def _check_name(key: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(key, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise ConfigError(key, f"must be at most {MAX_NAME_LENGTH} characters, got "
                               f"{len(value)}: {value[:40]!r}...")
    if not value.isprintable():
        raise ConfigError(key, f"must be printable (no NUL, newline or control "
                               f"character), got {value!r}")


def _check_listen(key: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(key, f"must be HOST:PORT, got {value!r}")


def parse_listen(value: str) -> tuple[str, int]:
    _check_listen("listen", value)
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


# ------------------------------------------------------------------------- coercion


def _coerce(key: str, hint: Any, raw: Any, *, from_env: bool) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(hint) if option is not type(None)]
        if raw is None or (from_env and raw == ""):
            return None
        return _coerce(key, options[0], raw, from_env=from_env)
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if from_env and isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
            return True
        if from_env and isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(key, f"expected true or false, got {raw!r}")
    if hint is int:
        integer: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            integer = raw
        elif from_env and isinstance(raw, str) and len(raw) <= 30:
            try:
                integer = int(raw)
            except ValueError:
                pass
        if integer is None:
            raise ConfigError(key, f"expected an integer, got {raw!r}")
        _check_number(key, integer)
        return integer
    if hint is float:
        number: float | None = None
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            try:
                number = float(raw)
            except OverflowError:  # an integer beyond float range
                number = math.inf
        elif from_env and isinstance(raw, str):
            try:
                number = float(raw)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(key, f"expected a number, got {raw!r}")
        _check_number(key, number)
        return number
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise ConfigError(key, f"expected a string, got {raw!r}")
    if hint is Path:
        if isinstance(raw, str) and raw:
            return Path(raw).expanduser()
        raise ConfigError(key, f"expected a path, got {raw!r}")
    if origin is tuple:
        item_hint = get_args(hint)[0]
        if from_env and isinstance(raw, str):
            raw = [item.strip() for item in raw.split(",") if item.strip()]
        if not isinstance(raw, list):
            raise ConfigError(key, f"expected a list, got {raw!r}")
        return tuple(_coerce(f"{key}[{i}]", item_hint, item, from_env=from_env)
                     for i, item in enumerate(raw))
    if origin in (Mapping, dict) or hint is Mapping:
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise ConfigError(key, "expected a table of strings")
        return dict(raw)
    raise ConfigError(key, f"unsupported setting type {hint!r}")


def _build(cls: type, key_prefix: str, table: Mapping[str, Any], env: Mapping[str, str],
           env_prefix: str | None) -> Any:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(cls)}
    for unknown in sorted(set(table) - known):
        raise ConfigError(f"{key_prefix}{unknown}", "unknown key")
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        key = f"{key_prefix}{item.name}"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            sub_table = table.get(item.name, {})
            if not isinstance(sub_table, dict):
                raise ConfigError(key, "expected a table")
            values[item.name] = _build(hint, f"{key}.", sub_table, env,
                                       f"SUNKD_{item.name.upper()}_")
            continue
        if item.name == "pools":
            pools_raw = table.get("pools", [])
            if not isinstance(pools_raw, list):
                raise ConfigError("pools", "expected an array of tables ([[pools]])")
            pools = []
            for index, pool_table in enumerate(pools_raw):
                if not isinstance(pool_table, dict) or "name" not in pool_table:
                    raise ConfigError(f"pools[{index}]", "each pool needs a name")
                pools.append(_build(PoolSettings, f"pools[{index}].", pool_table, {}, None))
            values["pools"] = tuple(pools)
            continue
        env_name = f"{env_prefix}{item.name.upper()}" if env_prefix is not None else None
        if env_name is not None and env_name in env:
            values[item.name] = _coerce(f"{key} (env {env_name})", hint, env[env_name],
                                        from_env=True)
        elif item.name in table:
            values[item.name] = _coerce(key, hint, table[item.name], from_env=False)
    try:
        return cls(**values)
    except TypeError as error:
        raise ConfigError(key_prefix.rstrip(".") or "config", str(error)) from error


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None,
                  **overrides: Any) -> Settings:
    """Read the TOML file (if any), overlay `SUNKD_*` variables, then explicit overrides
    (command-line flags). Raises ConfigError on any invalid key."""
    environ = os.environ if env is None else env
    table: dict[str, Any] = {}
    if path is not None:
        try:
            table = tomllib.loads(path.read_text())
        except FileNotFoundError as error:
            raise ConfigError("--config", f"file not found: {path}") from error
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("--config", f"{path} is not valid TOML: {error}") from error
    settings: Settings = _build(Settings, "", table, environ, "SUNKD_")
    clean = {key: value for key, value in overrides.items() if value is not None}
    if clean:
        settings = dataclasses.replace(settings, **clean)
    return settings
