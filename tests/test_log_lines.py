"""The one-shot commands' log lines (``log.configure(lean=True)``: no structlog) are the
daemons' structlog lines byte for byte: same keys in the same order, same values, same
JSON text; only the timestamp differs, by the clock."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import structlog

from slurmgpu import log

TIMESTAMP = re.compile(r'"timestamp": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z"')


class Odd:
    """A value JSON cannot hold: rendered by repr."""

    def __repr__(self) -> str:
        return "<odd>"


CALLS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("info", "prolog_decision", {}, {"time": 1.5, "phase": "prolog", "node": "n1", "job": "7",
                                     "gpus": [0, 1], "verdict": "OK", "action": "none", "exit": 0}),
    ("error", "epilog_decision", {}, {"phase": "epilog", "verdict": "FAIL", "problems": ["gpu.lost GPU 1: é"],
                                      "path": Path("/x"), "odd": Odd(), "none": None}),
    ("warning", "check_result", {"node": "n1", "phase": "check"}, {"check": "gpu.count", "gpu": None}),
    ("info", "job_gpu_summary", {"node": "old"}, {"node": "new", "level": "mine", "event": "kept"}),
    ("debug", "hidden", {}, {"x": 1}),
]


def lines(lean: bool, level: str) -> list[str]:
    out = io.StringIO()
    log.configure(level, json=True, stream=out, lean=lean)
    for method, event, bound, fields in CALLS:
        getattr(log.get_logger(**bound), method)(event, **{k: v for k, v in fields.items() if k != "event"})
    return [TIMESTAMP.sub('"timestamp": "T"', line) for line in out.getvalue().splitlines()]


@pytest.fixture(autouse=True)
def reset_logging() -> Any:
    yield
    structlog.reset_defaults()
    log._configured, log._lean = False, None


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_lean_lines_are_structlogs_lines(level: str) -> None:
    daemon = lines(lean=False, level=level)
    hook = lines(lean=True, level=level)
    assert hook == daemon
    assert len(hook) == sum(log.LEVELS[m] >= log.LEVELS[level] for m, *_ in CALLS)


def test_lean_timestamp_is_iso_utc() -> None:
    out = io.StringIO()
    log.configure("info", json=True, stream=out, lean=True)
    log.get_logger().info("x")
    assert TIMESTAMP.search(out.getvalue())
    assert list(json.loads(out.getvalue())) == ["event", "level", "timestamp"]


def test_lean_logger_is_used_only_for_json() -> None:
    """A console (json=False) keeps structlog's readable format."""
    log.configure("info", json=False, stream=io.StringIO(), lean=True)
    assert log._lean is None
