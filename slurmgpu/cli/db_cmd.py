"""`slurmgpu db`: the fleet database itself. `db copy` carries a SQLite database's history
into PostgreSQL (``slurmgpu.collector.store.copy`` does the work; docs/postgresql.md,
"Moving from SQLite")."""

from __future__ import annotations

import json

import click

from slurmgpu.cli.common import EXIT_UNKNOWN, CliError, json_option

# `slurmgpu db copy` exit statuses (besides 0: copied and verified).
EXIT_NOT_EMPTY = 4
_COPY_EPILOG = """
    \b
    Stop the collector first; then point [collector] db at the URL and start it.
    \b
    Exit status:
      0  copied; every table's row count is the same on both sides
      3  bad input, the source in use or at another schema version, the server
         unreachable, or the copy failed (nothing was written)
      4  the destination already holds rows (nothing was written; see --replace)
    """


@click.group("db")
def db() -> None:
    """The fleet database: copy a SQLite one into PostgreSQL."""


@db.command("copy", epilog=_COPY_EPILOG)
@click.option("--from", "source", required=True, metavar="FILE",
              help="The SQLite database to copy (the collector's [collector] db file); only read (but see --migrate-source).")
@click.option("--to", "destination", required=True, metavar="URL",
              help="The PostgreSQL database (postgresql://...): new and empty, or see --replace.")
@click.option("--replace", is_flag=True,
              help="Empty a destination that already holds rows first (in the copy's transaction).")
@click.option("--migrate-source", is_flag=True,
              help="Migrate an older source file to this slurmgpu's schema first (as the "
                   "collector would at its next start).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              metavar="SECONDS", help="Wait at most this long for a connection or a lock.")
@json_option("Print the row counts per table as JSON (progress goes to stderr).")
def copy(source: str, destination: str, replace: bool, migrate_source: bool, timeout_s: float,
         as_json: bool) -> None:
    """Copy a SQLite fleet database into PostgreSQL, every table, in one transaction."""
    from slurmgpu.collector.store.copy import (
        CopyError,
        DestinationNotEmpty,
        TableCopy,
        copy_to_postgres,
    )

    width = 26

    def progress(t: TableCopy) -> None:
        click.echo(f"{t.table:<{width}} {t.destination:>12,} rows  {t.seconds:7.2f} s", err=as_json)

    try:
        result = copy_to_postgres(source, destination, replace=replace, migrate_source=migrate_source,
                                  progress=progress, timeout_s=timeout_s)
    except DestinationNotEmpty as exc:
        raise CliError(str(exc), EXIT_NOT_EMPTY) from None
    except CopyError as exc:
        raise CliError(str(exc), EXIT_UNKNOWN) from None
    if as_json:
        click.echo(json.dumps(result.document(), indent=2))
        return
    click.echo(f"copied {result.rows:,} rows in {len(result.tables)} tables from {result.source} to "
               f"{result.destination} in {result.seconds:.1f} s (schema version {result.schema_version}); "
               "row counts equal on both sides")
