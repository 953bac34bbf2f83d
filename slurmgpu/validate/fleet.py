"""Validation results across the fleet: stragglers (a node whose measurement is a
fraction below the fleet median for the same GPU model and metric) and suggested
thresholds (`slurmgpu validate baseline`). Pure: the collector reads each node's newest
``validation`` event and hands their findings here."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slurmgpu.result import Finding, Severity

STRAGGLER = "validate.straggler"

Key = tuple[str, str, str]  # (check, metric, model)


@dataclass(frozen=True)
class NodeResults:
    node: str
    findings: Sequence[Mapping[str, Any]]  # wire maps (Finding.to_json())


def node_values(findings: Iterable[Mapping[str, Any]]) -> dict[Key, tuple[float, str]]:
    """Per (check, metric, model): the node's median value and unit."""
    values: dict[Key, list[float]] = {}
    units: dict[Key, str] = {}
    for f in findings:
        raw = f.get("data")
        data: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        value, metric = data.get("value"), data.get("metric")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(metric, str):
            key = (str(f.get("check")), metric, str(data.get("model") or "unknown model"))
            values.setdefault(key, []).append(float(value))
            units[key] = str(data.get("unit") or "")
    return {k: (statistics.median(v), units[k]) for k, v in values.items()}


def fleet_values(results: Iterable[NodeResults]) -> dict[Key, dict[str, tuple[float, str]]]:
    out: dict[Key, dict[str, tuple[float, str]]] = {}
    for r in results:
        for key, value in node_values(r.findings).items():
            out.setdefault(key, {})[r.node] = value
    return out


def stragglers(node: str, results: Iterable[NodeResults], fraction: float, min_nodes: int) -> list[Finding]:
    """``validate.straggler`` WARNs for ``node``: each measurement of it more than
    ``fraction`` below the median of the nodes with the same GPU model (at least
    ``min_nodes`` of them, ``node`` included)."""
    out = []
    for (check, metric, model), per_node in sorted(fleet_values(results).items()):
        if node not in per_node or len(per_node) < min_nodes:
            continue
        value, unit = per_node[node]
        median = statistics.median(v for v, _ in per_node.values())
        if value < (1 - fraction) * median:
            short = 100 * (1 - value / median)
            out.append(Finding(STRAGGLER, Severity.WARN, f"{check} {metric} {value:,.1f} {unit}: {short:.0f}% below "
                               f"the fleet median {median:,.1f} {unit} of {len(per_node)} nodes with {model}",
                               subject=check, data={"metric": metric, "value": value, "median": median,
                                                    "model": model, "nodes": len(per_node)}))
    return out


@dataclass(frozen=True)
class Suggestion:
    model: str
    check: str
    metric: str
    unit: str
    nodes: int
    median: float
    minimum: float
    suggested: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def suggest(results: Iterable[NodeResults], fraction: float) -> list[Suggestion]:
    """Per GPU model and metric: the fleet median less ``fraction``, as a floor."""
    out = []
    for (check, metric, model), per_node in sorted(fleet_values(results).items(), key=lambda kv: (kv[0][2], kv[0][1])):
        values = [v for v, _ in per_node.values()]
        median = statistics.median(values)
        unit = next(iter(per_node.values()))[1]
        out.append(Suggestion(model, check, metric, unit, len(values), round(median, 1), round(min(values), 1),
                              round(median * (1 - fraction), 1)))
    return out
