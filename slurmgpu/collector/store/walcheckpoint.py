"""The collector's SQLite WAL checkpoints, in a thread of their own: PASSIVE checkpoints
every ``every_s`` (the writer never waits for them), the writer's own automatic
checkpoint only as a backstop, and, once the WAL is long, a turn in which the writer
holds its bulk batches (``holding``, at most ``MAX_HOLD_S``) while the thread copies the
rest, so the writer's next transaction starts the WAL over.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/walcheckpoint.py``).
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
