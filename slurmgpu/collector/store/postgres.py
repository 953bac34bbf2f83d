"""The PostgreSQL backend: a psycopg 3 connection that speaks the subset of the sqlite3 API
the store uses (``slurmgpu.collector.store.backend.Connection``), with ``?`` placeholders
and sqlite3's DB-API exception classes.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/postgres.py``).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Buffer, Loader
from psycopg.conninfo import conninfo_to_dict

from slurmgpu.collector.store.backend import Cursor, describe, one_line

# DB-API exception classes, most specific first (psycopg's and sqlite3's share the names).
_DBAPI = ("IntegrityError", "DataError", "NotSupportedError", "ProgrammingError", "InternalError",
          "OperationalError", "InterfaceError", "DatabaseError", "Error")
# A quoted literal or identifier (kept, its % doubled), a ? placeholder, or a literal %.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\?|%")


@functools.lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        return token.replace("%", "%%")
    return _TOKEN.sub(swap, sql)


def translate(exc: psycopg.Error) -> sqlite3.Error:
    """The sqlite3 exception of the same DB-API class as ``exc``."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    name = next(n for n in _DBAPI if n in names)
    twin: sqlite3.Error = getattr(sqlite3, name)(one_line(exc))
    return twin


class _NumericLoader(Loader):
    def load(self, data: Buffer) -> Any:
        text = bytes(data).decode("ascii")
        try:
            return int(text)
        except ValueError:
            return float(text)


class _NoRows:
    """The result of a ROLLBACK on a connection that is gone (its transaction went with it)."""

    rowcount = -1
    description = None

    def fetchone(self) -> Any:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def __iter__(self) -> Iterator[Any]:
        return iter(())


# ``_Unnest``'s columns as one delimited text each (``_column_text``): the separator and the
# NULL element, characters that a text value holding them (a hostile node's message may)
# sends the whole statement by psycopg's arrays instead.
_SEP, _NULL = "\x1f", "\x1e"
# What a number column's text may hold (ints; floats as ``str`` writes them, inf and nan
# included): anything else (a bool's "True") goes by psycopg's arrays, which check types.
_NUMBER_TEXT = {"bigint": re.compile("[-0-9\x1e\x1f]*"),
                "double precision": re.compile("[-+0-9.einfa\x1e\x1f]*")}


def _column_text(kind: str, values: list[Any]) -> str | None:
    """One column's values as the text ``string_to_array(text, chr(31), chr(30))`` turns
    back into them (cast to the column's type), or None where that cannot be exact: one
    ``join`` in C per column, where psycopg dumps an array element by element in Python.
    Why: docs/design-notes.md (``_Unnest``)."""
    if kind == "text":
        if _NULL in values:
            return None
        try:
            text = _SEP.join([_NULL if v is None else v for v in values])
        except TypeError:  # (not all str)
            return None
        return text if text.count(_SEP) == len(values) - 1 else None
    if kind == "bytea":
        try:
            return _SEP.join([_NULL if v is None else "\\x" + v.hex() for v in values])
        except AttributeError:
            return None
    pattern = _NUMBER_TEXT.get(kind)
    if pattern is None:
        return None
    text = _SEP.join([_NULL if v is None else str(v) for v in values])
    return text if pattern.fullmatch(text) else None


_INSERT = re.compile(r"^\s*INSERT INTO (\w+) \(([^)]*)\)\s*VALUES\s*\(([^)]*)\)(.*)$", re.S | re.I)
_CONFLICT = re.compile(r"\bON CONFLICT \(([^)]*)\)", re.I)


@dataclass(frozen=True)
class _Unnest:
    """``INSERT INTO t (a, b, c) VALUES (?, ?, 1) ...`` for many rows as one statement over
    ``unnest`` of one array (or one text) per column; batches whose upsert repeats a conflict
    key go row by row (``fits``). Why: docs/design-notes.md (``_Unnest``)."""

    sql: str
    width: int  # parameters per row
    keys: tuple[int, ...]  # the conflict key's positions among them (upserts)
    text_sql: str = ""  # the same statement over ``string_to_array`` of one text a column
    kinds: tuple[str, ...] = ()  # each parameter's column type

    @classmethod
    def of(cls, sql: str, column_types: Callable[[str], dict[str, str]]) -> _Unnest | None:
        match = _INSERT.match(sql)
        if match is None:
            return None
        table, rest = match.group(1), match.group(4)
        columns = [c.strip() for c in match.group(2).split(",")]
        values = [v.strip() for v in match.group(3).split(",")]
        types = column_types(table)
        params = [c for c, v in zip(columns, values, strict=False) if v == "?"]
        if len(columns) != len(values) or "?" in rest or any(c not in types for c in params):
            return None
        conflict = _CONFLICT.search(rest)
        keys = tuple(params.index(k.strip()) for k in conflict.group(1).split(",")) if conflict else ()
        if conflict and any(k.strip() not in params for k in conflict.group(1).split(",")):
            return None
        names, select, n = [], [], 0
        for value in values:
            if value == "?":
                names.append(f"c{n}")
                select.append(f"u.c{n}")
                n += 1
            else:
                select.append(value)
        arrays = ", ".join(f"%s::{types[c]}[]" for c in params)
        texts = ", ".join(f"string_to_array(%s, chr(31), chr(30))::{types[c]}[]" for c in params)
        statement = (f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(select)} "
                     f"FROM unnest({{}}) AS u({', '.join(names)}) WHERE true{_pg_sql(rest)}")
        return cls(statement.format(arrays), n, keys, statement.format(texts), tuple(types[c] for c in params))

    def fits(self, rows: list[Any]) -> bool:
        if any(len(row) != self.width for row in rows):
            return False
        if not self.keys:
            return True
        return len({tuple(row[k] for k in self.keys) for row in rows}) == len(rows)

    def statement(self, rows: list[Any]) -> tuple[str, list[Any]]:
        """The statement and its parameters for these rows: a text a column where every
        column can be one, else psycopg's arrays."""
        columns = [list(column) for column in zip(*rows, strict=True)]
        texts = [_column_text(kind, column) for kind, column in zip(self.kinds, columns, strict=True)]
        if all(text is not None for text in texts):
            return self.text_sql, texts
        return self.sql, columns


class PgConnection:
    """One PostgreSQL connection (not thread-safe: one owner, as the SQLite one)."""

    def __init__(self, url: str, timeout_s: float, params: Mapping[str, Any] | None = None) -> None:
        self.target = url
        self.timeout_s = timeout_s
        self.params = dict(params or {})
        self.raw = _open(url, timeout_s, self.params)
        self._open_tx = False  # inside a BEGIN ... COMMIT/ROLLBACK of ours
        self._plans: dict[str, _Unnest | None] = {}  # executemany's SQL -> its one-statement form
        self._types: dict[str, dict[str, str]] = {}  # table -> column -> type (for the arrays)

    @property
    def in_transaction(self) -> bool:
        if self.raw.broken:  # the server ended the transaction with the connection
            return False
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        verb = sql.lstrip()[:8].upper()
        if self.raw.broken and self._lost(verb):
            return _NoRows()
        try:
            cur: Cursor = self.raw.execute(_pg_sql(sql), parameters)
        except psycopg.Error as exc:
            if not (verb.startswith("BEGIN") and self.raw.broken):
                raise translate(exc) from exc
            self._reopen()  # found dead at the start of a transaction: nothing was lost
            try:
                cur = self.raw.execute(_pg_sql(sql), parameters)
            except psycopg.Error as again:
                raise translate(again) from again
        if verb.startswith("BEGIN"):
            self._open_tx = True
        elif verb.startswith(("COMMIT", "ROLLBACK")):
            self._open_tx = False
        return cur

    def _lost(self, verb: str) -> bool:
        """The server dropped the connection: True for a ROLLBACK of the transaction that
        went with it (nothing to do); a statement of that transaction fails; any other
        opens a new connection first."""
        if self._open_tx:
            if verb.startswith(("ROLLBACK", "COMMIT")):
                self._open_tx = False
            if verb.startswith("ROLLBACK"):
                return True
            raise sqlite3.OperationalError("the connection to the database was lost; "
                                           "the transaction was not committed")
        self._reopen()
        return False

    def _reopen(self) -> None:
        self.raw.close()
        self.raw = _open(self.target, self.timeout_s, self.params)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        """Many rows: an INSERT of many rows is one statement over arrays (``_Unnest``),
        anything else a statement per row (psycopg's pipeline)."""
        if self.raw.broken:
            self._lost("")
        rows = parameters if isinstance(parameters, list) else list(parameters)
        cur = self.raw.cursor()
        try:
            plan = self._unnest(sql) if len(rows) > 1 else None
            if plan is not None and plan.fits(rows):
                cur.execute(*plan.statement(rows))
            else:
                cur.executemany(_pg_sql(sql), rows)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return cur

    def _unnest(self, sql: str) -> _Unnest | None:
        if sql not in self._plans:
            self._plans[sql] = _Unnest.of(sql, self._column_types)
        return self._plans[sql]

    def _column_types(self, table: str) -> dict[str, str]:
        if table not in self._types:
            self._types[table] = {str(name): str(kind) for name, kind in self.raw.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped", (table,))}
        return self._types[table]

    def close(self) -> None:
        self.raw.close()


def _open(url: str, timeout_s: float, extra: Mapping[str, Any]) -> psycopg.Connection[Any]:
    try:
        params: dict[str, Any] = dict(conninfo_to_dict(url))
    except psycopg.Error as exc:  # (libpq quotes the URL: never its password)
        why = " ".join(str(exc).replace(url, describe(url)).split())
        raise sqlite3.OperationalError(f"{describe(url)}: not a valid PostgreSQL URL ({why})") from exc
    for key, value in {"connect_timeout": max(2, round(timeout_s)), "application_name": "slurmgpu",
                       **extra}.items():
        params.setdefault(key, value)  # (the URL's own parameters win)
    try:
        raw = psycopg.connect(autocommit=True, **params)
    except psycopg.Error as exc:
        raise sqlite3.OperationalError(f"{describe(url)}: cannot connect ({one_line(exc)})") from exc
    raw.adapters.register_loader("numeric", _NumericLoader)
    try:
        raw.execute(f"SET lock_timeout = {max(1, int(timeout_s * 1000))}")
    except psycopg.Error as exc:
        raw.close()
        raise translate(exc) from exc
    return raw


def connect(url: str, timeout_s: float, params: Mapping[str, Any] | None = None) -> PgConnection:
    """Open ``url`` (``sqlite3.OperationalError`` naming it when that fails). Waits for a
    lock (the store's write lock, a table lock) at most ``timeout_s``, as SQLite's busy
    timeout does. ``params``: more libpq connection parameters (the URL's win)."""
    return PgConnection(url, timeout_s, params)
