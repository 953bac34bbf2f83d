"""Several collectors on one PostgreSQL database (issue 15): ingest is active/active, the
automation runs on one of them at a time.

* Ingest: every collector stores what its agents send, its batches side by side with the
  others' (``Dialect.begin_ingest``). Deduplication holds across collectors: a batch
  inserts its ``messages`` rows first, ``ON CONFLICT DO NOTHING`` on the unique key
  (``Ingest._claim``), and stores the rest of what the insert returned, so a message an
  agent resent to a second collector after a failover is acked as a duplicate and stored
  once, even while the first collector's batch is in flight.
* Leadership: the collector whose database session holds an advisory lock leads
  (``store.leader.Leadership``, no home-made election). Only the leader runs the
  automation, the checkpoint coordination, the Slurm state recording, the unreachable
  sweep and the pruning. ``leading`` asks at most every ``poll_s`` (each ask renews the
  leader's lease); a leader that died, or stopped and kept its session, is replaced
  within ``[collector] leader_timeout_s`` (plus one poll).
* The leader's inbox: what any collector stored that the automation must see (reports'
  verdicts and findings, events, command results) is written to ``leader_inbox`` in the
  same transaction as the batch; the leader hands it to the automation in id order and
  deletes it (``store.coordination``: a row committed late is taken next time). A new
  leader continues from the rows its predecessor had not handled, with the automation's
  state and pending checkpoints read back from the database.
* Commands: a checkpoint request for an agent connected to another collector goes to
  ``command_outbox``; the collector the agent is connected to sends it (``deliver``).

Fencing: the automation's and the checkpoints' Slurm client is ``FencedSlurm``: each call
that changes Slurm (drain, resume, reboot, a job's signal, requeue, admin comment) first
checks, with one query, that this collector's session still holds the lock, so a leader
cut off since its last poll does not act (``NotLeader``, recorded as the decision's
error). What is left is the time of that query and the Slurm call itself. A leader
killed between a Slurm action and the deletion of its inbox rows leaves those rows to
its successor, which sees the node already drained in the stored state (a drain is not
issued twice for a node the state marks drained) but counts their strikes once more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

import slurmgpu.collector.store.coordination as tables
from slurmgpu.collector.store import Leadership, Store
from slurmgpu.collector.store.coordination import InboxRow
from slurmgpu.collector.transport import CollectorError
from slurmgpu.log import get_logger
from slurmgpu.slurm import SlurmClient, SlurmError

# Inbox rows handed to the automation per chunk (each chunk is deleted once handled).
INBOX_CHUNK = 500
# How often the outbox is read for the agents connected here.
DELIVER_EVERY_S = 0.25

# (node, command, args, command_id) -> the command id; raises when the node is not connected.
SendLocal = Callable[..., str]


class Coordination:
    """This collector's part in a group of collectors sharing one database."""

    def __init__(self, store: Store, leadership: Leadership, *, name: str | None = None,
                 poll_s: float = 1.0) -> None:
        self.store = store
        self.leadership = leadership
        self.name = name or uuid.uuid4().hex[:12]
        self.poll_s = poll_s
        self.leader = False
        self._next_poll = 0.0
        self._next_delivery = 0.0
        self.log = get_logger(component="coordination", collector=self.name)

    # ------------------------------------------------------------------ leadership

    def leading(self) -> tuple[bool, bool]:
        """(whether this collector leads, whether it just became the leader)."""
        mono = time.monotonic()
        if mono < self._next_poll:
            return self.leader, False
        self._next_poll = mono + self.poll_s
        was, self.leader = self.leader, self.leadership.poll()
        if self.leadership.ended is not None:
            self.log.warning("stale_leader_ended", db=self.store.where, backend_pid=self.leadership.ended,
                             lease_s=self.leadership.timeout_s)
            self.leadership.ended = None
        if self.leader != was:
            self.log.info("leader_elected" if self.leader else "leader_lost", db=self.store.where)
        return self.leader, self.leader and not was

    def still_leading(self) -> bool:
        """A fresh check (one query), for just before an action. It only ever ends the
        leadership here; taking it up is ``leading``'s (which reloads the state)."""
        now = self.leadership.poll()
        if self.leader and not now:
            self.leader = False
            self.log.info("leader_lost", db=self.store.where)
        return self.leader and now

    def close(self) -> None:
        self.leadership.release()
        self.leader = False

    # ------------------------------------------------------------------ the inbox

    def inbox(self) -> list[InboxRow]:
        """The next chunk of the inbox (empty when not leading)."""
        if not self.leader:
            return []
        return tables.inbox_take(self.store.db, INBOX_CHUNK)

    def handled(self, rows: list[InboxRow]) -> None:
        if rows:
            tables.inbox_done(self.store.db, [row.id for row in rows])

    # ------------------------------------------------------------------ commands

    def sender(self, send_local: SendLocal) -> Callable[[str, str, dict[str, Any]], str]:
        """The leader's ``send`` for its checkpoints: straight to an agent connected here,
        else through the outbox to the collector it is connected to."""
        def send(node: str, command: str, args: dict[str, Any]) -> str:
            command_id = uuid.uuid4().hex
            try:
                return send_local(node, command, args, command_id=command_id)
            except CollectorError:  # not connected here: maybe to another collector
                tables.outbox_add(self.store.db, node, command_id, command, args, time.time())
                self.log.info("command_queued", node=node, command=command, command_id=command_id)
                return command_id
        return send

    def deliver(self, send_local: SendLocal, connected: Collection[str]) -> int:
        """Send the queued commands for the agents connected here; the number sent."""
        mono = time.monotonic()
        if mono < self._next_delivery:
            return 0
        self._next_delivery = mono + DELIVER_EVERY_S
        sent: list[int] = []
        for row in tables.outbox_due(self.store.db, connected):
            try:
                send_local(row.node, row.command, row.args, command_id=row.command_id)
            except CollectorError:  # gone meanwhile: left for the collector it moves to
                continue
            sent.append(row.id)
        if sent:
            tables.outbox_sent(self.store.db, sent, self.name, time.time())
        return len(sent)

    def prune(self, now: float) -> int:
        return tables.prune(self.store.db, now)


class NotLeader(SlurmError):
    """This collector lost the leader's lock: it does not change Slurm (the new leader
    decides from the stored state)."""


class FencedSlurm:
    """A ``SlurmClient`` whose calls that change Slurm first check that this collector
    still leads (``Coordination.still_leading``); the others pass through."""

    CHANGES = frozenset({"drain", "resume", "reboot", "signal_job", "requeue", "set_admin_comment"})

    def __init__(self, client: SlurmClient, coordination: Coordination) -> None:
        self._client = client
        self._coordination = coordination

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in self.CHANGES:
            return attr

        def fenced(*args: Any, **kwargs: Any) -> Any:
            if not self._coordination.still_leading():
                target = args[0] if args else ""
                raise NotLeader(f"not the leader any more: {name} {target} left to the new leader")
            return attr(*args, **kwargs)
        return fenced
