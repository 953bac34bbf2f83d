#!/usr/bin/env python3
"""Collector /metrics scrape latency for fleets of 1,000 and 10,000 nodes.

For each fleet size: a fresh DB seeded through ``Store.store_batch`` / ``add_decisions``
(each node: a hello, ``--changes`` reports that each change its state, so
``report_history``/``findings`` hold that much history; the last report of 10% of the
nodes FAIL with two GPU findings, 10% WARN; one XID event per 10 nodes; a decision per
failing node; a few checkpoint rows), a real ``Collector`` (CURVE keys, no agents) with
``metrics_bind = 127.0.0.1:0`` and an Automation, then ``--scrapes`` HTTP GETs of
/metrics, each one computed (the 1 s scrape cache is off), three times: of the fleet as
seeded ("unchanged": nothing committed between scrapes), with one node's report committed
before each GET, its state unchanged ("reported": the common case), and with one node's
state change committed before each GET ("changed"). Reported for each:
scrape wall time p50/p99/max (HTTP, parse not included), the process CPU time per
scrape (p50: the collector's server thread and this client; not the PostgreSQL
server's); and the response size and sample count.

``--db postgresql``: the store on a throwaway PostgreSQL server (``slurmgpu.sim.postgres``:
initdb + pg_ctl, a unix socket; a new database per fleet size, ANALYZEd once seeded)
instead of a SQLite file.

    python bench/metrics_scrape.py [--nodes 1000,10000] [--changes 3] [--scrapes 20]
                                   [--db sqlite|postgresql] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.collector import metrics
from slurmgpu.collector.app import Collector, build_collector
from slurmgpu.collector.policy import Automation, Decision
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.automation import DrainedNode
from slurmgpu.config.schema import AutomationSettings, CollectorSettings
from slurmgpu.sim.postgres import PgServer
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.wire import EVENT, HELLO, REPORT, Envelope

GPUS = 8


def _report(node: str, seq: int, ts: float, verdict: str) -> Envelope:
    findings: list[dict[str, Any]] = [
        {"check": "ecc.volatile", "severity": "OK", "gpu": g, "message": "ok"} for g in range(GPUS)]
    if verdict == "FAIL":
        findings += [{"check": "ecc.uncorrected", "severity": "FAIL", "gpu": 1, "message": "3 DBE"},
                     {"check": "thermal.throttle", "severity": "WARN", "gpu": 5, "message": "hot"}]
    elif verdict == "WARN":
        findings.append({"check": "thermal.throttle", "severity": "WARN", "gpu": seq % GPUS,
                         "message": f"hot {seq}"})
    return Envelope(type=REPORT, node=node, seq=seq, ts=ts,
                    body={"verdict": verdict, "findings": findings, "facts": {}})


def seed(collector: Collector, nodes: int, changes: int) -> None:
    store = collector.store
    now = time.time()
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    batch: list[tuple[str, Envelope]] = []

    def flush() -> None:
        store.store_batch(batch, received_at=now)
        batch.clear()

    for i, node in enumerate(names):
        batch.append((node, Envelope(type=HELLO, node=node, seq=1, ts=now - 3600,
                                     body={"version": "1", "gpus": GPUS, "interval_s": 15.0})))
        for c in range(changes):  # alternate OK/WARN: each report is a state change
            verdict = "WARN" if c % 2 else "OK"
            if c == changes - 1:
                verdict = "FAIL" if i % 10 == 0 else ("WARN" if i % 10 == 1 else "OK")
            batch.append((node, _report(node, 2 + c, now - 60 * (changes - c), verdict)))
        if i % 10 == 0:
            batch.append((node, Envelope(type=EVENT, node=node, seq=2 + changes, ts=now - 30,
                                         body={"kind": "xid", "gpu": 1, "data": (79, 48, 63)[i % 3],
                                               "verdict": "FAIL", "findings": []})))
        if len(batch) >= 5000:
            flush()
    flush()
    store.add_decisions(Decision(n, "drain", "r", trigger="ecc.uncorrected", result="drained",
                                 time=now) for n in names[::10])
    with store.transaction():
        for j in range(min(50, nodes // 20)):
            store.add_checkpoint({"job_id": str(j), "action": "drain", "reason": "r",
                                  "trigger_node": names[j], "nodes": [names[j]], "user": "u",
                                  "requested": now, "deadline": now + 300,
                                  "state": ("open", "acked", "done")[j % 3]})


def run(nodes: int, changes: int, scrapes: int, pg: PgServer | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="slurmgpu-metrics-bench-") as tmp:
        root = Path(tmp)
        keys.init(root / "keys")
        db = str(root / "fleet.db") if pg is None else pg.create_database(f"metrics_{nodes}")
        cfg = CollectorSettings(address="tcp://127.0.0.1:0", bind="tcp://127.0.0.1:*",
                                db=db, keys_dir=str(root / "keys"),
                                metrics_bind="127.0.0.1:0", events_port=0)
        client = FakeSlurmClient([])
        store = Store(cfg.db)
        auto = Automation(AutomationSettings(), client, root / "state", store=store)
        auto.state.drained = {f"gpu-{i:05d}": DrainedNode(0.0) for i in range(0, nodes, 10)}
        auto._record.save()  # the state the collector's automation starts from
        store.close()
        metrics.CACHE_S = 0.0  # every scrape computes (what a scrape costs)
        collector = build_collector(cfg, automation=AutomationSettings(), slurm=client,
                                    state_dir=root / "state")
        try:
            t0 = time.perf_counter()
            seed(collector, nodes, changes)
            seed_s = time.perf_counter() - t0
            if pg is not None:  # the statistics autovacuum keeps on a live database
                collector.store.db.execute("ANALYZE")
            assert collector.metrics_server is not None
            url = collector.metrics_server.url
            counts = {t: collector.store.count(t) for t in ("nodes", "report_history", "findings", "events")}
            unchanged, body = scrape(url, scrapes)
            reported, _ = scrape(url, scrapes, lambda i: report(collector, i))
            changed, _ = scrape(url, scrapes, lambda i: change(collector, i))
            samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        finally:
            collector.close()
            store.close()
    if pg is not None:
        pg.drop_database(f"metrics_{nodes}")
    return {"nodes": nodes, "changes": changes, "db": "sqlite" if pg is None else "postgresql",
            "seed_s": round(seed_s, 2),
            "rows": counts, "bytes": len(body), "samples": samples,
            "unchanged": unchanged, "reported": reported, "changed": changed}


def report(collector: Collector, i: int) -> None:
    """One OK node's report with its state unchanged (the common case), committed: the
    nodes' and reports' rows change, the history does not."""
    ok = collector.store.db.execute("SELECT node FROM reports WHERE verdict = 'OK' ORDER BY node LIMIT 7")
    node = [str(n) for (n,) in ok][i % 7]
    collector.store.store_batch([(node, _report(node, 5000 + i, time.time(), "OK"))], received_at=time.time())


def change(collector: Collector, i: int) -> None:
    """One node's state change (FAIL, then OK, then FAIL...), committed."""
    node = f"gpu-{i % 7:05d}"
    env = _report(node, 1000 + i, time.time(), "FAIL" if i % 2 else "OK")
    collector.store.store_batch([(node, env)], received_at=time.time())


def scrape(url: str, scrapes: int, before: Callable[[int], None] | None = None) -> tuple[dict[str, float], bytes]:
    """``scrapes`` timed GETs (after one more that warms the page cache): their wall and
    CPU time (ms), and the last body. ``before(i)`` runs before each, untimed."""
    times: list[float] = []
    cpu: list[float] = []
    body = b""
    for i in range(scrapes + 1):
        if before is not None:
            before(i)
        t, c = time.perf_counter(), time.process_time()
        with urllib.request.urlopen(url, timeout=60) as resp:
            body = resp.read()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    times = sorted(times[1:])
    return {"p50_ms": round(statistics.median(times) * 1000, 1),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1),
            "max_ms": round(times[-1] * 1000, 1),
            "cpu_p50_ms": round(statistics.median(cpu[1:]) * 1000, 1)}, body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000")
    parser.add_argument("--changes", type=int, default=3,
                        help="state changes (report_history rows) per node")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite",
                        help="the store's backend (postgresql: a throwaway local server)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    pg = PgServer() if args.db == "postgresql" else None
    try:
        if pg is not None:
            pg.up()
        results = [run(int(n), args.changes, args.scrapes, pg) for n in args.nodes.split(",")]
    finally:
        if pg is not None:
            pg.down()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['db']}: {r['nodes']:>6} nodes, {r['rows']['report_history']:>7} history rows "
              f"({r['samples']} samples, {r['bytes'] // 1024} KiB; seeded in {r['seed_s']} s)")
        for mode in ("unchanged", "reported", "changed"):
            m = r[mode]
            print(f"    {mode:>9}: scrape p50 {m['p50_ms']} ms, p99 {m['p99_ms']} ms, "
                  f"max {m['max_ms']} ms, CPU p50 {m['cpu_p50_ms']} ms")


if __name__ == "__main__":
    main()
