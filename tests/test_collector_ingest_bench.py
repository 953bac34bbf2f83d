"""bench/collector_ingest.py's ``--floor``: the collector's real transport with a handler
that stores nothing, against a small simulated fleet; every report it acks counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "collector_ingest.py"


def test_the_floor_acks_every_report_and_stores_none() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--nodes", "20", "--duration", "2", "--warmup", "1",
                           "--bundle", "8", "--full-every", "40", "--floor", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["results"]
    assert row["floor"] is True and row["acked"] > 0
    assert row["stored"] == row["acked"]  # (nothing is stored: what was acked counts)
    assert row["collector_cpu_us_per_report"] > 0
    assert row["collector_cpu_us_per_report_by_thread"]["main"] > 0


def test_the_floor_refuses_a_database_in_one_line() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--floor", "--db", "postgresql"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("no --profile, --db or --collectors")
