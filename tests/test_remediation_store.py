"""Return to service in the fleet database (schema 14), on SQLite and PostgreSQL: the
validation history and `slurmgpu validations`, the drain outcomes, the kept ladders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.root import cli
from slurmgpu.collector.store import SCHEMA_VERSION, Store
from slurmgpu.collector.store.remediation import (
    DrainOutcome,
    ValidationRow,
    drain_outcomes,
    forget_ladder,
    last_validated,
    load_ladders,
    record_drain_outcome,
    record_ladder,
    record_validation,
    save_ladder,
    validations,
)
from slurmgpu.config.schema import RemediationSettings
from slurmgpu.remediation.ladder import from_json, start
from slurmgpu.result import Finding, Severity

T0 = 1_790_000_000.0


def runs(store: Store) -> None:
    with store.transaction():
        record_validation(store.db, ValidationRow("gpu-n2", T0, "idle", "quick"))
        record_validation(store.db, ValidationRow("gpu-n1", T0 + 10, "return", "quick",
                                                  reservation="slurmgpu-rts-gpu-n1", job_id="41"))
        record_validation(store.db, ValidationRow("gpu-n1", T0 + 10, "return", "quick", "pass", 62.5,
                                                  "slurmgpu-rts-gpu-n1", "41", "released"))
        record_validation(store.db, ValidationRow("gpu-n2", T0, "idle", "quick", "fail", 30.0, None, "40",
                                                  "drained"))


def test_a_validation_is_written_at_its_start_and_completed_at_its_end(store_url: str) -> None:
    store = Store(store_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        runs(store)
        rows = validations(store.db)
        assert [(r.node, r.verdict, r.duration_s, r.outcome) for r in rows] == [
            ("gpu-n2", "fail", 30.0, "drained"), ("gpu-n1", "pass", 62.5, "released")]
        assert [r.node for r in validations(store.db, "gpu-n1")] == ["gpu-n1"]
        with store.transaction():
            record_validation(store.db, ValidationRow("gpu-n1", T0 + 99, "idle", "quick", "timeout"))
        assert last_validated(store.db) == {"gpu-n1": T0 + 10, "gpu-n2": T0}  # a timeout judged nothing
        with pytest.raises(ValueError, match="validation trigger 'nightly'"):
            record_validation(store.db, ValidationRow("gpu-n1", T0, "nightly", "quick"))
    finally:
        store.close()


def test_drain_outcomes_are_kept_per_drain_and_check(store_url: str) -> None:
    store = Store(store_url)
    try:
        with store.transaction():
            record_drain_outcome(store.db, DrainOutcome("gpu-n1", T0, "ecc.volatile", "H100", "unknown"))
            record_drain_outcome(store.db, DrainOutcome("gpu-n1", T0, "ecc.volatile", "H100", "confirmed",
                                                        T0 + 900, None))
            record_drain_outcome(store.db, DrainOutcome("gpu-n2", T0 + 5, "xid.recent", None, "transient",
                                                        T0 + 300, "reset"))
        assert drain_outcomes(store.db) == [
            DrainOutcome("gpu-n1", T0, "ecc.volatile", "H100", "confirmed", T0 + 900, None),
            DrainOutcome("gpu-n2", T0 + 5, "xid.recent", None, "transient", T0 + 300, "reset")]
        assert [o.node for o in drain_outcomes(store.db, since=T0)] == ["gpu-n2"]
        with pytest.raises(ValueError, match="drain outcome 'fixed'"):
            record_drain_outcome(store.db, DrainOutcome("gpu-n1", T0, "x", None, "fixed"))
    finally:
        store.close()


def test_a_kept_ladder_is_read_back_by_the_next_leader(store_url: str) -> None:
    ladder = start("gpu-n1", [Finding("ecc.volatile", Severity.FAIL, "bad", gpu=0)], T0,
                   RemediationSettings()).ladder
    store = Store(store_url)
    try:
        with store.transaction():
            save_ladder(store.db, "gpu-n1", ladder.to_json(), T0)
            save_ladder(store.db, "gpu-n2", ladder.to_json(), T0)
            forget_ladder(store.db, "gpu-n2")
    finally:
        store.close()
    store = Store(store_url)  # another collector, later
    try:
        kept = load_ladders(store.db)
    finally:
        store.close()
    assert list(kept) == ["gpu-n1"] and from_json(kept["gpu-n1"]) == ladder


# --------------------------------------------------------------------------- the command


def test_the_validations_command_lists_the_history(store_url: str, tmp_path: Path) -> None:
    store = Store(store_url)
    try:
        runs(store)
    finally:
        store.close()
    result = CliRunner().invoke(cli, ["validations", "--db", store_url, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert list(rows[0]) == ["node", "trigger", "tier", "verdict", "started", "duration_s", "reservation",
                             "outcome"]
    assert [(r["node"], r["trigger"], r["verdict"]) for r in rows] == [("gpu-n2", "idle", "fail"),
                                                                     ("gpu-n1", "return", "pass")]
    text = CliRunner().invoke(cli, ["validations", "--db", store_url, "--node", "gpu-n1"])
    assert text.exit_code == 0, text.output
    header, line = text.output.splitlines()
    assert header.split() == ["NODE", "TRIGGER", "TIER", "VERDICT", "STARTED", "DURATION_S", "RESERVATION",
                              "OUTCOME"]
    assert line.split()[:4] == ["gpu-n1", "return", "quick", "pass"] and line.split()[-3:] == [
        "62", "slurmgpu-rts-gpu-n1", "released"]
    none = CliRunner().invoke(cli, ["validations", "--db", store_url, "--node", "gpu-n9"])
    assert none.exit_code == 0 and none.output == "no validation runs recorded for gpu-n9\n"


def test_the_command_says_when_the_database_is_missing_or_too_old(tmp_path: Path) -> None:
    missing = CliRunner().invoke(cli, ["validations", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code != 0 and "no fleet database" in missing.output
    old = tmp_path / "old.db"
    Store(old).close()
    import sqlite3

    with sqlite3.connect(old) as db:
        db.execute("UPDATE schema_version SET version = 13")
    result = CliRunner().invoke(cli, ["validations", "--db", str(old)])
    assert result.exit_code != 0 and "schema version 13 has no validation history" in result.output


def test_a_ladder_is_recorded_turn_by_turn_and_its_outcome_once_known(store_url: str) -> None:
    import slurmgpu.remediation.steps as st
    from slurmgpu.remediation.ladder import advance

    settings = RemediationSettings()
    bad = Finding("validate.gemm", Severity.FAIL, "slow", gpu=0)
    decision = start("gpu-n1", [Finding("ecc.volatile", Severity.FAIL, "bad", gpu=0),
                                Finding("xid.recent", Severity.FAIL, "XID 48", gpu=0)], T0, settings)
    store = Store(store_url)
    try:
        turns: list[tuple[float, st.Event]] = [
            (T0 + 60, st.PassiveHealthy()), (T0 + 61, st.ValidationSubmitted("5")),
            (T0 + 120, st.ValidationFailed("5", (bad,))), (T0 + 180, st.ResetDone()),
            (T0 + 181, st.ValidationSubmitted("6")), (T0 + 300, st.ValidationPassed("6"))]
        for now, event in turns:
            decision = advance(decision.ladder, event, now, settings)
            with store.transaction():
                record_ladder(store.db, decision.ladder, now, "NVIDIA H100 80GB HBM3")
            if now == T0 + 120:
                assert list(load_ladders(store.db)) == ["gpu-n1"]  # open: kept for the next leader
                assert [(o.outcome, o.resolved_at) for o in drain_outcomes(store.db)] == [("confirmed", None)] * 2
        assert load_ladders(store.db) == {}  # closed: nothing left to resume
        assert [(r.verdict, r.duration_s, r.outcome, r.job_id) for r in validations(store.db)] == [
            ("fail", 60.0, "drained", "5"), ("pass", 120.0, "released", "6")]
        assert drain_outcomes(store.db) == [
            DrainOutcome("gpu-n1", T0, c, "NVIDIA H100 80GB HBM3", "confirmed", T0 + 300, "reset")
            for c in ("ecc.volatile", "xid.recent")]
    finally:
        store.close()


def test_a_held_ladder_records_its_runs_as_retried_then_held_and_no_outcome(store_url: str) -> None:
    import slurmgpu.remediation.steps as st
    from slurmgpu.remediation.ladder import Stage, advance

    settings = RemediationSettings(validate_attempts=2, validate_backoff_s=10)
    ladder = start("gpu-n1", [Finding("ecc.volatile", Severity.FAIL, "bad", gpu=0)], T0, settings).ladder
    for now, event in [(T0 + 1, st.PassiveHealthy()), (T0 + 2, st.ValidationTimedOut()),
                       (T0 + 12, st.Tick()), (T0 + 13, st.StepFailed("create_reservation", "exists"))]:
        ladder = advance(ladder, event, now, settings).ladder
    assert ladder.stage is Stage.HELD
    store = Store(store_url)
    try:
        with store.transaction():
            record_ladder(store.db, ladder, T0 + 13)
        assert [(r.verdict, r.outcome) for r in validations(store.db)] == [("timeout", "retried"),
                                                                          ("cancelled", "held")]
        assert drain_outcomes(store.db) == [] and list(load_ladders(store.db)) == ["gpu-n1"]
    finally:
        store.close()


def test_a_nodes_validation_event_since_a_time(store_url: str) -> None:
    """Where the ladder finds a validation's findings when the head node cannot read the
    job's output: the node's newest `validate --send` event at or after the run's start."""
    from slurmgpu import wire
    from slurmgpu.collector.store.queries import validation_since
    from slurmgpu.validate.report import validation_event

    def sent(node: str, seq: int, ts: float, check: str) -> tuple[str, wire.Envelope]:
        body = validation_event({"verdict": "FAIL", "findings": wire.encode_findings(
            [Finding(check, Severity.FAIL, "slow", gpu=1)])})
        return node, wire.Envelope(type=wire.EVENT, node=node, seq=seq, body=body, ts=ts)

    store = Store(store_url)
    try:
        store.store_batch([sent("gpu-n1", 1, T0, "validate.hbm"), sent("gpu-n1", 2, T0 + 100, "validate.gemm"),
                           sent("gpu-n2", 1, T0 + 200, "validate.pcie")])
        found = validation_since(store.db, "gpu-n1", T0 + 50)
        assert found is not None and [f["check"] for f in found["findings"]] == ["validate.gemm"]
        assert validation_since(store.db, "gpu-n1", T0 + 101) is None
    finally:
        store.close()
