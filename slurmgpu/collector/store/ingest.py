"""The store's writes: agents' messages in batches, node reachability, Slurm's drains, the
automation's decisions and checkpoint bookkeeping. History keeps changes, not repetitions.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/ingest.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from slurmgpu.collector.store.backend import Connection, dialect_of
from slurmgpu.collector.store.history import History, Rows
from slurmgpu.collector.store.queries import current_drains
from slurmgpu.decision import REASON_PREFIX, reason_actor
from slurmgpu.result import Severity
from slurmgpu.slurm.cli import sanitize_reason
from slurmgpu.wire import COMMAND_RESULT, EVENT, HELLO, REPORT, Envelope

# Severity names as the wire carries them, ranked as slurmgpu.result does (others: UNKNOWN).
_RANK = {s.name: s.rank for s in Severity}
_OK, _UNKNOWN = Severity.OK.name, Severity.UNKNOWN.name
_STORED = frozenset({HELLO, REPORT, EVENT, COMMAND_RESULT})
_MAX_TEXT = 1024

# A batch item: (node, message) or (node, message, body) where ``body`` is the bytes
# ``message``'s body was received as (``wire.decode_received``: the store keeps them
# without re-packing the body).
BatchItem = tuple[str, Envelope] | tuple[str, Envelope, bytes]
# What a message is deduplicated by: (node, epoch, seq).
MessageKey = tuple[str, str, int]
# A message's body as stored (msgpack bytes) and its digest.
_Body = tuple[bytes, bytes]
# A drain decision of the automation may be stamped this much after the poll that saw the
# drain (the same clock; only a bound for the lookup, see Ingest.drain_actor).
DECISION_SLACK_S = 60.0
# A report's state for the history: (verdict, its non-OK findings' rows).
_State = tuple[str, tuple[tuple[Any, ...], ...]]
# The history tables pruned past the retention, with their time column.
_PRUNED = (("messages", "received_at"), ("report_history", "ts"), ("findings", "ts"), ("events", "ts"),
           ("command_results", "ts"), ("decisions", "time"), ("job_events", "ts"),
           ("node_states", "ts"), ("node_samples", "ts"))


def text(value: Any) -> str | None:
    """A value as stored in a TEXT column: a string, cut at ``_MAX_TEXT`` characters."""
    if value is None:
        return None
    out = value if isinstance(value, str) else str(value)
    return out[:_MAX_TEXT]


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63):
        return value
    return None


def _same_reason(decided: str, polled: str) -> bool:
    """The automation's decision reason (``polled`` plus, at times, a note such as
    `` (waiting for 2 job checkpoint(s))``) is the one Slurm shows: Slurm got it
    sanitised (one line, cut at 256 characters with "…") and may have appended
    `` : reboot issued``."""
    shown = " ".join(polled.split()).removesuffix(" : reboot issued").removesuffix("…").rstrip()
    return bool(shown) and sanitize_reason(decided, max_len=1 << 20).startswith(shown)


_sha256 = hashlib.sha256


@dataclass(frozen=True)
class Conflict:
    """A message dropped as a duplicate although its body differs from the stored one
    (or from another copy in the same batch): a seq reused within one epoch."""

    node: str
    epoch: str
    seq: int
    type: str


def _inbox_body(env: Envelope, packed: bytes) -> bytes:
    """What the leader's automation needs of a message (``leader_inbox.body``): a report's
    verdict and non-OK findings (not its facts), an event's or command result's body."""
    if env.type != REPORT:
        return packed
    body = env.body
    inbox: bytes = msgpack.packb({"verdict": body.get("verdict"), "findings": body.get("findings", [])},
                                 use_bin_type=True)
    return inbox


# (The WHEREs: another collector may have stored a newer report of the node meanwhile.)
_UPSERT_REPORT = (
    "INSERT INTO reports (node, seq, ts, verdict, body, epoch) VALUES (?,?,?,?,?,?) "
    "ON CONFLICT (node) DO UPDATE SET seq = excluded.seq, ts = excluded.ts, "
    "verdict = excluded.verdict, body = excluded.body, epoch = excluded.epoch "
    "WHERE reports.epoch IS NULL OR excluded.epoch <> reports.epoch OR excluded.seq > reports.seq")
# A report without facts keeps the node's last ones: in a table of their own (schema 13),
# written only by the reports that bring them.
_UPSERT_FACTS = (
    "INSERT INTO node_facts (node, facts, facts_ts, epoch, seq) VALUES (?,?,?,?,?) "
    "ON CONFLICT (node) DO UPDATE SET facts = excluded.facts, facts_ts = excluded.facts_ts, "
    "epoch = excluded.epoch, seq = excluded.seq "
    "WHERE node_facts.epoch IS NULL OR excluded.epoch <> node_facts.epoch OR excluded.seq > node_facts.seq")


def _report_row(node: str, env: Envelope, packed: bytes) -> tuple[Any, ...]:
    """A node's latest report as ``reports`` keeps it: the body as received, less a full
    report's facts (``_facts_row``: kept until the next full report)."""
    body = env.body
    verdict = body.get("verdict")
    verdict = (verdict if type(verdict) is str and len(verdict) <= _MAX_TEXT else text(verdict)) or _UNKNOWN
    if body.get("facts") is not None:
        packed = msgpack.packb({k: v for k, v in body.items() if k != "facts"}, use_bin_type=True)
    return (node, env.seq, env.ts, verdict, packed, env.epoch)


def _facts_row(node: str, env: Envelope) -> tuple[Any, ...]:
    """A full report's facts as ``node_facts`` keeps them (msgpack)."""
    facts = env.body["facts"]
    if not isinstance(facts, bytes):  # (agents pre-pack them; a dict from older senders)
        facts = msgpack.packb(facts, use_bin_type=True)
    return (node, facts, env.ts, env.epoch, env.seq)


_INSERT_MESSAGES = "INSERT INTO messages (node, epoch, seq, type, ts, received_at, digest) VALUES (?,?,?,?,?,?,?)"


def _skip(_row: tuple[Any, ...]) -> None:
    """A row not to collect."""


class Transaction:
    """``with``: one write transaction (``Dialect.begin_write`` ... COMMIT, ROLLBACK on any
    exception). Inside another one it joins it: the outer one commits or rolls back."""

    def __init__(self, db: Connection) -> None:
        self.db = db
        self.joined = False

    def __enter__(self) -> Connection:
        self.joined = self.db.in_transaction
        if not self.joined:
            dialect_of(self.db).begin_write(self.db)
        return self.db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.joined:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")


@dataclass
class _BatchRows:
    """What one batch writes, table by table."""

    # node -> [last_seq, verdict_ts, verdict, worst finding, agent_version, (epoch, seq) of the verdict]
    nodes: dict[str, list[Any]]
    messages: list[tuple[Any, ...]] = field(default_factory=list)
    history: list[tuple[Any, ...]] = field(default_factory=list)
    findings: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    results: list[tuple[Any, ...]] = field(default_factory=list)
    inbox: list[tuple[Any, ...]] = field(default_factory=list)
    samples: Rows = field(default_factory=Rows)
    latest_report: dict[str, tuple[Envelope, bytes]] = field(default_factory=dict)  # node -> (report, body)
    latest_facts: dict[str, Envelope] = field(default_factory=dict)  # node -> its newest report with facts


# A batch that carried a verdict (a report or event) replaces the node's if its message is
# newer (by seq within the agent's spool epoch; another epoch is a reinstalled agent):
# an older message arriving later (events are sent ahead of spooled reports) is history.
_NEWER = ("excluded.verdict IS NOT NULL AND (nodes.verdict_seq IS NULL "
          "OR excluded.verdict_epoch <> nodes.verdict_epoch OR excluded.verdict_seq > nodes.verdict_seq)")
_VERDICT_COLUMNS = ("verdict", "worst_check", "worst_severity", "worst_message", "worst_gpu", "verdict_ts",
                    "verdict_epoch", "verdict_seq")
_UPSERT_NODES = (
    "INSERT INTO nodes (node, first_seen, last_seen, last_seq, verdict, verdict_ts, worst_check, "
    "worst_severity, worst_message, worst_gpu, reachable, unreachable_since, agent_version, "
    "verdict_epoch, verdict_seq) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,1,NULL,?,?,?) ON CONFLICT (node) DO UPDATE SET "
    # (CASE, not SQLite's two-argument max(): PostgreSQL spells that greatest())
    "last_seen = CASE WHEN excluded.last_seen > nodes.last_seen THEN excluded.last_seen "
    "  ELSE nodes.last_seen END, "
    "last_seq = CASE WHEN excluded.last_seq > nodes.last_seq THEN excluded.last_seq "
    "  ELSE nodes.last_seq END, "
    "reachable = 1, unreachable_since = NULL, "
    "agent_version = coalesce(excluded.agent_version, nodes.agent_version), "
    + ", ".join(f"{c} = CASE WHEN {_NEWER} THEN excluded.{c} ELSE nodes.{c} END" for c in _VERDICT_COLUMNS))

# A node heard from (``touch``): what ``_UPSERT_NODES`` does for a heartbeat (no message:
# last_seq and the verdict stay), and nothing else.
_TOUCH_NODES = (
    "INSERT INTO nodes (node, first_seen, last_seen, last_seq, reachable) "
    "VALUES (?,?,?,0,1) ON CONFLICT (node) DO UPDATE SET "
    "last_seen = CASE WHEN excluded.last_seen > nodes.last_seen THEN excluded.last_seen "
    "  ELSE nodes.last_seen END, "
    "reachable = 1, unreachable_since = NULL")


class Ingest:
    """The write side of ``Store``. Not thread-safe: one owner (the collector loop)."""

    def __init__(self, db: Connection, sample_interval_s: float) -> None:
        self.db = db
        self.history = History(sample_interval_s)
        self._unreachable: set[str] | None = None  # nodes marked unreachable (loaded lazily)
        # node -> (drained, reason) as last recorded in node_states (loaded lazily)
        self._slurm_state: dict[str, tuple[bool, str | None]] | None = None
        # Duplicates whose body differed, found by the last ``store_batch`` call.
        self.conflicts: list[Conflict] = []
        # Reports the last ``store_batch`` stored as history only: older (by seq) than the
        # message that holds their node's state (they arrived after a newer event).
        self.stale: set[tuple[str, int]] = set()
        # node -> (epoch, seq) of the message that holds its state (read once per node)
        self._current: dict[str, tuple[str, int] | None] = {}
        # node -> state of the last report written to report_history (this process)
        self._last_state: dict[str, _State] = {}
        # PostgreSQL: other collectors may write the same nodes' messages (active/active),
        # so what memory says was stored is only a hint (``_existing``).
        self.shared = dialect_of(db).name != "sqlite"
        # Also write what the automation must see to ``leader_inbox`` (set by a collector
        # that runs the automation: its leader reads them back).
        self.inbox = False
        self._pack = msgpack.Packer(use_bin_type=True).pack  # (packb makes a Packer per call)

    def transaction(self) -> Transaction:
        """``with store.transaction():`` one write transaction (BEGIN IMMEDIATE ... COMMIT,
        ROLLBACK on any exception; inside another one, part of it)."""
        return Transaction(self.db)

    # ------------------------------------------------------------------ messages

    def store_batch(self, batch: Sequence[BatchItem], *,
                    received_at: float | None = None) -> list[tuple[str, int]]:
        """Store a batch of validated messages in one transaction.

        Heartbeats only refresh ``nodes.last_seen``. Acked types (hello, report,
        event, command-result) are stored once per (node, seq); the return value is
        the (node, seq) pairs newly stored by this call (duplicates are left out).
        An item may carry the frame its message was decoded from (see ``BatchItem``).
        """
        self.conflicts = []
        self.stale = set()
        if not batch:
            return []
        now = time.time() if received_at is None else received_at
        touched, candidates, bodies = self._candidates(batch)
        db = self.db
        states: dict[str, _State] = {}
        dialect_of(db).begin_ingest(db)
        try:
            if self.shared:
                new, existing = self._claim(candidates, bodies, now)
            else:
                existing = self._existing(list(candidates)) if candidates else {}
                new = [(key, item) for key, item in candidates.items() if key not in existing]
            self._check_duplicates(existing, candidates, bodies)
            rows = self._write(new, bodies, touched, now, states)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._forget_uncommitted(touched)
            raise
        self._last_state.update(states)  # only what is committed
        self._current.update((node, row[5]) for node, row in rows.nodes.items() if row[5] is not None)
        return [(node, seq) for (node, _epoch, seq), _ in new]

    def _candidates(self, batch: Sequence[BatchItem]) -> tuple[
            set[str], dict[MessageKey, BatchItem], dict[MessageKey, _Body]]:
        """The nodes heard from; the acked messages deduplicated within the batch (an
        agent may resend before the ack arrives), with their packed bodies and digests.
        A copy whose body differs from the first is a conflict."""
        candidates: dict[MessageKey, BatchItem] = {}
        bodies: dict[MessageKey, _Body] = {}
        touched: set[str] = set()
        pack, sha256 = self._pack, _sha256
        for item in batch:
            node, env = item[0], item[1]
            touched.add(node)
            if env.type not in _STORED:
                continue
            epoch = env.epoch
            key = (node, epoch, env.seq)
            packed = item[2] if len(item) > 2 else pack(env.body)
            digest = sha256(packed).digest()[:8]  # (_digest)
            held = bodies.get(key)
            if held is None:
                candidates[key], bodies[key] = item, (packed, digest)
            elif held[1] != digest:
                self.conflicts.append(Conflict(node, epoch, env.seq, env.type))
        return touched, candidates, bodies

    def _check_duplicates(self, existing: dict[MessageKey, bytes | None],
                          candidates: dict[MessageKey, BatchItem],
                          bodies: dict[MessageKey, _Body]) -> None:
        """Stored keys whose stored body digest differs (unknown for rows written
        before digests were kept: not counted)."""
        for key, stored in existing.items():
            if stored is not None and stored != bodies[key][1]:
                self.conflicts.append(Conflict(key[0], key[1], key[2], candidates[key][1].type))

    def _forget_uncommitted(self, touched: set[str]) -> None:
        """After a ROLLBACK: drop what memory says about rows that were not written, so
        the next batch writes them (what is stored is what counts)."""
        self._current.clear()
        self._unreachable = None
        self.history.forget(touched)

    def _existing(self, keys: list[MessageKey]) -> dict[MessageKey, bytes | None]:
        """Which of these (node, epoch, seq) are already stored, with their digests (an
        indexed point lookup each)."""
        found: dict[MessageKey, bytes | None] = {}
        for key in keys:
            row = self.db.execute("SELECT digest FROM messages WHERE node = ? AND epoch = ? AND seq = ?",
                                  key).fetchone()
            if row is not None:
                found[key] = row[0]
        return found

    def _claim(self, candidates: dict[MessageKey, BatchItem], bodies: dict[MessageKey, _Body],
               now: float) -> tuple[list[tuple[MessageKey, BatchItem]], dict[MessageKey, bytes | None]]:
        """On a database other collectors write at the same time (PostgreSQL, ingest
        batches side by side): insert the ``messages`` rows first, ``ON CONFLICT DO
        NOTHING``. What the insert returns is what this batch stores: the unique key
        decides, also against another collector's batch in flight (the insert waits for it
        to end). The rest are duplicates, with their stored digests. Keys in order, so two
        batches that share some take their locks in one order (no deadlock)."""
        keys = sorted(candidates)
        if not keys:
            return [], {}
        rows = [(node, epoch, seq, candidates[key][1].type, candidates[key][1].ts, now, bodies[key][1])
                for key in keys for node, epoch, seq in (key,)]
        sql = f"{_INSERT_MESSAGES} ON CONFLICT DO NOTHING RETURNING node, epoch, seq"
        cur = self.db.executemany(sql, rows) if len(rows) > 1 else self.db.execute(sql, rows[0])
        stored = {(str(node), str(epoch), int(seq)) for node, epoch, seq in cur.fetchall()}
        new = [(key, item) for key, item in candidates.items() if key in stored]  # (in batch order)
        duplicates = [key for key in keys if key not in stored]
        return new, (self._existing_shared(duplicates) if duplicates else {})

    def _existing_shared(self, keys: list[MessageKey]) -> dict[MessageKey, bytes | None]:
        """The stored digests of these keys, in one query."""
        nodes, epochs, seqs = (list(column) for column in zip(*keys, strict=True))
        rows = self.db.execute(
            "SELECT m.node, m.epoch, m.seq, m.digest FROM messages m "
            "JOIN unnest(?::text[], ?::text[], ?::bigint[]) AS k(node, epoch, seq) "
            "ON m.node = k.node AND m.epoch = k.epoch AND m.seq = k.seq", (nodes, epochs, seqs))
        return {(str(node), str(epoch), int(seq)): (bytes(digest) if digest is not None else None)
                for node, epoch, seq, digest in rows}

    def _write(self, new: list[tuple[MessageKey, BatchItem]], bodies: dict[MessageKey, _Body],
               touched: set[str], now: float, states: dict[str, _State]) -> _BatchRows:
        rows = _BatchRows({node: [0, None, None, None, None, None] for node in touched})
        # (shared: the messages rows were written first, ``_claim``)
        messages = _skip if self.shared else rows.messages.append
        nodes, verdict = rows.nodes, self._verdict
        for key, item in new:
            node, epoch, seq = key
            env = item[1]
            mtype = env.type
            packed, digest = bodies[key]
            messages((node, epoch, seq, mtype, env.ts, now, digest))
            row = nodes[node]
            if seq > row[0]:
                row[0] = seq
            if mtype in (REPORT, EVENT):
                verdict(rows, node, env, packed, now, states)
            elif mtype == HELLO:
                row[4] = text(env.body.get("version"))
            elif env.type == COMMAND_RESULT:
                body = env.body
                rows.results.append((node, seq, env.ts, text(body.get("command_id")),
                                     int(bool(body.get("ok"))),
                                     msgpack.packb(body.get("result"), use_bin_type=True)))
            if self.inbox and env.type != HELLO and (node, seq) not in self.stale:
                rows.inbox.append((node, seq, env.type, now, _inbox_body(env, packed)))
        self._insert(rows, touched, now)
        return rows

    def _verdict(self, rows: _BatchRows, node: str, env: Envelope, packed: bytes, now: float,
                 states: dict[str, _State]) -> None:
        """A report or event: the node's verdict and worst finding; for a report, its history
        row and findings when its state changed; for an event, the event and its findings."""
        body, seq, epoch = env.body, env.seq, env.epoch
        verdict = body.get("verdict")  # (a str of at most MAX_SEVERITY from decode; else cut)
        verdict = (verdict if type(verdict) is str and len(verdict) <= _MAX_TEXT else text(verdict)) or _UNKNOWN
        worst: dict[str, Any] = {}
        worst_rank = 0
        bad: list[tuple[Any, ...]] = []
        for f in body.get("findings", ()):
            severity = f.get("severity")
            if severity == _OK:  # the common case, kept cheap
                continue
            severity = str(severity).upper()
            if severity == _OK:
                continue
            bad.append((text(f.get("check")), severity, _int(f.get("gpu")),
                        text(f.get("subject")), text(f.get("message"))))
            rank = _RANK.get(severity, _RANK[_UNKNOWN])
            if rank > worst_rank:
                worst, worst_rank = f, rank
        # The node's state is its newest message by seq (within its spool epoch), whatever
        # the arrival order (events overtake spooled reports); its clock is data, never the order.
        row = rows.nodes[node]
        report = env.type == REPORT
        if self._newest(node, epoch, seq, row[5]):
            row[1], row[2], row[3], row[5] = now, verdict, worst, (epoch, seq)
        elif report:
            self.stale.add((node, seq))
        if report:
            self.history.observe(node, env.ts, verdict, body.get("throttle"), body.get("summary"),
                                 rows.samples)
            state = (verdict, tuple(bad))
            if state != (states.get(node) or self._last_state.get(node)):
                states[node] = state
                rows.history.append((node, seq, env.ts, verdict))
                rows.findings.extend((node, seq, env.ts, *b) for b in bad)
            latest = rows.latest_report
            held = latest.get(node)  # (the SQL keeps a newer stored one)
            if held is None or epoch != held[0].epoch or seq > held[0].seq:
                latest[node] = (env, packed)
            if body.get("facts") is not None:  # (not only the newest report's: it may have none)
                with_facts = rows.latest_facts.get(node)
                if with_facts is None or epoch != with_facts.epoch or seq > with_facts.seq:
                    rows.latest_facts[node] = env
        else:
            rows.findings.extend((node, seq, env.ts, *b) for b in bad)
            rows.events.append((node, seq, env.ts, text(body.get("kind")), _int(body.get("gpu")),
                                _int(body.get("data")), verdict, packed))

    def _newest(self, node: str, epoch: str, seq: int, held: tuple[str, int] | None) -> bool:
        """Whether (epoch, seq) is newer than the message that holds the node's state: the
        batch's (``held``), else the stored one (kept in memory, read once per node)."""
        if held is None:
            current = self._current
            held = current[node] if node in current else self._held(node)
        return held is None or epoch != held[0] or seq > held[1]

    def _held(self, node: str) -> tuple[str, int] | None:
        if node in self._current:
            return self._current[node]
        row = self.db.execute("SELECT verdict_epoch, verdict_seq FROM nodes WHERE node = ?", (node,)).fetchone()
        held = (str(row[0]), int(row[1])) if row is not None and row[1] is not None else None
        self._current[node] = held
        return held

    def _insert(self, rows: _BatchRows, touched: set[str], now: float) -> None:
        db = self.db
        if rows.messages:
            db.executemany(_INSERT_MESSAGES, rows.messages)
        if rows.history:
            db.executemany("INSERT INTO report_history (node, seq, ts, verdict) VALUES (?,?,?,?)",
                           rows.history)
        if rows.findings:
            db.executemany("INSERT INTO findings (node, seq, ts, check_id, severity, gpu, subject, message) "
                           "VALUES (?,?,?,?,?,?,?,?)", rows.findings)
        if rows.events:
            db.executemany("INSERT INTO events (node, seq, ts, kind, gpu, data, verdict, body) "
                           "VALUES (?,?,?,?,?,?,?,?)", rows.events)
        rows.samples.write(db)
        self._note_reachable(touched, now)
        if rows.results:
            db.executemany("INSERT INTO command_results (node, seq, ts, command_id, ok, result) "
                           "VALUES (?,?,?,?,?,?)", rows.results)
        if rows.inbox:
            db.executemany("INSERT INTO leader_inbox (node, seq, type, received_at, body) VALUES (?,?,?,?,?)",
                           rows.inbox)
        # (Rows of many nodes in node order: two collectors' batches that share nodes, a
        # node failing over from one to the other, lock them in one order.)
        if rows.latest_report:
            db.executemany(_UPSERT_REPORT, [_report_row(node, env, packed)
                                            for node, (env, packed) in sorted(rows.latest_report.items())])
        if rows.latest_facts:
            db.executemany(_UPSERT_FACTS, [_facts_row(node, env)
                                           for node, env in sorted(rows.latest_facts.items())])
        nodes = []
        for node, (last_seq, verdict_ts, verdict, w, version, held_by) in sorted(rows.nodes.items()):
            epoch, seq = held_by or (None, None)
            if w:
                nodes.append((node, now, now, last_seq, verdict, verdict_ts, text(w.get("check")),
                              text(w.get("severity")), text(w.get("message")), _int(w.get("gpu")),
                              version, epoch, seq))
            else:  # (no worst finding: the common case)
                nodes.append((node, now, now, last_seq, verdict, verdict_ts, None, None, None, None,
                              version, epoch, seq))
        db.executemany(_UPSERT_NODES, nodes)

    def touch(self, nodes: Iterable[str], now: float | None = None) -> None:
        """Record that these nodes were heard from (heartbeats): their ``last_seen`` and
        reachability, in one transaction of its own: what ``store_batch`` writes for a
        heartbeat, by a statement that sets nothing else."""
        when = time.time() if now is None else now
        heard = set(nodes)
        if not heard:
            return
        db = self.db
        dialect_of(db).begin_ingest(db)
        try:
            self._note_reachable(heard, when)
            db.executemany(_TOUCH_NODES, [(node, when, when) for node in sorted(heard)])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._unreachable = None  # (``_note_reachable`` may have dropped some)
            raise

    # ------------------------------------------------------------------ decisions, checkpoints

    def add_decisions(self, decisions: Iterable[Any]) -> int:
        """Record automation decisions (objects with the ``Decision`` fields) in one
        transaction; returns the rows written."""
        rows = [(float(d.time), text(d.node), text(d.action), text(d.reason), int(bool(d.held)),
                 int(bool(d.dry_run)), text(d.trigger), text(d.result)) for d in decisions]
        if not rows:
            return 0
        with self.transaction():
            self.db.executemany("INSERT INTO decisions (time, node, action, reason, held, dry_run, "
                                "trigger, result) VALUES (?,?,?,?,?,?,?,?)", rows)
        return len(rows)

    def add_findings(self, node: str, seq: int, ts: float, findings: Iterable[Any]) -> int:
        """Findings the collector itself made about a node's message (``validate.straggler``
        on a validation event), in the findings table under that message's seq."""
        rows = [(node, seq, ts, text(f.check), f.severity.name, f.gpu, text(f.subject), text(f.message))
                for f in findings]
        if rows:
            with self.transaction():
                self.db.executemany("INSERT INTO findings (node, seq, ts, check_id, severity, gpu, subject, "
                                    "message) VALUES (?,?,?,?,?,?,?,?)", rows)
        return len(rows)

    # (rows written inside the caller's transaction)

    def add_checkpoint(self, row: dict[str, Any]) -> int:
        cur = self.db.execute(
            'INSERT INTO checkpoints (job_id, action, reason, trigger_node, nodes, "user", requested, '
            "deadline, state) VALUES (?,?,?,?,?,?,?,?,?) RETURNING id",
            (row["job_id"], row["action"], text(row.get("reason")), row["trigger_node"],
             json.dumps(list(row["nodes"])), text(row.get("user")), row["requested"],
             row["deadline"], row.get("state", "open")))
        return int(cur.fetchone()[0])

    def update_checkpoint(self, checkpoint_id: int, **fields: Any) -> None:
        allowed = {"state", "acked_at", "acked_by", "closed", "deadline", "action", "nodes"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"bad checkpoint fields {sorted(fields)}")
        if "nodes" in fields:
            fields["nodes"] = json.dumps(list(fields["nodes"]))
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE checkpoints SET {sets} WHERE id = ?",
                        [*fields.values(), checkpoint_id])

    def set_pending_drain(self, node: str, action: str, reason: str, trigger: str, since: float,
                          checkpoint_ids: Sequence[int]) -> None:
        self.db.execute(
            "INSERT INTO pending_drains (node, action, reason, trigger, since, checkpoints) "
            "VALUES (?,?,?,?,?,?) ON CONFLICT (node) DO UPDATE SET checkpoints = excluded.checkpoints",
            (node, action, text(reason), text(trigger), since, json.dumps(list(checkpoint_ids))))

    def upgrade_pending_drain(self, node: str, action: str, reason: str, trigger: str) -> None:
        self.db.execute("UPDATE pending_drains SET action = ?, reason = ?, trigger = ? WHERE node = ?",
                        (action, text(reason), text(trigger), node))

    def remove_pending_drain(self, node: str) -> None:
        self.db.execute("DELETE FROM pending_drains WHERE node = ?", (node,))

    def add_job_event(self, job_id: str, ts: float, kind: str, node: str | None = None,
                      detail: str | None = None) -> None:
        self.db.execute("INSERT INTO job_events (job_id, ts, kind, node, detail) VALUES (?,?,?,?,?)",
                        (job_id, ts, kind, text(node), text(detail)))

    # ------------------------------------------------------------------ node states

    def mark_unreachable(self, now: float, after_s: float) -> list[str]:
        """Mark nodes silent for more than ``after_s`` unreachable; return the newly marked."""
        unreachable = self._unreachable_nodes()
        with self.transaction():
            rows = self.db.execute(
                "UPDATE nodes SET reachable = 0, unreachable_since = ? "
                "WHERE reachable = 1 AND last_seen < ? RETURNING node", (now, now - after_s)).fetchall()
            gone = sorted(str(r[0]) for r in rows)
            self.db.executemany(
                "INSERT INTO node_states (node, ts, kind, reason, actor) VALUES (?,?,?,?,?)",
                [(n, now, "unreachable", f"silent for {after_s:g} s", "collector") for n in gone])
        unreachable.update(gone)
        return gone

    def _unreachable_nodes(self) -> set[str]:
        if self._unreachable is None:
            self._unreachable = {str(r[0]) for r in
                                 self.db.execute("SELECT node FROM nodes WHERE reachable = 0")}
        return self._unreachable

    def _note_reachable(self, touched: set[str], now: float) -> None:
        """Inside ``_write``: nodes marked unreachable that spoke again."""
        unreachable = self._unreachable_nodes()
        back = sorted(unreachable & touched)
        if back:
            self.db.executemany(
                "INSERT INTO node_states (node, ts, kind, reason, actor) VALUES (?,?,?,?,?)",
                [(n, now, "reachable", None, "collector") for n in back])
            unreachable.difference_update(back)

    def record_slurm_states(self, states: Iterable[Any], now: float) -> list[tuple[str, str]]:
        """Record drain/resume transitions from a Slurm poll (``NodeState`` objects), each
        drain with who did it (``drain_actor``); returns the (node, kind) transitions
        written."""
        last = self._last_slurm_states()
        rows: list[tuple[str, float, str, str | None, str | None, str | None]] = []
        for st in states:
            drained, reason = bool(st.drained), text(st.reason)
            before = last.get(st.name)
            if before is None and not drained:
                last[st.name] = (False, None)  # first sight, not drained: nothing happened
                continue
            if drained and (before is None or not before[0] or before[1] != reason):
                ts = st.reason_time if st.reason_time and st.reason_time <= now else now
                rows.append((st.name, ts, "drained", reason, text(st.reason_user),
                             self.drain_actor(st.name, reason, now)))
            elif not drained and before is not None and before[0]:
                rows.append((st.name, now, "resumed", None, None, None))
            last[st.name] = (drained, reason if drained else None)
        if rows:
            with self.transaction():
                self.db.executemany("INSERT INTO node_states (node, ts, kind, reason, actor, "
                                    "drained_by) VALUES (?,?,?,?,?,?)", rows)
        return [(r[0], r[2]) for r in rows]

    def drain_actor(self, node: str, reason: str | None, now: float) -> str:
        """Who drained ``node`` with this Slurm ``reason``: ``outside``, an actor tag,
        ``automation`` or ``slurmgpu``, decided as docs/fleet-db.md (``drained_by``) says."""
        if not reason or not reason.startswith(REASON_PREFIX):
            return "outside"
        tagged = reason_actor(reason)
        if tagged is not None:
            return tagged[0]
        since = self.db.execute("SELECT max(ts) FROM node_states WHERE node = ? AND kind = "
                                "'resumed'", (node,)).fetchone()[0]
        for (decided,) in self.db.execute(
                "SELECT reason FROM decisions WHERE node = ? AND result IN ('drained', "
                "'reboot-requested') AND time > ? AND time <= ? ORDER BY time DESC LIMIT 20",
                (node, since if since is not None else float("-inf"), now + DECISION_SLACK_S)):
            if _same_reason(decided or "", reason):
                return "automation"
        return "slurmgpu"

    def _last_slurm_states(self) -> dict[str, tuple[bool, str | None]]:
        if self._slurm_state is None:  # (a node resumed last counts as never drained)
            self._slurm_state = {n: (True, d.reason) for n, d in current_drains(self.db).items()}
        return self._slurm_state

    # ------------------------------------------------------------------ retention

    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        """Delete history older than the retention; returns the rows deleted.
        The latest report and the node rows are kept whatever their age."""
        cutoff = (time.time() if now is None else now) - retention_days * 86400.0
        deleted = 0
        with self.transaction():
            for table, column in _PRUNED:
                deleted += self.db.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,)).rowcount
            deleted += self.db.execute("DELETE FROM checkpoints WHERE state != 'open' AND requested < ?",
                                       (cutoff,)).rowcount
        # The next report of every node is recorded again, so a node whose state has not
        # changed for longer than the retention still has its current state in the history.
        self._last_state.clear()
        return deleted
