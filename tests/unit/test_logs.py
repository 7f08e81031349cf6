"""Secrets never reach the logs."""

from __future__ import annotations

import io
import json

import structlog

from sunkd.runtime.logs import configure_logging, redact_text


def test_url_passwords_and_tokens_are_redacted() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    structlog.get_logger("t").info(
        "connect", url="postgresql+asyncpg://sunkd:hunter2@db:5432/sunkd",
        token="eyJhbGciOi.secret.sig", token_file="/etc/sunkd/token",
        detail="Authorization: Bearer abc.def.ghi", nested={"password": "pw"})
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    text = json.dumps(line)
    assert "hunter2" not in text and "secret.sig" not in text and "abc.def" not in text
    assert '"pw"' not in text
    assert line["url"] == "postgresql+asyncpg://sunkd:***@db:5432/sunkd"
    assert line["token_file"] == "/etc/sunkd/token"


def test_redact_text_leaves_plain_urls() -> None:
    assert redact_text("http://slurm:6820/ping") == "http://slurm:6820/ping"
