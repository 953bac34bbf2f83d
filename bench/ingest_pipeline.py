#!/usr/bin/env python3
"""The collector's main-thread work per report, in one process, without the simulated
senders: what `bench/collector_ingest.py` measures minus libzmq (no sockets are read).

Bundles of delta reports (1 in ``--full-every`` carries facts, as agents send them)
from ``--nodes`` allow-listed nodes are made up front as received frames; then the real
collector (``build_collector``, a SQLite file, its WAL thread) takes them as its loop
does: ``Transport._accept`` (frame checks, decoding, unbundling), ``Transport._commit``
(``Fleet.commit``: the store's batch and COMMIT; the acks, sent to routing ids that are
not connected, so no I/O thread work follows). Reported: the process's CPU time per
stored report (``time.process_time``: every thread, the WAL thread included).

    python bench/ingest_pipeline.py [--nodes 10000] [--bundles 8000] [--bundle 32]
                                    [--batch 256] [--full-every 40] [--neighbour] [--json]

``--neighbour``: a process on another CPU writes over 200 MB in a loop while this one is
timed (this one on CPU 0, it on CPU 1): what the simulated senders of
``collector_ingest.py``, sharing the VM's cache and memory with the collector, cost it.

A reference figure is printed with the result: ``sum(range(1000))`` in this interpreter
(CPython's speed on this CPU), so a run on another machine can be set beside this one.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import socket
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.collector.app import build_collector
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.sim.fleet import FrameMaker, make_nodes
from slurmgpu.wire import bundle_frame


class Frame:
    """What ``recv_multipart(copy=False)`` gives the transport: bytes and the CURVE key."""

    def __init__(self, data: bytes, user: str | None) -> None:
        self.bytes = data
        self._user = user

    def get(self, _key: str) -> str | None:
        return self._user

    def __len__(self) -> int:
        return len(self.bytes)


def make_bundles(nodes: list[Any], count: int, size: int, full_every: int,
                 seqs: list[int]) -> list[list[Frame]]:
    frames = FrameMaker(full_every=full_every)
    out = []
    for b in range(count):
        i = b % len(nodes)
        node = nodes[i]
        first = seqs[i] + 1
        now = time.time()
        reports = [frames.report(frames.node_part(node.name), i, seq, now) for seq in range(first, first + size)]
        seqs[i] += size
        out.append([Frame(b"\x00" + i.to_bytes(4, "big"), None),
                    Frame(bundle_frame(node.name, reports), node.public.decode())])
    return out


def feed(collector: Any, bundles: list[list[Frame]], batch: int) -> None:
    """As ``Transport._drain_batch`` does, ``batch`` messages a batch."""
    transport, fleet = collector.transport, collector.fleet
    now = time.time()
    items: list[Any] = []
    to_ack: list[Any] = []
    for parts in bundles:
        transport._accept(parts, items, to_ack, now)
        if len(items) >= batch:
            transport._commit(fleet, items, to_ack, now)
            items, to_ack = [], []
            fleet.tick()  # (the loop's turn)
    if items:
        transport._commit(fleet, items, to_ack, now)


def neighbour(seconds: float) -> None:
    os.sched_setaffinity(0, {1})
    blocks = [bytearray(1 << 20) for _ in range(200)]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for block in blocks:
            block[::64] = b"x" * (len(block) // 64)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="pipeline-"))
    keys.init(root / "keys")
    nodes = make_nodes(root / "keys", args.nodes)
    port = _free_port()  # (benches bind no fixed port)
    # (no node falls silent while the frames are made: in the collector_ingest runs none
    # does, and marking thousands unreachable, and logging each, is not ingest work)
    settings = CollectorSettings(address=f"tcp://127.0.0.1:{port}", bind=f"tcp://127.0.0.1:{port}",
                                 db=str(root / "fleet.db"), keys_dir=str(root / "keys"), events_port=0,
                                 heartbeat_s=3600.0)
    collector = build_collector(settings)
    seqs = [0] * len(nodes)
    try:
        warm = make_bundles(nodes, len(nodes), args.bundle, args.full_every, seqs)  # first reports
        timed = make_bundles(nodes, args.bundles, args.bundle, args.full_every, seqs)
        per_report = sum(len(b[1].bytes) for b in timed) / (len(timed) * args.bundle)
        gc.disable()  # (as the transport does during a batch)
        feed(collector, warm, args.batch)
        other = None
        if args.neighbour:
            os.sched_setaffinity(0, {0})
            other = mp.get_context("fork").Process(target=neighbour, args=(600.0,))
            other.start()
            time.sleep(1.0)
        stored0, cpu0, wall0 = collector.counters.stored, time.process_time(), time.perf_counter()
        feed(collector, timed, args.batch)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stored = collector.counters.stored - stored0
        if other is not None:
            other.kill()
            other.join()
        gc.enable()
    finally:
        collector.close()
    reference = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000
    return {"nodes": args.nodes, "bundle": args.bundle, "batch": args.batch, "full_every": args.full_every,
            "neighbour": args.neighbour,
            "stored": stored, "bytes_per_report": round(per_report),
            "cpu_us_per_report": round(cpu / stored * 1e6, 1), "reports_per_cpu_s": round(stored / cpu),
            "wall_s": round(wall, 2), "sum_range_1000_us": round(reference * 1e6, 2),
            "cpu": platform.processor() or _cpu_model(), "python": platform.python_version()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=8_000, help="bundles timed (after one per node)")
    parser.add_argument("--bundle", type=int, default=32, help="reports a bundle")
    parser.add_argument("--batch", type=int, default=256, help="messages a batch (the transport's MAX_BATCH)")
    parser.add_argument("--full-every", type=int, default=40, metavar="N")
    parser.add_argument("--neighbour", action="store_true",
                        help="a memory-heavy process on CPU 1 while this one runs on CPU 0")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.nodes, args.bundles, args.bundle, args.batch, args.full_every) < 1:
        parser.error("--nodes, --bundles, --bundle, --batch and --full-every must be at least 1")
    if args.neighbour and not {0, 1} <= os.sched_getaffinity(0):
        parser.error("--neighbour needs CPUs 0 and 1")
    row = run(args)
    if args.json:
        print(json.dumps(row, indent=2))
        return
    print(f"{row['nodes']} nodes, bundles of {row['bundle']}, batches of {row['batch']}, 1/{row['full_every']} full "
          f"({row['bytes_per_report']} bytes a report)"
          f"{', neighbour on CPU 1' if row['neighbour'] else ''}: "
          f"{row['cpu_us_per_report']} us CPU a report ({row['reports_per_cpu_s']} reports per CPU second); "
          f"sum(range(1000)) {row['sum_range_1000_us']} us on {row['cpu']}, Python {row['python']}")


if __name__ == "__main__":
    main()
