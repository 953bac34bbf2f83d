"""`slurmgpu report-nightly`: the daily fleet report (daemon/slurmgpu-report.timer).

Writes ``<[report] dir>/YYYY-MM-DD.html`` and ``.json`` for one calendar day (local
time, default yesterday: the 24 h before the last midnight), deletes reports older
than ``[report] keep_days``, and mails the Markdown report with the HTML attached to
``[report] mail_to`` (through ``smtp_host``, or ``sendmail -t`` when that is empty).
The work is ``slurmgpu.report.nightly``; this module settles its inputs.

Exit 0 when the reports are written (and mailed, if configured); 3 with one line on
stderr otherwise (a bad argument or config, an unreadable database, an unwritable
directory, a mail failure: the files are written before the mail is tried).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import date as Date
from typing import TYPE_CHECKING, Any

import click

from slurmgpu.cli.common import (
    CliError,
    config_option,
    db_option,
    existing_db,
    json_option,
    load_settings,
    os_error,
)

if TYPE_CHECKING:
    from slurmgpu.config.schema import ReportSettings


def run_nightly(config_file: str | None = None, *, day: Date | None = None, mail: bool = True,
                db: str | None = None, out_dir: str | None = None, now: float | None = None,
                mail_to: list[str] | None = None, report: ReportSettings | None = None) -> dict[str, Any]:
    """One day's report from the config, the database and the ``[report]`` settings as
    the command line leaves them: ``report`` replaces the config's ``[report]``,
    ``mail_to`` just its recipients. Raises SlurmGpuError, CliError or OSError."""
    from slurmgpu.report.mail import report_settings
    from slurmgpu.report.nightly import write_day

    loaded = load_settings(config_file)
    rs = report if report is not None else report_settings(loaded.settings)
    if mail_to:
        rs = dataclasses.replace(rs, mail_to=list(mail_to))
    found = existing_db(loaded, db)
    return write_day(loaded.config, found.path, rs, day=day, mail=mail, out_dir=out_dir, now=now)


@click.command("report-nightly")
@config_option
@click.option("--date", "day", default=None, metavar="YYYY-MM-DD",
              help="The (local) day to report on. [default: yesterday]")
@click.option("--no-mail", is_flag=True, help="Write the reports, send no mail.")
@click.option("--mail-to", multiple=True, metavar="ADDR",
              help="Mail to ADDR instead of [report] mail_to (repeatable).")
@db_option
@click.option("--dir", "out_dir", default=None, help="Report directory (default: [report] dir).")
@json_option("Print what was done as JSON.")
def report_nightly(config_file: str | None, day: str | None, no_mail: bool, mail_to: tuple[str, ...],
                   db: str | None, out_dir: str | None, as_json: bool) -> None:
    """Write the daily fleet report (HTML + JSON) for one day, prune old ones, mail it.

    Run by daemon/slurmgpu-report.timer at 06:00. Exit 0 when done; 3 with one line on
    stderr on a bad argument, config or database, or when the mail fails (the files are
    written first)."""
    try:
        parsed = Date.fromisoformat(day) if day is not None else None
    except ValueError:
        raise CliError(f"bad --date {day!r} (want YYYY-MM-DD)") from None
    try:
        result = run_nightly(config_file, day=parsed, mail=not no_mail, db=db, out_dir=out_dir,
                             mail_to=list(mail_to))
    except OSError as exc:
        raise os_error(exc) from None
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for path in result["written"]:
        click.echo(f"wrote {path}")
    if result["pruned"]:
        click.echo(f"pruned {len(result['pruned'])} old report file(s)")
    if result["mailed"]:
        click.echo(f"mailed to {', '.join(result['mail_to'])} ({result['mailed']})")
