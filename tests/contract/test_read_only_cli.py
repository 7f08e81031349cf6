"""Read commands never write: `status`, `events`, `history`, `audit` and `replay` open the
log read-only and refuse, with one sentence and exit 2, anything that is not a sunkd log:
a mistyped path (not created), another application's SQLite database (no tables added, its
journal mode untouched), a database with an `events` table of its own, a PostgreSQL
database without sunkd's schema (nothing created). Commands that write to an existing
log (`pin`, `log ...`) never create one either; only `run`, `demo` and `migrate` do.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect

from sunkd.cli.main import main
from sunkd.store.eventlog import EventLog, create_engine

READ_COMMANDS: list[list[str]] = [
    ["status"],
    ["events"],
    ["history", "n1"],
    ["audit"],
    ["replay", "--check"],
]
WRITE_COMMANDS: list[list[str]] = [
    ["pin", "n1", "--to", "slurm", "--reason", "test", "--force"],
    ["log", "archive", "--upto-seq", "5", "--to", "ARCHIVE"],
    ["log", "restore", "--from", "ARCHIVE"],
]


def _run(command: list[str], url: str, tmp_path: Path) -> int:
    argv = [part.replace("ARCHIVE", str(tmp_path / "archive")) for part in command]
    return main([*argv, "--database-url", url])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _not_a_log(capsys: pytest.CaptureFixture[str], where: str) -> None:
    err = capsys.readouterr().err
    assert "not a sunkd log at" in err, err
    assert where in err, err
    assert "run `sunkd migrate` to create one" in err, err
    assert "OperationalError" not in err and "SELECT" not in err, err


@pytest.mark.parametrize("command", READ_COMMANDS + WRITE_COMMANDS,
                         ids=lambda c: " ".join(c[:2]))
def test_a_mistyped_sqlite_path_is_not_created(tmp_path: Path, command: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evnets.db"
    assert _run(command, f"sqlite+aiosqlite:///{path}", tmp_path) == 2
    _not_a_log(capsys, str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing may be created"


def _foreign_database(path: Path, *, own_events: bool) -> None:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    connection.execute("INSERT INTO users (name) VALUES ('ada')")
    if own_events:
        connection.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)")
        connection.execute("INSERT INTO events (what) VALUES ('launch')")
    connection.commit()
    connection.close()


def _schema_and_mode(path: Path) -> tuple[list[str], str]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = sorted(row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master"))
        mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
        return names, mode
    finally:
        connection.close()


@pytest.mark.parametrize("own_events", [False, True], ids=["foreign", "own-events-table"])
@pytest.mark.parametrize("command", READ_COMMANDS + WRITE_COMMANDS,
                         ids=lambda c: " ".join(c[:2]))
def test_another_applications_sqlite_database_is_left_alone(
        tmp_path: Path, command: list[str], own_events: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "app.db"
    _foreign_database(path, own_events=own_events)
    before, digest = _schema_and_mode(path), _digest(path)
    assert before[1] == "delete"
    assert _run(command, f"sqlite+aiosqlite:///{path}", tmp_path) == 2
    _not_a_log(capsys, str(path))
    assert _schema_and_mode(path) == before, "no table, view or journal mode change"
    assert _digest(path) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


async def _tables(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            return sorted(await connection.run_sync(
                lambda sync: inspect(sync).get_table_names()
                + inspect(sync).get_view_names()))
    finally:
        await engine.dispose()


@pytest.mark.parametrize("command", READ_COMMANDS + WRITE_COMMANDS,
                         ids=lambda c: " ".join(c[:2]))
async def test_a_postgres_database_without_sunkds_schema_is_refused(
        postgres_url: str, tmp_path: Path, command: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    assert await _tables(postgres_url) == []
    code = await asyncio.to_thread(_run, command, postgres_url, tmp_path)
    assert code == 2
    _not_a_log(capsys, postgres_url.rsplit("/", 1)[1])
    assert await _tables(postgres_url) == []


async def test_read_commands_leave_a_sunkd_log_unchanged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a real log the read commands answer, and the file is byte for byte the same."""
    import asyncio

    path = tmp_path / "events.db"
    url = f"sqlite+aiosqlite:///{path}"
    event_log = await EventLog.open(url, migrate=True)
    await event_log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    digest = _digest(path)
    for command in READ_COMMANDS:
        code = await asyncio.to_thread(_run, command, url, tmp_path)
        out, err = capsys.readouterr()
        if command[0] == "history":  # an empty log: a node with no history exits 1
            assert (code, out.strip()) == (1, "no history for node 'n1'"), err
        else:
            assert code == 0, (command, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert _digest(path) == digest


@pytest.mark.parametrize("own_events", [False, True], ids=["foreign", "own-events-table"])
def test_simulate_from_log_leaves_another_applications_database_alone(
        tmp_path: Path, own_events: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """`sunkd simulate --from-log` reads a log too: on another application's SQLite
    database it exits 2 saying it is no sunkd log, and the file keeps its tables, its
    journal mode and its bytes (opening it read-write used to switch it to WAL)."""
    path = tmp_path / "app.db"
    _foreign_database(path, own_events=own_events)
    before, digest = _schema_and_mode(path), _digest(path)
    assert main(["simulate", "--from-log", f"sqlite+aiosqlite:///{path}", "--json"]) == 2
    assert _schema_and_mode(path) == before, "no table, view or journal mode change"
    assert _digest(path) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    err = capsys.readouterr().err
    assert f"not a sunkd log at {path}" in err, err


async def test_read_commands_never_upgrade_an_older_sunkd_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sunkd log at an older schema revision (an older sunkd's SQLite file) is read by
    no command but `migrate`: each read command says to run `sunkd migrate` and leaves the
    file as it was (SQLite logs used to be migrated by whatever command opened them)."""
    import asyncio

    from sunkd.store import migrations_api

    path = tmp_path / "events.db"
    url = f"sqlite+aiosqlite:///{path}"
    engine = create_engine(url)
    try:
        await migrations_api.upgrade(engine, "0002")
        assert await migrations_api.current_revision(engine) == "0002"
    finally:
        await engine.dispose()
    files = sorted(p.name for p in tmp_path.iterdir())
    digest = _digest(path)
    for command in READ_COMMANDS:
        code = await asyncio.to_thread(_run, command, url, tmp_path)
        err = capsys.readouterr().err
        assert code != 0, (command, err)
        assert "0002" in err and "run `sunkd migrate`" in err, (command, err)
        assert "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert _digest(path) == digest, "the file was changed (migrated?)"
