#!/usr/bin/env python3
"""Whole-process time of `slurmgpu report --since 30d` on a seeded month of a large fleet.

Seeds 1,000 nodes x 30 days (``slurmgpu.sim.seed``: ~0.7 M hourly samples, drains,
XIDs, counters, versions, jobs) into a temporary database (timed on its own), then runs
`slurmgpu report --since 30d --format F --out FILE` as a fresh process, for each format,
``--runs`` times each: interpreter start, imports, config, every SQL query, rendering.
Reported per format: wall time p50/max and the report process's CPU time (user + system,
all its threads) p50, which a machine shared with other jobs moves less.

    python bench/report_speed.py [--nodes 1000] [--days 30] [--runs 5] [--db FILE] [--json]

The config is etc/report-demo.toml with its ``[[hosts]]`` hostlists widened to the seeded
fleet (``gpu-a100-[0001-4000]`` at 10,000 nodes), so every node matches its section at
any size (``--config FILE``: that file as it is).

Target (issue 6): p50 and max <= 5 s per format; issue 15: 10,000 nodes x 90 days <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 5.0
FORMATS = ("html", "json", "md")


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fleet_config(db: Path, out: Path) -> Path:
    """etc/report-demo.toml with each ``gpu-<model>-[...]`` hostlist naming that model's
    seeded nodes (first to last), written to ``out``."""
    import contextlib
    import re
    import sqlite3

    text = (ROOT / "etc" / "report-demo.toml").read_text()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        for model in ("a100", "h100"):
            first, last = conn.execute("SELECT min(node), max(node) FROM nodes WHERE node LIKE ?",
                                       (f"gpu-{model}-%",)).fetchone()
            if first is not None:
                span = f"{first.rsplit('-', 1)[1]}-{last.rsplit('-', 1)[1]}"
                text = re.sub(rf'nodes = "gpu-{model}-\[[^\]]*\]"', f'nodes = "gpu-{model}-[{span}]"', text)
    out.write_text(text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default=None,
                        help="a database seeded before (same --nodes, --days, --seed): not seeded again")
    parser.add_argument("--config", default=None,
                        help="config file (default: etc/report-demo.toml, hosts widened to the fleet)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args()

    from slurmgpu.sim.seed import seed

    now = "2026-11-26T06:00:00Z"  # a fixed window: reproducible numbers
    end = datetime.fromisoformat(now.replace("Z", "+00:00")).timestamp()
    results: dict[str, Any] = {"nodes": args.nodes, "days": args.days, "runs": args.runs,
                               "target_s": TARGET_S, "python": platform.python_version(),
                               "cpus": os.cpu_count(), "formats": {}}
    with tempfile.TemporaryDirectory(prefix="slurmgpu-report-bench-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "fleet.db"
        if not args.db:
            began = time.perf_counter()
            summary = seed(db, args.nodes, args.days, end=end, seed=args.seed)
            results["seed_s"] = round(time.perf_counter() - began, 3)
            results["rows"] = sum(summary["rows"].values())
        results["db_mb"] = round(db.stat().st_size / 1e6, 1)
        # (the lemons are in the seeded database: --db below)
        config = Path(args.config) if args.config else fleet_config(db, Path(tmp) / "report.toml")
        env = dict(os.environ)
        for fmt in FORMATS:
            out = Path(tmp) / f"report.{fmt}"
            cmd = [sys.executable, "-m", "slurmgpu", "report", "--since", f"{args.days:g}d", "--now", now,
                   "--db", str(db), "--config", str(config), "--format", fmt, "--out", str(out)]
            samples, cpu = [], []
            for _ in range(args.runs):
                start, used = time.perf_counter(), _children_cpu()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                samples.append(time.perf_counter() - start)
                cpu.append(_children_cpu() - used)
                if proc.returncode != 0:
                    print(f"report --format {fmt} failed (rc {proc.returncode}): {proc.stderr.strip()}",
                          file=sys.stderr)
                    return 1
            results["formats"][fmt] = {
                "p50_s": round(statistics.median(samples), 3), "max_s": round(max(samples), 3),
                "min_s": round(min(samples), 3), "cpu_p50_s": round(statistics.median(cpu), 3),
                "bytes": out.stat().st_size,
                "ok": max(samples) <= TARGET_S,
            }
    results["ok"] = all(f["ok"] for f in results["formats"].values())
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        if "seed_s" in results:
            print(f"seed: {args.nodes} nodes x {args.days:g} days, {results['rows']:,} rows, "
                  f"{results['db_mb']} MB in {results['seed_s']:.2f} s")
        print(f"{'format':<8}{'p50':>9}{'max':>9}{'CPU p50':>9}{'size':>11}   target <= {TARGET_S:g} s")
        for fmt, r in results["formats"].items():
            print(f"{fmt:<8}{r['p50_s']:>8.2f}s{r['max_s']:>8.2f}s{r['cpu_p50_s']:>8.2f}s"
                  f"{r['bytes'] / 1024:>9.0f}KiB   {'ok' if r['ok'] else 'OVER'}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
