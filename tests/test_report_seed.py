"""The fleet report's data generator (`slurmgpu.sim.seed`, `slurmgpu sim report-seed`)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.collector.store import SCHEMA_VERSION, Store
from slurmgpu.sim.seed import SeedError, seed
from slurmgpu.xid import catalog

END = datetime(2026, 11, 26, 6, tzinfo=UTC).timestamp()
TABLES = ("nodes", "reports", "node_samples", "report_history", "findings", "events", "decisions",
          "node_states", "gpu_counters", "ib_counters", "node_versions", "checkpoints", "job_events")


def _dump(path: Path) -> dict[str, list[Any]]:
    db = sqlite3.connect(path)
    try:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in TABLES}
    finally:
        db.close()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("seed")
    summary = seed(tmp / "fleet.db", nodes=60, days=7, end=END, seed=3)
    return tmp / "fleet.db", summary, tmp


def test_same_arguments_same_rows(tmp_path: Path) -> None:
    a = seed(tmp_path / "a.db", nodes=40, days=5, end=END, seed=7)
    b = seed(tmp_path / "b.db", nodes=40, days=5, end=END, seed=7)
    seed(tmp_path / "c.db", nodes=40, days=5, end=END, seed=8)
    assert a["rows"] == b["rows"]
    assert _dump(tmp_path / "a.db") == _dump(tmp_path / "b.db")
    assert _dump(tmp_path / "a.db") != _dump(tmp_path / "c.db")


def test_schema_is_the_collectors(seeded: tuple[Path, dict[str, Any], Path]) -> None:
    path, summary, _ = seeded
    store = Store(path)  # opens without migrating: the seeder wrote the current schema
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert len(store.fleet()) == 60
        for table, count in summary["rows"].items():
            assert store.count(table) == count
    finally:
        store.close()


def test_row_counts_are_plausible(seeded: tuple[Path, dict[str, Any], Path]) -> None:
    path, summary, _ = seeded
    rows = summary["rows"]
    hours = 7 * 24
    # every node reports every hour, minus a few unreachable hours
    assert 0.97 * 60 * hours <= rows["node_samples"] <= 60 * hours
    assert rows["gpu_counters"] >= 60 * 8 and rows["ib_counters"] >= 60 * 4
    assert rows["node_versions"] >= 60
    db = sqlite3.connect(path)
    try:
        names = [r[0] for r in db.execute("SELECT node FROM nodes ORDER BY node")]
        a100 = [n for n in names if n.startswith("gpu-a100-")]
        h100 = [n for n in names if n.startswith("gpu-h100-")]
        assert len(a100) == 24 and len(h100) == 36 and a100[0] == "gpu-a100-001"
        per_hour = db.execute("SELECT max(reports), min(span_s), max(span_s) FROM node_samples").fetchone()
        assert per_hour == (240, 3600.0, 3600.0)
        # most nodes hardly throttle; a few throttle heavily
        shares = [r[0] for r in db.execute("SELECT 1.0 * sum(hw_slowdown_reports) / sum(reports) "
                                           "FROM node_samples GROUP BY node")]
        assert sum(1 for s in shares if s < 0.01) >= 0.8 * len(shares)
        assert max(shares) > 0.05
        # XIDs are real codes, application ones the most common
        known = set(catalog())
        xids = dict(db.execute("SELECT data, count(*) FROM events WHERE kind = 'xid' GROUP BY data"))
        assert set(xids) <= known and 79 in xids
        body = msgpack.unpackb(db.execute("SELECT body FROM events WHERE kind = 'xid' LIMIT 1").fetchone()[0])
        assert body["kind"] == "xid" and {"gpu", "data", "verdict", "findings"} <= set(body)
        blocked = db.execute("SELECT body FROM events WHERE kind = 'prolog_blocked'").fetchall()
        assert all("job_id" in msgpack.unpackb(b[0]) for b in blocked)
        # drains, each with who did it: the automation's (slurmgpu: reasons, with a matching
        # decision), the epilog's (tagged reasons) and operators' (outside slurmgpu)
        drains = db.execute("SELECT node, ts, reason, actor, drained_by FROM node_states "
                            "WHERE kind = 'drained'").fetchall()
        by = {d[4] for d in drains}
        assert by == {"automation", "epilog", "outside"}
        auto = [d for d in drains if d[4] == "automation"]
        assert auto and all(d[2].startswith("slurmgpu: ") and d[3] == "root" for d in auto)
        assert all(d[2].startswith("slurmgpu: ") and d[2].endswith(" [by epilog]")
                   for d in drains if d[4] == "epilog")
        assert all(not d[2].startswith("slurmgpu:") and d[3] not in ("root", "slurm")
                   for d in drains if d[4] == "outside")
        for node, ts, _reason, _actor, _by in auto:
            assert db.execute("SELECT 1 FROM decisions WHERE node = ? AND result = 'drained' AND "
                              "abs(time - ?) < 120", (node, ts)).fetchone(), node
        kinds = {r[0] for r in db.execute("SELECT DISTINCT kind FROM node_states")}
        assert kinds == {"drained", "resumed", "unreachable", "reachable"}
        checks = {r[0] for r in db.execute("SELECT DISTINCT check_id FROM findings")}
        assert {"xid.recent", "mem.row_remap", "ecc.uncorrected", "ib.flap", "thermal.throttle"} <= checks
        assert any(c.startswith("pin.") for c in checks)
        assert db.execute("SELECT count(*) FROM gpu_counters WHERE remap_failure = 1").fetchone()[0] >= 1
        assert db.execute("SELECT count(*) FROM gpu_counters WHERE remap_pending = 1").fetchone()[0] >= 1
        # one node upgraded its driver mid-window
        upgraded = db.execute("SELECT node FROM node_versions GROUP BY node HAVING count(DISTINCT driver) > 1")
        assert [r[0] for r in upgraded] == [summary["upgraded"]]
        states = {r[0] for r in db.execute("SELECT state FROM checkpoints")}
        assert states <= {"acked", "expired"} and states
        assert db.execute("SELECT count(*) FROM job_events WHERE kind = 'requeued'").fetchone()[0] >= 1
        assert db.execute("SELECT min(ts), max(ts) FROM node_samples").fetchone()[1] <= END
    finally:
        db.close()


def test_lemons_in_the_automation_state(seeded: tuple[Path, dict[str, Any], Path]) -> None:
    path, summary, tmp = seeded
    store = Store(path)
    try:
        state = store.automation().state
    finally:
        store.close()
    assert sorted(state.lemons) == summary["lemons"] and len(summary["lemons"]) == 2
    for info in state.lemons.values():
        assert info.since <= END and "3 drains" in info.why
    assert sorted(state.drained) == summary["drained_at_end"] and state.fleet == 60
    assert not list(tmp.glob("**/automation.json"))  # no state file beside the database


def test_refuses_a_database_with_a_fleet(seeded: tuple[Path, dict[str, Any], Path]) -> None:
    with pytest.raises(SeedError, match="already holds a fleet"):
        seed(seeded[0], nodes=5, days=1, end=END)


def test_tiny_fleets(tmp_path: Path) -> None:
    for n, days in ((1, 1), (2, 0.5), (5, 3)):
        summary = seed(tmp_path / f"f{n}.db", nodes=n, days=days, end=END)
        assert summary["rows"]["nodes"] == n


def test_cli(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    result = CliRunner().invoke(cli, ["sim", "report-seed", "--db", str(db), "--nodes", "20", "--days", "2",
                                      "--end", "2026-11-26T06:00:00Z", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["end"] == END and summary["rows"]["nodes"] == 20
    store = Store(db)
    assert sorted(store.automation().state.lemons) == summary["lemons"]
    store.close()
    again = CliRunner().invoke(cli, ["sim", "report-seed", "--db", str(db), "--nodes", "20"])
    assert again.exit_code == 3 and "already holds a fleet" in again.output
    bad = CliRunner().invoke(cli, ["sim", "report-seed", "--db", str(tmp_path / "g.db"), "--end", "soon"])
    assert bad.exit_code == 3
