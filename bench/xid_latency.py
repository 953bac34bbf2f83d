#!/usr/bin/env python3
"""XID -> collector DB latency: one real `slurmgpu agent` watching 8 simulated H100s (the fake
libnvidia-ml.so.1) and one real `slurmgpu collector` (CURVE, SQLite), both subprocesses; no
Slurm needed.

    python bench/xid_latency.py [--count 100] [--json]

Each round appends one Xid event (type 8, XID 79) to the scenario's ``events`` (atomic
rewrite) and polls the collector's database with a read-only connection every 2 ms until
the event row is visible, i.e. COMMITTED. Latency = wall time from the rewrite to that
first sight (same machine, same clock; the poll adds up to 2 ms). Also reported: the
collector's own ``received_at`` stamp minus the injection time (its batch time, just
before the commit). Rounds are spaced 20-60 ms apart.

Target: p99 <= 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurmgpu import keys
from slurmgpu.sim.build import build_library
from slurmgpu.sim.cluster import (
    hello_times,
    local_query,
    proc_alive,
    render_agent_config,
    spawn_detached,
)
from slurmgpu.sim.scenario import load_scenario, write_scenario

NODE = "bench-n1"
BASE_CONFIG = """\
[gpu]
count = 8
[pins]
driver = ["550.90.07"]
[checks]
disabled = ["ib.*", "pin.ib_firmware", "pin.nccl", "pin.ofed", "pin.cuda"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalFleet:
    """A collector and one agent on the fake NVML, in a temporary directory."""

    def __init__(self, *, interval_s: float = 2, heartbeat_s: float = 1,
                 max_age_s: float = 1, load: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sgb-", dir="/tmp"))  # short: socket path
        self.interval_s, self.heartbeat_s, self.max_age_s = interval_s, heartbeat_s, max_age_s
        self.scenario = self.dir / "scenario.json"
        self.db = self.dir / "fleet.db"
        self.socket = self.dir / "agent.sock"
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.pids: dict[str, int] = {}
        self.next_event_id = 1
        self.load = load  # every GPU under "load": clock events at 35/s each (fake NVML)

    def start(self, timeout: float = 30) -> LocalFleet:
        lib = build_library(self.dir / "lib")
        scenario = load_scenario("h100-sxm-8")
        for gpu in scenario["gpus"] if self.load else ():
            gpu["load"] = True
        write_scenario(self.scenario, scenario)
        (self.dir / "kmsg").write_text("", encoding="utf-8")
        keys.init(self.dir / "keys")
        bundle = keys.add_node(self.dir / "keys", NODE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGPU_")
               and k != "NOTIFY_SOCKET"}
        self.pids["collector"] = spawn_detached(
            [sys.executable, "-m", "slurmgpu", "collector", "--bind", self.address,
             "--db", str(self.db), "--keys-dir", str(self.dir / "keys")],
            env=env, log=self.dir / "collector.log", pid_file=self.dir / "collector.pid")
        config = self.dir / "agent.toml"
        config.write_text(render_agent_config(
            BASE_CONFIG, socket_path=self.socket, spool=self.dir / "spool", address=self.address,
            keys_dir=bundle, interval_s=self.interval_s, heartbeat_s=self.heartbeat_s,
            max_age_s=self.max_age_s), encoding="utf-8")
        agent_env = {**env, "SLURMGPU_NVML_LIBRARY": str(lib),
                     "SLURMGPU_SIM_SCENARIO": str(self.scenario),
                     "SLURMGPU_KMSG": str(self.dir / "kmsg"),
                     "SLURMGPU_STATE_DIR": str(self.dir / "state")}
        self.pids["agent"] = spawn_detached(
            [sys.executable, "-m", "slurmgpu", "agent", "--node", NODE, "--config", str(config),
             "--keys-dir", str(bundle)],
            env=agent_env, log=self.dir / "agent.log", pid_file=self.dir / "agent.pid")
        deadline = time.monotonic() + timeout
        while not (NODE in hello_times(self.db) and
                   local_query(self.socket, {"op": "status"}, 0.5).get("ok")):
            if time.monotonic() > deadline:
                raise SystemExit(f"agent/collector not ready; see {self.dir}/*.log")
            time.sleep(0.05)
        return self

    def inject_xid(self, gpu: int = 3, xid: int = 79) -> float:
        data = json.loads(self.scenario.read_text(encoding="utf-8"))
        data.setdefault("events", []).append(
            {"gpu": gpu, "type": 8, "data": xid, "id": self.next_event_id})
        self.next_event_id += 1
        write_scenario(self.scenario, data)
        return time.time()

    def stop(self, keep: bool = False) -> None:
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(proc_alive(p) for p in self.pids.values()):
            time.sleep(0.05)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def run(count: int) -> dict[str, Any]:
    seen: list[float] = []
    stamped: list[float] = []
    with LocalFleet() as fleet:
        conn = sqlite3.connect(f"file:{fleet.db}?mode=ro", uri=True, timeout=5)
        try:
            for i in range(count):
                time.sleep(random.uniform(0.02, 0.06))
                injected = fleet.inject_xid()
                deadline = time.monotonic() + 10
                row = None
                while row is None:
                    row = conn.execute(
                        "SELECT m.received_at FROM events e JOIN messages m USING (node, seq) "
                        "WHERE e.kind = 'xid' ORDER BY e.seq LIMIT 1 OFFSET ?", (i,)).fetchone()
                    if row is None:
                        if time.monotonic() > deadline:
                            raise SystemExit(f"XID {i + 1} never reached the DB; see {fleet.dir}")
                        time.sleep(0.002)
                seen.append(time.time() - injected)
                stamped.append(float(row[0]) - injected)
        finally:
            conn.close()
    ms = [v * 1000 for v in seen]
    return {
        "count": count,
        "committed_ms": {"p50": round(statistics.median(ms), 1), "p99": round(pct(ms, 99), 1),
                         "max": round(max(ms), 1)},
        "received_at_ms": {"p50": round(statistics.median(stamped) * 1000, 1),
                           "p99": round(pct([v * 1000 for v in stamped], 99), 1)},
        "target_p99_ms": 1000,
        "ok": pct(ms, 99) <= 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.count)
    if args.json:
        print(json.dumps(result))
    else:
        c = result["committed_ms"]
        print(f"XID -> committed row, {args.count} XIDs: p50 {c['p50']} ms, p99 {c['p99']} ms, "
              f"max {c['max']} ms (collector received_at p50 {result['received_at_ms']['p50']} ms); "
              f"target p99 <= 1000 ms: {'OK' if result['ok'] else 'MISSED'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
