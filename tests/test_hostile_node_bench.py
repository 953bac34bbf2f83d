"""bench/hostile_node.py runs on SQLite: the honest node's reports are all acked and the
hostile node's NUL reports all acked as rejected; ``--isolation`` stores a batch around
an unstorable message in a few transactions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> list[dict[str, object]]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "hostile_node.py"), "--db", "sqlite", "--json",
                           *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)["results"]
    return rows


def test_the_hostile_node_bench_acks_every_honest_report_and_rejects_every_nul_one() -> None:
    baseline, hostile = bench("--honest", "1", "--interval", "0.1", "--rate", "20", "--duration", "2")
    assert baseline["hostile"] is False and hostile["hostile"] is True
    for row in (baseline, hostile):
        assert row["honest_unacked"] == 0 and row["honest_acks"] >= 15 and row["collector_alive"]
    assert hostile["hostile_sent"] == hostile["hostile_rejected"] >= 30  # type: ignore[operator]


def test_the_isolation_bench_refuses_the_one_bad_message() -> None:
    [row] = bench("--isolation", "16")
    assert row["clean"] == {"ms": row["clean"]["ms"], "transactions": 1, "messages_written": 16,  # type: ignore[index]
                            "stored": 16, "refused": 0}
    bad = row["one_bad"]
    assert bad["stored"] == 16 and bad["refused"] == 1 and bad["transactions"] <= 2 * 5 + 1  # type: ignore[index]
