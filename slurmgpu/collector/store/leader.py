"""Which collector leads: the one that runs the automation and the checkpoint coordination
when several collectors share one PostgreSQL database. No home-made election:
the leader is the collector whose database session holds a session-level advisory lock
(``pg_try_advisory_lock``), on a connection of its own.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/leader.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from slurmgpu.collector.store.backend import WRITE_LOCK_KEY, Connection, StoreError, is_postgres
from slurmgpu.collector.store.schema import connect_postgres

# The leader's lock: another advisory key than the store's write lock.
LEADER_LOCK_KEY = WRITE_LOCK_KEY + 1
# A session's hold on it, in pg_locks (``l``).
_LEADER_LOCK = ("l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                f"AND ((l.classid::bigint << 32) | l.objid::bigint) = {LEADER_LOCK_KEY}")
_HELD = f"SELECT count(*) FROM pg_locks l WHERE {_LEADER_LOCK} AND l.pid = pg_backend_pid()"
# The session holding the lock, if it has run no statement for longer than the lease
# (seconds, the parameter): a leader that stopped renewing it.
_STALE = (f"SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE {_LEADER_LOCK} "
          "AND a.state = 'idle' AND a.state_change < clock_timestamp() - make_interval(secs => ?)")
_END_WAIT_MS = 5000  # how long ending a stale leader's session may take


class Leadership:
    """This collector's claim to lead (see the module docstring). One owner (the loop)."""

    def __init__(self, target: str | Path, *, timeout_s: float = 10.0) -> None:
        self.target = str(target)
        self.timeout_s = max(2.0, timeout_s)
        self.shared = is_postgres(self.target)  # False: one SQLite file, one collector
        self.leader = not self.shared
        self._db: Connection | None = None
        self.ended: int | None = None  # the stale leader's session this one's last poll ended

    def poll(self) -> bool:
        """Try to become the leader, or check that this collector still is; True while it
        leads. A database that cannot be reached means not leading (never an exception)."""
        if not self.shared:
            return True
        try:
            db = self._connection()
            if self.leader:
                self.leader = int(db.execute(_HELD).fetchone()[0]) > 0
            if not self.leader:
                self.leader = self._try_lock(db) or (self._end_stale_leader(db) and self._try_lock(db))
        except (sqlite3.Error, StoreError):  # (StoreError: no psycopg)
            self._drop()
            self.leader = False
        return self.leader

    @staticmethod
    def _try_lock(db: Connection) -> bool:
        return bool(db.execute(f"SELECT pg_try_advisory_lock({LEADER_LOCK_KEY})").fetchone()[0])

    def _end_stale_leader(self, db: Connection) -> bool:
        """End the session of a leader that stopped renewing its lease (``ended``: its
        backend pid); whether there was one and it is gone."""
        self.ended = None
        row = db.execute(_STALE, (self.timeout_s,)).fetchone()
        if row is None:
            return False
        pid = int(row[0])
        if not db.execute("SELECT pg_terminate_backend(?, ?)", (pid, _END_WAIT_MS)).fetchone()[0]:
            return False
        self.ended = pid
        return True

    def release(self) -> None:
        """Stop leading (a clean shutdown: a follower takes over at its next poll)."""
        if self._db is not None and self.leader:
            with contextlib.suppress(sqlite3.Error):  # (the session is gone, and the lock with it)
                self._db.execute(f"SELECT pg_advisory_unlock({LEADER_LOCK_KEY})")
        self._drop()
        self.leader = not self.shared

    def _connection(self) -> Connection:
        if self._db is None:
            self._db = connect_postgres(self.target, self.timeout_s, self._keepalives())
        return self._db

    def _keepalives(self) -> dict[str, object]:
        """libpq parameters: this side's keepalives, and the server's for this session
        (``options``), each giving up on a silent peer within ``timeout_s``."""
        idle = max(1, int(self.timeout_s / 3))
        interval = max(1, int(self.timeout_s / 6))
        user_timeout_ms = int(self.timeout_s * 1000)
        return {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": interval,
                "keepalives_count": 2, "tcp_user_timeout": user_timeout_ms,
                "options": f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} "
                           f"-c tcp_keepalives_count=2 -c tcp_user_timeout={user_timeout_ms}"}

    def _drop(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
