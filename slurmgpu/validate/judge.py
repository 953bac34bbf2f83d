"""Measurements -> findings: a floor (the host's threshold or the model's built-in one)
and the node's own median (a part ``outlier_fraction`` below its identical siblings
fails, whatever the floor). Every finding carries ``data`` = {"metric", "value", "unit",
"model"}: what the collector compares across the fleet (stragglers) and `validate
baseline` suggests thresholds from."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from slurmgpu.result import Finding, Severity
from slurmgpu.validate.floors import Floor

#: Fewest measurements of one kind on a node before its median is trusted.
MIN_FOR_MEDIAN = 3


@dataclass(frozen=True)
class Measured:
    value: float
    gpu: int | None = None
    subject: str | None = None
    model: str | None = None

    @property
    def where(self) -> str:
        return self.subject or (f"gpu{self.gpu}" if self.gpu is not None else "node")


@dataclass(frozen=True)
class Metric:
    check: str  # "validate.pcie"
    name: str  # "pcie_gbps"
    unit: str  # "GB/s"
    what: str  # "host<->device (pinned, the slower direction)"


def _fmt(value: float) -> str:
    return f"{value:,.1f}"


def _data(metric: Metric, m: Measured) -> dict[str, object]:
    return {"metric": metric.name, "value": round(m.value, 3), "unit": metric.unit, "model": m.model}


def judge_one(metric: Metric, m: Measured, floor: Floor | None, median: float | None,
              outlier_fraction: float) -> Finding:
    text = f"{m.where}: {_fmt(m.value)} {metric.unit} {metric.what}"
    data = _data(metric, m)
    if floor is not None and m.value < floor.value:
        return Finding(metric.check, Severity.FAIL, f"{text}, below {_fmt(floor.value)} {metric.unit} "
                       f"({floor.source})", m.gpu, m.subject, data={**data, "floor": floor.value})
    if median is not None and m.value < (1 - outlier_fraction) * median:
        short = 100 * (1 - m.value / median)
        return Finding(metric.check, Severity.FAIL, f"{text}, {short:.0f}% below this node's median "
                       f"{_fmt(median)} {metric.unit}", m.gpu, m.subject, data={**data, "median": median})
    return Finding(metric.check, Severity.OK, text, m.gpu, m.subject, data=data)


def judge(metric: Metric, measured: Sequence[Measured], floor_of: dict[str | None, Floor | None],
          outlier_fraction: float) -> list[Finding]:
    """``floor_of``: the floor per GPU model (None key: parts of no known model)."""
    median = statistics.median(m.value for m in measured) if len(measured) >= MIN_FOR_MEDIAN else None
    return [judge_one(metric, m, floor_of.get(m.model), median, outlier_fraction) for m in measured]
