"""The status page rendered by a real headless Chromium against a real server: the
screenshot is a decodable, non-blank PNG and the DOM has the key facts."""

from __future__ import annotations

import asyncio
import shutil
import struct
import zlib
from pathlib import Path

from aiohttp import web

from sunkd.api.app import build_app
from tests.conftest import require
from tests.integration.test_api import seeded_view

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def png_pixels(data: bytes) -> tuple[int, int, set[bytes]]:
    """(width, height, distinct pixels) of an 8-bit RGB/RGBA non-interlaced PNG, with
    the scanline filters undone (stdlib only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, b"", b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks += body
        position += 12 + length
    width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(chunks)
    stride = width * channels
    previous = bytearray(stride)
    seen: set[bytes] = set()
    for row in range(height):
        start = row * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + best) & 0xFF
        if row % 4 == 0:
            for i in range(0, stride, channels * 4):
                seen.add(bytes(line[i:i + 3]))
        previous = line
    return width, height, seen


async def chromium(*args: str) -> tuple[int, bytes, bytes]:
    process = await asyncio.create_subprocess_exec(
        "chromium", *CHROMIUM_FLAGS, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), 120)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out, err


async def test_status_page_in_headless_chromium(sqlite_url: str, tmp_path: Path) -> None:
    require(shutil.which("chromium") is not None, "chromium is not installed")
    view = await seeded_view(sqlite_url)
    runner = web.AppRunner(build_app(view))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        server = site._server
        assert server is not None and server.sockets
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/?hours=5"
        screenshot = tmp_path / "status.png"
        code, _out, err = await chromium(f"--user-data-dir={tmp_path / 'profile-1'}",
                                         f"--screenshot={screenshot}",
                                         "--window-size=1280,900", url)
        assert code == 0, err.decode(errors="replace")[-2000:]
        width, height, colours = png_pixels(screenshot.read_bytes())
        assert (width, height) == (1280, 900)
        assert len(colours) > 20, "the screenshot is (nearly) a single colour"
        # The timeline's phase colours are on screen (SLURM blue, KUBERNETES green).
        assert bytes.fromhex("2b6cb0") in colours and bytes.fromhex("2f855a") in colours

        code, dom, err = await chromium(f"--user-data-dir={tmp_path / 'profile-2'}",
                                        "--dump-dom", url)
        assert code == 0, err.decode(errors="replace")[-2000:]
        text = dom.decode()
        assert "sunkd status" in text and "leader" in text
        assert "default/gpu" in text and "at most the last 5 hours" in text
        for node in ("n1", "n2", "n3", "n4", "n5", "other-1"):
            assert f"<td>{node}</td>" in text
        assert text.count("<rect") >= 15  # intervals of six nodes over 5 hours
        assert "NotReady" in text  # n4 is HELD, and says why
        assert "Slurm drain not finished within drain_timeout" in text  # interval title
        assert "fresh" in text
    finally:
        await runner.cleanup()
        assert view.event_log is not None
        await view.event_log.close()
