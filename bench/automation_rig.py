"""Shared pieces of bench/checkpoint_fanout.py and bench/event_to_drain.py (issue 5).

* ``Rig``: a real ``Collector`` (real CURVE, real SQLite ``Store``, both in a temporary
  directory) with a real ``Automation`` whose Slurm client the bench chooses, served by a
  thread that calls ``serve_once(10)`` in a loop. The collector logs at ``info`` as JSON
  to ``<dir>/collector.log`` (what ``slurmgpu collector`` writes to journald by default).
* ``Agents``: simulated agents, one CURVE DEALER socket each (``slurmgpu.sim.fleet.SimFleet``),
  which say hello, send events, and record the commands they receive.
* ``sim_cluster``: a throw-away simulated Slurm cluster (``SimCluster``, no agents, hooks
  off) in its own temporary directory, always brought down with ``purge``.
* ``pct`` / ``summary``: the percentiles the benches print.

Everything runs on one clock (``time.time()``), in one process, so the simulated agents
and the collector share the GIL and this machine's cores.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from slurmgpu import keys, log
from slurmgpu.collector.app import build_collector
from slurmgpu.collector.policy import Automation
from slurmgpu.config.schema import AutomationSettings, CollectorSettings
from slurmgpu.sim import fleet as simfleet
from slurmgpu.slurm import SlurmClient
from slurmgpu.wire import ACK, COMMAND, COMMAND_RESULT, EVENT, WireError, decode, message_frame

# --------------------------------------------------------------------------- numbers


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (as bench/xid_latency.py)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary(values_s: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max in milliseconds (None when empty)."""
    if not values_s:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    return {"p50_ms": round(pct(values_s, 50) * 1000, 1), "p90_ms": round(pct(values_s, 90) * 1000, 1),
            "p99_ms": round(pct(values_s, 99) * 1000, 1), "max_ms": round(max(values_s) * 1000, 1)}


def rounded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-round rows for --json: floats to 4 decimals."""
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows]


def fmt(s: dict[str, float | None]) -> str:
    return " ".join(f"{k[:-3]} {v} ms" for k, v in s.items())


# --------------------------------------------------------------------------- settings


def automation_settings(**kw: Any) -> AutomationSettings:
    """Automation on, breaker out of the way: it must never hold a drain in a bench.
    ``storm_window_s`` is tiny so that nodes failing one after the other (round-robin)
    never count as a storm."""
    base: dict[str, Any] = {"enabled": True, "max_fraction": 1.0, "max_per_hour": 100_000,
                            "storm_fraction": 1.0, "storm_window_s": 0.001,
                            "lemon_drains": 100_000}
    base.update(kw)
    return AutomationSettings(**base)


def xid_event(gpu: int = 0, xid: int = 79) -> dict[str, Any]:
    """An EVENT body as the agent sends it for an XID 79 (GPU fallen off the bus)."""
    finding = {"check": "xid.recent", "severity": "FAIL", "gpu": gpu, "subject": None,
               "message": f"XID {xid}: GPU has fallen off the bus -> reset",
               "data": {"xid": xid, "count": 1, "action": "reset", "origin": "catalog"}}
    return {"kind": "xid", "gpu": gpu, "data": xid, "verdict": "FAIL", "findings": [finding]}


def slurm_available() -> bool:
    """Root and slurmctld installed: a simulated cluster can be brought up."""
    return os.geteuid() == 0 and any(
        shutil.which(p, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
        for p in ("slurmctld",))


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` cleans up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# --------------------------------------------------------------------------- keys


def named_nodes(keys_dir: Path, names: list[str]) -> list[simfleet.SimNode]:
    """CURVE keypairs for exactly these node names, allow-listed in ``keys_dir``."""
    out = []
    for name in names:
        bundle = keys.add_node(keys_dir, name)
        public, secret, _ = keys.client_keys(bundle)
        out.append(simfleet.SimNode(name, public, secret))
    return out


# --------------------------------------------------------------------------- collector


class Rig:
    """A collector + automation in a thread, all state under ``root``."""

    def __init__(self, root: Path, client: SlurmClient, settings: AutomationSettings, *,
                 log_level: str = "info") -> None:
        self.root = root
        self.keys_dir = root / "keys"  # keys.init'ed, nodes allow-listed: the fleet size
        self._log_file = open(root / "collector.log", "w", encoding="utf-8")  # noqa: SIM115
        log.configure(log_level, json=True, stream=self._log_file)
        self.collector = build_collector(
            CollectorSettings(address="tcp://127.0.0.1:0", bind="tcp://127.0.0.1:*",
                              db=str(root / "fleet.db"), keys_dir=str(self.keys_dir), events_port=0),
            automation=settings, slurm=client, state_dir=root / "state")
        assert self.collector.automation is not None
        self.automation: Automation = self.collector.automation
        self.address = self.collector.endpoint
        self.server_key = simfleet.collector_public_key(self.keys_dir)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> Rig:
        self._thread = threading.Thread(target=self._loop, name="collector", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.collector.serve_once(10)
        except BaseException as exc:  # reported by check()
            self.error = exc
        finally:
            self.collector.close()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"collector thread failed: {self.error!r}")
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("collector thread stopped")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        else:
            self.collector.close()
        with contextlib.suppress(OSError):
            self._log_file.close()

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- agents


@dataclass
class Received:
    node: int
    at: float
    command: str
    command_id: str
    args: dict[str, Any] = field(default_factory=dict)


class Agents:
    """Simulated agents on one zmq context: hello, events, commands, command results.
    Every acked message gets a fresh, increasing seq per node, as the real agent's."""

    def __init__(self, address: str, server_key: bytes, nodes: list[simfleet.SimNode]) -> None:
        self.fleet = simfleet.SimFleet(address, server_key, nodes)
        self.nodes = nodes
        self.unacked: list[set[int]] = [set() for _ in nodes]

    def close(self) -> None:
        self.fleet.close()

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hello(self, timeout_s: float = 60) -> None:
        got = self.fleet.hello(timeout_s)
        if got != len(self.nodes):
            raise RuntimeError(f"only {got} of {len(self.nodes)} simulated agents got their hello acked")
        self.fleet.inflight = [{} for _ in self.nodes]

    def send(self, i: int, mtype: str, body: dict[str, Any]) -> float:
        """Send one acked message from node ``i``; returns the time just before the send."""
        self.fleet.seq[i] += 1
        seq = self.fleet.seq[i]
        frame = message_frame(mtype, self.nodes[i].name, seq, body)
        self.unacked[i].add(seq)
        t = time.time()
        self.fleet.sockets[i].send(frame)
        return t

    def send_event(self, i: int, body: dict[str, Any]) -> float:
        return self.send(i, EVENT, body)

    def reply(self, i: int, command_id: str, result: dict[str, Any], ok: bool = True) -> None:
        self.send(i, COMMAND_RESULT, {"command_id": command_id, "ok": ok, "result": result})

    def pending_acks(self) -> int:
        return sum(len(s) for s in self.unacked)

    def poll(self, timeout_ms: int) -> list[Received]:
        """Wait up to ``timeout_ms``; return the commands received (stamped on receipt).
        Acks are consumed here; heartbeats ignored."""
        out: list[Received] = []
        for sock, _ in self.fleet.poller.poll(timeout_ms):
            i = self.fleet.index[sock]
            while True:
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                at = time.time()
                try:
                    env = decode(frame)
                except WireError:
                    continue
                if env.type == ACK:
                    self.unacked[i].difference_update(env.body["seqs"])
                elif env.type == COMMAND:
                    out.append(Received(i, at, str(env.body.get("command")), env.id,
                                        dict(env.body.get("args") or {})))
        return out

    def wait_acks(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.pending_acks() and time.monotonic() < deadline:
            self.poll(20)
        return not self.pending_acks()


# --------------------------------------------------------------------------- Slurm


@contextlib.contextmanager
def sim_cluster(nodes: int, *, timeout: float = 120) -> Iterator[Any]:
    """A fresh simulated Slurm cluster (no agents, hooks off) in a short temporary
    directory (the munge socket path must fit in 108 bytes); always purged."""
    from slurmgpu.sim.cluster import SimCluster

    d = Path(tempfile.mkdtemp(prefix="sgbc-", dir="/tmp"))
    cluster = SimCluster(d)
    try:
        cluster.up(nodes=nodes, gpus=1, hooks_enabled=False, agents=False, timeout=timeout)
        yield cluster
    finally:
        try:
            cluster.down(purge=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def temp_root(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
