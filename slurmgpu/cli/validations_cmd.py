"""`slurmgpu validations`: the validation history from the collector's database, one row
per run (a node's return to service, an idle-time or a manual validation)."""

from __future__ import annotations

import json
import time

import click

from slurmgpu.cli.common import (
    CliError,
    config_option,
    db_option,
    existing_db,
    json_option,
    load_settings,
)

#: The schema that has the ``validations`` table.
SCHEMA_WITH_VALIDATIONS = 14
HEADERS = ("NODE", "TRIGGER", "TIER", "VERDICT", "STARTED", "DURATION_S", "RESERVATION", "OUTCOME")
COLUMNS = ("node", "trigger", "tier", "verdict", "started", "duration_s", "reservation", "outcome")


@click.command("validations")
@click.option("--node", default=None, metavar="NODE", help="Only this node's runs.")
@config_option
@db_option
@json_option("JSON output: a list of runs.")
def validations(node: str | None, config_file: str | None, db: str | None, as_json: bool) -> None:
    """The validation history from the collector's database: one row per run (return to
    service, idle-time, manual).

    Oldest first: node, trigger (return, idle, manual), tier, verdict, started,
    duration_s, reservation, outcome (docs/remediation.md)."""
    from slurmgpu.collector.store.queries import snapshot
    from slurmgpu.collector.store.remediation import validations as stored
    from slurmgpu.collector.store.schema import schema_version

    found = existing_db(load_settings(config_file), db)
    with snapshot(found.path) as conn:
        version = schema_version(conn)
        if version < SCHEMA_WITH_VALIDATIONS:
            raise CliError(f"{found.path}: schema version {version} has no validation history "
                           f"(needs {SCHEMA_WITH_VALIDATIONS}); start this slurmgpu's collector once to migrate it")
        rows = [r.to_json() for r in stored(conn, node)]
    if as_json:
        click.echo(json.dumps([{k: r[k] for k in COLUMNS} for r in rows], indent=2))
        return
    if not rows:
        click.echo("no validation runs recorded" + (f" for {node}" if node else ""))
        return
    table = [HEADERS, *([_cell(k, r[k]) for k in COLUMNS] for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    for line in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def _cell(key: str, value: object) -> str:
    if value is None:
        return "-"
    if key == "started":
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(str(value))))
    if key == "duration_s":
        return f"{float(str(value)):.0f}"
    return str(value)
