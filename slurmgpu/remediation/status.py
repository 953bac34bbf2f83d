"""Where a node is in its ladder, what happens next and when, for `slurmgpu fleet` and
`slurmgpu nodes` (``ladder_status``)."""

from __future__ import annotations

from dataclasses import dataclass

from slurmgpu.remediation.ladder import Ladder, Stage, waiting_for_breaker


@dataclass(frozen=True)
class LadderStatus:
    """``next``: what the ladder waits for or does next; ``at``: when (a deadline or the
    end of a backoff; None: on an event)."""

    node: str
    stage: str
    next: str
    at: float | None

    def text(self, now: float) -> str:
        """``reset: retry in 4 min``, ``awaiting_validation: result of job 77, timeout in 25 min``."""
        if self.at is None:
            return f"{self.stage}: {self.next}"
        left = max(self.at - now, 0.0)
        return f"{self.stage}: {self.next} in {_span(left)}"

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "stage": self.stage, "next": self.next, "at": self.at}


_WAITING = {
    Stage.VALIDATING: "result of the validation",
    Stage.RESETTING: "reset to finish",
    Stage.REBOOTING: "node back from its reboot",
}
_DUE = {Stage.VALIDATING: "validation again", Stage.RESETTING: "reset again", Stage.REBOOTING: "reboot again"}
_ON_EVENT = {
    Stage.DRAINED: "validation once the passive checks pass",
    Stage.HELD: "held drained: an operator resumes it (or a new leader tries once more)",
    Stage.REPAIR: "in repair (ticket handed off)",
    Stage.VALIDATED: "back in service",
    Stage.OPERATOR_RESUMED: "resumed by an operator",
}


def ladder_status(ladder: Ladder) -> LadderStatus:
    stage = ladder.stage
    if stage in _WAITING and ladder.issued_at is not None:
        waiting = f"result of job {ladder.job_id}" if stage is Stage.VALIDATING and ladder.job_id else _WAITING[stage]
        timeout = ", timeout" if ladder.deadline is not None else " (dry run: nothing started)"
        return LadderStatus(ladder.node, str(stage), waiting + timeout, ladder.deadline)
    if waiting_for_breaker(ladder):
        return LadderStatus(ladder.node, str(stage), "held back while the automation's breaker is open "
                            "(`slurmgpu breaker status`)", None)
    if stage in _DUE and ladder.due is not None:
        return LadderStatus(ladder.node, str(stage), _DUE[stage], ladder.due)
    return LadderStatus(ladder.node, str(stage), _ON_EVENT.get(stage, "-"), None)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
