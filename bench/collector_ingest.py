#!/usr/bin/env python3
"""Collector ingest throughput: a real collector subprocess, simulated fleets of 100,
1,000 and 10,000 nodes on loopback (real CURVE), saturating it.

For each fleet size: fresh DB and keys, collector started with `slurmgpu collector`,
every node's hello acked (all connected), then reports as fast as a per-node window of
unacknowledged reports allows for --duration seconds, while every node also sends a
heartbeat each --heartbeat-s (5 s, as agents do: 2,000/s at 10,000 nodes). Reported: stored reports/s from
the acks received and from the DB row count (``messages`` rows of type report: one per
stored, deduplicated report; ``report_history`` only records changes), ack latency
p50/p99, and the collector's CPU time per report.

    python bench/collector_ingest.py [--nodes 100,1000,10000] [--duration 10]
                                     [--heartbeat-s 5] [--json]

File descriptors: each simulated node needs ~2 fds (zmq mailbox + TCP), so a fleet
larger than the RLIMIT_NOFILE hard limit allows is split over several sender processes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.sim import fleet as simfleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reports_in_db(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute("SELECT count(*) FROM messages WHERE type = 'report'").fetchone()[0])


def sender(address: str, server_key: bytes, nodes: list[simfleet.SimNode], duration: float,
           window: int, heartbeat_s: float | None, warmup_s: float, ready: Any, go: Any,
           out: Any) -> None:
    with simfleet.SimFleet(address, server_key, nodes) as sim:
        connected = sim.hello(120)
        if warmup_s:  # every node's first reports (history, high-water marks) before the clock
            sim.run(warmup_s, None, window=window, drain_s=30, heartbeat_s=heartbeat_s)
        ready.put(connected)
        go.wait()
        stats = sim.run(duration, None, window=window, drain_s=10, heartbeat_s=heartbeat_s)
        lat = sorted(stats.latencies)
        out.put({"sent": stats.sent, "acked": stats.acked, "elapsed": stats.elapsed_s,
                 "heartbeats": stats.heartbeats_sent,
                 "latencies": lat[:: max(1, len(lat) // 20000)]})


def run_case(n: int, duration: float, inflight: int, heartbeat_s: float | None,
             profile: str | None = None, warmup_s: float = 0.0) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"ingest-{n}-"))
    try:
        keys.init(root / "keys")
        nodes = simfleet.make_nodes(root / "keys", n)
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        db = root / "fleet.db"
        python = [sys.executable, "-m", "cProfile", "-o", f"{profile}.{n}", "-m", "slurmgpu", "collector"] \
            if profile else [sys.executable, "-c", "from slurmgpu.cli.fleet_cmd import collector; collector()"]
        collector = subprocess.Popen(
            [*python, "--bind", address, "--db", str(db), "--keys-dir", str(root / "keys"),
             "--log-level", "warning"])
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        per_proc = max(1, (hard - 256) // simfleet.FDS_PER_NODE)
        procs = math.ceil(n / per_proc)
        window = max(1, inflight // n)
        chunks = [nodes[i::procs] for i in range(procs)]
        ctx = mp.get_context("fork")
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        server_key = simfleet.collector_public_key(root / "keys")
        workers = [ctx.Process(target=sender, args=(address, server_key, c, duration, window,
                                                    heartbeat_s, warmup_s, ready, go, out))
                   for c in chunks]
        for w in workers:
            w.start()
        connected = sum(ready.get(timeout=300) for _ in workers)
        before = reports_in_db(db)
        cpu0, threads0 = _cpu(collector.pid), _thread_cpu(collector.pid)
        t0 = time.perf_counter()
        go.set()
        results = [out.get(timeout=duration + 120) for _ in workers]
        wall = time.perf_counter() - t0
        cpu1, threads1 = _cpu(collector.pid), _thread_cpu(collector.pid)
        for w in workers:
            w.join()
        collector.send_signal(signal.SIGTERM)
        collector.wait(30)
        stored = reports_in_db(db) - before
        acked = sum(r["acked"] for r in results)
        elapsed = max(r["elapsed"] for r in results)
        lat = sorted(x for r in results for x in r["latencies"])
        pct = (lambda p: round(lat[min(len(lat) - 1, int(p * (len(lat) - 1)))] * 1000, 1)) \
            if lat else (lambda p: None)
        return {"nodes": n, "sender_procs": procs, "window": window, "connected": connected,
                "sent": sum(r["sent"] for r in results), "acked": acked,
                "heartbeats": sum(r["heartbeats"] for r in results),
                "acked_per_s": round(acked / elapsed), "stored": stored,
                "stored_per_s": round(stored / wall), "ack_p50_ms": pct(0.5), "ack_p99_ms": pct(0.99),
                "collector_cpu_us_per_report": round((cpu1 - cpu0) / max(1, stored) * 1e6, 1),
                "collector_cpu_us_per_report_by_thread": {
                    name: round((threads1.get(name, 0.0) - threads0.get(name, 0.0)) / max(1, stored) * 1e6, 1)
                    for name in sorted(threads1)}}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cpu(pid: int) -> float:
    """User+system CPU seconds of a process (all threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per kind of thread of a process: "main" (the Python loop: decode,
    store, acks), "zmq-io" (libzmq's I/O thread: TCP, CURVE), "other" (ZAP, metrics...)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = "main" if task.name == str(pid) else ("zmq-io" if comm.startswith("ZMQbg/IO") else "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=4000,
                        help="unacked reports across the fleet (window per node = this / nodes)")
    parser.add_argument("--heartbeat-s", type=float, default=5.0,
                        help="each node also heartbeats this often, as agents do (0: none)")
    parser.add_argument("--warmup", type=float, default=10.0, metavar="SECONDS",
                        help="reports sent before the measurement, so that every node's first "
                             "report (its history and high-water mark) is not what is measured")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="run the collector under cProfile, stats to PREFIX.<nodes> (its main thread "
                             "only; the CPU figures then include the profiler's overhead)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = run_case(n, args.duration, args.inflight, args.heartbeat_s or None, args.profile,
                       args.warmup)
        rows.append(row)
        if not args.json:
            print(f"{row['nodes']:>6} nodes ({row['sender_procs']} sender procs, window {row['window']}): "
                  f"stored {row['stored_per_s']}/s (db), acked {row['acked_per_s']}/s, "
                  f"ack p50 {row['ack_p50_ms']} ms p99 {row['ack_p99_ms']} ms, "
                  f"collector {row['collector_cpu_us_per_report']} us CPU/report "
                  f"{row['collector_cpu_us_per_report_by_thread']}", flush=True)
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
