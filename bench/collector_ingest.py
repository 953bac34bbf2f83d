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
                                     [--heartbeat-s 5] [--db sqlite|postgresql]
                                     [--collectors N] [--full-every N]
                                     [--live-nodes N [--live-interval S]] [--no-events-port]
                                     [--bundle N] [--collector-cpus LIST]
                                     [--floor] [--json]

``--bundle N``: the saturating nodes send their reports as agents drain a backlog, N in
one bundle message (``wire.BUNDLE``; agents send 32), with a window of at least N per node.

``--collector-cpus 0``: the collectors on CPU 0 only, every simulated node on the other
CPUs: the collector's figures as on a head node where it has a core of its own (the
PostgreSQL server is not pinned).

``--live-nodes N``: N more nodes that do not saturate; each sends an XID event every
``--live-interval`` seconds, each node on a phase of its own (spread over the interval),
to the collector's events port (``[collector] events_port``, as agents do;
``--no-events-port``: collectors without one, the events go with the reports). Their ack
latency (p50, p99, max over the events) is what a fresh fault waits for during a backlog
drain.

``--floor``: instead of the collector, its real transport alone (``Transport``: the same
sockets, CURVE, checks, decoding and acks) with a handler that stores nothing and counts
every message as stored. Its CPU a report is what the collector pays before its store:
the floor under the collector's figure on this machine.

``--db postgresql``: a throwaway PostgreSQL server (initdb/pg_ctl in a temp dir, as the
tests start it) instead of the SQLite file; ``--collectors N``: N collector processes on
that one database, the nodes split evenly between them (active/active ingest). The
PostgreSQL server's CPU per report (every ``postgres`` process) is then reported too.

File descriptors: each simulated node needs ~2 fds (zmq mailbox + TCP), so a fleet
larger than the RLIMIT_NOFILE hard limit allows is split over several sender processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.collector.counters import Counters
from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.transport import Stored, Transport
from slurmgpu.config.schema import CollectorSettings, with_port
from slurmgpu.sim import fleet as simfleet
from slurmgpu.sim.postgres import PgServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reports_in_db(db: str) -> int:
    with queries.snapshot(db) as conn:
        return int(conn.execute("SELECT count(*) FROM messages WHERE type = 'report'").fetchone()[0])


def unreachable_marks(db: str, start: float, end: float) -> int:
    """Nodes marked unreachable between ``start`` and ``end`` (wall clock): a node whose
    messages wait too long at the collector looks silent. (The simulated nodes heartbeat
    while the others warm up; after the run they are silent.)"""
    with queries.snapshot(db) as conn:
        return int(conn.execute("SELECT count(*) FROM node_states WHERE kind = 'unreachable' "
                                "AND ts >= ? AND ts <= ?", (start, end)).fetchone()[0])


def elapsed_of(results: list[dict[str, Any]]) -> float:
    return float(max(r["elapsed"] for r in results))


def postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL server process (postmaster, backends, workers)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() in ("postgres", "postmaster"):
                    total += _cpu(int(proc.name))
            except OSError:
                continue
    return total


def sender(address: str, server_key: bytes, nodes: list[simfleet.SimNode], duration: float,
           window: int, heartbeat_s: float | None, warmup_s: float, full_every: int, bundle: int,
           ready: Any, go: Any, out: Any, rate: float | None = None) -> None:
    with simfleet.SimFleet(address, server_key, nodes, full_every=full_every, bundle=bundle) as sim:
        connected = sim.hello(120)
        if warmup_s:  # every node's first reports (history, high-water marks) before the clock
            sim.run(warmup_s, None, window=window, drain_s=30, heartbeat_s=heartbeat_s)
        ready.put(connected)
        sim.idle(go.is_set, heartbeat_s)  # (heartbeating, as agents do, while the others warm up)
        stats = sim.run(duration, rate, window=window, drain_s=10, heartbeat_s=heartbeat_s)
        lat = sorted(stats.latencies)
        out.put({"sent": stats.sent, "acked": stats.acked, "elapsed": stats.elapsed_s,
                 "bundles": stats.bundles_sent,
                 "heartbeats": stats.heartbeats_sent, "heartbeats_skipped": stats.heartbeats_skipped,
                 "heartbeats_from_collector": stats.heartbeats,
                 "latencies": lat[:: max(1, len(lat) // 20000)]})


def start_collector(root: Path, address: str, db: str, profile: str | None,
                    events_port: int, cpus: set[int] | None = None,
                    heartbeat_s: float = 5.0) -> subprocess.Popen[bytes]:
    """A collector process; ``heartbeat_s``: its ``[collector] heartbeat_s`` (how long a
    node may go unacked before the collector heartbeats it)."""
    python = [sys.executable, "-m", "cProfile", "-o", profile, "-m", "slurmgpu", "collector"] \
        if profile else [sys.executable, "-c", "from slurmgpu.cli.fleet_cmd import collector; collector()"]
    config = root / "collector.toml"
    config.write_text(f"[collector]\nheartbeat_s = {heartbeat_s!r}\n")
    return subprocess.Popen([*python, "--config", str(config), "--bind", address, "--events-port",
                             str(events_port), "--db", db, "--keys-dir", str(root / "keys"), "--log-level", "warning"],
                            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))


class NullHandler:
    """The transport's handler for ``--floor``: stores nothing; every message counts as
    newly stored (so each is acked as stored)."""

    def commit(self, batch: Any, now: float) -> Stored:
        return Stored([(item[0], item[1].seq) for item in batch], set())

    def acked(self, batch: Any, new: Any, now: float) -> None:
        pass

    def allow_list_changed(self, allowed: Any) -> None:
        pass

    def heard(self, nodes: set[str], now: float) -> bool:
        return True


def serve_floor(address: str, events_port: int, keys_dir: str, heartbeat_s: float = 5.0) -> None:
    """The collector's transport serving with a ``NullHandler`` until SIGTERM (``--floor``)."""
    settings = CollectorSettings(address=address, bind=address, db=":memory:", keys_dir=keys_dir,
                                 events_port=events_port, heartbeat_s=heartbeat_s)
    transport = Transport(settings, Counters())
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    transport.listen()
    handler = NullHandler()
    try:
        while not stop:
            transport.receive(handler, 200)
            transport.tick(handler)
    finally:
        transport.close()


def start_floor(root: Path, address: str, events_port: int, cpus: set[int] | None,
                heartbeat_s: float = 5.0) -> subprocess.Popen[bytes]:
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from collector_ingest import serve_floor; "
            f"serve_floor({address!r}, {events_port}, {str(root / 'keys')!r}, {heartbeat_s!r})")
    return subprocess.Popen([sys.executable, "-c", code],
                            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))


def pinned(cpus: set[int] | None, target: Any) -> Any:
    """``target`` run on these CPUs only (a sender kept off the collector's cores)."""
    if cpus is None:
        return target

    def run(*args: Any) -> None:
        os.sched_setaffinity(0, cpus)
        target(*args)
    return run


def live_sender(address: str, server_key: bytes, nodes: list[simfleet.SimNode], duration: float,
                interval_s: float, go: Any, out: Any) -> None:
    """Nodes that are not draining a backlog: each sends an event every ``interval_s``
    (an XID as the agent sends it, not windowed) while the others saturate the collector.
    Their ack latency is what a fresh fault waits for during a backlog drain."""
    import zmq

    from slurmgpu.wire import ACK, EVENT, Envelope, decode, encode

    ctx = zmq.Context()
    socks = []
    for node in nodes:
        sock = ctx.socket(zmq.DEALER)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = node.public, node.secret, server_key
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        socks.append(sock)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    sent: dict[tuple[int, int], float] = {}
    latencies: list[float] = []
    go.wait()
    start = time.perf_counter()
    # Each node on a phase of its own (faults are not synchronised across nodes): an event
    # lands anywhere in the collector's loop turn, and a percentile is one over events, not
    # over the few instants when every node sent at once.
    seqs = [0] * len(nodes)
    next_at = [start + interval_s * i / len(nodes) for i in range(len(nodes))]
    body = {"kind": "xid", "gpu": 3, "data": 79, "verdict": "FAIL", "findings": [], "coalesced": 0}
    while time.perf_counter() < start + duration + 5:
        now = time.perf_counter()
        for i, (node, sock) in enumerate(zip(nodes, socks, strict=True)):
            if now >= next_at[i] and now < start + duration:
                seqs[i] += 1
                next_at[i] += interval_s
                sock.send(encode(Envelope(type=EVENT, node=node.name, seq=seqs[i], body=body, epoch="live")))
                sent[(i, seqs[i])] = time.perf_counter()
        wait_ms = max(0.0, min(10.0, (min(next_at) - time.perf_counter()) * 1000))
        for sock, _ in poller.poll(wait_ms):
            i = socks.index(sock)
            env = decode(sock.recv())
            if env.type == ACK:
                for acked in env.body["seqs"]:
                    at = sent.pop((i, acked), None)
                    if at is not None:
                        latencies.append(time.perf_counter() - at)
    out.put({"live_sent": len(latencies) + len(sent), "live_unacked": len(sent), "live_latencies": latencies})
    ctx.destroy(linger=0)


def _rss_kb(pid: int) -> dict[str, int]:
    """The collector's resident memory now and at its peak (kB, /proc/<pid>/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def run_case(n: int, duration: float, inflight: int, heartbeat_s: float | None,
             profile: str | None = None, warmup_s: float = 0.0, *, pg: PgServer | None = None,
             collectors: int = 1, full_every: int = 1, live_nodes: int = 0,
             live_interval_s: float = 1.0, events: bool = True, bundle: int = 1,
             collector_cpus: set[int] | None = None, floor: bool = False, rate: float | None = None,
             collector_heartbeat_s: float = 5.0) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"ingest-{n}-"))
    try:
        keys.init(root / "keys")
        nodes = simfleet.make_nodes(root / "keys", n)
        live = simfleet.make_nodes(root / "keys", live_nodes, prefix="live") if live_nodes else []
        addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(collectors)]
        db = pg.create_database() if pg is not None else str(root / "fleet.db")
        Store(db).close()  # migrated once, before the collectors start
        events_ports = [free_port() if events else 0 for _ in addresses]
        procs_of = [start_floor(root, a, port, collector_cpus, collector_heartbeat_s) if floor else
                    start_collector(root, a, db, f"{profile}.{n}.{i}" if profile else None, port,
                                    collector_cpus, collector_heartbeat_s)
                    for i, (a, port) in enumerate(zip(addresses, events_ports, strict=True))]
        others = None if collector_cpus is None else (os.sched_getaffinity(0) - collector_cpus) or None
        # live nodes send their events where agents do: the events port when there is one
        live_address = (with_port(addresses[0], events_ports[0]) if events else None) or addresses[0]
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        per_proc = max(1, (hard - 256) // simfleet.FDS_PER_NODE)
        procs = max(collectors, math.ceil(n / per_proc / collectors) * collectors)
        window = max(1, inflight // n, bundle)
        chunks = [nodes[i::procs] for i in range(procs)]
        ctx = mp.get_context("fork")
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        server_key = simfleet.collector_public_key(root / "keys")
        workers = [ctx.Process(target=pinned(others, sender), args=(addresses[i % collectors], server_key, c, duration,
                                                    window, heartbeat_s, warmup_s, full_every, bundle,
                                                    ready, go, out, rate))
                   for i, c in enumerate(chunks)]
        live_out = ctx.Queue()
        live_workers = [ctx.Process(target=pinned(others, live_sender), args=(live_address, server_key, live, duration,
                                                             live_interval_s, go, live_out))] if live else []
        for w in workers + live_workers:
            w.start()
        connected = sum(ready.get(timeout=300) for _ in workers)
        before = reports_in_db(db)
        cpu0 = [_cpu(c.pid) for c in procs_of]
        threads0 = [_thread_cpu(c.pid) for c in procs_of]
        pg0 = postgres_cpu() if pg is not None else 0.0
        t0, t_wall = time.perf_counter(), time.time()
        go.set()
        results = [out.get(timeout=duration + 120) for _ in workers]
        wall = time.perf_counter() - t0
        live_result = live_out.get(timeout=60) if live_workers else None
        rss = _rss_kb(procs_of[0].pid)
        cpu1 = [_cpu(c.pid) for c in procs_of]
        threads1 = [_thread_cpu(c.pid) for c in procs_of]
        pg1 = postgres_cpu() if pg is not None else 0.0
        for w in workers + live_workers:
            w.join()
        for c in procs_of:
            c.send_signal(signal.SIGTERM)
        for c in procs_of:
            c.wait(30)
        # (--floor stores nothing: every report acked counts)
        stored = sum(r["acked"] for r in results) if floor else reports_in_db(db) - before
        unreachable = unreachable_marks(db, t_wall, t_wall + elapsed_of(results))
        threads0_sum, threads1_sum = _summed(threads0), _summed(threads1)
        acked = sum(r["acked"] for r in results)
        elapsed = elapsed_of(results)
        lat = sorted(x for r in results for x in r["latencies"])
        pct = (lambda p: round(lat[min(len(lat) - 1, int(p * (len(lat) - 1)))] * 1000, 1)) \
            if lat else (lambda p: None)
        return {"nodes": n, "db": "postgresql" if pg is not None else "sqlite", "collectors": collectors,
                "collector_cpus": sorted(collector_cpus) if collector_cpus is not None else None,
                "events_port": events, "floor": floor,
                "full_every": full_every, "bundle": bundle,
                "bundles_sent": sum(r["bundles"] for r in results),
                "sender_procs": procs, "window": window, "connected": connected,
                "sent": sum(r["sent"] for r in results), "acked": acked,
                "heartbeats": sum(r["heartbeats"] for r in results),
                "heartbeats_skipped": sum(r["heartbeats_skipped"] for r in results),
                "heartbeats_from_collector": sum(r["heartbeats_from_collector"] for r in results),
                "acked_per_s": round(acked / elapsed), "stored": stored,
                "stored_per_s": round(stored / wall), "unreachable_marks": unreachable, "ack_p50_ms": pct(0.5), "ack_p99_ms": pct(0.99),
                "collector_cpu_us_per_report": round((sum(cpu1) - sum(cpu0)) / max(1, stored) * 1e6, 1),
                "collector_cpu_us_per_report_by_thread": {
                    name: round((threads1_sum.get(name, 0.0) - threads0_sum.get(name, 0.0)) / max(1, stored)
                                * 1e6, 1)
                    for name in sorted(threads1_sum)},
                "wall_s": round(wall, 3),
                "collector_cpu_s": [round(b - a, 3) for a, b in zip(cpu0, cpu1, strict=True)],
                "postgres_cpu_us_per_report": round((pg1 - pg0) / max(1, stored) * 1e6, 1) if pg else None,
                "collector_rss_mb": round(rss.get("VmRSS", 0) / 1024, 1),
                "collector_peak_rss_mb": round(rss.get("VmHWM", 0) / 1024, 1),
                **_live_summary(live_result)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cpu(pid: int) -> float:
    """User+system CPU seconds of a process (all threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def _live_summary(result: dict[str, Any] | None) -> dict[str, Any]:
    if result is None:
        return {}
    lat = sorted(result["live_latencies"])
    pct = (lambda p: round(lat[min(len(lat) - 1, int(p * (len(lat) - 1)))] * 1000, 1)) if lat else (lambda p: None)
    return {"live_events": result["live_sent"], "live_unacked": result["live_unacked"],
            "live_ack_p50_ms": pct(0.5), "live_ack_p99_ms": pct(0.99), "live_ack_max_ms": pct(1.0)}


def _summed(per_process: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for threads in per_process:
        for name, seconds in threads.items():
            out[name] = out.get(name, 0.0) + seconds
    return out


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
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--collectors", type=int, default=1,
                        help="collector processes on the one database (PostgreSQL for more than one)")
    parser.add_argument("--full-every", type=int, default=1, metavar="N",
                        help="one report in N carries the node's facts, as agents send them "
                             "([agent] full_report_s / interval_s: 600 / 15 = 40); 1: all")
    parser.add_argument("--live-nodes", type=int, default=0, metavar="N",
                        help="N more nodes, not saturating: each sends an event every --live-interval "
                             "(their ack latency: a fresh fault during a backlog drain)")
    parser.add_argument("--live-interval", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--no-events-port", action="store_true",
                        help="collectors without [collector] events_port: live events queue with the reports")
    parser.add_argument("--bundle", type=int, default=1, metavar="N",
                        help="send the saturating nodes' reports N to a bundle, as agents drain a "
                             "backlog (32); the window per node is then at least N")
    parser.add_argument("--collector-cpus", metavar="LIST",
                        help="run the collectors on these CPUs (e.g. 0) and every sender on the others: "
                             "a head node whose collector has cores of its own")
    parser.add_argument("--floor", action="store_true",
                        help="the collector's transport alone (sockets, CURVE, checks, decoding, acks), "
                             "storing nothing: what the collector pays before its store")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.floor and (args.profile or args.db != "sqlite" or args.collectors != 1):
        parser.error("--floor runs one transport without a database: no --profile, --db or --collectors")
    if args.collector_cpus is not None:
        try:
            args.collector_cpus = {int(c) for c in args.collector_cpus.split(",")}
        except ValueError:
            parser.error(f"--collector-cpus {args.collector_cpus!r}: not a list of CPU numbers")
        if not args.collector_cpus < os.sched_getaffinity(0):
            parser.error(f"--collector-cpus: CPUs {sorted(os.sched_getaffinity(0))} are usable here, "
                         "and the senders need one the collectors do not have")
    if args.collectors > 1 and args.db != "postgresql":
        parser.error("--collectors > 1 needs --db postgresql (one SQLite file has one collector)")
    with contextlib.ExitStack() as stack:
        pg = None
        if args.db == "postgresql":
            pg = PgServer()
            pg.up()
            stack.callback(pg.down)
        rows = [_case(n, args, pg) for n in (int(x) for x in args.nodes.split(","))]
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "results": rows}, indent=2))
    return 0


def _case(n: int, args: argparse.Namespace, pg: PgServer | None) -> dict[str, Any]:
    row = run_case(n, args.duration, args.inflight, args.heartbeat_s or None, args.profile,
                   args.warmup, pg=pg, collectors=args.collectors, full_every=args.full_every,
                   live_nodes=args.live_nodes, live_interval_s=args.live_interval,
                   events=not args.no_events_port, bundle=args.bundle,
                   collector_cpus=args.collector_cpus,
                   floor=args.floor)
    if not args.json:
        server = (f", postgres {row['postgres_cpu_us_per_report']} us CPU/report"
                  if row["postgres_cpu_us_per_report"] is not None else "")
        server += f", RSS {row['collector_rss_mb']} MB (peak {row['collector_peak_rss_mb']})"
        if "live_events" in row:
            server += (f", live events: {row['live_events']} ack p50 {row['live_ack_p50_ms']} ms "
                       f"p99 {row['live_ack_p99_ms']} ms max {row['live_ack_max_ms']} ms ({row['live_unacked']} unacked)")
        pin = f", collectors on CPU {row['collector_cpus']}" if row["collector_cpus"] else ""
        what = "transport alone (--floor)" if row["floor"] else f"{row['db']} x{row['collectors']}"
        print(f"{row['nodes']:>6} nodes, {what}{pin}, "
              f"1/{row['full_every']} full, "
              f"bundles of {row['bundle']} ({row['bundles_sent']} sent), "
              f"events port {'on' if row['events_port'] else 'off'} "
              f"({row['sender_procs']} sender procs, window {row['window']}): "
              f"stored {row['stored_per_s']}/s (db), acked {row['acked_per_s']}/s, "
              f"{row['unreachable_marks']} marked unreachable, "
              f"ack p50 {row['ack_p50_ms']} ms p99 {row['ack_p99_ms']} ms, "
              f"collector {row['collector_cpu_us_per_report']} us CPU/report "
              f"{row['collector_cpu_us_per_report_by_thread']}{server}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
