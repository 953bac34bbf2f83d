"""The collector's remediation executor: it keeps each node's open ladder
(``slurmgpu.remediation.ladder``), saves every turn (``record_ladder``) before it carries
the turn's steps out through the (fenced) Slurm client, and reports what happened back
as events. What slurmgpu creates in Slurm follows ``slurmgpu.slurm.owned``'s naming; the
GPU reset runs as a job in the node's reservation. docs/remediation.md, "Wiring".
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurmgpu.collector.store import Store, queries
from slurmgpu.collector.store.remediation import load_ladders, record_ladder
from slurmgpu.config.schema import RemediationSettings
from slurmgpu.decision import with_prefix
from slurmgpu.facts import GpuFacts, NodeFacts
from slurmgpu.log import get_logger
from slurmgpu.remediation import ladder as lad
from slurmgpu.remediation import steps as st
from slurmgpu.remediation.repair import run_repair
from slurmgpu.remediation.ticket import build_ticket
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import JobGone, JobInfo, NodeState, SlurmClient, SlurmError, owned
from slurmgpu.wire import WireError, decode_finding

#: How often the open ladders look at their jobs in Slurm,
POLL_S = 1.0
#: and at their nodes (drained, held, rebooting, resumed by an operator): one query for all.
NODE_POLL_S = 5.0
#: `slurmgpu remediate reset`'s exit code for a GPU a process holds.
RESET_BUSY = 1
#: `slurmgpu validate`'s exit codes: OK or WARN pass, FAIL fails; any other is its own trouble.
OK, WARNED, FAILED = 0, 1, 2
#: A failed validation whose output the head cannot read waits this long after the job's
#: end for its findings as a ``validation`` event (``validate --send``, through the agent).
EVENT_WAIT_S = 60.0


class Remediation:
    """Open ladders by node. ``note_action``: told of each reboot it makes (the breaker's
    and the lemons' count); ``on_closed``: told when a ladder ends (and whether the node
    is in service); ``breaker_open``: whether the automation's breaker holds the remedies."""

    def __init__(self, settings: RemediationSettings, client: SlurmClient, store: Store, state_dir: Path, *,
                 dry_run: bool = False, program: Sequence[str] = ("slurmgpu",),
                 note_action: Callable[[str, str, float], None] | None = None,
                 on_closed: Callable[[str, bool], None] | None = None, poll_s: float = POLL_S,
                 node_poll_s: float = NODE_POLL_S, breaker_open: Callable[[], bool] = lambda: False) -> None:
        self.settings, self.client, self.store, self.dry_run = settings, client, store, dry_run
        self.breaker_open = breaker_open
        self.program = tuple(program)
        self.out_dir = Path(state_dir) / "validations"
        self.note_action, self.on_closed = note_action, on_closed
        self.ladders: dict[str, lad.Ladder] = {}
        self._reset_jobs: dict[str, str] = {}  # node -> its reset job (asked again at a Restart)
        self.poll_s, self._next_poll = poll_s, 0.0
        self.node_poll_s, self._next_node_poll = node_poll_s, 0.0
        self._states: dict[str, NodeState] | None = None  # this node poll's answer, when shared
        self.log = get_logger(component="remediation")

    # ---- what the automation tells it

    def owns(self, node: str) -> bool:
        return node in self.ladders

    def drained(self, node: str, findings: Sequence[Finding], action: str | None, now: float) -> None:
        """slurmgpu (or an opted-in operator) drained ``node``: its ladder starts."""
        if node not in self.ladders:
            self._apply(lad.start(node, findings, now, self.settings, action=action, dry_run=self.dry_run,
                                  breaker_open=self.breaker_open()), now)

    def healthy(self, node: str, now: float) -> None:
        """The passive checks pass again (where the automation used to resume the node)."""
        ladder = self.ladders.get(node)
        if ladder is not None and ladder.stage is lad.Stage.DRAINED:
            self._event(ladder, st.PassiveHealthy(), now)

    def take_over(self, now: float) -> None:
        """Collector start or new leader: the open ladders resume (``Restart``); what
        slurmgpu left in Slurm for a node without one is removed."""
        self.ladders = {}
        for node, data in load_ladders(self.store.db).items():
            try:
                self.ladders[node] = lad.from_json(data)
            except ValueError as exc:
                self.log.error("ladder_unreadable", node=node, error=str(exc))
        if not self.dry_run:
            done = owned.cleanup(self.client, keep_nodes=set(self.ladders))
            self.log.info("remediation_cleanup", jobs=done.cancelled_jobs, reservations=done.deleted_reservations)
        for ladder in list(self.ladders.values()):
            self._event(ladder, st.Restart(), now)

    def tick(self, now: float) -> None:
        """Every loop turn: each open ladder's job or node looked at (every ``poll_s``),
        then time (backoffs, deadlines)."""
        if time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + self.poll_s
        nodes_too = time.monotonic() >= self._next_node_poll
        if nodes_too:
            self._next_node_poll, self._states = time.monotonic() + self.node_poll_s, None
        for node in list(self.ladders):
            event = None if self.dry_run else self._observe(self.ladders[node], nodes_too, now)
            if event is not None:
                self._event(self.ladders[node], event, now)
            if node in self.ladders:
                self._event(self.ladders[node], st.Tick(), now)

    # ---- turns

    def _event(self, ladder: lad.Ladder, event: st.Event, now: float) -> None:
        self._apply(lad.advance(ladder, event, now, self.settings, dry_run=self.dry_run,
                                breaker_open=self.breaker_open()), now)

    def _apply(self, decision: lad.Decision, now: float) -> None:
        """Save the turn, then carry its steps out in order; a step whose outcome is an
        event ends the turn and the ladder hears it (the rest of the steps were its
        followers)."""
        ladder = decision.ladder
        with self.store.transaction() as db:
            record_ladder(db, ladder, now, self._gpu_model(ladder.node))
        if not ladder.closed:
            self.ladders[ladder.node] = ladder
        elif self.ladders.pop(ladder.node, None) is not None and self.on_closed is not None:
            self.on_closed(ladder.node, ladder.stage is not lad.Stage.REPAIR)
        for step in decision.steps:
            self.log.info("remediation_step", node=ladder.node, step=step.kind, stage=str(ladder.stage))
            event = self._carry(step, ladder, now)
            if event is not None:
                self._event(ladder, event, now)
                return

    def _carry(self, step: st.Step, ladder: lad.Ladder, now: float) -> st.Event | None:
        try:
            return self._do(step, ladder, now)
        except SlurmError as exc:
            self.log.warning("remediation_step_failed", node=step.node, step=step.kind, error=str(exc))
            if isinstance(step, st.ResetGpus):
                return st.ResetFailed(str(exc))
            if isinstance(step, st.CreateReservation | st.ResumeIntoReservation | st.SubmitValidation | st.Drain):
                return st.StepFailed(step.kind, str(exc))
            return None

    def _do(self, step: st.Step, ladder: lad.Ladder, now: float) -> st.Event | None:
        c = self.client
        if isinstance(step, st.CreateReservation):
            c.create_reservation(step.node, duration_min=_minutes(step.duration_s), users=owned.service_users())
        elif isinstance(step, st.ResumeIntoReservation):
            c.resume(step.node)
        elif isinstance(step, st.SubmitValidation):
            return st.ValidationSubmitted(self._submit(step.node, step.reservation,
                                                      ["validate", "--tier", step.tier, "--json", "--send"], step.timeout_s))
        elif isinstance(step, st.Release):
            c.delete_reservation(step.reservation)
        elif isinstance(step, st.Cleanup):
            self._cleanup(step.node, step.reservation, step.job_id)
        elif isinstance(step, st.Drain):
            c.drain(step.node, step.reason)
        elif isinstance(step, st.ResetGpus):
            self._reset(step)
        elif isinstance(step, st.Reboot):
            if self.note_action is not None:
                self.note_action(step.node, step.reason, now)
            c.reboot_and_hold(step.node, step.reason)
        elif isinstance(step, st.RunRepair):
            return self._repair(ladder, step.reason, now)
        return None

    # ---- the steps

    def _submit(self, node: str, reservation: str, args: list[str], timeout_s: float) -> str:
        return self.client.submit_validation(node, [*self.program, *args], reservation=reservation,
                                             time_limit_min=_minutes(timeout_s), output=self._job_output(node))

    def _out(self, node: str) -> Path:
        return self.out_dir / f"{node}.out"

    def _job_output(self, node: str) -> str:
        """A job's ``--output``, its directory made first (Slurm 22.05 does not make it)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return str(self._out(node))

    def _reset(self, step: st.ResetGpus) -> None:
        """The reset runs on the node as a job in its reservation (named like the
        validation: ``slurmgpu.slurm.owned`` cleans it up the same way), one
        ``remediate reset --gpu N`` per GPU; its exit code is the result."""
        gpus = step.gpus or tuple(range(len(_gpus(self._facts(step.node)))))
        argv = ["sh", "-c", " && ".join(owned.wrap_text([*self.program, "remediate", "reset", "--gpu", str(g)])
                                        for g in gpus) or "true"]
        reservation = owned.reservation_name(step.node)
        self.client.create_reservation(step.node, duration_min=_minutes(self.settings.reset_timeout_s) + 5,
                                       users=owned.service_users())
        self.client.resume(step.node)
        self._reset_jobs[step.node] = self.client.submit_validation(
            step.node, argv, reservation=reservation, time_limit_min=_minutes(self.settings.reset_timeout_s),
            output=self._job_output(step.node))

    def _cleanup(self, node: str, reservation: str | None, job_id: str | None) -> None:
        if job_id:
            self.client.cancel_job(job_id)
        if reservation:
            self.client.delete_reservation(reservation)

    def _repair(self, ladder: lad.Ladder, reason: str, now: float) -> st.Event:
        if not self.settings.repair_command:
            return st.RepairDone(None, "no repair_command")
        ticket = build_ticket(ladder, _gpus(self._facts(ladder.node)), now, reason)
        done = run_repair(self.settings.repair_command, ticket, self.settings.repair_timeout_s)
        self.log.info("repair_command", node=ladder.node, exit_code=done.exit_code, error=done.error)
        return st.RepairDone(done.exit_code, done.error)

    # ---- looking at Slurm

    def _observe(self, ladder: lad.Ladder, nodes_too: bool, now: float) -> st.Event | None:
        """What Slurm shows of the ladder's current step, as an event (None: nothing new);
        its node's state only on a node poll (``nodes_too``)."""
        try:
            if ladder.stage is lad.Stage.VALIDATING and ladder.job_id:
                return self._validation_result(ladder, now)
            if ladder.stage is lad.Stage.RESETTING and ladder.issued_at is not None:
                return self._reset_result(ladder.node)
            if not nodes_too or not _on_its_node(ladder):
                return None
            if ladder.stage is lad.Stage.REBOOTING and ladder.issued_at is not None:
                return self._back(ladder.node)
            return self._resumed_by_operator(ladder.node)  # (no step out: it should be drained)
        except JobGone:
            return st.StepFailed("validation", "Slurm no longer knows the job") \
                if ladder.stage is lad.Stage.VALIDATING else st.ResetFailed("the reset job is gone")
        except SlurmError as exc:
            self.log.warning("remediation_poll_failed", node=ladder.node, error=str(exc))
        return None

    def _validation_result(self, ladder: lad.Ladder, now: float) -> st.Event | None:
        job = self.client.job(str(ladder.job_id))
        if job.state not in owned.ENDED_JOB_STATES:
            return None
        findings = self._findings(ladder, job, now)
        if findings is None:
            return None  # (its event may be on its way)
        if (job.state, job.exit_code) == ("COMPLETED", OK) or _warned(job, findings):
            return st.ValidationPassed(job.job_id, findings)
        if job.state == "FAILED" and job.exit_code == FAILED:
            return st.ValidationFailed(job.job_id, findings)
        return st.StepFailed("validation", f"job {job.job_id} ended {job.state} (exit {job.exit_code})")

    def _findings(self, ladder: lad.Ladder, job: JobInfo, now: float) -> tuple[Finding, ...] | None:
        """The validation's findings: its ``--json`` output where the head node reads it (a
        shared file system), else its ``validation`` event since the run was issued; a job
        that judged the node (exit 1 or 2) with neither waits ``EVENT_WAIT_S``, then names
        its exit code."""
        found = _output_findings(self._out(ladder.node))
        if found is None and ladder.validations:
            event = queries.validation_since(self.store.db, ladder.node, ladder.validations[-1].started)
            found = _event_findings(event) if event is not None else None
        if found is not None:
            return found
        if job.exit_code in (None, 0):
            return ()
        judged = job.state == "FAILED" and job.exit_code in (WARNED, FAILED)  # (else no findings judge it)
        if judged and job.end_time is not None and now - job.end_time < EVENT_WAIT_S:
            return None
        return (Finding("validate.job", Severity.FAIL, f"validation job exit {job.exit_code}"),)

    def _reset_result(self, node: str) -> st.Event | None:
        job_id = self._reset_jobs.get(node)
        if job_id is None:
            return None
        job = self.client.job(job_id)
        if job.state not in owned.ENDED_JOB_STATES:
            return None
        del self._reset_jobs[node]
        # Out of service again before the reservation goes: no job slips in.
        self.client.drain(node, with_prefix("reset done, validation next"))
        self.client.delete_reservation(owned.reservation_name(node))
        if job.exit_code == 0:
            return st.ResetDone()
        return st.ResetFailed(f"reset job {job.job_id} exit {job.exit_code}", busy=job.exit_code == RESET_BUSY)

    def _node(self, node: str) -> NodeState:
        """The node's state: from one `nodes()` a node poll shared by every ladder that
        waits on its node, or alone when it is the only one."""
        if self._states is None:
            waiting = sum(1 for ladder in self.ladders.values() if _on_its_node(ladder))
            self._states = {s.name: s for s in self.client.nodes()} if waiting > 1 else {}
        state = self._states.get(node)
        return self.client.node(node) if state is None else state

    def _back(self, node: str) -> st.Event | None:
        """Back from the reboot the ladder asked for (Slurm set its reboot flag then): down
        with "reboot complete", or (ReturnToService=2 returns a DOWN node that registers)
        up and responding, the flag gone."""
        state = self._node(node)
        if state.rebooting:
            return None
        up = state.state != "down" and "NOT_RESPONDING" not in state.flags
        return st.NodeBack() if up or "reboot complete" in (state.reason or "") else None

    def _resumed_by_operator(self, node: str) -> st.Event | None:
        state = self._node(node)
        if state.drained or state.rebooting or state.state == "down":
            return None
        return st.OperatorResume(state.reason_user or "")

    # ---- stored facts

    def _facts(self, node: str) -> NodeFacts | None:
        try:
            latest = queries.latest_report(self.store.db, node)
            facts = latest["body"].get("facts") if latest is not None else None
            return NodeFacts.from_json(facts) if isinstance(facts, dict) else None
        except Exception:  # (no facts: the ticket says so by an empty gpus list)
            return None

    def _gpu_model(self, node: str) -> str | None:
        gpus = _gpus(self._facts(node))
        return gpus[0].name if gpus else None


def _gpus(facts: NodeFacts | None) -> list[GpuFacts]:
    return list(facts.gpus) if facts is not None else []


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def _output_findings(path: Path) -> tuple[Finding, ...] | None:
    """The findings of a validation's ``--json`` output; None where the head node cannot
    read it (no shared file system) or it holds no verdict."""
    try:
        text = path.read_text(errors="replace")
        start = re.search(r"^\{", text, re.MULTILINE)  # (after any warning on stderr)
        doc = json.loads(text[start.start() if start else len(text):])
        return _not_ok(tuple(st.finding_from_json(f) for f in doc["findings"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _event_findings(body: dict[str, Any]) -> tuple[Finding, ...] | None:
    try:
        return _not_ok(tuple(decode_finding(f, "validation") for f in body["findings"]))
    except (WireError, KeyError, TypeError):
        return None


def _warned(job: JobInfo, findings: tuple[Finding, ...]) -> bool:
    """A WARN verdict (exit 1: Slurm says FAILED), which passes, only where the findings
    say so: a Python that could not start slurmgpu exits 1 too."""
    worst = max((f.severity for f in findings), default=None)
    return (job.state, job.exit_code) == ("FAILED", WARNED) and worst is Severity.WARN


def _not_ok(found: tuple[Finding, ...]) -> tuple[Finding, ...]:
    return tuple(f for f in found if f.severity is not Severity.OK) or found


def _on_its_node(ladder: lad.Ladder) -> bool:
    """Whether the ladder waits on its node's state: back from a reboot, or (no step out)
    still drained."""
    return ladder.issued_at is None or ladder.stage in (lad.Stage.REBOOTING, lad.Stage.DRAINED, lad.Stage.HELD)
