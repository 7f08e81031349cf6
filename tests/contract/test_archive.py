"""`sunkd log archive`, `sunkd log restore` and `sunkd replay
--check --archive` on SQLite and PostgreSQL; the append-only triggers refuse every
delete but the archive's; the archive base snapshot survives pruning.

On PostgreSQL the tests shrink the partitions (`sunkd_partitioning`) to a few dozen seqs,
so a whole partition fills with a test-sized log; the archive then drops real
partitions exactly as it does at 1,000,000 seqs."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from sunkd.cli.main import main
from sunkd.cli.operator import replay_check
from sunkd.domain.codec import encode_payload
from sunkd.domain.events import Event, LogArchived, SlurmNodeObserved
from sunkd.domain.fold import fold
from sunkd.domain.snapshot import state_to_json
from sunkd.store import archive, projections
from sunkd.store.eventlog import EventLog
from tests.seeding import ClockedLog, all_events, open_clocked, seed_pool_history

SIZE = 20  # seqs per partition in these tests (PostgreSQL)


async def small_partitions(log: EventLog, size: int = SIZE) -> None:
    """Replace the migration's empty 1,000,000-seq partitions by `size`-seq ones."""
    if log.dialect != "postgresql":
        return
    assert await log.latest_seq() == 0
    async with log.engine.begin() as connection:
        for part in await archive.partitions(log):
            await connection.execute(text(f'DROP TABLE "{part.name}"'))
        await connection.execute(text("UPDATE sunkd_partitioning SET partition_size = :s"),
                                 {"s": size})
    await archive.extend_partitions(log, ahead=1)


async def seeded(url: str) -> ClockedLog:
    log = await open_clocked(url)
    await small_partitions(log)
    await seed_pool_history(log)
    return log


async def transitions(log: EventLog) -> list[dict[str, Any]]:
    return await projections.rows(log.engine, "SELECT transition_id, node, outcome, "
                                              "start_seq FROM transitions ORDER BY start_seq")


async def test_archive_restore_and_replay_check(database_url: str, tmp_path: Path) -> None:
    log = await seeded(database_url)
    try:
        everything = await all_events(log)
        latest = everything[-1].seq
        before = await transitions(log)
        origin = await log.origin()
        full_fold = fold(everything)
        await log.save_snapshot(15, state_to_json(fold(everything[:15])))

        result = await archive.archive(log, tmp_path, upto_seq=latest - 5)
        assert result is not None and result.from_seq == 1
        if log.dialect == "postgresql":  # cut back to the last whole partition
            assert result.upto_seq % SIZE == 0 and result.upto_seq > latest - 5 - SIZE
            assert len(result.partitions_dropped) == result.upto_seq // SIZE
        else:
            assert result.upto_seq == latest - 5
        cut = result.upto_seq
        assert result.events == result.removed == cut

        # The files: gzip JSON lines, readable without sunkd, checksums as in the manifest.
        manifest = json.loads(result.manifest.read_text())
        assert manifest["format"] == "sunkd-archive/1"
        assert (manifest["from_seq"], manifest["upto_seq"], manifest["events"]) == (1, cut, cut)
        lines = []
        for entry in manifest["files"]:
            path = tmp_path / entry["name"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
            lines += [json.loads(line) for line in gzip.open(path, "rt")]
        assert [line["seq"] for line in lines] == list(range(1, cut + 1))
        assert [(line["kind"], line["subject"]) for line in lines] == \
            [(e.kind, e.subject) for e in everything[:cut]]
        assert lines[0]["payload"] == encode_payload(everything[0].payload)

        # The database: the range is gone, the log.archived event and the base are there.
        assert await log.live_range() == (cut + 1, latest + 1)
        recorded = (await log.read(latest))[0]
        assert isinstance(recorded.payload, LogArchived)
        assert (recorded.payload.from_seq, recorded.payload.upto_seq,
                recorded.payload.base_seq) == (1, cut, cut)
        assert [f.sha256 for f in recorded.payload.files] == \
            [e["sha256"] for e in manifest["files"]]
        assert recorded.payload.manifest_sha256 == \
            hashlib.sha256(result.manifest.read_bytes()).hexdigest()
        assert await log.origin() == origin  # the daemon's log guard
        assert cut in await log.snapshot_seqs()

        # The base survives pruning while it is the base; older snapshots do not.
        state = fold(await all_events(log), fold(everything[:cut]))
        for offset in range(4):
            await log.save_snapshot(latest + 1 + offset, state_to_json(state), keep=2)
        assert await log.snapshot_seqs() == [cut, latest + 3, latest + 4]

        # Replay: from the base snapshot alone, and from seq 1 through the archive.
        notes: list[str] = []
        assert await replay_check(log, notes=notes) == []
        assert any("archive base snapshot" in note for note in notes)
        assert any("read models not compared" in note for note in notes)
        notes = []
        assert await replay_check(log, archives=[tmp_path], notes=notes) == []
        assert any(note.startswith("archive verified") for note in notes)
        assert fold(await all_events(log), fold(everything[:cut])).nodes == \
            fold([], full_fold).nodes

        # The audit views lost the archived transitions; a restore brings them back.
        assert len(await transitions(log)) < len(before)
        restored = await archive.restore(log, [tmp_path])
        assert (restored.restored, restored.present, restored.skipped_live) == (cut, 0, 0)
        assert await transitions(log) == before
        again = await archive.restore(log, [tmp_path], from_seq=2, upto_seq=4)
        assert (again.restored, again.present) == (0, 3)
        notes = []
        assert await replay_check(log, archives=[tmp_path], notes=notes) == []
        assert not any("read models not compared" in note for note in notes)
    finally:
        await log.close()


async def test_a_second_archive_chains_onto_the_first(database_url: str,
                                                      tmp_path: Path) -> None:
    log = await seeded(database_url)
    try:
        latest = await log.latest_seq()
        first = await archive.archive(log, tmp_path, upto_seq=SIZE)
        assert first is not None and first.upto_seq == SIZE
        second = await archive.archive(log, tmp_path, upto_seq=latest - 5)
        assert second is not None and second.from_seq == SIZE + 1
        found, problems = await archive.verify_against_log(log, [tmp_path])
        assert problems == [] and [m.from_seq for m in found] == [1, SIZE + 1]
        assert await log.archive_base_seq() == second.upto_seq
        assert await replay_check(log, archives=[tmp_path]) == []
        assert await replay_check(log) == []
        # An archive that misses the first run breaks seq continuity, and says so.
        found[0].path.unlink()
        problems = await replay_check(log, archives=[tmp_path])
        assert any("expected 1" in p for p in problems)
    finally:
        await log.close()


async def test_replay_check_and_restore_refuse_a_tampered_archive(
        database_url: str, tmp_path: Path) -> None:
    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        path = tmp_path / result.files[0]["name"]
        lines = gzip.open(path, "rt").read().splitlines()
        body = json.loads(lines[1])
        body["subject"] = "someone-else"  # a rewritten event, re-compressed
        lines[1] = json.dumps(body)
        path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        problems = await replay_check(log, archives=[tmp_path])
        assert any("sha256" in p and result.files[0]["name"] in p for p in problems)
        with pytest.raises(archive.ArchiveError, match="does not verify"):
            await archive.restore(log, [tmp_path])
        assert await archive.restored_range(log) == (0, 0, 0)
    finally:
        await log.close()


async def test_nothing_is_removed_when_the_reread_fails(
        database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await seeded(database_url)
    try:
        latest = await log.latest_seq()
        # The disk gives back other bytes than were written (fault injection).
        monkeypatch.setattr(archive, "_verify_file",
                            lambda path, entry: [f"{path.name}: sha256 differs"])
        with pytest.raises(archive.ArchiveError, match="nothing was removed"):
            await archive.archive(log, tmp_path, upto_seq=latest - 5)
        assert await log.live_range() == (1, latest)
        assert await log.archive_base_seq() is None
    finally:
        await log.close()


async def test_only_the_archive_may_delete(database_url: str, tmp_path: Path) -> None:
    """The daemon's code paths cannot remove history: the triggers refuse a DELETE (and
    on PostgreSQL a TRUNCATE of the table or of any partition); the archive can."""
    log = await seeded(database_url)
    try:
        latest = await log.latest_seq()
        refused = ["DELETE FROM events WHERE seq = 1", "UPDATE events SET kind = 'x'"]
        if log.dialect == "postgresql":
            parts = await archive.partitions(log)
            refused += ["TRUNCATE events", f'TRUNCATE "{parts[0].name}"',
                        f'DELETE FROM "{parts[0].name}"', "TRUNCATE events_default"]
        for sql in refused:
            with pytest.raises(DBAPIError, match="append-only"):
                async with log.engine.begin() as connection:
                    await connection.execute(text(sql))
        assert await log.latest_seq() == latest and len(await all_events(log)) == latest
        result = await archive.archive(log, tmp_path, upto_seq=latest - 5)
        assert result is not None and result.removed > 0
        assert (await log.live_range() or (0, 0))[0] == result.upto_seq + 1
        if log.dialect == "sqlite":
            rows = await projections.rows(log.engine, "SELECT * FROM sunkd_maintenance")
            assert rows == []  # the permission did not outlive the archive's transaction
            with pytest.raises(DBAPIError, match="append-only"):
                async with log.engine.begin() as connection:
                    await connection.execute(text("DELETE FROM events"))
    finally:
        await log.close()


async def test_late_maintenance_moves_default_rows_into_partitions(postgres_url: str,
                                                                   tmp_path: Path) -> None:
    log = await open_clocked(postgres_url)
    try:
        await small_partitions(log)  # one partition of 20 seqs, then DEFAULT
        lease = await log.acquire("a")
        assert lease is not None
        await log.append([Event(f"n{i}", SlurmNodeObserved(node=f"n{i}", state="IDLE"))
                          for i in range(70)], lease.epoch)
        count = await projections.rows(log.engine, "SELECT count(*) AS n FROM events_default")
        assert count == [{"n": 51}]  # seqs 21..71: maintenance ran late
        created = await archive.extend_partitions(log, ahead=2)
        assert created >= 3
        count = await projections.rows(log.engine, "SELECT count(*) AS n FROM events_default")
        assert count == [{"n": 0}]
        parts = await archive.partitions(log)
        assert [(p.lower, p.upper) for p in parts[:4]] == [(1, 21), (21, 41), (41, 61),
                                                           (61, 81)]
        assert len(await all_events(log)) == 71
        with pytest.raises(DBAPIError, match="append-only"):  # new partitions get it too
            async with log.engine.begin() as connection:
                await connection.execute(text(f'TRUNCATE "{parts[2].name}"'))
    finally:
        await log.close()


def test_cli_archive_restore_and_replay(sqlite_url: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    async def seed() -> int:
        log = await seeded(sqlite_url)
        try:
            return await log.latest_seq()
        finally:
            await log.close()

    latest = asyncio.run(seed())
    capsys.readouterr()
    out = tmp_path / "archive"
    db = ["--database-url", sqlite_url]
    assert main(["log", "archive", *db, "--upto-seq", str(latest - 3), "--to", str(out),
                 "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["archived"]["upto_seq"] == latest - 3
    assert main(["log", "archive", *db, "--older-than", "3650d", "--to", str(out)]) == 0
    assert "nothing to archive" in capsys.readouterr().out
    assert main(["replay", *db, "--check", "--archive", str(out)]) == 0
    assert "archive verified" in capsys.readouterr().out
    assert main(["log", "restore", *db, "--from", str(out), "--range", "1-10"]) == 0
    assert "restored 10 events" in capsys.readouterr().out
    assert main(["log", "grants", *db, "--database", "sunkd"]) == 0
    assert "GRANT INSERT ON events TO sunkd;" in capsys.readouterr().out


async def test_a_daemon_follows_and_restarts_across_an_archive(database_url: str,
                                                              tmp_path: Path) -> None:
    """The daemon's log guard (a recreated database stops it) identifies the log by its
    first event, which the archive removes: it must see the same log afterwards; and a
    restart loads the base (or a later) snapshot plus the tail, equal to the whole fold."""
    from sunkd.runtime.logguard import LogGuard
    from sunkd.runtime.reconciler import Reconciler

    log = await seeded(database_url)
    try:
        whole = fold(await all_events(log))
        reconciler = Reconciler(log)
        await reconciler.load()
        guard = LogGuard(log, folded=lambda: reconciler.state.last_seq)
        await guard.check()  # records the identity
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        await guard.check()  # would raise LogWentBackwardsError: "log was replaced"
        restarted = Reconciler(log)
        await restarted.load()
        assert state_to_json(fold([], restarted.state))["nodes"] == \
            state_to_json(whole)["nodes"]
    finally:
        await log.close()


async def test_no_fold_from_nothing_on_an_archived_log(database_url: str,
                                                       tmp_path: Path) -> None:
    """Without a readable snapshot covering the archived range, loading refuses instead
    of folding the live tail onto an empty state (a state without that history)."""
    from sunkd.runtime.reconciler import ArchivedLogError, load_state

    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        _state, used = await load_state(log)
        assert used == result.upto_seq
        async with log.engine.begin() as connection:
            await connection.execute(text("DELETE FROM snapshots"))  # all gone
        with pytest.raises(ArchivedLogError, match=f"starts at seq {result.upto_seq + 1}"):
            await load_state(log)
        problems = await replay_check(log)
        assert any(f"archive base snapshot {result.upto_seq} is missing" in p for p in problems)
    finally:
        await log.close()


async def test_migration_0003_keeps_the_rows_and_the_views(database_url: str) -> None:
    """Upgrading a populated 0002 log partitions it (PostgreSQL) with every row kept and
    the read models working; the downgrade puts the plain table back, rows included."""
    from sunkd.store import migrations_api
    from sunkd.store.eventlog import create_engine

    engine = create_engine(database_url)
    try:
        await migrations_api.upgrade(engine, "0002")
    finally:
        await engine.dispose()
    log = ClockedLog(create_engine(database_url), database_url)  # at 0002, not head
    try:
        await seed_pool_history(log)
        rows = await all_events(log)
        views = await transitions(log)
        await migrations_api.upgrade(log.engine, "0003")
        assert [e.seq for e in await all_events(log)] == [e.seq for e in rows]
        assert await transitions(log) == views
        if log.dialect == "postgresql":
            assert [p.lower for p in await archive.partitions(log)][:2] == \
                [1, 1 + archive.PARTITION_SIZE]
        await migrations_api.downgrade(log.engine, "0002")
        assert [e.seq for e in await all_events(log)] == [e.seq for e in rows]
        assert await transitions(log) == views
        with pytest.raises(DBAPIError, match="append-only"):
            async with log.engine.begin() as connection:
                await connection.execute(text("DELETE FROM events"))
    finally:
        await log.close()


# ------------------------------------------- verification against what the log recorded


def _rewrite_file(path: Path, lines: list[str]) -> None:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))


def _recompute_manifest(manifest_path: Path) -> None:
    """What a forger does after editing a file: make the manifest beside it agree."""
    body = json.loads(manifest_path.read_text())
    for entry in body["files"]:
        data = (manifest_path.parent / entry["name"]).read_bytes()
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        entry["bytes"] = len(data)
        entry["content_sha256"] = hashlib.sha256(gzip.decompress(data)).hexdigest()
        entry["events"] = len(gzip.decompress(data).splitlines())
    manifest_path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


async def _refused(log: EventLog, directory: Path, *needles: str) -> list[str]:
    problems = await replay_check(log, archives=[directory])
    assert problems, "the forged archive passed replay --check"
    text_of = "\n".join(problems)
    for needle in needles:
        assert needle in text_of, (needle, problems)
    with pytest.raises(archive.ArchiveError, match="does not verify") as caught:
        await archive.restore(log, [directory])
    for needle in needles:
        assert needle in str(caught.value), (needle, str(caught.value))
    assert await archive.restored_range(log) == (0, 0, 0), "nothing restored"
    return problems


async def test_an_edited_event_with_recomputed_manifest_checksums_is_refused(
        database_url: str, tmp_path: Path) -> None:
    """The manifest beside the files is no authority: `log.archived` recorded every file's
    and the manifest's sha256 when they were written."""
    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        name = result.files[0]["name"]
        path = tmp_path / name
        lines = gzip.open(path, "rt").read().splitlines()
        body = json.loads(lines[1])
        body["subject"] = "someone-else"
        lines[1] = json.dumps(body)
        _rewrite_file(path, lines)
        _recompute_manifest(result.manifest)
        await _refused(log, tmp_path, name, "log.archived")
    finally:
        await log.close()


async def test_a_seq_replaced_by_a_copy_of_its_neighbour_is_refused_naming_it(
        database_url: str, tmp_path: Path) -> None:
    """Line count, first and last seq all agree; seq 5 is simply not there."""
    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        name = result.files[0]["name"]
        path = tmp_path / name
        lines = gzip.open(path, "rt").read().splitlines()
        assert json.loads(lines[4])["seq"] == 5
        lines[4] = lines[3]  # seq 4 twice, seq 5 gone
        _rewrite_file(path, lines)
        _recompute_manifest(result.manifest)
        await _refused(log, tmp_path, name, "seq 5 is missing")
    finally:
        await log.close()


async def test_earlier_archives_are_verified_through_the_records_archived_after_them(
        database_url: str, tmp_path: Path) -> None:
    """The first run's `log.archived` event is itself archived by the second run: the
    first manifest is then checked against that record, read from the verified second
    archive."""
    from sunkd.domain.events import SourceHealth

    log = await seeded(database_url)
    try:
        first = await archive.archive(log, tmp_path, upto_seq=SIZE)
        assert first is not None and first.upto_seq == SIZE
        await log.append_unfenced([Event("slurm", SourceHealth(source="slurm", status="fresh"))
                                   for _ in range(3 * SIZE)])
        second = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert second is not None and second.upto_seq > first.event_seq, \
            "the first run's record is archived by the second"
        assert await replay_check(log, archives=[tmp_path]) == []
        path = tmp_path / first.files[0]["name"]
        lines = gzip.open(path, "rt").read().splitlines()
        body = json.loads(lines[2])
        body["subject"] = "forged"
        lines[2] = json.dumps(body)
        _rewrite_file(path, lines)
        _recompute_manifest(first.manifest)
        await _refused(log, tmp_path, first.files[0]["name"], "log.archived")
    finally:
        await log.close()


async def test_an_archive_the_log_never_recorded_is_refused(
        sqlite_url: str, tmp_path: Path) -> None:
    """An archive of another log (whole and self-consistent) is not this log's history."""
    log = await seeded(sqlite_url)
    other = await seeded(sqlite_url.replace("events.db", "other.db"))
    try:
        made = await archive.archive(other, tmp_path / "other", upto_seq=10)
        assert made is not None
        problems = await replay_check(log, archives=[tmp_path / "other"])
        assert any("no log.archived event" in p for p in problems), problems
        with pytest.raises(archive.ArchiveError, match=r"no log\.archived event"):
            await archive.restore(log, [tmp_path / "other"])
    finally:
        await log.close()
        await other.close()


# ------------------------------------------------------------ malformed archives


async def _problems_of(log: EventLog, directory: Path) -> str:
    """replay --check's problems and restore's refusal, as one text (no raw exception)."""
    problems = await replay_check(log, archives=[directory])
    assert problems
    with pytest.raises(archive.ArchiveError) as caught:
        await archive.restore(log, [directory])
    assert await archive.restored_range(log) == (0, 0, 0)
    return "\n".join(problems) + "\n" + str(caught.value)


async def test_a_manifest_that_is_not_json_is_named(database_url: str, tmp_path: Path) -> None:
    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        result.manifest.write_text('{"format": "sunkd-archive/1", "from_seq": 1,\n  oops\n')
        said = await _problems_of(log, tmp_path)
        assert f"{result.manifest.name}: line 2" in said and "not JSON" in said, said
    finally:
        await log.close()


@pytest.mark.parametrize("files", [["a string"], [{"name": 7}], "nothing", [{}]])
async def test_a_manifest_of_the_wrong_shape_is_named(database_url: str, tmp_path: Path,
                                                      files: Any) -> None:
    log = await seeded(database_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        body = json.loads(result.manifest.read_text())
        body["files"] = files
        result.manifest.write_text(json.dumps(body))
        said = await _problems_of(log, tmp_path)
        assert result.manifest.name in said, said
    finally:
        await log.close()


async def test_a_file_name_that_leaves_the_archive_directory_is_refused(
        database_url: str, tmp_path: Path) -> None:
    log = await seeded(database_url)
    try:
        directory = tmp_path / "archive"
        result = await archive.archive(log, directory, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        body = json.loads(result.manifest.read_text())
        name = body["files"][0]["name"]
        (directory / name).rename(tmp_path / name)  # now outside the directory
        body["files"][0]["name"] = f"../{name}"
        result.manifest.write_text(json.dumps(body))
        said = await _problems_of(log, directory)
        assert f"../{name}" in said and "outside the archive directory" in said, said
    finally:
        await log.close()


async def test_an_over_long_line_is_refused_in_bounded_memory(
        sqlite_url: str, tmp_path: Path) -> None:
    """One 300 MiB line took 930 MB; lines are now read at most MAX_LINE_BYTES at a time."""
    import tracemalloc

    log = await seeded(sqlite_url)
    try:
        result = await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        assert result is not None
        name = result.files[0]["name"]
        path = tmp_path / name
        with gzip.open(path, "wb", compresslevel=1) as stream:
            stream.write(b'{"seq":1,"payload":"')
            chunk = b"x" * (1 << 20)
            for _ in range(100):  # 100 MiB on one line
                stream.write(chunk)
            stream.write(b'"}\n')
        tracemalloc.start()
        try:
            said = await _problems_of(log, tmp_path)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert f"{name}: line 1" in said and "longer than" in said, said
        assert peak < 80 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    finally:
        await log.close()


# ------------------------------------------------- appending to a chain in a directory


async def test_archive_refuses_to_append_to_a_chain_that_does_not_verify(
        database_url: str, tmp_path: Path) -> None:
    from sunkd.domain.events import SourceHealth

    log = await seeded(database_url)
    try:
        first = await archive.archive(log, tmp_path, upto_seq=SIZE)
        assert first is not None
        await log.append_unfenced([Event("slurm", SourceHealth(source="slurm", status="fresh"))
                                   for _ in range(2 * SIZE)])
        name = first.files[0]["name"]
        path = tmp_path / name
        lines = gzip.open(path, "rt").read().splitlines()
        lines[3] = lines[2]  # a seq lost in the files already there
        _rewrite_file(path, lines)
        live = await log.live_range()
        manifests_before = sorted(p.name for p in tmp_path.glob("manifest-*"))
        with pytest.raises(archive.ArchiveError) as caught:
            await archive.archive(log, tmp_path, upto_seq=await log.latest_seq() - 5)
        said = str(caught.value)
        assert "nothing was archived" in said and name in said and "seq 4 is missing" in said
        assert await log.live_range() == live
        assert sorted(p.name for p in tmp_path.glob("manifest-*")) == manifests_before
    finally:
        await log.close()


async def test_archive_refuses_a_gap_in_the_chain_of_its_directory(
        database_url: str, tmp_path: Path) -> None:
    from sunkd.domain.events import SourceHealth

    log = await seeded(database_url)
    try:
        assert await archive.archive(log, tmp_path / "a", upto_seq=SIZE) is not None
        await log.append_unfenced([Event("slurm", SourceHealth(source="slurm", status="fresh"))
                                   for _ in range(3 * SIZE)])
        middle = await archive.archive(log, tmp_path / "b", upto_seq=2 * SIZE)
        assert middle is not None and middle.from_seq == SIZE + 1
        with pytest.raises(archive.ArchiveError, match=f"ends at seq {SIZE}") as caught:
            await archive.archive(log, tmp_path / "a", upto_seq=await log.latest_seq() - 5)
        assert "nothing was archived" in str(caught.value)
        assert (await log.live_range() or (0, 0))[0] == middle.upto_seq + 1
    finally:
        await log.close()
