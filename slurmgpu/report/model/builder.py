"""The report model's SQL: ``Builder`` reads the collector's database for one window,
section by section (docs/report.md defines every number)."""

from __future__ import annotations

import os
import sqlite3
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from slurmgpu.config.hosts import HostIndex
from slurmgpu.report.model.common import (
    ALL_SET,
    AUTOMATION_MATCH_S,
    BY_GROUPS,
    CATEGORIES,
    ECC_COUNTERS,
    ECC_MAX_GPUS,
    IB_COUNTERS,
    IB_FINDING_CHECKS,
    LIST_MAX,
    OTHER_SET,
    PIN_FIELDS,
    SERIES_MAX_POINTS,
    TOP_N,
    BackgroundQuery,
    _attribute,
    _Buckets,
    _category,
    _hours,
    _Node,
    _pct,
    _r,
    _runs,
    _ts,
    database_file,
)
from slurmgpu.result import Severity

if TYPE_CHECKING:
    from slurmgpu.collector.store.backend import Connection
    from slurmgpu.config.load import LoadedConfig
    from slurmgpu.config.schema import Settings


# Throttling, per node over the window's hourly samples, node by node through the (node,
# ts) primary key (~10x faster than the ts index plus a GROUP BY b-tree), for the nodes
# in [first, stop) ({range}): a "total" row (nodes sampled, reports, hw slowdown, sw
# thermal) and a "node" row per node with reports and any throttled (few rows: the scan
# can run in a thread, never waiting for the GIL to hand a row over).
THROTTLE_SQL = (
    "WITH per AS MATERIALIZED (SELECT n.node AS node, sum(s.reports) AS reports, "
    "sum(s.hw_slowdown_reports) AS hw, sum(s.sw_thermal_reports) AS sw FROM nodes n "
    "CROSS JOIN node_samples s WHERE s.node = n.node AND s.ts > ? AND s.ts <= ? {range}"
    "GROUP BY n.node) "
    "SELECT 'total', NULL, count(*), sum(reports), sum(hw), sum(sw) FROM per UNION ALL "
    "SELECT 'node', node, reports, hw, sw, NULL FROM per "
    "WHERE reports <> 0 AND (hw <> 0 OR sw <> 0)")
# The scan is split in node ranges run at once, one thread each (SQLite scans outside
# the GIL): at most this many, and no more than CPUs.
THROTTLE_PARTS = 4


def _throttle_query(first: str | None, stop: str | None,
                    window: tuple[float, float]) -> tuple[str, tuple[Any, ...]]:
    bounds = [("n.node >= ?", first), ("n.node < ?", stop)]
    where = " AND ".join(cond for cond, value in bounds if value is not None)
    params = tuple(value for _, value in bounds if value is not None)
    return THROTTLE_SQL.format(range=f"AND {where} " if where else ""), (*window, *params)


def _sql_order(value: Any) -> tuple[int, Any]:
    """``ORDER BY value``'s key in SQLite: NULL, then numbers, text, blobs."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    return (2, value) if isinstance(value, str) else (3, value)


class Builder:
    def __init__(self, db: Connection, t0: float, t1: float,
                 config: LoadedConfig | None) -> None:
        self.db = db
        self.t0, self.t1 = t0, t1
        self.config = config
        self._hosts = HostIndex(config.all_hosts if config is not None else ())
        self._settings_cache: dict[tuple[int, ...], Settings] = {}
        self._node_settings: dict[str, Settings] = {}
        self._throttle: list[BackgroundQuery] = []
        self.nodes: dict[str, _Node] = {}
        self.buckets = _Buckets(t0, t1)

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, tuple(params)).fetchall()

    def columns(self, table: str) -> set[str]:
        return {str(d[0]) for d in self.db.execute(f"SELECT * FROM {table} LIMIT 0").description}

    @property
    def w(self) -> tuple[float, float]:
        return self.t0, self.t1

    # ---- config

    def settings(self, node: str | None) -> Settings:
        if self.config is None:
            from slurmgpu.config.schema import Settings

            key: tuple[int, ...] = ()
            if key not in self._settings_cache:
                self._settings_cache[key] = Settings()
            return self._settings_cache[key]
        if node is not None and node in self._node_settings:
            return self._node_settings[node]
        sections = self._hosts.matching(node) if node is not None else []
        key = tuple(s.index for s in sections)
        cached = self._settings_cache.get(key)
        if cached is None:
            cached = self.config.settings_for(node, environ={})  # the file's view of that node
            self._settings_cache[key] = cached
        if node is not None:
            self._node_settings[node] = cached
        return cached

    @property
    def rest_set(self) -> str:
        """The host set of the nodes no [[hosts]] section names: ``other``, or ``all nodes``
        where the config has no sections (one set: the whole fleet)."""
        return OTHER_SET if self.config is not None and self.config.hosts else ALL_SET

    def host_sets(self, node: str) -> list[str]:
        if self.config is None:
            return [self.rest_set]
        names: list[str] = []
        for s in self._hosts.matching(node):
            name = s.name or f"hosts[{s.index}]"
            if name not in names:
                names.append(name)
        return names or [self.rest_set]

    def set_order(self) -> list[str]:
        names: list[str] = []
        if self.config is not None:
            for s in self.config.all_hosts:
                name = s.name or f"hosts[{s.index}]"
                if name not in names:
                    names.append(name)
        return [*names, self.rest_set]

    # ---- node states and availability

    def load_nodes(self) -> None:
        for name, first_seen in self.q("SELECT node, first_seen FROM nodes WHERE first_seen <= ? "
                                       "ORDER BY node", (self.t1,)):
            self.nodes[name] = _Node(name, float(first_seen), self.host_sets(name))
        per_node: dict[str, list[tuple[float, str, str | None, str | None, str | None]]] = \
            defaultdict(list)
        # (drained_by: schema 6; NULL for older databases and rows)
        by = "drained_by" if "drained_by" in self.columns("node_states") else "NULL"
        for node, ts, kind, reason, actor, drained_by in self.q(
                f"SELECT node, ts, kind, reason, actor, {by} FROM node_states WHERE ts <= ? "
                "ORDER BY node, ts, id", (self.t1,)):
            if node in self.nodes:
                per_node[node].append((float(ts), kind, reason, actor, drained_by))
        for node, rows in per_node.items():
            n = self.nodes[node]
            n.drains = _runs((r for r in rows if r[1] in ("drained", "resumed")), "drained")
            n.unreachable = _runs((r for r in rows if r[1] in ("unreachable", "reachable")),
                                  "unreachable")
        for node, verdict in self.q(
                "SELECT n.node, (SELECT h.verdict FROM report_history h WHERE h.node = n.node "
                "AND h.ts <= ? ORDER BY h.ts DESC LIMIT 1) FROM nodes n WHERE n.first_seen <= ?",
                (self.t0, self.t1)):
            if node in self.nodes:
                self.nodes[node].verdict_at_start = verdict
        for node, ts, verdict in self.q(
                "SELECT node, ts, verdict FROM report_history WHERE ts > ? AND ts <= ? "
                "ORDER BY node, ts", self.w):
            if node in self.nodes:
                self.nodes[node].verdicts.append((float(ts), verdict))
        for n in self.nodes.values():
            self._sweep(n)

    def _sweep(self, n: _Node) -> None:
        """Split the node's observed time (from max(from, first_seen) to ``to``) into the
        four categories, by priority drained > unreachable > degraded > healthy."""
        changes: list[tuple[float, int, bool]] = []  # (ts, flag, on); flags 0 drained 1 unr 2 fail
        for flag, runs in ((0, n.drains), (1, n.unreachable)):
            for run in runs:
                changes.append((run.start, flag, True))
                if run.end is not None:
                    changes.append((run.end, flag, False))
        previous = n.verdict_at_start
        for ts, verdict in n.verdicts:
            failing = verdict == Severity.FAIL.name
            if failing and previous != Severity.FAIL.name:
                n.fail_transitions += 1
            previous = verdict
            changes.append((ts, 2, failing))
        changes.sort(key=lambda c: c[0])
        state = [False, False, n.verdict_at_start == Severity.FAIL.name]
        start = max(self.t0, n.first_seen)
        i = 0
        while i < len(changes) and changes[i][0] <= start:  # the state when observing starts
            state[changes[i][1]] = changes[i][2]
            i += 1
        cursor = start
        for ts, flag, on in changes[i:]:
            if ts > self.t1:
                break
            self._segment(n, cursor, ts, _category(*state))
            state[flag] = on
            cursor = ts
        self._segment(n, cursor, self.t1, _category(*state))

    def _segment(self, n: _Node, a: float, b: float, category: str) -> None:
        if b <= a:
            return
        n.seconds[category] += b - a
        self.buckets.add(a, b, category)

    def availability(self) -> dict[str, Any]:
        sets: dict[str, dict[str, float]] = {name: dict.fromkeys(CATEGORIES, 0.0)
                                             for name in self.set_order()}
        set_nodes: Counter[str] = Counter()
        fleet = dict.fromkeys(CATEGORIES, 0.0)
        for n in self.nodes.values():
            for c in CATEGORIES:
                fleet[c] += n.seconds[c]
                for s in n.sets:
                    sets[s][c] += n.seconds[c]
            for s in n.sets:
                set_nodes[s] += 1

        def row(secs: dict[str, float], nodes: int) -> dict[str, Any]:
            # Every number of the row from the same rounded hours: the total is their sum
            # and the availability their ratio, so no two of them disagree on the page.
            hours = {c: _hours(secs[c]) for c in CATEGORIES}
            total = round(sum(hours.values()), 3)
            return {"nodes": nodes, "node_hours": total,
                    **{f"{c}_h": hours[c] for c in CATEGORIES},
                    "availability_pct": _pct(hours["healthy"], total)}

        worst = sorted((n for n in self.nodes.values() if n.observed_s - n.seconds["healthy"] > 0),
                       key=lambda n: (-(n.observed_s - n.seconds["healthy"]), n.name))[:TOP_N]
        return {
            "fleet": row(fleet, len(self.nodes)),
            "host_sets": [{"name": name, **row(secs, set_nodes[name])}
                          for name, secs in sets.items() if set_nodes[name] or name != self.rest_set],
            "bucket_s": int(self.buckets.size),
            "series": self.buckets.rows(),
            "worst_nodes": [{"node": n.name, "sets": n.sets,
                             **{f"{c}_h": _hours(n.seconds[c]) for c in CATEGORIES}}
                            for n in worst],
        }

    # ---- drains

    def drains(self) -> dict[str, Any]:
        decided: dict[str, list[float]] = defaultdict(list)
        for node, t in self.q("SELECT node, time FROM decisions WHERE result = 'drained' AND "
                              "time <= ? ORDER BY node, time", (self.t1 + AUTOMATION_MATCH_S,)):
            decided[node].append(float(t))
        rows: list[dict[str, Any]] = []
        for n in self.nodes.values():
            for run in n.drains:
                if run.end is not None and run.end <= self.t0:
                    continue
                end = run.end
                rows.append({
                    "node": n.name, "start": _ts(run.start), "end": _ts(end),
                    "still_drained": end is None,
                    "duration_s": _r((end if end is not None else self.t1) - run.start, 1),
                    "reason": run.reason, "reason_now": run.reason_now, "actor": run.actor,
                    **_attribute(run, decided.get(n.name, [])),
                    "resumed": end is not None,
                    "started_in_window": run.start > self.t0,
                })
        rows.sort(key=lambda r: (r["start"], r["node"]))
        started = [r for r in rows if r["started_in_window"]]
        by = Counter(r["by"] for r in started)
        return {
            "count": len(started),
            "ongoing_at_end": sum(1 for r in rows if r["still_drained"]),
            "by": {group: by[group] for group in BY_GROUPS if by[group]},
            "nodes": len({r["node"] for r in started}),
            "drains": rows[-LIST_MAX:],
            "truncated": max(0, len(rows) - LIST_MAX),
        }

    # ---- findings

    def failures(self) -> dict[str, Any]:
        by_check = [{"check_id": c, "severity": s, "count": k, "nodes": nodes}
                    for c, s, k, nodes in self.q(
                        "SELECT check_id, severity, count(*), count(DISTINCT node) FROM findings "
                        "WHERE ts > ? AND ts <= ? AND severity IN ('FAIL', 'WARN') "
                        "GROUP BY check_id, severity ORDER BY count(*) DESC, check_id, severity",
                        self.w)]
        total, nodes = self.q("SELECT count(*), count(DISTINCT node) FROM findings WHERE ts > ? "
                              "AND ts <= ? AND severity IN ('FAIL', 'WARN')", self.w)[0]
        top = self.q("SELECT node, count(*), sum(CASE WHEN severity = 'FAIL' THEN 1 ELSE 0 END) "
                     "FROM findings WHERE ts > ? "
                     "AND ts <= ? AND severity IN ('FAIL', 'WARN') GROUP BY node "
                     f"ORDER BY count(*) DESC, node LIMIT {TOP_N}", self.w)
        checks: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if top:
            marks = ",".join("?" * len(top))
            for node, check, count in self.q(
                    f"SELECT node, check_id, count(*) FROM findings WHERE ts > ? AND ts <= ? AND "
                    f"severity IN ('FAIL', 'WARN') AND node IN ({marks}) GROUP BY node, check_id "
                    "ORDER BY count(*) DESC, check_id", (*self.w, *(t[0] for t in top))):
                checks[node].append({"check_id": check, "count": count})
        return {
            "total": total, "fail": sum(r["count"] for r in by_check if r["severity"] == Severity.FAIL.name),
            "warn": sum(r["count"] for r in by_check if r["severity"] == Severity.WARN.name),
            "nodes": nodes, "by_check": by_check,
            "top_nodes": [{"node": node, "count": count, "fail": int(fails or 0),
                           "checks": checks[node]} for node, count, fails in top],
        }

    def xids(self, settings: Settings) -> dict[str, Any]:
        from slurmgpu.xid import XidPolicy, catalog

        policy = XidPolicy(settings.xid.overrides, settings.xid.unknown_action)
        known = catalog()
        # One pass over the window's XID events, by code, node and GPU; every number below
        # is summed from it (as its own GROUP BY over the events would count it).
        count_of: Counter[Any] = Counter()
        node_counts: dict[Any, Counter[str]] = defaultdict(Counter)
        gpus_of: dict[Any, set[str]] = defaultdict(set)
        for code, node, gpu, count in self.q(
                "SELECT data, node, gpu, count(*) FROM events WHERE kind = 'xid' AND ts > ? AND "
                "ts <= ? GROUP BY data, node, gpu", self.w):
            count_of[code] += count
            node_counts[code][node] += count
            gpus_of[code].add(f"{node}/{'' if gpu is None else gpu}")  # node || '/' || gpu
        codes = []
        for code in sorted(count_of, key=lambda c: (-count_of[c], _sql_order(c))):
            if code is None:
                meaning, category, action = "XID number not recorded", "unknown", None
            else:
                rule = policy.rule(int(code))
                base = known.get(int(code))
                meaning = base.name if base else rule.name
                category, action = rule.category, rule.action
            top = sorted(node_counts[code].items(), key=lambda i: (-i[1], i[0]))[:TOP_N]
            codes.append({"xid": code, "count": count_of[code], "nodes": len(node_counts[code]),
                          "gpus": len(gpus_of[code]), "meaning": meaning, "category": category,
                          "action": action,
                          "top_nodes": [{"node": node, "count": count} for node, count in top]})
        return {"total": sum(c["count"] for c in codes),
                "nodes": len({node for counts in node_counts.values() for node in counts}),
                "codes": codes}

    # ---- counters

    def _rows_at(self, table: str, key: str, columns: Sequence[str], t: float,
                 *, first_after: float | None = None) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """{(node, key): (ts, *columns)}: each key's last row with ts <= t (or, with
        ``first_after``, its first row with first_after < ts <= t). (Standard SQL, for both
        backends: SQLite's bare columns beside max() are not PostgreSQL's.)"""
        agg = "min" if first_after is not None else "max"
        cols = ", ".join(f"t.{c}" for c in columns)
        where = "ts > ? AND ts <= ?" if first_after is not None else "ts <= ?"
        params = (first_after, t) if first_after is not None else (t,)
        return {(row[0], row[1]): tuple(row[2:])
                for row in self.q(f"SELECT t.node, t.{key}, t.ts, {cols} FROM {table} t JOIN (SELECT node, "
                                  f"{key} AS k, {agg}(ts) AS ts FROM {table} WHERE {where} GROUP BY node, "
                                  f"{key}) m ON t.node = m.node AND t.{key} = m.k AND t.ts = m.ts", params)}

    def _rises(self, table: str, key: str, counters: Sequence[str], extra: Sequence[str]
               ) -> tuple[dict[tuple[Any, ...], dict[str, int]], dict[tuple[Any, ...], dict[str, Any]],
                          dict[tuple[Any, ...], dict[str, Any]]]:
        """(rises, now, baselines): each counter's rise over the window per key (only
        keys with one), every key's row at ``to`` and the rising keys' baseline rows
        (at ``from``, or the first in the window)."""
        names = ("ts", *counters, *extra)
        rows = self._rows_at(table, key, names[1:], self.t1)
        now = {k: dict(zip(names, row, strict=True)) for k, row in rows.items()}
        base = self._rows_at(table, key, counters, self.t0)  # (baselines: the counters only)
        changed = {k for k, row in rows.items() if row[0] > self.t0}
        first = self._rows_at(table, key, counters, self.t1, first_after=self.t0) \
            if any(k not in base for k in changed) else {}
        starts = {k: b for k in changed if (b := base.get(k) or first.get(k)) is not None}
        rises = self._chained_rises(table, key, counters, starts)
        baselines = {k: dict(zip(("ts", *counters), starts[k], strict=True)) for k in rises}
        return rises, now, baselines

    def _chained_rises(self, table: str, key: str, counters: Sequence[str],
                       starts: dict[tuple[Any, ...], tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, int]]:
        """Each counter's rise over the window, row after row from ``starts`` (the rows at
        ``from``, or the first in the window): a counter that went down was reset (a GPU
        reset, a driver reload) and counts from 0, so errors before a reset in the window
        are counted too."""
        last = {k: list(row[1:]) for k, row in starts.items()}
        rises: dict[tuple[Any, ...], dict[str, int]] = {}
        for node, k2, *values in self.q(f"SELECT node, {key}, {', '.join(counters)} FROM {table} "
                                        f"WHERE ts > ? AND ts <= ? ORDER BY node, {key}, ts", self.w):
            k = (node, k2)
            before = last.get(k)
            if before is None:
                continue
            for i, (c, after) in enumerate(zip(counters, values, strict=True)):
                if after is None:
                    continue
                delta = after if before[i] is None or after < before[i] else after - before[i]
                if before[i] is not None and delta > 0:
                    rises.setdefault(k, {})[c] = rises.get(k, {}).get(c, 0) + int(delta)
                before[i] = after
        return rises

    def ecc(self) -> dict[str, Any]:
        rises, now, baselines = self._rises("gpu_counters", "gpu", ECC_COUNTERS,
                                            ("serial", "model", "remap_pending", "remap_failure"))

        def rank(k: tuple[Any, ...]) -> tuple[int, int, int, str, int]:
            r = rises[k]
            return (-(r.get("ecc_uncorrected", 0) + r.get("remap_uncorrected", 0)),
                    -r.get("remap_corrected", 0), -r.get("ecc_corrected", 0), k[0], k[1])

        ordered = sorted(rises, key=rank)
        gpus = []
        for k in ordered[:ECC_MAX_GPUS]:
            cur = now[k]
            counter = max(rises[k], key=lambda c: (rises[k][c], -ECC_COUNTERS.index(c)))
            gpus.append({
                "node": k[0], "gpu": k[1], "serial": cur["serial"], "model": cur["model"],
                "rise": {c: rises[k].get(c, 0) for c in ECC_COUNTERS},
                "now": {c: cur[c] for c in ECC_COUNTERS},
                "remap_pending": bool(cur["remap_pending"]), "remap_failure": bool(cur["remap_failure"]),
                "series_counter": counter,
                "series": self._series(k, counter, baselines[k].get(counter), cur[counter]),
            })
        flagged = [{"node": k[0], "gpu": k[1], "serial": row["serial"], "model": row["model"],
                    "remap_pending": bool(row["remap_pending"]),
                    "remap_failure": bool(row["remap_failure"]), "since": _ts(row["ts"])}
                   for k, row in sorted(now.items())
                   if row["remap_pending"] or row["remap_failure"]]
        return {"gpus_rising": len(rises), "gpus": gpus,
                "truncated": max(0, len(rises) - ECC_MAX_GPUS), "remap_flags": flagged}

    def _series(self, k: tuple[Any, ...], counter: str, before: Any, after: Any
                ) -> list[list[float]]:
        rows = self.q(f"SELECT ts, {counter} FROM gpu_counters WHERE node = ? AND gpu = ? AND "
                      "ts > ? AND ts <= ? AND " + counter + " IS NOT NULL ORDER BY ts",
                      (k[0], k[1], *self.w))
        if len(rows) > SERIES_MAX_POINTS:
            step = len(rows) / (SERIES_MAX_POINTS - 1)
            rows = [rows[int(i * step)] for i in range(SERIES_MAX_POINTS - 1)] + [rows[-1]]
        points = [[_ts(self.t0) or 0.0, before]] if before is not None else []
        points += [[_ts(ts) or 0.0, v] for ts, v in rows]
        if after is not None:
            points.append([_ts(self.t1) or 0.0, after])
        return points

    def start_throttling(self) -> None:
        """Start the throttling scan (every node's hourly samples of the window: the
        report's longest query) beside the other sections, when the database is a file
        (and ``db`` holds no uncommitted rows another connection would not see): in up
        to THROTTLE_PARTS node ranges at once. (SQLite only: PostgreSQL runs its own
        parallel scans, and its snapshot is the one connection's.)"""
        if not isinstance(self.db, sqlite3.Connection):
            return
        if self._throttle or self.db.in_transaction or not database_file(self.db):
            return
        parts = max(1, min(THROTTLE_PARTS, os.cpu_count() or 1))
        names = [str(r[0]) for r in self.q("SELECT node FROM nodes WHERE node IS NOT NULL "
                                           "ORDER BY node")]
        cuts = sorted({names[len(names) * i // parts] for i in range(1, parts)} if names else set())
        edges: list[str | None] = [None, *cuts, None]
        for first, stop in pairwise(edges):
            self._throttle.append(BackgroundQuery(self.db, *_throttle_query(first, stop, self.w)))

    def close(self) -> None:
        """Stop background queries still running (the report failed before its section)."""
        for query in self._throttle:
            query.cancel()
        self._throttle = []

    def throttling(self) -> dict[str, Any]:
        if self._throttle:
            found = [row for query in self._throttle for row in query.result()]
            self._throttle = []
        else:
            found = self.q(*_throttle_query(None, None, self.w))
        sampled = total = hw = sw = 0
        per: list[dict[str, Any]] = []
        for kind, node, *values in found:
            if kind == "total":  # one per node range
                sampled, total, hw, sw = (old + (v or 0) for old, v in
                                          zip((sampled, total, hw, sw), values, strict=True))
                continue
            reports, h, s, _ = values
            per.append({"node": node, "reports": reports, "hw_slowdown_reports": h,
                        "sw_thermal_reports": s, "hw_slowdown_pct": _pct(h, reports),
                        "sw_thermal_pct": _pct(s, reports)})
        return {
            "reports": total, "hw_slowdown_reports": hw, "sw_thermal_reports": sw,
            "hw_slowdown_pct": _pct(hw, total), "sw_thermal_pct": _pct(sw, total),
            "nodes_sampled": sampled, "nodes_throttled": len(per),
            "leaders_hw": sorted((p for p in per if p["hw_slowdown_reports"]),
                                 key=lambda p: (-p["hw_slowdown_pct"], p["node"]))[:TOP_N],
            "leaders_sw": sorted((p for p in per if p["sw_thermal_reports"]),
                                 key=lambda p: (-p["sw_thermal_pct"], p["node"]))[:TOP_N],
        }

    def ib(self) -> dict[str, Any]:
        rises, now, _ = self._rises("ib_counters", "port", IB_COUNTERS, ("state", "rate_gbps"))
        marks = ",".join("?" * len(IB_FINDING_CHECKS))
        flaps: dict[tuple[Any, ...], int] = {}
        for node, subject, count in self.q(
                f"SELECT node, coalesce(subject, ''), count(*) FROM findings WHERE ts > ? AND "
                f"ts <= ? AND check_id IN ({marks}) GROUP BY node, subject",
                (*self.w, *IB_FINDING_CHECKS)):
            flaps[(node, subject)] = count
        ports = []
        for k in set(rises) | set(flaps):
            cur = now.get(k, {})
            rise = rises.get(k, {})
            ports.append({"node": k[0], "port": k[1] or None, "rise": rise,
                          "rise_total": sum(rise.values()), "flap_findings": flaps.get(k, 0),
                          "state": cur.get("state"), "rate_gbps": cur.get("rate_gbps")})
        ports.sort(key=lambda p: (-p["flap_findings"], -p["rise_total"], p["node"], p["port"] or ""))
        return {"ports_rising": len(rises), "ports_flapping": len(flaps),
                "ports": ports[:LIST_MAX], "truncated": max(0, len(ports) - LIST_MAX)}

    # ---- versions

    def versions(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        cols = ("gpu_model", "driver", "cuda", "nccl", "vbios", "ib_firmware", "ofed", "kernel")
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in self.q(f"SELECT v.node, v.ts, {', '.join(f'v.{c}' for c in cols)} FROM node_versions v "
                          "JOIN (SELECT node, max(ts) AS ts FROM node_versions WHERE ts <= ? GROUP BY node) "
                          "m ON v.node = m.node AND v.ts = m.ts", (self.t1,)):
            out[(row[0],)] = dict(zip(cols, row[2:], strict=True))
        return out

    def pin_drift(self, versions: dict[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
        from slurmgpu.config.versions_match import match_any

        fields: dict[str, Any] = {}
        off_nodes: set[str] = set()
        off_pin: dict[tuple[Any, tuple[str, ...]], bool] = {}  # (version, pins) -> off them
        pinned = False
        for column, pin_key in PIN_FIELDS.items():
            counts: Counter[str] = Counter()
            off_counts: Counter[str] = Counter()
            off: list[dict[str, Any]] = []
            unreported = 0
            for name in self.nodes:
                value = versions.get((name,), {}).get(column)
                if value is None or value == "":
                    unreported += 1
                    continue
                counts[value] += 1
                pins = list(getattr(self.settings(name).pins, pin_key))
                pinned = pinned or bool(pins)
                key = (value, tuple(pins))
                if key not in off_pin:  # the same few versions and pins over the fleet
                    parts = [p.strip() for p in str(value).split(",") if p.strip()]
                    off_pin[key] = bool(pins) and not all(match_any(p, pins) for p in parts)
                if off_pin[key]:
                    off_counts[value] += 1
                    off.append({"node": name, "version": value, "pins": pins})
                    off_nodes.add(name)
            fields[column] = {
                "pin_key": f"pins.{pin_key}",
                "versions": [{"version": v, "nodes": c, "off_pin": off_counts[v]}
                             for v, c in sorted(counts.items(), key=lambda i: (-i[1], i[0]))],
                "not_reported": unreported,
                "off_pin": off[:LIST_MAX],
                "off_pin_count": len(off),
            }
        by_nodes = self.pin_findings()
        off_nodes |= {f["node"] for f in by_nodes}
        judged = pinned or self.nodes_reported()
        return {"nodes_off_pin": len(off_nodes) if judged else None, "fields": fields,
                "by_nodes": by_nodes[:LIST_MAX], "by_nodes_count": len(by_nodes),
                "off_pin_nodes": sorted(off_nodes), "config_pins": pinned,
                "judged": _pins_judged(pinned, judged)}

    def pin_findings(self) -> list[dict[str, Any]]:
        """The nodes' own non-OK ``pin.*`` findings in their state at the window's end (the
        latest ``report_history`` row): judged with each node's own ``[pins]``."""
        rows = self.q("SELECT f.node, f.check_id, f.severity, f.gpu, f.message FROM findings f "
                      "JOIN (SELECT node, max(ts) AS ts FROM report_history WHERE ts <= ? "
                      "GROUP BY node) m ON f.node = m.node AND f.ts = m.ts "
                      "WHERE f.check_id LIKE 'pin.%' AND f.severity IN ('FAIL', 'WARN') "
                      "ORDER BY f.node, f.check_id, f.gpu", (self.t1,))
        return [{"node": node, "check": check, "severity": severity, "gpu": gpu, "message": message}
                for node, check, severity, gpu, message in rows if node in self.nodes]

    def nodes_reported(self) -> bool:
        """Whether any node's state (its checks, pins included) is known at the window's end."""
        return bool(self.q("SELECT 1 FROM report_history WHERE ts <= ? LIMIT 1", (self.t1,)))

    # ---- jobs

    def jobs(self) -> dict[str, Any]:
        import msgpack

        blocked = []
        for node, ts, body in self.q("SELECT node, ts, body FROM events WHERE kind = "
                                     "'prolog_blocked' AND ts > ? AND ts <= ? ORDER BY ts", self.w):
            job = action = None
            try:
                data = msgpack.unpackb(body, raw=False) if body else {}
                if isinstance(data, dict) and data.get("job_id") is not None:
                    job = str(data["job_id"])
                if isinstance(data, dict) and isinstance(data.get("action"), str):
                    action = data["action"]
            except Exception:  # a damaged body still counts as a blocked prolog
                job = None
            blocked.append({"node": node, "ts": _ts(ts), "job_id": job, "action": action})
        requests = self.q("SELECT job_id, action, state, requested, acked_at FROM checkpoints "
                          "WHERE requested > ? AND requested <= ?", self.w)
        acks = sorted(float(a) - float(r) for _, _, _, r, a in requests if a is not None)
        requeues = self.q("SELECT job_id FROM job_events WHERE kind = 'requeued' AND ts > ? AND "
                          "ts <= ?", self.w)
        by_collector = {str(r[0]) for r in requeues}
        # Slurm requeues a job whose prolog exits non-zero: every prolog_blocked event is
        # one (the agent sends it only then; see slurmgpu.agent.gatelog for the full path).
        by_prolog = {b["job_id"] for b in blocked if b["job_id"]}
        return {
            "prolog_blocked": {"events": len(blocked),
                               "jobs": len({b["job_id"] for b in blocked if b["job_id"]}),
                               "nodes": len({b["node"] for b in blocked}),
                               "recent": blocked[-50:]},
            "checkpoints": {"requests": len(requests), "jobs": len({r[0] for r in requests}),
                            "by_action": dict(sorted(Counter(r[1] for r in requests).items())),
                            "by_state": dict(sorted(Counter(r[2] for r in requests).items()))},
            "requeued": {"events": len(requeues), "jobs": len(by_collector | by_prolog),
                         "checkpoint_jobs": len(by_collector), "prolog_jobs": len(by_prolog)},
            "ack": {"count": len(acks),
                    "p50_s": _r(statistics.median(acks), 2) if acks else None,
                    "max_s": _r(acks[-1], 2) if acks else None,
                    "no_ack": sum(1 for r in requests if r[4] is None and r[2] != "open"),
                    "open": sum(1 for r in requests if r[4] is None and r[2] == "open")},
        }


def _pins_judged(config_pins: bool, judged: bool) -> str:
    """How pin drift was judged, in a sentence for the report."""
    if not judged:
        return ("not judged: the report's config has no [pins] and no node has reported "
                "its own pin checks")
    nodes = "by the nodes' own pin.* checks (each node's [pins])"
    if config_pins:
        return f"{nodes}, and versions against the report config's [pins]"
    return f"{nodes} only: the report's config has no [pins] to compare versions with"
