"""The per-node agent (``slurmgpu agent``): polls NVML/IB/versions, reacts to NVML
events within a second, answers local queries, and reports to the collector.

``Agent`` is imported on first use: the CLI imports small helpers from this package
(``slurmgpu.agent.notify``) on every command, the prolog's cold path included, and must
not pay for the agent's engine, checkpoint watcher and wire modules."""

from __future__ import annotations

from typing import Any

__all__ = ["Agent"]


def __getattr__(name: str) -> Any:
    if name == "Agent":
        from slurmgpu.agent.core import Agent

        return Agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
