"""Messages that say what happened: a write that waited out the statement timeout on a
locked leadership row says so (it was an empty `TimeoutError: `), and a node name of
10,000 characters is not echoed in full by `sunkd pin`."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from sunkd.cli.main import main
from sunkd.domain.events import Event, OperatorPinned
from sunkd.store.eventlog import EventLog


async def test_a_write_that_waits_out_the_statement_timeout_says_why(postgres_url: str) -> None:
    await (await EventLog.open(postgres_url, migrate=True)).close()
    holder = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg://",
                                                        "postgresql://"))
    # The real engine settings, with asyncpg's statement timeout at 1.5 s instead of 60 s.
    engine = create_async_engine(postgres_url, connect_args={"command_timeout": 1.5})
    event_log = EventLog(engine, postgres_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT * FROM leadership FOR UPDATE")
        with pytest.raises(TimeoutError) as caught:
            await event_log.append_unfenced([Event("n1", OperatorPinned(
                node="n1", to="slurm", who="t", why="t"))])
        message = str(caught.value)
        assert "leadership row" in message and "nothing was written" in message, message
        await transaction.rollback()
        assert await event_log.latest_seq() == 0
    finally:
        await event_log.close()
        await holder.close()


def test_pin_of_a_10000_character_name_is_not_echoed_in_full(
        tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/events.db"
    asyncio.run(_create(url))
    name = "n" * 10_000
    assert main(["pin", name, "--to", "slurm", "--reason", "r", "--database-url", url]) == 2
    err = capsys.readouterr().err
    assert len(err) < 600, len(err)
    assert "…" in err and "10000 characters" in err, err


async def _create(url: str) -> None:
    await (await EventLog.open(url)).close()
