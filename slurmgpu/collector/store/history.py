"""Report summaries -> the fleet history tables (docs/fleet-db.md). ``History.observe``
runs inside the store's batch transaction and only compares small tuples, so ingest stays
cheap.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/history.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from slurmgpu.collector.store.backend import insert_sql
from slurmgpu.result import Severity
from slurmgpu.summary import GPU_FIELDS, IB_FIELDS, THROTTLE_HW, THROTTLE_SW, VERSION_FIELDS
from slurmgpu.wire import MAX_GPUS, MAX_IB_PORTS

if TYPE_CHECKING:
    from slurmgpu.collector.store.backend import Connection

_MAX_TEXT = 256
_FAIL = Severity.FAIL.name
# A node's report counts, one row per interval (the partial one at shutdown, updated).
_SAMPLES = insert_sql("node_samples", ("node", "ts", "span_s", "reports", "fail_reports", "hw_slowdown_reports",
                                       "sw_thermal_reports"), ("node", "ts"))
_GPUS = insert_sql("gpu_counters", ("node", "gpu", "ts", *GPU_FIELDS))
_IB = insert_sql("ib_counters", ("node", "port", "ts", *IB_FIELDS))
_VERSIONS = insert_sql("node_versions", ("node", "ts", *VERSION_FIELDS))


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

    def write(self, db: Connection) -> None:
        for sql, rows in ((_SAMPLES, self.samples), (_GPUS, self.gpus), (_IB, self.ib),
                          (_VERSIONS, self.versions)):
            if rows:
                db.executemany(sql, rows)


class History:
    def __init__(self, interval_s: float = 3600.0) -> None:
        self.interval_s = interval_s
        self._acc: dict[str, _Acc] = {}
        # node -> its last summary as received: a report that changed nothing costs one
        # comparison of bytes, not a walk over every GPU and port.
        self._seen: dict[str, Any] = {}
        # node -> {GPU index / IB port: its last values}. Each summary replaces its node's
        # map, so a node holds at most what one message may carry (the wire's bounds),
        # however many port names it invents over time.
        self._gpu: dict[str, dict[int, tuple[Any, ...]]] = {}
        self._ib: dict[str, dict[str, tuple[Any, ...]]] = {}
        self._versions: dict[str, tuple[Any, ...]] = {}

    def observe(self, node: str, ts: float, verdict: str, throttle: Any, summary: Any,
                rows: Rows) -> None:
        """One report of ``node`` at ``ts``: its ``throttle`` bits and its ``summary``
        (packed bytes as agents send them, a map, or absent)."""
        acc = self._acc.get(node)
        if acc is None:
            acc = self._acc[node] = _Acc(ts)
        acc.reports += 1
        acc.fail += verdict == _FAIL
        if isinstance(throttle, int) and throttle:
            acc.hw += bool(throttle & THROTTLE_HW)
            acc.sw += bool(throttle & THROTTLE_SW)
        if ts - acc.start >= self.interval_s:
            rows.samples.append((node, ts, ts - acc.start, acc.reports, acc.fail, acc.hw, acc.sw))
            self._acc[node] = _Acc(ts)
        if summary is None or self._seen.get(node) == summary:
            return  # nothing changed (for packed bytes: one memcmp)
        self._seen[node] = summary
        if isinstance(summary, bytes):
            try:
                summary = msgpack.unpackb(summary, raw=False, strict_map_key=True)
            except Exception:  # not msgpack: ignored (the report itself was valid)
                return
        if isinstance(summary, dict):
            self._changed(node, ts, summary.get("gpus"), summary.get("ib"), summary.get("versions"), rows)

    def _changed(self, node: str, ts: float, gpus: Any, ports: Any, versions: Any, rows: Rows) -> None:
        if isinstance(gpus, list):
            last_gpus, now_gpus = self._gpu.get(node, {}), {}
            for g in gpus[:MAX_GPUS]:
                # (the wire bounds indices; a direct caller's odd row is skipped, never
                # bound as an out-of-range SQL integer)
                if not isinstance(g, list) or not g or type(g[0]) is not int or not 0 <= g[0] < MAX_GPUS:
                    continue
                values = now_gpus[g[0]] = _values(g[1:], len(GPU_FIELDS))
                if last_gpus.get(g[0]) != values:
                    rows.gpus.append((node, g[0], ts, *values))
            self._gpu[node] = now_gpus
        if isinstance(ports, list):
            last_ports, now_ports = self._ib.get(node, {}), {}
            for p in ports[:MAX_IB_PORTS]:
                if not isinstance(p, list) or not p or not isinstance(p[0], str):
                    continue
                port = p[0][:_MAX_TEXT]
                values = now_ports[port] = _values(p[1:], len(IB_FIELDS))
                if last_ports.get(port) != values:
                    rows.ib.append((node, port, ts, *values))
            self._ib[node] = now_ports
        if isinstance(versions, list):
            values = _values(versions, len(VERSION_FIELDS))
            if self._versions.get(node) != values:
                self._versions[node] = values
                rows.versions.append((node, ts, *values))

    def forget(self, nodes: set[str]) -> None:
        """The store rolled back a batch with these nodes' rows: forget their last seen
        values, so their next report writes its rows again (as after a restart). Their
        sample counts keep the rolled-back reports (at most one batch over-counted)."""
        for node in nodes:
            self._seen.pop(node, None)
            self._versions.pop(node, None)
            self._gpu.pop(node, None)
            self._ib.pop(node, None)

    def flush(self, now: float, rows: Rows) -> None:
        """Write every node's partial interval (at shutdown)."""
        for node, acc in self._acc.items():
            if acc.reports:
                rows.samples.append((node, now, max(0.0, now - acc.start), acc.reports, acc.fail,
                                     acc.hw, acc.sw))
        self._acc.clear()


def _values(items: list[Any], n: int) -> tuple[Any, ...]:
    """Exactly ``n`` storable values from an untrusted list (missing ones None)."""
    return tuple(_scalar(v) for v in (items[:n] + [None] * (n - len(items))))
