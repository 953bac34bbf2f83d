"""Man pages written from the click commands (slurmgpu/cli/manpages.py), click's bash
completion, and the logrotate file the packages install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from slurmgpu.cli import COMMANDS, cli
from slurmgpu.cli.manpages import escape, pages, write_pages

REPO = Path(__file__).resolve().parent.parent


def test_a_page_for_slurmgpu_and_each_command() -> None:
    written = pages(cli)
    assert set(written) == {"slurmgpu.1"} | {f"slurmgpu-{name}.1" for name in COMMANDS}


def test_a_page_says_what_help_says() -> None:
    """Every option of a command and of a group's subcommands is on its page."""
    config_page = pages(cli)["slurmgpu-config.1"]
    group = cli.get_command(click.Context(cli), "config")
    assert isinstance(group, click.Group)
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        assert command is not None and f".SS slurmgpu config {name}" in config_page
        for param in command.params:
            for opt in getattr(param, "opts", []) if isinstance(param, click.Option) else []:
                assert escape(opt) in config_page, (name, opt)


def test_roff_escapes() -> None:
    assert escape("--json") == "\\-\\-json"
    assert escape("a\\b") == "a\\eb"
    assert escape(".start\n'quote") == "\\&.start\n\\&'quote"


@pytest.mark.skipif(shutil.which("man") is None, reason="no man (man-db)")
def test_pages_render_without_warnings(tmp_path: Path) -> None:
    """What lintian runs (manpage-has-errors-from-man) finds nothing."""
    for page in write_pages(tmp_path):
        env = {**os.environ, "LC_ALL": "C.UTF-8", "MANROFFSEQ": "", "MANWIDTH": "80"}
        out = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(page)],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0 and not out.stderr, (page.name, out.stderr)


def test_the_build_command_writes_the_pages(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "slurmgpu.cli.manpages", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "slurmgpu-check.1").read_text().startswith('.TH "SLURMGPU-CHECK" "1"')


def test_click_bash_completion_completes_commands() -> None:
    """The script the packages install and the answers it asks slurmgpu for."""
    code = "from slurmgpu.cli import main; main()"
    env = {**os.environ, "_SLURMGPU_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "complete -o nosort -F _slurmgpu_completion slurmgpu" in script.stdout
    env = {**os.environ, "_SLURMGPU_COMPLETE": "bash_complete", "COMP_WORDS": "slurmgpu config ch",
           "COMP_CWORD": "2"}
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert answer.stdout.split() == ["plain,check"]


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="no logrotate")
def test_logrotate_rotates_the_records_and_nothing_else(tmp_path: Path) -> None:
    """The shipped file, pointed at a scratch state dir, rotates gate.jsonl and
    job-summaries.jsonl by renaming (their writers open them for each record) and leaves
    the drains journal alone."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for name in ("gate.jsonl", "job-summaries.jsonl", "pending-actions.jsonl"):
        (state / name).write_text('{"x": 1}\n')
    text = (REPO / "etc" / "logrotate-slurmgpu").read_text().replace("/var/lib/slurmgpu", str(state))
    user = f"su {os.getuid()} {os.getgid()}" if os.getuid() else "su root root"
    conf = tmp_path / "slurmgpu"
    conf.write_text(text.replace("su root root", user).replace("create 0600 root root", "create 0600"))
    out = subprocess.run(["logrotate", "--force", "--state", str(tmp_path / "status"), str(conf)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in state.iterdir()) == [
        "gate.jsonl", "gate.jsonl.1", "job-summaries.jsonl", "job-summaries.jsonl.1",
        "pending-actions.jsonl"]
    assert (state / "gate.jsonl").read_text() == "" and (state / "pending-actions.jsonl").read_text()


def test_writing_the_pages_leaves_the_commands_as_they_were() -> None:
    """click caches a command's help option on first use: the pages must build it with
    the root's -h, or `slurmgpu doctor -h` stops working in the same process."""
    from click.testing import CliRunner

    assert "-h, --help" in pages(cli)["slurmgpu-doctor.1"].replace("\\-", "-")
    assert CliRunner().invoke(cli, ["doctor", "-h"]).exit_code == 0
