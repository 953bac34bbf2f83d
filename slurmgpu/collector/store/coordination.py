"""The automation's inbox (``leader_inbox``, on either backend) and the command outbox
(``command_outbox``, several collectors on PostgreSQL): migration 8's tables, read and
written here only; ``slurmgpu.collector.fleet`` handles the inbox,
``slurmgpu.collector.coordination`` the outbox.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/coordination.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from slurmgpu.collector.store.backend import Connection
from slurmgpu.collector.store.ingest import Transaction

# Unsent commands and unhandled inbox rows older than this are dropped by the prune: a
# command that old is past any checkpoint deadline, and an inbox row that old means no
# collector ran the automation for a day (its verdicts are in the history all the same).
STALE_S = 86_400.0
# Inbox rows handed to the automation per chunk (each chunk is deleted once handled).
INBOX_CHUNK = 500


@dataclass(frozen=True)
class InboxRow:
    id: int
    node: str
    seq: int
    type: str
    received_at: float
    body: dict[str, Any]


@dataclass(frozen=True)
class OutboxRow:
    id: int
    node: str
    command_id: str
    command: str
    args: dict[str, Any]


def _unpack(blob: Any) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(bytes(blob), raw=False)
    except (ValueError, msgpack.UnpackException):  # (written by us: never expected)
        return {}
    return body if isinstance(body, dict) else {}


def inbox_take(db: Connection, limit: int) -> list[InboxRow]:
    """The oldest ``limit`` rows of the leader's inbox, oldest first."""
    rows = db.execute("SELECT id, node, seq, type, received_at, body FROM leader_inbox "
                      "ORDER BY id LIMIT ?", (limit,))
    return [InboxRow(int(i), str(node), int(seq), str(kind), float(at), _unpack(body))
            for i, node, seq, kind, at, body in rows]


def inbox_done(db: Connection, ids: Iterable[int]) -> None:
    """These rows are handled (one statement: a chunk is up to 500 rows)."""
    handled = [int(i) for i in ids]
    if not handled:
        return
    with Transaction(db) as tx:
        tx.execute(f"DELETE FROM leader_inbox WHERE id IN ({', '.join('?' * len(handled))})", handled)


def outbox_add(db: Connection, node: str, command_id: str, command: str, args: dict[str, Any],
               now: float) -> None:
    with Transaction(db) as tx:
        tx.execute("INSERT INTO command_outbox (node, command_id, command, args, created) "
                   "VALUES (?,?,?,?,?)",
                   (node, command_id, command, msgpack.packb(args, use_bin_type=True), now))


def outbox_due(db: Connection, nodes: Collection[str]) -> list[OutboxRow]:
    """The unsent commands for these nodes (those connected to the caller), oldest first."""
    if not nodes:
        return []
    rows = db.execute("SELECT id, node, command_id, command, args FROM command_outbox "
                      "WHERE sent_at IS NULL ORDER BY id").fetchall()
    return [OutboxRow(int(i), str(node), str(cid), str(command), _unpack(args))
            for i, node, cid, command, args in rows if node in nodes]


def outbox_sent(db: Connection, ids: Iterable[int], by: str, now: float) -> None:
    with Transaction(db) as tx:
        tx.executemany("UPDATE command_outbox SET sent_at = ?, sent_by = ? WHERE id = ?",
                       [(now, by, i) for i in ids])


def prune(db: Connection, now: float) -> int:
    """Drop outbox rows and inbox rows past ``STALE_S`` (see there); the rows deleted."""
    with Transaction(db) as tx:
        deleted = tx.execute("DELETE FROM command_outbox WHERE created < ?", (now - STALE_S,)).rowcount
        deleted += tx.execute("DELETE FROM leader_inbox WHERE received_at < ?", (now - STALE_S,)).rowcount
    return max(0, deleted)
