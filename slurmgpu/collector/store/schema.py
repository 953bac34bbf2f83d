"""The fleet database's schema: the migrations that build it (one list for both backends,
in SQLite's DDL that ``Dialect.ddl`` translates), and the checks that refuse a damaged
database before anything is written. Only this package reads and writes its tables.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurmgpu.collector.store.backend import (
    SQLITE,
    Connection,
    StoreError,
    describe,
    dialect_of,
    is_postgres,
)

__all__ = ["MIGRATIONS", "RECOVER", "SCHEMA_VERSION", "StoreError", "connect", "connect_postgres",
           "expected_tables", "schema_version"]

RECOVER = ("restore it from a backup, or move it aside to start an empty one "
           "(slurmgpu never wipes or rewrites a damaged database)")


def _script(db: Connection, script: str) -> None:
    """Run ``;``-separated DDL (SQLite's, see ``Dialect.ddl``) inside the caller's
    transaction (``executescript`` would COMMIT first)."""
    dialect = dialect_of(db)
    for statement in script.split(";"):
        if statement.strip():
            db.execute(dialect.ddl(statement))


# The DDL of each schema version, applied in order at open; the schema version is the
# number applied. Append only. What each one brought: docs/design-notes.md.
_DDL: tuple[str, ...] = (
    # 1: The first schema
    """
        CREATE TABLE nodes (
            node TEXT PRIMARY KEY,
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL,
            last_seq INTEGER NOT NULL DEFAULT 0,
            verdict TEXT,
            verdict_ts REAL,
            worst_check TEXT,
            worst_severity TEXT,
            worst_message TEXT,
            worst_gpu INTEGER,
            reachable INTEGER NOT NULL DEFAULT 1,
            unreachable_since REAL,
            agent_version TEXT
        );
        CREATE TABLE messages (
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            ts REAL NOT NULL,
            received_at REAL NOT NULL,
            PRIMARY KEY (node, seq)
        ) WITHOUT ROWID;
        CREATE TABLE reports (
            node TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            verdict TEXT NOT NULL,
            body BLOB NOT NULL
        );
        CREATE TABLE report_history (
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            verdict TEXT NOT NULL
        );
        CREATE INDEX report_history_node_ts ON report_history (node, ts);
        CREATE TABLE findings (
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            check_id TEXT NOT NULL,
            severity TEXT NOT NULL,
            gpu INTEGER,
            subject TEXT,
            message TEXT
        );
        CREATE INDEX findings_node_ts ON findings (node, ts);
        CREATE TABLE events (
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            gpu INTEGER,
            data INTEGER,
            verdict TEXT NOT NULL,
            body BLOB NOT NULL
        );
        CREATE INDEX events_ts ON events (ts);
        CREATE INDEX events_node_ts ON events (node, ts);
        CREATE TABLE command_results (
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            command_id TEXT NOT NULL,
            ok INTEGER NOT NULL,
            result BLOB NOT NULL
        );
        CREATE INDEX command_results_id ON command_results (command_id)
    """,
    # 2: The automation's decisions
    """
        CREATE TABLE decisions (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            node TEXT NOT NULL,
            action TEXT NOT NULL,
            reason TEXT,
            held INTEGER NOT NULL DEFAULT 0,
            dry_run INTEGER NOT NULL DEFAULT 0,
            trigger TEXT,
            result TEXT
        );
        CREATE INDEX decisions_node_time ON decisions (node, time)
    """,
    # 3: Checkpoint coordination
    """
        CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY,
            job_id TEXT NOT NULL,
            action TEXT NOT NULL,
            reason TEXT,
            trigger_node TEXT NOT NULL,
            nodes TEXT NOT NULL,
            "user" TEXT,
            requested REAL NOT NULL,
            deadline REAL NOT NULL,
            state TEXT NOT NULL,
            acked_at REAL,
            acked_by TEXT,
            closed REAL
        );
        CREATE INDEX checkpoints_job ON checkpoints (job_id);
        CREATE INDEX checkpoints_state ON checkpoints (state);
        CREATE TABLE pending_drains (
            node TEXT PRIMARY KEY,
            action TEXT NOT NULL,
            reason TEXT,
            trigger TEXT,
            since REAL NOT NULL,
            checkpoints TEXT NOT NULL
        );
        CREATE TABLE job_events (
            id INTEGER PRIMARY KEY,
            job_id TEXT NOT NULL,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            node TEXT,
            detail TEXT
        );
        CREATE INDEX job_events_job ON job_events (job_id, ts)
    """,
    # 4: History for the fleet report
    """
        CREATE TABLE node_states (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            reason TEXT,
            actor TEXT
        );
        CREATE INDEX node_states_ts ON node_states (ts);
        CREATE INDEX node_states_node_ts ON node_states (node, ts);
        CREATE TABLE node_samples (
            node TEXT NOT NULL,
            ts REAL NOT NULL,
            span_s REAL NOT NULL,
            reports INTEGER NOT NULL,
            fail_reports INTEGER NOT NULL,
            hw_slowdown_reports INTEGER NOT NULL,
            sw_thermal_reports INTEGER NOT NULL,
            PRIMARY KEY (node, ts)
        ) WITHOUT ROWID;
        CREATE INDEX node_samples_ts ON node_samples (ts);
        CREATE TABLE gpu_counters (
            node TEXT NOT NULL,
            gpu INTEGER NOT NULL,
            ts REAL NOT NULL,
            serial TEXT,
            model TEXT,
            ecc_corrected INTEGER,
            ecc_uncorrected INTEGER,
            remap_corrected INTEGER,
            remap_uncorrected INTEGER,
            remap_pending INTEGER,
            remap_failure INTEGER
        );
        CREATE INDEX gpu_counters_node_gpu_ts ON gpu_counters (node, gpu, ts);
        CREATE INDEX gpu_counters_ts ON gpu_counters (ts);
        CREATE TABLE ib_counters (
            node TEXT NOT NULL,
            port TEXT NOT NULL,
            ts REAL NOT NULL,
            state TEXT,
            rate_gbps REAL,
            symbol_error INTEGER,
            link_downed INTEGER,
            link_error_recovery INTEGER,
            port_rcv_errors INTEGER,
            local_link_integrity_errors INTEGER,
            excessive_buffer_overrun_errors INTEGER
        );
        CREATE INDEX ib_counters_node_port_ts ON ib_counters (node, port, ts);
        CREATE INDEX ib_counters_ts ON ib_counters (ts);
        CREATE TABLE node_versions (
            node TEXT NOT NULL,
            ts REAL NOT NULL,
            gpu_model TEXT,
            driver TEXT,
            cuda TEXT,
            nccl TEXT,
            vbios TEXT,
            ib_firmware TEXT,
            ofed TEXT,
            kernel TEXT
        );
        CREATE INDEX node_versions_node_ts ON node_versions (node, ts)
    """,
    # 5: deduplication per (node, epoch, seq), with the body's digest
    """
        CREATE TABLE messages_new (
            node TEXT NOT NULL,
            epoch TEXT NOT NULL DEFAULT '',
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            ts REAL NOT NULL,
            received_at REAL NOT NULL,
            digest BLOB,
            PRIMARY KEY (node, epoch, seq)
        ) WITHOUT ROWID;
        INSERT INTO messages_new (node, epoch, seq, type, ts, received_at)
            SELECT node, '', seq, type, ts, received_at FROM messages;
        DROP TABLE messages;
        ALTER TABLE messages_new RENAME TO messages
    """,
    # 6: who drained a node
    "ALTER TABLE node_states ADD COLUMN drained_by TEXT",
    # 7: The automation's state
    """
        CREATE TABLE automation_state (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL,
            fleet INTEGER NOT NULL DEFAULT 0,
            breaker_open INTEGER NOT NULL DEFAULT 0,
            breaker_since REAL,
            breaker_why TEXT
        );
        CREATE TABLE automation_seen (node TEXT PRIMARY KEY);
        CREATE TABLE automation_strikes (
            node TEXT NOT NULL,
            check_id TEXT NOT NULL,
            strikes INTEGER NOT NULL,
            PRIMARY KEY (node, check_id)
        ) WITHOUT ROWID;
        CREATE TABLE automation_healthy (
            node TEXT PRIMARY KEY,
            reports INTEGER NOT NULL,
            first REAL NOT NULL
        );
        CREATE TABLE automation_drained (
            node TEXT PRIMARY KEY,
            time REAL,
            trigger TEXT,
            reason TEXT,
            then_action TEXT
        );
        CREATE TABLE automation_drain_history (
            node TEXT NOT NULL,
            ts REAL NOT NULL,
            drains INTEGER NOT NULL,
            PRIMARY KEY (node, ts)
        ) WITHOUT ROWID;
        CREATE TABLE automation_drain_times (ts REAL PRIMARY KEY, drains INTEGER NOT NULL);
        CREATE TABLE automation_failing (
            check_id TEXT NOT NULL,
            node TEXT NOT NULL,
            time REAL NOT NULL,
            PRIMARY KEY (check_id, node)
        ) WITHOUT ROWID;
        CREATE TABLE automation_held (
            node TEXT PRIMARY KEY,
            action TEXT,
            reason TEXT,
            trigger TEXT,
            time REAL,
            since REAL,
            then_action TEXT,
            checkpoints INTEGER
        );
        CREATE TABLE automation_released (
            node TEXT PRIMARY KEY,
            action TEXT,
            reason TEXT,
            trigger TEXT,
            time REAL,
            since REAL,
            then_action TEXT,
            checkpoints INTEGER,
            released_at REAL,
            released_by TEXT
        );
        CREATE TABLE automation_lemons (node TEXT PRIMARY KEY, since REAL, why TEXT);
        CREATE TABLE automation_log (
            id INTEGER PRIMARY KEY,
            time REAL,
            node TEXT,
            action TEXT,
            reason TEXT,
            held INTEGER,
            dry_run INTEGER,
            trigger TEXT,
            result TEXT,
            released_by TEXT
        )
    """,
    # 8: Several collectors on one PostgreSQL database
    """
        CREATE TABLE leader_inbox (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            received_at REAL NOT NULL,
            body BLOB NOT NULL
        );
        CREATE TABLE command_outbox (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            command_id TEXT NOT NULL,
            command TEXT NOT NULL,
            args BLOB NOT NULL,
            created REAL NOT NULL,
            sent_at REAL,
            sent_by TEXT
        );
        CREATE INDEX command_outbox_unsent ON command_outbox (sent_at, node)
    """,
    # 9: Reports without facts
    """
        ALTER TABLE reports ADD COLUMN facts BLOB;
        ALTER TABLE reports ADD COLUMN facts_ts REAL;
        ALTER TABLE reports ADD COLUMN epoch TEXT;
        ALTER TABLE nodes ADD COLUMN verdict_epoch TEXT;
        ALTER TABLE nodes ADD COLUMN verdict_seq INTEGER
    """,
    # 10: an index for each node's latest state change
    "CREATE INDEX IF NOT EXISTS report_history_node_seq_ts ON report_history (node, seq, ts)",
    # 11: history_version (unused since)
    """
        CREATE TABLE history_version (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL
        );
        INSERT INTO history_version (id, version) VALUES (1, 0)
    """,
    # 12: node_version and the nodes' change marks (unused since)
    """
        CREATE TABLE node_version (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL
        );
        INSERT INTO node_version (id, version) VALUES (1, 0);
        ALTER TABLE nodes ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE nodes ADD COLUMN history_changed INTEGER NOT NULL DEFAULT 0
    """,
    # 13: a node's last facts in a table of their own
    """
        CREATE TABLE node_facts (
            node TEXT PRIMARY KEY,
            facts BLOB NOT NULL,
            facts_ts REAL NOT NULL,
            epoch TEXT,
            seq INTEGER NOT NULL
        );
        INSERT INTO node_facts (node, facts, facts_ts, epoch, seq)
            SELECT node, facts, facts_ts, epoch, seq FROM reports
            WHERE facts IS NOT NULL AND facts_ts IS NOT NULL;
        ALTER TABLE reports DROP COLUMN facts;
        ALTER TABLE reports DROP COLUMN facts_ts
    """,
    # 14: Return to service
    """
        CREATE TABLE IF NOT EXISTS validations (
            node TEXT NOT NULL,
            started REAL NOT NULL,
            trigger TEXT NOT NULL,
            tier TEXT NOT NULL,
            verdict TEXT,
            duration_s REAL,
            reservation TEXT,
            job_id TEXT,
            outcome TEXT,
            PRIMARY KEY (node, started)
        );
        CREATE INDEX IF NOT EXISTS validations_started ON validations (started);
        CREATE TABLE IF NOT EXISTS drain_outcomes (
            node TEXT NOT NULL,
            drained_at REAL NOT NULL,
            check_id TEXT NOT NULL,
            gpu_model TEXT,
            outcome TEXT NOT NULL,
            resolved_at REAL,
            returned_by TEXT,
            PRIMARY KEY (node, drained_at, check_id)
        );
        CREATE INDEX IF NOT EXISTS drain_outcomes_drained_at ON drain_outcomes (drained_at);
        CREATE TABLE IF NOT EXISTS remediation_ladders (
            node TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            updated REAL NOT NULL
        )
    """,
)
MIGRATIONS: list[Callable[[Connection], None]] = [
    functools.partial(_script, script=ddl) for ddl in _DDL]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: Connection) -> int:
    row = db.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def _fresh_tables() -> dict[str, bool]:
    """Each table of a fully migrated database (the migrations run on an in-memory one),
    and whether the migrations themselves put rows in it (a counter's one row)."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for migration in MIGRATIONS:
            migration(db)
        return {t: bool(db.execute(f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone()[0])
                for t in SQLITE.tables(db)}
    finally:
        db.close()


@functools.cache
def expected_tables() -> frozenset[str]:
    return frozenset(_fresh_tables())


@functools.cache
def seeded_tables() -> frozenset[str]:
    """The tables a fresh database holds rows in (and no others)."""
    return frozenset(t for t, seeded in _fresh_tables().items() if seeded)


def connect(target: str | Path, timeout_s: float) -> Connection:
    """Open the database (a path: SQLite; a ``postgresql://`` URL: PostgreSQL), refuse a
    damaged one (StoreError, one line naming it and what to do) and migrate an older one."""
    if not is_postgres(target):
        return _connect_sqlite(Path(target), timeout_s)
    try:
        db = connect_postgres(str(target), timeout_s)
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from None
    return _ready(db, target, "")


def connect_postgres(url: str, timeout_s: float, params: Mapping[str, Any] | None = None) -> Connection:
    """A plain connection to a PostgreSQL database (no checks, no migration; ``params``:
    more libpq parameters): StoreError when psycopg is not installed,
    sqlite3.OperationalError when the server cannot be reached."""
    try:
        from slurmgpu.collector.store.postgres import connect as pg_connect
    except ImportError as exc:
        raise StoreError(f"{describe(url)}: PostgreSQL needs psycopg 3 ({exc}); "
                         "pip install 'slurmgpu[postgres]'") from None
    return pg_connect(url, timeout_s, params)


def _connect_sqlite(path: Path, timeout_s: float) -> Connection:
    """SQLite: WAL, ``synchronous=NORMAL``; an empty or corrupt file is refused, and so is
    one that cannot be opened or written here (said so, in one line)."""
    memory = str(path) == ":memory:"
    try:
        if not memory:
            path.parent.mkdir(parents=True, exist_ok=True)
            _refuse_empty_file(path)
            _refuse_unwritable(path)
        db = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StoreError(f"{path}: cannot open the database ({reason}); [collector] db must name a "
                         "file in a directory this user can write") from None

    def pragmas() -> None:
        db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        if not memory:
            _check_integrity(db, path)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = OFF")

    return _ready(db, path, f"; {RECOVER}", pragmas)


def _ready(db: Connection, where: str | Path, advice: str,
           prepare: Callable[[], None] | None = None) -> Connection:
    """``db`` set up (``prepare``), migrated and checked; else closed, and a StoreError
    (one line naming the database, and ``advice``)."""
    try:
        if prepare is not None:
            prepare()
        _migrate(db, where)
        _check_schema(db, where)
    except sqlite3.DatabaseError as exc:  # not a database, or corrupt beyond the checks
        db.close()
        raise StoreError(f"{describe(where)}: not a usable database ({exc}){advice}") from None
    except BaseException:
        db.close()
        raise
    return db


def _refuse_empty_file(path: Path) -> None:
    """A 0-byte file where the database should be is damage (a failed copy, a full disk),
    not a fresh start: refuse it instead of silently initialising over it."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return  # a new database: created by the migrations
    if size == 0:
        raise StoreError(f"{path}: the database file is empty (0 bytes); {RECOVER}")


def _refuse_unwritable(path: Path) -> None:
    """The collector writes the database and its -wal and -shm files beside it: a file or
    directory it cannot write is said to be so (a good database on a read-only mount is
    no damage to restore from a backup)."""
    for target in (path, path.parent):
        if target.exists() and not os.access(target, os.W_OK):
            why = ("on a read-only filesystem" if os.statvfs(target).f_flag & os.ST_RDONLY
                   else f"not writable by uid {os.getuid()}")
            raise StoreError(f"{target}: the fleet database cannot be written here ({why}); the collector "
                             "writes it and the -wal and -shm files beside it: mount it read-write, or "
                             "let this user write the file and its directory")


def _check_integrity(db: sqlite3.Connection, path: Path) -> None:
    """``PRAGMA quick_check`` before anything is written: a corrupt file is refused with
    one line, never written to, never wiped."""
    try:
        problems = [str(row[0]) for row in db.execute("PRAGMA quick_check(5)")]
    except UnicodeDecodeError:  # a damaged schema page: SQLite's own error text is not UTF-8
        problems = ["the schema is damaged (unreadable text)"]
    if problems != ["ok"]:
        found = "; ".join(problems).replace("\n", "; ")  # (one row may hold several lines)
        raise StoreError(f"{path}: integrity check failed ({found[:300]}); {RECOVER}")


def _check_schema(db: Connection, where: str | Path) -> None:
    """Every table the migrations make is there (a dropped table used to give a collector
    that stayed up, stored nothing and acked nothing)."""
    missing = sorted(expected_tables() - dialect_of(db).tables(db))
    if missing:
        raise StoreError(f"{describe(where)}: schema version {schema_version(db)} but table(s) "
                         f"{', '.join(missing)} missing; {RECOVER}")


def _migrate(db: Connection, where: str | Path) -> None:
    dialect = dialect_of(db)
    if "schema_version" in dialect.tables(db) and schema_version(db) == SCHEMA_VERSION:
        return  # up to date: no write transaction (readers never block the collector)
    dialect.begin_write(db)  # (two collectors starting at once: the second waits, then sees it done)
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        current = schema_version(db)
        if current > SCHEMA_VERSION:
            raise StoreError(f"{describe(where)}: schema version {current} is newer than this "
                             f"slurmgpu understands ({SCHEMA_VERSION})")
        if current == 0:
            db.execute("DELETE FROM schema_version")
            db.execute("INSERT INTO schema_version (version) VALUES (0)")
        for number in range(current, SCHEMA_VERSION):
            MIGRATIONS[number](db)
            db.execute("UPDATE schema_version SET version = ?", (number + 1,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
