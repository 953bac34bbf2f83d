#!/usr/bin/env python3
"""The fleet yardstick: what a real fleet needs from the collector, measured end to end
(real collector processes, real CURVE, the simulated nodes of bench/collector_ingest.py).

Targets, for a fleet of 10,000 nodes x 8 GPUs reporting every 15 s (~670 reports/s), 1 %
of the nodes sending events:

- ``steady_cpu_fraction`` <= 0.10: a collector's CPU (of one core) in steady state;
- ``backlog_drain_s`` <= 300: a 1-hour outage's backlog (2.4 M reports) drained;
- ``live_event_ack_p99_ms`` <= 100: events' ack p99 on the events port during that drain.

Each for SQLite (one collector) and PostgreSQL (two collectors). ``--nodes`` scales the
fleet down for a small machine: every per-node interval shrinks by the same factor, so
the collector sees the same message rates (reports, heartbeats both ways, events) from
fewer connections; the drain time is the full backlog over the drain rate measured with
bundles of 32, as agents send a backlog. docs/benchmarks.md says how that extrapolates.

    python bench/fleet_yardstick.py [--nodes 1000] [--duration 20] [--db sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collector_ingest import run_case

from slurmgpu.sim.postgres import PgServer

FLEET_NODES = 10_000
REPORT_S = 15.0
HEARTBEAT_S = 5.0
FULL_EVERY = 40  # one report in 40 carries the node's facts (600 s / 15 s)
EVENT_NODES = 0.01
OUTAGE_REPORTS = FLEET_NODES * 3600 / REPORT_S  # 2.4 M
BACKLOG_BUNDLE = 32
TARGETS = {"steady_cpu_fraction": 0.10, "backlog_drain_s": 300.0, "live_event_ack_p99_ms": 100.0}


def _common(nodes: int, args: argparse.Namespace, pg: PgServer | None) -> dict[str, Any]:
    scale = FLEET_NODES / nodes
    return {"pg": pg, "collectors": 2 if pg is not None else 1, "full_every": FULL_EVERY,
            "heartbeat_s": HEARTBEAT_S / scale, "collector_heartbeat_s": HEARTBEAT_S / scale, "live_nodes": max(1, round(nodes * EVENT_NODES)),
            "live_interval_s": REPORT_S / scale}


def steady(nodes: int, args: argparse.Namespace, pg: PgServer | None) -> dict[str, Any]:
    """Every node reporting at the fleet's rate: the collectors' CPU over the wall time."""
    rate = FLEET_NODES / REPORT_S / nodes
    row = run_case(nodes, args.duration, nodes, warmup_s=3.0, rate=rate, **_common(nodes, args, pg))
    return {"reports_per_s": round(row["stored"] / row["wall_s"], 1),
            "steady_cpu_fraction": round(max(row["collector_cpu_s"]) / row["wall_s"], 3),
            "steady_cpu_fraction_all_collectors": round(sum(row["collector_cpu_s"]) / row["wall_s"], 3),
            "collector_heartbeats_per_s": round(row["heartbeats_from_collector"] / row["wall_s"], 1),
            "steady_live_event_ack_p99_ms": row.get("live_ack_p99_ms")}


def catch_up(nodes: int, args: argparse.Namespace, pg: PgServer | None) -> dict[str, Any]:
    """Every node draining its backlog in bundles, as fast as the collectors ack, while
    the event nodes send events to the events port."""
    row = run_case(nodes, args.duration, 4000, warmup_s=3.0, bundle=BACKLOG_BUNDLE, **_common(nodes, args, pg))
    rate = row["stored_per_s"]
    return {"drain_reports_per_s": rate,
            "backlog_drain_s": round(OUTAGE_REPORTS / rate, 1) if rate else None,
            "live_event_ack_p99_ms": row.get("live_ack_p99_ms"),
            "live_events": row.get("live_events"), "live_unacked": row.get("live_unacked")}


def measure(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        pg = None
        if db == "postgresql":
            pg = PgServer()
            pg.up()
            stack.callback(pg.down)
        out = {"db": db, "collectors": 2 if pg is not None else 1, "nodes_simulated": args.nodes,
               "scale": FLEET_NODES / args.nodes, **steady(args.nodes, args, pg), **catch_up(args.nodes, args, pg)}
    out["met"] = {key: out[key] is not None and out[key] <= limit for key, limit in TARGETS.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes standing for 10,000")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each phase")
    parser.add_argument("--db", default="sqlite,postgresql")
    args = parser.parse_args()
    if not 1 <= args.nodes <= FLEET_NODES:
        parser.error(f"--nodes {args.nodes}: between 1 and {FLEET_NODES}")
    rows = [measure(db, args) for db in args.db.split(",")]
    print(json.dumps({"targets": TARGETS, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
