"""The collector's SQLite WAL checkpoints, in a thread of their own: a PASSIVE checkpoint
every ``every_s`` (the writer never waits for it), so that the writer's own automatic
checkpoint, once the WAL holds ``RESTART_PAGES``, has little left to copy before its
next transaction starts the WAL over.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/walcheckpoint.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

from slurmgpu.collector.store.backend import Connection
from slurmgpu.log import get_logger

# The writer checkpoints itself (and then starts the WAL over) past this many WAL pages
# (32 MB with 4 KB pages).
RESTART_PAGES = 8_192


class WalCheckpointer(threading.Thread):
    def __init__(self, path: Path, writer: Connection, *, every_s: float = 0.5,
                 restart_pages: int = RESTART_PAGES) -> None:
        super().__init__(name="slurmgpu-wal-checkpoint", daemon=True)
        self.path = path
        self.every_s = every_s
        self.checkpoints = 0
        self._halt = threading.Event()
        self.log = get_logger(component="store")
        writer.execute(f"PRAGMA wal_autocheckpoint = {restart_pages}")

    def run(self) -> None:
        failing = False
        while not self._halt.wait(self.every_s):
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=1.0, isolation_level=None)) as db:
                    while not self._halt.wait(self.every_s):
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        self.checkpoints += 1
                        failing = False
            except sqlite3.Error as exc:  # the writer's own checkpoints go on
                if not failing:
                    self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
                failing = True

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
