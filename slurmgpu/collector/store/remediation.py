"""Return to service in the fleet database (schema 14): the validation history
(``validations``), what each drain turned out to be (``drain_outcomes``, read by the
report's ``verdict_quality``) and the open remediation ladders (``remediation_ladders``,
the JSON of ``slurmgpu.remediation.ladder.Ladder``). Functions over a connection; the
caller holds the transaction (``Store.transaction``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from typing import Any

from slurmgpu.collector.store.backend import Connection, insert_sql
from slurmgpu.collector.store.leader import LEADER_LOCK_KEY
from slurmgpu.remediation.ladder import TERMINAL, Ladder, Stage, ValidationRun

TRIGGERS = ("return", "idle", "manual")
OUTCOMES = ("confirmed", "cleared_by_validation", "transient", "unknown")
#: The advisory lock an idle validation pass holds on PostgreSQL (beside the leader's).
IDLE_PASS_LOCK_KEY = LEADER_LOCK_KEY + 1


@dataclass(frozen=True)
class ValidationRow:
    """One validation run: ``trigger`` return, idle or manual; ``verdict`` None while it
    runs; ``outcome``: what came of it (released, drained, retried, held; idle runs: passed,
    reported, preempted, retried)."""

    node: str
    started: float
    trigger: str
    tier: str
    verdict: str | None = None
    duration_s: float | None = None
    reservation: str | None = None
    job_id: str | None = None
    outcome: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class DrainOutcome:
    """What one drain turned out to be, for one of its checks (``OUTCOMES``);
    ``returned_by``: the step that brought the node back (validation, reset, reboot)."""

    node: str
    drained_at: float
    check: str
    gpu_model: str | None
    outcome: str
    resolved_at: float | None = None
    returned_by: str | None = None


_VALIDATION_COLUMNS = tuple(f.name for f in fields(ValidationRow))
_OUTCOME_COLUMNS = ("node", "drained_at", "check_id", "gpu_model", "outcome", "resolved_at", "returned_by")


def record_validation(db: Connection, row: ValidationRow) -> None:
    """Insert the run, or update it (same node and start): its verdict, duration, outcome."""
    if row.trigger not in TRIGGERS:
        raise ValueError(f"validation trigger {row.trigger!r} (expected one of {', '.join(TRIGGERS)})")
    db.execute(insert_sql("validations", _VALIDATION_COLUMNS, ("node", "started")), astuple(row))


def validations(db: Connection, node: str | None = None) -> list[ValidationRow]:
    """The validation history, oldest first; of one node with ``node``."""
    where, params = (" WHERE node = ?", (node,)) if node is not None else ("", ())
    rows = db.execute(f"SELECT {', '.join(_VALIDATION_COLUMNS)} FROM validations{where} "
                      "ORDER BY started, node", params).fetchall()
    return [ValidationRow(*row) for row in rows]


def last_validated(db: Connection) -> dict[str, float]:
    """Each node's latest validation start that gave a verdict (pass or fail), any trigger:
    what ``triggers.due_for_idle_validation`` reads."""
    rows = db.execute("SELECT node, max(started) FROM validations WHERE verdict IN ('pass', 'fail') "
                      "GROUP BY node").fetchall()
    return {str(node): float(ts) for node, ts in rows}


@contextlib.contextmanager
def idle_pass_lock(db: Connection, *, postgres: bool) -> Iterator[bool]:
    """Whether an idle validation pass may run: on PostgreSQL (several heads) whether this
    session got ``IDLE_PASS_LOCK_KEY``, held until the pass ends; on SQLite always."""
    if not postgres:
        yield True
        return
    got = bool(db.execute(f"SELECT pg_try_advisory_lock({IDLE_PASS_LOCK_KEY})").fetchone()[0])
    try:
        yield got
    finally:
        if got:
            db.execute(f"SELECT pg_advisory_unlock({IDLE_PASS_LOCK_KEY})")


def record_drain_outcome(db: Connection, row: DrainOutcome) -> None:
    if row.outcome not in OUTCOMES:
        raise ValueError(f"drain outcome {row.outcome!r} (expected one of {', '.join(OUTCOMES)})")
    db.execute(insert_sql("drain_outcomes", _OUTCOME_COLUMNS, ("node", "drained_at", "check_id")), astuple(row))


def drain_outcomes(db: Connection, since: float | None = None) -> list[DrainOutcome]:
    where, params = (" WHERE drained_at > ?", (since,)) if since is not None else ("", ())
    rows = db.execute(f"SELECT {', '.join(_OUTCOME_COLUMNS)} FROM drain_outcomes{where} "
                      "ORDER BY drained_at, node, check_id", params).fetchall()
    return [DrainOutcome(*row) for row in rows]


def drain_outcome_counts(db: Connection) -> list[tuple[str, str, str, int]]:
    """(check, GPU model or "unknown", outcome, drains) over the whole table."""
    rows = db.execute("SELECT check_id, gpu_model, outcome, count(*) FROM drain_outcomes "
                      "GROUP BY check_id, gpu_model, outcome").fetchall()
    return [(str(c), str(m or "unknown"), str(o), int(n)) for c, m, o, n in rows]


def save_ladder(db: Connection, node: str, state: dict[str, Any], now: float) -> None:
    """Keep ``node``'s ladder (``Ladder.to_json``)."""
    db.execute(insert_sql("remediation_ladders", ("node", "state", "updated"), ("node",)),
               (node, json.dumps(state, sort_keys=True), now))


def forget_ladder(db: Connection, node: str) -> None:
    db.execute("DELETE FROM remediation_ladders WHERE node = ?", (node,))


def load_ladders(db: Connection) -> dict[str, dict[str, Any]]:
    """Every kept ladder's JSON, by node (``ladder.from_json`` reads each)."""
    return {str(node): json.loads(state) for node, state in
            db.execute("SELECT node, state FROM remediation_ladders ORDER BY node")}


def ladder_stage_counts(db: Connection) -> dict[str, int]:
    """Kept ladders by stage: every open stage, 0 where no node is in it."""
    counts = dict.fromkeys((str(stage) for stage in Stage if stage not in TERMINAL), 0)
    for (state,) in db.execute("SELECT state FROM remediation_ladders"):
        stage = str(json.loads(state).get("stage"))
        counts[stage] = counts.get(stage, 0) + 1
    return counts


def record_ladder(db: Connection, ladder: Ladder, now: float, gpu_model: str | None = None) -> None:
    """Everything a turn of ``ladder`` changed: its JSON kept while it is open (forgotten
    once closed), its validation runs (trigger ``return``), and once known the outcome of
    its drain for each of the drain's checks (``gpu_model``: the node's; confirmed may be
    known before the ladder ends: ``resolved_at`` stays None until it does)."""
    if ladder.closed:
        forget_ladder(db, ladder.node)
    else:
        save_ladder(db, ladder.node, ladder.to_json(), now)
    for run in ladder.validations:
        record_validation(db, _validation_row(ladder, run))
    outcome = ladder.outcome
    if outcome is not None:
        for check in ladder.checks or ["unknown"]:
            record_drain_outcome(db, DrainOutcome(ladder.node, ladder.since, check, gpu_model, str(outcome),
                                                  ladder.closed_at, _returned_by(ladder)))


def _validation_row(ladder: Ladder, run: ValidationRun) -> ValidationRow:
    duration = None if run.finished is None else round(run.finished - run.started, 3)
    last = run is ladder.validations[-1]
    outcome: str | None = {"pass": "released", "fail": "drained"}.get(str(run.verdict), "retried")
    if run.verdict is None:
        outcome = None
    elif last and ladder.stage is Stage.HELD:
        outcome = "held"
    return ValidationRow(ladder.node, run.started, "return", run.tier, run.verdict, duration, run.reservation,
                         run.job_id, outcome)


def _returned_by(ladder: Ladder) -> str | None:
    return "repair" if ladder.stage is Stage.REPAIR else ladder.returned_by

