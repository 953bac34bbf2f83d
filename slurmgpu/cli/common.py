"""What every `slurmgpu` command shares: its options (``--config``, ``--json``, ``--db``),
how it loads its settings, and how it says it failed.

Settings: ``load_settings`` (``slurmgpu.cli.loading``, re-exported here) is the one way
a command gets them, in the order of ``slurmgpu.config.env`` (defaults < the file <
``SLURMGPU_*`` < the command's flags).

Errors: a command raises, and only the root prints (``RootGroup.main`` in
``slurmgpu.cli``): ``CliError`` for a message and an exit code of its own (3 unless told
otherwise), a ``SlurmGpuError`` (bad config, key file, ...) or a click usage error. Each
becomes one line, ``slurmgpu: error: ...``, on stderr.

Light: click and ``slurmgpu.config.env`` (the root group imports this, and `slurmgpu
--help` must stay quick); the config loader is imported when settings are loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import click

from slurmgpu.cli.loading import Loaded, load_settings  # noqa: F401  (re-exported: every command loads this way)
from slurmgpu.config.env import CONFIG_ENV, DEFAULT_CONFIG_PATH, env_for
from slurmgpu.errors import error_line, first_line  # noqa: F401  (first_line: re-exported)

EXIT_UNKNOWN = 3
F = TypeVar("F", bound=Callable[..., Any])

CONFIG_HELP = f"Config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG_PATH})."
DB_ENV = env_for("collector.db") or ""


class CliError(click.ClickException):
    """A command's failure: one line on stderr (``slurmgpu: error: MESSAGE``) and
    ``exit_code`` (3, UNKNOWN, unless the command's help says otherwise). ``document``:
    what a ``--json`` run prints on stdout first (the error as an object)."""

    def __init__(self, message: str, exit_code: int = EXIT_UNKNOWN, *,
                 document: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares a ClassVar; it is read per instance
        self.document = document

    def show(self, file: IO[Any] | None = None) -> None:
        if self.document is not None:
            import json

            click.echo(json.dumps(self.document, indent=2))
        report(self.format_message())


def report(message: str) -> None:
    """The one error line (the root's; ``CliError.show``)."""
    click.echo(error_line(message), err=True)


def os_error(exc: OSError) -> CliError:
    """An OSError as one line: ``FILE: why``."""
    where = f"{exc.filename}: " if exc.filename else ""
    return CliError(f"{where}{exc.strerror or exc}")


# --------------------------------------------------------------------------- options


def config_option(f: F) -> F:
    """``--config FILE``: not checked here (a hook must read a bad path as a config error
    and fail open, not as a usage error)."""
    return click.option("--config", "config_file", metavar="FILE", default=None,
                        help=CONFIG_HELP)(f)


def json_option(help: str = "Print the result as JSON.") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def db_option(f: F) -> F:
    from slurmgpu.config.schema import CollectorSettings

    text = (f"SQLite database (default: [collector] db of the config, which ${DB_ENV} "
            f"overrides; built in: {CollectorSettings().db}).")
    return click.option("--db", default=None, metavar="FILE", help=text)(f)


# --------------------------------------------------------------------------- settings


# --------------------------------------------------------------------------- the fleet database


@dataclass(frozen=True)
class FleetDb:
    """The collector's database as a reading command finds it, and why there."""

    path: str
    source: str  # "--db", "$SLURMGPU_DB", "[collector] db in FILE", "the built-in default"

    def exists(self) -> bool:
        """A database file is there, or ``path`` is a PostgreSQL URL (whose server says,
        when the store opens it)."""
        from slurmgpu.collector.store.backend import is_postgres

        return is_postgres(self.path) or Path(self.path).is_file()

    def missing(self) -> str:
        return (f"no fleet database at {self.path} (from {self.source}); is the collector running, "
                f"and is this its database? (set --db, ${DB_ENV} or [collector] db)")


def fleet_db(loaded: Loaded, db: str | None, environ: Mapping[str, str] = os.environ) -> FleetDb:
    """Where the database is (``--db`` > ``$SLURMGPU_DB`` > ``[collector] db`` > built in);
    every command that reads it (`fleet`, `report`, `report-nightly`, `jobs events`,
    `breaker`, `lemon`) finds it this way."""
    if db:
        return FleetDb(db, "--db")
    path = loaded.settings.collector.db
    if environ.get(DB_ENV):
        return FleetDb(path, f"${DB_ENV}")
    if loaded.config.path is not None:
        return FleetDb(path, f"[collector] db in {loaded.config.path}")
    return FleetDb(path, "the built-in default")


def existing_db(loaded: Loaded, db: str | None) -> FleetDb:
    """The database, or a CliError naming it (and where its path came from) when absent."""
    found = fleet_db(loaded, db)
    if not found.exists():
        raise CliError(found.missing())
    return found
