"""The report's return-to-service sections (docs/report.md): ``verdict_quality``, what the
drains that started in the window turned out to be, per check and per GPU model, with a
precision estimate; ``return-to-service``, how long the nodes that came back (or went to
repair) in the window took, per step. Both read schema 14's ``drain_outcomes`` and
``validations``; a database from before says so (``source`` None), never a zero.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from slurmgpu.report.model.common import _r

if TYPE_CHECKING:
    from slurmgpu.collector.store.backend import Connection

SCHEMA_WITH_OUTCOMES = 14
OUTCOMES = ("confirmed", "cleared_by_validation", "transient", "unknown")
#: Outcomes that judged the drain: right (confirmed, transient) or wrong (cleared_by_validation).
RIGHT = ("confirmed", "transient")
RESOLVED = (*RIGHT, "cleared_by_validation")
STEPS = ("validation", "reset", "reboot", "repair")


def has_outcomes(db: Connection) -> bool:
    row = db.execute("SELECT version FROM schema_version").fetchone()
    return row is not None and int(row[0]) >= SCHEMA_WITH_OUTCOMES


def verdict_quality(db: Connection, t0: float, t1: float) -> dict[str, Any]:
    """One row per check (and per check and GPU model) of the drains started in the window."""
    if not has_outcomes(db):
        return {"source": None, "checks": [], "by_gpu_model": []}
    rows = db.execute("SELECT check_id, gpu_model, outcome FROM drain_outcomes "
                      "WHERE drained_at > ? AND drained_at <= ?", (t0, t1)).fetchall()
    by_check: dict[str, Counter[str]] = defaultdict(Counter)
    by_model: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for check, model, outcome in rows:
        by_check[str(check)][str(outcome)] += 1
        by_model[(str(check), str(model or "unknown"))][str(outcome)] += 1
    return {"source": "drain_outcomes",
            "checks": [{"check": c, **_counts(n)} for c, n in sorted(by_check.items())],
            "by_gpu_model": [{"check": c, "gpu_model": m, **_counts(n)} for (c, m), n in sorted(by_model.items())]}


def _counts(n: Counter[str]) -> dict[str, Any]:
    """The row's counts and precision: the share of the judged drains that were right;
    None when none was judged (no resolved drain is no evidence either way)."""
    resolved = sum(n[o] for o in RESOLVED)
    right = sum(n[o] for o in RIGHT)
    return {"drains": sum(n.values()), **{o: n[o] for o in OUTCOMES}, "resolved": resolved,
            "precision": _r(right / resolved, 3) if resolved else None}


def return_to_service(db: Connection, t0: float, t1: float) -> dict[str, Any]:
    """Time from drain to return (or to the repair hand-off), per step, of the drains
    resolved in the window; the validations run in it, per trigger and verdict."""
    if not has_outcomes(db):
        return {"source": None, "steps": [], "validations": []}
    drains = db.execute("SELECT DISTINCT node, drained_at, resolved_at, returned_by FROM drain_outcomes "
                        "WHERE resolved_at > ? AND resolved_at <= ? AND returned_by IS NOT NULL",
                        (t0, t1)).fetchall()
    times: dict[str, list[float]] = defaultdict(list)
    for _node, drained_at, resolved_at, step in drains:
        times[str(step)].append(float(resolved_at) - float(drained_at))
    runs = db.execute("SELECT trigger, verdict, count(*) FROM validations WHERE started > ? AND started <= ? "
                      "GROUP BY trigger, verdict", (t0, t1)).fetchall()
    return {"source": "drain_outcomes",
            "steps": [_step(step, times[step]) for step in STEPS if times.get(step)],
            "validations": [{"trigger": t, "verdict": v, "runs": int(n)}
                            for t, v, n in sorted(runs, key=lambda r: (str(r[0]), str(r[1])))]}


def _step(step: str, seconds: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(seconds)
    return {"step": step, "nodes": len(ordered), "median_s": _r(_rank(ordered, 0.5), 1),
            "p90_s": _r(_rank(ordered, 0.9), 1), "max_s": _r(ordered[-1], 1)}


def _rank(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of a sorted, non-empty list."""
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
