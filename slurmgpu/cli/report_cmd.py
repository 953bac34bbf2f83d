"""`slurmgpu report`: the fleet health report (HTML, Markdown or JSON) from the
collector's database (see docs/report.md). The report modules load inside the command."""

from __future__ import annotations

import time

import click

from slurmgpu.cli.common import CliError, config_option, db_option, existing_db, load_settings
from slurmgpu.fileutil import write_text_atomic


@click.command("report")
@click.option("--since", default=None, metavar="DURATION",
              help="Window length ending at --to (or now): 90m, 24h, 7d. [default: 24h]")
@click.option("--from", "start", default=None, metavar="ISO",
              help="Window start (ISO 8601; no zone = UTC). Excludes --since.")
@click.option("--to", "end", default=None, metavar="ISO", help="Window end (default: now).")
@click.option("--format", "fmt", default="html", show_default=True, metavar="html|md|json",
              help="Output format.")
@click.option("--out", default=None, metavar="FILE",
              help="Write to FILE (atomically) instead of stdout.")
@config_option
@db_option
@click.option("--now", default=None, metavar="ISO",
              help="Pretend it is this time (reproducible reports).")
def report(since: str | None, start: str | None, end: str | None, fmt: str, out: str | None,
           config_file: str | None, db: str | None, now: str | None) -> None:
    """Fleet health over a window: availability, drains, failures, XIDs, ECC trends,
    throttling, IB ports, version pin drift, nodes due for service, jobs, MTBF.

    Exit 0 with the report; 3 (one line on stderr, nothing written) on a bad argument,
    a bad config or a missing or too old database."""
    from slurmgpu.report import FORMATS
    from slurmgpu.report.model import parse_time, report_from_path, resolve_window

    if fmt not in FORMATS:
        raise CliError(f"bad --format {fmt!r} (want one of: {', '.join(FORMATS)})")
    clock = parse_time(now, "--now") if now is not None else time.time()
    t0, t1 = resolve_window(since, start, end, clock)
    loaded = load_settings(config_file)
    found = existing_db(loaded, db)
    model = report_from_path(found.path, t0, t1, config=loaded.config, generated_at=clock)
    if fmt == "json":
        import json

        text = json.dumps(model, indent=2, ensure_ascii=False) + "\n"
    elif fmt == "md":
        from slurmgpu.report import markdown

        text = markdown.render(model)
    else:
        from slurmgpu.report import html

        text = html.render(model)
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        write_text_atomic(out, text)
    except OSError as exc:
        raise CliError(f"{out}: {exc.strerror or exc}") from None
