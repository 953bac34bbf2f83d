"""A deterministic month of fleet history, for the fleet report's demo, tests and benchmark.

``seed(db_path, nodes=1000, days=30)`` fills an empty fleet database (the collector's
schema, docs/fleet-db.md) with what a collector would have recorded for a fleet of
8-GPU A100 (40 %) and H100 (60 %) nodes: hourly samples for every node, fault episodes
(XIDs, ECC, row remaps, thermal throttling, IB link flaps) with their report history,
findings, events, the automation's decisions and Slurm drains / resumes with who drained
(the automation; the epilog for uncorrected ECC errors), checkpointed and requeued jobs,
jobs the prolog refused, operators' maintenance drains, unreachable spells, GPU / IB counters
and software versions (a few nodes off the pins of ``etc/report-demo.toml``, one
upgraded mid-month), two lemon nodes. Same arguments, same rows.

Everything is written in one transaction with ``executemany`` (1,000 nodes x 30 days,
~0.8 M rows, in a few seconds). ``slurmgpu sim report-seed`` is the command line.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from slurmgpu import __version__
from slurmgpu.errors import SlurmGpuError

HOUR = 3600.0
DAY = 86400.0
REPORT_S = 15.0  # the agent's interval: 240 reports an hour
REPORTS_PER_HOUR = int(HOUR / REPORT_S)
GPUS = 8
PORTS = ("mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1")

# Pinned stack per model (what etc/report-demo.toml accepts).
MODELS: dict[str, dict[str, Any]] = {
    "a100": {"gpu_model": "NVIDIA A100-SXM4-80GB", "driver": "550.90.07", "cuda": "12.4",
             "nccl": "2.21.5", "vbios": "92.00.45.00.06", "ib_firmware": "20.39.1002",
             "ofed": "24.01-0.3.3", "kernel": "5.15.0-113-generic", "rate_gbps": 200.0,
             "serial": "1323"},
    "h100": {"gpu_model": "NVIDIA H100 80GB HBM3", "driver": "550.90.07", "cuda": "12.4",
             "nccl": "2.21.5", "vbios": "96.00.99.00.01", "ib_firmware": "28.39.1002",
             "ofed": "24.01-0.3.3", "kernel": "5.15.0-113-generic", "rate_gbps": 400.0,
             "serial": "1654"},
}
A100_FRACTION = 0.4
# Drift: (field, check, value per model, message). Values violate etc/report-demo.toml.
DRIFTS: list[tuple[str, str, dict[str, str]]] = [
    ("driver", "pin.driver", {"a100": "535.183.01", "h100": "535.183.01"}),
    ("vbios", "pin.vbios", {"a100": "92.00.36.00.02,92.00.45.00.06", "h100": "96.00.74.00.0b"}),
    ("ib_firmware", "pin.ib_firmware", {"a100": "20.37.1014", "h100": "28.37.1014"}),
    ("nccl", "pin.nccl", {"a100": "2.18.3", "h100": "2.18.3"}),
]
UPGRADE_FROM = "535.183.01"  # the mid-month upgrade: this driver -> the pinned one

# Application XIDs (say nothing about the node): code -> weight.
APP_XIDS = {13: 30, 31: 40, 43: 25, 45: 4, 68: 1}
# Hardware XID episodes per model: code -> weight (48 and 63/64 come with ECC/remap episodes).
HW_XIDS = {"a100": {74: 8, 79: 5, 94: 3, 95: 2, 119: 0, 63: 5},
           "h100": {74: 6, 79: 4, 94: 6, 95: 3, 119: 7, 63: 5}}
# Fault episode kinds: weight.
FAULTS = {"xid": 45, "ecc": 10, "remap": 10, "remap-failure": 2, "thermal": 8, "ib": 12}
FAULT_RATE = 0.15  # fault episodes per node per 30 days
OPERATORS = ("alice", "bob", "carol")
MAINTENANCE = ("maintenance: BMC firmware update", "maintenance: replace PSU",
               "maintenance: OS reimage", "maintenance: NVSwitch tray swap",
               "maintenance: cable reseat (ticket OPS-{n})", "maintenance: rack power work")
USERS = ("u1021", "u2203", "u3117", "u4410", "u5062", "u6634", "u7718")
XID_ACTION = {"ignore": "none", "warn": "warn", "checkpoint": "checkpoint", "drain": "drain",
              "reset": "drain", "reboot": "drain"}


class SeedError(SlurmGpuError):
    """The database already holds a fleet (seed only an empty file)."""


@dataclass
class _Node:
    name: str
    model: str
    index: int
    versions: dict[str, str]
    # standing findings: (check, severity, gpu, subject, message, valid_from, valid_to)
    standing: list[tuple[str, str, int | None, str | None, str, float, float]] = field(default_factory=list)
    fails: list[tuple[float, float]] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    throttle: list[tuple[float, float, float]] = field(default_factory=list)
    chronic: float = 0.0  # share of HW slowdown reports in a throttling hour
    noise: float = 0.0  # probability of an hour with a few HW slowdown reports
    verdict: str = "OK"
    worst: tuple[str, str, str, int | None] | None = None
    unreachable_since: float | None = None
    last_seen: float = 0.0


@dataclass
class _Episode:
    """A fault episode being written: what its onset found, what the automation then does."""
    kind: str
    gpu: int
    t0: float  # its first report
    t_fix: float  # when it is repaired (> end: still open)
    action: str = "drain"
    trigger: str = ""
    severity: str = "FAIL"
    bad: list[tuple[Any, ...]] = field(default_factory=list)
    ckpt_deadline: float = 0.0


def _catalog_names() -> dict[int, tuple[str, str]]:
    from slurmgpu.xid import catalog

    return {code: (rule.name, rule.action) for code, rule in catalog().items()}


def _weighted(rng: random.Random, table: dict[Any, int]) -> Any:
    keys = [k for k, w in table.items() if w > 0]
    return rng.choices(keys, weights=[table[k] for k in keys])[0]


def _seq(start: float, ts: float, event: bool = False) -> int:
    """A node's message seq at ``ts`` (one report every 15 s; events take odd numbers)."""
    return int(max(0.0, ts - start) / REPORT_S) * 2 + (3 if event else 2)


class _Seeder:
    def __init__(self, rng: random.Random, start: float, end: float) -> None:
        self.rng, self.start, self.end = rng, start, end
        self.xids = _catalog_names()
        self.history: list[tuple[Any, ...]] = []
        self.findings: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.decisions: list[tuple[Any, ...]] = []
        self.states: list[tuple[Any, ...]] = []
        self.gpu: list[tuple[Any, ...]] = []
        self.ib: list[tuple[Any, ...]] = []
        self.versions: list[tuple[Any, ...]] = []
        self.checkpoints: list[tuple[Any, ...]] = []
        self.job_events: list[tuple[Any, ...]] = []
        self.lemons: dict[str, dict[str, Any]] = {}
        self.drained: dict[str, dict[str, Any]] = {}
        self.job = 4_180_000
        self.ticket = 4100
        # counters' current values: (node, gpu) -> list; (node, port) -> list
        self.gpu_now: dict[tuple[str, int], list[Any]] = {}
        self.ib_now: dict[tuple[str, str], list[Any]] = {}

    # ---------------------------------------------------------------- helpers

    def standing(self, node: _Node, ts: float) -> list[tuple[Any, ...]]:
        return [(c, s, g, subj, m) for c, s, g, subj, m, a, b in node.standing if a <= ts < b]

    def report(self, node: _Node, ts: float, bad: list[tuple[Any, ...]]) -> None:
        """A report_history row (and its findings): ``bad`` plus the standing findings."""
        rows = bad + self.standing(node, ts)
        verdict = "OK"
        for row in rows:
            if row[1] == "FAIL" or (row[1] == "WARN" and verdict == "OK"):
                verdict = row[1]
        seq = _seq(self.start, ts)
        self.history.append((node.name, seq, ts, verdict))
        self.findings.extend((node.name, seq, ts, *row) for row in rows)
        if ts <= self.end:
            node.verdict = verdict
            worst = next((r for r in rows if r[1] == verdict), None)
            node.worst = None if worst is None else (worst[0], worst[1], worst[4], worst[2])

    def event(self, node: _Node, ts: float, kind: str, gpu: int | None, data: int | None,
              verdict: str, bad: list[tuple[Any, ...]], extra: dict[str, Any] | None = None) -> None:
        seq = _seq(self.start, ts, event=True)
        body: dict[str, Any] = {"kind": kind, "gpu": gpu, "data": data, "verdict": verdict,
                                "findings": [{"check": c, "severity": s, "gpu": g, "subject": subj,
                                              "message": m} for c, s, g, subj, m in bad]}
        body.update(extra or {})
        self.events.append((node.name, seq, ts, kind, gpu, data, verdict,
                            msgpack.packb(body, use_bin_type=True)))
        self.findings.extend((node.name, seq, ts, *row) for row in bad if row[1] != "OK")

    def decision(self, ts: float, node: _Node, action: str, reason: str, trigger: str,
                 result: str) -> None:
        self.decisions.append((ts, node.name, action, reason, 0, 0, trigger, result))

    def node_state(self, ts: float, node: _Node, kind: str, reason: str | None, actor: str | None,
                   by: str | None = None) -> None:
        """A node_states row; ``by``: who drained it (drained_by, for ``drained`` rows)."""
        self.states.append((node.name, ts, kind, reason, actor, by))

    def set_gpu(self, node: _Node, gpu: int, ts: float, **changes: int) -> None:
        cur = self.gpu_now[(node.name, gpu)]
        names = ("ecc_corrected", "ecc_uncorrected", "remap_corrected", "remap_uncorrected",
                 "remap_pending", "remap_failure")
        for key, value in changes.items():
            cur[2 + names.index(key)] = value
        self.gpu.append((node.name, gpu, ts, *cur))

    def set_ib(self, node: _Node, port: str, ts: float, **changes: int) -> None:
        cur = self.ib_now[(node.name, port)]
        names = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                 "local_link_integrity_errors", "excessive_buffer_overrun_errors")
        for key, value in changes.items():
            cur[2 + names.index(key)] = value
        self.ib.append((node.name, port, ts, *cur))

    # ---------------------------------------------------------------- episodes

    def drain(self, node: _Node, ts: float, action: str, reason: str, trigger: str, *,
              by_epilog: bool = False) -> None:
        """The automation drains the node; ``by_epilog``: the epilog of the job that was
        running there got to it first (its reason tagged, the automation finds it drained)."""
        if by_epilog:
            self.node_state(ts - 1.0, node, "drained", f"{reason} [by epilog]", "root", "epilog")
            self.decision(ts, node, action, reason, trigger, "already-drained")
        else:
            self.decision(ts, node, action, reason, trigger, "drained")
            self.node_state(ts + 2.0, node, "drained", reason, "root", "automation")
        self.drained[node.name] = {"time": ts, "trigger": trigger, "reason": reason}

    def resume(self, node: _Node, ts: float) -> None:
        """The node checks healthy after its repair: OK reports, then the automation resumes it."""
        self.report(node, ts, [])
        when = ts + 600.0 + self.rng.uniform(0, 60)
        if when < self.end:
            self.decision(when, node, "resume", f"3 OK reports over {600 + 30:g} s", "healthy", "resumed")
            self.node_state(when + 2.0, node, "resumed", None, "root")
            self.drained.pop(node.name, None)

    def jobs(self, node: _Node, ts: float, action: str, reason: str, deadline_s: float) -> float:
        """Checkpoint requests to the node's jobs (0-3); returns when the node can drain."""
        rng = self.rng
        count = rng.choices((0, 1, 2, 3), weights=(25, 45, 20, 10))[0]
        ready = ts + 1.0
        for _ in range(count):
            self.job += rng.randint(1, 400)
            job = str(self.job)
            prefix, number = node.name.rsplit("-", 1)
            others = [f"{prefix}-{int(number) + k:0{len(number)}d}" for k in range(1, rng.choice((1, 1, 2, 4)))]
            requested = ts + 1.0
            deadline = requested + deadline_s
            expired = rng.random() < 0.2
            acked_at = None if expired else requested + rng.uniform(20, deadline_s * 0.8)
            closed = deadline + 1.0 if expired else (acked_at or requested) + 1.0
            state = "expired" if expired else "acked"
            self.checkpoints.append((job, action, reason, node.name, json.dumps([node.name, *others]),
                                     rng.choice(USERS), requested, deadline, state, acked_at,
                                     None if expired else f"{job}.0@{node.name}", closed))
            jev = self.job_events
            jev.append((job, requested, "detected", node.name, reason))
            jev.append((job, requested + 0.2, "signalled", node.name, "SIGUSR1 (scancel --signal)"))
            jev.append((job, requested + 0.5, "delivered", node.name, "checkpoint request file written"))
            if expired:
                jev.append((job, deadline, "deadline", node.name, f"no ack within {deadline_s:g} s"))
            else:
                late = rng.random() < 0.05
                jev.append((job, acked_at, "acked-late" if late else "acked", node.name, None))
            jev.append((job, closed, "drained", node.name, None))
            if rng.random() < 0.85:
                jev.append((job, closed + 0.5, "requeued", node.name, "scontrol requeue"))
            else:
                jev.append((job, closed + 0.5, "requeue-skipped", node.name, "job is not requeueable"))
            ready = max(ready, closed)
        return ready

    def prolog_blocked(self, node: _Node, ts: float, why: str) -> None:
        for _ in range(self.rng.choice((0, 0, 1, 1, 2))):
            self.job += self.rng.randint(1, 50)
            self.event(node, ts + self.rng.uniform(3, 25), "prolog_blocked", None, None, "FAIL", [],
                       {"job_id": str(self.job), "reason": why})

    def repair_time(self, median_h: float) -> float:
        return HOUR * median_h * math.exp(self.rng.gauss(0.0, 0.8))

    def fault(self, node: _Node, kind: str, t0: float, *, forever: bool = False,
              xid: int | None = None, repair_h: float = 10.0) -> float:
        """One fault episode from ``t0``; returns when it ended (> end: still open)."""
        gpu = self.rng.randrange(GPUS)
        t_fix = self.end + DAY if forever else t0 + self.repair_time(repair_h)
        ep = _Episode(kind, gpu, t0, t_fix)
        if kind == "xid":
            self._onset_xid(node, ep, xid)
        elif kind == "ecc":
            self._onset_ecc(node, ep)
        elif kind == "remap":
            self._onset_remap(node, ep)
        elif kind == "remap-failure":
            self._onset_remap_failure(node, ep)
        elif kind == "thermal":
            self._onset_thermal(node, ep)
        elif kind == "ib":
            self._onset_ib(node, ep)
        fix = min(ep.t_fix, self.end + DAY)
        self.report(node, ep.t0, ep.bad)
        if ep.severity == "FAIL":
            node.fails.append((ep.t0, min(fix, self.end)))
        self._respond(node, ep)
        if fix <= self.end:
            if kind in ("ecc", "remap"):
                self.set_gpu(node, gpu, fix - 120.0, remap_pending=0)
            if ep.action == "warn":
                self.report(node, fix, [])
            elif not forever:
                self.resume(node, fix)
        return fix

    def _onset_xid(self, node: _Node, ep: _Episode, xid: int | None) -> None:
        gpu, t0 = ep.gpu, ep.t0
        xid = xid or _weighted(self.rng, HW_XIDS[node.model])
        name, xid_action = self.xids.get(xid, (f"XID {xid}", "drain"))
        ep.action = "drain-now" if xid == 79 else XID_ACTION[xid_action]
        ep.severity = "FAIL" if ep.action in ("drain", "drain-now") else "WARN"
        message = f"XID {xid}: {name}"
        ep.bad = [("xid.recent", ep.severity, gpu, None, message)]
        if xid == 79:
            ep.bad.append(("gpu.lost", "FAIL", gpu, None, "GPU has fallen off the bus"))
        self.event(node, t0 - 1.0, "xid", gpu, xid, ep.severity, ep.bad[:1])
        ep.trigger = "xid.recent"
        if ep.action == "checkpoint":
            ep.ckpt_deadline = 300.0
        elif ep.action == "drain-now":
            ep.ckpt_deadline = 120.0
        if xid == 63:  # a row remap event: the remap itself is below
            ep.t_fix = t0 + self.rng.uniform(0.2, 2.0) * HOUR

    def _onset_ecc(self, node: _Node, ep: _Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        n = self.rng.choice((1, 1, 2, 4))
        cur = self.gpu_now[(node.name, gpu)]
        self.event(node, t0 - 2.0, "ecc_dbe", gpu, n, "FAIL", [])
        self.event(node, t0 - 1.0, "xid", gpu, 48, "FAIL",
                   [("xid.recent", "FAIL", gpu, None, f"XID 48: {self.xids[48][0]}")])
        self.set_gpu(node, gpu, t0, ecc_uncorrected=cur[3] + n, remap_pending=1)
        ep.bad = [("ecc.uncorrected", "FAIL", gpu, None, f"{n} uncorrected ECC error(s) (volatile)")]
        ep.trigger = "ecc.uncorrected"

    def _onset_remap(self, node: _Node, ep: _Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        cur = self.gpu_now[(node.name, gpu)]
        self.event(node, t0 - 1.0, "xid", gpu, 63, "WARN",
                   [("xid.recent", "WARN", gpu, None, f"XID 63: {self.xids[63][0]}")])
        self.set_gpu(node, gpu, t0, remap_uncorrected=cur[5] + 1, remap_pending=1)
        ep.bad = [("mem.row_remap", "FAIL", gpu, None, "row remap pending: GPU reset required")]
        ep.action, ep.trigger, ep.ckpt_deadline = "checkpoint", "mem.row_remap", 300.0
        ep.t_fix = t0 + self.rng.uniform(0.5, 4.0) * HOUR

    def _onset_remap_failure(self, node: _Node, ep: _Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        self.event(node, t0 - 1.0, "xid", gpu, 64, "FAIL",
                   [("xid.recent", "FAIL", gpu, None, f"XID 64: {self.xids[64][0]}")])
        self.set_gpu(node, gpu, t0, remap_failure=1)
        ep.bad = [("mem.row_remap", "FAIL", gpu, None, "row remapping failure: no spare rows (RMA)")]
        ep.trigger = "mem.row_remap"
        ep.t_fix = self.end + DAY

    def _onset_thermal(self, node: _Node, ep: _Episode) -> None:
        gpu, t0 = ep.gpu, ep.t0
        ep.severity = "WARN"
        ep.bad = [("thermal.throttle", "WARN", gpu, None, "HW slowdown active (clocks event reasons 0x8)")]
        ep.trigger = "thermal.throttle"
        node.throttle.append((t0 - 2 * HOUR, t0 + 60.0, 0.7))
        self.decision(t0 + 1.0, node, "warn", f"slurmgpu: thermal.throttle GPU {gpu} HW slowdown active",
                      ep.trigger, "recorded")
        ep.t0 = t0 + 30.0  # three strikes later

    def _onset_ib(self, node: _Node, ep: _Episode) -> None:
        rng, t0 = self.rng, ep.t0
        port = rng.choice(PORTS)
        cur = self.ib_now[(node.name, port)]
        self.set_ib(node, port, t0 - 240.0, symbol_error=cur[2] + rng.randint(200, 5000),
                    link_downed=cur[3] + 1, link_error_recovery=cur[4] + rng.randint(1, 5))
        cur = self.ib_now[(node.name, port)]
        self.set_ib(node, port, t0 - 30.0, symbol_error=cur[2] + rng.randint(100, 3000),
                    link_downed=cur[3] + rng.randint(1, 3), port_rcv_errors=cur[5] + rng.randint(10, 400))
        ep.bad = [("ib.flap", "FAIL", None, port, "link flapping: link_downed rose in 2 samples within "
                                                    "300 s (2 strikes)")]
        ep.trigger = "ib.flap"
        ep.t_fix = t0 + self.repair_time(6.0)

    def _respond(self, node: _Node, ep: _Episode) -> None:
        """The automation's answer to an episode's first report: a warning, or a drain (after
        asking the node's jobs to checkpoint); the prolog refuses jobs meanwhile."""
        rng, t0, action, trigger = self.rng, ep.t0, ep.action, ep.trigger
        first = ep.bad[0]
        where = f" GPU {first[2]}" if first[2] is not None else (f" {first[3]}" if first[3] else "")
        reason = f"slurmgpu: {first[0]}{where} {first[4]}" + (" (3 reports)" if ep.kind == "thermal" else "")
        if action == "warn":
            self.decision(t0 + 1.0, node, "warn", reason, trigger, "recorded")
            return
        if ep.ckpt_deadline:
            self.decision(t0 + 1.0, node, action, reason, trigger,
                          "drained" if action == "drain-now" else "checkpointing")
            ready = self.jobs(node, t0 + 1.0, action, reason, ep.ckpt_deadline)
            if action == "drain-now":
                self.node_state(t0 + 3.0, node, "drained", reason, "root", "automation")
                self.drained[node.name] = {"time": t0 + 1.0, "trigger": trigger, "reason": reason}
            else:
                self.drain(node, max(ready, t0 + 2.0), "drain", reason, trigger)
        else:
            # (uncorrected ECC errors: the job's epilog drains the node as it ends)
            self.drain(node, t0 + 1.0, action, reason, trigger, by_epilog=ep.kind == "ecc")
        self.prolog_blocked(node, t0, reason)
        if ep.kind == "remap-failure":
            self.ticket += rng.randint(1, 30)
            when = t0 + rng.uniform(2, 20) * HOUR
            if when < self.end:
                self.node_state(when, node, "drained", f"RMA GPU {ep.gpu}: row remap failure "
                                f"(case {self.ticket})", rng.choice(OPERATORS), "outside")

    def maintenance(self, node: _Node, t0: float) -> float:
        rng = self.rng
        who = rng.choice(OPERATORS)
        self.ticket += rng.randint(1, 30)
        reason = rng.choice(MAINTENANCE).format(n=self.ticket)
        t1 = t0 + rng.uniform(1, 10) * HOUR
        self.node_state(t0, node, "drained", reason, who, "outside")
        if "reimage" in reason or "PSU" in reason or "power" in reason:
            down = t0 + rng.uniform(0.3, 0.6) * (t1 - t0)
            self.unreachable(node, down, down + rng.uniform(600, 1800))
        if t1 < self.end:
            self.node_state(t1, node, "resumed", None, who)
        return t1

    def unreachable(self, node: _Node, t0: float, t1: float) -> float:
        self.node_state(t0, node, "unreachable", None, "collector")
        node.gaps.append((t0 - 15.0, min(t1, self.end)))
        if t1 < self.end:
            self.node_state(t1, node, "reachable", None, "collector")
        else:
            node.unreachable_since = t0
            node.last_seen = t0 - 15.0
        return t1


def _samples(node: _Node, start: float, hours: int, rng: random.Random) -> Iterable[tuple[Any, ...]]:
    reports = [REPORTS_PER_HOUR] * hours
    fail = [0] * hours
    hw = [0] * hours
    sw = [0] * hours

    def spread(a: float, b: float, out: list[int], share: float, sign: int = 1) -> None:
        a, b = max(a, start), min(b, start + hours * HOUR)
        if b <= a:
            return
        for h in range(int((a - start) // HOUR), min(hours, math.ceil((b - start) / HOUR))):
            lo, hi = start + h * HOUR, start + (h + 1) * HOUR
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                out[h] += sign * round(overlap / REPORT_S * share)

    for a, b in node.gaps:
        spread(a, b, reports, 1.0, -1)
    for a, b in node.fails:
        spread(a, b, fail, 1.0)
    for a, b, share in node.throttle:
        spread(a, b, hw, share)
    if node.chronic:
        for h in range(hours):
            if rng.random() < 0.6:
                hw[h] += int(REPORTS_PER_HOUR * node.chronic * rng.uniform(0.5, 1.5))
                if rng.random() < 0.2:
                    sw[h] += rng.randint(1, 30)
    elif node.noise:
        for h in range(hours):
            if rng.random() < node.noise:
                hw[h] += rng.randint(1, 6)
    name = node.name
    for h in range(hours):
        n = reports[h]
        if n > 0:
            yield (name, start + (h + 1) * HOUR, HOUR, n, min(fail[h], n), min(hw[h], n), min(sw[h], n))


def _by_time(row: tuple[Any, ...]) -> tuple[float, str]:
    return (row[1], row[0])


def _by_requested(row: tuple[Any, ...]) -> float:
    return float(row[6])


def _name(model: str, i: int, count: int) -> str:
    return f"gpu-{model}-{i:0{max(3, len(str(count)))}d}"


def _schedule(rng: random.Random, start: float, end: float, n: int) -> list[float]:
    """``n`` start times in the window, sorted."""
    return sorted(rng.uniform(start + 2 * HOUR, end - 4 * HOUR) for _ in range(n))


SHOWCASE = ("lemon1", "lemon2", "remap-failure", "remap", "ecc", "ib", "xid79", "xid119", "thermal",
            "maintenance", "unreachable", "drift1", "drift2", "upgrade")
# Each node's planned episodes: (time, kind, argument), laid out in time by _lay_out.
_Plan = dict[str, list[tuple[float, str, Any]]]


def seed(db_path: str | Path, nodes: int = 1000, days: float = 30, *, end: float | None = None,
         seed: int = 0) -> dict[str, Any]:
    """Fill the (empty) fleet database at ``db_path`` with ``days`` of history for ``nodes``
    nodes ending at ``end`` (default: the current hour), the automation's state (the two
    lemons, the nodes it drained) included. Returns a summary (row counts, notable nodes)."""
    if nodes < 1 or days <= 0:
        raise SeedError("nodes must be >= 1 and days > 0")
    began = time.perf_counter()
    end = float(math.floor(time.time() / HOUR) * HOUR) if end is None else float(end)
    start = end - days * DAY
    hours = math.ceil((end - start) / HOUR)
    rng = random.Random(seed)
    sd = _Seeder(rng, start, end)
    fleet = _fleet(nodes, end)

    # Showcase nodes: every kind of trouble appears at least once, even in a small fleet.
    order = rng.sample(range(nodes), nodes)
    pick = itertools.cycle(order)
    showcase = {role: fleet[next(pick)] for role in SHOWCASE}
    plan: _Plan = {n.name: [] for n in fleet}
    scale = days / 30.0
    drifted, up = _versions(sd, fleet, showcase, plan, scale)
    _counters(sd, fleet, order)
    _plan_episodes(sd, fleet, showcase, plan, scale)
    lemons = _lay_out(sd, fleet, plan)
    _application_xids(sd, fleet, scale)
    counts = _write(db_path, sd, fleet, hours)
    return {
        "db": str(db_path), "nodes": nodes, "days": days, "seed": seed, "start": start, "end": end,
        "rows": counts, "lemons": sorted(set(lemons)), "drifted": sorted(drifted), "upgraded": up.name,
        "drained_at_end": sorted(sd.drained), "seconds": round(time.perf_counter() - began, 3),
    }


def _fleet(nodes: int, end: float) -> list[_Node]:
    """The A100 nodes, then the H100 nodes, each on the pinned stack of its model."""
    n_a100 = max(1, round(nodes * A100_FRACTION)) if nodes > 1 else 1
    fleet: list[_Node] = []
    for i in range(nodes):
        model = "a100" if i < n_a100 else "h100"
        idx = i + 1 if model == "a100" else i - n_a100 + 1
        count = n_a100 if model == "a100" else nodes - n_a100
        spec = MODELS[model]
        versions = {k: spec[k] for k in ("gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware",
                                         "ofed", "kernel")}
        fleet.append(_Node(_name(model, idx, count), model, i, versions, last_seen=end))
    return fleet


def _versions(sd: _Seeder, fleet: list[_Node], showcase: dict[str, _Node], plan: _Plan,
              scale: float) -> tuple[list[str], _Node]:
    """Versions: baselines, drift, the mid-month upgrade. Returns the drifted nodes' names
    and the upgraded node."""
    rng, start, end = sd.rng, sd.start, sd.end
    drifted: list[str] = []
    drift_nodes = [showcase["drift1"], showcase["drift2"]] + [
        n for n in fleet if rng.random() < 0.01 and n not in showcase.values()]
    for k, node in enumerate(drift_nodes):
        fld, check, values = DRIFTS[k % len(DRIFTS)]
        node.versions[fld] = values[node.model]
        node.standing.append((check, "WARN", None, None, f"{fld} {values[node.model]} is not pinned",
                              -math.inf, math.inf))
        drifted.append(node.name)
    up = showcase["upgrade"]
    t_up = start + (end - start) * 0.5 + rng.uniform(-DAY, DAY) * min(1.0, scale)
    if up.name not in drifted:
        up.versions["driver"] = UPGRADE_FROM
        up.standing.append(("pin.driver", "WARN", None, None, f"driver {UPGRADE_FROM} is not pinned",
                            -math.inf, t_up))
    for node in fleet:
        sd.versions.append((node.name, start + rng.uniform(0, 60), *node.versions.values()))
    if up.name not in drifted:
        upgraded = dict(up.versions, driver=MODELS[up.model]["driver"])
        sd.versions.append((up.name, t_up, *upgraded.values()))
        plan[up.name].append((t_up + 300.0, "report", None))
    return drifted, up


def _counters(sd: _Seeder, fleet: list[_Node], order: list[int]) -> None:
    """Counters: a baseline row for every GPU and port, then the slow risers."""
    rng, start, end, nodes = sd.rng, sd.start, sd.end, len(fleet)
    for node in fleet:
        spec = MODELS[node.model]
        for g in range(GPUS):
            base = 0 if rng.random() < 0.9 else rng.randint(1, 400)
            cur = [f"{spec['serial']}{node.index:06d}{g}", spec["gpu_model"], base, 0, 0, 0, 0, 0]
            sd.gpu_now[(node.name, g)] = cur
            sd.gpu.append((node.name, g, start + 1.0, *cur))
        for p in PORTS:
            cur_ib = ["ACTIVE", spec["rate_gbps"], rng.choice((0, 0, 0, 1, 3)), 0, 0, 0, 0, 0]
            sd.ib_now[(node.name, p)] = cur_ib
            sd.ib.append((node.name, p, start + 1.0, *cur_ib))
    risers = max(2, int(nodes * GPUS * 0.003))
    for k in range(risers):
        node = fleet[order[(k * 7 + 3) % nodes]]
        g = rng.randrange(GPUS)
        rate = rng.choice((50, 200, 1500))
        t = start + rng.uniform(0, 5) * DAY
        while t < end:
            cur = sd.gpu_now[(node.name, g)]
            sd.set_gpu(node, g, t, ecc_corrected=cur[2] + int(rate * rng.uniform(0.5, 1.5)))
            t += DAY * rng.uniform(0.5, 1.5)
    for node in fleet:
        if rng.random() < 0.01 * max(1.0, 30 / max(nodes, 30)):
            p = rng.choice(PORTS)
            t = start + rng.uniform(0, 10) * DAY
            while t < end:
                cur_ib = sd.ib_now[(node.name, p)]
                sd.set_ib(node, p, t, symbol_error=cur_ib[2] + rng.randint(20, 800))
                t += DAY * rng.uniform(0.7, 1.3)


def _plan_episodes(sd: _Seeder, fleet: list[_Node], showcase: dict[str, _Node], plan: _Plan,
                   scale: float) -> None:
    """Episodes: the showcase ones, then random ones at the fleet's rates."""
    rng, start, end = sd.rng, sd.start, sd.end
    window = end - start
    for role in ("lemon1", "lemon2"):
        node = showcase[role]
        t = start + window * rng.uniform(0.3, 0.5)
        step = min(rng.uniform(1.2, 2.0) * DAY, (end - t - 2 * HOUR) / 3)
        for k in range(3):
            plan[node.name].append((t, "lemon", k))
            t += step
    for role, kind, arg in (("remap-failure", "fault", ("remap-failure", None)),
                            ("remap", "fault", ("remap", None)), ("ecc", "fault", ("ecc", None)),
                            ("ib", "fault", ("ib", None)), ("xid79", "fault", ("xid", 79)),
                            ("xid119", "fault", ("xid", 119 if showcase["xid119"].model == "h100" else 74)),
                            ("thermal", "fault", ("thermal", None)),
                            ("maintenance", "maintenance", None), ("unreachable", "unreachable", None)):
        node = showcase[role]
        plan[node.name].append((rng.uniform(start + 2 * HOUR, end - 4 * HOUR), kind, arg))
    throttlers = [showcase["thermal"]] + [n for n in fleet if rng.random() < 0.004]
    for node in throttlers:
        node.chronic = rng.uniform(0.15, 0.45)
    for node in fleet:
        if not node.chronic and rng.random() < 0.08:
            node.noise = rng.uniform(0.01, 0.05)
        lam = FAULT_RATE * scale
        for t in _schedule(rng, start, end, sum(1 for _ in range(3) if rng.random() < lam / 3)):
            kind = _weighted(rng, FAULTS)
            if kind == "thermal" and not node.chronic:
                node.chronic = rng.uniform(0.05, 0.2)
            plan[node.name].append((t, "fault", (kind, None)))
        if rng.random() < 0.03 * scale:
            plan[node.name].append((rng.uniform(start, end - HOUR), "maintenance", None))
        if rng.random() < 0.02 * scale:
            plan[node.name].append((rng.uniform(start, end - HOUR), "unreachable", None))


def _lay_out(sd: _Seeder, fleet: list[_Node], plan: _Plan) -> list[str]:
    """Lay every node's episodes out in time, one at a time. Returns the lemons."""
    rng, start, end = sd.rng, sd.start, sd.end
    lemons: list[str] = []
    for node in fleet:
        sd.report(node, start + rng.uniform(1, REPORT_S), [])
        busy_until = start
        for t, kind, arg in sorted(plan[node.name], key=lambda x: x[0]):
            if kind == "report":
                if t >= busy_until:
                    sd.report(node, t, [])
                continue
            if kind != "lemon":
                t = max(t, busy_until + 2 * HOUR)
            if t >= end - (HOUR if kind != "lemon" else 0.25 * HOUR):
                continue
            if kind == "fault":
                fault_kind, xid = arg
                busy_until = sd.fault(node, fault_kind, t, forever=fault_kind == "remap-failure", xid=xid)
            elif kind == "lemon":
                busy_until = _lemon_drain(sd, node, t, busy_until, last=arg == 2)
                if arg == 2:
                    lemons.append(node.name)
            elif kind == "maintenance":
                busy_until = sd.maintenance(node, t)
            elif kind == "unreachable":
                busy_until = sd.unreachable(node, t, t + rng.uniform(0.3, 8) * HOUR)
    return lemons


def _lemon_drain(sd: _Seeder, node: _Node, t: float, busy_until: float, *, last: bool) -> float:
    """One of a lemon's three XID drains; the last one stays open and makes it a lemon."""
    code = 119 if node.model == "h100" else 74
    ended = sd.fault(node, "xid", max(t, busy_until + 0.1 * HOUR), forever=last, xid=code,
                     repair_h=min(3.0, (sd.end - sd.start) / HOUR / 24))
    if last:
        info = sd.drained.get(node.name, {})
        sd.lemons[node.name] = {"since": info.get("time", t), "why":
                                f"3 drains within 604800 s, last: {info.get('reason', '')}"}
    return ended


def _application_xids(sd: _Seeder, fleet: list[_Node], scale: float) -> None:
    """Application XIDs: events only (the node is fine)."""
    rng = sd.rng
    app = list(APP_XIDS)
    weights = [APP_XIDS[c] for c in app]
    for node in fleet:
        for _ in range(int(rng.expovariate(1 / (3.0 * scale)))):
            g, code = rng.randrange(GPUS), rng.choices(app, weights)[0]
            t = rng.uniform(sd.start, sd.end)
            sd.event(node, t, "xid", g, code, "OK",
                     [("xid.recent", "OK", g, None, f"XID {code}: {sd.xids[code][0]}")])


def _write(db_path: str | Path, sd: _Seeder, fleet: list[_Node], hours: int) -> dict[str, int]:
    """Write it all, in one transaction; returns each table's row count."""
    from slurmgpu.collector.store import Store, queries

    sd.states.sort(key=_by_time)
    sd.checkpoints.sort(key=_by_requested)
    sd.job_events.sort(key=_by_time)
    store = Store(db_path)
    try:
        db = store.db
        if store.count("nodes"):
            raise SeedError(f"{db_path}: the database already holds a fleet; seed an empty file")
        db.execute("PRAGMA synchronous = OFF")
        db.execute("PRAGMA cache_size = -262144")
        with store.transaction():
            # Building the big table's secondary index after the rows is several times faster.
            index_sql = queries.index_sql(db, "node_samples_ts")
            db.execute("DROP INDEX node_samples_ts")
            db.executemany("INSERT INTO node_samples (node, ts, span_s, reports, fail_reports, "
                           "hw_slowdown_reports, sw_thermal_reports) VALUES (?,?,?,?,?,?,?)",
                           (row for node in fleet for row in _samples(node, sd.start, hours, sd.rng)))
            db.execute(index_sql)
            _insert_history(db, sd)
            _insert_nodes(db, fleet, sd.start)
            _seed_automation(store, sd, len(fleet))
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {t: store.count(t) for t in ("nodes", "node_samples", "report_history", "findings",
                                            "events", "decisions", "node_states", "gpu_counters",
                                            "ib_counters", "node_versions", "checkpoints", "job_events")}
    finally:
        store.close()


def _seed_automation(store: Any, sd: _Seeder, fleet: int) -> None:
    """The automation's state as the collector would keep it: the fleet's size, the nodes it
    drained (still drained at the end) and the two lemons (inside the seeding transaction)."""
    record = store.automation()
    record.state.fleet = fleet
    record.state.drained = {node: dict(info) for node, info in sd.drained.items()}
    record.state.lemons = {node: dict(info) for node, info in sd.lemons.items()}
    record.save()


def _insert_history(db: Any, sd: _Seeder) -> None:
    db.executemany("INSERT INTO report_history (node, seq, ts, verdict) VALUES (?,?,?,?)",
                   sd.history)
    db.executemany("INSERT INTO findings (node, seq, ts, check_id, severity, gpu, subject, "
                   "message) VALUES (?,?,?,?,?,?,?,?)", sd.findings)
    db.executemany("INSERT INTO events (node, seq, ts, kind, gpu, data, verdict, body) "
                   "VALUES (?,?,?,?,?,?,?,?)", sd.events)
    db.executemany("INSERT INTO decisions (time, node, action, reason, held, dry_run, trigger, "
                   "result) VALUES (?,?,?,?,?,?,?,?)", sorted(sd.decisions))
    db.executemany("INSERT INTO node_states (node, ts, kind, reason, actor, drained_by) "
                   "VALUES (?,?,?,?,?,?)", sd.states)
    db.executemany("INSERT INTO gpu_counters (node, gpu, ts, serial, model, ecc_corrected, "
                   "ecc_uncorrected, remap_corrected, remap_uncorrected, remap_pending, "
                   "remap_failure) VALUES (?,?,?,?,?,?,?,?,?,?,?)", sd.gpu)
    db.executemany("INSERT INTO ib_counters (node, port, ts, state, rate_gbps, symbol_error, "
                   "link_downed, link_error_recovery, port_rcv_errors, local_link_integrity_errors, "
                   "excessive_buffer_overrun_errors) VALUES (?,?,?,?,?,?,?,?,?,?,?)", sd.ib)
    db.executemany("INSERT INTO node_versions (node, ts, gpu_model, driver, cuda, nccl, vbios, "
                   "ib_firmware, ofed, kernel) VALUES (?,?,?,?,?,?,?,?,?,?)", sd.versions)
    db.executemany("INSERT INTO checkpoints (job_id, action, reason, trigger_node, nodes, user, "
                   "requested, deadline, state, acked_at, acked_by, closed) "
                   "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", sd.checkpoints)
    db.executemany("INSERT INTO job_events (job_id, ts, kind, node, detail) VALUES (?,?,?,?,?)",
                   sd.job_events)


def _insert_nodes(db: Any, fleet: list[_Node], start: float) -> None:
    """Each node's row and its latest report, as the collector keeps them."""
    node_rows, reports = [], []
    for node in fleet:
        seen = node.last_seen
        w = node.worst
        node_rows.append((node.name, start, seen, _seq(start, seen), node.verdict, seen,
                          w[0] if w else None, w[1] if w else None, w[2] if w else None,
                          w[3] if w else None, 0 if node.unreachable_since else 1,
                          node.unreachable_since, __version__))
        body = {"verdict": node.verdict, "findings": (
            [{"check": w[0], "severity": w[1], "message": w[2], "gpu": w[3]}] if w else []),
            "summary": {"versions": dict(node.versions)}}
        reports.append((node.name, _seq(start, seen), seen, node.verdict,
                        msgpack.packb(body, use_bin_type=True)))
    db.executemany("INSERT INTO nodes (node, first_seen, last_seen, last_seq, verdict, verdict_ts, "
                   "worst_check, worst_severity, worst_message, worst_gpu, reachable, "
                   "unreachable_since, agent_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", node_rows)
    db.executemany("INSERT INTO reports (node, seq, ts, verdict, body) VALUES (?,?,?,?,?)", reports)
