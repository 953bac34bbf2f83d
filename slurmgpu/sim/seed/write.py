"""Writing the seeded month: the hourly samples, every collected row, the nodes' latest
reports and the automation's state, in one transaction with ``executemany``."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from slurmgpu import __version__

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
    from slurmgpu.collector.store import Store, queries
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
    record.state.drained = {node: dict(info) for node, info in sd.drained.items()}
    record.state.lemons = {node: dict(info) for node, info in sd.lemons.items()}
    record.save()


def _insert_history(db: Any, sd: Recorder) -> None:
    db.execute("UPDATE history_version SET version = version + 1")  # (as the collector's ingest does)
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
    db.executemany('INSERT INTO checkpoints (job_id, action, reason, trigger_node, nodes, "user", '
                   "requested, deadline, state, acked_at, acked_by, closed) "
                   "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", sd.checkpoints)
    db.executemany("INSERT INTO job_events (job_id, ts, kind, node, detail) VALUES (?,?,?,?,?)",
                   sd.job_events)


def _insert_nodes(db: Any, fleet: list[Node], start: float) -> None:
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
    db.executemany("INSERT INTO nodes (node, first_seen, last_seen, last_seq, verdict, verdict_ts, "
                   "worst_check, worst_severity, worst_message, worst_gpu, reachable, "
                   "unreachable_since, agent_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", node_rows)
    db.executemany("INSERT INTO reports (node, seq, ts, verdict, body) VALUES (?,?,?,?,?)", reports)
