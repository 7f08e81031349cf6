"""`sunkd sim kubeapi`: run the Kubernetes API emulator as a standalone process.

Lets a developer point kubectl or a locally running sunkd at the emulator, e.g.
`sunkd sim kubeapi --port 6443 --kubeconfig-out /tmp/kubeconfig --load manifests/crds/`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from .server import KubeAPIEmulator, load_manifests


async def serve(port: int, kubeconfig_out: Path | None, load: list[Path], listen_host: str,
                stop: asyncio.Event | None = None) -> int:
    api = KubeAPIEmulator()
    try:
        loaded = load_manifests(api, load)
    except Exception as exc:  # report any load failure plainly
        print(f"sunkd sim kubeapi: cannot load manifests: {exc}", file=sys.stderr)
        return 2
    await api.start(listen_host, port)
    if kubeconfig_out is not None:
        api.write_kubeconfig(kubeconfig_out)
    print(f"Kubernetes API emulator (not a real API server) listening on {api.url}; "
          f"{len(loaded)} objects loaded"
          + (f"; kubeconfig written to {kubeconfig_out}" if kubeconfig_out else ""),
          flush=True)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await api.stop()
    return 0


def run_cli(port: int, kubeconfig_out: Path | None, load: list[Path], listen_host: str) -> int:
    """Entry point used by `sunkd sim kubeapi` in sunkd/cli/main.py; blocks until SIGINT/SIGTERM."""
    return asyncio.run(serve(port, kubeconfig_out, load, listen_host))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sunkd sim kubeapi",
                                     description="Run the Kubernetes API emulator.")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--kubeconfig-out", type=Path, default=None)
    parser.add_argument("--load", type=Path, action="append", default=[],
                        help="YAML file or directory to create at start (repeatable)")
    return parser


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return await serve(args.port, args.kubeconfig_out, args.load, args.listen_host)


def sync_main(argv: list[str] | None = None) -> int:
    return asyncio.run(main(argv))


if __name__ == "__main__":
    raise SystemExit(sync_main())
