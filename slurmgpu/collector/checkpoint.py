"""Checkpoint coordination: jobs on a degrading node are told to save their state
before the node is taken away; all state is in the database, so a restarted collector
picks up where it was. Design notes: docs/design-notes.md (``slurmgpu/collector/checkpoint.py``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from slurmgpu.collector.store import Store
from slurmgpu.collector.store.queries import CheckpointRow, PendingDrain
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.decision import Action, job_comment
from slurmgpu.jobfiles import BREAKER_HOLD
from slurmgpu.log import get_logger
from slurmgpu.slurm import JobInfo, SlurmClient, SlurmError

COMMAND = "checkpoint"  # the agent command (slurmgpu.agent.core.Agent.handle_command)
# Job states in which a requeue makes sense (anything else has already ended).
REQUEUEABLE = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "STOPPED"})
# A late ack still lands on a checkpoint closed less than this long ago.
LATE_ACK_S = 3600.0
# A job comment Slurm refused (the job in transition) is tried again this often, at most
# COMMENT_TRIES times in all.
COMMENT_RETRY_S = 2.0
COMMENT_TRIES = 5

# (node, command, args) -> command id; raises when the node's agent is not connected.
SendCommand = Callable[[str, str, dict[str, Any]], str]
# (node, action, reason, trigger, now) -> the decision recording the drain.
DrainNode = Callable[[str, Action, str, str, float], Any]


class MakeCheckpoints(Protocol):
    """Makes the automation's ``Checkpoints``, given its drain (``Automation.finish_pending``):
    how ``Automation`` gets them (``functools.partial(Checkpoints, store, ...)``)."""

    def __call__(self, *, drain_node: DrainNode) -> Checkpoints: ...


class RequestState(enum.StrEnum):
    """A checkpoint request's ``state`` (a closed one keeps its last)."""

    OPEN = "open"
    ACKED = "acked"
    EXPIRED = "expired"


@dataclass(frozen=True)
class JobEvent:
    job_id: str
    ts: float
    kind: str
    node: str | None = None
    detail: str | None = None


class Checkpoints:
    def __init__(self, store: Store, client: SlurmClient, settings: AutomationSettings, *,
                 send: SendCommand | None = None, drain_node: DrainNode | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``send``: a command to a node's agent; ``drain_node``: the node's drain once its
        jobs are ready (``Automation.finish_pending``; the automation makes its Checkpoints)."""
        self.store = store
        self.client = client
        self.settings = settings
        self.send = send
        self.clock = clock
        self.drain_node = drain_node
        self.log = get_logger(component="checkpoints")
        self._open: dict[int, CheckpointRow] = {}
        self._pending: dict[str, PendingDrain] = {}
        self._requeued: set[int] = set()  # open requests whose jobs this collector requeued
        self._comments_due: dict[str, tuple[str, int, float]] = {}  # job -> (text, tries left, when)
        self.reload()

    def reload(self) -> None:
        """Take the open requests and pending drains from the database: at start, and when
        this collector becomes the leader of several (its predecessor's are continued)."""
        self._open = {c["id"]: c for c in self.store.checkpoints(active=True, limit=1_000_000)}
        self._pending = {p["node"]: p for p in self.store.pending_drains()}
        self._requeued.clear()
        if self._open or self._pending:
            self.log.info("checkpoints_resumed", open=len(self._open), pending_drains=len(self._pending))

    # ------------------------------------------------------------------ start

    def begin(self, node: str, action: Action, reason: str, trigger: str, now: float | None = None, *,
              released_by: str | None = None) -> int:
        """Ask every job running on ``node`` to checkpoint; the node's drain waits for them.
        Returns how many jobs it waits for (0: nothing runs there, drain at once).
        ``released_by``: the drain was held by the breaker and released by this operator;
        the jobs asked while it was held are not asked again."""
        now = self.clock() if now is None else now
        if node in self._pending:
            return len(self._pending[node]["checkpoints"])
        jobs = self._jobs(node)
        held = any(cp["trigger_node"] == node for cp in self._open.values())  # asked while held
        if not jobs and not held:
            return 0
        events: list[JobEvent] = []
        with self.store.transaction():
            ids = [self._request(job, node, action, reason, now, events, released_by=released_by) for job in jobs]
            if ids:
                self.store.set_pending_drain(node, action, reason, trigger, now, ids)
            if held:  # requests made while the drain was held, for jobs that have ended since
                self._close_held(node, set(ids), now, events, "the job no longer runs on the node")
            self._record(events)
        if not jobs:
            return 0
        self._pending[node] = PendingDrain(node=node, action=action, reason=reason, trigger=trigger,
                                           since=now, checkpoints=ids)
        self.log.info("checkpoint_started", node=node, action=action, jobs=[j.job_id for j in jobs],
                      deadline_s=self.settings.checkpoint_deadline_s)
        return len(ids)

    def request(self, node: str, action: Action, reason: str, trigger: str, now: float | None = None) -> int:
        """The breaker holds ``node``'s drain: ask its jobs to checkpoint now all the same
        (signal, request rows, agents told), with no pending drain: that waits for the
        release (``begin(..., released_by=...)``). Returns how many jobs were asked."""
        now = self.clock() if now is None else now
        if node in self._pending:
            return len(self._pending[node]["checkpoints"])
        jobs = self._jobs(node)
        if not jobs:
            return 0
        events: list[JobEvent] = []
        with self.store.transaction():
            for job in jobs:
                self._request(job, node, action, reason, now, events, held=True)
            self._record(events)
        self.log.info("checkpoint_requested_drain_held", node=node, action=action, trigger=trigger,
                      jobs=[j.job_id for j in jobs], deadline_s=self.settings.checkpoint_deadline_s)
        return len(jobs)

    def cancel(self, node: str, now: float | None, why: str) -> int:
        """Close the requests made for ``node``'s held drain (the node is healthy again and
        its hold dropped). Returns how many were closed."""
        now = self.clock() if now is None else now
        if node in self._pending:
            return 0
        events: list[JobEvent] = []
        with self.store.transaction():
            closed = self._close_held(node, set(), now, events, why)
            self._record(events)
        return closed

    def _close_held(self, node: str, keep: set[int], now: float, events: list[JobEvent], why: str) -> int:
        """Close the open requests made for ``node`` that no pending drain waits for (and
        that are not in ``keep``): those of a held drain (``request-closed``, ``why``).
        Inside a transaction."""
        needed = keep | self._needed()
        stale = [cp for cp in self._open.values() if cp["trigger_node"] == node and cp["id"] not in needed]
        for cp in stale:
            self.store.update_checkpoint(cp["id"], closed=now)
            self._open.pop(cp["id"], None)
            events.append(JobEvent(cp["job_id"], now, "request-closed", node, why))
        return len(stale)

    def _jobs(self, node: str) -> list[JobInfo]:
        try:
            return [j for j in self.client.jobs_on_node(node) if j.state in REQUEUEABLE]
        except SlurmError as exc:
            self.log.error("checkpoint_jobs_unknown", node=node, error=str(exc))
            return []

    def escalate(self, node: str, reason: str, trigger: str, now: float | None = None) -> bool:
        """A node waiting for checkpoints ("checkpoint") got a drain-now-class fault: its
        jobs will also be requeued. True if it changed anything."""
        pending = self._pending.get(node)
        if pending is None or pending["action"] == Action.DRAIN_NOW:
            return False
        now = self.clock() if now is None else now
        pending["action"], pending["reason"], pending["trigger"] = Action.DRAIN_NOW, reason, trigger
        cps = [self._open[i] for i in pending["checkpoints"] if i in self._open]
        with self.store.transaction():
            self.store.upgrade_pending_drain(node, Action.DRAIN_NOW, reason, trigger)
            for cp in cps:
                cp["action"] = Action.DRAIN_NOW
                self.store.update_checkpoint(cp["id"], action=Action.DRAIN_NOW)
            self._record([JobEvent(cp["job_id"], now, "escalated", node, f"drain-now: {reason}")
                              for cp in cps])
        return True

    def _request(self, job: JobInfo, node: str, action: Action, reason: str, now: float,
                 events: list[JobEvent], *, held: bool = False, released_by: str | None = None) -> int:
        """One job: reuse its open request (upgraded to drain-now if need be), or signal
        it, open a request and notify the agents on its nodes. ``held``: the node's drain
        is held by the breaker; ``released_by``: that hold was released by this operator."""
        jid = job.job_id
        existing = next((cp for cp in self._open.values() if cp["job_id"] == jid), None)
        if existing is not None and released_by is not None and existing["trigger_node"] == node:
            events.append(JobEvent(jid, now, "drain-released", node,
                                   f"the breaker's hold on the drain was released by {released_by}; "
                                   f"the request of {_stamp(existing['requested'])} stands (not signalled again)"))
        else:
            held_note = " (the circuit breaker holds the drain; only the checkpoint goes ahead)" if held else ""
            events.append(JobEvent(jid, now, "detected", node, f"{action}: {reason}{held_note}"))
        if existing is not None:
            cp = existing
            if action is Action.DRAIN_NOW and cp["action"] != Action.DRAIN_NOW:
                cp["action"] = action
                self.store.update_checkpoint(cp["id"], action=action)
            return cp["id"]
        s = self.settings
        scope = "every process" if s.checkpoint_full else "the batch shell"
        try:
            self.client.signal_job(jid, s.checkpoint_signal, full=s.checkpoint_full)
            events.append(JobEvent(jid, self.clock(), "signalled", node,
                                   f"SIG{s.checkpoint_signal} to {scope}"))
        except SlurmError as exc:
            events.append(JobEvent(jid, self.clock(), "signal-failed", node, str(exc)))
        if held:  # the job reads it in its request file (`slurmgpu ckpt status`)
            reason = f"{reason} ({held_request_note(action)})"
        row = CheckpointRow(id=0, job_id=jid, action=action, reason=reason, trigger_node=node,
                            nodes=list(job.nodes) or [node], user=job.user, requested=now,
                            deadline=now + s.checkpoint_deadline_s, state=RequestState.OPEN,
                            acked_at=None, acked_by=None, closed=None)
        row["id"] = self.store.add_checkpoint(dict(row))
        self._open[row["id"]] = row
        self._notify(row, events)
        return row["id"]

    def _notify(self, row: CheckpointRow, events: list[JobEvent]) -> None:
        if self.send is None:
            return
        args = {"job_id": row["job_id"], "action": row["action"], "reason": row["reason"],
                "deadline": row["deadline"], "requested_at": row["requested"],
                "trigger_node": row["trigger_node"], "user": row["user"]}
        for target in row["nodes"]:
            try:
                self.send(target, COMMAND, args)
            except Exception as exc:  # agent not connected: the signal still went out
                events.append(JobEvent(row["job_id"], self.clock(), "notify-failed", target, str(exc)))

    # ------------------------------------------------------------------ from agents

    def _delivered_before(self, jid: str, node: str, requested: float) -> bool:
        """This request's delivery to ``node`` is on record already: a result handled again
        by a new leader (the old one died before deleting its inbox chunk)."""
        return any(e["kind"] == "delivered" and e["node"] == node and e["ts"] >= requested
                   for e in self.store.job_events(jid))

    def on_result(self, node: str, body: dict[str, Any], now: float | None = None) -> list[Any]:
        """A ``command-result`` from an agent: delivery or ack of a checkpoint request."""
        now = self.clock() if now is None else now
        result = body.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("job_id"), str):
            return []
        jid, state = result["job_id"], result.get("state")
        cp = self._find(jid, node)
        if cp is None:
            return []
        if not body.get("ok"):
            self._record([JobEvent(jid, now, "delivery-failed", node, str(result.get("error", "")))])
            return []
        if state == "delivered":
            if not self._delivered_before(jid, node, cp["requested"]):
                self._record([JobEvent(jid, now, "delivered", node, str(result.get("file") or ""))])
            return []
        if state != "acked":
            return []
        note = result.get("note")
        detail = f"after {now - cp['requested']:.1f} s" + (f": {note}" if note else "")
        if cp["state"] != RequestState.OPEN:
            self._record([JobEvent(jid, now, "acked-late", node, detail)])
            return []
        cp["state"], cp["acked_at"], cp["acked_by"] = RequestState.ACKED, now, node
        with self.store.transaction():
            self.store.update_checkpoint(cp["id"], state=RequestState.ACKED, acked_at=now, acked_by=node)
            self._record([JobEvent(jid, now, "acked", node, detail)])
        self.log.info("checkpoint_acked", job_id=jid, node=node, wait_s=round(now - cp["requested"], 3))
        return self._complete_ready(now)

    def on_local(self, node: str, body: dict[str, Any], now: float | None = None) -> None:
        """A ``local_checkpoint`` event: the agent signalled jobs itself while the
        collector was unreachable."""
        now = self.clock() if now is None else now
        events = []
        for job in body.get("jobs") or ():
            if not isinstance(job, dict) or not isinstance(job.get("job_id"), str):
                continue
            pids = job.get("pids") or []
            at = job.get("at")
            ts = float(at) if isinstance(at, (int, float)) else now
            events.append(JobEvent(job["job_id"], ts, "signalled-locally", node,
                                   f"SIG{job.get('signal', '?')} to {len(pids)} local process(es) "
                                   "while the collector was unreachable"))
        self._record(events)

    def on_prolog_refusal(self, node: str, body: dict[str, Any], now: float | None = None) -> None:
        """A ``prolog_blocked`` event: the refusal in the job's timeline, and on the job
        itself where its user reads it (Slurm requeues a job its prolog refused)."""
        event = refusal_event(node, body, self.clock() if now is None else now)
        if event is not None:
            self._record([event])
            self.comment(event.job_id, job_comment(f"refused by the prolog on {node}", event.detail or ""))

    def comment(self, job_id: str, text: str, tries: int = COMMENT_TRIES) -> None:
        """Set the job's AdminComment; refused (a job Slurm is requeueing just then), it is
        tried again at later ``tick``s, ``tries`` times in all; slurmgpu's own trouble
        there only logs a line."""
        if self.settings.dry_run:
            return
        try:
            self.client.set_admin_comment(job_id, text)
        except SlurmError as exc:
            left = tries - 1
            self.log.warning("job_comment_failed", job_id=job_id, error=str(exc), tries_left=left)
            if left > 0:
                self._comments_due[job_id] = (text, left, self.clock() + COMMENT_RETRY_S)
            return
        self._comments_due.pop(job_id, None)

    def _retry_comments(self, now: float) -> None:
        for job_id, (text, left, at) in list(self._comments_due.items()):
            if at <= now:
                del self._comments_due[job_id]
                self.comment(job_id, text, left)

    def _find(self, job_id: str, node: str) -> CheckpointRow | None:
        """The job's open request (or one closed recently) that names ``node``: a node can
        only speak for jobs it runs."""
        for cp in self._open.values():
            if cp["job_id"] == job_id and node in cp["nodes"]:
                return cp
        for row in reversed(self.store.checkpoints(job_id=job_id)):
            if node in row["nodes"] and (row["closed"] is None or self.clock() - row["closed"] < LATE_ACK_S):
                return row
        return None

    # ------------------------------------------------------------------ deadlines

    def tick(self, now: float | None = None) -> list[Any]:
        """Expire requests past their deadline, then finish every node whose jobs are all
        acked or expired. Returns the automation decisions made (drains)."""
        now = self.clock() if now is None else now
        self._retry_comments(now)
        late = [cp for cp in self._open.values() if cp["state"] == RequestState.OPEN and cp["deadline"] <= now]
        if late:
            with self.store.transaction():
                for cp in late:
                    cp["state"] = RequestState.EXPIRED
                    self.store.update_checkpoint(cp["id"], state=RequestState.EXPIRED)
                    waited = cp["deadline"] - cp["requested"]
                    self._record([JobEvent(cp["job_id"], now, "deadline", cp["trigger_node"],
                                               f"no ack within {waited:g} s")])
            for cp in late:
                self.log.warning("checkpoint_deadline", job_id=cp["job_id"], node=cp["trigger_node"])
        return self._complete_ready(now) if late or self._pending else []

    def _complete_ready(self, now: float) -> list[Any]:
        decisions = []
        for node, pending in list(self._pending.items()):
            cps = self._requests(pending)
            if any(cp["state"] == RequestState.OPEN for cp in cps):
                continue
            decisions += self._complete(node, pending, cps, now)
        return decisions

    def _requests(self, pending: PendingDrain) -> list[CheckpointRow]:
        """The open requests a pending drain waits for."""
        return [cp for cp in (self._open.get(i) for i in pending["checkpoints"]) if cp is not None]

    def _needed(self) -> set[int]:
        """The requests some pending drain waits for."""
        return {i for p in self._pending.values() for i in p["checkpoints"]}

    def _complete(self, node: str, pending: PendingDrain, cps: list[CheckpointRow], now: float) -> list[Any]:
        """Drain the node, requeue its jobs for drain-now, close what nobody waits for."""
        decisions = []
        events: list[JobEvent] = []
        if self.drain_node is not None:
            d = self.drain_node(node, Action(pending["action"]), pending["reason"] or "", pending["trigger"] or "",
                                now)
            decisions.append(d)
            for cp in cps:
                events.append(JobEvent(cp["job_id"], self.clock(), "drained", node, str(d.result)))
        if pending["action"] == Action.DRAIN_NOW:
            for cp in cps:
                if cp["id"] not in self._requeued:
                    events.append(self._requeue(cp, node))
                    self._requeued.add(cp["id"])
        del self._pending[node]
        still_needed = self._needed()
        with self.store.transaction():
            self.store.remove_pending_drain(node)
            for cp in cps:
                if cp["id"] not in still_needed:
                    self.store.update_checkpoint(cp["id"], closed=self.clock())
                    self._open.pop(cp["id"], None)
                    self._requeued.discard(cp["id"])
            self._record(events)
        return decisions

    def _requeue(self, cp: CheckpointRow, node: str) -> JobEvent:
        jid = cp["job_id"]
        try:
            state = self.client.job(jid).state
            if state not in REQUEUEABLE:
                return JobEvent(jid, self.clock(), "requeue-skipped", node, f"job is {state}")
            self.comment(jid, job_comment(f"requeued from {node}", cp["reason"] or cp["action"]))
            self.client.requeue(jid)
        except SlurmError as exc:
            return JobEvent(jid, self.clock(), "requeue-failed", node, str(exc))
        self.log.info("job_requeued", job_id=jid, node=node)
        return JobEvent(jid, self.clock(), "requeued", node, "to restart on healthy nodes")

    # ------------------------------------------------------------------ views

    def pending(self) -> list[dict[str, Any]]:
        """Nodes waiting for their jobs' checkpoints, with those jobs."""
        return [{"node": node, "action": p["action"], "since": p["since"], "reason": p["reason"],
                 "jobs": [{"job_id": cp["job_id"], "state": cp["state"], "deadline": cp["deadline"]}
                          for cp in self._requests(p)]}
                for node, p in sorted(self._pending.items())]

    def open_count(self) -> int:
        return sum(1 for cp in self._open.values() if cp["state"] == RequestState.OPEN)

    # ------------------------------------------------------------------ helpers

    def _record(self, events: Iterable[JobEvent]) -> None:
        """The events into their jobs' timelines: one transaction (or part of the caller's)."""
        events = list(events)
        if events:
            with self.store.transaction():
                for e in events:
                    self.store.add_job_event(e.job_id, e.ts, e.kind, e.node, e.detail)


def held_request_note(action: str) -> str:
    """What a job's checkpoint request adds to its reason while the circuit breaker holds
    its node's drain (`slurmgpu ckpt status` shows it: ``jobfiles.held_note_of``):
    ``drain held by the circuit breaker; the job is requeued when an admin releases it``."""
    after = "the job is requeued" if action == Action.DRAIN_NOW else "the node is drained"
    return f"{BREAKER_HOLD}; {after} when an admin releases it"


def refusal_event(node: str, body: dict[str, Any], now: float) -> JobEvent | None:
    """The ``prolog-refused`` job event of a ``prolog_blocked`` event body (None: it names
    no job)."""
    job = body.get("job_id")
    if not isinstance(job, str) or not job:
        return None
    problems = [str(p) for p in body.get("problems") or [] if p]
    return JobEvent(job, now, "prolog-refused", node, "; ".join(problems) or "the node failed its checks")


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
