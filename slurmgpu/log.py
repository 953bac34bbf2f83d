"""Logging, configured once per process.

structlog renders JSON lines (for journald) or a console format on a TTY.
Library code only calls ``get_logger()``; entry points call ``configure()``.
structlog is imported lazily so short-lived commands that log nothing don't
pay for it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_configured = False


def configure(level: str = "warning", *, json: bool | None = None, stream: Any = None) -> None:
    global _configured
    import structlog

    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
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
    _configured = True


def get_logger(**bind: Any) -> Any:
    import structlog

    if not _configured:
        configure()
    return structlog.get_logger().bind(**bind)


def log_verdict(verdict: Any, *, phase: str) -> None:
    """One canonical line per check result, then one for the node."""
    log = get_logger(node=verdict.node, phase=phase)
    for f in verdict.findings:
        method = log.info if f.severity.name == "OK" else log.warning
        method("check_result", check=f.check, severity=f.severity.name, gpu=f.gpu, subject=f.subject,
               message=f.message)
    log.info("verdict", verdict=verdict.severity.name, findings=len(verdict.findings),
             duration_ms=round(verdict.duration_ms, 2))
