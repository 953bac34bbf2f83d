#!/usr/bin/env python3
"""Honest nodes' ack latency beside one hostile node with a valid key (issue 28, item 6):
a real collector subprocess (real CURVE, SQLite or a throwaway PostgreSQL), ``--honest``
nodes each sending a report every ``--interval`` seconds and timing its ack, and one
node sending ``--rate`` reports a second whose finding message contains NUL (which
PostgreSQL's text cannot store; before the wire refused it, every such report made the
collector roll its batch back and store it again one message per transaction).

Each case runs twice, without the hostile node (the baseline) and with it; reported:
the honest acks' p50/p99, how many were acked, and the hostile reports acked as
rejected.

``--isolation N``: what a message the store refuses (one the wire would have to miss: a
seq past int64, refused by both backends) costs its batch, in process: the time
``Fleet.commit`` takes for N full reports of N nodes, and for the same with that message
in the middle (it is isolated and refused, the others stored), and the transactions.

    python bench/hostile_node.py [--db sqlite,postgresql] [--duration 20] [--rate 100] [--json]
    python bench/hostile_node.py --isolation 256 [--db ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import zmq

from slurmgpu import keys, log, wire
from slurmgpu.collector.counters import Counters
from slurmgpu.collector.fleet import Fleet
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.sim.postgres import PgServer
from slurmgpu.summary import report_fields
from slurmgpu.testing import make_facts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collector_memory_flood import free_port, pct

NUL_FINDING = {"check": "gpu.thermal", "severity": "WARN", "gpu": 0, "subject": None,
               "message": "GPU 0 at 87 C\x00 and more"}
# An 8-GPU node's full report, as agents send it (facts and summary pre-packed)
FACTS = make_facts("honest", gpus=8, ib_ports=8)
HONEST_BODY = {"verdict": "OK", "findings": [], "ok_checks": ["gpu.ecc", "gpu.count", "ib.ports"],
               "facts": wire.packed(wire.plain(FACTS.to_json())), **report_fields(FACTS)}


class Node:
    """An allow-listed node speaking the wire by hand (its frames are not validated)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, bundle: Path, name: str) -> None:
        public, secret, server = keys.client_keys(bundle)
        self.name, self.epoch, self.seq = name, uuid.uuid4().hex, 0
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = public, secret, server
        self.sock.connect(address)

    def send(self, mtype: str, body: dict[str, Any]) -> int:
        self.seq += 1
        tree = {"v": 1, "id": uuid.uuid4().hex, "node": self.name, "seq": self.seq, "ts": time.time(),
                "type": mtype, "body": body, "epoch": self.epoch}
        self.sock.send(msgpack.packb(tree, use_bin_type=True))
        return self.seq

    def acks(self, timeout_s: float) -> list[wire.Envelope]:
        out = []
        if self.sock.poll(int(timeout_s * 1000)):
            while self.sock.poll(0):
                env = wire.decode(self.sock.recv())
                if env.type == wire.ACK:
                    out.append(env)
        return out


def honest_loop(address: str, bundle: Path, name: str, interval_s: float, duration_s: float,
                out: Any) -> None:
    """One honest node, in its own process: a report every ``interval_s``, its ack timed."""
    ctx = zmq.Context()
    node = Node(ctx, address, bundle, name)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    end = time.monotonic() + duration_s
    next_send = time.monotonic()
    while (now := time.monotonic()) < end or (sent and now < end + 5.0):  # (5 s more for the last acks)
        if end > now >= next_send:
            sent[node.send(wire.REPORT, HONEST_BODY)] = now
            next_send += interval_s
        until = min(next_send, end) if now < end else end + 5.0
        for env in node.acks(max(0.0, until - time.monotonic())):
            got = time.monotonic()
            latencies += [got - sent.pop(s) for s in env.body["seqs"] if s in sent]
    out.put((latencies, len(sent)))
    ctx.destroy(linger=0)


def hostile_loop(address: str, bundle: Path, rate: float, duration_s: float, out: Any) -> None:
    """The hostile node: ``rate`` NUL reports a second; counts the acks rejecting them."""
    ctx = zmq.Context()
    node = Node(ctx, address, bundle, "hostile")
    rejected = sent = 0
    end = time.monotonic() + duration_s
    next_send = time.monotonic()
    while (now := time.monotonic()) < end or (rejected < sent and now < end + 5.0):  # (then its last acks)
        if end > now >= next_send:
            node.send(wire.REPORT, {"verdict": "WARN", "findings": [NUL_FINDING]})
            sent += 1
            next_send += 1.0 / rate
        until = min(next_send, end) if now < end else end + 5.0
        for env in node.acks(max(0.0, until - time.monotonic())):
            rejected += len(env.body.get("rejected") or ())
    out.put((sent, rejected))
    ctx.destroy(linger=0)


def start_collector(tmp: Path, db: str, names: list[str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    keys_dir = tmp / "keys"
    keys.init(keys_dir)
    for name in names:
        keys.add_node(keys_dir, name)
    port = free_port()
    (tmp / "slurmgpu.toml").write_text(
        f'[collector]\nbind = "tcp://127.0.0.1:{port}"\naddress = "tcp://127.0.0.1:{port}"\n'
        f'db = "{db}"\nkeys_dir = "{keys_dir}"\nmetrics_bind = ""\nevents_port = 0\n')
    proc = subprocess.Popen([sys.executable, "-m", "slurmgpu", "collector", "--config", str(tmp / "slurmgpu.toml"),
                             "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"tcp://127.0.0.1:{port}", keys_dir


def wait_ready(address: str, bundle: Path) -> None:
    ctx = zmq.Context()
    try:
        node = Node(ctx, address, bundle, "hostile")
        node.send(wire.HELLO, {"version": "bench", "gpus": 8, "interval_s": 15.0})
        if not node.acks(60):
            raise SystemExit("the collector did not ack a hello")
    finally:
        ctx.destroy(linger=0)


def run_case(db: str, args: argparse.Namespace, hostile: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sg-hostile-"))
    names = [f"honest-{i}" for i in range(args.honest)]
    proc, address, keys_dir = start_collector(tmp, db if db != "sqlite" else str(tmp / "fleet.db"),
                                              [*names, "hostile"])
    try:
        wait_ready(address, keys_dir / "bundles" / "hostile")
        fork = mp.get_context("fork")
        out, bad_out = fork.Queue(), fork.Queue()
        procs = [fork.Process(target=honest_loop, args=(address, keys_dir / "bundles" / n, n, args.interval,
                                                        args.duration, out)) for n in names]
        if hostile:
            procs.append(fork.Process(target=hostile_loop, args=(address, keys_dir / "bundles" / "hostile",
                                                                 args.rate, args.duration, bad_out)))
        for p in procs:
            p.start()
        results = [out.get(timeout=args.duration + 60) for _ in names]
        sent, rejected = bad_out.get(timeout=60) if hostile else (0, 0)
        for p in procs:
            p.join(10)
        latencies = [x for lat, _ in results for x in lat]
        return {"hostile": hostile, "honest_acks": len(latencies), "honest_unacked": sum(u for _, u in results),
                "honest_ack_p50_ms": pct(latencies, 0.5), "honest_ack_p99_ms": pct(latencies, 0.99),
                "hostile_sent": sent, "hostile_rejected": rejected, "collector_alive": proc.poll() is None}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def isolation(url: str, n: int) -> dict[str, Any]:
    """``Fleet.commit`` of n reports (once to warm up, once timed), then of n others with
    one unstorable message."""
    log.configure("error", stream=sys.stderr)
    store = Store(url)
    fleet = Fleet(CollectorSettings(db=url), store, Counters(), allowed={})
    calls: list[int] = []
    real = store.store_batch

    def counting(batch: Any, **kw: Any) -> list[tuple[str, int]]:
        calls.append(len(batch))
        return real(batch, **kw)

    store.store_batch = counting  # type: ignore[method-assign]
    body = wire.packed(HONEST_BODY)
    out: dict[str, Any] = {}
    try:
        for case, seq in (("warm-up", 1), ("clean", 2), ("one_bad", 3)):  # (the nodes' first: extra reads)
            batch = [(f"n{i}", wire.Envelope(type=wire.REPORT, node=f"n{i}", seq=seq, body=HONEST_BODY), body)
                     for i in range(n)]
            if case == "one_bad":
                batch.insert(n // 2, ("bad", wire.Envelope(type=wire.REPORT, node="bad", seq=2**63,
                                                           body=HONEST_BODY), body))
            calls.clear()
            t0 = time.perf_counter()
            stored = fleet.commit(batch, time.time())
            out[case] = {"ms": round((time.perf_counter() - t0) * 1000, 1), "transactions": len(calls),
                         "messages_written": sum(calls), "stored": len(stored.new) if stored else None,
                         "refused": len(stored.refused) if stored else None}
    finally:
        store.close()
    del out["warm-up"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="sqlite,postgresql", help="sqlite, postgresql, or both")
    parser.add_argument("--honest", type=int, default=7, help="honest nodes")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between an honest node's reports")
    parser.add_argument("--rate", type=float, default=100.0, help="the hostile node's NUL reports a second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds a case runs")
    parser.add_argument("--isolation", type=int, metavar="N", help="time a batch of N with one bad message")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for backend in args.db.split(","):
            url = backend
            if backend == "postgresql":
                pg = PgServer()
                pg.up()
                stack.callback(pg.down)
            if args.isolation:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sg-isolation-"))
                url = pg.create_database() if backend == "postgresql" else f"{tmp}/fleet.db"
                rows.append({"db": backend, "messages": args.isolation, **isolation(url, args.isolation)})
                continue
            for hostile in (False, True):
                if backend == "postgresql":
                    url = pg.create_database()
                rows.append({"db": backend, **run_case(url, args, hostile)})
    if args.json or args.isolation:
        print(json.dumps({"cpus": os.cpu_count(), "results": rows}, indent=2))
        return 0
    print(f"{'db':<11} {'hostile':>8} {'acks':>6} {'unacked':>8} {'p50 ms':>7} {'p99 ms':>7} {'NUL sent':>9} "
          f"{'rejected':>9}")
    for r in rows:
        print(f"{r['db']:<11} {r['hostile']!s:>8} {r['honest_acks']:>6} {r['honest_unacked']:>8} "
              f"{r['honest_ack_p50_ms']!s:>7} {r['honest_ack_p99_ms']!s:>7} {r['hostile_sent']:>9} "
              f"{r['hostile_rejected']:>9}")
    return 0 if all(r["collector_alive"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
