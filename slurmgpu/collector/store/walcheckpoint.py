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
loop between two batches): the writer holds its bulk batches (``holding``) while the
thread copies the remainder, its fsync included, and the writer's next transaction
starts the WAL over. The turn is the thread's work, not the writer's, because it is not
always short (4-20 ms on the test VM, some of 50-130 ms when the disk's fsync is slow):
meanwhile the collector still stores and acks the events socket's messages (small
transactions; the thread's passes copy them too), so a live node's event never waits for
a turn. The writer holds for at most ``MAX_HOLD_S`` (a thread that died or a stalled
disk cannot stop ingest). A reader on an old snapshot (a scrape, a report) holds the
copying back, and the WAL with it: the passes then go back to every ``every_s``, no turn
is due until they copy everything, and a turn under way when one begins ends at the first
pass that copies nothing more.
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
# The writer holds its bulk batches for a turn at most this long.
MAX_HOLD_S = 0.5


class WalCheckpointer(threading.Thread):
    def __init__(self, path: Path, writer: Connection, *, every_s: float = 0.5,
                 restart_pages: int = RESTART_PAGES) -> None:
        super().__init__(name="slurmgpu-wal-checkpoint", daemon=True)
        self.path = path
        self.every_s = every_s
        self.restart_pages = restart_pages
        self.checkpoints = 0
        self.turns = 0  # turns taken (``take_turn``): the WAL started over, or tried to
        self._halt = threading.Event()
        self._turn = threading.Event()  # the writer's turn is due
        self._held = threading.Event()  # the writer holds its bulk batches: the turn is on
        self._held_until = 0.0  # (monotonic) when the writer goes on regardless
        self._chasing = False  # the WAL is long: passes back to back
        self._copied = -1  # the frames the last pass found copied
        self.log = get_logger(component="store")
        writer.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")

    def run(self) -> None:
        failing = False
        while not self._halt.wait(self.every_s):
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=1.0, isolation_level=None)) as db:
                    while not self._halt.is_set():
                        if self._turn.is_set():
                            if self._held.wait(TURN_WAIT_S):  # the writer took its turn
                                self._start_over(db)
                        elif not self._halt.wait(CHASE_PAUSE_S if self._chasing else self.every_s):
                            self._pass(db)
                            failing = False
            except sqlite3.Error as exc:  # the writer's backstop still checkpoints
                if not failing:
                    self.log.warning("wal_checkpoint_failed", db=str(self.path), error=str(exc))
                failing = True

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

    def _start_over(self, db: sqlite3.Connection) -> None:
        """The writer holds its bulk batches: passes back to back until one copies
        everything (the writer's next transaction then starts the WAL over) or copies
        nothing more than the last (a reader on an old snapshot holds it), then the turn
        is over, whatever happens."""
        copied = -1
        try:
            while time.monotonic() < self._held_until and not self._halt.is_set():
                busy, frames, now_copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.checkpoints += 1
                if (not busy and now_copied == frames) or now_copied == copied:
                    break
                copied = now_copied
        finally:
            self._chasing = False
            self._turn.clear()
            self._held.clear()
            self.turns += 1

    def take_turn(self) -> bool:
        """The writer, between two of its transactions: if its turn is due, it holds its
        bulk batches from now (``holding``) while the thread starts the WAL over. Returns
        whether it took one."""
        if not self._turn.is_set() or self._held.is_set():
            return False
        self._held_until = time.monotonic() + MAX_HOLD_S
        self._held.set()
        return True

    def holding(self) -> bool:
        """Whether the writer holds its bulk batches now: a turn under way, for at most
        ``MAX_HOLD_S`` (then it goes on: the backstop still bounds the WAL)."""
        return self._held.is_set() and time.monotonic() < self._held_until

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
