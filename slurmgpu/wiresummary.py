"""The wire's checks of a report's ``summary`` (the format: ``slurmgpu.summary``): what
the collector's fleet history turns into table rows and in-memory keys, so every row,
key and value is bounded, and each value is of the kind of the store column it goes to
(a value PostgreSQL would refuse there, such as 'abc' or 1e300 in a BIGINT column or
text with NUL, is refused here; SQLite would have taken it). Unpacked and checked once
per distinct summary bytes (~600 bytes, a few microseconds). ``slurmgpu.wire`` calls it
and re-exports its bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

import msgpack

from slurmgpu.errors import WireError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what SQLite can bind
MAX_GPUS = 1024  # GPU indices are 0..MAX_GPUS-1, at most MAX_GPUS distinct per message
MAX_IB_PORTS = 256
MAX_SHORT = 256  # versions, subjects, port names, summary strings
MAX_SUMMARY_ROW = 64  # values per summary row (GPU_FIELDS, IB_FIELDS: < 12 today)


def short(value: Any) -> str:
    """repr() of an untrusted value, bounded for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: Any, low: int, high: int) -> TypeGuard[int]:
    """A real int (not a bool) in [low, high]."""
    return type(value) is int and low <= value <= high


def is_str(value: Any, limit: int, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, str) and len(value) <= limit


def validate_summary(summary: dict[str, Any] | bytes) -> None:
    """A report's ``summary`` (a map, or msgpack bytes of one) within the bounds."""
    if isinstance(summary, bytes):
        # A node's summary rarely changes between reports: remember the bytes that passed
        # (a pure function of them), bounded in bytes (summaries can be up to a frame's
        # size), so the common case is one set lookup.
        if summary in _GOOD_SUMMARIES.items:
            return
        _validate_packed_summary(summary)
        _GOOD_SUMMARIES.add(summary)
        return
    _validate_summary_map(summary)


class _BoundedBytesSet:
    """A set of bytes holding at most ``max_bytes`` in all; emptied when full."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.items: set[bytes] = set()
        self.size = 0

    def add(self, value: bytes) -> None:
        if self.size + len(value) > self.max_bytes:
            self.items.clear()
            self.size = 0
        if len(value) <= self.max_bytes:
            self.items.add(value)
            self.size += len(value)


# ~600 bytes a summary: ~27,000 nodes' summaries; a node sending a new 1 MiB summary in
# every report clears it every 16 reports, at no cost but re-validation.
_GOOD_SUMMARIES = _BoundedBytesSet(16 << 20)


def _validate_packed_summary(packed: bytes) -> None:
    try:
        summary = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"report: summary is not msgpack: {type(exc).__name__}") from None
    _validate_summary_map(summary)


def _validate_summary_map(summary: Any) -> None:
    if not isinstance(summary, dict):
        raise WireError("report: summary is not a map")
    gpus, ports, versions = summary.get("gpus"), summary.get("ib"), summary.get("versions")
    _summary_rows(gpus, MAX_GPUS, "gpus", _gpu_key, _GPU_COLUMNS)
    _summary_rows(ports, MAX_IB_PORTS, "ib", _port_key, _IB_COLUMNS)
    if versions is not None:
        if not isinstance(versions, list) or len(versions) > MAX_SUMMARY_ROW:
            raise WireError("report: summary versions is not a short list")
        _columns(versions, _VERSION_COLUMNS)


def _gpu_key(value: Any) -> bool:
    return is_int(value, 0, MAX_GPUS - 1)


def _port_key(value: Any) -> bool:
    return is_str(value, MAX_SHORT) and "\x00" not in value


def _summary_rows(rows: Any, limit: int, name: str, key_ok: Callable[[Any], bool],
                  columns: tuple[frozenset[type], ...]) -> None:
    """At most ``limit`` rows ``[key, *values]`` with distinct, valid keys, their values
    of their ``columns``' kinds."""
    if rows is None:
        return
    if not isinstance(rows, list) or len(rows) > limit:
        raise WireError(f"report: summary {name} is not a list of at most {limit} rows")
    keys: set[Any] = set()
    for row in rows:
        if not isinstance(row, list) or not row or len(row) > MAX_SUMMARY_ROW \
                or not key_ok(row[0]) or row[0] in keys:
            raise WireError(f"report: bad or repeated summary {name} row")
        keys.add(row[0])
        _columns(row[1:], columns)


# The kind of the store's column each summary value goes to (slurmgpu.summary's fields,
# in order; the fleet history's gpu_counters, ib_counters and node_versions tables): a
# value of another kind is one PostgreSQL would refuse there ('abc' in a BIGINT column,
# 1e300 in a BIGINT column, text with NUL). Values past the known ones are not stored.
_TEXT, _INTEGER, _REAL = frozenset({str}), frozenset({int, bool}), frozenset({int, float, bool})
_GPU_COLUMNS = (_TEXT, _TEXT, *[_INTEGER] * 6)
_IB_COLUMNS = (_TEXT, _REAL, *[_INTEGER] * 6)
_VERSION_COLUMNS = (_TEXT,) * 8
_KIND_NAMES = {_TEXT: "text", _INTEGER: "integer", _REAL: "number"}


def _columns(values: list[Any], columns: tuple[frozenset[type], ...]) -> None:
    """Summary values within the bounds (``_scalars``), each None or of its column's kind."""
    _scalars(values)
    for value, kinds in zip(values, columns, strict=False):
        if value is not None and type(value) not in kinds:
            raise WireError(f"report: summary value {short(value)} is no {_KIND_NAMES[kinds]}")


def _scalars(values: list[Any]) -> None:
    """Summary values: None, bool, an int64, a finite float or a short string. (Inline
    type dispatch: ~150 values per report, on the ingest hot path.)"""
    for v in values:
        t = type(v)
        if t is int:
            if INT64_MIN <= v <= INT64_MAX:
                continue
        elif t is str:
            if len(v) <= MAX_SHORT and "\x00" not in v:
                continue
        elif t is float:
            if math.isfinite(v):
                continue
        elif v is None or t is bool:
            continue
        raise WireError(f"report: summary value {short(v)} out of range")
