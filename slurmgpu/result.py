"""Severities, findings and the node verdict.

The values of ``Severity`` are the Nagios plugin exit codes admins already use
(0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). For the verdict, severities rank
OK < WARN < UNKNOWN < FAIL: a node that fails a check fails, whatever else
broke; a node where a check could not run is not called healthy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import field
from typing import Any

from slurmgpu.record import record


class Severity(enum.IntEnum):
    OK = 0
    WARN = 1
    FAIL = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def exit_code(self) -> int:
        return int(self.value)

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected ok, warn, fail or unknown)") from None


_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.UNKNOWN: 2, Severity.FAIL: 3}


def worst(severities: Iterable[Severity]) -> Severity:
    """The worst severity of several; OK when there are none."""
    return max(severities, key=lambda s: s.rank, default=Severity.OK)


@record(frozen=True)
class Finding:
    """One statement a check makes about the node or one GPU/port."""

    check: str
    severity: Severity
    message: str
    gpu: int | None = None
    # A non-GPU subject, e.g. "mlx5_0/1" for an IB port.
    subject: str | None = None
    # True when the check does not apply here (not supported, not configured).
    not_applicable: bool = False
    # Machine-readable detail for collectors and reports.
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.name,
            "gpu": self.gpu,
            "subject": self.subject,
            "message": self.message,
            "not_applicable": self.not_applicable,
            "data": self.data,
        }


@record(frozen=True)
class Verdict:
    """Every finding for a node plus the worst of them."""

    node: str
    findings: tuple[Finding, ...]
    duration_ms: float = 0.0

    @property
    def severity(self) -> Severity:
        return worst(f.severity for f in self.findings)

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is not Severity.OK]
