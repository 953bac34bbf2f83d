"""Formatting shared by the HTML and Markdown renderers."""

from __future__ import annotations

from datetime import UTC, datetime


def when(ts: float | None) -> str:
    """Unix seconds -> ``2024-05-01 12:00Z`` (UTC), ``-`` for None."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")


def day(ts: float, hourly: bool) -> str:
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.strftime("%H:00") if hourly else dt.strftime("%m-%d")


def duration(seconds: float | None) -> str:
    """``3h 05m``, ``2d 4h``, ``45s``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def mtbf(value: float | None) -> str:
    return "∞" if value is None else f"{value:,.0f} h"
