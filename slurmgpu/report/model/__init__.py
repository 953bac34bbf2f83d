"""The fleet report model: SQL over the collector's database -> one plain dict.

Every number here is defined in docs/report.md (which table, which rows, which
arithmetic). The window is ``(from, to]``: rows with ``from < ts <= to`` are "in the
window"; the value of a stored-on-change table at time ``t`` is its last row with
``ts <= t`` (so the state at the window's start is the last row at or before ``from``).

Volume: ``node_samples`` (one row per node per hour) is only ever aggregated in SQL;
the other tables are small (transitions, changes) or read through GROUP BY.
"""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from slurmgpu.decision import REASON_PREFIX
from slurmgpu.report import SCHEMA
from slurmgpu.report.model.builder import Builder
from slurmgpu.report.model.common import (
    HOUR,
    MIN_SCHEMA_VERSION,
    SERVICE_REASON_CHECKS,
    _hours,
    _r,
    _ts,
)
from slurmgpu.report.model.remediation import return_to_service, verdict_quality
from slurmgpu.report.model.window import (
    ReportError,
    iso,
    parse_duration,
    parse_time,
    resolve_window,
)
from slurmgpu.report.render_util import spans_in_words

if TYPE_CHECKING:
    from slurmgpu.collector.store.backend import Connection
    from slurmgpu.config.load import LoadedConfig

__all__ = ["ReportError", "build_report", "iso", "open_db", "parse_duration", "parse_time",
           "report_from_path", "resolve_window"]

# --------------------------------------------------------------------------- database


def _connect(path: str | Path) -> Connection:
    """A file: SQLite, read-only. A ``postgresql://`` URL: PostgreSQL, in one read-only
    snapshot (every query of the report sees the same data)."""
    if "://" in str(path):
        from slurmgpu.collector.store.schema import connect_postgres

        pg = connect_postgres(str(path), 10.0)
        pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return pg
    p = Path(path)
    if not p.is_file():
        raise ReportError(f"{path}: no fleet database (is the collector running?)")
    uri = f"file:{quote(str(p.resolve()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=10.0)


def open_db(path: str | Path) -> Connection:
    """The fleet database, read-only; ReportError when it is missing, not a fleet
    database or older than the report needs."""
    try:
        db = _connect(path)
        row = db.execute("SELECT version FROM schema_version").fetchone()
    except sqlite3.Error as exc:
        raise ReportError(f"{_shown(path)}: not a readable slurmgpu fleet database ({exc})") from None
    version = int(row[0]) if row else 0
    if version < MIN_SCHEMA_VERSION:
        db.close()
        raise ReportError(f"{_shown(path)}: schema version {version} is older than the report needs "
                          f"({MIN_SCHEMA_VERSION}); start this slurmgpu's collector once to "
                          "migrate it")
    return db


def _shown(path: str | Path) -> str:
    """The database as the report names it (a URL without its password)."""
    if "://" not in str(path):
        return str(path)
    from slurmgpu.collector.store.backend import describe

    return describe(str(path))


def _lemons(db: Connection) -> dict[str, Any]:
    """The automation's lemon nodes, from its state in the database (``automation_lemons``,
    schema 7); none in a database from before it."""
    try:
        rows = db.execute("SELECT node, since, why FROM automation_lemons ORDER BY node").fetchall()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):
            return {"source": None, "error": None, "nodes": []}
        return {"source": "automation_lemons", "error": f"{type(exc).__name__}: {exc}", "nodes": []}
    nodes = [{"node": str(node), "since": _ts(since), "why": spans_in_words(why) if why else why}
             for node, since, why in rows]
    return {"source": "automation_lemons", "error": None, "nodes": nodes}


def _service(b: Builder, ecc: dict[str, Any], started: Counter[str],
             lemons: dict[str, Any], pins: dict[str, Any]) -> dict[str, Any]:
    """The nodes to send to a technician: GPUs with remap flags, 2+ drains in the window,
    drained for an XID or a lost GPU, off their version pins; the lemons."""
    due: dict[str, list[str]] = defaultdict(list)
    for flag in ecc["remap_flags"]:
        what = "remap_failure" if flag["remap_failure"] else "remap_pending"
        due[flag["node"]].append(f"GPU {flag['gpu']} {what}")
    for n in b.nodes.values():
        if started[n.name] >= 2:
            due[n.name].append(f"{started[n.name]} drains in window")
        current = n.drains[-1] if n.drains and n.drains[-1].end is None else None
        reason = (current.reason_now or "") if current else ""
        if current and reason.startswith(REASON_PREFIX) and any(c in reason for c in SERVICE_REASON_CHECKS):
            due[n.name].append(f"drained: {reason}")
    for node in pins["off_pin_nodes"]:
        due[node].append("off its version pins (see Version pin drift)")
    lemon_names = [x["node"] for x in lemons["nodes"]]
    return {"lemons": lemons["nodes"], "lemons_source": lemons["source"],
            "lemons_error": lemons["error"],
            "due": [{"node": node, "lemon": node in lemon_names, "reasons": why}
                    for node, why in sorted(due.items())]}


def _mtbf(b: Builder, versions: dict[tuple[Any, ...], dict[str, Any]],
          started: Counter[str]) -> dict[str, Any]:
    """MTBF per GPU model: node-hours per drain started and per transition to FAIL."""
    per_model: dict[str, dict[str, float]] = defaultdict(lambda: {"nodes": 0, "s": 0.0,
                                                                  "drains": 0, "fails": 0})
    for n in b.nodes.values():
        model = versions.get((n.name,), {}).get("gpu_model") or "unknown"
        m = per_model[model]
        m["nodes"] += 1
        m["s"] += n.observed_s
        m["drains"] += started[n.name]
        m["fails"] += n.fail_transitions
    return {"models": [{
        "gpu_model": model, "nodes": int(m["nodes"]), "node_hours": _hours(m["s"]),
        "drains": int(m["drains"]), "fail_transitions": int(m["fails"]),
        "mtbf_drain_h": _r(m["s"] / HOUR / m["drains"], 3) if m["drains"] else None,
        "mtbf_fail_h": _r(m["s"] / HOUR / m["fails"], 3) if m["fails"] else None,
    } for model, m in sorted(per_model.items())]}


def _summary(b: Builder, s: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers, from the sections ``s``."""
    availability, drains, failures, xids, jobs = (s["availability"], s["drains"], s["failures"],
                                                  s["xids"], s["jobs"])
    return {
        "nodes": len(b.nodes),
        "node_hours": availability["fleet"]["node_hours"],
        "availability_pct": availability["fleet"]["availability_pct"],
        "drains": drains["count"],
        "drained_at_end": drains["ongoing_at_end"],
        "new_failures": failures["total"],
        "failing_nodes": failures["nodes"],
        "xids": xids["total"],
        "xid_nodes": xids["nodes"],
        "gpus_ecc_rising": s["ecc-trends"]["gpus_rising"],
        "jobs_prolog_blocked": jobs["prolog_blocked"]["jobs"],
        "jobs_checkpointed": jobs["checkpoints"]["jobs"],
        "jobs_requeued": jobs["requeued"]["jobs"],
        "lemons": len(s["service"]["lemons"]),
        "due_for_service": len(s["service"]["due"]),
        "nodes_off_pin": s["pin-drift"]["nodes_off_pin"],
    }


def build_report(db: Connection, t0: float, t1: float, *,
                 config: LoadedConfig | None = None, generated_at: float,
                 source: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report model for the window ``(t0, t1]`` (see docs/report.md)."""
    b = Builder(db, t0, t1, config)
    try:
        b.start_throttling()  # (runs beside the sections below; its result is read last)
        top = b.settings(None)
        b.load_nodes()
        s: dict[str, Any] = {"availability": b.availability(), "drains": b.drains(),
                             "failures": b.failures(), "xids": b.xids(top), "ecc-trends": b.ecc(),
                             "ib": b.ib()}
        versions = b.versions()
        s["pin-drift"] = b.pin_drift(versions)
        s["jobs"] = b.jobs()
        s["throttling"] = b.throttling()
    finally:
        b.close()
    started = Counter({n.name: sum(1 for r in n.drains if t0 < r.start <= t1)
                       for n in b.nodes.values()})
    s["service"] = _service(b, s["ecc-trends"], started, _lemons(db), s["pin-drift"])
    s["mtbf"] = _mtbf(b, versions, started)
    s["verdict_quality"] = verdict_quality(db, t0, t1)
    s["return-to-service"] = return_to_service(db, t0, t1)
    return {
        "schema": SCHEMA,
        "generated_at": iso(generated_at),
        "window": {"from": iso(t0), "to": iso(t1), "seconds": _r(t1 - t0, 3),
                   "from_ts": _ts(t0), "to_ts": _ts(t1)},
        "source": source or {},
        "summary": _summary(b, s),
        **{key: s[key] for key in ("availability", "drains", "failures", "xids", "ecc-trends",
                                   "throttling", "ib", "pin-drift", "service", "jobs", "mtbf",
                                   "verdict_quality", "return-to-service")},
    }


def report_from_path(path: str | Path, t0: float, t1: float, *, config: LoadedConfig | None,
                     generated_at: float) -> dict[str, Any]:
    """Open ``path`` read-only and build the model (config: [[hosts]], pins)."""
    db = open_db(path)
    try:
        version = int(db.execute("SELECT version FROM schema_version").fetchone()[0])
        return build_report(db, t0, t1, config=config, generated_at=generated_at,
                            source={"db": _shown(path), "schema_version": version,
                                    "config": config.path if config is not None else None})
    except sqlite3.Error as exc:
        raise ReportError(f"{_shown(path)}: {exc}") from None
    finally:
        db.close()
