"""The agent's outgoing-message spool: SQLite (WAL) at ``<spool_dir>/spool.db``.

Every message the collector must acknowledge (hello, report, event, command-result)
is written here *before* it is sent, under a spool-assigned sequence number that is
strictly increasing across restarts (``AUTOINCREMENT`` never reuses a number). A row
is deleted only when the collector acks its seq; on (re)connect the link resends
every remaining row in seq order, byte for byte (same envelope id).

Design notes: docs/design-notes.md (``slurmgpu/agent/spool.py``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgpu.fileutil import private_dir, touch_private
from slurmgpu.log import get_logger

FILENAME = "spool.db"
REOPEN_EVERY_S = 60.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    type TEXT NOT NULL,
    created REAL NOT NULL,
    frame BLOB NOT NULL
)
"""
_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def new_epoch() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Spooled:
    seq: int
    frame: bytes
    stored: bool  # False: the write failed; send once, best effort


class Spool:
    """Thread-safe; one connection shared under a lock."""

    def __init__(self, directory: str | os.PathLike[str], max_mb: float = 64.0) -> None:
        self.path = Path(directory) / FILENAME
        self.max_bytes = int(max_mb * 1024 * 1024)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._last_seq = 0
        # Read by ``append``'s encode callback (under the lock) to stamp the frame.
        self.epoch = new_epoch()
        self._error: str | None = None  # for the next report's agent.spool finding
        self._failing = False
        self._next_open = 0.0
        self._log = get_logger(component="spool")
        with self._lock:
            self._open()

    # ------------------------------------------------------------------ setup

    def _open(self) -> bool:
        self._next_open = time.monotonic() + REOPEN_EVERY_S
        try:
            private_dir(self.path.parent)
            touch_private(self.path)  # (SQLite gives its -wal and -shm files the same mode)
            conn = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False,
                                   isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
            epoch = self._load_epoch(conn)
            row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='messages'").fetchone()
            high = conn.execute("SELECT max(seq) FROM messages").fetchone()[0]
        except (sqlite3.Error, OSError) as exc:
            self._fail(f"cannot open spool {self.path}: {exc}")
            return False
        self._conn = conn
        if epoch != self.epoch:
            self._log.info("spool_epoch", epoch=epoch, path=str(self.path))
        self.epoch = epoch
        self._last_seq = max(self._last_seq, row[0] if row else 0, high or 0)
        return True

    def _load_epoch(self, conn: sqlite3.Connection) -> str:
        """The file's epoch; a file without one (new, or from before epochs) gets ours."""
        conn.execute(_META)
        row = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
        if row is not None and isinstance(row[0], str) and row[0]:
            return row[0]
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('epoch', ?)", (self.epoch,))
        return self.epoch

    def _fail(self, message: str) -> None:
        self._error = message
        if not self._failing:
            self._log.error("spool_write_failed", error=message, path=str(self.path))
        self._failing = True

    # ------------------------------------------------------------------ writes

    def append(self, mtype: str, encode: Callable[[int], bytes]) -> Spooled:
        """Assign the next seq, build the frame with it (``encode`` must stamp the frame
        with ``self.epoch``, read inside the call), store it. Never raises for storage
        problems (``stored`` False); ``encode`` errors propagate."""
        with self._lock:
            if self._conn is None and time.monotonic() >= self._next_open:
                self._open()
            seq = self._last_seq + 1
            self._last_seq = seq  # even when the write fails: never reuse a sent seq
            frame = encode(seq)
            if self._conn is None:
                self._error = self._error or f"spool {self.path} unavailable"
                return Spooled(seq, frame, False)
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if mtype == "hello":  # a new hello supersedes unacked older ones
                        self._conn.execute("DELETE FROM messages WHERE type='hello'")
                    self._conn.execute(
                        "INSERT INTO messages(seq, type, created, frame) VALUES (?, ?, ?, ?)",
                        (seq, mtype, time.time(), frame))
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:  # SQLITE_FULL may have rolled back already
                        with contextlib.suppress(sqlite3.Error):
                            self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                self._fail(f"spool write failed ({exc}); {mtype} seq {seq} sent unspooled")
                return Spooled(seq, frame, False)
            if self._failing:
                self._log.info("spool_write_recovered", path=str(self.path))
                self._failing = False
            if self._used_bytes() > self.max_bytes:
                self._compact()
            return Spooled(seq, frame, True)

    def delete(self, seqs: Iterable[int]) -> int:
        """Drop acknowledged rows; returns how many existed."""
        wanted = [(int(s),) for s in seqs]
        if not wanted:
            return 0
        with self._lock:
            if self._conn is None:
                return 0
            try:
                before = self._conn.total_changes
                self._conn.executemany("DELETE FROM messages WHERE seq=?", wanted)
                return self._conn.total_changes - before
            except sqlite3.Error as exc:
                self._fail(f"spool delete failed: {exc}")
                return 0

    def _compact(self) -> int:
        assert self._conn is not None
        try:
            cur = self._conn.execute(
                "DELETE FROM messages WHERE type='report' AND seq < "
                "(SELECT max(seq) FROM messages WHERE type='report')")
        except sqlite3.Error as exc:
            self._fail(f"spool compaction failed: {exc}")
            return 0
        dropped = cur.rowcount
        used = self._used_bytes()
        self._log.warning("spool_compacted", dropped_reports=dropped, used_bytes=used,
                          max_bytes=self.max_bytes)
        if used > self.max_bytes:
            self._log.warning("spool_over_limit", used_bytes=used, max_bytes=self.max_bytes,
                              note="only events/results left; nothing more is dropped")
        return dropped

    def _used_bytes(self) -> int:
        assert self._conn is not None
        try:
            pages = self._conn.execute("PRAGMA page_count").fetchone()[0]
            free = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
            size = self._conn.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.Error:
            return 0
        return int((pages - free) * size)

    # ------------------------------------------------------------------ reads

    def pending(self, after: int = 0, limit: int = 100, *,
                types: Sequence[str] | None = None) -> list[tuple[int, bytes]]:
        """Unacked rows with seq > ``after``, in seq order (``types``: of these types only)."""
        where = "seq > ?"
        params: list[object] = [after]
        if types is not None:
            where += f" AND type IN ({', '.join('?' for _ in types)})"
            params += list(types)
        with self._lock:
            if self._conn is None:
                return []
            try:
                rows = self._conn.execute(
                    f"SELECT seq, frame FROM messages WHERE {where} ORDER BY seq LIMIT ?",
                    (*params, limit)).fetchall()
            except sqlite3.Error as exc:
                self._fail(f"spool read failed: {exc}")
                return []
            return [(int(s), bytes(f)) for s, f in rows]

    def count(self, mtype: str | None = None) -> int:
        with self._lock:
            if self._conn is None:
                return 0
            if mtype is None:
                return int(self._conn.execute("SELECT count(*) FROM messages").fetchone()[0])
            return int(self._conn.execute("SELECT count(*) FROM messages WHERE type=?",
                                          (mtype,)).fetchone()[0])

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def take_error(self) -> str | None:
        """The latest storage problem since the last call (for the next report)."""
        with self._lock:
            error, self._error = self._error, None
            return error

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None
