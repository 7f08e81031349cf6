"""Read only the first HTTP answer on a connection, for slurmrestd's doubled error answers.

slurmrestd 26.05.5 follows an error answer that closes the connection (401 without a
token, 511 when slurmctld refuses the token, 502 when slurmctld is down) with a second
copy of it on the same connection: `HTTP/1.1 511 ...` with `Connection: Close` and
`Content-Length: N`, the N bytes of JSON, then `HTTP/1.1 511 ...` again (captured in
tests/fixtures/slurm/v0.0.45_nodes_bad_token_raw.http). RFC 9112 section 9.6: a client
that receives `close` closes the connection after reading the answer that carries it.
aiohttp's strict llhttp parser instead refuses the whole read ("Data after `Connection:
close`") and the first, complete answer is lost. So the client, for a GET or a DELETE
only (idempotent: repeating it is harmless), asks again here: one request on a fresh
connection, parsed by h11 (python-hyper's HTTP/1.1 state machine, chosen over a
hand-written parser), which stops at the first answer's end and ignores whatever
follows. slurmrestd 26.05.5 doubles a DELETE node's 422 error answer the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlsplit

import h11

# aiohttp's words for the refusal (llhttp's HPE_CLOSED_CONNECTION), in the exception text.
DATA_AFTER_CLOSE = "Data after `Connection: close`"
_READ = 65536


class AnswerTooLarge(Exception):
    """The first answer's body exceeds the caller's cap."""


async def first_answer(
    method: str,
    base_url: str,
    path: str,
    headers: Mapping[str, str],
    *,
    socket_path: str | None,
    time_limit: float,
    max_body: int,
) -> tuple[int, str, bytes]:
    """(status, content type, body) of the first answer to one request; raises OSError,
    TimeoutError, h11.ProtocolError or AnswerTooLarge."""
    async with asyncio.timeout(time_limit):
        if socket_path is not None:
            reader, writer = await asyncio.open_unix_connection(socket_path)
            host = "localhost"
        else:
            parts = urlsplit(base_url)
            host = parts.netloc
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        try:
            return await _exchange(reader, writer, method, host, path, headers, max_body)
        finally:
            writer.close()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                    host: str, path: str, headers: Mapping[str, str],
                    max_body: int) -> tuple[int, str, bytes]:
    connection = h11.Connection(h11.CLIENT)
    request_headers = [("Host", host), ("Connection", "close"), *headers.items()]
    writer.write(connection.send(h11.Request(method=method, target=path,
                                             headers=request_headers)))
    writer.write(connection.send(h11.EndOfMessage()))
    await writer.drain()
    status = 0
    content_type = ""
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(_READ))
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            for name, value in event.headers:
                if name == b"content-type":
                    content_type = value.decode("latin-1").split(";")[0].strip().lower()
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                raise AnswerTooLarge(f"more than {max_body}")
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            if status == 0:
                raise h11.RemoteProtocolError("connection closed before an answer")
            return status, content_type, bytes(body)
