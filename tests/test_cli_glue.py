"""The CLI's glue has one shape (issue 14, move 7): one --config, --json and --db
declaration; commands raise and only the root prints the one error line, for the real
program and for in-process callers alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli import cli
from slurmgpu.cli.common import CliError

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "slurmgpu" / "cli"
SHARED = CLI / "common.py"


def modules() -> list[Path]:
    return sorted(p for p in (REPO / "slurmgpu").rglob("*.py") if "__pycache__" not in p.parts)


def option_names(tree: ast.AST) -> list[str]:
    """The first argument of every ``click.option("--x", ...)`` call."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "option" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append(node.args[0].value)
    return out


@pytest.mark.parametrize("option", ["--config", "--json"])
def test_one_declaration_of_each_shared_option(option: str) -> None:
    declared = [str(p.relative_to(REPO)) for p in modules() for name in option_names(ast.parse(p.read_text()))
                if name == option]
    assert declared == ["slurmgpu/cli/common.py"]


def test_only_the_root_prints_errors() -> None:
    """No command prints its own error line nor defines its own fail()."""
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        if path == SHARED:
            continue
        text = path.read_text()
        if "slurmgpu: error" in text:
            offenders.append(f"{path.relative_to(REPO)}: prints 'slurmgpu: error'")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name in ("fail", "_fail"):
                offenders.append(f"{path.relative_to(REPO)}: def {node.name}")
    assert offenders == []


def test_the_nightly_command_only_settles_inputs() -> None:
    """The report's day, files, pruning and mail live in slurmgpu.report.nightly."""
    tree = ast.parse((CLI / "nightly_cmd.py").read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert defined == {"run_nightly", "report_nightly"}


@pytest.mark.parametrize("args,code,line", [
    (["report", "--format", "pdf"], 3, "slurmgpu: error: bad --format 'pdf' (want one of: html, md, json)"),
    (["report-nightly", "--date", "yesterday"], 3, "slurmgpu: error: bad --date 'yesterday' (want YYYY-MM-DD)"),
    (["check", "--bogus"], 3,
     "slurmgpu: error: No such option '--bogus'. Did you mean '--gpus'? (see 'slurmgpu check --help')"),
    (["config", "check", "/nonexistent/slurmgpu.toml"], 3,
     "slurmgpu: error: /nonexistent/slurmgpu.toml: config file not found"),
])
def test_in_process_callers_get_the_one_line(args: list[str], code: int, line: str) -> None:
    result = CliRunner().invoke(cli, args, prog_name="slurmgpu")
    assert result.exit_code == code
    assert result.stderr.splitlines() == [line]


def test_a_command_error_keeps_its_exit_code() -> None:
    @cli.command("raises-for-test")
    def raises() -> None:
        raise CliError("not a lemon", exit_code=1)

    try:
        result = CliRunner().invoke(cli, ["raises-for-test"])
    finally:
        cli.commands.pop("raises-for-test")
    assert (result.exit_code, result.stderr) == (1, "slurmgpu: error: not a lemon\n")
    assert cli.main(["--version"], standalone_mode=False) == 0
