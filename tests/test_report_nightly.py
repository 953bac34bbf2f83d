"""`slurmgpu report-nightly`, its mail (SMTP and sendmail) and the systemd units."""

from __future__ import annotations

import email
import json
import os
import socketserver
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.cli.nightly_cmd import run_nightly
from slurmgpu.config.schema import ReportSettings
from slurmgpu.report import SCHEMA, SECTIONS
from slurmgpu.report.mail import MailError, report_settings, subject_for
from slurmgpu.report.nightly import day_window, prune
from slurmgpu.sim.seed import seed

ROOT = Path(__file__).resolve().parent.parent
DAY = date(2026, 11, 25)
# The seeded history ends at local midnight after DAY: the whole day is in the data.
END = day_window(DAY)[1]


class _SmtpHandler(socketserver.StreamRequestHandler):
    """Just enough SMTP for smtplib: EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT."""

    def _say(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self) -> None:
        server: Any = self.server
        self._say("220 sink ESMTP")
        sender, rcpts = None, []
        while True:
            raw = self.rfile.readline()
            if not raw:
                return
            cmd = raw.decode(errors="replace").strip()
            verb = cmd[:4].upper()
            if verb in ("EHLO", "HELO"):
                self._say("250 sink")
            elif verb == "MAIL":
                sender, rcpts = cmd.split(":", 1)[1].strip(), []
                self._say("250 OK")
            elif verb == "RCPT":
                rcpts.append(cmd.split(":", 1)[1].strip().strip("<>"))
                self._say("250 OK")
            elif verb == "DATA":
                self._say("354 end with <CRLF>.<CRLF>")
                lines = []
                while True:
                    line = self.rfile.readline()
                    if line in (b".\r\n", b".\n", b""):
                        break
                    lines.append(line[1:] if line.startswith(b"..") else line)
                server.messages.append({"from": sender, "to": rcpts, "data": b"".join(lines)})
                self._say("250 queued")
            elif verb in ("RSET", "NOOP"):
                self._say("250 OK")
            elif verb == "QUIT":
                self._say("221 bye")
                return
            else:
                self._say("502 not implemented")


@pytest.fixture
def smtp_sink() -> Iterator[Any]:
    server: Any = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SmtpHandler)
    server.daemon_threads = True
    server.messages = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A seeded fleet DB and a config pointing at it (with the seed's lemons)."""
    tmp = tmp_path_factory.mktemp("nightly")
    seed(tmp / "fleet.db", nodes=30, days=3, end=END, seed=1)
    config = tmp / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{tmp / "fleet.db"}"\n[paths]\nstate_dir = "{tmp / "state"}"\n')
    return tmp / "fleet.db", config


def _fake_sendmail(tmp_path: Path, rc: int = 0) -> Path:
    script = tmp_path / "sendmail"
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/sendmail.args"\ncat > "{tmp_path}/sendmail.eml"\n'
                      f'[ {rc} -eq 0 ] || echo "sendmail: no route" >&2\nexit {rc}\n')
    script.chmod(0o755)
    return script


def _parts(msg: Message) -> dict[str, Message]:
    return {part.get_content_type(): part for part in msg.walk() if not part.is_multipart()}


def test_writes_html_and_json_for_the_day(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    result = run_nightly(str(config), day=DAY, mail=True, out_dir=str(tmp_path / "reports"))
    assert result["mailed"] is None  # no recipients configured
    html = (tmp_path / "reports" / "2026-11-25.html").read_text()
    model = json.loads((tmp_path / "reports" / "2026-11-25.json").read_text())
    assert model["schema"] == SCHEMA
    assert (model["window"]["from_ts"], model["window"]["to_ts"]) == day_window(DAY)
    assert all(f'id="{s}"' in html or f"id={s}" in html for s in SECTIONS)
    assert model["summary"]["nodes"] == 30
    assert (tmp_path / "reports" / "2026-11-25.html").stat().st_mode & 0o777 == 0o644


def test_default_day_is_yesterday(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    now = datetime(2026, 11, 26, 6, 3).timestamp()  # the timer's run, local time
    result = run_nightly(str(config), mail=False, out_dir=str(tmp_path), now=now)
    assert result["date"] == "2026-11-25"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026-11-25.html", "2026-11-25.json"]


def test_day_window_is_local_midnight_to_midnight() -> None:
    t0, t1 = day_window(DAY)
    assert datetime.fromtimestamp(t0) == datetime(2026, 11, 25)
    assert datetime.fromtimestamp(t1) == datetime(2026, 11, 26)


def test_prune_keeps_recent_and_foreign_files(tmp_path: Path) -> None:
    today = date(2026, 11, 26)
    names = [f"{today - timedelta(days=d)}.{ext}" for d in (1, 89, 90, 91, 400) for ext in ("html", "json")]
    for name in [*names, "notes.txt", "2026-13-45.html", "2025-01-01.pdf"]:
        (tmp_path / name).write_text("x")
    removed = prune(tmp_path, 90, today)
    assert sorted(removed) == sorted(n for n in names if n.startswith(("2026-08-27", "2025-")))
    left = {p.name for p in tmp_path.iterdir()}
    assert {"notes.txt", "2026-13-45.html", "2025-01-01.pdf", "2026-08-28.html", "2026-11-25.json"} <= left
    assert prune(tmp_path, 0, today) == []


def test_mail_over_smtp(fleet: tuple[Path, Path], tmp_path: Path, smtp_sink: Any) -> None:
    _, config = fleet
    host, port = smtp_sink.server_address
    settings = ReportSettings(dir=str(tmp_path), mail_to=["ops@example.org", "oncall@example.org"],
                              mail_from="slurmgpu@head.example.org", smtp_host=host, smtp_port=port)
    result = run_nightly(str(config), day=DAY, report=settings)
    assert result["mailed"] == f"smtp {host}:{port}"
    assert len(smtp_sink.messages) == 1
    sent = smtp_sink.messages[0]
    assert sorted(sent["to"]) == ["oncall@example.org", "ops@example.org"]
    msg = email.message_from_bytes(sent["data"])
    assert msg["Subject"].startswith("slurmgpu fleet report 2026-11-25: ")
    assert "% available" in msg["Subject"] and "{" not in msg["Subject"]
    parts = _parts(msg)
    text = parts["text/plain"].get_payload(decode=True).decode()
    html = parts["text/html"].get_payload(decode=True).decode()
    assert text.lstrip().startswith("#")  # the Markdown report
    assert "slurmgpu-report-2026-11-25.html" in (parts["text/html"].get_filename() or "")
    assert html.replace("\r\n", "\n") == (tmp_path / "2026-11-25.html").read_text()  # SMTP: CRLF


def test_mail_through_sendmail(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    script = _fake_sendmail(tmp_path)
    settings = ReportSettings(dir=str(tmp_path / "r"), mail_to=["ops@example.org"], sendmail=str(script),
                              subject="[{date}] {drains} drains, {nope}")
    result = run_nightly(str(config), day=DAY, report=settings)
    assert result["mailed"] == f"sendmail {script}"
    assert (tmp_path / "sendmail.args").read_text().split() == ["-t", "-oi"]
    msg = email.message_from_bytes((tmp_path / "sendmail.eml").read_bytes())
    assert msg["To"] == "ops@example.org"
    assert msg["Subject"].startswith("[2026-11-25] ") and msg["Subject"].endswith("drains, {nope}")
    assert set(_parts(msg)) == {"text/plain", "text/html"}


def test_mail_failure_is_an_error_after_the_files(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    settings = ReportSettings(dir=str(tmp_path), mail_to=["ops@example.org"],
                              sendmail=str(_fake_sendmail(tmp_path, rc=75)))
    with pytest.raises(MailError, match="exited 75: sendmail: no route"):
        run_nightly(str(config), day=DAY, report=settings)
    assert (tmp_path / "2026-11-25.html").exists()
    refused = ReportSettings(dir=str(tmp_path), mail_to=["ops@example.org"], smtp_host="127.0.0.1",
                             smtp_port=_closed_port())
    with pytest.raises(MailError, match=r"SMTP 127\.0\.0\.1"):
        run_nightly(str(config), day=DAY, report=refused)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_mail_and_mail_to_override(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    settings = ReportSettings(dir=str(tmp_path), mail_to=["ops@example.org"],
                              sendmail=str(_fake_sendmail(tmp_path)))
    assert run_nightly(str(config), day=DAY, mail=False, report=settings)["mailed"] is None
    assert not (tmp_path / "sendmail.eml").exists()
    result = run_nightly(str(config), day=DAY, report=settings, mail_to=["me@example.org"])
    assert result["mail_to"] == ["me@example.org"]
    assert email.message_from_bytes((tmp_path / "sendmail.eml").read_bytes())["To"] == "me@example.org"


def test_report_settings_and_subject() -> None:
    from slurmgpu.config.schema import Settings

    settings = Settings()
    settings.report.mail_to = ["a@example.org"]
    rs = report_settings(settings)
    assert rs.mail_to == ["a@example.org"] and rs.keep_days == 90
    rs.mail_to.append("b@example.org")  # a copy: the settings are not changed
    assert settings.report.mail_to == ["a@example.org"]
    assert subject_for("{date} {availability_pct}% {x}", "2026-11-25", {"availability_pct": None}) == \
        "2026-11-25 -% {x}"
    assert subject_for("{0} {", "d", {}) == "{0} {"


def test_cli(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    _, config = fleet
    out = tmp_path / "reports"
    result = CliRunner().invoke(cli, ["report-nightly", "--config", str(config), "--date", "2026-11-25",
                                      "--dir", str(out), "--no-mail", "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert done["written"] == [str(out / "2026-11-25.html"), str(out / "2026-11-25.json")]
    bad = CliRunner().invoke(cli, ["report-nightly", "--config", str(config), "--date", "25/11/2026"])
    assert bad.exit_code == 3 and "bad --date" in bad.output
    missing = CliRunner().invoke(cli, ["report-nightly", "--config", str(config), "--date", "2026-11-25",
                                       "--db", str(tmp_path / "nope.db"), "--dir", str(out)])
    assert missing.exit_code == 3


def test_wrapper_runs_the_command(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    """daemon/slurmgpu-nightly-report passes its arguments on (SLURMGPU_BIN = this slurmgpu)."""
    _, config = fleet
    wrapper = ROOT / "daemon" / "slurmgpu-nightly-report"
    assert wrapper.stat().st_mode & stat.S_IXUSR
    env = dict(os.environ, SLURMGPU_BIN=f"{sys.executable} -m slurmgpu", SLURMGPU_CONFIG=str(config),
               SLURMGPU_REPORT_ARGS="--no-mail")
    proc = subprocess.run([str(wrapper), "--date", "2026-11-25", "--dir", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "2026-11-25.json").exists()


def test_systemd_units() -> None:
    service = (ROOT / "daemon" / "slurmgpu-report.service").read_text()
    timer = (ROOT / "daemon" / "slurmgpu-report.timer").read_text()
    assert "Type=oneshot" in service and "ExecStart=/usr/libexec/slurmgpu/slurmgpu-nightly-report" in service
    assert "OnCalendar=*-*-* 06:00" in timer and "Persistent=true" in timer
    assert "RandomizedDelaySec=" in timer and "WantedBy=timers.target" in timer


def test_report_table_in_the_config(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    """[report] in slurmgpu.toml drives the whole run (once the schema has ReportSettings)."""
    db, _ = fleet
    script = _fake_sendmail(tmp_path)
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{db}"\n[report]\ndir = "{tmp_path / "reports"}"\nkeep_days = 30\n'
                      f'mail_to = ["ops@example.org"]\nsendmail = "{script}"\n')
    result = CliRunner().invoke(cli, ["report-nightly", "--config", str(config), "--date", "2026-11-25"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "reports" / "2026-11-25.html").exists()
    assert email.message_from_bytes((tmp_path / "sendmail.eml").read_bytes())["To"] == "ops@example.org"
