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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import (
    REASON_PREFIX,
    SlurmClient,
    SlurmError,
    SlurmUnreachable,
    actor_tag,
    reason_actor,
)

# Checks whose failures are events, not states: the hardware can look healthy
# right after them, so a node drained for one is not auto-resumed.
STICKY_CHECKS = ("xid.recent",)
MAX_REASON = 256


@dataclass(frozen=True)
class ActionResult:
    node: str
    action: str  # "drained", "already-drained", "operator-drain-kept", "resumed", "not-drained", ...
    reason: str | None = None

    @property
    def changed(self) -> bool:
        return self.action in ("drained", "resumed", "reboot-requested")


def drain_reason(findings: Sequence[Finding]) -> str:
    """``slurmgpu: mem.row_remap GPU 3 row remapping failed ...`` from the worst findings."""
    bad = sorted((f for f in findings if f.severity is not Severity.OK),
                 key=lambda f: (-f.severity.rank, f.check, f.gpu if f.gpu is not None else -1))
    if not bad:
        return f"{REASON_PREFIX} unhealthy"
    first = bad[0]
    where = f" GPU {first.gpu}" if first.gpu is not None else (f" {first.subject}" if first.subject else "")
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{REASON_PREFIX} {first.check}{where} {first.message}{more}"


def with_prefix(reason: str) -> str:
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


class Actions:
    def __init__(self, client: SlurmClient, state_dir: str | Path) -> None:
        self.client = client
        self.journal = Path(state_dir) / "pending-actions.jsonl"

    def drain(self, node: str, reason: str, *, actor: str | None = None,
              user: str | None = None) -> ActionResult:
        """``actor`` (``prolog``, ``epilog``, ``healthcheck``, ``operator`` with the
        operator's login as ``user``) is written into the reason as a tag (see
        ``with_actor``); the automation passes none (its decisions are recorded)."""
        return self._take_away("drain", node, reason, actor, user)

    def reboot(self, node: str, reason: str) -> ActionResult:
        """``scontrol reboot ASAP nextstate=RESUME``: drain now, reboot when idle,
        resume after. An operator's drain is kept and a rebooting node left alone;
        a node slurmgpu drained is rebooted. Unreachable slurmctld: journaled."""
        return self._take_away("reboot", node, reason)

    def _take_away(self, action: str, node: str, reason: str, actor: str | None = None,
                   user: str | None = None) -> ActionResult:
        reason = with_actor(with_prefix(reason), actor, user)
        try:
            current = self.client.node(node)
            if current.drained and not current.owned_by_slurmgpu:
                return ActionResult(node, "operator-drain-kept", current.reason)
            if action == "drain" and current.drained:
                return ActionResult(node, "already-drained", current.reason)
            if action == "reboot" and current.rebooting:
                return ActionResult(node, "already-rebooting", current.reason)
            (self.client.reboot if action == "reboot" else self.client.drain)(node, reason)
        except SlurmUnreachable:
            self._remember({"action": action, "node": node, "reason": reason, "time": time.time()})
            raise
        return ActionResult(node, "reboot-requested" if action == "reboot" else "drained", reason)

    def resume(self, node: str, *, force: bool = False) -> ActionResult:
        """Resume a node slurmgpu drained (any drained node with force)."""
        current = self.client.node(node)
        if not current.drained:
            return ActionResult(node, "not-drained", current.reason)
        if current.rebooting:
            return ActionResult(node, "rebooting-left-alone", current.reason)
        if not current.owned_by_slurmgpu and not force:
            return ActionResult(node, "operator-drain-kept", current.reason)
        self.client.resume(node)
        return ActionResult(node, "resumed", current.reason)

    def resume_recovered(self, node: str) -> ActionResult:
        """Healthcheck path: resume only slurmgpu drains for conditions that clear."""
        current = self.client.node(node)
        reason = current.reason or ""
        if current.drained and current.owned_by_slurmgpu and _is_sticky(reason):
            return ActionResult(node, "sticky-drain-kept", reason)
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
                redo = self.reboot if entry.get("action") == "reboot" else self.drain
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
