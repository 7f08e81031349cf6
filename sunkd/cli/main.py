"""The `sunkd` command line: one entry point for the daemon, operator controls and tools.

Subcommands import their modules lazily so that `sunkd --version` and `sunkd events`
start fast and keep working even on a host without, say, a Kubernetes config.
Exit status: 0 success, 1 operational failure, 2 invalid usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from sunkd import __version__
from sunkd.runtime.config import ConfigError, Settings, load_settings
from sunkd.runtime.logs import configure_logging

log = structlog.get_logger(__name__)

Handler = Callable[[argparse.Namespace, Settings], int]


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {"database_url": getattr(args, "database_url", None)}
    if getattr(args, "listen", None):
        overrides["listen"] = args.listen
    if args.log_level:
        overrides["log_level"] = args.log_level
    path: Path | None = args.config
    if path is not None and path.is_dir():
        raise ConfigError("--config", f"{path} is a directory, not a TOML file")
    try:
        return load_settings(path, **overrides)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError("--config", f"cannot read {path}: {error}") from error


# Seqs and counts are SQL BIGINTs: larger values are refused here, not by the driver.
MAX_BIGINT = 2**63 - 1


def _count(value: str) -> int:
    """An argparse type: an integer from 0 to 2**63 - 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if not 0 <= number <= MAX_BIGINT:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_BIGINT}, got {value}")
    return number


# ------------------------------------------------------------------ delegations


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from sunkd.cli.doctor import doctor

    exit_code: int = asyncio.run(doctor(settings, as_json=args.json, out=sys.stdout))
    return exit_code


def cmd_sim_kubeapi(args: argparse.Namespace, settings: Settings) -> int:
    from sunkd_testbed.kubeapi import run_cli

    exit_code: int = run_cli(port=args.port, kubeconfig_out=args.kubeconfig_out,
                             load=args.load or [], listen_host=args.host)
    return exit_code


TESTBED_MISSING = (
    "sunkd {command}: this command runs the test bed, which is not part of sunkd's "
    "production install. Install it with `pip install 'sunkd[testbed]'`, or from a clone "
    "of the repository `pip install -e . -e ./testbed` (`make demo` does it).")


def _optional(module: str, attribute: str) -> Handler:
    """A handler living in a module that other commands must not need to import."""

    def handler(args: argparse.Namespace, settings: Settings) -> int:
        imported = __import__(module, fromlist=[attribute])
        result: int = getattr(imported, attribute)(args, settings)
        return result

    return handler


def _needs_testbed(command: str, handler: Handler) -> Handler:
    """`demo` and `sim` run the test bed, a separate distribution (`sunkd[testbed]`):
    without it they say how to get it, rather than print a traceback."""

    def guarded(args: argparse.Namespace, settings: Settings) -> int:
        try:
            return handler(args, settings)
        except ModuleNotFoundError as missing:
            if not (missing.name or "").startswith("sunkd_testbed"):
                raise
            print(TESTBED_MISSING.format(command=command), file=sys.stderr)
            return 2

    return guarded


# ----------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sunkd", description="One compute pool for Slurm and Kubernetes.")
    parser.add_argument("--version", action="version", version=f"sunkd {__version__}")
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    def database(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--database-url", help="overrides SUNKD_DATABASE_URL")

    migrate = add("migrate", _optional("sunkd.cli.log", "cmd_migrate"),
                  "upgrade the database schema (or downgrade it)")
    database(migrate)
    migrate.add_argument("--revision", default="head")
    migrate.add_argument("--downgrade", metavar="REVISION", help="e.g. base or -1")

    events = add("events", _optional("sunkd.cli.log", "cmd_events"),
                 "print the event log")
    database(events)
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--after", type=_count, default=0, metavar="SEQ")
    events.add_argument("--subject", help="only events about this node or pool")
    events.add_argument("--kind", action="append", help="only this kind (repeatable)")
    events.add_argument("--limit", type=_count, default=10_000_000)
    events.add_argument("--json", action="store_true", help="one JSON object per line")

    _add_log_commands(commands, database)

    doctor = add("doctor", cmd_doctor, "check the connections to Slurm (and Kubernetes)")
    doctor.add_argument("--json", action="store_true")

    from sunkd.cli.topology import add_arguments as topology_arguments

    topology = commands.add_parser("topology", help="the network topology sunkd gives Slurm")
    topology_render = topology.add_subparsers(
        dest="topology_command", metavar="ACTION", required=True).add_parser(
        "render", help="print topology.conf/.yaml from Kubernetes node labels")
    topology_render.set_defaults(handler=_optional("sunkd.cli.topology", "cmd_topology_render"))
    topology_arguments(topology_render)

    run = add("run", _optional("sunkd.cli.run", "cmd_run"), "run the daemon")
    database(run)
    run.add_argument("--listen", metavar="HOST:PORT", help="HTTP address (default 127.0.0.1:8080)")
    run.add_argument("--tls-cert", type=Path, metavar="PEM",
                     help="serve HTTPS with this certificate (chain); needs --tls-key")
    run.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's key")

    status = add("status", _optional("sunkd.cli.operator", "cmd_status"),
                 "where every node is, and why")
    database(status)
    status.add_argument("--json", action="store_true")

    pin = add("pin", _optional("sunkd.cli.operator", "cmd_pin"),
              "pin a node to one side (or back to auto)")
    database(pin)
    pin.add_argument("node")
    pin.add_argument("--to", required=True, choices=["slurm", "kubernetes", "auto"])
    pin.add_argument("--reason", required=True)
    pin.add_argument("--who", help="defaults to the login name")
    pin.add_argument("--force", action="store_true",
                     help="pin a node sunkd has not observed yet (it applies once it is)")

    replay = add("replay", _optional("sunkd.cli.operator", "cmd_replay"),
                 "rebuild state from the whole log and compare")
    database(replay)
    replay.add_argument("--check", action="store_true",
                        help="exit non-zero on any difference with the snapshot/read models")
    replay.add_argument("--rebuild", action="store_true", help="rebuild the SQL read models")
    replay.add_argument("--archive", type=Path, action="append", metavar="DIR",
                        help="also verify this archive (`sunkd log archive`) and replay "
                             "from seq 1 through it (repeatable)")

    history = add("history", _optional("sunkd.cli.audit", "cmd_history"),
                  "ownership intervals of a node, with who and why")
    database(history)
    history.add_argument("node")
    history.add_argument("--since", help="ISO time or a duration like 24h")
    history.add_argument("--json", action="store_true")

    audit = add("audit", _optional("sunkd.cli.audit", "cmd_audit"),
                "utilization per owner, transitions, aborts, slowest drains")
    database(audit)
    audit.add_argument("--from", "--since", dest="since",
                       help="start: ISO time or a duration ago like 30d (default 30d)")
    audit.add_argument("--to", help="end: ISO time or a duration ago like 1d (default now)")
    audit.add_argument("--json", action="store_true")

    demo = add("demo", _needs_testbed("demo", _optional("sunkd_testbed.demo", "cmd_demo")),
               "run the whole system locally: real Slurm, the Kubernetes emulator, SQLite")
    database(demo)
    demo.add_argument("--duration", type=float, help="seconds; run until Ctrl-C without it")
    demo.add_argument("--nodes", type=int,
                      help="Slurm nodes (default 4; with --slurmd-pods 3 kubelet Nodes)")
    demo.add_argument("--summary-json", type=Path)
    demo.add_argument("--phase-seconds", type=float, default=30.0,
                      help="how long each demand phase lasts (default 30)")
    demo.add_argument("--listen", metavar="HOST:PORT")
    demo.add_argument("--slurmd-pods", action="store_true",
                      help="as root: the real control plane, real kubelet Nodes and a "
                           "Nodeset whose slurmd pods follow ownership (docs/nodeset.md)")

    from sunkd.cli.simulate import add_arguments as simulate_arguments

    simulate_arguments(add("simulate", _optional("sunkd.cli.simulate", "cmd_simulate"),
                           "separate clusters vs sunkd's pool vs an ideal pool, on traces"))

    sim = commands.add_parser("sim", help="simulators for tests and demos")
    sim_commands = sim.add_subparsers(dest="sim_command", metavar="SIMULATOR", required=True)
    kubeapi = sim_commands.add_parser(
        "kubeapi", help="a Kubernetes API emulator (not a real API server)")
    kubeapi.set_defaults(handler=_needs_testbed("sim kubeapi", cmd_sim_kubeapi))
    kubeapi.add_argument("--port", type=int, default=0)
    kubeapi.add_argument("--host", default="127.0.0.1")
    kubeapi.add_argument("--kubeconfig-out", type=Path)
    kubeapi.add_argument("--load", type=Path, action="append", help="YAML objects to create")
    return parser


def _add_log_commands(commands: Any, database: Callable[[argparse.ArgumentParser], None]
                      ) -> None:
    """`sunkd log archive|restore|partitions|grants` (docs/operations.md, "Retention")."""
    from sunkd.cli.log import duration, seq_range

    group = commands.add_parser("log", help="retention: archive, restore, partitions, roles",
                                description="retention of the event log")
    subs = group.add_subparsers(dest="log_command", metavar="ACTION", required=True)

    def add(name: str, attribute: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = subs.add_parser(name, help=help_text,
                                                       description=help_text)
        sub.set_defaults(handler=_optional("sunkd.cli.log", attribute))
        database(sub)
        sub.add_argument("--json", action="store_true")
        return sub

    archive = add("archive", "cmd_log_archive",
                  "write old events to checksummed files, then remove them from the database")
    cut = archive.add_mutually_exclusive_group(required=True)
    cut.add_argument("--older-than", type=duration, metavar="AGE", help="e.g. 30d")
    cut.add_argument("--upto-seq", type=_count, metavar="SEQ")
    archive.add_argument("--to", type=Path, required=True, metavar="DIR")
    restore = add("restore", "cmd_log_restore",
                  "bring an archived range back (into events_restored) for audit")
    restore.add_argument("--from", dest="source", type=Path, action="append", required=True,
                         metavar="DIR")
    restore.add_argument("--range", type=seq_range, metavar="A-B")
    partitions = add("partitions", "cmd_log_partitions",
                     "create the PostgreSQL partitions ahead of the append point")
    partitions.add_argument("--ahead", type=_count, default=4, metavar="N")
    grants = add("grants", "cmd_log_grants",
                 "print the SQL of the daemon and maintenance database roles")
    grants.add_argument("--daemon-role", default="sunkd")
    grants.add_argument("--maintenance-role", default="sunkd_maintenance")
    grants.add_argument("--database", help="defaults to the database of the URL")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["hook"]:
        # Slurm runs it for every job: no settings, no logging, and always fail-open
        # (sunkd/slurm/hook.py; `sunkd-hook` is the same without this module's imports).
        from sunkd.slurm.hook import main as hook_main

        return hook_main(arguments[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        settings = _settings(args)
    except ConfigError as error:
        print(f"sunkd: invalid configuration: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        handler: Handler = args.handler
        return handler(args, settings)
    except ConfigError as error:
        print(f"sunkd: invalid configuration: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        from sunkd.store.migrations_api import NotASunkdLog, SchemaError

        if isinstance(error, NotASunkdLog):  # a mistyped path, another application's data
            print(f"sunkd: {error}", file=sys.stderr)
            return 2
        if isinstance(error, SchemaError):
            print(f"sunkd: {error}", file=sys.stderr)
            return 1
        if settings.log_level == "debug":
            raise
        # An operator tool answers with a sentence, not a traceback.
        print(f"sunkd {args.command}: {type(error).__name__}: {error} (run with "
              "--log-level debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
