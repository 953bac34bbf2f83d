"""`slurmgpu report`: the fleet health report.

``slurmgpu.report.model`` reads the collector's database (read-only) and computes one
plain dict, the *report model* (it is also the JSON output); ``slurmgpu.report.html``
and ``slurmgpu.report.markdown`` render it. docs/report.md defines every number.
"""

from __future__ import annotations

SCHEMA = "slurmgpu.report/1"

# Section ids, in report order: HTML <section id=...> and the model's keys.
SECTIONS = ("summary", "availability", "drains", "failures", "xids", "ecc-trends", "throttling",
            "ib", "pin-drift", "service", "jobs", "mtbf", "verdict_quality", "return-to-service")

TITLES = {
    "summary": "Summary",
    "availability": "Availability",
    "drains": "Drains",
    "failures": "New failures by check",
    "xids": "XID events",
    "ecc-trends": "ECC and row-remap trends",
    "throttling": "Throttling",
    "ib": "InfiniBand ports",
    "pin-drift": "Version pin drift",
    "service": "Nodes due for service",
    "jobs": "Jobs affected",
    "mtbf": "MTBF by GPU model",
    "verdict_quality": "Verdict quality",
    "return-to-service": "Return to service",
}

FORMATS = ("html", "md", "json")

__all__ = ["FORMATS", "SCHEMA", "SECTIONS", "TITLES"]
