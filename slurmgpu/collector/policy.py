"""The collector's automation decisions: what to do about a node's report. Slurm is
reached only through ``slurmgpu.actions.Actions``; the state lives in the fleet database
(``slurmgpu.collector.store.automation``), each change saved as it is made.

Design notes: docs/design-notes.md (``slurmgpu/collector/policy.py``).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import slurmgpu.collector.breaker as breaker
import slurmgpu.collector.lemons as lemons
from slurmgpu.actions import Actions
from slurmgpu.collector.store import AutomationState, Store, queries
from slurmgpu.collector.store.automation import Breaker, DrainedNode, HeldDrain, Stage
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.decision import (
    ACTION_RANK,
    CHECKPOINTING,
    DRAINING,
    FINISHED,
    NEW_DRAINS,
    TAKEN_AWAY,
    Action,
    Outcome,
    drain_reason,
)
from slurmgpu.decision import PolicyTable as PolicyTable
from slurmgpu.log import get_logger
from slurmgpu.remediation.triggers import operator_opted_in
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import NodeState, SlurmClient, SlurmError, SlurmUnreachable
from slurmgpu.wire import decode_finding

if TYPE_CHECKING:
    from slurmgpu.collector.checkpoint import Checkpoints, MakeCheckpoints
    from slurmgpu.collector.remediate import Remediation

# Where a slurmgpu before schema 7 kept the state: imported into the database once.
LEGACY_STATE_FILE = "automation.json"
IMPORTED_SUFFIX = ".imported"


class Clock(Protocol):
    def time(self) -> float: ...  # (the ``time`` module is one)


@dataclass(frozen=True)
class Decision:
    node: str
    action: Action  # one of decision.POLICY_ACTIONS, or RESUME
    reason: str
    held: bool = False
    dry_run: bool = False
    trigger: str = ""  # the check id (or "healthy" for a resume)
    result: Outcome | str = ""  # what happened: a ``decision.Outcome``, or "error: ..."
    time: float = 0.0
    # A drain the breaker held and an operator released (`slurmgpu breaker release`): who.
    released_by: str = ""


def legacy_state_file(state_dir: str | Path) -> Path:
    """Where a slurmgpu before schema 7 kept the automation's state (``[paths] state_dir``);
    the collector imports it into the database at its first start."""
    return Path(state_dir) / LEGACY_STATE_FILE


class Automation:
    def __init__(self, settings: AutomationSettings, client: SlurmClient, state_dir: str | Path,
                 clock: Clock | None = None, *, store: Store, read_only: bool = False,
                 checkpoints: MakeCheckpoints | None = None) -> None:
        """``store``: the fleet database that keeps the state (the collector's own).
        ``read_only``: only look at the state (`slurmgpu breaker status`): no directory
        made, no write probe, no import; saving still works where the database is writable.
        ``checkpoints``: makes the ``Checkpoints`` that coordinate "checkpoint"/"drain-now"
        with the jobs on the node, given the drain to call once they acked (or their
        deadline passed): ``finish_pending``. None: no checkpoint coordination."""
        self.settings = settings
        self.policy = PolicyTable(settings)
        self.client = client
        self.actions = Actions(client, state_dir)
        self.store = store
        self.clock: Clock = clock or time
        if not read_only:
            _probe_writable(Path(state_dir))
        self._record = store.automation()
        if not read_only:
            self._import_legacy(legacy_state_file(state_dir))
        self.checkpoints: Checkpoints | None = (
            checkpoints(drain_node=self.finish_pending) if checkpoints is not None else None)
        # With [remediation] enabled: a drained node returns through its ladder (``ladder``).
        self.remediation: Remediation | None = None

    @property
    def state(self) -> AutomationState:
        return self._record.state

    def refresh(self) -> bool:
        """Read the state back if another process changed it since (an operator's
        `slurmgpu breaker release`); True if it did. Cheap: one indexed read."""
        return self._record.refresh()

    def _import_legacy(self, path: Path) -> None:
        """The upgrade from a slurmgpu before schema 7: its ``automation.json`` goes into a
        database that holds no automation state yet, once (held and released drains,
        lemons, the breaker survive), and is renamed ``automation.json.imported``."""
        if not path.is_file():
            return
        log = get_logger(component="automation")
        if self._record.version is not None:
            log.warning("automation_json_ignored", path=str(path), db=self.store.where,
                        why="the database already holds the automation's state")
            return
        try:
            self._record.import_json(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError,
                sqlite3.InterfaceError, sqlite3.ProgrammingError) as exc:  # unreadable, or not its shape
            raise ValueError(f"cannot import the automation state from {path} ({exc}): "
                             "repair or move it aside, then start again") from None
        try:
            path.rename(path.with_name(path.name + IMPORTED_SUFFIX))
        except OSError as exc:  # imported all the same: the database's state is the one used
            log.warning("automation_json_not_renamed", path=str(path), error=str(exc))
        st = self.state
        log.info("automation_state_imported", path=str(path), db=self.store.where,
                 breaker_open=st.breaker.open, held=len(st.held), released=len(st.released),
                 drained=len(st.drained), lemons=len(st.lemons))

    # ---- fleet and breaker

    def fleet_size(self, n: int) -> None:
        self.refresh()
        if n != self.state.fleet:
            self.state.fleet = n
            self._record.save(())

    def _fleet(self) -> int:
        return max(self.state.fleet, len(self.state.seen))

    def release(self, by: str = "operator", now: float | None = None) -> list[dict[str, Any]]:
        """Operator: close the breaker and let every drain it holds now proceed once: they
        move to ``released`` and the collector carries them out (``run_released``) whatever
        the breaker says by then, recording ``by`` in their decisions. The storm evidence is
        forgotten. Returns the released drains (``forecast()``: would it trip again?)."""
        now = self.clock.time() if now is None else now
        with self.store.transaction():  # BEGIN IMMEDIATE: read, change and write as one
            self.refresh()
            st = self.state
            released = []
            for node, held in sorted(st.held.items()):
                st.released[node] = dataclasses.replace(held, released_at=now, released_by=by)
                released.append(st.released[node].to_json(node))
            st.breaker = Breaker()
            st.held.clear()
            st.failing.clear()
            self._record.save()
        return released

    def run_released(self, now: float | None = None) -> list[Decision]:
        """Carry out the drains an operator released, once each (the breaker is not asked
        again: the operator has confirmed them). The collector calls this every loop turn."""
        self.refresh()
        st = self.state
        if not st.released:
            return []
        now = self.clock.time() if now is None else now
        nodes = set(st.released)
        decisions: list[Decision] = []
        for node, entry in sorted(st.released.items()):
            try:
                decisions += self._drain(node, entry.action, entry.reason, entry.trigger, now,
                                         then_reboot=entry.then_reboot)
            except Exception as exc:  # recorded, not retried every loop turn
                st.released.pop(node, None)
                get_logger(component="automation").error("released_drain_failed", node=node,
                                                         error=f"{type(exc).__name__}: {exc}")
                decisions.append(self._decision(node, entry.action, entry.reason, entry.trigger,
                                                f"error: {exc}", now, released_by=entry.released_by or ""))
        st.released.clear()
        self._record.save(nodes)
        return decisions

    def forecast(self, now: float | None = None) -> dict[str, Any]:
        """The breaker once the drains it holds (or that were released) are done
        (``breaker.forecast``)."""
        now = self.clock.time() if now is None else now
        return breaker.forecast(self.state, self.settings, self._fleet(), now)

    def clear_lemon(self, node: str) -> None:
        """Operator: the node was repaired; its drain history starts afresh."""
        with self.store.transaction():  # BEGIN IMMEDIATE: read, change and write as one
            self.refresh()
            lemons.clear(self.state, node)
            self._record.save((node,))

    def status(self) -> dict[str, Any]:
        """The breaker (``why``: the reason it opened with, then), the drains it holds
        (not those of nodes someone else has drained since), and the nodes Slurm shows
        drained now (``drained_now``: node -> who drained it, at the collector's last poll)."""
        st = self.state
        now_drained = {node: d.drained_by or "?" for node, d in self._current_drains().items()}
        return {
            "breaker_open": st.breaker.open,
            "since": st.breaker.since,
            "why": st.breaker.why,
            "fleet": self._fleet(),
            "drained_now": now_drained,
            "held": [v.to_json(k) for k, v in sorted(st.held.items()) if not _moot_hold(v, now_drained.get(k))],
            "released": [v.to_json(k) for k, v in sorted(st.released.items())],
            "lemons": {node: dataclasses.asdict(lemon) for node, lemon in st.lemons.items()},
            "drained": sorted(n for n, v in st.drained.items() if v.stage is not Stage.CHECKPOINTING),
            # Drained nodes reporting OK now: [OK reports, since] (auto-resume's streak).
            "healthy": {n: v for n, v in st.healthy.items() if n in st.drained},
            "checkpointing": sorted(n for n, v in st.drained.items() if v.stage is Stage.CHECKPOINTING),
            "dry_run": self.settings.dry_run,
        }

    # ---- reports

    def on_report(self, node: str, verdict: Severity, findings: Sequence[Finding],
                  now: float | None = None) -> list[Decision]:
        """One report (or event) of ``node``: its verdict and findings, as decoded from the
        wire (``Envelope.findings``)."""
        now = self.clock.time() if now is None else now
        self.refresh()
        st = self.state
        if node not in st.seen:
            st.seen.append(node)
        bad = [f for f in findings if f.severity is not Severity.OK and not f.not_applicable]
        old = st.strikes.get(node, {})
        strikes = {c: old.get(c, 0) + 1 for c in {f.check for f in bad}}
        if strikes:
            st.strikes[node] = strikes
        else:
            st.strikes.pop(node, None)
        decisions: list[Decision] = []
        if verdict is Severity.OK and not bad:
            dropped = [e for e in (st.held.pop(node, None), st.released.pop(node, None)) if e]
            if self.checkpoints is not None and any(e.checkpoints for e in dropped):
                self.checkpoints.cancel(node, now, "the node is healthy again: its held drain is dropped")
            decisions += self._healthy(node, now)
        else:
            st.healthy.pop(node, None)
            decisions += self._unhealthy(node, bad, strikes, now)
        self._record.save((node,))
        self._ladder_start(node, bad, decisions, now)
        return decisions

    # ---- the return-to-service ladder (slurmgpu.collector.remediate)

    def _ladder_start(self, node: str, bad: list[Finding], decisions: list[Decision], now: float) -> None:
        """A new drain (not one waiting for checkpoints) opens the node's ladder."""
        new = [d for d in decisions if d.result in NEW_DRAINS and d.result is not Outcome.CHECKPOINTING]
        if self.remediation is not None and new:
            self.remediation.drained(node, bad, str(new[-1].action), now)

    def _ladder_owns(self, node: str) -> bool:
        return self.remediation is not None and self.remediation.owns(node)

    def ladder_closed(self, node: str, in_service: bool) -> None:
        """The node's ladder ended: back in service, resumed by an operator, or handed to
        repair (drained, no longer the automation's to resume)."""
        self.refresh()
        if self.state.drained.pop(node, None) is not None or in_service:
            self._record.save((node,))

    def ladder_reboot(self, node: str, reason: str, now: float) -> None:
        """A reboot of the ladder: a breaker action and a step towards a lemon."""
        st = self.state
        st.drain_times.append(now)
        lemons.note_drain(st, self.settings, node, reason, now)
        self._record.save((node,))

    def operator_drains(self, states: Sequence[NodeState], now: float) -> None:
        """Operator drains that opted in (``triggers.operator_opted_in``) get a ladder."""
        rem = self.remediation
        if rem is None:
            return
        for s in states:
            if s.drained and not rem.owns(s.name) and s.name not in self.state.drained \
                    and operator_opted_in(s.reason or "", rem.settings):
                self.state.drained[s.name] = DrainedNode(now, "operator", s.reason or "")
                self._record.save((s.name,))
                rem.drained(s.name, [], None, now)

    def _unhealthy(self, node: str, bad: list[Finding], strikes: dict[str, int],
                   now: float) -> list[Decision]:
        worst, trigger = Action.NONE, None
        for f in sorted(bad, key=lambda f: f.check):
            action = self.policy.action(f, strikes.get(f.check, 1))
            if action in DRAINING:
                breaker.note_failing(self.state, self.settings, self._fleet(), f.check, node, now)
            if ACTION_RANK[action] > ACTION_RANK[worst]:
                worst, trigger = action, f
        if trigger is None or self._ladder_owns(node):
            return []  # (a node in its ladder: the ladder decides)
        check = trigger.check
        wants_reboot = str(trigger.data.get("action")) == Action.REBOOT
        then_reboot = worst is Action.DRAIN_NOW and wants_reboot and self.settings.reboot_allowed
        reason = drain_reason([trigger], strikes=self._strikes_needed(trigger, strikes.get(check, 1)),
                              one_line=True, rebooting=then_reboot or worst is Action.REBOOT)
        if worst not in DRAINING:
            result = Outcome.DRY_RUN if self.settings.dry_run else Outcome.RECORDED
            return [self._decision(node, worst, reason, check, result, now)]
        return self._drain(node, worst, reason, check, now, then_reboot=then_reboot)

    def _strikes_needed(self, finding: Finding, strikes: int) -> int:
        """The fewest reports in a row that give ``finding`` its action now: the count a
        drain reason names (a fault that drains at once names none, however many reports
        came while a breaker held it)."""
        action = self.policy.action(finding, strikes)
        return next(k for k in range(1, strikes + 1) if self.policy.action(finding, k) is action)

    def _drain(self, node: str, action: Action, reason: str, check: str, now: float, *,
               then_reboot: bool = False) -> list[Decision]:
        """Take the node away, unless it is already (or the breaker holds the drain).
        ``then_reboot``: a drain-now whose fault only a reboot clears (XID 79, with
        reboot_allowed): the jobs checkpoint and are requeued as for any drain-now, and the
        node is then rebooted (``scontrol reboot ASAP``) instead of only drained."""
        st = self.state
        released = st.released.pop(node, None)  # an operator released its held drain
        if released is not None:
            action, reason, check, then_reboot = _worse(released, action, reason, check, then_reboot)
        if node in st.drained and (done := self._drained_again(node, action, reason, check, now)) is not None:
            return done
        if released is None:  # a released drain proceeds whatever the breaker says now
            breaker.check_drain(st, self.settings, self._fleet(), node, now)
            if st.breaker.open:
                return self._hold(node, action, reason, check, now, then_reboot=then_reboot)
        else:
            st.drain_times = [t for t in st.drain_times if now - t < breaker.HOUR]
        st.held.pop(node, None)
        by = (released.released_by or "operator") if released is not None else ""
        return [self._take(node, action, reason, check, now, then_reboot=then_reboot, by=by)]

    def _drained_again(self, node: str, action: Action, reason: str, check: str,
                       now: float) -> list[Decision] | None:
        """A node the automation took away already: its pending checkpoint escalated to a
        drain-now, or nothing (idempotent); None: someone resumed it while it still
        fails, so it is drained again."""
        drained = self.state.drained[node]
        if drained.pending is Action.CHECKPOINT and action is Action.DRAIN_NOW and self.checkpoints is not None \
                and self.checkpoints.escalate(node, reason, check, now):
            drained.pending = action
            return [self._decision(node, action, reason, check, Outcome.ESCALATED, now)]
        if self.settings.dry_run or drained.stage is Stage.CHECKPOINTING or self._still_drained(node):
            return []
        del self.state.drained[node]
        return None

    def _take(self, node: str, action: Action, reason: str, check: str, now: float, *,
              then_reboot: bool, by: str) -> Decision:
        """Drain (or reboot) the node now, or once its jobs have checkpointed. ``by``: the
        operator who released the drain the breaker held."""
        st, s = self.state, self.settings
        waiting = 0
        if not s.dry_run and action in CHECKPOINTING and self.checkpoints is not None:
            # Jobs run there: they are told to checkpoint (a held drain's jobs already
            # were: their requests are reused); the drain comes at their ack.
            waiting = self.checkpoints.begin(node, action, reason, check, now, released_by=by or None)
        result: Outcome | str = Outcome.CHECKPOINTING if waiting else Outcome.DRY_RUN
        if not s.dry_run and not waiting:
            result = self._slurm_outcome(node, Action.REBOOT if then_reboot else action, reason)
        if not isinstance(result, Outcome):  # an error: nothing taken away
            return self._decision(node, action, reason, check, result, now)
        if result is Outcome.CHECKPOINTING:
            st.drained[node] = DrainedNode(now, check, reason, Stage.CHECKPOINTING, action, then_reboot)
        elif result in TAKEN_AWAY:
            st.drained[node] = DrainedNode(now, check, reason)
        if result in NEW_DRAINS:
            st.drain_times.append(now)
            lemons.note_drain(st, s, node, reason, now)
        if waiting:
            reason = f"{reason} (waiting for {waiting} job checkpoint(s))"
        if by:
            reason = f"{reason} (held by the breaker, released by {by})"
        return self._decision(node, action, reason, check, result, now, released_by=by)

    def _hold(self, node: str, action: Action, reason: str, check: str, now: float, *,
              then_reboot: bool = False) -> list[Decision]:
        """The breaker is open: the drain waits for an operator's release. The jobs on the
        node are asked to checkpoint all the same (once per hold): only the drain waits, so
        a job on a failing node can save its state meanwhile. The worst action held wins."""
        st = self.state
        prev = st.held.get(node)
        elsewhere = self._current_drains(node).get(node)
        if elsewhere is not None and _moot_hold(prev, elsewhere.drained_by) and action not in CHECKPOINTING:
            # The prolog, an operator, ... drained it since: nothing is left to hold.
            if st.held.pop(node, None) is None:
                return []
            return [self._decision(node, action, f"{reason} (drained meanwhile by "
                                   f"{elsewhere.drained_by or '?'}: no longer held)", check,
                                   Outcome.ALREADY_DRAINED, now)]
        entry = HeldDrain(action, reason, check, now, now, then_reboot)
        if prev is not None:
            entry.action, entry.reason, entry.trigger, entry.then_reboot = _worse(
                prev, action, reason, check, then_reboot)
            entry.since, entry.checkpoints = prev.since, prev.checkpoints
        if entry.checkpoints is None and not self.settings.dry_run and entry.action in CHECKPOINTING \
                and self.checkpoints is not None:
            entry.checkpoints = self.checkpoints.request(node, entry.action, entry.reason, entry.trigger, now)
            if entry.checkpoints:
                reason = f"{reason} (drain held; {entry.checkpoints} job(s) asked to checkpoint)"
        st.held[node] = entry
        return [self._decision(node, action, reason, check, Outcome.HELD, now, held=True)]

    def _take_away(self, node: str, action: Action, reason: str) -> Outcome:
        """Drain, or for REBOOT `scontrol reboot ASAP nextstate=RESUME` (a drain when
        Slurm refuses the reboot, e.g. no RebootProgram). With return to service the node's
        ladder reboots it, held down until validated: a drain here."""
        if action is Action.REBOOT and self.remediation is None:
            try:
                return self.actions.reboot(node, reason).action
            except SlurmUnreachable:
                raise
            except SlurmError as e:
                get_logger(component="automation").warning("reboot_refused_draining", node=node,
                                                           error=str(e))
        return self.actions.drain(node, reason).action

    def _slurm_outcome(self, node: str, action: Action, reason: str) -> Outcome | str:
        """``_take_away``'s outcome: unreachable (journaled by Actions, replayed later), or
        ``error: ...``."""
        try:
            return self._take_away(node, action, reason)
        except SlurmUnreachable:
            return Outcome.UNREACHABLE
        except SlurmError as e:
            return f"error: {e}"

    def finish_pending(self, node: str, action: Action, reason: str, trigger: str,
                       now: float) -> Decision:
        """The jobs on ``node`` have checkpointed (or run out of time): drain it now (or
        reboot it, when the drain-now was for a fault only a reboot clears)."""
        self.refresh()
        st = self.state
        entry = st.drained.get(node)
        reboot = entry is not None and entry.then_reboot
        result = self._slurm_outcome(node, Action.REBOOT if reboot else Action.DRAIN, reason)
        if result not in FINISHED:
            st.drained.pop(node, None)  # an operator's drain, or an error: not ours
        elif entry is None:
            st.drained[node] = DrainedNode(now, trigger, reason)
        else:
            entry.stage, entry.pending, entry.then_reboot = Stage.DRAINED, None, False
        decision = self._decision(node, action, reason, trigger, result, now)
        self._record.save((node,))
        if result in FINISHED & NEW_DRAINS and self.remediation is not None and not self.remediation.owns(node):
            self.remediation.drained(node, self._drain_findings(node, trigger, reason),
                                     str(Action.REBOOT) if reboot else None, now)
        return decision

    def _drain_findings(self, node: str, trigger: str, reason: str) -> list[Finding]:
        """What a drain carried out later was for, as the ladder starts from it: the
        trigger's failing findings in the node's latest report (their GPUs, the action
        they ask for: a reset first), else one naming the check with the drain's reason."""
        try:
            latest = queries.latest_report(self.store.db, node)
            body: dict[str, Any] = latest["body"] if latest is not None else {}
            found = [decode_finding(f, "report") for f in body.get("findings", ())]
        except Exception as exc:  # (what it adds is detail: the drain stands without it)
            get_logger(component="automation").warning("drain_findings_unread", node=node, error=str(exc))
            found = []
        mine = [f for f in found if f.check == trigger and f.severity is Severity.FAIL]
        return mine or [Finding(trigger or "unknown", Severity.FAIL, reason)]

    def _current_drains(self, node: str | None = None) -> dict[str, queries.CurrentDrain]:
        """Slurm's drained nodes as the collector last polled them (none when it cannot tell)."""
        try:
            return queries.current_drains(self.store.db, node)
        except sqlite3.Error:
            return {}

    def _still_drained(self, node: str) -> bool:
        try:
            return bool(self.client.node(node).drained)
        except SlurmError:
            return True  # cannot tell: do not drain twice

    def _healthy(self, node: str, now: float) -> list[Decision]:
        st, s = self.state, self.settings
        drained = st.drained.get(node)
        if drained is None or drained.stage is not Stage.DRAINED or lemons.is_lemon(st, node):
            return []
        count, first = st.healthy.get(node, [0, now])
        count += 1
        st.healthy[node] = [count, first]
        if count < s.resume_healthy_reports or now - first < s.resume_after_s:
            return []
        reason = f"{int(count)} OK reports over {now - first:g} s"
        st.healthy.pop(node, None)
        if self.remediation is not None:
            if not self.remediation.owns(node):  # (drained before [remediation] was enabled)
                self.remediation.drained(node, [Finding(drained.trigger or "unknown", Severity.FAIL,
                                                        drained.reason)], None, now)
            self.remediation.healthy(node, now)
            return []
        if s.dry_run:
            result = Outcome.DRY_RUN
        else:
            try:
                result = self.actions.resume_recovered(node).action
            except SlurmError as e:
                return [self._decision(node, Action.RESUME, reason, "healthy", f"error: {e}", now)]
        if result is not Outcome.REBOOTING_LEFT_ALONE:
            # resumed, or no longer ours to resume (operator drain, sticky XID drain, not drained)
            st.drained.pop(node, None)
        return [self._decision(node, Action.RESUME, reason, "healthy", result, now)]

    # ---- helpers

    def _decision(self, node: str, action: Action, reason: str, trigger: str, result: Outcome | str, now: float,
                  *, held: bool = False, released_by: str = "") -> Decision:
        return Decision(node, action, reason, held=held, dry_run=self.settings.dry_run,
                        trigger=trigger, result=result, time=now, released_by=released_by)


def _probe_writable(state_dir: Path) -> None:
    """Automation that cannot journal what it does must not do anything: refuse to start (a
    ValueError naming the directory) rather than drain nodes with no trace."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=state_dir)  # leaves nothing
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"automation state directory {state_dir} is not writable "
                         f"({exc.strerror or exc}): fix it, or run without [automation]") from None


def _moot_hold(entry: HeldDrain | None, drained_by: str | None) -> bool:
    """A held drain that has nothing left to do: someone other than the automation has
    drained the node since, and no job there waits on it (asked to checkpoint: the
    release still requeues them)."""
    return drained_by is not None and drained_by != "automation" and not (entry and entry.checkpoints)


def _worse(held: HeldDrain, action: Action, reason: str, check: str,
           then_reboot: bool) -> tuple[Action, str, str, bool]:
    """The worse of a held drain and a new one (its action, reason and check), and
    whether a reboot follows."""
    if ACTION_RANK.get(held.action, -1) > ACTION_RANK[action]:
        action, reason, check = held.action, held.reason, held.trigger
    return action, reason, check, then_reboot or held.then_reboot
