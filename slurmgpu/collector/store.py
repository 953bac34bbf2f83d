"""The collector's SQLite store.

One database file (WAL, ``synchronous=NORMAL``): a crash may lose the last
transactions that were committed but not yet checkpointed by the OS, never corrupt
the file; the collector acknowledges a message only after its batch commits.

The schema is versioned: ``schema_version`` holds the number of migrations applied
and ``MIGRATIONS`` (in order) brings any older file up to date at open.

Throughput: ``store_batch`` writes a whole batch (hundreds to thousands of messages)
in one transaction with ``executemany``; the latest report and the node row are
written once per node per batch, not once per message. The latest report's body is
the body bytes as received (sliced out of the frame when the caller passes it), not
re-packed.

History keeps changes, not repetitions: a report whose verdict and non-OK findings
(check, severity, gpu, subject, message) equal the previous report's from that node
adds no ``report_history``/``findings`` rows; it is still deduplicated (``messages``),
acked, and it still refreshes the node row and the latest report. So
``report_history`` holds one row per change of a node's state (plus one for the first
report each node sends after the collector starts), which is what trend views want;
``messages`` has one row per stored message. Events are always recorded in full.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from slurmgpu.collector.history import History, Rows
from slurmgpu.decision import REASON_PREFIX, reason_actor
from slurmgpu.errors import SlurmGpuError
from slurmgpu.result import Severity
from slurmgpu.slurm.cli import sanitize_reason
from slurmgpu.wire import COMMAND_RESULT, EVENT, HEARTBEAT, HELLO, REPORT, Envelope, raw_body

# Severity names as the wire carries them, ranked as slurmgpu.result does (others: UNKNOWN).
_RANK = {s.name: s.rank for s in Severity}
_OK, _UNKNOWN = Severity.OK.name, Severity.UNKNOWN.name
_STORED = frozenset({HELLO, REPORT, EVENT, COMMAND_RESULT})
_MAX_TEXT = 1024

# A batch item: (node, message) or (node, message, frame) where ``frame`` is the
# bytes ``message`` was decoded from (lets the store keep the body without re-packing).
BatchItem = tuple[str, Envelope] | tuple[str, Envelope, bytes]
# What a message is deduplicated by: (node, epoch, seq).
MessageKey = tuple[str, str, int]
# A message's body as stored (msgpack bytes) and its digest.
_Body = tuple[bytes, bytes]
# In-memory high-water marks kept at most (one per node and spool epoch); past this the
# map is dropped and rebuilt lazily, so a node inventing epochs cannot grow it.
MAX_HIGH_WATER = 100_000
# A drain decision of the automation may be stamped this much after the poll that saw the
# drain (the same clock; only a bound for the lookup, see Store.drain_actor).
DECISION_SLACK_S = 60.0
# A report's state for the history: (verdict, its non-OK findings' rows).
_State = tuple[str, tuple[tuple[Any, ...], ...]]


def _script(db: sqlite3.Connection, script: str) -> None:
    """Run ``;``-separated DDL inside the caller's transaction (``executescript`` would
    COMMIT first)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _migration_1(db: sqlite3.Connection) -> None:
    _script(db, """
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
    """)


def _migration_2(db: sqlite3.Connection) -> None:
    """The automation's decisions (``slurmgpu.collector.policy.Decision``)."""
    _script(db, """
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
    """)


def _migration_3(db: sqlite3.Connection) -> None:
    """Checkpoint coordination (``slurmgpu.collector.checkpoint``): one row per request
    to a job, the nodes waiting for their jobs before they drain, and every job's
    timeline (detected, signalled, delivered, acked, drained, requeued...)."""
    _script(db, """
        CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY,
            job_id TEXT NOT NULL,
            action TEXT NOT NULL,
            reason TEXT,
            trigger_node TEXT NOT NULL,
            nodes TEXT NOT NULL,
            user TEXT,
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
    """)


def _migration_4(db: sqlite3.Connection) -> None:
    """History for the fleet report (``slurmgpu report``): node state transitions (drained /
    resumed from Slurm, unreachable / reachable from the collector), hourly per-node
    samples (reports, throttled reports), and GPU error counters, IB port counters and
    software versions, each stored when it changes. See docs/fleet-db.md."""
    _script(db, """
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
    """)


def _migration_5(db: sqlite3.Connection) -> None:
    """Deduplication per (node, epoch, seq): a reinstalled agent (new spool, seq back at
    1) is a new epoch, not a replay. Rows from before have epoch '' (what epoch-less
    agents send). ``digest`` (of the body) tells a resend from a different message that
    reuses a seq; NULL for rows from before."""
    _script(db, """
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
    """)


def _migration_6(db: sqlite3.Connection) -> None:
    """Who drained a node, recorded by the collector when its Slurm poll sees the drain
    (``node_states.drained_by``, see ``drain_actor``). Rows from before stay NULL: the
    fleet report guesses those as it always did."""
    _script(db, "ALTER TABLE node_states ADD COLUMN drained_by TEXT")


# Applied in order at open; the schema version is the number applied. Append only.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migration_1, _migration_2, _migration_3,
                                                          _migration_4, _migration_5, _migration_6]
SCHEMA_VERSION = len(MIGRATIONS)


def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    """A query's rows as {column: value} dicts."""
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")


class StoreError(SlurmGpuError):
    """The database is newer than this slurmgpu, or unusable."""


_RECOVER = ("restore it from a backup, or move it aside to start an empty one "
            "(slurmgpu never wipes or rewrites a damaged database)")


def _refuse_empty_file(path: Path) -> None:
    """A 0-byte file where the database should be is damage (a failed copy, a full disk),
    not a fresh start: refuse it instead of silently initialising over it."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return  # a new database: created by the migrations
    if size == 0:
        raise StoreError(f"{path}: the database file is empty (0 bytes); {_RECOVER}")


@functools.cache
def _expected_tables() -> frozenset[str]:
    """The tables a fully migrated database has (the migrations run on an in-memory one)."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for migration in MIGRATIONS:
            migration(db)
        return frozenset(str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                         if not str(r[0]).startswith("sqlite_"))
    finally:
        db.close()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:_MAX_TEXT]


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63):
        return value
    return None


def _same_reason(decided: str, polled: str) -> bool:
    """The automation's decision reason (``polled`` plus, at times, a note such as
    `` (waiting for 2 job checkpoint(s))``) is the one Slurm shows: Slurm got it
    sanitised (one line, cut at 256 characters with "…") and may have appended
    `` : reboot issued``."""
    shown = " ".join(polled.split()).removesuffix(" : reboot issued").removesuffix("…").rstrip()
    return bool(shown) and sanitize_reason(decided, max_len=1 << 20).startswith(shown)


def _digest(body: bytes) -> bytes:
    """What tells a resend (same body bytes) from another message under the same key.
    (SHA-256, cut to 8 bytes: ~10 us for a 14 KB report body, half of BLAKE2b's time
    where the CPU has SHA instructions; a node cannot hide a reused seq behind a
    collision.)"""
    return hashlib.sha256(body).digest()[:8]


@dataclass(frozen=True)
class Conflict:
    """A message dropped as a duplicate although its body differs from the stored one
    (or from another copy in the same batch): a seq reused within one epoch."""

    node: str
    epoch: str
    seq: int
    type: str


def _body_bytes(item: BatchItem) -> bytes:
    """The packed body: sliced from the frame when the item carries it, else re-packed."""
    if len(item) > 2:
        data = raw_body(item[2])
        if data is not None:
            return data
    packed: bytes = msgpack.packb(item[1].body, use_bin_type=True)
    return packed


class Store:
    """The fleet database. Not thread-safe: one owner (the collector loop)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 10.0,
                 sample_interval_s: float = 3600.0) -> None:
        self.path = Path(path)
        self.history = History(sample_interval_s)
        self._unreachable: set[str] | None = None  # nodes marked unreachable (loaded lazily)
        # node -> (drained, reason) as last recorded in node_states (loaded lazily)
        self._slurm_state: dict[str, tuple[bool, str | None]] | None = None
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _refuse_empty_file(self.path)
        # (node, epoch) -> largest stored seq, loaded per key on first sight
        self._high: dict[tuple[str, str], int] = {}
        # Duplicates whose body differed, found by the last ``store_batch`` call.
        self.conflicts: list[Conflict] = []
        # node -> state of the last report written to report_history (this process)
        self._last_state: dict[str, _State] = {}
        self.db = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None,
                                  check_same_thread=False)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            self._check_integrity()
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
            self.db.execute("PRAGMA foreign_keys = OFF")
            self._migrate()
            self._check_schema()
        except sqlite3.DatabaseError as exc:  # not a database, or corrupt beyond the check
            self.db.close()
            raise StoreError(f"{self.path}: not a usable database ({exc}); {_RECOVER}") from None
        except StoreError:
            self.db.close()
            raise

    # ------------------------------------------------------------------ schema

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` before anything is written: a corrupt file is refused
        with one line, never written to, never wiped."""
        if str(self.path) == ":memory:":
            return
        problems = [str(row[0]) for row in self.db.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: integrity check failed ({'; '.join(problems)[:300]}); {_RECOVER}")

    def _check_schema(self) -> None:
        """Every table the migrations make is there (a dropped table used to give a
        collector that stayed up, stored nothing and acked nothing)."""
        have = {str(r[0]) for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted(_expected_tables() - have)
        if missing:
            raise StoreError(f"{self.path}: schema version {self.schema_version()} but table(s) "
                             f"{', '.join(missing)} missing; {_RECOVER}")

    def schema_version(self) -> int:
        row = self.db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        has_table = self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                    "name = 'schema_version'").fetchone()
        if has_table and self.schema_version() == SCHEMA_VERSION:
            return  # up to date: no write transaction (readers never block the collector)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise StoreError(f"{self.path}: schema version {current} is newer than this "
                                 f"slurmgpu understands ({SCHEMA_VERSION})")
            if current == 0:
                self.db.execute("DELETE FROM schema_version")
                self.db.execute("INSERT INTO schema_version (version) VALUES (0)")
            for number in range(current, SCHEMA_VERSION):
                MIGRATIONS[number](self.db)
                self.db.execute("UPDATE schema_version SET version = ?", (number + 1,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Write the partial hourly samples, then close."""
        rows = Rows()
        self.history.flush(time.time(), rows)
        if rows.samples and str(self.path) != ":memory:":
            try:
                with self.transaction():
                    rows.write(self.db)
            except sqlite3.Error:
                pass  # read-only or gone: the partial hour is lost, nothing else
        self.db.close()

    # ------------------------------------------------------------------ writes

    def store_batch(self, batch: Sequence[BatchItem], *,
                    received_at: float | None = None) -> list[tuple[str, int]]:
        """Store a batch of validated messages in one transaction.

        Heartbeats only refresh ``nodes.last_seen``. Acked types (hello, report,
        event, command-result) are stored once per (node, seq); the return value is
        the (node, seq) pairs newly stored by this call (duplicates are left out).
        An item may carry the frame its message was decoded from (see ``BatchItem``).
        """
        self.conflicts = []
        if not batch:
            return []
        now = time.time() if received_at is None else received_at
        touched, candidates, bodies = self._candidates(batch)
        db = self.db
        states: dict[str, _State] = {}
        db.execute("BEGIN IMMEDIATE")
        try:
            existing = self._existing(list(candidates)) if candidates else {}
            new = [(key, item) for key, item in candidates.items() if key not in existing]
            self._check_duplicates(existing, candidates, bodies)
            self._write(new, bodies, touched, now, states)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._forget_uncommitted(touched)
            raise
        self._last_state.update(states)  # only what is committed
        high = self._high
        for node, epoch, seq in (key for key, _ in new):
            # (only marks loaded from the database are raised: one missing because the map
            # was dropped mid-batch is loaded again on next use, never guessed low)
            if seq > high.get((node, epoch), seq):
                high[(node, epoch)] = seq
        return [(node, seq) for (node, _epoch, seq), _ in new]

    def _candidates(self, batch: Sequence[BatchItem]) -> tuple[
            set[str], dict[MessageKey, BatchItem], dict[MessageKey, _Body]]:
        """The nodes heard from; the acked messages deduplicated within the batch (an
        agent may resend before the ack arrives), with their packed bodies and digests.
        A copy whose body differs from the first is a conflict."""
        candidates: dict[MessageKey, BatchItem] = {}
        bodies: dict[MessageKey, _Body] = {}
        touched: set[str] = set()
        for item in batch:
            node, env = item[0], item[1]
            touched.add(node)
            if env.type not in _STORED:
                continue
            key = (node, env.epoch, env.seq)
            packed = _body_bytes(item)
            digest = _digest(packed)
            if key not in candidates:
                candidates[key], bodies[key] = item, (packed, digest)
            elif bodies[key][1] != digest:
                self.conflicts.append(Conflict(node, env.epoch, env.seq, env.type))
        return touched, candidates, bodies

    def _check_duplicates(self, existing: dict[MessageKey, bytes | None],
                          candidates: dict[MessageKey, BatchItem],
                          bodies: dict[MessageKey, _Body]) -> None:
        """Stored keys whose stored body digest differs (unknown for rows written
        before digests were kept: not counted)."""
        for key, stored in existing.items():
            if stored is not None and stored != bodies[key][1]:
                self.conflicts.append(Conflict(key[0], key[1], key[2], candidates[key][1].type))

    def _forget_uncommitted(self, touched: set[str]) -> None:
        """After a ROLLBACK: drop what memory says about rows that were not written, so
        the next batch writes them (what is stored is what counts)."""
        self._high.clear()
        self._unreachable = None
        self.history.forget(touched)

    def _existing(self, keys: list[MessageKey]) -> dict[MessageKey, bytes | None]:
        """Which of these (node, epoch, seq) are already stored, with their digests.

        Agents send each spool's seqs in increasing order, so almost every message is
        above its (node, epoch) high-water mark (the largest stored seq, kept in memory)
        and needs no query; only resends at or below it cost an indexed point lookup.
        """
        found: dict[MessageKey, bytes | None] = {}
        for key in keys:
            node, epoch, seq = key
            if seq > self._high_water(node, epoch):
                continue
            row = self.db.execute("SELECT digest FROM messages WHERE node = ? AND epoch = ? AND seq = ?",
                                  key).fetchone()
            if row is not None:
                found[key] = row[0]
        return found

    def _high_water(self, node: str, epoch: str) -> int:
        high = self._high.get((node, epoch))
        if high is None:
            if len(self._high) >= MAX_HIGH_WATER:
                self._high.clear()
            row = self.db.execute("SELECT max(seq) FROM messages WHERE node = ? AND epoch = ?",
                                  (node, epoch)).fetchone()
            high = self._high[(node, epoch)] = int(row[0] or 0)
        return high

    def _write(self, new: list[tuple[MessageKey, BatchItem]], bodies: dict[MessageKey, _Body],
               touched: set[str], now: float, states: dict[str, _State]) -> None:
        db = self.db
        last_state = self._last_state
        messages: list[tuple[Any, ...]] = []
        history: list[tuple[Any, ...]] = []
        findings: list[tuple[Any, ...]] = []
        events: list[tuple[Any, ...]] = []
        results: list[tuple[Any, ...]] = []
        hist = Rows()
        latest_report: dict[str, tuple[Envelope, bytes]] = {}  # node -> (report, its body)
        # Per node: [last_seq, verdict_ts, verdict, worst finding, agent_version]
        node_rows: dict[str, list[Any]] = {node: [0, None, None, None, None] for node in touched}
        for key, item in new:
            node, epoch, seq = key
            env = item[1]
            body = env.body
            packed, digest = bodies[key]
            messages.append((node, epoch, seq, env.type, env.ts, now, digest))
            row = node_rows[node]
            if seq > row[0]:
                row[0] = seq
            if env.type in (REPORT, EVENT):
                verdict = _text(body.get("verdict")) or _UNKNOWN
                worst: dict[str, Any] = {}
                worst_rank = 0
                bad: list[tuple[Any, ...]] = []
                for f in body.get("findings", ()):
                    severity = f.get("severity")
                    if severity == _OK:  # the common case, kept cheap
                        continue
                    severity = str(severity).upper()
                    if severity == _OK:
                        continue
                    bad.append((_text(f.get("check")), severity, _int(f.get("gpu")),
                                _text(f.get("subject")), _text(f.get("message"))))
                    rank = _RANK.get(severity, _RANK[_UNKNOWN])
                    if rank > worst_rank:
                        worst, worst_rank = f, rank
                # The node's latest word is the last to arrive (a node's messages arrive in
                # seq order, resends are deduplicated): its clock is data, never the order.
                row[1], row[2], row[3] = now, verdict, worst
                if env.type == REPORT:
                    self.history.observe(node, env.ts, verdict, body.get("throttle"),
                                         body.get("summary"), hist)
                    state = (verdict, tuple(bad))
                    if state != (states.get(node) or last_state.get(node)):
                        states[node] = state
                        history.append((node, seq, env.ts, verdict))
                        findings.extend((node, seq, env.ts, *b) for b in bad)
                    latest_report[node] = (env, packed)  # arrival order, as above
                else:
                    findings.extend((node, seq, env.ts, *b) for b in bad)
                    events.append((node, seq, env.ts, _text(body.get("kind")), _int(body.get("gpu")),
                                   _int(body.get("data")), verdict, packed))
            elif env.type == HELLO:
                row[4] = _text(body.get("version"))
            elif env.type == COMMAND_RESULT:
                results.append((node, seq, env.ts, _text(body.get("command_id")), int(bool(body.get("ok"))),
                                msgpack.packb(body.get("result"), use_bin_type=True)))
        if messages:
            db.executemany("INSERT INTO messages (node, epoch, seq, type, ts, received_at, digest) "
                           "VALUES (?,?,?,?,?,?,?)", messages)
        if history:
            db.executemany("INSERT INTO report_history (node, seq, ts, verdict) VALUES (?,?,?,?)", history)
        if findings:
            db.executemany("INSERT INTO findings (node, seq, ts, check_id, severity, gpu, subject, message) "
                           "VALUES (?,?,?,?,?,?,?,?)", findings)
        if events:
            db.executemany("INSERT INTO events (node, seq, ts, kind, gpu, data, verdict, body) "
                           "VALUES (?,?,?,?,?,?,?,?)", events)
        hist.write(db)
        self._note_reachable(touched, now)
        if results:
            db.executemany("INSERT INTO command_results (node, seq, ts, command_id, ok, result) "
                           "VALUES (?,?,?,?,?,?)", results)
        if latest_report:
            db.executemany(
                "INSERT INTO reports (node, seq, ts, verdict, body) VALUES (?,?,?,?,?) "
                "ON CONFLICT (node) DO UPDATE SET seq = excluded.seq, ts = excluded.ts, "
                "verdict = excluded.verdict, body = excluded.body",
                [(node, env.seq, env.ts, _text(env.body.get("verdict")) or _UNKNOWN, packed)
                 for node, (env, packed) in latest_report.items()])
        rows = []
        for node, (last_seq, verdict_ts, verdict, worst, version) in node_rows.items():
            w = worst or {}
            rows.append((node, now, now, last_seq, verdict, verdict_ts, _text(w.get("check")),
                         _text(w.get("severity")), _text(w.get("message")), _int(w.get("gpu")), version))
        db.executemany(
            "INSERT INTO nodes (node, first_seen, last_seen, last_seq, verdict, verdict_ts, worst_check, "
            "worst_severity, worst_message, worst_gpu, reachable, unreachable_since, agent_version) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,1,NULL,?) ON CONFLICT (node) DO UPDATE SET "
            "last_seen = max(nodes.last_seen, excluded.last_seen), "
            "last_seq = max(nodes.last_seq, excluded.last_seq), "
            "reachable = 1, unreachable_since = NULL, "
            "agent_version = coalesce(excluded.agent_version, nodes.agent_version), "
            # A batch that carried a verdict (a report or event) replaces the node's: the
            # newest to arrive (verdict_ts is when the collector received it).
            "verdict = CASE WHEN excluded.verdict IS NOT NULL THEN excluded.verdict ELSE nodes.verdict END, "
            "worst_check = CASE WHEN excluded.verdict IS NOT NULL "
            "  THEN excluded.worst_check ELSE nodes.worst_check END, "
            "worst_severity = CASE WHEN excluded.verdict IS NOT NULL "
            "  THEN excluded.worst_severity ELSE nodes.worst_severity END, "
            "worst_message = CASE WHEN excluded.verdict IS NOT NULL "
            "  THEN excluded.worst_message ELSE nodes.worst_message END, "
            "worst_gpu = CASE WHEN excluded.verdict IS NOT NULL "
            "  THEN excluded.worst_gpu ELSE nodes.worst_gpu END, "
            "verdict_ts = coalesce(excluded.verdict_ts, nodes.verdict_ts)",
            rows)

    def add_decisions(self, decisions: Iterable[Any]) -> int:
        """Record automation decisions (objects with the ``Decision`` fields) in one
        transaction; returns the rows written."""
        rows = [(float(d.time), _text(d.node), _text(d.action), _text(d.reason), int(bool(d.held)),
                 int(bool(d.dry_run)), _text(d.trigger), _text(d.result)) for d in decisions]
        if not rows:
            return 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany("INSERT INTO decisions (time, node, action, reason, held, dry_run, "
                                "trigger, result) VALUES (?,?,?,?,?,?,?,?)", rows)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return len(rows)

    def transaction(self) -> _Transaction:
        """``with store.transaction():`` one write transaction (BEGIN IMMEDIATE ... COMMIT,
        ROLLBACK on any exception)."""
        return _Transaction(self.db)

    # ---- checkpoint coordination (rows written inside the caller's transaction)

    def add_checkpoint(self, row: dict[str, Any]) -> int:
        cur = self.db.execute(
            "INSERT INTO checkpoints (job_id, action, reason, trigger_node, nodes, user, requested, "
            "deadline, state) VALUES (?,?,?,?,?,?,?,?,?)",
            (row["job_id"], row["action"], _text(row.get("reason")), row["trigger_node"],
             json.dumps(list(row["nodes"])), _text(row.get("user")), row["requested"],
             row["deadline"], row.get("state", "open")))
        return int(cur.lastrowid or 0)

    def update_checkpoint(self, checkpoint_id: int, **fields: Any) -> None:
        allowed = {"state", "acked_at", "acked_by", "closed", "deadline", "action", "nodes"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"bad checkpoint fields {sorted(fields)}")
        if "nodes" in fields:
            fields["nodes"] = json.dumps(list(fields["nodes"]))
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE checkpoints SET {sets} WHERE id = ?",
                        [*fields.values(), checkpoint_id])

    def checkpoints(self, *, job_id: str | None = None, active: bool = False,
                    limit: int = 1000) -> list[dict[str, Any]]:
        """Checkpoint requests, oldest first; ``active``: not closed yet (open, or acked /
        expired with the node's drain still to be carried out)."""
        sql = ("SELECT id, job_id, action, reason, trigger_node, nodes, user, requested, deadline, "
               "state, acked_at, acked_by, closed FROM checkpoints")
        where: list[str] = []
        params: list[Any] = []
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if active:
            where.append("closed IS NULL")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id LIMIT ?"
        params.append(max(0, int(limit)))
        out = _dicts(self.db.execute(sql, params))
        for item in out:
            item["nodes"] = json.loads(item["nodes"])
        return out

    def set_pending_drain(self, node: str, action: str, reason: str, trigger: str, since: float,
                          checkpoint_ids: Sequence[int]) -> None:
        self.db.execute(
            "INSERT INTO pending_drains (node, action, reason, trigger, since, checkpoints) "
            "VALUES (?,?,?,?,?,?) ON CONFLICT (node) DO UPDATE SET checkpoints = excluded.checkpoints",
            (node, action, _text(reason), _text(trigger), since, json.dumps(list(checkpoint_ids))))

    def upgrade_pending_drain(self, node: str, action: str, reason: str, trigger: str) -> None:
        self.db.execute("UPDATE pending_drains SET action = ?, reason = ?, trigger = ? WHERE node = ?",
                        (action, _text(reason), _text(trigger), node))

    def remove_pending_drain(self, node: str) -> None:
        self.db.execute("DELETE FROM pending_drains WHERE node = ?", (node,))

    def pending_drains(self) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT node, action, reason, trigger, since, checkpoints "
                              "FROM pending_drains ORDER BY since, node")
        return [{"node": n, "action": a, "reason": r, "trigger": t, "since": s,
                 "checkpoints": json.loads(c)} for n, a, r, t, s, c in cur]

    def add_job_event(self, job_id: str, ts: float, kind: str, node: str | None = None,
                      detail: str | None = None) -> None:
        self.db.execute("INSERT INTO job_events (job_id, ts, kind, node, detail) VALUES (?,?,?,?,?)",
                        (job_id, ts, kind, _text(node), _text(detail)))

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT ts, kind, node, detail FROM job_events WHERE job_id = ? "
                              "ORDER BY ts, id", (job_id,))
        return [{"ts": ts, "kind": k, "node": n, "detail": d} for ts, k, n, d in cur]

    def touch(self, nodes: Iterable[str], now: float | None = None) -> None:
        """Record that these nodes were heard from (heartbeats)."""
        when = time.time() if now is None else now
        self.store_batch([(n, Envelope(type=HEARTBEAT, node=n, seq=0)) for n in nodes], received_at=when)

    def mark_unreachable(self, now: float, after_s: float) -> list[str]:
        """Mark nodes silent for more than ``after_s`` unreachable; return the newly marked."""
        unreachable = self._unreachable_nodes()
        with self.transaction():
            rows = self.db.execute(
                "UPDATE nodes SET reachable = 0, unreachable_since = ? "
                "WHERE reachable = 1 AND last_seen < ? RETURNING node", (now, now - after_s)).fetchall()
            gone = sorted(str(r[0]) for r in rows)
            self.db.executemany(
                "INSERT INTO node_states (node, ts, kind, reason, actor) VALUES (?,?,?,?,?)",
                [(n, now, "unreachable", f"silent for {after_s:g} s", "collector") for n in gone])
        unreachable.update(gone)
        return gone

    def _unreachable_nodes(self) -> set[str]:
        if self._unreachable is None:
            self._unreachable = {str(r[0]) for r in
                                 self.db.execute("SELECT node FROM nodes WHERE reachable = 0")}
        return self._unreachable

    def _note_reachable(self, touched: set[str], now: float) -> None:
        """Inside ``_write``: nodes marked unreachable that spoke again."""
        unreachable = self._unreachable_nodes()
        back = sorted(unreachable & touched)
        if back:
            self.db.executemany(
                "INSERT INTO node_states (node, ts, kind, reason, actor) VALUES (?,?,?,?,?)",
                [(n, now, "reachable", None, "collector") for n in back])
            unreachable.difference_update(back)

    def record_slurm_states(self, states: Iterable[Any], now: float) -> list[tuple[str, str]]:
        """Record drain/resume transitions from a Slurm poll (``NodeState`` objects), each
        drain with who did it (``drain_actor``); returns the (node, kind) transitions
        written."""
        last = self._last_slurm_states()
        rows: list[tuple[str, float, str, str | None, str | None, str | None]] = []
        for st in states:
            drained, reason = bool(st.drained), _text(st.reason)
            before = last.get(st.name)
            if before is None and not drained:
                last[st.name] = (False, None)  # first sight, not drained: nothing happened
                continue
            if drained and (before is None or not before[0] or before[1] != reason):
                ts = st.reason_time if st.reason_time and st.reason_time <= now else now
                rows.append((st.name, ts, "drained", reason, _text(st.reason_user),
                             self.drain_actor(st.name, reason, now)))
            elif not drained and before is not None and before[0]:
                rows.append((st.name, now, "resumed", None, None, None))
            last[st.name] = (drained, reason if drained else None)
        if rows:
            with self.transaction():
                self.db.executemany("INSERT INTO node_states (node, ts, kind, reason, actor, "
                                    "drained_by) VALUES (?,?,?,?,?,?)", rows)
        return [(r[0], r[2]) for r in rows]

    def drain_actor(self, node: str, reason: str | None, now: float) -> str:
        """Who drained ``node`` with this Slurm ``reason`` (docs/fleet-db.md):

        * ``outside``: the reason is not slurmgpu's (``scontrol``, Slurm itself);
        * ``prolog`` / ``epilog`` / ``healthcheck`` / ``operator``: the actor tag that a
          hook or ``slurmgpu drain`` ended the reason with (``[by epilog]``);
        * ``automation``: an untagged slurmgpu reason that the automation (in this
          collector, which records its decisions before it polls Slurm again) drained the
          node with since the node's last resume;
        * ``slurmgpu``: any other slurmgpu reason (a slurmgpu older than the tags).
        """
        if not reason or not reason.startswith(REASON_PREFIX):
            return "outside"
        tagged = reason_actor(reason)
        if tagged is not None:
            return tagged[0]
        since = self.db.execute("SELECT max(ts) FROM node_states WHERE node = ? AND kind = "
                                "'resumed'", (node,)).fetchone()[0]
        for (decided,) in self.db.execute(
                "SELECT reason FROM decisions WHERE node = ? AND result IN ('drained', "
                "'reboot-requested') AND time > ? AND time <= ? ORDER BY time DESC LIMIT 20",
                (node, since if since is not None else float("-inf"), now + DECISION_SLACK_S)):
            if _same_reason(decided or "", reason):
                return "automation"
        return "slurmgpu"

    def _last_slurm_states(self) -> dict[str, tuple[bool, str | None]]:
        if self._slurm_state is None:
            self._slurm_state = {
                str(n): (k == "drained", r) for n, k, r in self.db.execute(
                    "SELECT node, kind, reason FROM node_states WHERE id IN (SELECT max(id) FROM "
                    "node_states WHERE kind IN ('drained', 'resumed') GROUP BY node)")}
        return self._slurm_state

    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        """Delete history older than the retention; returns the rows deleted.
        The latest report and the node rows are kept whatever their age."""
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        deleted = 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for sql in ("DELETE FROM messages WHERE received_at < ?",
                        "DELETE FROM report_history WHERE ts < ?",
                        "DELETE FROM findings WHERE ts < ?",
                        "DELETE FROM events WHERE ts < ?",
                        "DELETE FROM command_results WHERE ts < ?",
                        "DELETE FROM decisions WHERE time < ?",
                        "DELETE FROM job_events WHERE ts < ?",
                        "DELETE FROM node_states WHERE ts < ?",
                        "DELETE FROM node_samples WHERE ts < ?",
                        "DELETE FROM checkpoints WHERE state != 'open' AND requested < ?"):
                deleted += self.db.execute(sql, (cutoff,)).rowcount
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        # The next report of every node is recorded again, so a node whose state has not
        # changed for longer than the retention still has its current state in the history.
        self._last_state.clear()
        return deleted

    # ------------------------------------------------------------------ reads

    def fleet(self) -> list[dict[str, Any]]:
        cur = self.db.execute(
            "SELECT node, verdict, first_seen, last_seen, last_seq, worst_check, worst_severity, "
            "worst_message, worst_gpu, reachable, unreachable_since, agent_version FROM nodes ORDER BY node")
        names = [d[0] for d in cur.description]
        out = []
        for row in cur:
            item = dict(zip(names, row, strict=True))
            item["reachable"] = bool(item["reachable"])
            out.append(item)
        return out

    def events(self, node: str | None = None, since: float | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT node, seq, ts, kind, gpu, data, verdict, body FROM events"
        where: list[str] = []
        params: list[Any] = []
        if node is not None:
            where.append("node = ?")
            params.append(node)
        if since is not None:
            where.append("ts >= ?")
            params.append(since)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY ts, node, seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        out = []
        for n, seq, ts, kind, gpu, data, verdict, body in self.db.execute(sql, params):
            out.append({"node": n, "seq": seq, "ts": ts, "kind": kind, "gpu": gpu, "data": data,
                        "verdict": verdict, "body": msgpack.unpackb(body, raw=False)})
        return out

    def decisions(self, node: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The latest automation decisions (all nodes, or one), oldest first."""
        sql = "SELECT id, time, node, action, reason, held, dry_run, trigger, result FROM decisions"
        params: list[Any] = []
        if node is not None:
            sql += " WHERE node = ?"
            params.append(node)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(max(0, int(limit)))
        out = _dicts(self.db.execute(sql, params))
        for item in out:
            item["held"], item["dry_run"] = bool(item["held"]), bool(item["dry_run"])
        out.reverse()
        return out

    def latest_report(self, node: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT seq, ts, verdict, body FROM reports WHERE node = ?", (node,)).fetchone()
        if row is None:
            return None
        body = msgpack.unpackb(row[3], raw=False)
        if isinstance(body.get("facts"), bytes):  # agents send facts pre-packed
            body["facts"] = msgpack.unpackb(body["facts"], raw=False)
        return {"node": node, "seq": row[0], "ts": row[1], "verdict": row[2], "body": body}

    def count(self, table: str) -> int:
        if table not in {"nodes", "messages", "reports", "report_history", "findings", "events",
                         "command_results", "decisions", "checkpoints", "pending_drains",
                         "job_events", "node_states", "node_samples", "gpu_counters", "ib_counters",
                         "node_versions"}:
            raise ValueError(f"unknown table {table!r}")
        return int(self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
