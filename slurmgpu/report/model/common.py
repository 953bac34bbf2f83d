"""The report model's constants and building blocks: rounding, and each node's drains and
unreachable periods (``_Run``), its observed time by category (``_Node``, ``_Buckets``),
and who drained it (``_attribute``)."""

from __future__ import annotations

import math
import sqlite3
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.decision import REASON_PREFIX, reason_actor
from slurmgpu.report.model.window import DAY, HOUR

# The tables the report reads first appear in migration 4 (slurmgpu/collector/store/schema.py).
MIN_SCHEMA_VERSION = 4
CATEGORIES = ("healthy", "degraded", "drained", "unreachable")
# Drains recorded before schema 6 (no node_states.drained_by) are guessed as before: the
# automation's when a `decisions` row (result 'drained', same node) lies within this many
# seconds of the drain's start.
AUTOMATION_MATCH_S = 120.0
HOOKS = ("prolog", "epilog", "healthcheck")
# node_states.drained_by -> drains[].by (the hooks are one group, "hook")
BY_GROUPS = ("automation", "hook", "operator", "outside", "slurmgpu")
TOP_N = 10
ECC_MAX_GPUS = 50
SERIES_MAX_POINTS = 60
LIST_MAX = 200
ECC_COUNTERS = ("ecc_corrected", "ecc_uncorrected", "remap_corrected", "remap_uncorrected")
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
IB_FINDING_CHECKS = ("ib.flap",)
# node_versions column -> [pins] key it is matched against (`cuda` holds the driver's
# CUDA version, which [pins] calls cuda_driver).
PIN_FIELDS = {"driver": "driver", "cuda": "cuda_driver", "nccl": "nccl", "vbios": "vbios",
              "ib_firmware": "ib_firmware"}
SERVICE_REASON_CHECKS = ("xid.recent", "gpu.lost")
OTHER_SET = "other"
ALL_SET = "all nodes"  # the one host set of a config without [[hosts]]
# Chart bucket by window length: (longest window, bucket).
BUCKETS = ((3 * HOUR, 300.0), (2 * DAY, HOUR), (math.inf, DAY))


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def _hours(seconds: float, digits: int = 3) -> float:
    return round(seconds / HOUR, digits)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole > 0 else None


def _ts(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)



# --------------------------------------------------------------------------- node state


@dataclass
class _Run:
    """A drain or unreachable period: ``start`` .. ``end`` (None: still on at ``to``)."""

    start: float
    end: float | None = None
    reason: str | None = None
    reason_now: str | None = None
    actor: str | None = None
    drained_by: str | None = None  # node_states.drained_by of the first row (schema >= 6)


@dataclass
class _Node:
    name: str
    first_seen: float
    sets: list[str] = field(default_factory=list)
    drains: list[_Run] = field(default_factory=list)
    unreachable: list[_Run] = field(default_factory=list)
    verdict_at_start: str | None = None
    verdicts: list[tuple[float, str]] = field(default_factory=list)  # in the window
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    fail_transitions: int = 0

    @property
    def observed_s(self) -> float:
        return sum(self.seconds.values())


def _runs(rows: Iterable[tuple[float, str, str | None, str | None, str | None]],
          on: str) -> list[_Run]:
    """Transition rows (ts, kind, reason, actor, drained_by) of one pair of kinds ->
    periods. A repeated ``on`` row while on (a drain whose reason changed) continues the
    period."""
    runs: list[_Run] = []
    current: _Run | None = None
    for ts, kind, reason, actor, drained_by in rows:
        if kind == on:
            if current is None:
                current = _Run(ts, None, reason, reason, actor, drained_by)
                runs.append(current)
            else:
                current.reason_now = reason
        elif current is not None:
            current.end = ts
            current = None
    return runs


class BackgroundQuery:
    """One read query on a connection of its own to the same database file, run in a
    thread: SQLite leaves the GIL while it steps, so a long scan runs beside the report's
    other queries and Python on another core. ``result()`` waits for its rows (or raises
    its error); ``cancel()`` interrupts it."""

    def __init__(self, db: sqlite3.Connection, sql: str, params: Sequence[Any]) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self._error: BaseException | None = None
        self._db = connect_readonly(db)
        self._thread = threading.Thread(target=self._run, args=(sql, tuple(params)),
                                        name="slurmgpu-report-query", daemon=True)
        self._thread.start()

    def _run(self, sql: str, params: tuple[Any, ...]) -> None:
        try:
            self._rows = self._db.execute(sql, params).fetchall()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> list[tuple[Any, ...]]:
        self._thread.join()
        self._db.close()
        if self._error is not None:
            raise self._error
        return self._rows

    def cancel(self) -> None:
        self._db.interrupt()
        self._thread.join()
        self._db.close()


def database_file(db: sqlite3.Connection) -> str:
    """The file of ``db``'s main database ("" for an in-memory or temporary one)."""
    for _, name, file in db.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(file or "")
    return ""


def connect_readonly(db: sqlite3.Connection) -> sqlite3.Connection:
    """A second read-only connection to ``db``'s file (usable from another thread)."""
    from pathlib import Path
    from urllib.parse import quote

    uri = f"file:{quote(str(Path(database_file(db)).resolve()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=10.0, check_same_thread=False)


class _Buckets:
    """Fleet node-seconds per category in fixed UTC-aligned buckets (the chart)."""

    def __init__(self, t0: float, t1: float) -> None:
        self.size = next(size for longest, size in BUCKETS if t1 - t0 <= longest)
        self.base = (t0 // self.size) * self.size
        self.t0, self.t1 = t0, t1
        count = max(1, math.ceil((t1 - self.base) / self.size))
        self.seconds = [dict.fromkeys(CATEGORIES, 0.0) for _ in range(count)]

    def add(self, a: float, b: float, category: str) -> None:
        """Add ``a``..``b`` to the buckets it spans, bucket by bucket in time order: the
        piece in ``a``'s bucket, ``size`` to each whole one (bucket edges are whole
        numbers: exactly ``size`` apart), the piece in ``b``'s."""
        base, size, seconds = self.base, self.size, self.seconds  # (the report's hot loop)
        i, last = int((a - base) // size), len(seconds)
        if a >= b or i >= last:
            return
        edge = base + (i + 1) * size
        if edge >= b or i < 0:  # within a bucket (or before the first: as it always was)
            while a < b and i < last:
                edge = min(b, base + (i + 1) * size)
                seconds[i][category] += edge - a
                a, i = edge, i + 1
            return
        seconds[i][category] += edge - a
        j = min(int((b - base) // size), last)  # b's bucket
        for bucket in seconds[i + 1:j]:
            bucket[category] += size
        if j < last and b > base + j * size:
            seconds[j][category] += b - (base + j * size)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, secs in enumerate(self.seconds):
            start = max(self.t0, self.base + i * self.size)
            end = min(self.t1, self.base + (i + 1) * self.size)
            if end <= start:
                continue
            # (4 decimals: a 5-minute bucket's shares stay right to 0.1 %)
            out.append({"start": _ts(start), "end": _ts(end),
                        **{f"{c}_h": _hours(secs[c], 4) for c in CATEGORIES}})
        return out


def _category(drained: bool, unreachable: bool, failing: bool) -> str:
    if drained:
        return "drained"
    if unreachable:
        return "unreachable"
    return "degraded" if failing else "healthy"



def _attribute(run: _Run, decided: list[float]) -> dict[str, Any]:
    """Who drained: ``by`` (a ``BY_GROUPS`` group), ``hook`` (which one, or None),
    ``drained_by`` (the text shown) and ``attribution``: ``recorded`` (the collector
    recorded the actor when it saw the drain: node_states.drained_by), ``reason`` (read
    from the reason: a row from before schema 6, outside slurmgpu or with an actor tag)
    or ``guessed`` (such a row with an untagged slurmgpu reason: the automation's when
    one of its drain decisions lies within AUTOMATION_MATCH_S, else a hook's)."""
    source, attribution = run.drained_by, "recorded"
    tagged = reason_actor(run.reason)
    if source is None:
        attribution = "reason"
        if not (run.reason or "").startswith(REASON_PREFIX):
            source = "outside"
        elif tagged is not None:
            source = tagged[0]
        else:
            attribution = "guessed"
            i = bisect_left(decided, run.start - AUTOMATION_MATCH_S)
            near = i < len(decided) and decided[i] <= run.start + AUTOMATION_MATCH_S
            source = "automation" if near else "hook"
    hook = source if source in HOOKS else None
    by = "hook" if hook is not None or source == "hook" else source
    if by not in BY_GROUPS:  # a value this report does not know: say so, count it apart
        by = "slurmgpu" if (run.reason or "").startswith(REASON_PREFIX) else "outside"
    if by == "automation":
        text = "slurmgpu automation"
    elif by == "hook":
        text = f"slurmgpu {hook}" if hook else "slurmgpu (node hook)"
    elif by == "operator":
        login = tagged[1] if tagged is not None and tagged[1] else run.actor
        text = f"operator {login or '(unknown)'} (slurmgpu drain)"
    elif by == "outside":
        text = f"{run.actor or '(unknown)'} (outside slurmgpu)"
    else:
        text = "slurmgpu (who not recorded)"
    if attribution == "guessed":
        text += " (guessed)"
    return {"by": by, "hook": hook, "drained_by": text, "attribution": attribution}
