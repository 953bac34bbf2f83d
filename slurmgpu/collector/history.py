"""Report summaries -> the fleet history tables (docs/fleet-db.md).

``History.observe`` is called by the store for every new report inside its batch
transaction; it only compares small tuples with the last values it saw and appends
rows to write, so ingest stays cheap:

* ``node_samples``: per node, counts accumulated over ``interval_s`` (reports, FAIL
  reports, reports with HW slowdown / SW thermal throttling on some GPU), one row
  per interval;
* ``gpu_counters``, ``ib_counters``, ``node_versions``: a row the first time a GPU /
  port / node is seen after the collector starts, then one each time a value changes.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.summary import IB_COUNTERS

_GPU_FIELDS = ("serial", "model", "ecc_corrected", "ecc_uncorrected", "remap_corrected",
               "remap_uncorrected", "remap_pending", "remap_failure")
_VERSION_FIELDS = ("gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware", "ofed", "kernel")
_MAX_TEXT = 256


def _scalar(value: Any) -> Any:
    """What SQLite can store from an untrusted value: int/float/short str, else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else None
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        return value[:_MAX_TEXT]
    return None


@dataclass
class _Acc:
    start: float
    reports: int = 0
    fail: int = 0
    hw: int = 0
    sw: int = 0


@dataclass
class Rows:
    samples: list[tuple[Any, ...]] = field(default_factory=list)
    gpus: list[tuple[Any, ...]] = field(default_factory=list)
    ib: list[tuple[Any, ...]] = field(default_factory=list)
    versions: list[tuple[Any, ...]] = field(default_factory=list)

    def write(self, db: sqlite3.Connection) -> None:
        if self.samples:
            db.executemany("INSERT OR REPLACE INTO node_samples (node, ts, span_s, reports, fail_reports, "
                           "hw_slowdown_reports, sw_thermal_reports) VALUES (?,?,?,?,?,?,?)", self.samples)
        if self.gpus:
            db.executemany(f"INSERT INTO gpu_counters (node, gpu, ts, {', '.join(_GPU_FIELDS)}) "
                           f"VALUES ({', '.join('?' * (3 + len(_GPU_FIELDS)))})", self.gpus)
        if self.ib:
            db.executemany(f"INSERT INTO ib_counters (node, port, ts, state, rate_gbps, "
                           f"{', '.join(IB_COUNTERS)}) "
                           f"VALUES ({', '.join('?' * (5 + len(IB_COUNTERS)))})", self.ib)
        if self.versions:
            db.executemany(f"INSERT INTO node_versions (node, ts, {', '.join(_VERSION_FIELDS)}) "
                           f"VALUES ({', '.join('?' * (2 + len(_VERSION_FIELDS)))})", self.versions)


class History:
    def __init__(self, interval_s: float = 3600.0) -> None:
        self.interval_s = interval_s
        self._acc: dict[str, _Acc] = {}
        self._gpu: dict[tuple[str, int], tuple[Any, ...]] = {}
        self._ib: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._versions: dict[str, tuple[Any, ...]] = {}

    def observe(self, node: str, ts: float, verdict: str, summary: Any, rows: Rows) -> None:
        """One report of ``node`` at ``ts`` with its ``summary`` (may be absent)."""
        summary = summary if isinstance(summary, dict) else {}
        gpus = [g for g in summary.get("gpus") or () if isinstance(g, dict)]
        acc = self._acc.get(node)
        if acc is None:
            acc = self._acc[node] = _Acc(ts)
        acc.reports += 1
        acc.fail += verdict == "FAIL"
        acc.hw += any(g.get("hw_slowdown") for g in gpus)
        acc.sw += any(g.get("sw_thermal") for g in gpus)
        if ts - acc.start >= self.interval_s:
            rows.samples.append((node, ts, ts - acc.start, acc.reports, acc.fail, acc.hw, acc.sw))
            self._acc[node] = _Acc(ts)
        for g in gpus:
            index = _scalar(g.get("index"))
            if not isinstance(index, int):
                continue
            values = tuple(_scalar(g.get(f)) for f in _GPU_FIELDS)
            if self._gpu.get((node, index)) != values:
                self._gpu[(node, index)] = values
                rows.gpus.append((node, index, ts, *values))
        for p in summary.get("ib") or ():
            if not isinstance(p, dict) or not isinstance(p.get("port"), str):
                continue
            port = p["port"][:_MAX_TEXT]
            values = (_scalar(p.get("state")), _scalar(p.get("rate_gbps")),
                      *(_scalar(p.get(c)) for c in IB_COUNTERS))
            if self._ib.get((node, port)) != values:
                self._ib[(node, port)] = values
                rows.ib.append((node, port, ts, *values))
        versions = summary.get("versions")
        if isinstance(versions, dict):
            values = tuple(_scalar(versions.get(f)) for f in _VERSION_FIELDS)
            if self._versions.get(node) != values:
                self._versions[node] = values
                rows.versions.append((node, ts, *values))

    def flush(self, now: float, rows: Rows) -> None:
        """Write every node's partial interval (at shutdown)."""
        for node, acc in self._acc.items():
            if acc.reports:
                rows.samples.append((node, now, max(0.0, now - acc.start), acc.reports, acc.fail,
                                     acc.hw, acc.sw))
        self._acc.clear()
