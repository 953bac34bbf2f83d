"""The Slurm hook wrappers and the quick client when slurmgpu itself cannot start (issue 13
item 1): not installed for the interpreter found, a missing interpreter, no Python at all.
Slurm drains a node whose prolog or epilog exits non-zero, so none of these may exit
non-zero unless the site configured fail-closed. The mini-cluster tests with the hooks as
a package installs them are in test_slurm_integration.py (``installed``)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import quickgate

REPO = Path(__file__).resolve().parent.parent


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_hook_wrappers", REPO / "tools" / "gen_hook_wrappers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_slurmgpu_python(tmp: Path) -> str:
    """An interpreter that cannot import slurmgpu (no site-packages, no PYTHONPATH)."""
    path = tmp / "bare-python"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    path.chmod(0o755)
    return str(path)


def base_env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": "42",
            "SLURMGPU_AGENT_SOCKET": str(tmp / "no-agent.sock"),
            "SLURMGPU_CONFIG": str(tmp / "slurmgpu.toml"), **extra}


def run_quickgate(env: dict[str, str], phase: str = "prolog") -> subprocess.CompletedProcess[str]:
    # As the wrappers run it: an isolated file, no site-packages.
    return subprocess.run([sys.executable, "-I", "-S", str(REPO / "slurmgpu" / "quickgate.py"), phase],
                          env=env, capture_output=True, text=True, timeout=60, check=False, cwd="/")


def decision_line(stderr: str) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return line


def test_the_wrappers_are_generated_from_one_template() -> None:
    gen = _generator()
    for phase, path in gen.WRAPPERS.items():
        assert (REPO / path).read_text() == gen.render(phase), f"run tools/gen_hook_wrappers.py ({path})"
        assert os.access(REPO / path, os.X_OK)
    assert os.readlink(REPO / "prolog" / "slurmgpu-taskprolog.py") == "../slurmgpu/taskprolog.py"


@pytest.mark.parametrize(("policy", "phase", "code", "action"), [
    (None, "prolog", 0, "fail-open"), ("fail-open", "epilog", 0, "fail-open"),
    ("fail-closed", "prolog", 1, "fail-closed"), ("fail-closed", "epilog", 1, "fail-closed"),
    (None, "healthcheck", 3, "none"),
])
def test_an_interpreter_without_slurmgpu_follows_on_error(tmp_path: Path, policy: str | None, phase: str,
                                                          code: int, action: str) -> None:
    """Was: `python3 -m slurmgpu` -> "No module named slurmgpu", exit 1 -> Slurm drains."""
    if policy:
        (tmp_path / "slurmgpu.toml").write_text(f'[{phase}]\non_error = "{policy}"\n')
    proc = run_quickgate(base_env(tmp_path, SLURMGPU_PYTHON=no_slurmgpu_python(tmp_path)), phase)
    assert proc.returncode == code, proc.stderr
    line = decision_line(proc.stderr)
    assert line["event"] == f"{phase}_decision" and line["action"] == action and line["path"] == "none"
    assert "cannot import slurmgpu" in line["error"] and "SLURMGPU_PYTHON" in line["error"]
    assert line["node"] == "gpu-n1" and line["job"] == "42"
    assert "ModuleNotFoundError" in proc.stderr  # the interpreter's own reason, above the line


def test_a_missing_interpreter_follows_on_error(tmp_path: Path) -> None:
    proc = run_quickgate(base_env(tmp_path, SLURMGPU_PYTHON=str(tmp_path / "venv" / "bin" / "python")))
    assert proc.returncode == 0
    line = decision_line(proc.stderr)
    assert line["action"] == "fail-open" and "no such executable" in line["error"]


def test_a_full_path_killed_by_a_signal_follows_on_error(tmp_path: Path) -> None:
    script = tmp_path / "killed"
    script.write_text("#!/bin/sh\nkill -9 $$\n")
    script.chmod(0o755)
    proc = run_quickgate(base_env(tmp_path, SLURMGPU_BIN=str(script)))
    assert proc.returncode == 0 and "killed by signal 9" in decision_line(proc.stderr)["error"]


def test_a_working_interpreter_runs_the_real_hook(tmp_path: Path) -> None:
    """$SLURMGPU_PYTHON that has slurmgpu: BOOTSTRAP runs the real `slurmgpu prolog`
    (here its own config-error handling answers: fail-open, one `config:` line)."""
    (tmp_path / "slurmgpu.toml").write_text('[gpu]\nmig = "sometimes"\n')
    env = base_env(tmp_path, SLURMGPU_PYTHON=sys.executable)
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = run_quickgate(env)
    assert proc.returncode == 0, proc.stderr
    assert "config:" in proc.stderr and "cannot run slurmgpu" not in proc.stderr


def test_the_interpreter_of_a_slurmgpu_script_on_path_is_used(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "slurmgpu").write_text(f"#!{no_slurmgpu_python(tmp_path)}\n")
    (bindir / "slurmgpu").chmod(0o755)
    command = quickgate.full_path_commands("prolog", [], {"PATH": str(bindir)})[0]
    # (a shebang naming a non-python is not taken as one: the packaged python is used)
    assert command[0] in quickgate.PACKAGED_PYTHONS or command[0] == sys.executable
    (bindir / "slurmgpu").write_text("#!/usr/bin/env python3.11 -X\n")
    assert quickgate.python_of(str(bindir / "slurmgpu")) is None  # env + relative name
    (bindir / "slurmgpu").write_text("#!/opt/slurmgpu/bin/python\n")
    command = quickgate.full_path_commands("epilog", ["--config", "x"], {"PATH": str(bindir)})[0]
    assert command[:2] == ["/opt/slurmgpu/bin/python", "-c"] and command[3:] == ["epilog", "--config", "x"]
    commands = quickgate.full_path_commands("prolog", [], {"SLURMGPU_BIN": "/x/slurmgpu --v"})
    assert commands[0] == ["/x/slurmgpu", "--v", "prolog"] and commands[1][1] == "-c"


def test_a_bug_in_the_quick_client_follows_on_error(tmp_path: Path) -> None:
    code = ("import sys\nimport slurmgpu.quickgate as q\n"
            "def boom(*a):\n    raise RuntimeError('bug')\n"
            "q.gate = boom\nsys.exit(q.main(['epilog']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **base_env(tmp_path)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert "quickgate: RuntimeError: bug" in decision_line(proc.stderr)["error"]


def copy_wrapper(tmp: Path, phase: str, *, with_quickgate: bool) -> Path:
    gen = _generator()
    wrapper = tmp / "libexec" / Path(gen.WRAPPERS[phase]).name
    wrapper.parent.mkdir(exist_ok=True)
    shutil.copy(REPO / gen.WRAPPERS[phase], wrapper)
    if with_quickgate:
        shutil.copy(REPO / "slurmgpu" / "quickgate.py", wrapper.parent / "slurmgpu-quickgate")
    return wrapper


@pytest.mark.parametrize(("policy", "phase", "code"), [
    (None, "prolog", 0), ('"fail-closed"', "prolog", 1), ("'fail-closed'", "epilog", 1),
    ('"fail-open"', "epilog", 0), ('"fail-closed"', "healthcheck", 3),
])
def test_a_wrapper_with_no_quick_client_follows_on_error_from_the_text(tmp_path: Path, policy: str | None,
                                                                       phase: str, code: int) -> None:
    """No Python can run even the quick client (here: it is missing): the shell reads
    on_error from the config's text, only from the phase's own table."""
    text = '[epilog]\non_error = "fail-closed"\n' if phase == "prolog" else ""
    if policy:
        text += f"[{phase}]\ntimeout_s = 5\n  on_error = {policy}  # site policy\n[agent]\n"
    (tmp_path / "slurmgpu.toml").write_text(text)
    wrapper = copy_wrapper(tmp_path, phase, with_quickgate=False)
    proc = subprocess.run([str(wrapper)], env=base_env(tmp_path), capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == code, proc.stderr
    line = decision_line(proc.stderr)
    assert line["event"] == f"{phase}_decision" and "SLURMGPU_PYTHON" in line["error"]


def test_a_wrapper_runs_the_quick_client_with_the_configured_python(tmp_path: Path) -> None:
    wrapper = copy_wrapper(tmp_path, "prolog", with_quickgate=True)
    env = base_env(tmp_path, SLURMGPU_PYTHON=no_slurmgpu_python(tmp_path))
    del env["PATH"]  # Slurm 22.05 gives a prolog none
    proc = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert "cannot import slurmgpu" in decision_line(proc.stderr)["error"]


# -- issue 28 item 1: a broken install or a wrong interpreter drains nothing --------------

def python_with(tmp: Path, site: Path) -> str:
    """This test's interpreter, with ``site`` first on its path (a package copy, a stand-in
    for a removed dependency) for what it runs with -c (the full path's BOOTSTRAP)."""
    path = tmp / "site-python"
    path.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def broken_copy(tmp: Path, module: str) -> Path:
    """A copy of the package with a syntax error appended to ``module`` (a path in it)."""
    site = tmp / "site"
    shutil.copytree(REPO / "slurmgpu", site / "slurmgpu", ignore=shutil.ignore_patterns("__pycache__"))
    with open(site / "slurmgpu" / module, "a") as f:
        f.write("\ndef broken(:\n")
    return site


def without(tmp: Path, package: str) -> Path:
    """A path entry on which ``import <package>`` fails as it does once its distribution
    package (python3-pynvml, python3-structlog) is removed (the rest as installed)."""
    site = tmp / "site"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n")
    return site


def run_wrapper(tmp: Path, phase: str, **env: str) -> subprocess.CompletedProcess[str]:
    wrapper = copy_wrapper(tmp, phase, with_quickgate=True)
    return subprocess.run([str(wrapper)], env=base_env(tmp, **env), capture_output=True, text=True,
                          timeout=120, check=False)


def assert_one_decision(proc: subprocess.CompletedProcess[str], phase: str, code: int,
                        action: str) -> dict[str, Any]:
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if f'"{phase}_decision"' in line]
    assert len(lines) == 1, proc.stderr
    line = decision_line(proc.stderr)
    assert line["event"] == f"{phase}_decision" and line["action"] == action, line
    return line


@pytest.mark.parametrize("module", ["gate.py", "log.py", "checks/__init__.py"])
@pytest.mark.parametrize(("phase", "code", "action"), [
    ("prolog", 0, "fail-open"), ("epilog", 0, "fail-open"), ("healthcheck", 3, "none")])
def test_a_broken_module_follows_on_error(tmp_path: Path, module: str, phase: str, code: int,
                                          action: str) -> None:
    """Was: `def broken(:` appended to slurmgpu/gate.py -> exit 1 and a traceback: Slurm
    drains every node the broken package is on."""
    proc = run_wrapper(tmp_path, phase, SLURMGPU_PYTHON=python_with(tmp_path, broken_copy(tmp_path, module)))
    line = assert_one_decision(proc, phase, code, action)
    assert "cannot" in line["error"] and "SyntaxError" in proc.stderr


@pytest.mark.parametrize("policy", [None, "fail-closed"])
def test_a_removed_structlog_does_not_stop_the_hooks(tmp_path: Path, policy: str | None) -> None:
    """Was: python3-structlog removed -> exit 1 and a traceback; then (issue 32) on_error.
    The hooks no longer import structlog (issue 38): the prolog judges the node as
    usual. (An import that fails still follows on_error: test_a_broken_module_...)"""
    (tmp_path / "slurmgpu.toml").write_text(f'[prolog]\non_error = "{policy}"\n' if policy else "")
    proc = run_wrapper(tmp_path, "prolog", SLURMGPU_PYTHON=python_with(tmp_path, without(tmp_path, "structlog")))
    line = assert_one_decision(proc, "prolog", 0, "none")
    assert (line["level"], line["verdict"]) == ("info", "OK"), line


def slurmgpu_script() -> str:
    script = shutil.which("slurmgpu", path=str(Path(sys.executable).parent))
    assert script, "the slurmgpu console script beside this interpreter"
    return script


@pytest.mark.parametrize("phase", ["prolog", "epilog", "healthcheck"])
@pytest.mark.parametrize("setting", ["SLURMGPU_PYTHON=/bin/false", "SLURMGPU_PYTHON=/bin/sh",
                                     "SLURMGPU_PYTHON=script", "SLURMGPU_BIN=/bin/false"])
def test_a_wrong_interpreter_follows_on_error(tmp_path: Path, phase: str, setting: str) -> None:
    """Was: SLURMGPU_PYTHON=/bin/false -> 1, /bin/sh -> 2, the slurmgpu script -> 3,
    SLURMGPU_BIN=/bin/false -> 1. (No interpreter here has slurmgpu but the one named.)"""
    name, value = setting.split("=")
    proc = run_wrapper(tmp_path, phase, **{name: slurmgpu_script() if value == "script" else value})
    line = assert_one_decision(proc, phase, 3 if phase == "healthcheck" else 0,
                               "none" if phase == "healthcheck" else "fail-open")
    assert "cannot run slurmgpu" in line["error"]


@pytest.mark.parametrize("setting", ["SLURMGPU_PYTHON=/bin/false", "SLURMGPU_BIN=/bin/sh"])
def test_a_wrong_interpreter_falls_back_to_one_that_has_slurmgpu(tmp_path: Path, setting: str) -> None:
    """The interpreter of the `slurmgpu` script on PATH is tried next: the real hook
    decides (here on a bad config: its own `config:` line, fail-closed as configured)."""
    (tmp_path / "slurmgpu.toml").write_text('[prolog]\non_error = "fail-closed"\n[gpu]\nmig = "sometimes"\n')
    name, value = setting.split("=")
    proc = run_wrapper(tmp_path, "prolog", **{name: value},
                       PATH=f"{Path(slurmgpu_script()).parent}:/usr/bin:/bin")
    assert proc.returncode == 1, proc.stderr
    assert "config:" in proc.stderr and "cannot run slurmgpu" not in proc.stderr
