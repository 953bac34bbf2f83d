"""The remediation ladder of one node, as a pure state machine: ``start`` when slurmgpu
drains a node, ``advance`` with each event; each returns a ``Decision``: the ladder's
next state and the steps to carry out now. No I/O, no clock (``now`` is passed in); a
``Ladder`` goes to JSON and back (``to_json``/``from_json``) so that a new leader
resumes where the old one stopped. docs/remediation.md draws the states.

The caller persists ``Decision.ladder`` before it carries out ``Decision.steps``.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.config.schema import RemediationSettings
from slurmgpu.decision import MAX_REASON, REASON_PREFIX, drain_reason, with_prefix
from slurmgpu.remediation.steps import (
    Cleanup,
    CreateReservation,
    Drain,
    Event,
    NodeBack,
    OperatorResume,
    PassiveHealthy,
    Reboot,
    Release,
    RepairDone,
    ResetDone,
    ResetFailed,
    ResetGpus,
    Restart,
    ResumeIntoReservation,
    RunRepair,
    Step,
    StepFailed,
    SubmitValidation,
    Tick,
    ValidationFailed,
    ValidationPassed,
    ValidationSubmitted,
    ValidationTimedOut,
    event_to_json,
    finding_from_json,
    step_to_json,
)
from slurmgpu.result import Finding, Severity

LADDER_VERSION = 1


class Stage(enum.StrEnum):
    DRAINED = "drained"  # waits for the passive checks to pass again
    VALIDATING = "awaiting_validation"  # reservation, resumed into it, validation job
    RESETTING = "reset"
    REBOOTING = "reboot"
    HELD = "held"  # slurmgpu could not carry its steps out: stays drained, an operator decides
    REPAIR = "repair"  # terminal: drained, handed to the repair flow
    VALIDATED = "validated"  # terminal: released, back in service
    OPERATOR_RESUMED = "operator_resumed"  # terminal


TERMINAL = frozenset({Stage.REPAIR, Stage.VALIDATED, Stage.OPERATOR_RESUMED})
# The remedies, in the order the ladder climbs them.
RUNGS = (Stage.RESETTING, Stage.REBOOTING, Stage.REPAIR)
#: A remedy the open breaker holds back is looked at again this often.
BREAKER_RECHECK_S = 60.0
BREAKER_WAIT = "waits: the automation's breaker is open"


class Outcome(enum.StrEnum):
    """What a drain turned out to be (docs/remediation.md, "Verdict quality")."""

    CONFIRMED = "confirmed"  # a validation failed, or the node went to repair
    CLEARED_BY_VALIDATION = "cleared_by_validation"  # no fault found: a false-positive candidate
    TRANSIENT = "transient"  # cleared by a reset or a reboot
    UNKNOWN = "unknown"  # resumed by an operator without a validation


def reservation_name(node: str) -> str:
    """The reservation slurmgpu makes for ``node``: the only ones it ever deletes (the
    Slurm side's naming rule, ``slurmgpu.slurm.owned``, which a test holds equal)."""
    return f"slurmgpu-rts-{node}"


def entry_action(findings: Sequence[Finding], action: str | None = None) -> str:
    """Where the ladder starts: ``reboot`` or ``reset`` when a failing finding's action
    (``data["action"]``: the XID catalog's, the driver's recovery action) or the policy's
    ``action`` says so, else ``drain`` (validate first)."""
    said = {str(f.data.get("action")) for f in findings if f.severity is Severity.FAIL} | {str(action)}
    return next((a for a in ("reboot", "reset") if a in said), "drain")


@dataclass
class ValidationRun:
    """One validation in the reservation: ``verdict`` pass, fail, timeout or cancelled
    (None while it runs)."""

    started: float
    tier: str
    reservation: str
    job_id: str | None = None
    finished: float | None = None
    verdict: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HistoryEntry:
    """One turn of the ladder: the event, the stage after it, the steps it asked for
    (``dry_run``: recorded, not taken) and a note."""

    time: float
    event: str
    stage: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    dry_run: bool = False
    note: str = ""


@dataclass
class Ladder:
    """One node's ladder. ``due``: when the stage's steps are (re)issued (None: it waits
    for an event); ``deadline``: when the issued stage times out; ``attempts``: failed
    attempts per stage; ``rung``: the index in ``RUNGS`` of the next remedy."""

    node: str
    action: str
    since: float
    findings: list[dict[str, Any]]
    stage: Stage = Stage.DRAINED
    due: float | None = None
    issued_at: float | None = None
    deadline: float | None = None
    rung: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    job_id: str | None = None
    reservation: str | None = None
    confirmed: bool = False
    remedies: list[str] = field(default_factory=list)
    repair_requested: bool = False
    closed_at: float | None = None
    validations: list[ValidationRun] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        """Terminal; a repair only once asked for (the open breaker may hold it back)."""
        return self.stage in TERMINAL and (self.stage is not Stage.REPAIR or self.repair_requested)

    @property
    def checks(self) -> list[str]:
        """The check ids of the drain's failing findings, sorted, each once."""
        return sorted({str(f["check"]) for f in self.findings if f.get("severity") != "OK"})

    @property
    def outcome(self) -> Outcome | None:
        """None while the ladder is open (or held)."""
        if self.confirmed or self.stage is Stage.REPAIR:
            return Outcome.CONFIRMED
        if self.stage is Stage.VALIDATED:
            return Outcome.TRANSIENT if self.remedies else Outcome.CLEARED_BY_VALIDATION
        return Outcome.UNKNOWN if self.stage is Stage.OPERATOR_RESUMED else None

    @property
    def returned_by(self) -> str | None:
        """The step that brought a validated node back: validation, reset or reboot."""
        if self.stage is not Stage.VALIDATED:
            return None
        return self.remedies[-1] if self.remedies else "validation"

    def to_json(self) -> dict[str, Any]:
        return {"version": LADDER_VERSION, **{k: _plain(v) for k, v in vars(self).items()}}


@dataclass(frozen=True)
class Decision:
    """The ladder after one event, and the steps to take now (none in dry-run)."""

    ladder: Ladder
    steps: tuple[Step, ...] = ()


def from_json(data: dict[str, Any]) -> Ladder:
    """A ladder from ``Ladder.to_json``; ValueError for another version or a bad field."""
    if data.get("version") != LADDER_VERSION:
        raise ValueError(f"remediation ladder version {data.get('version')!r} (this slurmgpu reads "
                         f"{LADDER_VERSION})")
    values = {k: v for k, v in data.items() if k != "version"}
    try:
        values["stage"] = Stage(values["stage"])
        values["validations"] = [ValidationRun(**v) for v in values.get("validations", [])]
        values["history"] = [HistoryEntry(**h) for h in values.get("history", [])]
        return Ladder(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"remediation ladder: {exc}") from None


def start(node: str, findings: Sequence[Finding], now: float, settings: RemediationSettings, *,
          action: str | None = None, dry_run: bool = False, breaker_open: bool = False) -> Decision:
    """The ladder of a node slurmgpu (or an opted-in operator) just drained for
    ``findings``; ``action``: the automation's action, if any (``entry_action``).
    ``breaker_open``: the automation's breaker is open, and holds back the remedies
    (reset, reboot, repair) until it closes; validations and releases go on."""
    entry = entry_action(findings, action)
    ladder = Ladder(node=node, action=entry, since=now, findings=[f.to_json() for f in findings])
    turn = _Turn(ladder, now, settings, dry_run, breaker_open)
    first = {"reset": 0, "reboot": 1}.get(entry)
    if first is not None and _limit(settings, RUNGS[first]) > 0:
        ladder.rung = first
        turn.climb()
    return turn.done("start", f"entry: {entry}")


def advance(ladder: Ladder, event: Event, now: float, settings: RemediationSettings, *,
            dry_run: bool = False, breaker_open: bool = False) -> Decision:
    """The ladder after ``event`` at ``now`` (``ladder`` itself is left as it was)."""
    turn = _Turn(copy.deepcopy(ladder), now, settings, dry_run, breaker_open)
    turn.on(event)
    turn.on_time()
    return turn.done(event.kind, turn.note)


# --------------------------------------------------------------------------- the turn


class _Turn:
    """One call of ``start``/``advance``: the ladder it changes and the steps it asks for."""

    def __init__(self, ladder: Ladder, now: float, settings: RemediationSettings, dry_run: bool,
                 breaker_open: bool = False) -> None:
        self.ladder, self.now, self.settings, self.dry_run = ladder, now, settings, dry_run
        self.breaker_open = breaker_open
        self.steps: list[Step] = []
        self.note = ""

    def done(self, event: str, note: str) -> Decision:
        if self.steps or note or event not in ("tick", "restart"):
            self.ladder.history.append(HistoryEntry(
                time=self.now, event=event, stage=str(self.ladder.stage),
                steps=[step_to_json(s) for s in self.steps], dry_run=self.dry_run, note=note))
        return Decision(self.ladder, () if self.dry_run else tuple(self.steps))

    def on(self, event: Event) -> None:
        lad = self.ladder
        if isinstance(event, OperatorResume):
            self.operator_resumed(event.user)
        elif isinstance(event, RepairDone) and lad.stage is Stage.REPAIR:
            self.note = f"repair command exit {event.exit_code}" + (f": {event.error}" if event.error else "")
        elif lad.closed:
            self.note = "ignored: the ladder is closed"
        elif isinstance(event, Restart):
            self.restarted()
        elif isinstance(event, Tick):
            return
        else:
            self.on_stage_event(event)

    def on_stage_event(self, event: Event) -> None:
        stage = self.ladder.stage
        if stage is Stage.DRAINED and isinstance(event, PassiveHealthy):
            self.enter(Stage.VALIDATING)
        elif stage is Stage.VALIDATING:
            self.on_validation(event)
        elif stage is Stage.RESETTING and isinstance(event, ResetDone | ResetFailed):
            self.on_reset(event)
        elif stage is Stage.REBOOTING and self.ladder.issued_at is not None:
            self.on_reboot(event)
        else:
            self.note = f"ignored in stage {stage}"

    def on_validation(self, event: Event) -> None:
        lad = self.ladder
        if lad.issued_at is None:
            self.note = "ignored: no validation issued"
        elif isinstance(event, ValidationSubmitted):
            lad.job_id = event.job_id
            if lad.validations:
                lad.validations[-1].job_id = event.job_id
        elif isinstance(event, StepFailed):
            self.validation_trouble(f"{event.step} failed: {event.error}", "cancelled")
        elif isinstance(event, ValidationTimedOut) and event.job_id in (None, lad.job_id):
            self.validation_trouble("validation timed out", "timeout")
        elif isinstance(event, ValidationPassed | ValidationFailed) and event.job_id == lad.job_id:
            self.validation_result(event)
        else:
            self.note = "ignored: not the current validation"

    def validation_result(self, event: ValidationPassed | ValidationFailed) -> None:
        lad = self.ladder
        passed = isinstance(event, ValidationPassed)
        self.finish_run("pass" if passed else "fail", event.findings)
        if passed:
            self.steps.append(Release(lad.node, lad.reservation or reservation_name(lad.node)))
            self.forget_validation()
            self.close(Stage.VALIDATED)
            return
        lad.confirmed = True
        self.note = "validation failed"
        self.take_back(_failed_reason(event.findings))
        self.climb()

    def on_reboot(self, event: Event) -> None:
        if isinstance(event, NodeBack):
            self.ladder.remedies.append("reboot")
            self.enter(Stage.VALIDATING)
        elif isinstance(event, StepFailed):  # (no reboot without its reservation)
            self.note = f"{event.step} failed: {event.error}; held, not rebooted"
            self.take_back(with_prefix(f"{event.step} failed before the reboot (node held drained)"))
            self.hold()
        else:
            self.note = "ignored in stage reboot"

    def on_reset(self, event: ResetDone | ResetFailed) -> None:
        if self.ladder.issued_at is None:
            self.note = "ignored: no reset issued"
        elif isinstance(event, ResetDone):
            self.ladder.remedies.append("reset")
            self.enter(Stage.VALIDATING)
        elif event.busy:
            self.note = f"reset waits: {event.error}"
            self.enter(Stage.RESETTING, delay=_backoff(self.settings, Stage.RESETTING, 1))
        else:
            self.retry_or_climb(f"reset failed: {event.error}")

    def restarted(self) -> None:
        """A new leader: what the old one left running is cleaned up and issued again."""
        lad = self.ladder
        self.note = "taken over"
        if lad.stage is Stage.VALIDATING and lad.issued_at is not None:
            self.finish_run("cancelled", ())
            self.take_back(f"{REASON_PREFIX} validation restarted (collector restart)")
            self.enter(Stage.VALIDATING)
        elif lad.stage in (Stage.RESETTING, Stage.HELD):
            self.enter(lad.stage if lad.stage is Stage.RESETTING else Stage.VALIDATING)

    def operator_resumed(self, user: str) -> None:
        lad = self.ladder
        if lad.closed:
            self.note = "ignored: the ladder is closed"
            return
        if lad.stage is Stage.VALIDATING and lad.issued_at is not None:
            self.finish_run("cancelled", ())
        if lad.reservation or lad.job_id:
            self.steps.append(Cleanup(lad.node, lad.reservation, lad.job_id))
        self.forget_validation()
        self.note = f"resumed by operator {user}".rstrip()
        self.close(Stage.OPERATOR_RESUMED)

    # ---- time

    def on_time(self) -> None:
        lad = self.ladder
        if lad.closed:
            return
        if lad.issued_at is None and lad.due is not None and self.now >= lad.due:
            self.issue(recheck=True)
        elif lad.issued_at is not None and lad.deadline is not None and self.now >= lad.deadline:
            self.past_deadline()

    def past_deadline(self) -> None:
        stage = self.ladder.stage
        if stage is Stage.VALIDATING:
            self.validation_trouble("validation timed out", "timeout")
        elif stage is Stage.RESETTING:
            self.retry_or_climb("reset timed out")
        elif stage is Stage.REBOOTING:
            why = "the node did not come back from its reboot"
            self.take_back(with_prefix(f"{why} (node held drained)"))
            self.retry_or_climb(why)

    # ---- moves

    def enter(self, stage: Stage, delay: float = 0.0) -> None:
        lad = self.ladder
        lad.stage, lad.due, lad.issued_at, lad.deadline = stage, self.now + delay, None, None
        if delay <= 0:
            self.issue()

    def issue(self, recheck: bool = False) -> None:
        """The stage's steps, now; in dry-run they are recorded, not taken, and nothing
        times out (nothing was started). A remedy the open breaker holds back waits
        (no attempt used), said once in the history."""
        lad, s = self.ladder, self.settings
        if self.breaker_open and lad.stage in RUNGS:
            if not (recheck and waiting_for_breaker(lad)):
                self.note = _joined(self.note, f"{lad.stage} {BREAKER_WAIT}")
            lad.due = self.now + BREAKER_RECHECK_S
            return
        lad.issued_at, lad.due = self.now, None
        timeout = {Stage.VALIDATING: s.validation_timeout_s, Stage.RESETTING: s.reset_timeout_s,
                   Stage.REBOOTING: s.reboot_timeout_s}.get(lad.stage)
        lad.deadline = None if self.dry_run or timeout is None else self.now + timeout
        if lad.stage is Stage.VALIDATING:
            self.issue_validation()
        elif lad.stage is Stage.RESETTING:
            self.steps.append(ResetGpus(lad.node, tuple(_reset_gpus(lad))))
        elif lad.stage is Stage.REBOOTING:
            self.issue_reboot()
        elif lad.stage is Stage.REPAIR and not lad.repair_requested:
            self.issue_repair()

    def issue_validation(self) -> None:
        lad, s = self.ladder, self.settings
        lad.reservation, lad.job_id = reservation_name(lad.node), None
        lad.validations.append(ValidationRun(started=self.now, tier=s.tier, reservation=lad.reservation))
        self.steps += [CreateReservation(lad.node, lad.reservation, s.reservation_s),
                       ResumeIntoReservation(lad.node, lad.reservation),
                       SubmitValidation(lad.node, lad.reservation, s.tier, s.validation_timeout_s)]

    def issue_reboot(self) -> None:
        """The node's reservation first, held through the boot into its validation: a
        Slurm that returns a booted node to service (``ReturnToService=2``, 25.11) gives
        it to nobody else."""
        lad, s = self.ladder, self.settings
        lad.reservation = reservation_name(lad.node)
        self.steps += [CreateReservation(lad.node, lad.reservation, s.reboot_timeout_s + s.reservation_s),
                       Reboot(lad.node, _with_checks("reboot (remediation)", lad.checks))]

    def issue_repair(self) -> None:
        lad = self.ladder
        lad.repair_requested = True
        climbed = ", ".join(lad.remedies) or "none"
        reason = _with_checks(f"repair (tried: {climbed})", lad.checks)
        self.steps += [Drain(lad.node, reason), RunRepair(lad.node, reason)]
        lad.closed_at = self.now

    def climb(self) -> None:
        """To the next remedy whose attempts are not 0 (repair at last)."""
        lad = self.ladder
        while lad.rung < len(RUNGS) - 1 and _limit(self.settings, RUNGS[lad.rung]) == 0:
            lad.rung += 1
        stage = RUNGS[min(lad.rung, len(RUNGS) - 1)]
        lad.rung += 1
        self.enter(stage)

    def retry_or_climb(self, why: str) -> None:
        stage = self.ladder.stage
        if self.count_failure(stage) < _limit(self.settings, stage):
            self.note = f"{why}; retry"
            self.enter(stage, delay=_backoff(self.settings, stage, self.ladder.attempts[str(stage)]))
        else:
            self.note = f"{why}; climbing"
            self.climb()

    def validation_trouble(self, why: str, verdict: str) -> None:
        """The validation could not give a verdict: retried after the backoff, then held
        (slurmgpu's own trouble never climbs the ladder)."""
        self.finish_run(verdict, ())
        self.take_back(with_prefix(f"{why} (node held drained)"))
        failures = self.count_failure(Stage.VALIDATING)
        if failures < self.settings.validate_attempts:
            self.note = f"{why}; retry"
            self.enter(Stage.VALIDATING, delay=_backoff(self.settings, Stage.VALIDATING, failures))
        else:
            self.note = f"{why}; held after {failures} attempts"
            self.hold()

    def hold(self) -> None:
        lad = self.ladder
        lad.stage, lad.due, lad.issued_at, lad.deadline = Stage.HELD, None, None, None

    def take_back(self, reason: str) -> None:
        """Drain the node again, then cancel the job and delete the reservation."""
        lad = self.ladder
        self.steps.append(Drain(lad.node, reason))
        self.steps.append(Cleanup(lad.node, lad.reservation, lad.job_id))
        self.forget_validation()

    def count_failure(self, stage: Stage) -> int:
        key = str(stage)
        self.ladder.attempts[key] = self.ladder.attempts.get(key, 0) + 1
        return self.ladder.attempts[key]

    def finish_run(self, verdict: str, findings: Sequence[Finding]) -> None:
        runs = self.ladder.validations
        if runs and runs[-1].verdict is None:
            runs[-1].finished, runs[-1].verdict = self.now, verdict
            runs[-1].findings = [f.to_json() for f in findings]

    def forget_validation(self) -> None:
        self.ladder.reservation = self.ladder.job_id = None

    def close(self, stage: Stage) -> None:
        lad = self.ladder
        lad.stage, lad.due, lad.issued_at, lad.deadline, lad.closed_at = stage, None, None, None, self.now


# --------------------------------------------------------------------------- helpers


def waiting_for_breaker(ladder: Ladder) -> bool:
    """Whether the ladder's remedy is held back by the open breaker (its last word)."""
    return (ladder.stage in RUNGS and ladder.issued_at is None and bool(ladder.history)
            and ladder.history[-1].note.endswith(BREAKER_WAIT))


def _joined(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more


def _limit(settings: RemediationSettings, stage: Stage) -> int:
    return {Stage.VALIDATING: settings.validate_attempts, Stage.RESETTING: settings.reset_attempts,
            Stage.REBOOTING: settings.reboot_attempts}.get(stage, 1)


def _backoff(settings: RemediationSettings, stage: Stage, failures: int) -> float:
    """The stage's backoff, doubled with each failed attempt after the first."""
    base = {Stage.VALIDATING: settings.validate_backoff_s, Stage.RESETTING: settings.reset_backoff_s,
            Stage.REBOOTING: settings.reboot_backoff_s}.get(stage, 0.0)
    return float(base * 2 ** max(failures - 1, 0))


def _reset_gpus(ladder: Ladder) -> list[int]:
    """The GPUs the drain named and those its last validation failed."""
    last = ladder.validations[-1].findings if ladder.validations else []
    return sorted(set(_gpus(ladder.findings)) | set(_gpus(last)))


def _gpus(findings: list[dict[str, Any]]) -> list[int]:
    return sorted({int(f["gpu"]) for f in findings if f.get("gpu") is not None and f.get("severity") != "OK"})


def _with_checks(what: str, checks: list[str]) -> str:
    return _cut(with_prefix(f"{what}: {', '.join(checks)}" if checks else what))


def _failed_reason(findings: Sequence[Finding]) -> str:
    said = drain_reason(findings)[len(REASON_PREFIX):].strip()
    return _cut(with_prefix(f"validation failed: {said}"))


def _cut(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1].rstrip() + "…"


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, ValidationRun | HistoryEntry):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return str(value) if isinstance(value, enum.Enum) else value


def findings_of(run: ValidationRun) -> list[Finding]:
    """A validation run's findings, typed."""
    return [finding_from_json(f) for f in run.findings]


__all__ = ["LADDER_VERSION", "RUNGS", "TERMINAL", "Decision", "HistoryEntry", "Ladder", "Outcome", "Stage",
           "ValidationRun", "advance", "entry_action", "event_to_json", "findings_of", "from_json",
           "reservation_name", "start"]
