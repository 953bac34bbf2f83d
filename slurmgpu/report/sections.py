"""What the HTML and Markdown renderers take from the report model the same way: which
function renders which section, the MTBF table's cells, the pin findings' rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slurmgpu.report import SECTIONS
from slurmgpu.report.render_util import hours, mtbf, num

# Renders one section of the report model.
Renderer = Callable[[dict[str, Any]], str]


def section_renderers(namespace: Mapping[str, object]) -> dict[str, Renderer]:
    """Section id -> its renderer in a renderer module's ``namespace`` (its ``globals()``):
    ``_summary`` for ``summary``, ``_ecc_trends`` for ``ecc-trends``. A module that lacks
    one fails when it is imported."""
    found: dict[str, Renderer] = {}
    for section in SECTIONS:
        name = "_" + section.replace("-", "_")
        fn = namespace.get(name)
        if not callable(fn):
            raise TypeError(f"no renderer {name} for report section {section!r}")
        found[section] = fn
    return found


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
