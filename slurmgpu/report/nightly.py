"""The daily fleet report: one calendar day's report written as HTML and JSON, old ones
pruned, the Markdown mailed with the HTML attached (`slurmgpu report-nightly`, run by
daemon/slurmgpu-report.timer).

``write_day`` does the work from settled inputs (the config, the database path, the
``[report]`` settings); the command resolves those (``slurmgpu.cli.nightly_cmd``).
"""

from __future__ import annotations

import json
import re
import time
from datetime import date as Date
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgpu.fileutil import write_text_atomic

if TYPE_CHECKING:
    from slurmgpu.config.load import LoadedConfig
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


def write_day(config: LoadedConfig, db_path: str, rs: ReportSettings, *, day: Date | None = None,
              mail: bool = True, out_dir: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Build, write, prune and mail the report of local day ``day`` (default: yesterday)
    from the database at ``db_path``, under ``out_dir`` (default ``rs.dir``); returns what
    was done. Raises SlurmGpuError (an unreadable database, a mail failure: the files
    are written first) or OSError."""
    from slurmgpu.report import html
    from slurmgpu.report.model import report_from_path

    clock = time.time() if now is None else now
    if day is None:
        day = datetime.fromtimestamp(clock).date() - timedelta(days=1)
    t0, t1 = day_window(day)
    model = report_from_path(db_path, t0, t1, config=config, generated_at=clock)

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
        result["mailed"] = _mail(model, rs, stem, html_text)
    return result


def _mail(model: dict[str, Any], rs: ReportSettings, stem: str, html_text: str) -> str:
    from slurmgpu.report import markdown
    from slurmgpu.report.mail import build_message, send, subject_for

    msg = build_message(subject=subject_for(rs.subject, stem, model.get("summary") or {}),
                        mail_from=rs.mail_from, mail_to=rs.mail_to, text=markdown.render(model),
                        html=html_text, html_name=f"slurmgpu-report-{stem}.html")
    return send(msg, smtp_host=rs.smtp_host, smtp_port=int(rs.smtp_port), sendmail=rs.sendmail)
