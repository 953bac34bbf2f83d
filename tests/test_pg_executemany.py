"""Issue 15: on PostgreSQL an INSERT of many rows is one statement over arrays (``unnest``),
not a statement per row; an upsert whose rows repeat a conflict key goes row by row (one
statement may not update a row twice). Same rows either way."""

from __future__ import annotations

import contextlib

import pytest

from slurmgpu.collector.store import Store
from slurmgpu.collector.store.ingest import _INSERT_MESSAGES, _UPSERT_NODES

pytestmark = pytest.mark.postgresql

SAMPLES = ("INSERT INTO node_samples (node, ts, span_s, reports, fail_reports, hw_slowdown_reports, "
           "sw_thermal_reports) VALUES (?,?,?,?,?,?,?) ON CONFLICT (node, ts) DO UPDATE SET "
           "reports = excluded.reports")


def test_one_statement_for_many_rows_same_rows(pg_url: str) -> None:
    with contextlib.closing(Store(pg_url)) as store:
        db = store.db
        plan = db._unnest(_UPSERT_NODES)  # type: ignore[attr-defined]
        assert plan is not None and "unnest(" in plan.sql and plan.width == 13
        assert db._unnest("UPDATE nodes SET reachable = ? WHERE node = ?") is None  # type: ignore[attr-defined]
        rows = [(f"n{i}", 1.0, 2.0, i, "OK", 3.0, None, None, None, None, "v1", "e", i)
                for i in range(50)]
        db.execute("BEGIN")
        db.executemany(_UPSERT_NODES, rows)  # one statement
        db.executemany(_UPSERT_NODES, rows[:1])  # one row: the plain path
        db.execute("COMMIT")
        got = db.execute("SELECT node, last_seq, verdict, agent_version, verdict_seq, reachable "
                         "FROM nodes ORDER BY last_seq").fetchall()
        assert [tuple(r) for r in got] == [(f"n{i}", i, "OK", "v1", i, 1) for i in range(50)]


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


EVENTS = "INSERT INTO events (node, seq, ts, kind, gpu, data, verdict, body) VALUES (?,?,?,?,?,?,?,?)"


@pytest.mark.parametrize(("odd", "as_text"), [
    ("ecc_dbe", True),  # every column one text: the fast statement
    ("a message with \x1f, the separator", False),  # a text that cannot be one: psycopg's arrays
    ("\x1e", False),  # a text equal to the NULL element: the same
    ('an array literal: {"a,b", NULL}\\', True),  # array syntax means nothing in a text
    ("NULL", True),  # nor does the word
])
def test_each_column_as_one_text_or_as_arrays_same_rows(pg_url: str, odd: str, as_text: bool) -> None:
    """Text, numbers, NULLs, bytes of every value, infinities, NaN: stored as given,
    whichever way the statement went (NULL text: ``test_one_statement_for_many_rows_same_rows``)."""
    rows = [("n1", 1, 1795751716.512, "xid", 3, 79, "FAIL", bytes(range(256))),
            ("n2", 2, float("inf"), "", None, -(1 << 63), "OK", b""),
            ("n3", 3, -2.5e-300, odd, 0, (1 << 63) - 1, "WARN", b"\x00\\x"),
            ("n4", 4, float("nan"), odd, None, None, "OK", b"\x1f\x1e,{}"),
            ("n5", 5, float("-inf"), odd, -1, 0, "OK", b"\xff")]
    with contextlib.closing(Store(pg_url)) as store:
        db = store.db
        plan = db._unnest(EVENTS)  # type: ignore[attr-defined]
        assert plan is not None
        assert (plan.statement(rows)[0] == plan.text_sql) is as_text
        db.execute("BEGIN")
        db.executemany(EVENTS, rows)
        db.execute("COMMIT")
        got = db.execute("SELECT node, seq, ts, kind, gpu, data, verdict, body FROM events ORDER BY seq").fetchall()
        assert repr([(*r[:7], bytes(r[7])) for r in got]) == repr(rows)  # (repr: NaN equals no float)


def test_a_value_of_another_type_goes_by_arrays(pg_url: str) -> None:
    """A bool where a number goes ("True" is not one) is never sent as text: psycopg's
    arrays take it (or refuse it) as before."""
    with contextlib.closing(Store(pg_url)) as store:
        plan = store.db._unnest(EVENTS)  # type: ignore[attr-defined]
        rows = [("n1", 1, 1.0, "xid", True, 79, "FAIL", b""), ("n1", 2, 2.0, "xid", 0, 79, "FAIL", b"")]
        assert plan.statement(rows)[0] == plan.sql


def test_returning_gives_every_rows_values(pg_url: str) -> None:
    """``ON CONFLICT DO NOTHING RETURNING`` over many rows: the rows inserted, not the ones
    already there (the duplicate claim of two collectors)."""
    sql = f"{_INSERT_MESSAGES} ON CONFLICT DO NOTHING RETURNING node, seq"
    rows = [(f"n{i % 3}", "e", i, "report", 1.0, 2.0, None) for i in range(6)]
    with contextlib.closing(Store(pg_url)) as store:
        db = store.db
        db.executemany(_INSERT_MESSAGES, rows[:2])
        assert sorted(db.executemany(sql, rows).fetchall()) == sorted((n, s) for n, _, s, *_ in rows[2:])
        assert db.executemany(sql, rows).fetchall() == []
