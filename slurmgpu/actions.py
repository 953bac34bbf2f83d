"""Actions on Slurm: the one place that drains and resumes nodes.

Rules an admin can rely on:
* every reason slurmgpu writes starts with ``slurmgpu:``; a drain by a hook or by
  ``slurmgpu drain`` ends with who did it (`` [by epilog]``, `` [by operator alice]``);
* a node drained by someone else keeps its reason: slurmgpu never overrides it
  and never resumes it;
* nodes being rebooted are left alone;
* a drain that cannot reach slurmctld is written to a journal and retried by
  the next prolog/epilog/healthcheck run, so nothing is lost.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# The reason vocabulary (slurmgpu.decision); drain_reason, with_actor and MAX_REASON stay
# importable from here.
from slurmgpu.decision import MAX_REASON as MAX_REASON
from slurmgpu.decision import REASON_PREFIX, Action, Outcome
from slurmgpu.decision import drain_reason as drain_reason
from slurmgpu.decision import with_actor as with_actor
from slurmgpu.record import record
from slurmgpu.slurm import SlurmClient, SlurmError, SlurmUnreachable

# Checks whose failures are events, not states: the hardware can look healthy
# right after them, so a node drained for one is not auto-resumed.
STICKY_CHECKS = ("xid.recent",)


@record(frozen=True)
class ActionResult:
    node: str
    action: Outcome
    reason: str | None = None

    @property
    def changed(self) -> bool:
        return self.action in (Outcome.DRAINED, Outcome.RESUMED, Outcome.REBOOT_REQUESTED)


class Actions:
    def __init__(self, client: SlurmClient, state_dir: str | Path) -> None:
        self.client = client
        self.journal = Path(state_dir) / "pending-actions.jsonl"

    def drain(self, node: str, reason: str, *, actor: str | None = None,
              user: str | None = None) -> ActionResult:
        """``actor`` (``prolog``, ``epilog``, ``healthcheck``, ``operator`` with the
        operator's login as ``user``) is written into the reason as a tag (see
        ``with_actor``); the automation passes none (its decisions are recorded)."""
        return self._take_away(Action.DRAIN, node, reason, actor, user)

    def reboot(self, node: str, reason: str) -> ActionResult:
        """``scontrol reboot ASAP nextstate=RESUME``: drain now, reboot when idle,
        resume after. An operator's drain is kept and a rebooting node left alone;
        a node slurmgpu drained is rebooted. Unreachable slurmctld: journaled."""
        return self._take_away(Action.REBOOT, node, reason)

    def _take_away(self, action: Action, node: str, reason: str, actor: str | None = None,
                   user: str | None = None) -> ActionResult:
        reason = drain_reason(text=reason, one_line=True, actor=actor, user=user)
        try:
            current = self.client.node(node)
            if current.drained and not current.owned_by_slurmgpu:
                return ActionResult(node, Outcome.OPERATOR_DRAIN_KEPT, current.reason)
            if action is Action.DRAIN and current.drained:
                return ActionResult(node, Outcome.ALREADY_DRAINED, current.reason)
            if action is Action.REBOOT and current.rebooting:
                return ActionResult(node, Outcome.ALREADY_REBOOTING, current.reason)
            (self.client.reboot if action is Action.REBOOT else self.client.drain)(node, reason)
        except SlurmUnreachable:
            self._remember({"action": action.value, "node": node, "reason": reason, "time": time.time()})
            raise
        return ActionResult(node, Outcome.REBOOT_REQUESTED if action is Action.REBOOT else Outcome.DRAINED, reason)

    def resume(self, node: str, *, force: bool = False) -> ActionResult:
        """Resume a node slurmgpu drained (any drained node with force)."""
        current = self.client.node(node)
        if not current.drained:
            return ActionResult(node, Outcome.NOT_DRAINED, current.reason)
        if current.rebooting:
            return ActionResult(node, Outcome.REBOOTING_LEFT_ALONE, current.reason)
        if not current.owned_by_slurmgpu and not force:
            return ActionResult(node, Outcome.OPERATOR_DRAIN_KEPT, current.reason)
        self.client.resume(node)
        return ActionResult(node, Outcome.RESUMED, current.reason)

    def resume_recovered(self, node: str) -> ActionResult:
        """Healthcheck path: resume only slurmgpu drains for conditions that clear."""
        current = self.client.node(node)
        reason = current.reason or ""
        if current.drained and current.owned_by_slurmgpu and _is_sticky(reason):
            return ActionResult(node, Outcome.STICKY_DRAIN_KEPT, reason)
        return self.resume(node)

    def replay_pending(self) -> list[ActionResult]:
        """Retry drains and reboots that could not reach slurmctld earlier (by the
        entry's "action"; none: drain). Unreachable again: kept."""
        try:
            lines = self.journal.read_text().splitlines()
        except FileNotFoundError:
            return []
        results, keep = [], []
        for line in lines:
            try:
                entry = json.loads(line)
                redo = self.reboot if entry.get("action") == Action.REBOOT else self.drain
                results.append(redo(entry["node"], entry["reason"]))
            except SlurmUnreachable:
                keep.append(line)
            except (SlurmError, ValueError, KeyError):
                continue  # node gone or garbage line: nothing sensible to retry
        # drain()/reboot() re-journal unreachable entries themselves; write back only what is left.
        self._rewrite(keep)
        return results

    def _remember(self, entry: dict[str, object]) -> None:
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self, lines: list[str]) -> None:
        unique = list(dict.fromkeys(lines))
        if not unique:
            self.journal.unlink(missing_ok=True)
            return
        tmp = self.journal.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in unique))
        os.replace(tmp, self.journal)


def _is_sticky(reason: str) -> bool:
    body = reason[len(REASON_PREFIX):].strip()
    return any(body.startswith(check) for check in STICKY_CHECKS)
