"""Logging, configured once per process.

Daemons render through structlog: JSON lines (for journald) or a console format on a
TTY. The one-shot commands (the Slurm hooks, `check`) ask for ``lean=True``: the same
JSON lines, byte for byte (same keys in the same order, same values, same separators),
written by ``LineLogger`` with the standard library only, so a hook does not import
structlog. Library code only calls ``get_logger()``; entry points call ``configure()``.
"""

from __future__ import annotations

import sys
from typing import Any

_configured = False
_lean: LineLogger | None = None

#: The levels of ``logging`` (and of structlog's filtering loggers), without importing it.
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def configure(level: str = "warning", *, json: bool | None = None, stream: Any = None,
              lean: bool = False) -> None:
    """Log at ``level`` and above to ``stream`` (stderr). ``lean``: JSON lines through
    ``LineLogger`` (a console on a TTY still gets structlog's format)."""
    global _configured, _lean
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    _configured = True
    if lean and json:
        _lean = LineLogger(out, LEVELS[level.lower()])
        return
    _lean = None
    _configure_structlog(level, json, out)


def _configure_structlog(level: str, json: bool, out: Any) -> None:
    import logging

    import structlog

    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def get_logger(**bind: Any) -> Any:
    if not _configured:
        configure()
    if _lean is not None:
        return _lean.bind(**bind)
    import structlog

    return structlog.get_logger().bind(**bind)


class LineLogger:
    """structlog's JSON line without structlog: the bound context, the call's keywords,
    ``event``, ``level``, ``timestamp`` (ISO 8601, UTC, ``Z``), in that order, rendered
    by ``json.dumps`` with ``repr`` for what JSON cannot hold, one line per call."""

    def __init__(self, stream: Any, threshold: int, context: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self.threshold = threshold
        self.context = context or {}

    def bind(self, **more: Any) -> LineLogger:
        return LineLogger(self.stream, self.threshold, {**self.context, **more})

    def line(self, method: str, event: str, fields: dict[str, Any]) -> str:
        import datetime
        import json

        entry = {**self.context, **fields, "event": event, "level": method}
        entry["timestamp"] = datetime.datetime.now(tz=datetime.UTC).isoformat().replace("+00:00", "Z")
        return json.dumps(entry, default=_fallback)

    def log(self, method: str, event: str, fields: dict[str, Any]) -> None:
        if LEVELS[method] >= self.threshold:
            print(self.line(method, event, fields), file=self.stream, flush=True)

    def debug(self, event: str, **fields: Any) -> None:
        self.log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self.log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self.log("critical", event, fields)


def _fallback(value: Any) -> Any:
    """What structlog's JSONRenderer does with a value JSON cannot hold."""
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


def log_verdict(verdict: Any, *, phase: str) -> None:
    """One canonical line per check result, then one for the node."""
    log = get_logger(node=verdict.node, phase=phase)
    for f in verdict.findings:
        method = log.info if f.severity.name == "OK" else log.warning
        method("check_result", check=f.check, severity=f.severity.name, gpu=f.gpu, subject=f.subject,
               message=f.message)
    log.info("verdict", verdict=verdict.severity.name, findings=len(verdict.findings),
             duration_ms=round(verdict.duration_ms, 2))
