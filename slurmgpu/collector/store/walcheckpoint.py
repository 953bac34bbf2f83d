"""The collector's SQLite WAL checkpoints, in a thread of their own.

SQLite checkpoints the WAL into the database file inside the COMMIT that takes it past
``wal_autocheckpoint`` pages (1,000 by default: 4 MB); with ``synchronous=NORMAL`` that
checkpoint is also when the files are fsync'd. At fleet ingest rates nearly every batch
crosses it, so the collector's one loop waited ~20 ms per commit on the disk, receiving
nothing meanwhile. Here a thread with its own connection runs a PASSIVE checkpoint every
``every_s`` (it never blocks the writer, and the writer never waits for it), and the
writer's own automatic checkpoint is kept only as a backstop, at ``BACKSTOP_PAGES`` (a
thread that falls behind or dies cannot let the WAL grow without bound).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

from slurmgpu.collector.store.backend import Connection
from slurmgpu.log import get_logger

# The writer checkpoints itself past this many WAL pages (256 MB with 4 KB pages).
BACKSTOP_PAGES = 65_536


class WalCheckpointer(threading.Thread):
    def __init__(self, path: Path, writer: Connection, *, every_s: float = 0.5) -> None:
        super().__init__(name="slurmgpu-wal-checkpoint", daemon=True)
        self.path = path
        self.every_s = every_s
        self.checkpoints = 0
        self._halt = threading.Event()
        self.log = get_logger(component="store")
        writer.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")

    def run(self) -> None:
        failing = False
        while not self._halt.wait(self.every_s):
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=1.0, isolation_level=None)) as db:
                    while not self._halt.wait(self.every_s):
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        self.checkpoints += 1
                        failing = False
            except sqlite3.Error as exc:  # the writer's backstop still checkpoints
                if not failing:
                    self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
                failing = True

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
