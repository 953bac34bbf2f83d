"""`slurmgpu validations`: the validation history from the collector's database, one row
per run (a node's return to service, an idle-time or a manual validation);
`slurmgpu validations idle`: one pass of idle-time validation (its timer's command)."""

from __future__ import annotations

import json
import time
from typing import Any

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


@click.group("validations", invoke_without_command=True)
@click.option("--node", default=None, metavar="NODE", help="Only this node's runs.")
@config_option
@db_option
@json_option("JSON output: a list of runs.")
@click.pass_context
def validations(ctx: click.Context, node: str | None, config_file: str | None, db: str | None,
                as_json: bool) -> None:
    """The validation history from the collector's database: one row per run (return to
    service, idle-time, manual).

    Oldest first: node, trigger (return, idle, manual), tier, verdict, started,
    duration_s, reservation, outcome (docs/remediation.md)."""
    if ctx.invoked_subcommand is not None:
        return
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


@validations.command("idle")
@config_option
@db_option
@click.option("--limit", type=click.IntRange(0, 100_000), default=8, show_default=True,
              help="Submit at most this many validations in this pass.")
@click.option("--program", default="slurmgpu", show_default=True, metavar="CMD",
              help="The command that runs slurmgpu on the nodes (split like a shell line).")
@json_option("JSON output: what the pass collected, submitted and skipped.")
def idle(config_file: str | None, db: str | None, limit: int, program: str, as_json: bool) -> int:
    """One pass of idle-time validation ([validate] every_days): record the ended idle
    runs, then submit `slurmgpu validate --send` on idle nodes that are due, as a
    preemptible job ([validate] idle_qos / idle_partition). Run by
    slurmgpu-idle-validate.timer on one head node.

    Exit code: 0, or 1 when a Slurm call failed (each failure is one line on stderr)."""
    import shlex

    from slurmgpu.collector.idlevalidation import IdleJob, run_pass
    from slurmgpu.collector.store import Store
    from slurmgpu.slurm.factory import make_client

    loaded = load_settings(config_file)
    settings = loaded.settings.validate
    if settings.every_days > 0 and not (settings.idle_qos or settings.idle_partition):
        raise CliError("[validate] every_days is set but neither idle_qos nor idle_partition: "
                       "idle validations need a preemptible QOS or partition (docs/admin-guide.md)")
    job = IdleJob(settings.idle_qos, settings.idle_partition, tuple(shlex.split(program)))
    store = Store(existing_db(loaded, db).path)
    try:
        done = run_pass(store, make_client(loaded.settings.slurm), settings, time.time(), job=job, limit=limit)
    finally:
        store.close()
    _print_pass(done, as_json, settings.every_days)
    return 1 if done.errors else 0


def _print_pass(done: Any, as_json: bool, every_days: float) -> None:
    for line in done.errors:
        click.echo(f"slurmgpu: warning: idle validation: {line}", err=True)
    if as_json:
        click.echo(json.dumps({"collected": [r.to_json() for r in done.collected],
                               "submitted": [r.to_json() for r in done.submitted],
                               "skipped": done.skipped, "errors": done.errors,
                               "other_pass": done.other_pass}, indent=2))
        return
    if done.other_pass:
        click.echo("another head's idle validation pass is running: nothing done")
    elif every_days <= 0:
        click.echo("idle-time validation is off ([validate] every_days = 0)")
    for row in done.collected:
        click.echo(f"{row.node}: job {row.job_id} ended: {row.verdict} ({row.outcome})")
    for row in done.submitted:
        click.echo(f"{row.node}: submitted job {row.job_id} (tier {row.tier})")
