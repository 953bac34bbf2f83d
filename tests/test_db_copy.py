"""`slurmgpu db copy` (issue 15 part 2): a SQLite fleet database carried into PostgreSQL.
What must hold: the copy answers every reader as the file did (`fleet`, `report`), every
table comes over (one a later migration adds too), the collector can write on after it
(identity sequences past the copied ids), a destination with rows is refused with
nothing changed, a failed copy writes nothing, the source is never written, and every
bad input is one line and exit 3."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from slurmgpu.cli import cli
from slurmgpu.collector.store import Store, queries, schema
from slurmgpu.collector.store import copy as dbcopy
from slurmgpu.collector.store.backend import dialect_of
from slurmgpu.sim.seed import seed

pytestmark = pytest.mark.postgresql

END = 1_780_000_000.0


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded fleet in a SQLite file (read, never written, by the tests that copy it)."""
    path = tmp_path_factory.mktemp("copy") / "fleet.db"
    seed(path, nodes=30, days=4, end=END, seed=5)
    store = Store(path)
    try:  # the tables the seeder leaves empty, so that every kind of row comes over
        with store.transaction() as db:
            db.execute("INSERT INTO messages (node, epoch, seq, type, ts, received_at, digest) "
                       "VALUES ('gpu-a100-001', 'e1', 7, 'report', 1, 2, ?)", (b"\x00\xff digest",))
            db.execute("INSERT INTO command_results (node, seq, ts, command_id, ok, result) "
                       "VALUES ('gpu-a100-001', 8, 3, 'c1', 1, ?)", (b"\x81\xa2ok\xc3",))
            db.execute("INSERT INTO automation_log (id, time, node, action) VALUES (41, 5, 'n', 'drain')")
    finally:
        store.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def copy(source: Path | str, url: str, *more: str) -> Result:
    return run("db", "copy", "--from", str(source), "--to", url, *more)


def one_error_line(result: Result, *parts: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurmgpu: error: "), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def tables(target: str | Path) -> dict[str, int]:
    """Every table's row count (the schema's version table left out)."""
    with queries.snapshot(target) as db:
        names = sorted(dialect_of(db).tables(db) - {"schema_version"})
        return {t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in names}


# --------------------------------------------------------------------------- the copy


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def readers(target: str | Path, config: Path) -> list[Any]:
    """What `slurmgpu report --json` and `slurmgpu fleet --json` say about ``target``."""
    report = run("report", "--db", str(target), "--config", str(config), "--format", "json",
                 "--from", iso(END - 3 * 86400), "--to", iso(END), "--now", iso(END))
    fleet = run("fleet", "--db", str(target), "--config", str(config), "--json")
    assert report.exit_code == 0 and fleet.exit_code == 0, report.stderr + fleet.stderr
    model, nodes = json.loads(report.stdout), json.loads(fleet.stdout)
    model.pop("source")
    for node in nodes["nodes"]:
        node.pop("last_seen_age_s")  # (now - last_seen: the clock moved between the runs)
    return [model, nodes]


def test_the_copy_answers_every_reader_as_the_file_did(seeded: Path, pg_url: str, tmp_path: Path) -> None:
    before = digest(seeded)
    result = copy(seeded, pg_url, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["replaced"] is False and "***" not in document["destination"]
    counts = tables(seeded)
    assert set(document["tables"]) == set(counts) == schema.expected_tables() - {"schema_version"}
    assert {t: c["source"] for t, c in document["tables"].items()} == counts
    assert {t: c["destination"] for t, c in document["tables"].items()} == counts == tables(pg_url)
    assert document["rows"] == sum(counts.values()) > 3000 and document["schema_version"] == schema.SCHEMA_VERSION
    assert counts["messages"] == counts["command_results"] == 1 and counts["node_samples"] > 2000
    assert "node_samples" in result.stderr  # (the progress, a line per table)
    assert digest(seeded) == before  # only read

    config = tmp_path / "slurmgpu.toml"
    config.write_text("")
    ours, theirs = readers(seeded, config), readers(pg_url, config)
    assert ours == theirs and len(ours[1]["nodes"]) == 30 and ours[0]["summary"]["nodes"] == 30
    with queries.snapshot(pg_url) as db:  # the bytes, as they were
        assert db.execute("SELECT digest FROM messages").fetchone()[0] == b"\x00\xff digest"
        assert db.execute("SELECT result FROM command_results").fetchone()[0] == b"\x81\xa2ok\xc3"


def test_the_collector_writes_on_after_the_copy(seeded: Path, pg_url: str) -> None:
    """Ids kept as they were; each identity sequence moved past the largest copied id."""
    assert copy(seeded, pg_url).exit_code == 0
    store = Store(pg_url)
    try:
        last = {t: store.db.execute(f"SELECT max(id) FROM {t}").fetchone()[0]
                for t in ("decisions", "job_events", "checkpoints", "node_states", "automation_log")}
        assert last["automation_log"] == 41 and all(last.values())
        with store.transaction():
            store.add_job_event("9001", END + 1, "detected")
            checkpoint = store.add_checkpoint({"job_id": "9001", "action": "drain", "trigger_node": "n",
                                               "nodes": ["n"], "requested": END + 1, "deadline": END + 60})
            store.db.execute("INSERT INTO automation_log (time, node, action) VALUES (?, 'n', 'drain')",
                             (END + 1,))
        assert store.add_decisions([_Decision()]) == 1
        assert checkpoint == last["checkpoints"] + 1
        for table in ("decisions", "job_events", "automation_log"):
            assert store.db.execute(f"SELECT max(id) FROM {table}").fetchone()[0] == last[table] + 1
    finally:
        store.close()


class _Decision:
    time, node, action, reason, held, dry_run, trigger, result = END + 2, "n", "drain", "x", False, False, "t", "ok"


def test_a_destination_with_rows_is_refused_and_left_as_it_was(seeded: Path, pg_url: str) -> None:
    assert copy(seeded, pg_url).exit_code == 0
    store = Store(pg_url)
    try:
        store.add_decisions([_Decision()])
    finally:
        store.close()
    counts = tables(pg_url)
    again = copy(seeded, pg_url)
    assert again.exit_code == 4 and again.stdout == ""
    one_error_line(again, "already holds rows (in ", "decisions", "--replace")
    assert tables(pg_url) == counts  # nothing merged, nothing duplicated

    replaced = copy(seeded, pg_url, "--replace", "--json")
    assert replaced.exit_code == 0, replaced.stderr
    assert json.loads(replaced.stdout)["replaced"] is True and tables(pg_url) == tables(seeded)


def test_a_failed_copy_writes_nothing(tmp_path: Path, pg_url: str) -> None:
    """A value PostgreSQL will not take (SQLite keeps text in a REAL column): one line, exit
    3, and every table of the destination empty (the rows copied before it rolled back)."""
    path = tmp_path / "fleet.db"
    seed(path, nodes=5, days=1, end=END, seed=2)
    store = Store(path)
    try:
        store.db.execute("UPDATE reports SET ts = 'yesterday' WHERE node = (SELECT min(node) FROM reports)")
    finally:
        store.close()
    result = copy(path, pg_url)
    assert result.exit_code == 3
    one_error_line(result, "copy failed, nothing was written to")
    # (the current schema, empty: as a collector makes it; the migrations' own rows only)
    assert {t: n for t, n in tables(pg_url).items() if n} == {t: 1 for t in schema.seeded_tables()}
    assert copy(path, pg_url).exit_code == 3  # and it can be tried again


def test_a_table_added_by_a_later_migration_is_copied_too(tmp_path: Path, pg_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def migration_next(db: Any) -> None:
        schema._script(db, "CREATE TABLE gadgets (id INTEGER PRIMARY KEY, node TEXT NOT NULL, "
                           "blob BLOB, weight REAL); CREATE INDEX gadgets_node ON gadgets (node)")

    migrations = [*schema.MIGRATIONS, migration_next]
    monkeypatch.setattr(schema, "MIGRATIONS", migrations)
    for module in (schema, dbcopy):
        monkeypatch.setattr(module, "SCHEMA_VERSION", len(migrations))
    schema.expected_tables.cache_clear()
    try:
        path = tmp_path / "fleet.db"
        seed(path, nodes=3, days=1, end=END, seed=1)
        store = Store(path)
        try:
            store.db.executemany("INSERT INTO gadgets (id, node, blob, weight) VALUES (?, ?, ?, ?)",
                                 [(10, "a", b"\x01", 1.5), (12, "b", None, None)])
        finally:
            store.close()
        result = copy(path, pg_url, "--json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["tables"]["gadgets"] == {"source": 2, "destination": 2,
                                                                  "seconds": pytest.approx(0, abs=5)}
        store = Store(pg_url)
        try:
            new = store.db.execute("INSERT INTO gadgets (node) VALUES ('c') RETURNING id").fetchone()[0]
            assert new == 13
            assert store.db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'gadgets_node'").fetchone()
        finally:
            store.close()
    finally:
        schema.expected_tables.cache_clear()


# --------------------------------------------------------------------------- the source


def test_a_source_in_use_is_refused(seeded: Path, tmp_path: Path, pg_url: str) -> None:
    """A collector running on the file keeps a non-empty WAL beside it."""
    path = tmp_path / "fleet.db"
    path.write_bytes(seeded.read_bytes())
    store = Store(path)
    try:
        store.add_decisions([_Decision()])
        result = copy(path, pg_url)
        assert result.exit_code == 3
        one_error_line(result, "in use (fleet.db-wal holds", "stop the collector first")
    finally:
        store.close()  # (a clean stop folds the WAL into the file)
    assert copy(path, pg_url).exit_code == 0


def test_an_older_source_is_migrated_only_when_asked(tmp_path: Path, pg_url: str) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (4)")
    for migration in schema.MIGRATIONS[:4]:
        migration(db)
    db.execute("INSERT INTO decisions (id, time, node, action) VALUES (5, 1, 'n', 'drain')")
    db.close()
    refused = copy(path, pg_url)
    assert refused.exit_code == 3
    one_error_line(refused, "schema version 4, this slurmgpu's is", "--migrate-source")
    result = copy(path, pg_url, "--migrate-source", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["tables"]["decisions"]["destination"] == 1
    assert tables(path) == tables(pg_url)


def test_a_newer_source_is_refused(tmp_path: Path, pg_url: str, seeded: Path) -> None:
    path = tmp_path / "new.db"
    path.write_bytes(seeded.read_bytes())
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE schema_version SET version = version + 1")
    db.close()
    result = copy(path, pg_url)
    assert result.exit_code == 3
    one_error_line(result, "is newer than this slurmgpu understands")


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_3(tmp_path: Path, seeded: Path, pg_url: str) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database, really" * 100)
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    cases: list[tuple[tuple[Path | str, str], list[str]]] = [
        ((tmp_path / "none.db", pg_url), ["none.db: no such file"]),
        ((seeded, str(tmp_path / "x.db")), ["the destination must be a postgresql:// URL"]),
        ((pg_url, pg_url), ["the source must be a SQLite file"]),
        ((garbage, pg_url), ["garbage.db: not a usable SQLite database"]),
        ((foreign, pg_url), ["foreign.db: not a slurmgpu fleet database"]),
        ((seeded, "postgresql://u:secret@[nope/x"), ["not a valid PostgreSQL URL", "u:***@"]),
        ((seeded, "postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2"), ["cannot connect", "u:***@"]),
    ]
    for (source, url), parts in cases:
        result = copy(source, url)
        assert result.exit_code == 3, (source, url, result.output)
        one_error_line(result, *parts)
        assert "secret" not in result.output
    usage = run("db", "copy", "--to", pg_url)
    assert usage.exit_code == 3 and "Missing option '--from'" in usage.stderr


def test_without_psycopg_the_line_says_what_to_install(seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "slurmgpu.collector.store.postgres", None)
    result = copy(seeded, "postgresql:///fleet")
    assert result.exit_code == 3
    one_error_line(result, "pip install 'slurmgpu[postgres]'")

