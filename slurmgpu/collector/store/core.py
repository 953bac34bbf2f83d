"""The collector's store: ``Store``, the one owner of the fleet database (SQLite or
PostgreSQL, see ``backend``); the collector acknowledges a message only after its batch
commits. Its parts: ``schema``, ``ingest``, ``queries`` and ``automation``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import slurmgpu.collector.store.queries as queries
from slurmgpu.collector.store.automation import TABLES, AutomationRecord, stored_version
from slurmgpu.collector.store.backend import describe, is_postgres
from slurmgpu.collector.store.history import Rows
from slurmgpu.collector.store.ingest import Ingest
from slurmgpu.collector.store.schema import connect, schema_version
from slurmgpu.collector.store.walcheckpoint import WalCheckpointer

# What the automation left besides its state: forgotten with it by ``reset_automation``.
_AUTOMATION_TRACES = ("pending_drains", "checkpoints", "job_events", "decisions")


class Store(Ingest):
    """The fleet database. Not thread-safe: one owner (the collector loop)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 10.0,
                 sample_interval_s: float = 3600.0) -> None:
        # A file's path, or a PostgreSQL URL (kept as given: readers open it again).
        self.path: Path | str = str(path) if is_postgres(path) else Path(path)
        super().__init__(connect(self.path, timeout_s), sample_interval_s)
        self._checkpointer: WalCheckpointer | None = None

    @property
    def where(self) -> str:
        """The database as shown in logs and messages (a URL without its password)."""
        return describe(self.path)

    def schema_version(self) -> int:
        return schema_version(self.db)

    def checkpoint_in_background(self) -> None:
        """SQLite: WAL checkpoints in a thread of their own, not inside the collector's
        commits (``walcheckpoint``). The collector calls it; short-lived readers do not."""
        if isinstance(self.path, Path) and str(self.path) != ":memory:" and self._checkpointer is None:
            self._checkpointer = WalCheckpointer(self.path, self.db)
            self._checkpointer.start()

    def close(self) -> None:
        """Write the partial hourly samples, then close."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        rows = Rows()
        self.history.flush(time.time(), rows)
        if rows.samples and str(self.path) != ":memory:":
            # (read-only or gone: the partial hour is lost, nothing else)
            with contextlib.suppress(sqlite3.Error), self.transaction():
                rows.write(self.db)
        self.db.close()

    # ------------------------------------------------------------------ reads

    def fleet(self) -> list[queries.FleetRow]:
        return queries.fleet(self.db)

    def events(self, node: str | None = None, since: float | None = None,
               limit: int | None = None) -> list[queries.EventRow]:
        return queries.events(self.db, node, since, limit)

    def decisions(self, node: str | None = None, limit: int = 100) -> list[queries.DecisionRow]:
        return queries.decisions(self.db, node, limit)

    def latest_report(self, node: str) -> queries.LatestReport | None:
        return queries.latest_report(self.db, node)

    def count(self, table: str) -> int:
        return queries.count(self.db, table)

    def checkpoints(self, *, job_id: str | None = None, active: bool = False,
                    limit: int = 1000) -> list[queries.CheckpointRow]:
        return queries.checkpoints(self.db, job_id=job_id, active=active, limit=limit)

    def pending_drains(self) -> list[queries.PendingDrain]:
        return queries.pending_drains(self.db)

    def job_events(self, job_id: str) -> list[queries.JobEventRow]:
        return queries.job_events(self.db, job_id)

    # ------------------------------------------------------------------ bulk writes

    def insert_rows(self, table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> None:
        """Rows written as they are, one ``executemany`` (a seeded history: ``sim/seed``);
        inside the caller's ``transaction``."""
        names = ", ".join(f'"{c}"' for c in columns)
        self.db.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})", rows)

    @contextlib.contextmanager
    def index_rebuilt(self, index: str) -> Iterator[None]:
        """``index`` dropped for a bulk load and built again after it (several times faster)."""
        index_sql = queries.index_sql(self.db, index)
        self.db.execute(f"DROP INDEX {index}")
        yield
        self.db.execute(index_sql)

    # ------------------------------------------------------------------ the automation

    def automation(self) -> AutomationRecord:
        """The automation's state, read now (``AutomationRecord.version`` None: none stored)."""
        return AutomationRecord(self)

    def automation_version(self) -> int | None:
        """The version of the automation's state (every write bumps it); None: none stored."""
        return stored_version(self.db)

    def reset_automation(self) -> None:
        """Forget the automation's state, its pending checkpoints, job timelines and
        decisions (the simulator's reset between tests; the collector must be stopped)."""
        with self.transaction() as db:
            for table in (*TABLES, *_AUTOMATION_TRACES):
                db.execute(f"DELETE FROM {table}")
