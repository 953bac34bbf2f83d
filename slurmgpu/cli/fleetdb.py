"""Where the fleet database is, resolved the same way by every command that reads it
(`fleet`, `report`, `report-nightly`, `jobs events`, `breaker`, `lemon`): ``--db`` > ``$SLURMGPU_DB`` >
``[collector] db`` of the config (``--config`` > ``$SLURMGPU_CONFIG`` >
/etc/slurmgpu/slurmgpu.toml) > the built-in default. Errors name the path tried and where
it came from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from slurmgpu.config.schema import CollectorSettings

ENV_DB = "SLURMGPU_DB"
DEFAULT_DB = CollectorSettings().db
DB_HELP = (f"SQLite database (default: ${ENV_DB}, else [collector] db of the config, "
           f"else {DEFAULT_DB}).")


@dataclass(frozen=True)
class FleetDb:
    path: str
    source: str  # "--db", "$SLURMGPU_DB", "[collector] db in FILE", "the built-in default"

    def missing(self) -> str:
        return (f"no fleet database at {self.path} (from {self.source}); is the collector running, "
                f"and is this its database? (set --db, ${ENV_DB} or [collector] db)")


def resolve_db(db: str | None, config_path: str | None, config_db: str,
               environ: Mapping[str, str] = os.environ) -> FleetDb:
    """``config_path``/``config_db``: the loaded config's file (None: built-in defaults)
    and its ``[collector] db``."""
    if db:
        return FleetDb(db, "--db")
    if environ.get(ENV_DB):
        return FleetDb(environ[ENV_DB], f"${ENV_DB}")
    if config_path is not None:
        return FleetDb(config_db, f"[collector] db in {config_path}")
    return FleetDb(config_db, "the built-in default")


def existing_db(db: str | None, config_path: str | None, config_db: str) -> FleetDb:
    """The resolved database, or a one-line ClickException naming it when it is absent."""
    found = resolve_db(db, config_path, config_db)
    if not Path(found.path).is_file():
        raise click.ClickException(found.missing())
    return found


db_option = click.option("--db", default=None, metavar="FILE", help=DB_HELP)
