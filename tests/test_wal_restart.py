"""The collector's SQLite WAL is started over while batches follow each other back to back
(``walcheckpoint``: the background thread's passes copy the frames, the writer's own
checkpoint at ``restart_pages`` the little left), instead of growing without bound.
Real SQLite files, the real thread."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.collector.store import Store
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
    transaction each."""

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


def wal_size(store: Store) -> int:
    return os.path.getsize(f"{store.path}-wal")


def test_the_wal_is_started_over_while_batches_follow_each_other(store: Store) -> None:
    """The WAL file is reused from its start (not truncated): it grows by far less than
    what is written (without the writer's checkpoint at PAGES it grows by about all of it,
    unless the thread happens to copy everything between two transactions)."""
    start(store)
    writer = Writer(store)
    while writer.written < 8 * PAGES * 4096:
        writer.batch()
    size, written = wal_size(store), writer.written
    while writer.written - written < 8 * size:
        writer.batch()
    assert wal_size(store) - size < 0.75 * (writer.written - written), (wal_size(store), size, writer.written - written)
    assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 20 * writer.seq


def test_a_reader_on_an_old_snapshot_holds_the_wal_until_it_is_gone(store: Store) -> None:
    """A reader still on an old snapshot (a scrape, a report) keeps the checkpoints from
    copying past it, so the WAL grows meanwhile, and the passes go back to their interval
    instead of back to back; once it is gone the WAL is started over."""
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
        # every 10 ms (every_s), not every 5 (CHASE_PAUSE_S): at most ~100 a second, not ~200
        assert checkpointer.checkpoints - passes < 150 * (time.monotonic() - began) + 10
        assert wal_size(store) > 20 * PAGES * 4096
    finally:
        reader.execute("COMMIT")
        reader.close()
    time.sleep(0.1)  # (the thread's next pass copies what the reader held)
    size, written = wal_size(store), writer.written
    while writer.written - written < 8 * size:
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


def test_failing_checkpoints_are_logged_and_ingest_goes_on(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread's checkpoints failing (a full or failing disk): logged once, and the
    writer's batches go on (its own checkpoints still bound the WAL)."""
    real_connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: _FailingCheckpoints(real_connect(*a, **k)))
    checkpointer = start(store)
    checkpointer.log = log = _Log()
    writer = Writer(store)
    deadline = time.monotonic() + 30
    while not log.warnings and time.monotonic() < deadline:
        writer.batch()
        time.sleep(0.01)
    writer.batch()
    assert log.warnings == ["wal_checkpoint_failed"]
    assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 20 * writer.seq
