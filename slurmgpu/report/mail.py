"""Mail the nightly fleet report: the Markdown report as the text body, the HTML report
attached (``slurmgpu report-nightly``).

Delivery through an SMTP relay (``[report] smtp_host``) or, when that is empty, the
local MTA's ``sendmail -t -oi`` (``[report] sendmail``). Standard library only.
"""

from __future__ import annotations

import dataclasses
import smtplib
import socket
import subprocess
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from slurmgpu.config.schema import ReportSettings
from slurmgpu.errors import SlurmGpuError


class MailError(SlurmGpuError):
    """The report could not be handed to the mail system."""


def report_settings(settings: Any) -> ReportSettings:
    """``settings.report`` (a copy: callers may override fields from the command line)."""
    section: ReportSettings = settings.report
    return dataclasses.replace(section, mail_to=list(section.mail_to or []))


class _Keep(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def subject_for(template: str, date: str, summary: Mapping[str, Any]) -> str:
    """The subject line: ``{date}`` and any key of the report's summary
    (``{availability_pct}``, ``{drains}``, ``{drained_at_end}``, ``{new_failures}``...);
    unknown placeholders are left as written."""
    fields = _Keep({k: ("-" if v is None else v) for k, v in summary.items()})
    fields["date"] = date
    try:
        text = template.format_map(fields)
    except (ValueError, IndexError, AttributeError):
        text = template
    return " ".join(text.split())[:200]


def build_message(*, subject: str, mail_from: str, mail_to: Sequence[str], text: str,
                  html: str | None = None, html_name: str = "report.html") -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = mail_from
    msg["To"] = ", ".join(mail_to)
    msg["Date"] = formatdate(localtime=True)
    domain = mail_from.rpartition("@")[2] or socket.getfqdn()
    msg["Message-ID"] = make_msgid("slurmgpu-report", domain=domain)
    msg.set_content(text, subtype="plain", charset="utf-8")
    if html is not None:
        msg.add_attachment(html, subtype="html", charset="utf-8", filename=html_name)
    return msg


def send(msg: EmailMessage, *, smtp_host: str = "", smtp_port: int = 25,
         sendmail: str = "/usr/sbin/sendmail", timeout_s: float = 60.0) -> str:
    """Hand ``msg`` over; returns how ("smtp HOST:PORT" or "sendmail PATH")."""
    if smtp_host:
        try:
            with smtplib.SMTP(smtp_host, smtp_port, timeout=timeout_s) as smtp:
                refused = smtp.send_message(msg)
        except (OSError, smtplib.SMTPException) as exc:
            raise MailError(f"SMTP {smtp_host}:{smtp_port}: {exc}") from None
        if refused:
            raise MailError(f"SMTP {smtp_host}:{smtp_port} refused {', '.join(sorted(refused))}")
        return f"smtp {smtp_host}:{smtp_port}"
    try:
        proc = subprocess.run([sendmail, "-t", "-oi"], input=msg.as_bytes(), capture_output=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MailError(f"{sendmail}: {exc}") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise MailError(f"{sendmail} exited {proc.returncode}" + (f": {err[-1]}" if err else ""))
    return f"sendmail {sendmail}"
