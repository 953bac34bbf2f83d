#!/usr/bin/env python3
"""Ingest ack latency with and without scrapers hammering /metrics (issue 12, item 11).

A real collector process (CURVE, SQLite, ``metrics_bind`` on localhost) and 100 simulated
agents (``slurmgpu.sim.fleet``) sending real-sized reports at a steady rate; the run is
repeated with ``--scrapers`` threads GETting /metrics in a loop. Reported per case: the
ack latency p50/p99 the agents saw, reports acked, and the scrapes served (the collector
computes at most one scrape a second; the rest get the cached bytes). ``--seed-nodes``:
that many more nodes (8 GPUs, a report each, 1 in 10 failing) in the database before the
collector starts, so each scrape is that fleet's size.

    python bench/metrics_under_scrapers.py [--nodes 100] [--rate 2] [--duration 15] [--scrapers 8]
                                           [--seed-nodes 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.sim import fleet as simfleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_loop(url: str, stop: threading.Event, served: list[int]) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                resp.read()
            served.append(1)
        except OSError:
            time.sleep(0.05)


def seed_fleet(db: Path, count: int) -> None:
    """``count`` nodes with 8 GPUs and a report each (1 in 10 FAIL on a GPU)."""
    from slurmgpu.collector.store import Store
    from slurmgpu.wire import REPORT, Envelope

    def body(i: int) -> dict[str, Any]:
        bad = [{"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 1, "message": "dbe"}] if i % 10 == 0 else []
        return {"verdict": "FAIL" if bad else "OK", "facts": {}, "findings": [
            {"check": "ecc.volatile", "severity": "OK", "gpu": g, "message": "ok"} for g in range(8)] + bad}

    store = Store(db)
    for start in range(0, count, 1000):
        store.store_batch([(f"seeded-{i:05d}", Envelope(type=REPORT, node=f"seeded-{i:05d}", seq=1, body=body(i)))
                           for i in range(start, min(count, start + 1000))])
    store.close()


def run_case(nodes: int, rate: float, duration: float, scrapers: int, seed_nodes: int = 0) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="scrapers-"))
    try:
        seed_fleet(root / "fleet.db", seed_nodes)
        keys.init(root / "keys")
        sim_nodes = simfleet.make_nodes(root / "keys", nodes)
        address = f"tcp://127.0.0.1:{free_port()}"
        metrics = f"127.0.0.1:{free_port()}"
        config = root / "collector.toml"
        config.write_text(f'[collector]\nmetrics_bind = "{metrics}"\nevents_port = 0\n', encoding="utf-8")
        collector = subprocess.Popen(
            [sys.executable, "-m", "slurmgpu", "collector", "--config", str(config), "--bind", address,
             "--db", str(root / "fleet.db"), "--keys-dir", str(root / "keys"), "--log-level", "warning"])
        stop, served = threading.Event(), []  # type: ignore[var-annotated]
        url = f"http://{metrics}/metrics"
        threads = [threading.Thread(target=scrape_loop, args=(url, stop, served), daemon=True)
                   for _ in range(scrapers)]
        try:
            with simfleet.SimFleet(address, simfleet.collector_public_key(root / "keys"), sim_nodes) as sim:
                sim.hello()
                for t in threads:
                    t.start()
                stats = sim.run(duration, rate=rate)
        finally:
            stop.set()
            for t in threads:
                t.join(15)
            collector.send_signal(signal.SIGTERM)
            collector.wait(30)
        summary = stats.summary()
        return {"scrapers": scrapers, "nodes": nodes, "seed_nodes": seed_nodes, "rate_per_node": rate, "duration_s": duration,
                "acked": summary.get("acked"), "ack_p50_ms": summary.get("ack_p50_ms"),
                "ack_p99_ms": summary.get("ack_p99_ms"), "scrapes_served": len(served)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2.0, help="reports per node per second")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--scrapers", type=int, default=8)
    parser.add_argument("--seed-nodes", type=int, default=0, help="more nodes in the database (scrape size)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [run_case(args.nodes, args.rate, args.duration, n, args.seed_nodes) for n in (0, args.scrapers)]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(f"{r['scrapers']} scrapers: {r['acked']} reports acked, ack p50 {r['ack_p50_ms']} ms, "
                  f"p99 {r['ack_p99_ms']} ms; {r['scrapes_served']} scrapes served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
