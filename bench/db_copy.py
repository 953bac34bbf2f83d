#!/usr/bin/env python3
"""Whole-process time of `slurmgpu db copy` (SQLite -> PostgreSQL) on a seeded fleet.

Seeds ``--nodes`` x ``--days`` (``slurmgpu.sim.seed``: hourly samples, drains, XIDs,
counters, versions, jobs; ~0.74 M rows at 1,000 x 30) into a temporary SQLite file, and
adds ``--message-hours`` hours of the ``messages`` table as the collector fills it (one
row per report, every 15 s per node: 240 rows per node-hour; the seeder writes none).
Then starts a throwaway PostgreSQL server (``slurmgpu.sim.postgres``, on a unix socket)
and runs `slurmgpu db copy --json` as a fresh process ``--runs`` times, each into a new
database. Reported: wall time p50/max, rows, rows per second, the seconds of the largest
tables (from the last run), the SQLite file's size and the PostgreSQL database's.

    python bench/db_copy.py [--nodes 1000] [--days 30] [--message-hours 24] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

END = 1_780_000_000.0
REPORTS_PER_HOUR = 240


def seed_fleet(db: Path, nodes: int, days: int) -> float:
    from slurmgpu.sim.seed import seed

    began = time.monotonic()
    seed(db, nodes=nodes, days=days, end=END, seed=1)
    return time.monotonic() - began


def add_messages(db: Path, hours: int) -> int:
    """``hours`` of report messages for every seeded node, ending at the seeded end."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        names = [row[0] for row in conn.execute("SELECT node FROM nodes ORDER BY node")]
        per_node = hours * REPORTS_PER_HOUR
        start = END - hours * 3600.0
        step = 3600.0 / REPORTS_PER_HOUR
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO messages (node, epoch, seq, type, ts, received_at, digest) VALUES (?,?,?,?,?,?,?)",
            ((node, "3f9c2a71e0d84b56", seq, "report", start + seq * step, start + seq * step + 0.05,
              seq.to_bytes(8, "big")) for node in names for seq in range(1, per_node + 1)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return len(names) * per_node
    finally:
        conn.close()


def copy_once(db: Path, url: str) -> tuple[float, dict[str, Any]]:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "db", "copy", "--from", str(db), "--to", url,
                           "--json"], capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"db copy failed ({proc.returncode}): {proc.stderr.strip()}")
    return wall, json.loads(proc.stdout)


def database_size(url: str) -> int:
    from slurmgpu.collector.store.queries import snapshot

    with snapshot(url) as db:
        return int(db.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--message-hours", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from slurmgpu.sim.postgres import PgServer

    with tempfile.TemporaryDirectory(prefix="slurmgpu-copy-bench-") as tmp:
        db = Path(tmp) / "fleet.db"
        seed_s = seed_fleet(db, args.nodes, args.days)
        messages = add_messages(db, args.message_hours) if args.message_hours else 0
        server = PgServer()
        server.up()
        try:
            walls: list[float] = []
            document: dict[str, Any] = {}
            url = ""
            for run in range(args.runs):
                url = server.create_database(f"copy{run}")
                wall, document = copy_once(db, url)
                walls.append(wall)
            pg_bytes = database_size(url)
        finally:
            server.down()
        tables = document["tables"]
        biggest = sorted(tables, key=lambda t: -tables[t]["destination"])[:3]
        result = {
            "nodes": args.nodes, "days": args.days, "message_hours": args.message_hours,
            "messages": messages, "rows": document["rows"], "seed_s": round(seed_s, 2),
            "sqlite_mb": round(os.path.getsize(db) / 1e6, 1), "postgresql_mb": round(pg_bytes / 1e6, 1),
            "wall_p50_s": round(statistics.median(walls), 2), "wall_max_s": round(max(walls), 2),
            "rows_per_s": round(document["rows"] / statistics.median(walls)),
            "largest": {t: {"rows": tables[t]["destination"], "seconds": tables[t]["seconds"]} for t in biggest},
            "python": platform.python_version(), "cpus": os.cpu_count(),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.nodes} nodes x {args.days} days (+{args.message_hours} h of messages): "
          f"{result['rows']:,} rows, SQLite {result['sqlite_mb']} MB -> PostgreSQL {result['postgresql_mb']} MB")
    print(f"db copy wall p50 {result['wall_p50_s']} s, max {result['wall_max_s']} s "
          f"({result['rows_per_s']:,} rows/s) over {args.runs} runs; seeding took {result['seed_s']} s")
    for table, info in result["largest"].items():
        print(f"  {table:<14} {info['rows']:>12,} rows  {info['seconds']:7.2f} s")


if __name__ == "__main__":
    main()
