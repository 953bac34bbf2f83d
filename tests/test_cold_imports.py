"""The cold path (issues 10, 38): `slurmgpu check` and the Slurm hooks import only what
they use (no click, no structlog, no zmq, no collector), leave through os._exit once
their output is flushed, and the lazily loaded command table stays in step with the
commands it points at."""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from slurmgpu.cli import COMMANDS, cli
from slurmgpu.cli.lazy import LazyCommand, LazyGroup
from slurmgpu.cli.sim import sim
from slurmgpu.record import is_record
from tests.simfixtures import ScenarioFactory, sim_env

REPO = Path(__file__).resolve().parent.parent
SIM_CONFIG = REPO / "etc" / "sim-h100.toml"

# Nothing a one-shot command needs; each costs milliseconds per job to import. The
# simulator (slurmgpu.sim: the mini-cluster, simulated agents, the demo) never runs on a node.
FORBIDDEN = ("zmq", "zmq.*", "slurmgpu.keys", "slurmgpu.collector*", "slurmgpu.report*",
             "prometheus_client*", "slurmgpu.sim", "slurmgpu.sim.*")
# A one-shot run (not its --help) reads its options and writes its decision line without
# click and structlog (issue 38): each cost tens of milliseconds per job.
ONE_SHOT_FORBIDDEN = (*FORBIDDEN, "click", "click.*", "structlog", "structlog.*", "slurmgpu.cli.root",
                      "slurmgpu.cli.common", "slurmgpu.cli.lazy")

# Runs the real entry point, slurmgpu.cli.main(), and writes sys.modules at the very end:
# from os._exit (wrapped) for one-shot commands, from atexit otherwise.
HARNESS = """
import atexit, gc, json, os, sys

def record(via):
    with open(os.environ["COLD_OUT"], "w") as fh:
        json.dump({"via": via, "modules": sorted(sys.modules), "gc": gc.isenabled()}, fh)

real_exit = os._exit

def exit_recorded(code):
    record("os._exit")
    real_exit(code)

os._exit = exit_recorded
atexit.register(record, "atexit")
sys.argv = ["slurmgpu", *json.loads(os.environ["COLD_ARGS"])]
from slurmgpu.cli import main
main()
"""


def run_cold(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str],
                                                                            dict[str, Any]]:
    out = tmp_path / "modules.json"
    env = dict(env, COLD_OUT=str(out), COLD_ARGS=json.dumps(args))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", HARNESS], env=env, capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert out.exists(), proc.stderr
    return proc, json.loads(out.read_text())


def forbidden(modules: list[str], patterns: tuple[str, ...] = FORBIDDEN) -> list[str]:
    return [m for m in modules if any(fnmatch.fnmatchcase(m, pattern) for pattern in patterns)]


def cli_modules(modules: list[str]) -> set[str]:
    return {m for m in modules if m.startswith("slurmgpu.cli.")}


@pytest.fixture
def node_env(fake_nvml_lib: Path, scenario_file: ScenarioFactory, tmp_path: Path) -> dict[str, str]:
    """The simulated 8x H100 node, its own state dir and kernel log, a job with GPUs 0,1."""
    (tmp_path / "kmsg").write_text("")
    return sim_env(fake_nvml_lib, scenario_file("h100-sxm-8"), SLURMGPU_STATE_DIR=str(tmp_path / "state"),
                   SLURMGPU_KMSG=str(tmp_path / "kmsg"), SLURMD_NODENAME="gpu-h100-001",
                   SLURM_JOB_ID="4242", SLURM_JOB_GPUS="0,1", SLURM_JOB_USER="alice")


def test_check_imports_nothing_it_does_not_use(node_env: dict[str, str], tmp_path: Path) -> None:
    proc, seen = run_cold(["check", "--json", "--config", str(SIM_CONFIG), "--node", "gpu-h100-001"],
                          node_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "OK"  # all of it flushed before os._exit
    assert seen["via"] == "os._exit"
    assert forbidden(seen["modules"], ONE_SHOT_FORBIDDEN) == []
    assert cli_modules(seen["modules"]) == {"slurmgpu.cli.oneshot", "slurmgpu.cli.checkrun", "slurmgpu.cli.loading"}
    assert seen["gc"] is False  # the cyclic collector only rescans what the imports keep


def compiled_dataclasses(modules: list[str]) -> list[str]:
    """The ``@dataclass`` classes (not records) that ``modules`` of slurmgpu define."""
    found = []
    for name in (m for m in modules if m.startswith("slurmgpu.")):
        module = importlib.import_module(name)
        found += [f"{name}.{cls.__qualname__}" for cls in vars(module).values()
                  if isinstance(cls, type) and cls.__module__ == name and dataclasses.is_dataclass(cls)
                  and not is_record(cls)]
    return found


@pytest.mark.parametrize("command", ["check", "prolog"])
def test_one_shot_paths_create_records_not_dataclasses(node_env: dict[str, str], tmp_path: Path,
                                                       command: str) -> None:
    """``@dataclass`` compiles each class's ``__eq__`` and ``__repr__`` at import; the
    classes a one-shot command creates share them instead (``slurmgpu.record``)."""
    args = ["--json", "--node", "gpu-h100-001"] if command == "check" else []
    proc, seen = run_cold([command, "--config", str(SIM_CONFIG), *args], node_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert compiled_dataclasses(seen["modules"]) == []


def test_check_logging_its_results_imports_no_structlog(node_env: dict[str, str], tmp_path: Path) -> None:
    proc, seen = run_cold(["check", "--json", "--config", str(SIM_CONFIG), "--log-level", "info"],
                          node_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert forbidden(seen["modules"], ONE_SHOT_FORBIDDEN) == []
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert {line["event"] for line in lines} == {"check_result", "verdict"}


def test_check_help_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    proc, seen = run_cold(["check", "--help"], dict(os.environ), tmp_path)
    assert proc.returncode == 0 and "--gpus LIST" in proc.stdout
    assert forbidden(seen["modules"]) == []
    assert cli_modules(seen["modules"]) == {"slurmgpu.cli.common", "slurmgpu.cli.lazy", "slurmgpu.cli.checks",
                                            "slurmgpu.cli.root", "slurmgpu.cli.oneshot", "slurmgpu.cli.checkrun",
                                            "slurmgpu.cli.loading"}


@pytest.mark.parametrize("phase", ["prolog", "epilog", "healthcheck"])
def test_hooks_import_nothing_they_do_not_use(node_env: dict[str, str], tmp_path: Path,
                                              phase: str) -> None:
    # healthcheck resumes a recovered node through Slurm; there is no Slurm here.
    config = tmp_path / "slurmgpu.toml"
    config.write_text(SIM_CONFIG.read_text() + "\n[healthcheck]\nresume = false\n")
    proc, seen = run_cold([phase, "--config", str(config)], node_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert seen["via"] == "os._exit"
    assert forbidden(seen["modules"], ONE_SHOT_FORBIDDEN) == []
    assert cli_modules(seen["modules"]) == {"slurmgpu.cli.oneshot", "slurmgpu.cli.hooks", "slurmgpu.cli.loading"}
    assert seen["gc"] is False
    records = [json.loads(line) for line in (tmp_path / "state" / "gate.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["verdict"]) for r in records] == [(phase, "OK")]
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    decision = next(line for line in lines if line["event"] == f"{phase}_decision")
    assert (decision["level"], decision["verdict"]) == ("info", "OK")


@pytest.mark.parametrize("phase", ["prolog", "epilog", "healthcheck"])
def test_hook_on_error_imports_no_click_nor_structlog(node_env: dict[str, str], tmp_path: Path,
                                                      phase: str) -> None:
    """A bad config: the on_error decision line, written without structlog."""
    config = tmp_path / "slurmgpu.toml"
    config.write_text("[gpu]\ncount = 'eight'\n")
    proc, seen = run_cold([phase, "--config", str(config)], node_env, tmp_path)
    assert proc.returncode == (3 if phase == "healthcheck" else 0), proc.stderr
    assert forbidden(seen["modules"], ONE_SHOT_FORBIDDEN) == []
    decision = json.loads(proc.stderr.splitlines()[-1])
    assert list(decision) == ["phase", "action", "error", "node", "job", "event", "level", "timestamp"]
    assert decision["event"] == f"{phase}_decision" and decision["level"] == "error"


def test_top_level_help_imports_no_command(tmp_path: Path) -> None:
    proc, seen = run_cold(["--help"], dict(os.environ), tmp_path)
    assert proc.returncode == 0 and "Commands:" in proc.stdout
    assert seen["via"] == "atexit"  # not a one-shot command: the usual exit
    assert seen["gc"] is True
    assert cli_modules(seen["modules"]) == {"slurmgpu.cli.common", "slurmgpu.cli.lazy", "slurmgpu.cli.root",
                                            "slurmgpu.cli.loading"}


def test_every_listed_command_resolves() -> None:
    """`slurmgpu --help` lists the table; each entry must import and answer --help."""
    def slurmgpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "slurmgpu", *args], capture_output=True, text=True,
                              timeout=60, check=False, cwd=REPO)

    listing = slurmgpu("--help")
    assert listing.returncode == 0
    listed = re.findall(r"^  (\S+)  ", listing.stdout.split("Commands:", 1)[1], re.MULTILINE)
    assert listed == sorted(COMMANDS)
    for name in [*listed, *(f"sim {n}" for n in sim.list_commands(click.Context(sim)))]:
        proc = slurmgpu(*name.split(), "--help")
        assert proc.returncode == 0 and "Usage:" in proc.stdout, (name, proc.stderr)


def test_table_matches_the_commands() -> None:
    """The short help in the table is what the command itself would show."""
    for name, entry in COMMANDS.items():
        command = cli.load(name)
        assert command.get_short_help_str(limit=10_000) == entry.short_help, name
        assert not command.hidden


def test_lazy_listing_is_the_eager_listing() -> None:
    """The group's --help reads like click's own listing of the loaded commands."""
    lazy = LazyGroup("slurmgpu", lazy=COMMANDS, help=cli.help)
    eager = click.Group("slurmgpu", help=cli.help)
    for name in COMMANDS:
        eager.add_command(lazy.load(name), name)
    assert lazy.get_help(click.Context(lazy)) == eager.get_help(click.Context(eager))
    assert lazy.commands == {}  # rendering the listing loaded nothing


def test_missing_module_fails_loudly() -> None:
    group = LazyGroup("g", lazy={"gone": LazyCommand("slurmgpu.cli.no_such_module", "gone", "Gone.")})
    assert group.list_commands(click.Context(group)) == ["gone"]
    with pytest.raises(ModuleNotFoundError):
        group.get_command(click.Context(group), "gone")
    not_a_command = LazyGroup("g", lazy={"x": LazyCommand("slurmgpu.cli", "COMMANDS", "X.")})
    with pytest.raises(TypeError):
        not_a_command.get_command(click.Context(not_a_command), "x")


def test_cli_runner_calls_one_shot_commands_in_process() -> None:
    """Tests invoke the group, not main(): os._exit must not end the test process."""
    result = CliRunner().invoke(cli, ["check", "--gpus", "x"])
    # The root prints the one error line for in-process callers too.
    assert result.exit_code == 3 and "slurmgpu: error: --gpus" in result.output
