"""The PostgreSQL backend: a psycopg 3 connection that speaks the subset of the sqlite3 API
the store uses (``slurmgpu.collector.store.backend.Connection``).

* Autocommit, as the SQLite connection (``isolation_level=None``): a transaction is what
  the store opens with ``BEGIN`` (``Dialect.begin_write``) and closes itself.
* The store's SQL uses ``?`` placeholders; psycopg's are ``%s`` (and a literal ``%`` is
  ``%%``): ``_pg_sql`` translates, once per statement text.
* Errors come out as the sqlite3 module's DB-API classes (a unique violation as
  ``sqlite3.IntegrityError``, a lost server as ``sqlite3.OperationalError``...), each
  with its psycopg error as ``__cause__``: the collector, the CLI and the metrics catch
  one family whichever backend runs.
* ``sum()`` of a BIGINT column is a NUMERIC in PostgreSQL: it is read as an int (a float
  when it has a fraction), as SQLite returns it, never as a ``Decimal``.
* A connection the server dropped (a restart, a failover, an idle-session kill) is
  opened again at the next ``BEGIN`` or statement outside a transaction, never in the
  middle of one: a statement of a transaction that died with its connection fails (the
  caller rolls back, which is then a no-op) and nothing of it is half-written.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Buffer, Loader
from psycopg.conninfo import conninfo_to_dict

from slurmgpu.collector.store.backend import Cursor, describe

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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def translate(exc: psycopg.Error) -> sqlite3.Error:
    """The sqlite3 exception of the same DB-API class as ``exc``."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    name = next(n for n in _DBAPI if n in names)
    twin: sqlite3.Error = getattr(sqlite3, name)(_one_line(exc))
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


class PgConnection:
    """One PostgreSQL connection (not thread-safe: one owner, as the SQLite one)."""

    def __init__(self, url: str, timeout_s: float, params: Mapping[str, Any] | None = None) -> None:
        self.target = url
        self.timeout_s = timeout_s
        self.params = dict(params or {})
        self.raw = _open(url, timeout_s, self.params)
        self._open_tx = False  # inside a BEGIN ... COMMIT/ROLLBACK of ours

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
        if self.raw.broken:
            self._lost("")
        cur = self.raw.cursor()
        try:
            cur.executemany(_pg_sql(sql), parameters)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return cur

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
        raise sqlite3.OperationalError(f"{describe(url)}: cannot connect ({_one_line(exc)})") from exc
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
