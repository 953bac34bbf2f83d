"""The report's return-to-service sections: ``verdict_quality`` (one row per check, and
per check and GPU model) and ``return-to-service`` (time to return per step), in the
JSON, HTML and Markdown, on SQLite and PostgreSQL; a database from before says so."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.remediation import (
    DrainOutcome,
    ValidationRow,
    record_drain_outcome,
    record_validation,
)
from slurmgpu.report import html as report_html
from slurmgpu.report import markdown as report_md
from slurmgpu.report.model import report_from_path

H = 3600.0
T1 = 1767312000.0  # 2026-01-02T00:00:00Z
T0 = T1 - 24 * H

OUTCOMES = [  # node, drained_at, check, model, outcome, resolved_at, returned_by
    ("n1", T0 + 1 * H, "xid.recent", "H100", "transient", T0 + 2 * H, "reset"),
    ("n2", T0 + 2 * H, "xid.recent", "H100", "confirmed", T0 + 5 * H, "repair"),
    ("n3", T0 + 3 * H, "xid.recent", "A100", "cleared_by_validation", T0 + 3.5 * H, "validation"),
    ("n3", T0 + 3 * H, "ecc.volatile", "A100", "cleared_by_validation", T0 + 3.5 * H, "validation"),
    ("n4", T0 + 4 * H, "thermal.throttle", "H100", "unknown", T0 + 4.2 * H, None),
    ("n5", T0 - 2 * H, "xid.recent", "H100", "confirmed", T0 - H, "reboot"),  # before the window
    ("n6", T0 + 6 * H, "xid.recent", "H100", "confirmed", T0 + 9 * H, "reboot"),
]


def seeded(url: str) -> str:
    store = Store(url)
    try:
        with store.transaction():
            for row in OUTCOMES:
                record_drain_outcome(store.db, DrainOutcome(*row))
            record_validation(store.db, ValidationRow("n3", T0 + 3.2 * H, "return", "quick", "pass", 60.0))
            record_validation(store.db, ValidationRow("n2", T0 + 2.2 * H, "return", "quick", "fail", 70.0))
            record_validation(store.db, ValidationRow("n7", T0 + 8 * H, "idle", "quick"))
    finally:
        store.close()
    return url


def model_of(url: str) -> dict[str, Any]:
    return report_from_path(url, T0, T1, config=None, generated_at=T1)


def test_verdict_quality_counts_each_drain_by_its_outcome(store_url: str) -> None:
    quality = model_of(seeded(store_url))["verdict_quality"]
    rows = {r["check"]: r for r in quality["checks"]}
    assert rows["xid.recent"] == {"check": "xid.recent", "drains": 4, "confirmed": 2, "cleared_by_validation": 1,
                                  "transient": 1, "unknown": 0, "resolved": 4, "precision": 0.75}
    assert rows["ecc.volatile"]["precision"] == 0.0  # judged, and wrong: a real zero
    assert rows["thermal.throttle"] == {"check": "thermal.throttle", "drains": 1, "confirmed": 0,
                                        "cleared_by_validation": 0, "transient": 0, "unknown": 1,
                                        "resolved": 0, "precision": None}  # not judged: no zero
    by_model = {(r["check"], r["gpu_model"]): r["drains"] for r in quality["by_gpu_model"]}
    assert by_model == {("ecc.volatile", "A100"): 1, ("thermal.throttle", "H100"): 1,
                        ("xid.recent", "A100"): 1, ("xid.recent", "H100"): 3}


def test_return_to_service_times_each_step(store_url: str) -> None:
    back = model_of(seeded(store_url))["return-to-service"]
    assert back["steps"] == [
        {"step": "validation", "nodes": 1, "median_s": 1800.0, "p90_s": 1800.0, "max_s": 1800.0},
        {"step": "reset", "nodes": 1, "median_s": 3600.0, "p90_s": 3600.0, "max_s": 3600.0},
        {"step": "reboot", "nodes": 1, "median_s": 10800.0, "p90_s": 10800.0, "max_s": 10800.0},
        {"step": "repair", "nodes": 1, "median_s": 10800.0, "p90_s": 10800.0, "max_s": 10800.0}]
    assert back["validations"] == [{"trigger": "idle", "verdict": None, "runs": 1},
                                   {"trigger": "return", "verdict": "fail", "runs": 1},
                                   {"trigger": "return", "verdict": "pass", "runs": 1}]


def test_the_sections_render_in_html_and_markdown(tmp_path: Path) -> None:
    model = model_of(seeded(str(tmp_path / "fleet.db")))
    page = report_html.render(model)
    assert '<section id="verdict_quality"><h2>Verdict quality</h2>' in page
    assert '<section id="return-to-service"><h2>Return to service</h2>' in page
    assert "75% of 4" in page and "not judged" in page and "3h 00m" in page
    assert ('<tr><td>xid.recent</td><td class="n">4</td><td class="n">2</td><td class="n">1</td>'
            '<td class="n">1</td><td class="n">0</td><td class="n">75% of 4</td></tr>') in page
    assert '<tr><td>ecc.volatile (A100)</td><td class="n">1</td>' in page
    assert ('<tr><td>reset</td><td class="n">1</td><td class="n">60 min</td><td class="n">60 min</td>'
            '<td class="n">60 min</td></tr>') in page
    text = report_md.render(model)
    assert "## Verdict quality" in text and "| xid.recent | 4 | 2 | 1 | 1 | 0 | 75% of 4 |" in text
    assert "| reset | 1 | 60 min | 60 min | 60 min |" in text
    assert "Validations run: idle running 1, return fail 1, return pass 1" in text


def test_the_json_report_carries_verdict_quality(tmp_path: Path) -> None:
    db = seeded(str(tmp_path / "fleet.db"))
    result = CliRunner().invoke(cli, ["report", "--db", db, "--from", "2026-01-01T00:00:00Z",
                                      "--to", "2026-01-02T00:00:00Z", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["check"] for r in data["verdict_quality"]["checks"]] == ["ecc.volatile", "thermal.throttle",
                                                                       "xid.recent"]


def test_a_database_from_before_says_not_recorded_never_zero(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = 13")
        db.execute("DROP TABLE drain_outcomes")
        db.execute("DROP TABLE validations")
    model = model_of(str(path))
    assert model["verdict_quality"] == {"source": None, "checks": [], "by_gpu_model": []}
    assert model["return-to-service"] == {"source": None, "steps": [], "validations": []}
    assert "not recorded: this database is from before" in report_html.render(model)
