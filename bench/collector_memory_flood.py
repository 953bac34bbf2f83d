#!/usr/bin/env python3
"""Collector memory under a hostile node: a real collector subprocess (real CURVE, real
SQLite), one allow-listed node flooding what used to grow the collector without bound,
and a well-behaved node reporting beside it.

Phases, in order, each from the same hostile node:

  index-flood   the issue-12 attack: reports with 20,000 distinct GPU indices each
                (took RSS from 32 to 399 MB in 60 messages before the wire bounds)
  at-the-bound  reports exactly at every wire bound, each new: 1,024 GPUs, 256 IB
                ports, 4,096 findings and 1,024 ok_checks with check ids never seen
                before, long strings
  kinds         events with a new event kind, XID code and GPU index each

Reported per phase: messages sent, stored (DB rows), rejected, the collector's RSS at the
end of the phase and its peak (VmHWM), and the good node's ack latency p50/p99 during it.

    python bench/collector_memory_flood.py [--messages 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import zmq

from slurmgpu import keys, wire
from slurmgpu.wire import Envelope


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024  # MiB
    return out


class Node:
    """An allow-listed node speaking the wire protocol by hand (frames the real agent
    would never build)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, bundle: Path, name: str) -> None:
        public, secret, server = keys.client_keys(bundle)
        self.name = name
        self.epoch = uuid.uuid4().hex
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = public, secret, server
        self.sock.connect(address)
        self.seq = 0

    def frame(self, mtype: str, body: dict[str, Any]) -> bytes:
        self.seq += 1
        if "summary" in body:
            body = {**body, "summary": msgpack.packb(body["summary"], use_bin_type=True)}
        tree = {"v": wire.PROTOCOL_VERSION, "id": uuid.uuid4().hex, "node": self.name, "seq": self.seq,
                "ts": time.time(), "type": mtype, "epoch": self.epoch, "body": body}
        return msgpack.packb(tree, use_bin_type=True)

    def send(self, mtype: str, body: dict[str, Any]) -> int:
        self.sock.send(self.frame(mtype, body))
        return self.seq

    def acks(self, timeout_s: float) -> list[Envelope]:
        out = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0 and self.sock.poll(int(left * 1000) + 1):
            env = wire.decode(self.sock.recv())
            if env.type == wire.ACK:
                out.append(env)
            if not self.sock.poll(0):
                break
        return out


def gpu_row(index: int, tag: str) -> list[Any]:
    return [index, f"SN-{tag}-{index}", "H100 " + tag[:200], 0, 0, 0, 0, 0, 0]


def index_flood(i: int) -> tuple[str, dict[str, Any]]:
    base = i * 20_000
    return wire.REPORT, {"verdict": "OK", "findings": [], "facts": {},
                         "summary": {"gpus": [gpu_row(base + g, "x") for g in range(20_000)]}}


def at_the_bound(i: int) -> tuple[str, dict[str, Any]]:
    tag = f"{i:06d}" + "y" * 100
    findings = [{"check": f"c{i}.{f}."[:wire.MAX_CHECK_NAME], "severity": "WARN", "gpu": f % wire.MAX_GPUS,
                 "subject": f"s{i}-{f}", "message": "m" * 16} for f in range(wire.MAX_FINDINGS)]
    ok = [f"ok{i}.{c}" for c in range(wire.MAX_CHECKS)]
    summary = {"gpus": [gpu_row(g, tag) for g in range(wire.MAX_GPUS)],
               "ib": [[f"mlx5_{p}{i}/1"[:wire.MAX_SHORT], "ACTIVE", 400.0, 0, 0, 0, 0, 0, 0]
                      for p in range(wire.MAX_IB_PORTS)],
               "versions": [tag] * 8}
    return wire.REPORT, {"verdict": "WARN", "findings": findings, "ok_checks": ok, "facts": {},
                         "throttle": 0, "summary": summary}


def kinds(i: int) -> tuple[str, dict[str, Any]]:
    return wire.EVENT, {"kind": f"kind-{i}", "gpu": i % wire.MAX_GPUS, "data": 1000 + i, "verdict": "WARN",
                        "findings": [{"check": f"ev{i}", "severity": "WARN", "gpu": i % wire.MAX_GPUS,
                                      "subject": None, "message": "x"}],
                        "coalesced": 1, "message": f"Xid ({i}): invented"}


PHASES = {"index-flood": index_flood, "at-the-bound": at_the_bound, "kinds": kinds}


def good_node_loop(address: str, bundle: Path, stop: Any, out: Any) -> None:
    """The well-behaved node, in its own process (its latency is not the flooding
    sender's GIL wait)."""
    ctx = zmq.Context()
    node = Node(ctx, address, bundle, "good")
    ok = {"verdict": "OK", "findings": [], "facts": {}}
    latencies: list[float] = []
    while not stop.is_set():
        t0 = time.monotonic()
        seq = node.send(wire.REPORT, ok)
        while time.monotonic() - t0 < 5:
            got = node.acks(5)
            if any(seq in env.body["seqs"] for env in got):
                latencies.append(time.monotonic() - t0)
                break
        time.sleep(0.05)
    out.put(latencies)
    ctx.destroy(linger=0)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def rows(db: Path, node: str) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute("SELECT count(*) FROM messages WHERE node = ?", (node,)).fetchone()[0])


def run(messages: int, index_messages: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sg-memflood-"))
    try:
        keys_dir = tmp / "keys"
        keys.init(keys_dir)
        for name in ("bad", "good"):
            keys.add_node(keys_dir, name)
        port = free_port()
        db = tmp / "fleet.db"
        (tmp / "slurmgpu.toml").write_text(
            f'[collector]\nbind = "tcp://127.0.0.1:{port}"\naddress = "tcp://127.0.0.1:{port}"\n'
            f'db = "{db}"\nkeys_dir = "{keys_dir}"\nmetrics_bind = ""\nevents_port = 0\n')
        proc = subprocess.Popen([sys.executable, "-m", "slurmgpu", "collector", "--config",
                                 str(tmp / "slurmgpu.toml"), "--log-level", "warning"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ctx = zmq.Context()
        try:
            address = f"tcp://127.0.0.1:{port}"
            bad = Node(ctx, address, keys_dir / "bundles" / "bad", "bad")
            hello = {"version": "bench", "gpus": 8, "interval_s": 15.0}
            bad.send(wire.HELLO, hello)
            if not bad.acks(60):
                raise SystemExit("the collector did not ack the hello")
            mpx = mp.get_context("fork")
            time.sleep(1)
            result: dict[str, Any] = {"start": proc_status(proc.pid), "phases": {}}
            for name, make in PHASES.items():
                count = index_messages if name == "index-flood" else messages
                before = rows(db, "bad")
                stop, out = mpx.Event(), mpx.Queue()
                good = mpx.Process(target=good_node_loop, args=(address, keys_dir / "bundles" / "good", stop, out))
                good.start()
                rejected = stored = 0
                t0 = time.monotonic()
                for i in range(count):
                    bad.send(*make(i))
                    for env in bad.acks(0):
                        rejected += len(env.body.get("rejected") or ())
                        stored += len(env.body["seqs"]) - len(env.body.get("rejected") or ())
                    if i % 50 == 49:  # keep the hostile node's window bounded, as a spool would
                        for env in bad.acks(10):
                            rejected += len(env.body.get("rejected") or ())
                            stored += len(env.body["seqs"]) - len(env.body.get("rejected") or ())
                deadline = time.monotonic() + 60
                while stored + rejected < count and time.monotonic() < deadline:
                    for env in bad.acks(1):
                        rejected += len(env.body.get("rejected") or ())
                        stored += len(env.body["seqs"]) - len(env.body.get("rejected") or ())
                elapsed = time.monotonic() - t0
                stop.set()
                latencies: list[float] = out.get(timeout=30)
                good.join(10)
                status = proc_status(proc.pid)
                result["phases"][name] = {
                    "sent": count, "acked_stored": stored, "acked_rejected": rejected,
                    "db_rows": rows(db, "bad") - before, "seconds": round(elapsed, 1),
                    "rss_mb": round(status["VmRSS"], 1), "peak_rss_mb": round(status["VmHWM"], 1),
                    "good_acks": len(latencies), "good_ack_p50_ms": pct(latencies, 0.5),
                    "good_ack_p99_ms": pct(latencies, 0.99)}
            result["collector_alive"] = proc.poll() is None
            return result
        finally:
            ctx.destroy(linger=0)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per bounded phase")
    parser.add_argument("--index-messages", type=int, default=60, help="messages in the index flood")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.messages, args.index_messages)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    start = result["start"]
    print(f"collector at start: RSS {start['VmRSS']:.1f} MiB")
    print(f"{'phase':<14} {'sent':>6} {'stored':>7} {'rejected':>8} {'rss MiB':>8} {'peak MiB':>9} "
          f"{'good p50':>9} {'good p99':>9} {'secs':>6}")
    for name, p in result["phases"].items():
        print(f"{name:<14} {p['sent']:>6} {p['db_rows']:>7} {p['acked_rejected']:>8} {p['rss_mb']:>8} "
              f"{p['peak_rss_mb']:>9} {p['good_ack_p50_ms']!s:>9} {p['good_ack_p99_ms']!s:>9} {p['seconds']:>6}")
    print("collector alive:", result["collector_alive"])
    return 0 if result["collector_alive"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
