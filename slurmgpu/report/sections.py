"""What the HTML and Markdown renderers take from the report model the same way: which
function renders which section, the MTBF table's cells, the pin findings' rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slurmgpu.report import SECTIONS
from slurmgpu.report.render_util import duration, hours, mtbf, num

# Renders one section of the report model.
Renderer = Callable[[dict[str, Any]], str]


class Renderers:
    """A renderer module's sections: ``@renders("ecc-trends")`` on the function that
    renders it; ``complete()`` (at import) fails when a section has none."""

    def __init__(self) -> None:
        self.by_section: dict[str, Renderer] = {}

    def __call__(self, section: str) -> Callable[[Renderer], Renderer]:
        if section not in SECTIONS:
            raise ValueError(f"no report section {section!r}")

        def register(fn: Renderer) -> Renderer:
            self.by_section[section] = fn
            return fn
        return register

    def complete(self) -> dict[str, Renderer]:
        missing = [s for s in SECTIONS if s not in self.by_section]
        if missing:
            raise TypeError(f"no renderer for report section(s) {', '.join(missing)}")
        return {s: self.by_section[s] for s in SECTIONS}


MTBF_HEADERS = ("GPU model", "nodes", "node-hours", "drains", "MTBF (drains)", "FAIL transitions",
                "MTBF (FAIL)")


def mtbf_rows(m: dict[str, Any]) -> list[list[Any]]:
    """The MTBF table's rows, one a GPU model, cells formatted (``MTBF_HEADERS``)."""
    return [[r["gpu_model"], r["nodes"], hours(r["node_hours"]), r["drains"],
             mtbf(r["mtbf_drain_h"]), r["fail_transitions"], mtbf(r["mtbf_fail_h"])]
            for r in m["mtbf"]["models"]]


def off_pin_count(value: int | None) -> str:
    """The headline's off-pin count: "not judged" where nothing could judge the pins."""
    return "not judged" if value is None else num(value)


def pin_finding_rows(by_nodes: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The nodes' own pin findings as table rows: node, check, severity, message."""
    return [[f["node"], f["check"] + (f" GPU {f['gpu']}" if f["gpu"] is not None else ""),
             f["severity"], f["message"] or ""] for f in by_nodes]


VERDICT_HEADERS = ("check", "drains", "confirmed", "cleared by validation", "transient", "unknown",
                   "precision")
RETURN_HEADERS = ("returned by", "nodes", "median", "p90", "max")
NO_OUTCOMES = "not recorded: this database is from before return to service (schema 14)"


def verdict_rows(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Verdict quality rows (``VERDICT_HEADERS``): a check's drains by outcome and its
    precision, "not judged" where no drain was resolved."""
    return [[r["check"] + (f" ({r['gpu_model']})" if "gpu_model" in r else ""), r["drains"], r["confirmed"],
             r["cleared_by_validation"], r["transient"], r["unknown"],
             "not judged" if r["precision"] is None else f"{100 * r['precision']:.0f}% of {r['resolved']}"]
            for r in rows]


def return_rows(steps: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Return-to-service rows (``RETURN_HEADERS``): per step, the time from drain to return."""
    return [[s["step"], s["nodes"], duration(s["median_s"]), duration(s["p90_s"]), duration(s["max_s"])]
            for s in steps]


def validation_runs(runs: Sequence[Mapping[str, Any]]) -> str:
    """``return pass 3, idle fail 1`` (none: ``none``)."""
    return ", ".join(f"{r['trigger']} {r['verdict'] or 'running'} {r['runs']}" for r in runs) or "none"
