"""The per-node agent (``slurmgpu agent``): polls NVML/IB/versions, reacts to NVML
events within a second, answers local queries, and reports to the collector."""

from __future__ import annotations

from slurmgpu.agent.core import Agent

__all__ = ["Agent"]
