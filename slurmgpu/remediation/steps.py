"""What the remediation ladder asks for (steps) and what it is told (events), as typed,
frozen data that goes to JSON and back (``step_to_json``/``step_from_json``,
``event_to_json``/``event_from_json``). The ladder only names them; the collector carries
the steps out (Slurm, the node agent, the repair command) and reports back with events.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from slurmgpu.result import Finding, Severity

# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class CreateReservation:
    """A Slurm maintenance reservation (``Flags=MAINT``) on the node, named ``reservation``."""

    kind: ClassVar[str] = "create_reservation"
    node: str
    reservation: str
    duration_s: float


@dataclass(frozen=True)
class ResumeIntoReservation:
    """Resume the drained node: it takes only jobs of the reservation it is in."""

    kind: ClassVar[str] = "resume_into_reservation"
    node: str
    reservation: str


@dataclass(frozen=True)
class SubmitValidation:
    """``slurmgpu validate --tier TIER`` as a job under ``--reservation --exclusive``."""

    kind: ClassVar[str] = "submit_validation"
    node: str
    reservation: str
    tier: str
    timeout_s: float


@dataclass(frozen=True)
class Release:
    """Validation passed: delete the reservation; the node takes jobs again."""

    kind: ClassVar[str] = "release"
    node: str
    reservation: str


@dataclass(frozen=True)
class Cleanup:
    """Cancel the validation job and delete the reservation slurmgpu made (either may be
    None: nothing of that kind to clean up)."""

    kind: ClassVar[str] = "cleanup"
    node: str
    reservation: str | None
    job_id: str | None


@dataclass(frozen=True)
class Drain:
    """Drain the node (again) with ``reason``: a validation failed, or it goes to repair."""

    kind: ClassVar[str] = "drain"
    node: str
    reason: str


@dataclass(frozen=True)
class ResetGpus:
    """Reset the node's GPUs (``gpus``; empty: every GPU), only those with no process."""

    kind: ClassVar[str] = "reset_gpus"
    node: str
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reboot:
    """``scontrol reboot ASAP nextstate=DOWN reason=REASON (22.05 has no DRAIN next state)``."""

    kind: ClassVar[str] = "reboot"
    node: str
    reason: str


@dataclass(frozen=True)
class RunRepair:
    """Hand the node to the site's repair flow: ``[remediation] repair_command`` with the
    ticket (``slurmgpu.remediation.ticket``) on stdin. Asked for once per ladder."""

    kind: ClassVar[str] = "run_repair"
    node: str
    reason: str


Step = (CreateReservation | ResumeIntoReservation | SubmitValidation | Release | Cleanup | Drain
        | ResetGpus | Reboot | RunRepair)
STEP_TYPES: dict[str, type[Step]] = {t.kind: t for t in (
    CreateReservation, ResumeIntoReservation, SubmitValidation, Release, Cleanup, Drain, ResetGpus,
    Reboot, RunRepair)}

# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class PassiveHealthy:
    """The node's passive checks are healthy again (the automation's resume condition)."""

    kind: ClassVar[str] = "passive_healthy"


@dataclass(frozen=True)
class ValidationSubmitted:
    """The validation job was submitted into the reservation."""

    kind: ClassVar[str] = "validation_submitted"
    job_id: str


@dataclass(frozen=True)
class ValidationPassed:
    kind: ClassVar[str] = "validation_passed"
    job_id: str
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class ValidationFailed:
    kind: ClassVar[str] = "validation_failed"
    job_id: str
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class ValidationTimedOut:
    """The validation did not end within ``[remediation] validation_timeout_s`` (the
    ladder also finds this itself at a ``Tick`` past the deadline)."""

    kind: ClassVar[str] = "validation_timed_out"
    job_id: str | None = None


@dataclass(frozen=True)
class StepFailed:
    """A step of the validation (reservation, resume, submission) could not be carried
    out: slurmgpu's or Slurm's trouble, never a verdict on the node."""

    kind: ClassVar[str] = "step_failed"
    step: str
    error: str


@dataclass(frozen=True)
class ResetDone:
    kind: ClassVar[str] = "reset_done"


@dataclass(frozen=True)
class ResetFailed:
    """``busy``: a process still holds a GPU; the reset is tried again after the backoff
    without counting an attempt."""

    kind: ClassVar[str] = "reset_failed"
    error: str
    busy: bool = False


@dataclass(frozen=True)
class NodeBack:
    """The node came back from its reboot (slurmd registered again)."""

    kind: ClassVar[str] = "node_back"


@dataclass(frozen=True)
class RepairDone:
    """What the repair command did (``exit_code`` None: it could not run or timed out)."""

    kind: ClassVar[str] = "repair_done"
    exit_code: int | None
    error: str = ""


@dataclass(frozen=True)
class OperatorResume:
    """An operator resumed the node: the ladder ends, what slurmgpu made is cleaned up."""

    kind: ClassVar[str] = "operator_resume"
    user: str = ""


@dataclass(frozen=True)
class Restart:
    """A collector (re)started or became the leader and took the ladder over."""

    kind: ClassVar[str] = "restart"


@dataclass(frozen=True)
class Tick:
    """Time passed: a backoff may be over, a deadline past."""

    kind: ClassVar[str] = "tick"


Event = (PassiveHealthy | ValidationSubmitted | ValidationPassed | ValidationFailed | ValidationTimedOut
         | StepFailed | ResetDone | ResetFailed | NodeBack | RepairDone | OperatorResume | Restart | Tick)
EVENT_TYPES: dict[str, type[Event]] = {t.kind: t for t in (
    PassiveHealthy, ValidationSubmitted, ValidationPassed, ValidationFailed, ValidationTimedOut,
    StepFailed, ResetDone, ResetFailed, NodeBack, RepairDone, OperatorResume, Restart, Tick)}

# --------------------------------------------------------------------------- JSON


def step_to_json(step: Step) -> dict[str, Any]:
    return {"step": step.kind, **_fields(step)}


def step_from_json(data: dict[str, Any]) -> Step:
    """ValueError for a step this version does not know, or one with wrong fields."""
    return _build(STEP_TYPES, data, "step")


def event_to_json(event: Event) -> dict[str, Any]:
    return {"event": event.kind, **_fields(event)}


def event_from_json(data: dict[str, Any]) -> Event:
    return _build(EVENT_TYPES, data, "event")


def finding_from_json(data: dict[str, Any]) -> Finding:
    """The inverse of ``Finding.to_json``."""
    return Finding(check=str(data["check"]), severity=Severity[str(data["severity"])],
                   message=str(data.get("message") or ""), gpu=data.get("gpu"),
                   subject=data.get("subject"), not_applicable=bool(data.get("not_applicable")),
                   data=dict(data.get("data") or {}))


def _fields(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "findings":
            value = [x.to_json() for x in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _build(types: dict[str, Any], data: dict[str, Any], tag: str) -> Any:
    cls = types.get(str(data.get(tag)))
    if cls is None:
        raise ValueError(f"unknown remediation {tag} {data.get(tag)!r}")
    values = {k: v for k, v in data.items() if k != tag}
    if "findings" in values:
        values["findings"] = tuple(finding_from_json(x) for x in values["findings"])
    if "gpus" in values:
        values["gpus"] = tuple(int(g) for g in values["gpus"])
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"remediation {tag} {data.get(tag)!r}: {exc}") from None


__all__ = ["EVENT_TYPES", "STEP_TYPES", "Cleanup", "CreateReservation", "Drain", "Event", "NodeBack",
           "OperatorResume", "PassiveHealthy", "Reboot", "Release", "RepairDone", "ResetDone",
           "ResetFailed", "ResetGpus", "Restart", "ResumeIntoReservation", "RunRepair", "Step",
           "StepFailed", "SubmitValidation", "Tick", "ValidationFailed", "ValidationPassed",
           "ValidationSubmitted", "ValidationTimedOut", "event_from_json", "event_to_json",
           "finding_from_json", "step_from_json", "step_to_json"]
