"""The collector's SQLite WAL checkpoints, in a thread of their own: a PASSIVE checkpoint
every ``every_s`` (the writer never waits for it), back to back once the WAL is half of
``RESTART_PAGES`` long, so that the writer's own automatic checkpoint there has little
left to copy before its next transaction starts the WAL over.

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
CHASE_PAUSE_S = 0.005  # between passes once the WAL is half that long


class WalCheckpointer(threading.Thread):
    def __init__(self, path: Path, writer: Connection, *, every_s: float = 0.5,
                 restart_pages: int = RESTART_PAGES) -> None:
        super().__init__(name="slurmgpu-wal-checkpoint", daemon=True)
        self.path = path
        self.every_s = every_s
        self.restart_pages = restart_pages
        self.checkpoints = 0
        self._halt = threading.Event()
        self.log = get_logger(component="store")
        writer.execute(f"PRAGMA wal_autocheckpoint = {restart_pages}")

    def run(self) -> None:
        failing = False
        while not self._halt.wait(self.every_s):
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=1.0, isolation_level=None)) as db:
                    wait, copied = self.every_s, -1
                    while not self._halt.wait(wait):
                        wait, copied = self._pass(db, copied)
                        failing = False
            except sqlite3.Error as exc:  # the writer's own checkpoints go on
                if not failing:
                    self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
                failing = True

    def _pass(self, db: sqlite3.Connection, copied: int) -> tuple[float, int]:
        """One PASSIVE checkpoint; the wait before the next: short while the WAL is long
        and the passes get somewhere (a reader on an old snapshot holds them back)."""
        _, frames, now_copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.checkpoints += 1
        chase = frames >= self.restart_pages // 2 and now_copied != copied
        return (CHASE_PAUSE_S if chase else self.every_s), now_copied

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
