"""Named read queries over the fleet database: one function per question, each taking a
connection and returning typed rows, one SQL text for both backends. Everything outside
this package reads through here (``slurmgpu.report.model`` keeps its own SQL).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, cast

import msgpack

from slurmgpu.collector.store.backend import Connection, Cursor, dialect_of, is_postgres
from slurmgpu.collector.store.schema import connect_postgres, expected_tables
from slurmgpu.result import Severity

# Severity ranks as the store orders them (OK < WARN < UNKNOWN < FAIL); any other
# severity string ranks as UNKNOWN.
_RANK_SQL = ("CASE f.severity " + " ".join(f"WHEN '{s.name}' THEN {s.rank}" for s in Severity
                                           if s is not Severity.UNKNOWN)
             + f" ELSE {Severity.UNKNOWN.rank} END")


# Each node's latest state change (its highest seq; the latest ts of that seq), from the
# index report_history_node_seq_ts alone, and that change's findings.
CURRENT_FINDINGS_SQL = (
    "WITH latest AS (SELECT node, max(seq) AS seq FROM report_history GROUP BY node), "
    "cur AS (SELECT h.node, h.seq, max(h.ts) AS ts FROM report_history h JOIN latest "
    "ON h.node = latest.node AND h.seq = latest.seq GROUP BY h.node, h.seq) "
    f"SELECT f.node, f.gpu, f.check_id, f.severity, max({_RANK_SQL}), count(*) "
    "FROM findings f JOIN cur ON f.node = cur.node AND f.ts = cur.ts "
    "AND f.seq = cur.seq GROUP BY f.node, f.gpu, f.check_id, f.severity")


class FleetRow(TypedDict):
    node: str
    verdict: str | None
    first_seen: float
    last_seen: float
    last_seq: int
    worst_check: str | None
    worst_severity: str | None
    worst_message: str | None
    worst_gpu: int | None
    reachable: bool
    unreachable_since: float | None
    agent_version: str | None


class EventRow(TypedDict):
    node: str
    seq: int
    ts: float
    kind: str
    gpu: int | None
    data: int | None
    verdict: str
    body: Any


class DecisionRow(TypedDict):
    id: int
    time: float
    node: str
    action: str
    reason: str | None
    held: bool
    dry_run: bool
    trigger: str | None
    result: str | None


class LatestReport(TypedDict):
    node: str
    seq: int
    ts: float
    verdict: str
    body: Any
    facts_ts: float | None  # the report time of its facts (None: in the body, or none)


class CheckpointRow(TypedDict):
    id: int
    job_id: str
    action: str
    reason: str | None
    trigger_node: str
    nodes: list[str]
    user: str | None
    requested: float
    deadline: float
    state: str
    acked_at: float | None
    acked_by: str | None
    closed: float | None


class PendingDrain(TypedDict):
    node: str
    action: str
    reason: str | None
    trigger: str | None
    since: float
    checkpoints: list[int]


class JobEventRow(TypedDict):
    ts: float
    kind: str
    node: str | None
    detail: str | None


class FindingCount(NamedTuple):
    """Current non-OK findings of one (node, gpu, check, severity)."""

    node: str
    gpu: int | None
    check: str
    severity: str
    rank: int  # the severity's rank (Severity.rank; an unknown name ranks as UNKNOWN)
    n: int


class EventCount(NamedTuple):
    kind: str
    xid: int | None  # for kind "xid": the XID number (None: not recorded)
    n: int


class DecisionCount(NamedTuple):
    action: str
    result: str  # "error" for every "error: ..." result
    trigger: str
    n: int


def _where(sql: str, *conditions: tuple[str, tuple[Any, ...]] | None) -> tuple[str, list[Any]]:
    """``sql`` with a WHERE of the conditions given (each its SQL and its parameters)."""
    given = [c for c in conditions if c is not None]
    if given:
        sql += " WHERE " + " AND ".join(condition for condition, _ in given)
    return sql, [value for _, values in given for value in values]


def _dicts(cur: Cursor) -> list[dict[str, Any]]:
    """A query's rows as {column: value} dicts."""
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


@contextlib.contextmanager
def snapshot(path: str | Path, timeout_s: float = 5.0) -> Iterator[Connection]:
    """A read-only connection to the database at ``path`` (or a ``postgresql://`` URL)
    inside one read transaction (every query sees the same snapshot; WAL readers never
    block the collector, nor do PostgreSQL's)."""
    if is_postgres(path):
        db: Connection = connect_postgres(str(path), timeout_s)
    else:
        db = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, timeout=timeout_s,
                             isolation_level=None)
    try:
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if is_postgres(path) else "BEGIN")
        yield db
    finally:
        db.close()


# ---------------------------------------------------------------------- nodes and messages


def fleet(db: Connection) -> list[FleetRow]:
    """Every node the collector heard from, by name: its verdict, worst finding, reachability."""
    out = _dicts(db.execute(
        "SELECT node, verdict, first_seen, last_seen, last_seq, worst_check, worst_severity, "
        "worst_message, worst_gpu, reachable, unreachable_since, agent_version FROM nodes ORDER BY node"))
    for item in out:
        item["reachable"] = bool(item["reachable"])
    return cast(list[FleetRow], out)


def current_findings(db: Connection) -> list[FindingCount]:
    """The non-OK findings of each node's latest state change (report_history records a
    row, with its non-OK findings, only when a node's state changes), counted per node,
    GPU, check and severity."""
    return [FindingCount(node, gpu, check, severity, int(rank), int(count))
            for node, gpu, check, severity, rank, count in db.execute(CURRENT_FINDINGS_SQL)]


def latest_report(db: Connection, node: str) -> LatestReport | None:
    """The node's latest report, its body decoded, with the node's last facts (agents
    send them every ``full_report_s``: ``facts_ts`` says from when; None: in the body, or
    none yet)."""
    row = db.execute("SELECT r.seq, r.ts, r.verdict, r.body, f.facts, f.facts_ts FROM reports r "
                     "LEFT JOIN node_facts f ON f.node = r.node WHERE r.node = ?", (node,)).fetchone()
    if row is None:
        return None
    body = msgpack.unpackb(row[3], raw=False)
    if row[4] is not None:
        body["facts"] = bytes(row[4])
    if isinstance(body.get("facts"), bytes):  # agents send facts pre-packed
        body["facts"] = msgpack.unpackb(body["facts"], raw=False)
    return {"node": node, "seq": row[0], "ts": row[1], "verdict": row[2], "body": body,
            "facts_ts": row[5]}


def hello_times(db: Connection) -> dict[str, float]:
    """{node: when its latest hello was stored}."""
    return {str(n): float(t) for n, t in db.execute(
        "SELECT node, max(received_at) FROM messages WHERE type = 'hello' GROUP BY node")}


def index_sql(db: Connection, name: str) -> str:
    """The CREATE INDEX statement of one of the store's indexes (KeyError: no such index)."""
    row = db.execute(dialect_of(db).index_sql, (name,)).fetchone()
    if row is None:
        raise KeyError(name)
    return str(row[0])


def count(db: Connection, table: str) -> int:
    """The rows of one of the store's tables."""
    if table not in expected_tables():
        raise ValueError(f"unknown table {table!r}")
    return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


# ---------------------------------------------------------------------- events and decisions


def events(db: Connection, node: str | None = None, since: float | None = None,
           limit: int | None = None) -> list[EventRow]:
    """Events (all nodes, or one; from ``since``), oldest first, bodies decoded."""
    sql, params = _where("SELECT node, seq, ts, kind, gpu, data, verdict, body FROM events",
                         None if node is None else ("node = ?", (node,)),
                         None if since is None else ("ts >= ?", (since,)))
    sql += " ORDER BY ts, node, seq"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return [{"node": n, "seq": seq, "ts": ts, "kind": kind, "gpu": gpu, "data": data,
             "verdict": verdict, "body": msgpack.unpackb(body, raw=False)}
            for n, seq, ts, kind, gpu, data, verdict, body in db.execute(sql, params)]


def event_counts(db: Connection) -> list[EventCount]:
    """Events stored, per kind (and XID number for XID events)."""
    return [EventCount(kind, xid, int(n)) for kind, xid, n in db.execute(
        "SELECT kind, CASE WHEN kind = 'xid' THEN data END, count(*) FROM events GROUP BY 1, 2")]


_DECISIONS = "SELECT id, time, node, action, reason, held, dry_run, trigger, result FROM decisions"


def decisions(db: Connection, node: str | None = None, limit: int = 100) -> list[DecisionRow]:
    """The latest automation decisions (all nodes, or one), oldest first."""
    sql, params = _where(_DECISIONS, None if node is None else ("node = ?", (node,)))
    out = _decision_rows(db.execute(sql + " ORDER BY id DESC LIMIT ?", [*params, max(0, int(limit))]))
    out.reverse()
    return out


def decisions_since(db: Connection, node: str, since: float) -> list[DecisionRow]:
    """The automation's decisions about ``node`` at or after ``since``, oldest first."""
    return _decision_rows(db.execute(f"{_DECISIONS} WHERE node = ? AND time >= ? ORDER BY time, id",
                                     (node, since)))


def _decision_rows(cur: Cursor) -> list[DecisionRow]:
    out = _dicts(cur)
    for item in out:
        item["held"], item["dry_run"] = bool(item["held"]), bool(item["dry_run"])
    return cast(list[DecisionRow], out)


def decision_counts(db: Connection) -> list[DecisionCount]:
    """Automation decisions per action, result ("error: ..." as "error") and trigger."""
    return [DecisionCount(str(action), str(result), str(trigger), int(n))
            for action, result, trigger, n in db.execute(
                "SELECT action, CASE WHEN result LIKE 'error:%' THEN 'error' "
                "ELSE coalesce(result, '') END, coalesce(trigger, ''), count(*) "
                "FROM decisions GROUP BY 1, 2, 3")]


# ---------------------------------------------------------------------- checkpoints and jobs


def checkpoints(db: Connection, *, job_id: str | None = None, active: bool = False,
                limit: int = 1000) -> list[CheckpointRow]:
    """Checkpoint requests, oldest first; ``active``: not closed yet (open, or acked /
    expired with the node's drain still to be carried out)."""
    sql, params = _where('SELECT id, job_id, action, reason, trigger_node, nodes, "user", requested, deadline, '
                         "state, acked_at, acked_by, closed FROM checkpoints",
                         None if job_id is None else ("job_id = ?", (job_id,)),
                         ("closed IS NULL", ()) if active else None)
    out = _dicts(db.execute(sql + " ORDER BY id LIMIT ?", [*params, max(0, int(limit))]))
    for item in out:
        item["nodes"] = json.loads(item["nodes"])
    return cast(list[CheckpointRow], out)


def checkpoint_states(db: Connection) -> dict[str, int]:
    """{state: checkpoint requests}; empty for a database without checkpoints (schema < 3)."""
    try:
        return {str(state): int(n) for state, n in
                db.execute("SELECT state, count(*) FROM checkpoints GROUP BY state")}
    except sqlite3.OperationalError:  # no such table
        return {}


def pending_drains(db: Connection) -> list[PendingDrain]:
    """Nodes whose drain waits for their jobs' checkpoints, oldest first."""
    cur = db.execute("SELECT node, action, reason, trigger, since, checkpoints "
                     "FROM pending_drains ORDER BY since, node")
    return [{"node": n, "action": a, "reason": r, "trigger": t, "since": s,
             "checkpoints": json.loads(c)} for n, a, r, t, s, c in cur]


def pending_drain_count(db: Connection) -> int:
    """How many nodes' drains wait for checkpoints (0 for a database from before them)."""
    try:
        return int(db.execute("SELECT count(*) FROM pending_drains").fetchone()[0])
    except sqlite3.OperationalError:  # no such table
        return 0


def job_events(db: Connection, job_id: str) -> list[JobEventRow]:
    """A job's timeline (detected, signalled, acked, drained, requeued...), in order."""
    cur = db.execute("SELECT ts, kind, node, detail FROM job_events WHERE job_id = ? "
                     "ORDER BY ts, id", (job_id,))
    return [{"ts": ts, "kind": k, "node": n, "detail": d} for ts, k, n, d in cur]


def first_job_event(db: Connection, job_id: str, kind: str) -> JobEventRow | None:
    """The job's first ``kind`` event."""
    return next((e for e in job_events(db, job_id) if e["kind"] == kind), None)


class CurrentDrain(NamedTuple):
    """A node Slurm showed drained at the collector's last poll."""

    since: float
    drained_by: str | None  # automation, prolog, epilog, healthcheck, operator, outside, slurmgpu
    reason: str | None


def current_drains(db: Connection, node: str | None = None) -> dict[str, CurrentDrain]:
    """The nodes (or ``node``) whose latest drain/resume row in ``node_states`` is a drain."""
    where, args = ("AND node = ? ", (node,)) if node is not None else ("", ())
    cur = db.execute("SELECT s.node, s.ts, s.drained_by, s.reason FROM node_states s JOIN "
                     "(SELECT max(id) AS id FROM node_states WHERE kind IN ('drained', 'resumed') "
                     f"{where}GROUP BY node) m ON s.id = m.id WHERE s.kind = 'drained'", args)
    return {str(n): CurrentDrain(float(ts), by, reason) for n, ts, by, reason in cur}


# ---------------------------------------------------------------------- /metrics
# Read for every node at every scrape: columns, not an object per node.


class NodeVerdictColumns(NamedTuple):
    """Every node (a list per column, one index per node)."""

    nodes: list[str]
    last_seen: list[float]  # when it was last heard from
    reachable: list[int]  # 1 reachable, 0 not
    verdicts: list[str | None]  # of its latest report (None: no report yet)


def node_verdict_columns(db: Connection) -> NodeVerdictColumns:
    """Every node with when it was last heard, whether it is reachable, its latest verdict;
    in the order of first sight on SQLite (rowid), by name on PostgreSQL."""
    order = "n.rowid" if dialect_of(db).name == "sqlite" else "n.node"
    rows = db.execute("SELECT n.node, n.last_seen, n.reachable, r.verdict FROM nodes n "
                      f"LEFT JOIN reports r ON r.node = n.node ORDER BY {order}").fetchall()
    nodes, seen, reachable, verdicts = zip(*rows, strict=True) if rows else ((), (), (), ())
    return NodeVerdictColumns([str(n) for n in nodes], [float(t) for t in seen],
                              [1 if r else 0 for r in reachable], list(verdicts))


# ---------------------------------------------------------------------- validation (slurmgpu validate)


def latest_validations(db: Connection) -> list[tuple[str, int, float, dict[str, Any]]]:
    """Each node's newest ``validation`` event: (node, seq, ts, body decoded)."""
    rows = db.execute("SELECT e.node, e.seq, e.ts, e.body FROM events e WHERE e.kind = 'validation' AND e.ts = "
                      "(SELECT max(ts) FROM events l WHERE l.node = e.node AND l.kind = 'validation') "
                      "ORDER BY e.node, e.seq")
    latest: dict[str, tuple[str, int, float, dict[str, Any]]] = {}
    for node, seq, ts, body in rows:
        latest[node] = (node, int(seq), float(ts), msgpack.unpackb(body, raw=False))
    return list(latest.values())


def validation_since(db: Connection, node: str, since: float) -> dict[str, Any] | None:
    """The node's newest ``validation`` event at or after ``since`` (its body decoded), or None."""
    row = db.execute("SELECT body FROM events WHERE node = ? AND kind = 'validation' AND ts >= ? "
                     "ORDER BY ts DESC, seq DESC LIMIT 1", (node, since)).fetchone()
    return None if row is None else dict(msgpack.unpackb(row[0], raw=False))
