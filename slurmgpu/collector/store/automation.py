"""The automation's state in the fleet database (schema 7; before, it was the JSON file
``<state_dir>/automation.json``).

``AutomationState`` is the state as the policy (``slurmgpu.collector.policy``) works on it,
in memory; ``AutomationRecord`` keeps it in the ``automation_*`` tables:

Design notes: docs/design-notes.md (``slurmgpu/collector/store/automation.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from slurmgpu.collector.store.backend import Connection, dialect_of
from slurmgpu.collector.store.ingest import Ingest

Row = tuple[Any, ...]


class DrainedNode(TypedDict):
    """A node the automation drained (``AutomationState.drained``): when, for which check
    and why; ``pending``: the drain waits for its jobs' checkpoints (the action it will
    take); ``then``: a reboot follows the drain."""

    time: float
    trigger: str
    reason: str
    pending: NotRequired[str]
    then: NotRequired[str]


class Lemon(TypedDict):
    """A node drained too often (``AutomationState.lemons``): since when, and why."""

    since: float
    why: str
Rows = dict[Row, Row]  # one table's rows: key columns -> value columns
Group = dict[str, Rows]  # table -> rows
Image = dict[str, Group]  # FLEET (the fleet-wide rows) or a node -> its rows
FLEET = ""

# Entry keys of a held drain, in column order (`then` is the `then_action` column).
_HELD = ("action", "reason", "trigger", "time", "since", "then", "checkpoints")
_RELEASED = (*_HELD, "released_at", "released_by")
_LOG = ("time", "node", "action", "reason", "held", "dry_run", "trigger", "result", "released_by")
_HELD_COLUMNS = ("action", "reason", "trigger", "time", "since", "then_action", "checkpoints")
# table -> (key columns, value columns); the first key of a per-node table is the node.
_NODE_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "automation_seen": (("node",), ()),
    "automation_strikes": (("node", "check_id"), ("strikes",)),
    "automation_healthy": (("node",), ("reports", "first")),
    "automation_drained": (("node",), ("time", "trigger", "reason", "then_action")),
    "automation_drain_history": (("node", "ts"), ("drains",)),
    "automation_held": (("node",), _HELD_COLUMNS),
    "automation_released": (("node",), (*_HELD_COLUMNS, "released_at", "released_by")),
    "automation_lemons": (("node",), ("since", "why")),
}
_FLEET_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "automation_drain_times": (("ts",), ("drains",)),
    "automation_failing": (("check_id", "node"), ("time",)),
}
_STATE_COLUMNS = ("fleet", "breaker_open", "breaker_since", "breaker_why")
# Every table of the automation's state (``reset`` empties them).
TABLES = (*_NODE_TABLES, *_FLEET_TABLES, "automation_state", "automation_log")


@dataclass
class AutomationState:
    fleet: int = 0
    seen: list[str] = field(default_factory=list)
    strikes: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> check -> n
    healthy: dict[str, list[float]] = field(default_factory=dict)  # node -> [count, first]
    drained: dict[str, DrainedNode] = field(default_factory=dict)  # by us, still drained
    history: dict[str, list[float]] = field(default_factory=dict)  # node -> drain times
    drain_times: list[float] = field(default_factory=list)  # all new drains, last hour
    failing: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> node -> time
    breaker: dict[str, Any] = field(default_factory=lambda: {"open": False, "since": None, "why": None})
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Held drains an operator released, to be carried out once by the collector.
    released: dict[str, dict[str, Any]] = field(default_factory=dict)
    lemons: dict[str, Lemon] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)


def read_json(path: Path) -> AutomationState:
    """The state of a slurmgpu before schema 7, from its ``automation.json`` (OSError,
    ValueError: unreadable)."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    names = {f.name for f in fields(AutomationState)}
    return AutomationState(**{k: v for k, v in raw.items() if k in names})


class AutomationRecord:
    """The automation's state in memory (``state``) and the database it is kept in."""

    def __init__(self, store: Ingest) -> None:
        self.store = store
        self.state = AutomationState()
        # The stored version the state in memory was read or written as (None: the
        # database holds no automation state).
        self.version: int | None = None
        self._base: Image = {}  # the rows as stored at that version
        self.reload()

    def stored_version(self) -> int | None:
        return stored_version(self.store.db)

    def refresh(self) -> bool:
        """Read the state back if someone else wrote it since; True if it did."""
        if self.stored_version() == self.version:
            return False
        self.reload()
        return True

    def reload(self) -> None:
        self.state, self.version = _load(self.store.db)
        self._base = image(self.state)

    def save(self, nodes: Collection[str] | None = None) -> None:
        """Write what changed: every row, or (``nodes``) those nodes' rows and the fleet's."""
        new = image(self.state, nodes)
        if nodes is None:  # nodes the state no longer holds lose their rows
            for group in self._base:
                new.setdefault(group, {table: {} for table in _NODE_TABLES})
        with self.store.transaction() as db:
            stored = stored_version(db)
            version = (stored or 0) + 1
            for group, tables in new.items():
                _write_group(db, self._base.get(group, {}), tables)
            before = self._base.get(FLEET, {}).get("automation_state", {}).get((1,))
            _write_state(db, before if stored is not None else None, new[FLEET]["automation_state"][(1,)],
                         version)
        if stored != self.version:  # someone else wrote in between: take the merged rows
            self.reload()
            return
        self.version = version
        self._base.update(new)
        if nodes is None:
            self._base = {g: tables for g, tables in self._base.items() if any(tables.values())}

    def import_json(self, path: Path) -> bool:
        """Bring a pre-schema-7 ``automation.json`` into a database that holds no automation
        state yet (one transaction); False when it already holds some (nothing read)."""
        with self.store.transaction() as db:
            if stored_version(db) is not None:
                return False
            self.state, self.version, self._base = read_json(path), None, {}
            self.save()
        self.reload()  # (a drained node's pending comes from pending_drains)
        return True


def reset(db: Connection) -> None:
    """Forget the automation's state (inside the caller's transaction)."""
    for table in TABLES:
        db.execute(f"DELETE FROM {table}")


# ---------------------------------------------------------------------- state -> rows


def image(state: AutomationState, nodes: Collection[str] | None = None) -> Image:
    """The state as rows: the fleet-wide group and one group per node (every node the
    state names, or ``nodes``)."""
    seen = set(state.seen)
    if nodes is None:  # (the seen ones first)
        others = set().union(state.strikes, state.healthy, state.drained, state.history, state.held,
                             state.released, state.lemons) - seen
        nodes = [*dict.fromkeys(state.seen), *sorted(others)]
    out = {FLEET: _fleet_group(state)}
    for node in nodes:
        out[node] = _node_group(state, node, seen)
    return out


def _node_group(st: AutomationState, node: str, seen: set[str]) -> Group:
    drained, held, released = st.drained.get(node), st.held.get(node), st.released.get(node)
    healthy, lemon = st.healthy.get(node), st.lemons.get(node)
    return {
        "automation_seen": {(node,): ()} if node in seen else {},
        "automation_strikes": {(node, str(c)): (int(n),) for c, n in (st.strikes.get(node) or {}).items()},
        "automation_healthy": {(node,): (int(healthy[0]), float(healthy[1]))} if healthy else {},
        "automation_drained": {} if drained is None else {(node,): (
            drained.get("time"), drained.get("trigger"), drained.get("reason"), drained.get("then"))},
        "automation_drain_history": {(node, ts): (n,) for ts, n in Counter(st.history.get(node) or ()).items()},
        "automation_held": {} if held is None else {(node,): tuple(held.get(k) for k in _HELD)},
        "automation_released": {} if released is None else {(node,): tuple(released.get(k) for k in _RELEASED)},
        "automation_lemons": {} if lemon is None else {(node,): (lemon.get("since"), lemon.get("why"))},
    }


def _fleet_group(st: AutomationState) -> Group:
    b = st.breaker
    log: Rows = {}
    copies: Counter[Row] = Counter()
    for entry in st.log:  # identical entries are told apart by their copy number
        row = tuple(int(bool(entry.get(k))) if k in ("held", "dry_run") else entry.get(k) for k in _LOG)
        log[(*row, copies[row])] = ()
        copies[row] += 1
    return {
        "automation_state": {(1,): (int(st.fleet), int(bool(b.get("open"))), b.get("since"), b.get("why"))},
        "automation_drain_times": {(ts,): (n,) for ts, n in Counter(st.drain_times).items()},
        "automation_failing": {(c, n): (t,) for c, on in st.failing.items() for n, t in on.items()},
        "automation_log": log,
    }


# ---------------------------------------------------------------------- rows -> database


def _write_group(db: Connection, old: Group, new: Group) -> None:
    for table, rows in new.items():
        before = old.get(table, {})
        if table == "automation_log":
            _write_log(db, before, rows)
            continue
        if table == "automation_state":
            continue  # (written with the version: _write_state)
        keys, values = _NODE_TABLES.get(table) or _FLEET_TABLES[table]
        gone = [k for k in before if k not in rows]
        if gone:
            db.executemany(f"DELETE FROM {table} WHERE " + " AND ".join(f"{c} = ?" for c in keys), gone)
        changed = [k + v for k, v in rows.items() if before.get(k) != v]
        if changed:
            names = (*keys, *values)
            update = (" DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in values)
                      if values else " DO NOTHING")
            db.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES "
                           f"({', '.join('?' * len(names))}) ON CONFLICT ({', '.join(keys)})" + update,
                           changed)


def _write_log(db: Connection, old: Rows, new: Rows) -> None:
    same = dialect_of(db).same  # (null-safe =)
    match = " AND ".join(f"{c} {same} ?" for c in _LOG)
    for key in old:
        if key not in new:
            db.execute(f"DELETE FROM automation_log WHERE id = (SELECT id FROM automation_log WHERE "
                       f"{match} ORDER BY id LIMIT 1)", key[:-1])
    added = [key[:-1] for key in new if key not in old]
    if added:
        db.executemany(f"INSERT INTO automation_log ({', '.join(_LOG)}) VALUES "
                       f"({', '.join('?' * len(_LOG))})", added)


def _write_state(db: Connection, old: Row | None, new: Row, version: int) -> None:
    """The breaker and fleet row, with the new version; of a row already stored, only the
    columns this save changed."""
    if old is None:
        db.execute(f"INSERT INTO automation_state (id, version, {', '.join(_STATE_COLUMNS)}) "
                   "VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
                   + ", ".join(f"{c} = excluded.{c}" for c in _STATE_COLUMNS), (version, *new))
        return
    changed = [(c, v) for c, was, v in zip(_STATE_COLUMNS, old, new, strict=True) if was != v]
    db.execute("UPDATE automation_state SET version = ?" + "".join(f", {c} = ?" for c, _ in changed)
               + " WHERE id = 1", (version, *(v for _, v in changed)))


# ---------------------------------------------------------------------- database -> state


def stored_version(db: Connection) -> int | None:
    """The version of the automation's state in the database; None: it holds none."""
    row = db.execute("SELECT version FROM automation_state WHERE id = 1").fetchone()
    return None if row is None else int(row[0])


def _present(keys: Iterable[str], values: Iterable[Any]) -> dict[str, Any]:
    """An entry from its columns: a NULL column is a key the entry does not have."""
    return {k: v for k, v in zip(keys, values, strict=True) if v is not None}


def _load(db: Connection) -> tuple[AutomationState, int | None]:
    row = db.execute("SELECT version, fleet, breaker_open, breaker_since, breaker_why FROM "
                     "automation_state WHERE id = 1").fetchone()
    if row is None:
        return AutomationState(), None
    st = AutomationState(fleet=int(row[1]), breaker={"open": bool(row[2]), "since": row[3], "why": row[4]})
    st.seen = [str(n) for (n,) in db.execute("SELECT node FROM automation_seen ORDER BY node")]
    for node, check, n in db.execute("SELECT node, check_id, strikes FROM automation_strikes"):
        st.strikes.setdefault(node, {})[check] = int(n)
    st.healthy = {node: [int(n), float(first)] for node, n, first in
                  db.execute("SELECT node, reports, first FROM automation_healthy")}
    pending = {str(n): str(a) for n, a in db.execute("SELECT node, action FROM pending_drains")}
    for node, *values in db.execute("SELECT node, time, trigger, reason, then_action FROM automation_drained"):
        st.drained[node] = _present(("time", "trigger", "reason", "then"), values)  # type: ignore[assignment]
        if node in pending:
            st.drained[node]["pending"] = pending[node]
    for node, ts, n in db.execute("SELECT node, ts, drains FROM automation_drain_history ORDER BY node, ts"):
        st.history.setdefault(node, []).extend([float(ts)] * int(n))
    for ts, n in db.execute("SELECT ts, drains FROM automation_drain_times ORDER BY ts"):
        st.drain_times.extend([float(ts)] * int(n))
    for check, node, t in db.execute("SELECT check_id, node, time FROM automation_failing"):
        st.failing.setdefault(check, {})[node] = t
    for node, *values in db.execute(f"SELECT node, {', '.join(_HELD_COLUMNS)} FROM automation_held"):
        st.held[node] = _present(_HELD, values)
    for node, *values in db.execute(f"SELECT node, {', '.join(_HELD_COLUMNS)}, released_at, released_by "
                                    "FROM automation_released"):
        st.released[node] = _present(_RELEASED, values)
    st.lemons = {node: _present(("since", "why"), (since, why))  # type: ignore[misc]
                 for node, since, why in
                 db.execute("SELECT node, since, why FROM automation_lemons")}
    for values in db.execute(f"SELECT {', '.join(_LOG)} FROM automation_log ORDER BY id"):
        entry = dict(zip(_LOG, values, strict=True))
        entry["held"], entry["dry_run"] = bool(entry["held"]), bool(entry["dry_run"])
        st.log.append(entry)
    return st, int(row[0])
