"""Issue 15: on PostgreSQL an INSERT of many rows is one statement over arrays (``unnest``),
not a statement per row; an upsert whose rows repeat a conflict key goes row by row (one
statement may not update a row twice). Same rows either way."""

from __future__ import annotations

import contextlib

import pytest

from slurmgpu.collector.store import Store
from slurmgpu.collector.store.ingest import _UPSERT_NODES

pytestmark = pytest.mark.postgresql

SAMPLES = ("INSERT INTO node_samples (node, ts, span_s, reports, fail_reports, hw_slowdown_reports, "
           "sw_thermal_reports) VALUES (?,?,?,?,?,?,?) ON CONFLICT (node, ts) DO UPDATE SET "
           "reports = excluded.reports")


def test_one_statement_for_many_rows_same_rows(pg_url: str) -> None:
    with contextlib.closing(Store(pg_url)) as store:
        db = store.db
        plan = db._unnest(_UPSERT_NODES)  # type: ignore[attr-defined]
        assert plan is not None and "unnest(" in plan.sql and plan.width == 15
        assert db._unnest("UPDATE nodes SET reachable = ? WHERE node = ?") is None  # type: ignore[attr-defined]
        rows = [(f"n{i}", 1.0, 2.0, i, "OK", 3.0, None, None, None, None, "v1", "e", i, 7, i % 2 * 7)
                for i in range(50)]
        db.execute("BEGIN")
        db.executemany(_UPSERT_NODES, rows)  # one statement
        db.executemany(_UPSERT_NODES, rows[:1])  # one row: the plain path
        db.execute("COMMIT")
        got = db.execute("SELECT node, last_seq, verdict, agent_version, verdict_seq, reachable, changed, "
                         "history_changed FROM nodes ORDER BY last_seq").fetchall()
        assert [tuple(r) for r in got] == [(f"n{i}", i, "OK", "v1", i, 1, 7, i % 2 * 7) for i in range(50)]


def test_an_upsert_repeating_a_key_goes_row_by_row(pg_url: str) -> None:
    with contextlib.closing(Store(pg_url)) as store:
        db = store.db
        rows = [("n1", 3600.0, 3600.0, n, 0, 0, 0) for n in (1, 2, 3)] + [("n2", 3600.0, 3600.0, 9, 0, 0, 0)]
        plan = db._unnest(SAMPLES)  # type: ignore[attr-defined]
        assert plan is not None and not plan.fits(rows) and plan.fits(rows[2:])
        db.execute("BEGIN")
        db.executemany(SAMPLES, rows)
        db.execute("COMMIT")
        got = db.execute("SELECT node, reports FROM node_samples ORDER BY node").fetchall()
        assert [tuple(r) for r in got] == [("n1", 3), ("n2", 9)]  # the last of each key, as row by row
