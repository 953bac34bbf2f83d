"""Several collectors on one PostgreSQL database: ingest is active/active, the
automation runs on one of them at a time.

Design notes: docs/design-notes.md (``slurmgpu/collector/coordination.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

import slurmgpu.collector.store.coordination as tables
from slurmgpu.collector.store import Leadership, Store
from slurmgpu.collector.transport import CollectorError
from slurmgpu.log import get_logger
from slurmgpu.slurm import CHANGING_CALLS, SlurmClient, SlurmError

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
        self.leader = leadership.leader  # (alone on SQLite: leading from the start)
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


class NotLeader(SlurmError):
    """This collector lost the leader's lock: it does not change Slurm (the new leader
    decides from the stored state)."""


class FencedSlurm:
    """A ``SlurmClient`` whose calls that change Slurm first check that this collector
    still leads (``Coordination.still_leading``); the others pass through."""

    def __init__(self, client: SlurmClient, coordination: Coordination) -> None:
        self._client = client
        self._coordination = coordination

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in CHANGING_CALLS:
            return attr

        def fenced(*args: Any, **kwargs: Any) -> Any:
            if not self._coordination.still_leading():
                target = args[0] if args else ""
                raise NotLeader(f"not the leader any more: {name} {target} left to the new leader")
            return attr(*args, **kwargs)
        return fenced
