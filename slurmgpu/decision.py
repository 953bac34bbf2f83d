"""The decision vocabulary node and head share: actions, the policy over findings, the XID
actions, and the drain reasons slurmgpu writes into Slurm.

Pure: the standard library and ``slurmgpu.result`` only, no I/O. The node side (the
prolog/epilog gate, the agent) and the head side (the collector's automation) both import
it; they never import each other (they meet on the wire, ``slurmgpu.wire``).

* ``Action``: every action name either side uses. Its values are the historic strings,
  so the wire, the state files, the job files and the database hold what they always did.
* ``PolicyTable``: a finding (and how many reports in a row it failed) -> the action.
* XID actions (the catalog's, ``slurmgpu.xid``): their severity and the automation action
  each one maps to.
* Drain reasons: every reason starts with ``REASON_PREFIX``; a drain by a hook or by
  ``slurmgpu drain`` ends with who did it (`` [by epilog]``, `` [by operator alice]``),
  kept within ``MAX_REASON`` characters (``drain_reason``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Protocol

from slurmgpu.result import Finding, Severity


class Action(enum.StrEnum):
    NONE = "none"
    IGNORE = "ignore"  # the XID catalog's "none"
    WARN = "warn"
    CHECKPOINT = "checkpoint"
    DRAIN = "drain"
    DRAIN_NOW = "drain-now"
    RESET = "reset"  # XID catalog / driver recovery action: a GPU reset (drained for it)
    REBOOT = "reboot"
    RESUME = "resume"  # the automation's resume of a node it drained


class Outcome(enum.StrEnum):
    """What became of an action (``ActionResult.action``, a decision's ``result``); an
    error is ``error: <why>`` instead."""

    DRAINED = "drained"
    ALREADY_DRAINED = "already-drained"
    OPERATOR_DRAIN_KEPT = "operator-drain-kept"
    STICKY_DRAIN_KEPT = "sticky-drain-kept"
    REBOOT_REQUESTED = "reboot-requested"
    ALREADY_REBOOTING = "already-rebooting"
    REBOOTING_LEFT_ALONE = "rebooting-left-alone"
    RESUMED = "resumed"
    NOT_DRAINED = "not-drained"
    HELD = "held"  # by the automation's circuit breaker
    DRY_RUN = "dry-run"
    RECORDED = "recorded"  # a warn or checkpoint decision: no Slurm call
    UNREACHABLE = "unreachable"  # Slurm did not answer: journaled, replayed later
    CHECKPOINTING = "checkpointing"  # the drain waits for the jobs' checkpoints
    ESCALATED = "escalated"  # a pending checkpoint became a drain-now


# Outcomes after which the node counts as drained by the automation.
TAKEN_AWAY = frozenset({Outcome.DRAINED, Outcome.DRY_RUN, Outcome.UNREACHABLE, Outcome.ALREADY_DRAINED,
                        Outcome.CHECKPOINTING, Outcome.REBOOT_REQUESTED, Outcome.ALREADY_REBOOTING})
# Of those, the new drains: they count against the breaker's rate and towards a lemon.
NEW_DRAINS = TAKEN_AWAY - {Outcome.ALREADY_DRAINED, Outcome.ALREADY_REBOOTING}
# A pending drain carried out (``finish_pending``): the node is the automation's.
FINISHED = frozenset({Outcome.DRAINED, Outcome.ALREADY_DRAINED, Outcome.UNREACHABLE,
                      Outcome.REBOOT_REQUESTED, Outcome.ALREADY_REBOOTING})

# The automation's actions (``[automation] policy`` values), mildest first: the worst of a
# report's findings is the one taken.
POLICY_ACTIONS = (Action.NONE, Action.WARN, Action.CHECKPOINT, Action.DRAIN, Action.DRAIN_NOW,
                  Action.REBOOT)
ACTION_RANK: Mapping[str, int] = {a: i for i, a in enumerate(POLICY_ACTIONS)}
# Actions that take the node away (drain at once, or after the jobs' checkpoints).
DRAINING = frozenset({Action.CHECKPOINT, Action.DRAIN, Action.DRAIN_NOW, Action.REBOOT})
# Actions whose jobs are asked to checkpoint before the node goes.
CHECKPOINTING = frozenset({Action.CHECKPOINT, Action.DRAIN_NOW})

# The XID catalog's actions (``data/xid_catalog.toml``, ``[xid] overrides``) ...
XID_ACTIONS = (Action.IGNORE, Action.WARN, Action.CHECKPOINT, Action.DRAIN, Action.RESET,
               Action.REBOOT)
# ... the severity of an XID finding with that action ...
XID_ACTION_SEVERITY: Mapping[str, Severity] = {
    Action.IGNORE: Severity.OK,
    Action.WARN: Severity.WARN,
    Action.CHECKPOINT: Severity.WARN,
    Action.DRAIN: Severity.FAIL,
    Action.RESET: Severity.FAIL,
    Action.REBOOT: Severity.FAIL,
}
# ... and what the automation does about it (reboot only where reboot_allowed).
XID_POLICY: Mapping[str, Action] = {
    Action.IGNORE: Action.NONE,
    Action.WARN: Action.WARN,
    Action.CHECKPOINT: Action.CHECKPOINT,
    Action.DRAIN: Action.DRAIN,
    Action.RESET: Action.DRAIN,
    Action.REBOOT: Action.REBOOT,
}
DRAIN_NOW_XIDS = frozenset({79})  # GPU has fallen off the bus


class PolicySettings(Protocol):
    """What the policy reads of ``[automation]`` (``AutomationSettings``)."""

    @property
    def policy(self) -> Mapping[str, str]: ...

    @property
    def reboot_allowed(self) -> bool: ...

    @property
    def strikes(self) -> int: ...


class PolicyTable:
    """Finding -> action: site overrides (``check`` or ``check:SEVERITY``), then the
    built-in rules."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.overrides: dict[tuple[str, Severity | None], Action] = {}
        for key, action in settings.policy.items():
            if action not in POLICY_ACTIONS:
                raise ValueError(f"[automation] policy {key!r}: unknown action {action!r}")
            check, _, sev = key.partition(":")
            if sev and sev.upper() not in Severity.__members__:
                raise ValueError(f"[automation] policy {key!r}: unknown severity {sev!r}")
            self.overrides[(check.strip(), Severity[sev.upper()] if sev else None)] = Action(action)

    def action(self, finding: Finding, strikes: int = 1) -> Action:
        """``strikes``: consecutive reports (this one included) with this check not OK."""
        check, severity = finding.check, finding.severity
        if severity is Severity.OK or finding.not_applicable:
            return Action.NONE
        for key in ((check, severity), (check, None)):
            if key in self.overrides:
                return self._allowed(self.overrides[key])
        data = finding.data
        failing = severity is Severity.FAIL
        if check == "gpu.lost" and failing:
            return Action.DRAIN_NOW  # off the bus: the jobs on it are already failing
        if check == "xid.recent":
            if data.get("xid") in DRAIN_NOW_XIDS:
                return Action.DRAIN_NOW
            default = Action.DRAIN if failing else Action.WARN
            return self._allowed(XID_POLICY.get(str(data.get("action")), default))
        if check == "gpu.recovery_action" and failing:
            # The driver's own verdict: GPU_RESET -> reset (a drain), NODE_REBOOT -> reboot.
            return self._allowed(XID_POLICY.get(str(data.get("action")), Action.DRAIN))
        if check == "mem.row_remap" and "pending" in finding.message:
            return Action.CHECKPOINT if strikes < 2 else Action.DRAIN
        if check == "thermal.throttle" and severity is Severity.WARN:
            return Action.DRAIN if strikes >= self.settings.strikes else Action.WARN
        return Action.DRAIN if failing else Action.WARN

    def _allowed(self, action: Action) -> Action:
        if action is Action.REBOOT and not self.settings.reboot_allowed:
            return Action.DRAIN
        return action


# ---------------------------------------------------------------- drain reasons

REASON_PREFIX = "slurmgpu:"
MAX_REASON = 256
# Who may tag a reason: the three hooks and an operator's `slurmgpu drain`.
TAGGED_ACTORS = ("prolog", "epilog", "healthcheck", "operator")
# " [by epilog]", " [by operator alice]" (a login: Slurm user-name characters, <= 32)
_ACTOR_TAG = r" \[by (prolog|epilog|healthcheck|operator)(?: ([A-Za-z0-9._-]{1,32}))?\]"
_LOGIN = r"[A-Za-z0-9._-]{1,32}"


#: The XID policy's "-> action" as a drain reason says it where slurmgpu does not do it.
_NEEDS = {" -> reboot": " (needs a reboot)", " -> reset": " (needs a GPU reset)"}


def drain_reason(findings: Iterable[Finding] = (), *, text: str | None = None, strikes: int = 1,
                 one_line: bool = False, actor: str | None = None,
                 user: str | None = None, rebooting: bool = False) -> str:
    """The drain reason slurmgpu gives Slurm, always starting with ``REASON_PREFIX``.

    What it says: ``text`` (an internal error, an operator's words, a journaled reason),
    else the worst of ``findings`` with where (`` GPU 3``, `` mlx5_0/1``) and its message,
    the others counted (`` (+2 more)``), and with ``strikes`` > 1 (the collector: reports in
    a row) `` (3 reports)``; no problem among them: ``unhealthy``. A finding's
    `` -> reboot`` / `` -> reset`` (the XID policy's action) reads `` (needs a reboot)`` /
    `` (needs a GPU reset)`` unless ``rebooting`` (the node is being rebooted).

    How: as said, after ``REASON_PREFIX`` (a hook's decision record); with ``one_line``
    or an ``actor``, as Slurm is given it: whitespace folded, prefixed unless it already
    is, then the actor tag (``actor_tag``; ``user``: the operator's login), the text
    before the tag cut ("…") to keep the whole within ``MAX_REASON``."""
    body = text if text is not None else _findings_text(findings, strikes, rebooting)
    if one_line or actor is not None:
        return with_actor(with_prefix(body), actor, user)
    return f"{REASON_PREFIX} {body}"


def _findings_text(findings: Iterable[Finding], strikes: int, rebooting: bool) -> str:
    bad = sorted((f for f in findings if f.severity is not Severity.OK),
                 key=lambda f: (-f.severity.rank, f.check, f.gpu if f.gpu is not None else -1))
    if not bad:
        return "unhealthy"
    first = bad[0]
    where = f" GPU {first.gpu}" if first.gpu is not None else (f" {first.subject}" if first.subject else "")
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    times = f" ({strikes} reports)" if strikes > 1 else ""
    return f"{first.check}{where} {_needs(first.message, rebooting)}{more}{times}"


def _needs(message: str, rebooting: bool) -> str:
    for arrow, needs in _NEEDS.items():
        if message.endswith(arrow) and not (rebooting and arrow == " -> reboot"):
            return message[: -len(arrow)] + needs
    return message


def job_comment(what: str, why: str) -> str:
    """What slurmgpu did to a job and why, one line, for the job's AdminComment (its user
    reads it with `scontrol show job` and `sacct -o AdminComment`): ``slurmgpu: requeued
    from gpu-n2: gpu.lost GPU 5 GPU is lost``; ``why`` may be a drain reason (prefixed)."""
    why = why[len(REASON_PREFIX):] if why.startswith(REASON_PREFIX) else why
    return " ".join(f"{REASON_PREFIX} {what}: {why}".split())


def with_prefix(reason: str) -> str:
    """One line, starting with ``REASON_PREFIX``."""
    reason = " ".join(reason.split())
    return reason if reason.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {reason}"


def with_actor(reason: str, actor: str | None, user: str | None = None) -> str:
    """``reason`` (already prefixed) with the actor tag at its end, the text before it cut
    ("…") so that the whole stays within ``MAX_REASON`` and Slurm never cuts the tag off.
    No actor, or a reason that already names one (a journaled drain replayed by a later
    hook keeps its first actor): unchanged."""
    if actor is None or reason_actor(reason) is not None:
        return reason
    tag = actor_tag(actor, user)
    room = MAX_REASON - len(tag)
    if len(reason) > room:
        reason = reason[: room - 1].rstrip() + "…"
    return reason + tag


def actor_tag(actor: str, user: str | None = None) -> str:
    """`` [by epilog]`` / `` [by operator alice]`` (a user that is no plain login is left
    out). ValueError for an actor that is not in ``TAGGED_ACTORS``."""
    if actor not in TAGGED_ACTORS:
        raise ValueError(f"unknown drain actor {actor!r}")
    who = f" {user}" if actor == "operator" and user and re.fullmatch(_LOGIN, user) else ""
    return f" [by {actor}{who}]"


def reason_actor(reason: str | None) -> tuple[str, str | None] | None:
    """(actor, operator login or None) from a slurmgpu reason's actor tag (the last one:
    Slurm may append text after it, e.g. `` : reboot issued``); None when the reason is
    not slurmgpu's or carries no tag."""
    if not reason or not reason.startswith(REASON_PREFIX):
        return None
    tags = list(re.finditer(_ACTOR_TAG, reason))
    return (tags[-1].group(1), tags[-1].group(2)) if tags else None
