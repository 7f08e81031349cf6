"""`sunkd run`: check the TLS flags, tune the allocator and the collector, run the daemon."""

from __future__ import annotations

import argparse
import asyncio
import sys

import structlog

from sunkd.api.app import tls_context
from sunkd.runtime import collector
from sunkd.runtime.config import Settings
from sunkd.runtime.daemon import Daemon
from sunkd.runtime.malloc import ARENAS, limit_arenas

log = structlog.get_logger(__name__)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """`sunkd run [--tls-cert PEM --tls-key PEM]`."""
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if (cert is None) != (key is None):
        print("sunkd run: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if cert is not None and key is not None:
        try:
            tls_context(str(cert), str(key))
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            print(f"sunkd run: cannot use --tls-cert {cert} / --tls-key {key}: {error}",
                  file=sys.stderr)
            return 2
    # Before any thread exists (malloc.py says why).
    log.info("daemon.malloc", arenas=ARENAS if limit_arenas() else "glibc default or operator's",
             gc_thresholds=collector.tune())
    daemon = Daemon(settings, config_path=getattr(args, "config", None),
                    tls_cert=cert, tls_key=key, freeze_loaded_state=True)
    return asyncio.run(daemon.run())
