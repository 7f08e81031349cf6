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


def _client_errors(error: BaseException) -> BaseException | None:
    """The HTTP protocol error (aiohttp's, a client's doing) in `error`'s chain, if any."""
    if "aiohttp" not in sys.modules:
        return None
    from aiohttp.http_exceptions import HttpProcessingError
    from aiohttp.web_protocol import RequestPayloadError

    seen: BaseException | None = error
    for _ in range(10):  # a cause chain is short; a cycle is not followed forever
        if seen is None:
            return None
        if isinstance(seen, HttpProcessingError | RequestPayloadError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def client_error_processor(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A request aiohttp could not parse (a malformed request line or header, a body that
    does not decode) is the client's doing and any client can send one: one line with the
    error, at info, instead of aiohttp's ERROR with a traceback."""
    exc_info = event_dict.get("exc_info")
    error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(error, BaseException):
        client = _client_errors(error)
        if client is not None:
            del event_dict["exc_info"]
            event_dict["error"] = " ".join(f"{type(client).__name__}: {client}".split())[:300]
            event_dict["level"] = "info"
    return event_dict


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog, and stdlib logging (which aiohttp and alembic use) through the
    same processors, so that every record is one JSON object per line: a traceback is a
    field of it, never lines of its own."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    client_error_processor, structlog.processors.format_exc_info,
                    redact_processor, renderer]))
    root = logging.getLogger()
    for previous in root.handlers:  # as logging.basicConfig(force=True) does
        previous.close()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
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
