#!/usr/bin/env python3
"""The automation's one route (issue 30): what handing every stored report to the
automation through ``leader_inbox`` costs on SQLite, in process (no sockets).

A fleet of ``--nodes`` nodes sends OK reports in batches of ``--batch`` (the steady state
holds a few messages a batch); each batch is ``Fleet.commit`` then ``Fleet.acked``, with
the automation on: the inbox rows written in the batch's transaction, read back, handed to
``Automation.on_report`` and deleted. Prints JSON: microseconds per report.

    python bench/automation_route.py [--reports 3000] [--nodes 200] [--batch 5]

Run it on two checkouts (``PYTHONPATH=<checkout>``) to compare routes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from slurmgpu.collector.counters import Counters
from slurmgpu.collector.fleet import Fleet
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings, CollectorSettings
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.wire import REPORT, Envelope, decode_finding

OK = {"check": "ecc.uncorrected", "severity": "OK", "gpu": 0, "subject": None, "message": "fine",
      "not_applicable": False, "data": {}}


def run(reports: int, nodes: list[str], batch: int, root: Path) -> dict[str, float]:
    store = Store(root / "fleet.db")
    auto = Automation(AutomationSettings(), FakeSlurmClient(nodes), root / "state", store=store)
    fleet = Fleet(CollectorSettings(db=str(root / "fleet.db")), store, Counters(),
                  allowed={n.encode(): n for n in nodes}, automation=auto, own_store=True)
    finding = decode_finding(OK)
    began = time.perf_counter()
    for i in range(reports // batch):
        chosen = [nodes[(i * batch + k) % len(nodes)] for k in range(batch)]
        items = [(n, Envelope(type=REPORT, node=n, seq=i + 1, body={"verdict": "OK", "findings": [OK]},
                              findings=(finding,)), b"") for n in chosen]
        stored = fleet.commit(items, time.time())
        assert stored is not None
        fleet.acked(items, stored.new, time.time())
    elapsed = time.perf_counter() - began
    fleet.close()
    return {"reports": reports, "batch": batch, "us_per_report": round(elapsed / reports * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=3000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--batch", type=int, default=5)
    args = parser.parse_args()
    nodes = [f"gpu-{i:04d}" for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as root:
        print(json.dumps(run(args.reports, nodes, args.batch, Path(root))))


if __name__ == "__main__":
    main()
