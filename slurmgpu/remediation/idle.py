"""Idle-time validation as pure functions: whether a node may take an idle validation
now, and what an idle validation job that ended (or that Slurm forgot) was, as the
``validations`` table's verdict and outcome (docs/remediation.md, "Idle-time validation")."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

#: Node flags that keep an idle validation off: slurmgpu, an operator or Slurm has other
#: plans for the node.
BLOCKING_FLAGS = frozenset({
    "DRAIN", "NOT_RESPONDING", "MAINTENANCE", "RESERVED", "REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
    "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN", "COMPLETING", "FAIL",
})
#: ``slurmgpu validate``'s exit codes (0 OK, 1 WARN, 2 FAIL) as verdicts; 3 (UNKNOWN) and
#: anything else: the run judged nothing.
EXIT_VERDICTS = {0: "pass", 1: "pass", 2: "fail"}
#: Job end states that are not the validation's own verdict.
_ENDED = {"PREEMPTED": "preempted", "CANCELLED": "cancelled", "TIMEOUT": "timeout", "DEADLINE": "expired",
          "NODE_FAIL": "lost", "BOOT_FAIL": "lost", "REVOKED": "lost", "OUT_OF_MEMORY": "error"}


def why_not_now(state: str, flags: Collection[str], in_ladder: bool) -> str | None:
    """None when the node may take an idle validation now (idle, nothing else planned for
    it); else the reason in a few words."""
    if in_ladder:
        return "in a return-to-service ladder"
    blocking = sorted(set(flags) & BLOCKING_FLAGS)
    if blocking:
        return f"flagged {','.join(blocking).lower()}"
    if state != "idle":
        return f"{state}, not idle"
    return None


@dataclass(frozen=True)
class IdleResult:
    """``verdict``: pass, fail (the node's own), or what ended the run instead (preempted,
    cancelled, timeout, expired, lost, error); ``outcome``: what comes of it."""

    verdict: str
    outcome: str

    @property
    def judged(self) -> bool:
        return self.verdict in ("pass", "fail")


def ended_job(state: str, exit_code: int | None, state_reason: str | None = None) -> IdleResult:
    """What an ended idle validation job was: its exit code when it completed or failed,
    else the way it ended. A job cancelled for a preemption is preempted, not a failure."""
    if state == "PREEMPTED" or (state == "CANCELLED" and "preempt" in (state_reason or "").lower()):
        return IdleResult("preempted", "preempted")
    if state in ("COMPLETED", "FAILED"):
        verdict = EXIT_VERDICTS.get(exit_code if exit_code is not None else -1, "error")
        return IdleResult(verdict, {"pass": "passed", "fail": "reported"}.get(verdict, "retried"))
    return IdleResult(_ENDED.get(state, "error"), "retried")


def lost_job() -> IdleResult:
    """A job Slurm no longer knows (purged after ``MinJobAge``, or a lost controller state)."""
    return IdleResult("lost", "retried")
