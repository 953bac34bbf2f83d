"""The collector's SQLite WAL checkpoints, in a thread of their own.

SQLite checkpoints the WAL into the database file inside the COMMIT that takes it past
``wal_autocheckpoint`` pages (1,000 by default: 4 MB); with ``synchronous=NORMAL`` that
checkpoint is also when the files are fsync'd. At fleet ingest rates nearly every batch
crosses it, so the collector's one loop waited ~20 ms per commit on the disk, receiving
nothing meanwhile. Here a thread with its own connection runs a PASSIVE checkpoint every
``every_s`` (it never blocks the writer, and the writer never waits for it), and the
writer's own automatic checkpoint is kept only as a backstop, at ``BACKSTOP_PAGES`` (a
thread that falls behind or dies cannot let the WAL grow without bound).

Starting the WAL over. A PASSIVE checkpoint copies the frames that were there when it
began; the writer starts the WAL over only when none is left to copy as it begins a
transaction. With batches back to back that never happens (the writer adds frames
while the thread copies and syncs), so the WAL grew to the backstop, and one COMMIT then
paid for a checkpoint and its fsync: 235-400 ms, twice a minute at 10,000 nodes, with a
live node's event waiting behind it. So once the WAL holds ``restart_pages``, the thread
runs its passes back to back until one is short (it left little behind: what the writer
added meanwhile), and then it is the writer's turn (``take_turn``, from the collector's
loop between two batches): one PASSIVE checkpoint of that remainder, its fsync included
(4-20 ms on the test VM, a few of ~50-100 ms), and the next transaction starts the WAL
over. The thread does not checkpoint while the writer's turn is due. A reader on an old
snapshot (a scrape, a report) holds the copying back, and the WAL with it: the passes
then go back to every ``every_s``, and no turn is due until they copy everything.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path

from slurmgpu.collector.store.backend import Connection
from slurmgpu.log import get_logger

# The writer checkpoints itself past this many WAL pages (256 MB with 4 KB pages).
BACKSTOP_PAGES = 65_536
# From this many WAL pages (32 MB with 4 KB pages) on, the WAL is started over.
RESTART_PAGES = 8_192
# A pass shorter than this left little for the writer's turn.
CAUGHT_UP_S = 0.02
CHASE_PAUSE_S = 0.002  # between passes back to back
TURN_WAIT_S = 0.05  # between looks at whether the writer took its turn


class WalCheckpointer(threading.Thread):
    def __init__(self, path: Path, writer: Connection, *, every_s: float = 0.5,
                 restart_pages: int = RESTART_PAGES) -> None:
        super().__init__(name="slurmgpu-wal-checkpoint", daemon=True)
        self.path = path
        self.every_s = every_s
        self.restart_pages = restart_pages
        self.checkpoints = 0
        self.turns = 0  # the writer's checkpoints (``take_turn``)
        self._halt = threading.Event()
        self._turn = threading.Event()  # the writer's turn is due
        self._chasing = False  # the WAL is long: passes back to back
        self._copied = -1  # the frames the last pass found copied
        self.log = get_logger(component="store")
        writer.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")

    def run(self) -> None:
        failing = False
        while not self._halt.wait(self.every_s):
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=1.0, isolation_level=None)) as db:
                    while not self._halt.wait(self._pause()):
                        if not self._turn.is_set():
                            self._pass(db)
                            failing = False
            except sqlite3.Error as exc:  # the writer's backstop still checkpoints
                if not failing:
                    self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
                failing = True

    def _pause(self) -> float:
        if self._turn.is_set():
            return TURN_WAIT_S
        return CHASE_PAUSE_S if self._chasing else self.every_s

    def _pass(self, db: sqlite3.Connection) -> None:
        start = time.perf_counter()
        busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.checkpoints += 1
        # Back to back while passes get somewhere: a reader on an old snapshot (a scrape, a
        # report) keeps them from copying past it, and from starting the WAL over.
        self._chasing = frames >= self.restart_pages and copied != self._copied
        self._copied = copied
        if frames >= self.restart_pages and not busy and copied == frames \
                and time.perf_counter() - start < CAUGHT_UP_S:
            self._turn.set()

    def take_turn(self, writer: Connection) -> bool:
        """The writer, between two of its transactions: if its turn is due, checkpoint what
        the thread's last pass left, so that its next transaction starts the WAL over.
        Returns whether it did."""
        if not self._turn.is_set():
            return False
        try:
            writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:  # (the thread, and the backstop, go on)
            self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
        finally:
            self._chasing = False
            self._turn.clear()
            self.turns += 1
        return True

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
