"""The report's window: ``--since``, ``--from``, ``--to`` -> (from, to) in Unix seconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from slurmgpu.errors import SlurmGpuError

HOUR = 3600.0
DAY = 86400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": HOUR, "d": DAY, "w": 7 * DAY}


class ReportError(SlurmGpuError):
    """Bad window, missing or too old database: one line for the user."""


def parse_duration(text: str) -> float:
    """``90m``, ``24h``, ``7d`` (also ``s``, ``w``) -> seconds (> 0)."""
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ReportError(f"bad duration {text!r} (want a number and a unit: 90m, 24h, 7d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_time(text: str, option: str = "time") -> float:
    """ISO 8601 (``2024-05-01``, ``2024-05-01T12:00``, ``...Z``, ``...+02:00``) -> Unix
    seconds; a time without a zone is UTC."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(f"bad {option} {text!r} (want ISO 8601, e.g. 2024-05-01T12:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def resolve_window(since: str | None, start: str | None, end: str | None,
                   now: float) -> tuple[float, float]:
    """(from, to) in Unix seconds. ``--since`` (default 24h) ends at ``--to`` or now;
    ``--from`` with ``--to`` (or now) is the explicit window; ``--since`` and ``--from``
    together are an error."""
    if since is not None and start is not None:
        raise ReportError("--since and --from exclude each other")
    t1 = parse_time(end, "--to") if end is not None else now
    t0 = parse_time(start, "--from") if start is not None else t1 - parse_duration(since or "24h")
    if t0 >= t1:
        raise ReportError(f"empty window: from {iso(t0)} is not before to {iso(t1)}")
    return t0, t1


def iso(ts: float) -> str:
    """Unix seconds -> ``2024-05-01T12:00:00Z``."""
    dt = datetime.fromtimestamp(ts, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + "Z"
