"""The repair ticket: what `[remediation] repair_command` gets on stdin when a node
reaches the top of the ladder. A plain JSON object, versioned (``SCHEMA``,
``SCHEMA_VERSION``); docs/remediation.md describes every key and
docs/repair-ticket.schema.json is its JSON Schema. A key is only ever added within a
version; a key removed or changed in meaning is a new version.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from slurmgpu import __version__
from slurmgpu.facts import GpuFacts
from slurmgpu.remediation.ladder import Ladder

SCHEMA = "slurmgpu.repair-ticket/1"
SCHEMA_VERSION = 1


def build_ticket(ladder: Ladder, gpus: Sequence[GpuFacts], now: float, reason: str) -> dict[str, Any]:
    """The ticket of ``ladder``'s node: its GPUs as NVML last described them (``gpus``: the
    node's last facts; none when the collector has none), the drain's findings, the
    ladder's history and every validation it ran."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": _iso(now),
        "node": ladder.node,
        "reason": reason,
        "slurmgpu_version": __version__,
        "gpus": [_gpu(g) for g in gpus],
        "findings": list(ladder.findings),
        "ladder": {"action": ladder.action, "since": _iso(ladder.since), "remedies": list(ladder.remedies),
                   "attempts": dict(ladder.attempts),
                   "history": [_entry(h.time, h.event, h.stage, h.steps, h.note) for h in ladder.history]},
        "validations": [_validation(v.started, v.finished, v.tier, v.reservation, v.job_id, v.verdict,
                                    v.findings) for v in ladder.validations],
    }


def _gpu(g: GpuFacts) -> dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid, "serial": g.serial, "model": g.name,
            "pci_bus_id": g.pci_bus_id, "lost": g.lost}


def _entry(time: float, event: str, stage: str, steps: list[dict[str, Any]], note: str) -> dict[str, Any]:
    return {"time": _iso(time), "event": event, "stage": stage, "steps": [s["step"] for s in steps],
            "note": note}


def _validation(started: float, finished: float | None, tier: str, reservation: str, job_id: str | None,
                verdict: str | None, findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"started": _iso(started), "finished": None if finished is None else _iso(finished),
            "tier": tier, "reservation": reservation, "job_id": job_id, "verdict": verdict,
            "findings": list(findings)}


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
