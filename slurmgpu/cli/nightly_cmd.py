"""`slurmgpu report-nightly`: the daily fleet report (daemon/slurmgpu-report.timer).

Writes ``<[report] dir>/YYYY-MM-DD.html`` and ``.json`` for one calendar day (local
time, default yesterday: the 24 h before the last midnight), deletes reports older
than ``[report] keep_days``, and mails the Markdown report with the HTML attached to
``[report] mail_to`` (through ``smtp_host``, or ``sendmail -t`` when that is empty).

The report engine (``slurmgpu.report``) runs in this process. Exit 0 when the reports
are written (and mailed, if configured); 3 with one line on stderr otherwise (a bad
argument or config, an unreadable database, an unwritable directory, a mail failure:
the files are written before the mail is tried).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import date as Date
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurmgpu.cli.fleetdb import db_option, resolve_db
from slurmgpu.fileutil import write_text_atomic

if TYPE_CHECKING:
    from slurmgpu.config.schema import ReportSettings

REPORT_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})\.(html|json|md)$")


def day_window(day: Date) -> tuple[float, float]:
    """The local calendar day ``day`` as (start, end] Unix seconds (23 or 25 h across DST)."""
    start = datetime(day.year, day.month, day.day).astimezone()
    nxt = day + timedelta(days=1)
    end = datetime(nxt.year, nxt.month, nxt.day).astimezone()
    return start.timestamp(), end.timestamp()


def prune(directory: Path, keep_days: int, today: Date) -> list[str]:
    """Delete YYYY-MM-DD.{html,json,md} reports dated more than ``keep_days`` before
    ``today`` (0: keep all); other files are left alone. Returns the names deleted."""
    if keep_days <= 0:
        return []
    cutoff = today - timedelta(days=keep_days)
    removed = []
    for path in sorted(directory.iterdir()):
        match = REPORT_NAME.match(path.name)
        if not match or not path.is_file():
            continue
        try:
            dated = Date.fromisoformat(match.group(1))
        except ValueError:
            continue
        if dated < cutoff:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def run_nightly(config_file: str | None = None, *, day: Date | None = None, mail: bool = True,
                db: str | None = None, out_dir: str | None = None, now: float | None = None,
                mail_to: list[str] | None = None, report: ReportSettings | None = None) -> dict[str, Any]:
    """Build, write, prune and mail one day's report; returns what was done. ``report``
    replaces the config's ``[report]`` settings, ``mail_to`` just their recipients.
    Raises SlurmGpuError (bad config/database, mail failure) or OSError."""
    from slurmgpu.config.load import load_config
    from slurmgpu.report import html, markdown
    from slurmgpu.report.mail import build_message, report_settings, send, subject_for
    from slurmgpu.report.model import report_from_path

    clock = time.time() if now is None else now
    if day is None:
        day = datetime.fromtimestamp(clock).date() - timedelta(days=1)
    t0, t1 = day_window(day)
    config = load_config(config_file)
    settings = config.settings_for(None)
    rs = report if report is not None else report_settings(settings)
    if mail_to:
        rs = dataclasses.replace(rs, mail_to=list(mail_to))
    found = resolve_db(db, config.path, settings.collector.db)
    if not Path(found.path).is_file():
        from slurmgpu.errors import SlurmGpuError

        raise SlurmGpuError(found.missing())
    model = report_from_path(found.path, t0, t1, config=config, generated_at=clock)

    directory = Path(out_dir or rs.dir)
    directory.mkdir(parents=True, exist_ok=True)
    stem = day.isoformat()
    html_text = html.render(model)
    written = []
    for suffix, text in (("html", html_text),
                         ("json", json.dumps(model, indent=2, ensure_ascii=False) + "\n")):
        target = directory / f"{stem}.{suffix}"
        write_text_atomic(target, text)
        written.append(str(target))
    # Today's date in the pruning: a catch-up run for an old --date prunes nothing extra.
    removed = prune(directory, int(rs.keep_days), max(day, datetime.fromtimestamp(clock).date()))
    result: dict[str, Any] = {"date": stem, "window": model.get("window"), "written": written,
                              "pruned": removed, "mailed": None, "mail_to": list(rs.mail_to)}
    if mail and rs.mail_to:
        msg = build_message(subject=subject_for(rs.subject, stem, model.get("summary") or {}),
                            mail_from=rs.mail_from, mail_to=rs.mail_to, text=markdown.render(model),
                            html=html_text, html_name=f"slurmgpu-report-{stem}.html")
        result["mailed"] = send(msg, smtp_host=rs.smtp_host, smtp_port=int(rs.smtp_port),
                                sendmail=rs.sendmail)
    return result


@click.command("report-nightly")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: $SLURMGPU_CONFIG or /etc/slurmgpu/slurmgpu.toml).")
@click.option("--date", "day", default=None, metavar="YYYY-MM-DD",
              help="The (local) day to report on. [default: yesterday]")
@click.option("--no-mail", is_flag=True, help="Write the reports, send no mail.")
@click.option("--mail-to", multiple=True, metavar="ADDR",
              help="Mail to ADDR instead of [report] mail_to (repeatable).")
@db_option
@click.option("--dir", "out_dir", default=None, help="Report directory (default: [report] dir).")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def report_nightly(config_file: str | None, day: str | None, no_mail: bool, mail_to: tuple[str, ...],
                   db: str | None, out_dir: str | None, as_json: bool) -> None:
    """Write the daily fleet report (HTML + JSON) for one day, prune old ones, mail it.

    Run by daemon/slurmgpu-report.timer at 06:00. Exit 0 when done; 3 with one line on
    stderr on a bad argument, config or database, or when the mail fails (the files are
    written first)."""
    from slurmgpu.cli import fail
    from slurmgpu.errors import SlurmGpuError

    parsed: Date | None = None
    if day is not None:
        try:
            parsed = Date.fromisoformat(day)
        except ValueError:
            fail(f"bad --date {day!r} (want YYYY-MM-DD)")
            return
    try:
        result = run_nightly(config_file, day=parsed, mail=not no_mail, db=db, out_dir=out_dir,
                             mail_to=list(mail_to))
    except SlurmGpuError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}")
        return
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for path in result["written"]:
        click.echo(f"wrote {path}")
    if result["pruned"]:
        click.echo(f"pruned {len(result['pruned'])} old report file(s)")
    if result["mailed"]:
        click.echo(f"mailed to {', '.join(result['mail_to'])} ({result['mailed']})")
