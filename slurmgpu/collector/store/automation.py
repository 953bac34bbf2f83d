"""The automation's state in the fleet database (schema 7; before, it was the JSON file
``<state_dir>/automation.json``, imported once).

``AutomationState`` is the state as the policy (``slurmgpu.collector.policy``) works on it,
in memory: one typed record per node the automation took away (``DrainedNode``, whose
``Stage`` the return-to-service ladder extends), per drain the breaker holds or an
operator released (``HeldDrain``) and per lemon (``Lemon``). ``AutomationRecord`` keeps
it in the ``automation_*`` tables, writing only the rows a change touched; rows of any
earlier version load.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/automation.py``).
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurmgpu.collector.store.backend import Connection, insert_sql
from slurmgpu.collector.store.ingest import Ingest
from slurmgpu.decision import Action

Row = tuple[Any, ...]


class Stage(enum.StrEnum):
    """Where a node the automation took away stands (the return-to-service ladder adds
    its steps here: validating in a reservation, reset, reboot, repair)."""

    CHECKPOINTING = "checkpointing"  # the drain waits for its jobs' checkpoints
    DRAINED = "drained"


@dataclass(slots=True)
class DrainedNode:
    """A node the automation took away: when, for which check and why."""

    time: float
    trigger: str = ""
    reason: str = ""
    stage: Stage = Stage.DRAINED
    pending: Action | None = None  # CHECKPOINTING: the action its jobs' acks lead to
    then_reboot: bool = False  # CHECKPOINTING: a reboot, not a drain, once they acked


@dataclass(slots=True)
class HeldDrain:
    """A drain the circuit breaker holds (``AutomationState.held``), or one an operator
    released (``released``, with ``released_by``), carried out once by the collector."""

    action: Action
    reason: str
    trigger: str
    time: float
    since: float
    then_reboot: bool = False  # a drain-now whose fault only a reboot clears
    checkpoints: int | None = None  # jobs asked to checkpoint while it was held (None: not asked)
    released_at: float | None = None
    released_by: str | None = None

    def to_json(self, node: str) -> dict[str, Any]:
        """As `slurmgpu breaker status --json` shows it (a key that is not set is absent)."""
        out: dict[str, Any] = {"action": self.action, "reason": self.reason, "trigger": self.trigger,
                               "time": self.time, "since": self.since}
        if self.then_reboot:
            out["then"] = Action.REBOOT
        for key in ("checkpoints", "released_at", "released_by"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return dict(out, node=node)


@dataclass(slots=True)
class Lemon:
    """A node drained too often (``AutomationState.lemons``): since when, and why."""

    since: float
    why: str


@dataclass(slots=True)
class Breaker:
    """The circuit breaker (``slurmgpu.collector.breaker``): open since when, and why."""

    open: bool = False
    since: float | None = None
    why: str | None = None


Rows = dict[Row, Row]  # one table's rows: key columns -> value columns
Group = dict[str, Rows]  # table -> rows
Image = dict[str, Group]  # FLEET (the fleet-wide rows) or a node -> its rows
FLEET = ""

# A released drain's keys in automation.json, in column order (`then`: `then_action`).
_RELEASED = ("action", "reason", "trigger", "time", "since", "then", "checkpoints", "released_at", "released_by")
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
# Every table of the automation's state (``reset`` empties them; ``automation_log`` is no
# longer written, its old rows are forgotten with the rest).
TABLES = (*_NODE_TABLES, *_FLEET_TABLES, "automation_state", "automation_log")


@dataclass
class AutomationState:
    fleet: int = 0
    seen: list[str] = field(default_factory=list)
    strikes: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> check -> n
    healthy: dict[str, list[float]] = field(default_factory=dict)  # node -> [count, first]
    drained: dict[str, DrainedNode] = field(default_factory=dict)  # by us, still taken away
    history: dict[str, list[float]] = field(default_factory=dict)  # node -> drain times
    drain_times: list[float] = field(default_factory=list)  # all new drains, last hour
    failing: dict[str, dict[str, float]] = field(default_factory=dict)  # check -> node -> time
    breaker: Breaker = field(default_factory=Breaker)
    held: dict[str, HeldDrain] = field(default_factory=dict)
    released: dict[str, HeldDrain] = field(default_factory=dict)  # carried out once by the collector
    lemons: dict[str, Lemon] = field(default_factory=dict)


def read_json(path: Path) -> AutomationState:
    """The state of a slurmgpu before schema 7, from its ``automation.json`` (OSError,
    ValueError, TypeError, KeyError: unreadable)."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    names = {f.name for f in fields(AutomationState)} - {"breaker", "drained", "held", "released", "lemons"}
    st = AutomationState(**{k: v for k, v in raw.items() if k in names})
    st.breaker = Breaker(**raw.get("breaker") or {})
    st.drained = {n: _drained(e.get("time"), e.get("trigger"), e.get("reason"), e.get("then"))
                  for n, e in (raw.get("drained") or {}).items()}
    for table, key in ((st.held, "held"), (st.released, "released")):
        table.update({n: _held(*(e.get(k) for k in _RELEASED)) for n, e in (raw.get(key) or {}).items()})
    st.lemons = {n: Lemon(**e) for n, e in (raw.get("lemons") or {}).items()}
    return st


def _drained(time: Any, trigger: Any, reason: Any, then: Any) -> DrainedNode:
    """A drained node from its stored values (any of them NULL in an old row)."""
    return DrainedNode(float(time or 0.0), str(trigger or ""), str(reason or ""),
                       then_reboot=then == Action.REBOOT)


def _held(action: Any, reason: Any, trigger: Any, time: Any, since: Any, then: Any, checkpoints: Any,
          released_at: Any = None, released_by: Any = None) -> HeldDrain:
    """A held or released drain from its stored values (a drain when it names no action;
    ValueError for one that is no action)."""
    at = float(time or 0.0)
    return HeldDrain(Action(action or Action.DRAIN), str(reason or ""), str(trigger or ""), at,
                     at if since is None else float(since), then == Action.REBOOT,
                     None if checkpoints is None else int(checkpoints), released_at, released_by)


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

    def refresh(self) -> bool:
        """Read the state back if someone else wrote it since; True if it did."""
        if stored_version(self.store.db) == self.version:
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
            drained.time, drained.trigger, drained.reason, _then(drained.then_reboot))},
        "automation_drain_history": {(node, ts): (n,) for ts, n in Counter(st.history.get(node) or ()).items()},
        "automation_held": {} if held is None else {(node,): _held_row(held)[:len(_HELD_COLUMNS)]},
        "automation_released": {} if released is None else {(node,): _held_row(released)},
        "automation_lemons": {} if lemon is None else {(node,): (lemon.since, lemon.why)},
    }


def _then(reboot: bool) -> str | None:
    return str(Action.REBOOT) if reboot else None


def _held_row(h: HeldDrain) -> Row:
    return (str(h.action), h.reason, h.trigger, h.time, h.since, _then(h.then_reboot), h.checkpoints,
            h.released_at, h.released_by)


def _fleet_group(st: AutomationState) -> Group:
    b = st.breaker
    return {
        "automation_state": {(1,): (int(st.fleet), int(b.open), b.since, b.why)},
        "automation_drain_times": {(ts,): (n,) for ts, n in Counter(st.drain_times).items()},
        "automation_failing": {(c, n): (t,) for c, on in st.failing.items() for n, t in on.items()},
    }


# ---------------------------------------------------------------------- rows -> database


def _write_group(db: Connection, old: Group, new: Group) -> None:
    for table, rows in new.items():
        before = old.get(table, {})
        if table == "automation_state":
            continue  # (written with the version: _write_state)
        keys, values = _NODE_TABLES.get(table) or _FLEET_TABLES[table]
        gone = [k for k in before if k not in rows]
        if gone:
            db.executemany(f"DELETE FROM {table} WHERE " + " AND ".join(f"{c} = ?" for c in keys), gone)
        changed = [k + v for k, v in rows.items() if before.get(k) != v]
        if changed:
            db.executemany(insert_sql(table, (*keys, *values), keys), changed)


def _write_state(db: Connection, old: Row | None, new: Row, version: int) -> None:
    """The breaker and fleet row, with the new version; of a row already stored, only the
    columns this save changed."""
    if old is None:
        db.execute(insert_sql("automation_state", ("id", "version", *_STATE_COLUMNS), ("id",)), (1, version, *new))
        return
    changed = [(c, v) for c, was, v in zip(_STATE_COLUMNS, old, new, strict=True) if was != v]
    db.execute("UPDATE automation_state SET version = ?" + "".join(f", {c} = ?" for c, _ in changed)
               + " WHERE id = 1", (version, *(v for _, v in changed)))


# ---------------------------------------------------------------------- database -> state


def stored_version(db: Connection) -> int | None:
    """The version of the automation's state in the database; None: it holds none."""
    row = db.execute("SELECT version FROM automation_state WHERE id = 1").fetchone()
    return None if row is None else int(row[0])


def _load(db: Connection) -> tuple[AutomationState, int | None]:
    row = db.execute("SELECT version, fleet, breaker_open, breaker_since, breaker_why FROM "
                     "automation_state WHERE id = 1").fetchone()
    if row is None:
        return AutomationState(), None
    st = AutomationState(fleet=int(row[1]), breaker=Breaker(bool(row[2]), row[3], row[4]))
    st.seen = [str(n) for (n,) in db.execute("SELECT node FROM automation_seen ORDER BY node")]
    for node, check, n in db.execute("SELECT node, check_id, strikes FROM automation_strikes"):
        st.strikes.setdefault(node, {})[check] = int(n)
    st.healthy = {node: [int(n), float(first)] for node, n, first in
                  db.execute("SELECT node, reports, first FROM automation_healthy")}
    pending = {str(n): str(a) for n, a in db.execute("SELECT node, action FROM pending_drains")}
    for node, *values in db.execute("SELECT node, time, trigger, reason, then_action FROM automation_drained"):
        st.drained[node] = _drained(*values)
        if node in pending:
            st.drained[node].stage, st.drained[node].pending = Stage.CHECKPOINTING, Action(pending[node])
    for node, ts, n in db.execute("SELECT node, ts, drains FROM automation_drain_history ORDER BY node, ts"):
        st.history.setdefault(node, []).extend([float(ts)] * int(n))
    for ts, n in db.execute("SELECT ts, drains FROM automation_drain_times ORDER BY ts"):
        st.drain_times.extend([float(ts)] * int(n))
    for check, node, t in db.execute("SELECT check_id, node, time FROM automation_failing"):
        st.failing.setdefault(check, {})[node] = t
    for node, *values in db.execute(f"SELECT node, {', '.join(_HELD_COLUMNS)} FROM automation_held"):
        st.held[node] = _held(*values)
    for node, *values in db.execute(f"SELECT node, {', '.join(_HELD_COLUMNS)}, released_at, released_by "
                                    "FROM automation_released"):
        st.released[node] = _held(*values)
    st.lemons = {node: Lemon(float(since or 0.0), str(why or ""))
                 for node, since, why in db.execute("SELECT node, since, why FROM automation_lemons")}
    return st, int(row[0])
