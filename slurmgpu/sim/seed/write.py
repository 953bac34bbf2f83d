"""Writing the seeded month: the hourly samples, every collected row, the nodes' latest
reports and the automation's state, in one transaction (the store's bulk writes)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from slurmgpu import __version__
from slurmgpu.collector.store.automation import DrainedNode, Lemon

from .model import HOUR, REPORT_S, REPORTS_PER_HOUR, Node, SeedError, message_seq
from .rows import Recorder


def _samples(node: Node, start: float, hours: int, rng: random.Random) -> Iterable[tuple[Any, ...]]:
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


def write(db_path: str | Path, sd: Recorder, fleet: list[Node], hours: int) -> dict[str, int]:
    """Write it all, in one transaction; returns each table's row count."""
    from slurmgpu.collector.store import Store
    from slurmgpu.collector.store.backend import SQLITE, dialect_of

    sd.states.sort(key=_by_time)
    sd.checkpoints.sort(key=_by_requested)
    sd.job_events.sort(key=_by_time)
    store = Store(db_path)
    try:
        db = store.db
        if store.count("nodes"):
            raise SeedError(f"{db_path}: the database already holds a fleet; seed an empty file")
        sqlite = dialect_of(db) is SQLITE
        if sqlite:
            db.execute("PRAGMA synchronous = OFF")
            db.execute("PRAGMA cache_size = -262144")
        with store.transaction():
            with store.index_rebuilt("node_samples_ts"):
                store.insert_rows("node_samples", SAMPLE_COLUMNS,
                                  (row for node in fleet for row in _samples(node, sd.start, hours, sd.rng)))
            _insert_history(store, sd)
            _insert_nodes(store, fleet, sd.start)
            _seed_automation(store, sd, len(fleet))
        if sqlite:
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {t: store.count(t) for t in ("nodes", "node_samples", "report_history", "findings",
                                            "events", "decisions", "node_states", "gpu_counters",
                                            "ib_counters", "node_versions", "checkpoints", "job_events")}
    finally:
        store.close()


def _seed_automation(store: Any, sd: Recorder, fleet: int) -> None:
    """The automation's state as the collector would keep it: the fleet's size, the nodes it
    drained (still drained at the end) and the two lemons (inside the seeding transaction)."""
    record = store.automation()
    record.state.fleet = fleet
    record.state.drained = {node: DrainedNode(**info) for node, info in sd.drained.items()}
    record.state.lemons = {node: Lemon(**info) for node, info in sd.lemons.items()}
    record.save()


SAMPLE_COLUMNS = ("node", "ts", "span_s", "reports", "fail_reports", "hw_slowdown_reports", "sw_thermal_reports")
# Each seeded table's columns, in the order the recorder's rows hold them.
HISTORY_COLUMNS = {
    "report_history": ("node", "seq", "ts", "verdict"),
    "findings": ("node", "seq", "ts", "check_id", "severity", "gpu", "subject", "message"),
    "events": ("node", "seq", "ts", "kind", "gpu", "data", "verdict", "body"),
    "decisions": ("time", "node", "action", "reason", "held", "dry_run", "trigger", "result"),
    "node_states": ("node", "ts", "kind", "reason", "actor", "drained_by"),
    "gpu_counters": ("node", "gpu", "ts", "serial", "model", "ecc_corrected", "ecc_uncorrected",
                     "remap_corrected", "remap_uncorrected", "remap_pending", "remap_failure"),
    "ib_counters": ("node", "port", "ts", "state", "rate_gbps", "symbol_error", "link_downed",
                    "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors",
                    "excessive_buffer_overrun_errors"),
    "node_versions": ("node", "ts", "gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware",
                      "ofed", "kernel"),
    "checkpoints": ("job_id", "action", "reason", "trigger_node", "nodes", "user", "requested",
                    "deadline", "state", "acked_at", "acked_by", "closed"),
    "job_events": ("job_id", "ts", "kind", "node", "detail"),
}
NODE_COLUMNS = ("node", "first_seen", "last_seen", "last_seq", "verdict", "verdict_ts", "worst_check",
                "worst_severity", "worst_message", "worst_gpu", "reachable", "unreachable_since",
                "agent_version")


def _insert_history(store: Any, sd: Recorder) -> None:
    rows = {"report_history": sd.history, "findings": sd.findings, "events": sd.events,
            "decisions": sorted(sd.decisions), "node_states": sd.states, "gpu_counters": sd.gpu,
            "ib_counters": sd.ib, "node_versions": sd.versions, "checkpoints": sd.checkpoints,
            "job_events": sd.job_events}
    for table, columns in HISTORY_COLUMNS.items():
        store.insert_rows(table, columns, rows[table])


def _insert_nodes(store: Any, fleet: list[Node], start: float) -> None:
    """Each node's row and its latest report, as the collector keeps them."""
    node_rows, reports = [], []
    for node in fleet:
        seen = node.last_seen
        w = node.worst
        node_rows.append((node.name, start, seen, message_seq(start, seen), node.verdict, seen,
                          w[0] if w else None, w[1] if w else None, w[2] if w else None,
                          w[3] if w else None, 0 if node.unreachable_since else 1,
                          node.unreachable_since, __version__))
        body = {"verdict": node.verdict, "findings": (
            [{"check": w[0], "severity": w[1], "message": w[2], "gpu": w[3]}] if w else []),
            "summary": {"versions": dict(node.versions)}}
        reports.append((node.name, message_seq(start, seen), seen, node.verdict,
                        msgpack.packb(body, use_bin_type=True)))
    store.insert_rows("nodes", NODE_COLUMNS, node_rows)
    store.insert_rows("reports", ("node", "seq", "ts", "verdict", "body"), reports)
