"""bench/ingest_pipeline.py runs, on a small fleet, the collector's real main-thread path:
every bundled report it makes is stored once (its figure is per stored report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_pipeline_bench_stores_every_report_it_times() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ingest_pipeline.py"), "--nodes", "20",
                           "--bundles", "60", "--bundle", "8", "--batch", "50", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["stored"] == 60 * 8
    assert row["cpu_us_per_report"] > 0 and row["reports_per_cpu_s"] > 0
    assert row["bytes_per_report"] > 500  # (delta reports with their summary)


def test_the_pipeline_bench_refuses_a_bad_argument_in_one_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ingest_pipeline.py"), "--batch", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("must be at least 1")
