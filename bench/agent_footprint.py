#!/usr/bin/env python3
"""Agent footprint: one real `slurmgpu agent` watching 8 simulated H100s (the fake
libnvidia-ml.so.1) at the DEFAULT settings (interval_s 15, heartbeat_s 5), connected over
CURVE to a real `slurmgpu collector`; no Slurm needed.

    python bench/agent_footprint.py [--duration 120] [--no-flood] [--json]

By default every GPU is under "load", so the fake driver emits clock-change events at the
rate measured on a real H200 under load (35/s per GPU, 280/s in all), as a real driver
does; the run also counts the event messages the collector stored (target: none).

Once the agent has said hello, samples /proc/<pid>/status VmRSS and /proc/<pid>/stat
utime+stime every second for ``--duration`` seconds. Reports the largest RSS (MB) and the
CPU used over the run as a percentage of one core (start-up excluded).

Targets: <= 50 MB RSS, <= 1 % of one core.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from xid_latency import LocalFleet

TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def stored_events(db: Path) -> int:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def run(duration: float, flood: bool = True) -> dict[str, Any]:
    fleet = LocalFleet(interval_s=15, heartbeat_s=5, max_age_s=30, load=flood)
    try:
        fleet.start()
        pid = fleet.pids["agent"]
        start_cpu, start = cpu_s(pid), time.monotonic()
        peak = rss_mb(pid)
        samples = 1
        while time.monotonic() - start < duration:
            time.sleep(1.0)
            peak = max(peak, rss_mb(pid))
            samples += 1
        used = cpu_s(pid) - start_cpu
        elapsed = time.monotonic() - start
        final = rss_mb(pid)
        events = stored_events(fleet.db)
    finally:
        fleet.stop()
    cpu_pct = 100 * used / elapsed
    return {"duration_s": round(elapsed, 1), "samples": samples, "max_rss_mb": round(peak, 1),
            "final_rss_mb": round(final, 1), "cpu_s": round(used, 2),
            "cpu_pct_one_core": round(cpu_pct, 3), "clock_flood": flood,
            "clock_events_per_s": 8 * 35 if flood else 0, "event_messages_stored": events,
            "targets": {"rss_mb": 50, "cpu_pct": 1, "event_messages": 0},
            "ok": peak <= 50 and cpu_pct <= 1 and events == 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--no-flood", action="store_true", help="no clock-event flood (idle GPUs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.duration, flood=not args.no_flood)
    if args.json:
        print(json.dumps(result))
    else:
        flood = f", clock flood {result['clock_events_per_s']}/s" if result["clock_flood"] else ""
        print(f"agent, 8 simulated GPUs, interval 15 s{flood}, {result['duration_s']} s: max RSS "
              f"{result['max_rss_mb']} MB, CPU {result['cpu_pct_one_core']} % of one core "
              f"({result['cpu_s']} s), {result['event_messages_stored']} event messages stored; "
              f"targets <= 50 MB, <= 1 %, 0 events: "
              f"{'OK' if result['ok'] else 'MISSED'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
