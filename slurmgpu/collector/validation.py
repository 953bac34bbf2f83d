"""The collector's side of `slurmgpu validate`: each node's newest ``validation`` event
(``queries.latest_validations``) compared with the fleet's (``slurmgpu.validate.fleet``)."""

from __future__ import annotations

from collections.abc import Iterable

from slurmgpu.collector.store import Store
from slurmgpu.collector.store.queries import latest_validations
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.result import Finding
from slurmgpu.validate.fleet import NodeResults, stragglers
from slurmgpu.validate.report import KIND as VALIDATION

__all__ = ["VALIDATION", "judge_stragglers"]


def judge_stragglers(store: Store, settings: CollectorSettings, nodes: Iterable[str]) -> dict[str, list[Finding]]:
    """``validate.straggler`` findings per node of ``nodes`` (none: not a straggler)."""
    results = [NodeResults(node, body.get("findings") or []) for node, _seq, _ts, body in latest_validations(store.db)]
    return {node: stragglers(node, results, settings.straggler_fraction, settings.straggler_min_nodes)
            for node in nodes}
