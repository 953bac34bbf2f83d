"""Copying a SQLite fleet database into PostgreSQL (`slurmgpu db copy`), every table the
source lists, column by column by name, with ``COPY ... FROM STDIN``.

Design notes: docs/design-notes.md (``slurmgpu/collector/store/copy.py``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from slurmgpu.collector.store.backend import (
    POSTGRES,
    SQLITE,
    Connection,
    StoreError,
    describe,
    is_postgres,
    one_line,
)
from slurmgpu.collector.store.queries import snapshot
from slurmgpu.collector.store.schema import SCHEMA_VERSION, connect, schema_version, seeded_tables

# The rows fetched from the source at a time (each batch then streams into the COPY).
BATCH_ROWS = 10_000
# Written by each side's own migrations, never copied.
_OWN = frozenset({"schema_version"})


class CopyError(StoreError):
    """The copy was refused or failed; nothing was written to the destination."""


class DestinationNotEmpty(CopyError):
    """The destination already holds rows (``replace`` empties it first)."""


@dataclass(frozen=True)
class TableCopy:
    """One table: the rows in the source, and in the destination after the copy."""

    table: str
    source: int
    destination: int
    seconds: float


@dataclass
class CopyResult:
    source: str
    destination: str  # (without its password)
    schema_version: int
    replaced: bool  # the destination held rows, emptied first (``replace``)
    tables: list[TableCopy] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(t.destination for t in self.tables)

    def document(self) -> dict[str, Any]:
        """The result as ``--json`` prints it."""
        return {"source": self.source, "destination": self.destination,
                "schema_version": self.schema_version, "replaced": self.replaced,
                "tables": {t.table: {"source": t.source, "destination": t.destination,
                                     "seconds": round(t.seconds, 3)} for t in self.tables},
                "rows": self.rows, "seconds": round(self.seconds, 3)}


Progress = Callable[[TableCopy], None]


def copy_to_postgres(source: str | Path, destination: str, *, replace: bool = False,
                     migrate_source: bool = False, progress: Progress | None = None,
                     timeout_s: float = 10.0) -> CopyResult:
    """Copy the SQLite database at ``source`` into the PostgreSQL database at
    ``destination`` (see the module docstring). Raises CopyError (DestinationNotEmpty)
    or StoreError, one line each, with the destination unchanged."""
    began = time.monotonic()
    src = check_source(source, destination, migrate_source=migrate_source, timeout_s=timeout_s)
    try:
        dst = connect(destination, timeout_s)
    except sqlite3.Error as exc:
        raise CopyError(f"{describe(destination)}: {one_line(exc)}") from None
    result = CopyResult(str(src), describe(destination), SCHEMA_VERSION, replaced=False)
    try:
        with snapshot(src, timeout_s) as reader:
            _copy_all(reader, dst, replace, result, progress)
    except sqlite3.Error as exc:
        raise CopyError(f"copy failed, nothing was written to {describe(destination)}: "
                        f"{one_line(exc)}") from None
    finally:
        dst.close()
    result.seconds = time.monotonic() - began
    return result


# ---------------------------------------------------------------------- the source


def check_source(source: str | Path, destination: str, *, migrate_source: bool,
                 timeout_s: float) -> Path:
    """The source as a copy needs it (a SQLite file, not in use, at this schema version)
    and the destination a PostgreSQL URL; else CopyError."""
    if is_postgres(source):
        raise CopyError(f"{describe(source)}: the source must be a SQLite file (the copy goes "
                        "from SQLite to PostgreSQL)")
    if not is_postgres(destination):
        raise CopyError(f"{destination}: the destination must be a postgresql:// URL")
    path = Path(source)
    if not path.is_file():
        raise CopyError(f"{path}: no such file")
    _refuse_in_use(path)
    version = _source_version(path, timeout_s)
    if version < SCHEMA_VERSION and migrate_source:
        connect(path, timeout_s).close()  # the collector's own migration, then a clean close
        version = _source_version(path, timeout_s)
    if version > SCHEMA_VERSION:
        raise CopyError(f"{path}: schema version {version} is newer than this slurmgpu "
                        f"understands ({SCHEMA_VERSION}); copy it with the slurmgpu that wrote it")
    if version < SCHEMA_VERSION:
        raise CopyError(f"{path}: schema version {version}, this slurmgpu's is {SCHEMA_VERSION}; "
                        "pass --migrate-source to migrate the file first (as the collector "
                        "would at its next start)")
    return path


def _refuse_in_use(path: Path) -> None:
    """A collector running on the file (or one that crashed) leaves a non-empty WAL."""
    wal = Path(f"{path}-wal")
    try:
        size = wal.stat().st_size
    except FileNotFoundError:
        return
    if size:
        raise CopyError(f"{path}: in use ({wal.name} holds {size} bytes not yet folded into the "
                        "file): stop the collector first; after a crash, 'slurmgpu fleet --db "
                        f"{path}' once folds it in")


def _source_version(path: Path, timeout_s: float) -> int:
    try:
        with snapshot(path, timeout_s) as db:
            if "schema_version" not in SQLITE.tables(db):
                raise CopyError(f"{path}: not a slurmgpu fleet database (no schema_version table)")
            return schema_version(db)
    except sqlite3.Error as exc:
        raise CopyError(f"{path}: not a usable SQLite database ({one_line(exc)})") from None


# ---------------------------------------------------------------------- the copy


def _copy_all(src: Connection, dst: Any, replace: bool, result: CopyResult,
              progress: Progress | None) -> None:
    """Every table of ``src`` into ``dst`` (a ``PgConnection``), in one transaction."""
    tables = sorted(SQLITE.tables(src) - _OWN)
    columns = {t: _matching_columns(src, dst, t) for t in tables}
    POSTGRES.begin_write(dst)
    try:
        result.replaced = _make_room(dst, replace, sorted(POSTGRES.tables(dst) - _OWN))
        for table in tables:
            copied = _copy_table(src, dst, table, columns[table])
            result.tables.append(copied)
            if progress is not None:
                progress(copied)
        _advance_identities(dst)
        dst.execute(f"ANALYZE {', '.join(_quote(t) for t in tables)}")  # (the planner's statistics)
        dst.execute("COMMIT")
    except BaseException:
        dst.execute("ROLLBACK")
        raise


def _copy_table(src: Connection, dst: Any, table: str, columns: dict[str, str]) -> TableCopy:
    """One table, its secondary indexes built after its rows (several times faster than
    row by row), its count checked."""
    began = time.monotonic()
    expected = _count(src, table)
    indexes = _secondary_indexes(dst, table)
    for name in indexes:
        dst.execute(f"DROP INDEX {_quote(name)}")
    written = _stream(src, dst, table, columns)
    for statement in indexes.values():
        dst.execute(statement)
    copied = TableCopy(table, expected, _count(dst, table), time.monotonic() - began)
    if not expected == written == copied.destination:
        raise CopyError(f"{table}: {expected} rows in the source, {written} read, "
                        f"{copied.destination} in the destination; nothing was written")
    return copied


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _matching_columns(src: Connection, dst: Connection, table: str) -> dict[str, str]:
    """The source table's columns (in its order) with their type in the destination,
    whose table must have the same set."""
    mine = [str(row[1]) for row in src.execute(f"PRAGMA table_info({_quote(table)})")]
    theirs = {str(name): str(kind) for name, kind in dst.execute(
        "SELECT column_name, udt_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ?", (table,))}
    if not theirs:
        raise CopyError(f"{table}: no such table in the destination (its schema is not the source's)")
    if set(mine) != set(theirs):
        raise CopyError(f"{table}: columns differ (source: {', '.join(sorted(mine))}; destination: "
                        f"{', '.join(sorted(theirs))})")
    return {name: theirs[name] for name in mine}


def _secondary_indexes(dst: Connection, table: str) -> dict[str, str]:
    """The table's indexes that back no constraint (primary key, unique): name -> DDL."""
    return {str(name): str(ddl) for name, ddl in dst.execute(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index x "
        "JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
        "WHERE t.relname = ? AND t.relnamespace = current_schema()::regnamespace "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)", (table,))}


def _make_room(dst: Connection, replace: bool, tables: list[str]) -> bool:
    """Refuse a destination with rows (DestinationNotEmpty), or empty it (``replace``:
    True when it held rows)."""
    seeded = [t for t in tables if t in seeded_tables()]  # (their rows come from the source)
    if seeded:
        dst.execute(f"TRUNCATE {', '.join(_quote(t) for t in seeded)}")
    occupied = [t for t in tables if dst.execute(f"SELECT EXISTS (SELECT 1 FROM {_quote(t)})").fetchone()[0]]
    if not occupied:
        return False
    if not replace:
        raise DestinationNotEmpty(
            f"the destination already holds rows (in {', '.join(occupied)}); copy into a new, "
            "empty database, or pass --replace to empty it first (its rows are then lost)")
    dst.execute(f"TRUNCATE {', '.join(_quote(t) for t in tables)}")
    return True


def _count(db: Connection, table: str) -> int:
    return int(db.execute(f"SELECT count(*) FROM {_quote(table)}").fetchone()[0])


def _rows(src: Connection, table: str, columns: list[str]) -> Iterator[tuple[Any, ...]]:
    cur = cast(sqlite3.Cursor, src.execute(f"SELECT {', '.join(_quote(c) for c in columns)} "
                                           f"FROM {_quote(table)}"))
    while batch := cur.fetchmany(BATCH_ROWS):
        yield from batch


def _stream(src: Connection, dst: Any, table: str, columns: dict[str, str]) -> int:
    """The rows, in PostgreSQL's binary COPY format (each value dumped as its column's
    type); returns how many. psycopg's errors come out as sqlite3's."""
    import psycopg

    from slurmgpu.collector.store.postgres import translate

    names = ", ".join(_quote(c) for c in columns)
    written = 0
    row: tuple[Any, ...] = ()
    try:
        with dst.raw.cursor() as cur, \
                cur.copy(f"COPY {_quote(table)} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(columns.values()))
            for row in _rows(src, table, list(columns)):
                copy.write_row(row)
                written += 1
    except psycopg.Error as exc:
        raise translate(exc) from exc
    except (TypeError, ValueError, OverflowError) as exc:  # (a value that the column's type cannot hold)
        raise sqlite3.DataError(f"{table}: a value its columns ({', '.join(f'{c} {t}' for c, t in columns.items())}) "
                                f"cannot hold, in {_shown(row)} ({exc})") from exc
    return written


def _shown(row: tuple[Any, ...]) -> str:
    text = repr(row)
    return text if len(text) <= 200 else text[:197] + "..."


def _advance_identities(dst: Connection) -> None:
    """Every identity column's sequence past the largest value now in its table."""
    identities = dst.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND is_identity = 'YES'").fetchall()
    for table, column in identities:
        dst.execute(f"SELECT setval(pg_get_serial_sequence(?, ?), coalesce(max({_quote(column)}), 0) + 1, "
                    f"false) FROM {_quote(table)}", (_quote(table), column))
