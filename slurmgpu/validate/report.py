"""A validation run on the wire: the agent's local-socket request (`validate --send`)
and the ``validation`` event body the agent spools for the collector. The event carries
every finding, OK ones too: their ``data`` (metric, value, unit, GPU model) is what the
collector's straggler check and `validate baseline` read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmgpu import wire
from slurmgpu.result import Verdict

OP = "validation"
KIND = "validation"


def validation_request(verdict: Verdict) -> dict[str, Any]:
    return {"op": OP, "verdict": verdict.severity.name, "findings": wire.encode_findings(verdict.findings)}


def validation_event(request: Mapping[str, Any]) -> dict[str, Any]:
    """The event body for a request; ValueError (one line) when it is malformed."""
    findings = request.get("findings")
    if not isinstance(findings, list) or len(findings) > wire.MAX_FINDINGS:
        raise ValueError(f"'findings' must be a list of at most {wire.MAX_FINDINGS} findings")
    try:
        decoded = [wire.decode_finding(f, wire.EVENT) for f in findings]
    except wire.WireError as exc:
        raise ValueError(str(exc)) from None
    if not all(f.check.startswith("validate.") for f in decoded):
        raise ValueError("a validation carries validate.* findings only")
    verdict = str(request.get("verdict") or "")
    wire.decode_severity(verdict)
    return {"kind": KIND, "gpu": None, "data": None, "verdict": verdict, "findings": wire.encode_findings(decoded)}
