"""The collector's SQLite WAL is started over while batches follow each other back to back
(``walcheckpoint``: the background thread's passes, then the writer's turn between two
batches), instead of growing to the backstop and stalling one COMMIT for its checkpoint.
Real SQLite files, the real thread."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.collector.store import Store, walcheckpoint
from slurmgpu.collector.store.walcheckpoint import WalCheckpointer
from slurmgpu.wire import EVENT, Envelope

PAGES = 64  # the test's restart threshold: 256 KB of WAL
PAD = "x" * 4000  # ~one WAL page per event


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "fleet.db")
    yield store
    store.close()


def start(store: Store) -> WalCheckpointer:
    """The store's checkpoint thread, passing every 10 ms, starting the WAL over from PAGES."""
    assert isinstance(store.path, Path)
    checkpointer = WalCheckpointer(store.path, store.db, every_s=0.01, restart_pages=PAGES)
    store._checkpointer = checkpointer  # (what ``checkpoint_in_background`` sets)
    checkpointer.start()
    return checkpointer


class Writer:
    """Batches of events, one after the other, as the collector's loop stores them: one
    transaction, then the loop's turn (``Store.wal_turn``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seq = 0
        self.written = 0  # bytes of bodies

    def batch(self, events: int = 20) -> None:
        self.seq += 1
        self.store.store_batch([(f"n{i}", Envelope(type=EVENT, node=f"n{i}", seq=self.seq,
                                                   body={"verdict": "OK", "findings": [], "kind": "xid",
                                                         "gpu": 0, "data": 13, "pad": PAD}))
                                for i in range(events)])
        self.written += events * len(PAD)
        self.store.wal_turn()
        while self.store.wal_holding():  # (as the collector's loop holds its bulk batches)
            time.sleep(0.001)


def wal_size(store: Store) -> int:
    return os.path.getsize(f"{store.path}-wal")


def test_the_wal_is_started_over_while_batches_follow_each_other(store: Store) -> None:
    checkpointer = start(store)
    writer = Writer(store)
    deadline = time.monotonic() + 60
    while checkpointer.turns < 2 and time.monotonic() < deadline:
        writer.batch()
    assert checkpointer.turns >= 2
    size, written, turns = wal_size(store), writer.written, checkpointer.turns
    while (writer.written - written < 8 * size or checkpointer.turns < turns + 3) and time.monotonic() < deadline:
        writer.batch()
    assert checkpointer.turns >= turns + 3
    # The WAL file is reused from its start (not truncated): it grows only where one run of
    # batches between two turns is longer than any before. Without the turns (``wal_turn``
    # a no-op) it grows by about what is written, unless the thread happens to copy
    # everything between two of the writer's transactions.
    assert wal_size(store) - size < 0.75 * (writer.written - written), (wal_size(store), size, writer.written - written)
    assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 20 * writer.seq


def test_a_reader_on_an_old_snapshot_holds_the_wal_and_nothing_spins(store: Store) -> None:
    """A reader still on an old snapshot (a scrape, a report) keeps the passes from copying
    past it: no turn is due (it could not start the WAL over), the passes go back to their
    interval instead of back to back, and once it is gone the WAL is started over."""
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # (the migrations' frames)
    checkpointer = start(store)
    writer = Writer(store)
    writer.batch(events=2)  # (a WAL below PAGES: nothing to start over before the reader)
    assert isinstance(store.path, Path)
    reader = sqlite3.connect(store.path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()  # (its snapshot: the WAL as now)
        began, passes = time.monotonic(), checkpointer.checkpoints
        while writer.written < 20 * PAGES * 4096 or time.monotonic() < began + 0.5:
            writer.batch()
            time.sleep(0.002)
        elapsed = time.monotonic() - began
        assert checkpointer.turns == 0
        # every 10 ms (every_s), not every 2 (CHASE_PAUSE_S): at most ~100 a second, not ~500
        assert checkpointer.checkpoints - passes < 150 * elapsed + 10
        assert wal_size(store) > 20 * PAGES * 4096
    finally:
        reader.execute("COMMIT")
        reader.close()
    deadline = time.monotonic() + 60
    while checkpointer.turns < 2 and time.monotonic() < deadline:
        writer.batch()
    assert checkpointer.turns >= 2
    size, written = wal_size(store), writer.written
    while writer.written - written < 8 * size and time.monotonic() < deadline:
        writer.batch()
    assert wal_size(store) - size < 0.75 * (writer.written - written)  # (started over)


class _FailingCheckpoints:
    """The thread's connection on a failing disk: its checkpoints fail (disk I/O error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: object) -> object:
        if "wal_checkpoint" in sql:
            raise sqlite3.OperationalError("disk I/O error")
        return self.db.execute(sql, *args)

    def close(self) -> None:
        self.db.close()


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, event: str, **_fields: object) -> None:
        self.warnings.append(event)


def test_a_turn_that_fails_is_logged_and_ingest_goes_on(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread's checkpoints failing during a turn (a full or failing disk): logged,
    and the writer stops holding its batches at once (the backstop still bounds the WAL)."""
    real_connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: _FailingCheckpoints(real_connect(*a, **k)))
    checkpointer = start(store)
    checkpointer.log = log = _Log()
    store.wal_turn()
    assert not store.wal_holding()  # (not due: nothing held)
    checkpointer._turn.set()
    store.wal_turn()
    began = time.monotonic()
    while store.wal_holding() and time.monotonic() < began + 5:
        time.sleep(0.001)
    assert time.monotonic() - began < walcheckpoint.MAX_HOLD_S
    assert not checkpointer._turn.is_set() and checkpointer.turns == 1
    assert "wal_checkpoint_failed" in log.warnings


def test_a_turn_without_its_thread_holds_ingest_no_longer_than_max_hold(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that died with a turn due: the writer holds its batches for MAX_HOLD_S,
    then goes on, and takes no other turn."""
    assert isinstance(store.path, Path)
    monkeypatch.setattr(walcheckpoint, "MAX_HOLD_S", 0.2)
    checkpointer = WalCheckpointer(store.path, store.db, every_s=3600.0, restart_pages=PAGES)  # (never started)
    store._checkpointer = checkpointer
    try:
        checkpointer._turn.set()
        store.wal_turn()
        assert store.wal_holding()
        time.sleep(0.3)
        assert not store.wal_holding()
        store.wal_turn()
        assert not store.wal_holding()
    finally:
        store._checkpointer = None  # (never started: nothing to stop)
