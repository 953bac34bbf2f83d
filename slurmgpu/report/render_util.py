"""Formatting shared by the HTML and Markdown renderers."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime


def when(ts: float | None) -> str:
    """Unix seconds -> ``2024-05-01 12:00Z`` (UTC), ``-`` for None."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")


def day(ts: float, bucket_s: float) -> str:
    """A chart bucket's label: ``06-30`` for days, ``14:00`` / ``14:05`` within a day."""
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.strftime("%m-%d") if bucket_s >= 86400 else dt.strftime("%H:%M")


def per(bucket_s: float) -> str:
    """``hour``, ``day``, ``5 minutes``: what one chart bucket is."""
    if bucket_s >= 86400:
        return "day" if bucket_s == 86400 else f"{bucket_s / 86400:g} days"
    if bucket_s >= 3600:
        return "hour" if bucket_s == 3600 else f"{bucket_s / 3600:g} hours"
    return f"{bucket_s / 60:g} minutes"


def hours(value: float | None) -> str:
    """Hours (node-hours, MTBF) in the unit that fits: under 2 h in minutes (``0 min``,
    ``<1 min``, ``14 min``), under 100 h with one decimal (``3.5 h``), else whole hours
    (``1,234 h``)."""
    if value is None:
        return "-"
    if value < 2:
        minutes = value * 60
        if minutes <= 0:
            return "0 min"
        return "<1 min" if minutes < 0.5 else f"{max(1, round(minutes))} min"
    if value < 99.95:
        return f"{value:.1f} h"
    return f"{value:,.0f} h"


def axis(top: float) -> tuple[float, float, str]:
    """A chart's value axis for data up to ``top`` hours (> 0): (axis maximum in hours,
    hours per axis unit, unit): node-hours from 2 h, else node-minutes, else node-seconds;
    the maximum rounded up to 1, 2, 2.5 or 5 times a power of ten of that unit."""
    if top >= 2:
        scale, unit = 1.0, "node-h"
    elif top * 60 >= 1:
        scale, unit = 1 / 60, "node-min"
    else:
        scale, unit = 1 / 3600, "node-s"
    value = top / scale
    power = 10.0 ** math.floor(math.log10(value))
    nice = next(m * power for m in (1, 2, 2.5, 5, 10) if value <= m * power * (1 + 1e-9))
    return nice * scale, scale, unit


def tick(value: float) -> str:
    """An axis label: ``2.5``, ``20``, ``1,000``."""
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 else f"{value:,.2f}".rstrip("0")


def duration(seconds: float | None) -> str:
    """A span in the unit that fits: ``45 s``, under 2 h in minutes (``14 min``,
    ``90 min``), under 2 days ``3h 05m``, else ``2d 4h``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 7200:
        return f"{round(s / 60)} min"
    if s < 2 * 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def span(seconds: float) -> str:
    """A configured window in words: ``7 days``, ``1 day``, ``6 h``, ``30 min``, ``45 s``."""
    for unit, name in ((86400, "day"), (3600, "h"), (60, "min")):
        if seconds >= unit and seconds % unit == 0:
            count = int(seconds // unit)
            return f"{count} {name}{'s' if name == 'day' and count != 1 else ''}"
    return f"{seconds:g} s"


def spans_in_words(text: str) -> str:
    """``within 604800 s`` (a lemon's why, as older collectors wrote it) -> ``within 7 days``."""
    return re.sub(r"\bwithin (\d+(?:\.\d+)?) s\b", lambda m: f"within {span(float(m.group(1)))}", text)


def num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def mtbf(value: float | None) -> str:
    """Mean time between failures (hours), or why there is none."""
    return "n/a (no failures)" if value is None else hours(value)
