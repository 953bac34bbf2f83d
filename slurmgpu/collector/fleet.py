"""The collector's fleet logic: what a decoded message does (``transport.Handler``), and
the periodic work that is not the transport's.

Design notes: docs/design-notes.md (``slurmgpu/collector/fleet.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from slurmgpu.collector.checkpoint import refusal_event
from slurmgpu.collector.coordination import Coordination
from slurmgpu.collector.counters import Counters, LimitedLog
from slurmgpu.collector.store import Leadership, Store
from slurmgpu.collector.store.coordination import INBOX_CHUNK, InboxRow, inbox_done, inbox_take
from slurmgpu.collector.store.coordination import prune as prune_coordination
from slurmgpu.collector.transport import Batch, Stored
from slurmgpu.collector.validation import VALIDATION, judge_stragglers
from slurmgpu.config.schema import CollectorSettings
from slurmgpu.log import get_logger
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import NodeState, SlurmClient
from slurmgpu.wire import COMMAND_RESULT, EVENT, REPORT, Envelope, decode_finding, decode_severity

if TYPE_CHECKING:
    from slurmgpu.collector.checkpoint import Checkpoints
    from slurmgpu.collector.policy import Automation, Decision

PRUNE_EVERY_S = 3600.0
STATS_EVERY_S = 60.0


def _findings(row: InboxRow) -> tuple[Finding, ...]:
    return tuple(decode_finding(f, row.type) for f in row.body.get("findings", ()))


def _new_events(batch: Batch, new: list[tuple[str, int]], kind: str) -> list[tuple[str, Envelope]]:
    """The batch's newly stored events of this kind, with their nodes."""
    fresh = set(new)
    return [(node, env) for node, env, _ in batch if (node, env.seq) in fresh and env.type == EVENT
            and isinstance(env.body, dict) and env.body.get("kind") == kind]


def _message_fault(exc: BaseException) -> bool:
    """Whether a failed ``store_batch`` points at a message (a value SQLite cannot bind,
    a constraint, a bug on odd input: isolate the culprit by halving the batch and reject it)
    rather than at the store itself (disk full, I/O error, locked, corrupt, closed:
    stop acking, agents keep spooling)."""
    if isinstance(exc, (sqlite3.InterfaceError, sqlite3.IntegrityError, sqlite3.DataError)):
        return True
    if isinstance(exc, sqlite3.ProgrammingError):  # a value of a type SQLite cannot bind,
        return "binding parameter" in str(exc)  # else a closed or misused connection
    return not isinstance(exc, (sqlite3.Error, OSError, MemoryError))


def _halves(batch: Batch) -> list[Batch]:
    """``batch`` in two, the first half last (popped first)."""
    middle = (len(batch) + 1) // 2
    return [batch[middle:], batch[:middle]]


class SlurmPoller(threading.Thread):
    """Asks Slurm for every node's state every ``interval_s`` in its own thread (an
    unresponsive slurmctld must never stall the collector loop); the loop takes the
    latest answer with ``take``."""

    def __init__(self, client: SlurmClient, interval_s: float) -> None:
        super().__init__(name="slurmgpu-slurm-poll", daemon=True)
        self.client = client
        self.interval_s = interval_s
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._latest: tuple[float, list[NodeState]] | None = None
        self._failing = False
        self.log = get_logger(component="slurm_poll")

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                states = self.client.nodes()
            except Exception as exc:  # slurmctld down, no Slurm here: say so once per streak
                if not self._failing:
                    self.log.warning("slurm_poll_failed", error=f"{type(exc).__name__}: {exc}")
                self._failing = True
            else:
                if self._failing:
                    self.log.info("slurm_poll_recovered")
                self._failing = False
                with self._lock:
                    self._latest = (time.time(), states)
            self._stop_event.wait(self.interval_s)

    def take(self) -> tuple[float, list[NodeState]] | None:
        with self._lock:
            latest, self._latest = self._latest, None
        return latest

    def stop(self) -> None:
        self._stop_event.set()


class Fleet:
    """The transport's ``Handler``: stores, automates, coordinates checkpoints, polls
    Slurm. Also what ``/metrics`` reads (``counters.MetricsSource``)."""

    def __init__(self, settings: CollectorSettings, store: Store, counters: Counters, *,
                 allowed: Mapping[bytes, str], automation: Automation | None = None,
                 poller: SlurmPoller | None = None, own_store: bool = False,
                 coordination: Coordination | None = None) -> None:
        """``automation``: with its checkpoint coordination, if any. ``own_store``: ``close``
        closes the store. ``coordination``: this collector's part among several on a shared
        database (default: the only one, always leading)."""
        self.settings = settings
        self.store, self._own_store = store, own_store
        self.coordination = coordination or Coordination(store, Leadership(store.path))
        # What the automation must see goes through the inbox, read by the leader (this one alone)
        store.inbox = automation is not None
        self.counters = counters
        self.automation = automation
        self.checkpoints: Checkpoints | None = automation.checkpoints if automation is not None else None
        self.poller = poller
        self.log = get_logger(component="collector")
        self._limited = LimitedLog(self.log)
        now = time.monotonic()
        self._next_unreachable = now + settings.heartbeat_s
        self._next_prune = now  # prune once at start, then hourly
        self._next_stats = now + STATS_EVERY_S
        self.allowed: Mapping[bytes, str] = {}
        self.allow_list_changed(allowed)
        self._ladders_taken = False  # the remediation ladders, taken over once per leadership

    def close(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        self.coordination.close()
        if self._own_store:
            self.store.close()

    # ------------------------------------------------------------------ the store

    def commit(self, batch: Batch, now: float) -> Stored | None:
        """Store the batch in one transaction. If a message in it is what failed, its halves
        are stored each in one transaction, a failing half split again (in batch order), a
        failing single message refused. None: the store itself failed."""
        new: list[tuple[str, int]] = []
        bad: set[tuple[str, str, int]] = set()
        parts = [batch]
        while parts:
            part = parts.pop()
            try:
                new += self.store.store_batch(part, received_at=now)
            except Exception as exc:
                if not _message_fault(exc):
                    self._store_failed(exc, len(batch))
                    return None
                if part is batch:
                    self.log.warning("store_batch_isolating", error=f"{type(exc).__name__}: {exc}",
                                     messages=len(batch))
                if len(part) > 1:
                    parts += _halves(part)
                else:
                    bad.add(self._refuse(part[0], exc))
                continue
            self._note_conflicts()
        self.counters.store_failing = 0
        return Stored(new, bad)

    def _refuse(self, item: Any, exc: BaseException) -> tuple[str, str, int]:
        """A message the store refused: counted, logged (rate-limited); its key."""
        node, env = item[0], item[1]
        self.counters.rejected["store"] += 1
        self._limited.warning("message_rejected", reason="store", node=node, type=env.type,
                              epoch=env.epoch, seq=env.seq, error=f"{type(exc).__name__}: {exc}")
        return (node, env.epoch, env.seq)

    def _store_failed(self, exc: BaseException, messages: int) -> None:
        self.counters.store_errors += 1
        self.counters.store_failing += 1
        self.log.error("store_failed", error=f"{type(exc).__name__}: {exc}", messages=messages)

    def _note_conflicts(self) -> None:
        """Count and log the duplicates the store found with a body different from the
        stored one (a seq reused within a spool epoch: that message was not stored)."""
        for c in self.store.conflicts:
            self.counters.conflicts += 1
            self._limited.warning("duplicate_body_differs", node=c.node, epoch=c.epoch, seq=c.seq,
                                  type=c.type)

    # ------------------------------------------------------------------ after the acks

    def acked(self, batch: Batch, new: list[tuple[str, int]], now: float) -> None:
        """The newly stored messages of an acked batch: validation stragglers, then (the
        leader) the automation's inbox, this batch's rows included, whichever collector
        stored them; without automation, the prolog's refusals."""
        self._stragglers(batch, new)
        if self.automation is None:
            self._note_refusals(batch, new, now)
        elif self.coordination.leader:
            self._handle_inbox()

    def _stragglers(self, batch: Batch, new: list[tuple[str, int]]) -> None:
        """Each newly stored validation: its node against the fleet (``validate.straggler``)."""
        events = _new_events(batch, new, VALIDATION)
        if not events:
            return
        # (the database failing: stragglers wait for the next validation)
        with self._trouble("straggler_check_failed", counter="store_errors"):
            found = judge_stragglers(self.store, self.settings, [node for node, _ in events])
            for node, env in events:
                if found.get(node):
                    self.store.add_findings(node, env.seq, env.ts, found[node])
                    self.log.warning("validate_straggler", node=node, findings=[f.message for f in found[node]])

    def _note_refusals(self, batch: Batch, new: list[tuple[str, int]], now: float) -> None:
        """Without automation: the prolog's refusals still go to their jobs' timelines
        (`slurmgpu jobs events`); nothing is set on the jobs."""
        events = [e for node, env in _new_events(batch, new, "prolog_blocked")
                  if (e := refusal_event(node, env.body, now)) is not None]
        if not events:
            return
        with self._trouble("job_events_store_failed", sqlite3.Error, counter="store_errors"), \
                self.store.transaction():
            for e in events:
                self.store.add_job_event(e.job_id, e.ts, e.kind, e.node, e.detail)

    def _handle_inbox(self) -> None:
        """The leader: every message any collector stored for the automation since, in
        chunks, each deleted once handled. A chunk is handled and deleted only while this
        collector still leads (a fresh check each): a leader cut off meanwhile leaves its
        rows to the new one."""
        while True:
            try:
                rows = inbox_take(self.store.db, INBOX_CHUNK)
                if not rows or not self.coordination.still_leading():
                    return
                self._handle(rows, time.time())
                if not self.coordination.still_leading():  # (a fresh check: one query on PostgreSQL)
                    return
                inbox_done(self.store.db, [row.id for row in rows])
            except sqlite3.Error as exc:  # the database is failing: the rows wait for the next turn
                self._trouble_seen("leader_inbox_failed", exc, "store_errors")
                return
            if len(rows) < INBOX_CHUNK:
                return

    def _handle(self, rows: list[InboxRow], now: float) -> None:
        if self.automation is not None:
            self._automate(self.automation, rows, now)
        if self.checkpoints is not None:
            self._checkpoint_messages(self.checkpoints, rows, now)

    def allow_list_changed(self, allowed: Mapping[bytes, str]) -> None:
        self.allowed = allowed
        self._automation_fleet_size()

    def heard(self, nodes: set[str], now: float) -> bool:
        """Nodes heard by heartbeat: their ``last_seen`` (and reachability) in one write."""
        try:
            self.store.touch(nodes, now)
        except Exception as exc:  # the store is failing: the transport keeps them for later
            self._store_failed(exc, len(nodes))
            return False
        return True

    def _automate(self, automation: Automation, items: list[InboxRow], now: float) -> None:
        """Feed the newly stored reports and events to the automation (after the acks)."""
        self._sync_state()
        self._automation_released()  # before new reports: they may trip the breaker again
        decisions: list[Decision] = []
        for item in items:
            if item.type not in (REPORT, EVENT):
                continue
            with self._trouble("automation_failed", node=item.node, seq=item.seq):  # (a policy bug)
                verdict = decode_severity(item.body["verdict"])  # (a str: decode validated it)
                if verdict is Severity.OK and item.body.get("kind") == VALIDATION:
                    continue  # (active tests passing say nothing of the passive checks: no healthy streak)
                decisions.extend(automation.on_report(item.node, verdict, _findings(item), now))
        self._record_decisions(decisions)

    def _checkpoint_messages(self, checkpoints: Checkpoints, items: list[InboxRow], now: float) -> None:
        """Acks of checkpoint requests (command results) and agents' local fallbacks."""
        decisions: list[Decision] = []
        for item in items:
            body = item.body
            with self._trouble("checkpoint_message_failed", node=item.node, seq=item.seq):
                if item.type == COMMAND_RESULT:
                    decisions += checkpoints.on_result(item.node, body, now)
                elif item.type == EVENT and body.get("kind") == "local_checkpoint":
                    checkpoints.on_local(item.node, body, now)
                elif item.type == EVENT and body.get("kind") == "prolog_blocked":
                    checkpoints.on_prolog_refusal(item.node, body, now)
        self._record_decisions(decisions)

    def _record_decisions(self, decisions: list[Decision]) -> None:
        if not decisions:
            return
        for d in decisions:
            self.log.info("automation_decision", node=d.node, action=d.action, result=d.result,
                          held=d.held, dry_run=d.dry_run, trigger=d.trigger, reason=d.reason)
        with self._trouble("decisions_store_failed", sqlite3.Error, counter="store_errors", decisions=len(decisions)):
            self.counters.decisions += self.store.add_decisions(decisions)

    def _automation_fleet_size(self) -> None:
        if self.automation is None or not self.coordination.leader:
            return
        self._sync_state()
        with self._trouble("automation_failed"):
            self.automation.fleet_size(len(self.allowed))

    def _sync_state(self) -> None:
        """Read the automation's state back when another process changed it (`slurmgpu
        breaker release`: one indexed read of its version), so an operator's release is
        seen, and not overwritten by the state in memory."""
        automation = self.automation
        if automation is None:
            return
        # (unreadable for now: the state in memory is kept)
        with self._trouble("automation_state_unreadable", db=automation.store.where):
            if automation.refresh():
                self.log.info("automation_state_reloaded", db=automation.store.where,
                              breaker_open=automation.state.breaker.open)

    def _automation_released(self) -> None:
        """Carry out the drains an operator released (``slurmgpu breaker release``)."""
        automation = self.automation
        if automation is None or not automation.state.released:
            return
        with self._trouble("automation_failed"):
            decisions = automation.run_released(time.time())
            for d in decisions:
                self.log.info("breaker_release_carried_out", node=d.node, action=d.action, result=d.result,
                              released_by=d.released_by)
            self._record_decisions(decisions)

    @contextlib.contextmanager
    def _trouble(self, event: str, errors: type[BaseException] = Exception, *,
                 counter: str | None = "automation_errors", **fields: Any) -> Iterator[None]:
        """Run the block; slurmgpu's own trouble there (``errors``) is counted and logged
        as ``event``, and the loop goes on."""
        try:
            yield
        except errors as exc:
            self._trouble_seen(event, exc, counter, **fields)

    def _trouble_seen(self, event: str, exc: BaseException, counter: str | None, **fields: Any) -> None:
        if counter is not None:
            setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        self.log.error(event, error=f"{type(exc).__name__}: {exc}", **fields)

    # ------------------------------------------------------------------ periodic

    def tick(self) -> None:
        """Every loop turn: released drains, checkpoint deadlines, Slurm's node states; when
        due: unreachable nodes, pruning, the stats line."""
        mono = time.monotonic()
        if self._leading():
            self._leader_tick(mono)
        elif self.poller is not None:
            self.poller.take()  # the leader records Slurm's states
        if mono >= self._next_stats:
            self._next_stats = mono + STATS_EVERY_S
            self.log.info("collector_stats", **self.counters.snapshot())

    def _leading(self) -> bool:
        """Whether this collector runs the automation now (always, alone on its database).
        A collector that just became the leader takes the automation's state and pending
        checkpoints from the database, as its predecessor left them."""
        leading, became = self.coordination.leading()
        if became:
            self._take_over()
        return leading

    def _take_over(self) -> None:
        self._ladders_taken = False
        self._automation_fleet_size()  # (reads the automation's state back first)
        if self.checkpoints is not None:
            with self._trouble("checkpoints_reload_failed", sqlite3.Error, counter="store_errors"):
                self.checkpoints.reload()

    def _leader_tick(self, mono: float) -> None:
        self._sync_state()
        self._automation_released()
        if self.automation is not None:
            self._handle_inbox()
        self._checkpoint_tick()
        self._slurm_states()
        self._ladders_tick()
        if mono >= self._next_unreachable:
            self._next_unreachable = mono + self.settings.heartbeat_s
            self._mark_unreachable()
        if mono >= self._next_prune:
            self._next_prune = mono + PRUNE_EVERY_S
            self._prune()

    def _ladders_tick(self) -> None:
        """The remediation ladders (``collector.remediate``): taken over at the first turn
        of a leadership, then their jobs and deadlines."""
        rem = self.automation.remediation if self.automation is not None else None
        if rem is None:
            return
        with self._trouble("remediation_failed"):
            if not self._ladders_taken:
                self._ladders_taken = True
                rem.take_over(time.time())
            rem.tick(time.time())

    def _prune(self) -> None:
        with self._trouble("prune_failed", sqlite3.Error, counter=None):
            deleted = self.store.prune(self.settings.retention_days) + prune_coordination(self.store.db, time.time())
            if deleted:
                self.log.info("pruned", rows=deleted, retention_days=self.settings.retention_days)

    def _checkpoint_tick(self) -> None:
        if self.checkpoints is not None:
            with self._trouble("checkpoint_tick_failed"):
                self._record_decisions(self.checkpoints.tick(time.time()))

    def _slurm_states(self) -> None:
        """Record drain/resume transitions from the poller's latest look at Slurm."""
        if self.poller is None:
            return
        polled = self.poller.take()
        if polled is None:
            return
        at, states = polled
        fleet = set(self.allowed.values())
        with self._trouble("slurm_states_store_failed", sqlite3.Error, counter=None):
            for node, kind in self.store.record_slurm_states([s for s in states if s.name in fleet], at):
                self.log.info("node_state", node=node, kind=kind)
        if self.automation is not None:
            with self._trouble("remediation_failed"):
                self.automation.operator_drains([s for s in states if s.name in fleet], at)

    def _mark_unreachable(self) -> None:
        """Nodes silent for ``unreachable_after`` heartbeats (by their last message stored)."""
        window = self.settings.unreachable_after * self.settings.heartbeat_s
        with self._trouble("mark_unreachable_failed", sqlite3.Error, counter=None):
            for node in self.store.mark_unreachable(time.time(), window):
                self.log.warning("node_unreachable", node=node, silent_s=window)
