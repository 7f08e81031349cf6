"""Structured logging for every sunkd command, with secrets redacted.

JSON lines when stdout is not a TTY (production: journald, Kubernetes log shipping),
readable key=value lines on a TTY. A processor redacts passwords inside URLs and the
values of keys that name secrets (token, password, secret, authorization), wherever
they appear in an event dict, so a careless `log.info(..., url=database_url)` cannot
leak credentials.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog

REDACTED = "***"
_SECRET_KEY = re.compile(r"(token|password|passwd|secret|authorization|jwt)", re.IGNORECASE)
# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)(?=@)")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


def redact_text(text: str) -> str:
    """Remove URL passwords and bearer tokens from free text."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def _redact_value(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(key) and value not in (None, "", False):
        # Paths to secret files are not secrets; their contents are.
        if key.endswith(("_file", "_path")):
            return value
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(key, item) for item in value]
    return value


def redact_processor(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        event_dict[key] = _redact_value(key, event_dict[key])
    return event_dict


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and stdlib logging, which aiohttp/alembic use)."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=out,
                        format="%(levelname)s %(name)s %(message)s", force=True)
