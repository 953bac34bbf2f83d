"""prolog/slurmgpu-taskprolog: run as Slurm runs it (the executable, no site-packages),
with the task's environment."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "prolog" / "slurmgpu-taskprolog"


def run(env: dict[str, str], script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run([str(script)], env={**base, **env}, capture_output=True, text=True,
                          timeout=30, check=False, cwd="/")


@pytest.fixture(autouse=True)
def _python3_on_path() -> None:
    if shutil.which("python3") is None:
        pytest.skip("the TaskProlog's shebang needs python3 on PATH")


def test_shipped_like_the_quickgate() -> None:
    """A sh wrapper (it finds the interpreter: /etc/default/slurmgpu, packaged paths) and
    the script beside it, a symlink into the package."""
    script = SCRIPT.with_name("slurmgpu-taskprolog.py")
    assert script.is_symlink() and os.readlink(script) == "../slurmgpu/taskprolog.py"
    assert SCRIPT.stat().st_mode & stat.S_IXUSR and script.stat().st_mode & stat.S_IXUSR
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")
    assert script.read_text().startswith("#!/usr/bin/env -S python3 -I -S\n")


def test_the_wrapper_never_fails_the_task_without_any_python(tmp_path: Path) -> None:
    wrapper = tmp_path / "slurmgpu-taskprolog"
    shutil.copy(SCRIPT, wrapper)  # no slurmgpu-taskprolog.py beside it
    proc = run({"SLURM_JOB_ID": "9", "SLURMGPU_PYTHON": "/nonexistent/python"}, script=wrapper)
    assert proc.returncode == 0 and proc.stdout == ""


def test_the_wrapper_uses_the_configured_python(tmp_path: Path) -> None:
    proc = run({"SLURM_JOB_ID": "9", "SLURMGPU_JOBS_DIR": "/j", "SLURMGPU_PYTHON": sys.executable})
    assert proc.returncode == 0 and proc.stdout == "export SLURMGPU_CHECKPOINT_FILE=/j/9/checkpoint\n"


def test_prints_the_export_line_from_the_env(tmp_path: Path) -> None:
    proc = run({"SLURM_JOB_ID": "1234", "SLURMGPU_JOBS_DIR": str(tmp_path / "jobs"),
                "SLURMGPU_CONFIG": str(tmp_path / "absent.toml")})
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"export SLURMGPU_CHECKPOINT_FILE={tmp_path}/jobs/1234/checkpoint\n"


def test_jobs_dir_from_config(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text('[agent]\njobs_dir = "/srv/jobs"\ninterval_s = 5\n')
    proc = run({"SLURM_JOB_ID": "77_3", "SLURMGPU_CONFIG": str(config)})
    assert proc.stdout == "export SLURMGPU_CHECKPOINT_FILE=/srv/jobs/77_3/checkpoint\n"


@pytest.mark.parametrize("content", [None, "not [ toml", '[agent]\njobs_dir = 5\n', "\xff\xfe"])
def test_missing_or_bad_config_is_the_default(tmp_path: Path, content: str | None) -> None:
    config = tmp_path / "slurmgpu.toml"
    if content is not None:
        config.write_bytes(content.encode("latin-1"))
    proc = run({"SLURM_JOB_ID": "5", "SLURMGPU_CONFIG": str(config)})
    assert proc.returncode == 0
    assert proc.stdout == "export SLURMGPU_CHECKPOINT_FILE=/run/slurmgpu/jobs/5/checkpoint\n"


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_ID": ""}, {"SLURM_JOB_ID": "../../etc"},
                                 {"SLURM_JOB_ID": "12; rm -rf /"}])
def test_no_or_bad_job_id_prints_nothing_and_succeeds(env: dict[str, str]) -> None:
    proc = run(env)
    assert proc.returncode == 0 and proc.stdout == ""


def test_runs_from_a_copy_of_the_tree_without_site_packages(tmp_path: Path) -> None:
    """Slurm runs the symlink from wherever it is installed; the script finds
    slurmgpu.jobfiles next to its real file, with no PYTHONPATH and no site-packages."""
    tree = tmp_path / "opt" / "slurmgpu"
    (tree / "slurmgpu").mkdir(parents=True)
    for name in ("__init__.py", "jobfiles.py", "taskprolog.py"):
        shutil.copy2(REPO / "slurmgpu" / name, tree / "slurmgpu" / name)
    link = tmp_path / "bin" / "slurmgpu-taskprolog"
    link.parent.mkdir()
    link.symlink_to(tree / "slurmgpu" / "taskprolog.py")
    proc = run({"SLURM_JOB_ID": "9", "SLURMGPU_JOBS_DIR": "/j"}, script=link)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "export SLURMGPU_CHECKPOINT_FILE=/j/9/checkpoint\n"


def test_never_fails_the_task(tmp_path: Path) -> None:
    """Even when the shared code cannot be found, the task goes on (exit 0)."""
    tree = tmp_path / "broken"
    tree.mkdir()
    shutil.copy2(REPO / "slurmgpu" / "taskprolog.py", tree / "taskprolog.py")
    proc = run({"SLURM_JOB_ID": "9"}, script=tree / "taskprolog.py")
    assert proc.returncode == 0 and proc.stdout == ""
    assert "slurmgpu-taskprolog" in proc.stderr


def test_imports_only_the_standard_library() -> None:
    code = ("import sys, os\nos.environ['SLURM_JOB_ID'] = '1'\n"
            "sys.path.insert(0, sys.argv[1])\nimport slurmgpu.taskprolog as t\nt.main([])\n"
            "print(sorted(m for m in sys.modules if m.startswith('slurmgpu')"
            " or m in ('json', 'pathlib', 'typing', 're')))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True,
                          text=True, timeout=30, check=True)
    assert proc.stdout.splitlines()[-1] == "['slurmgpu', 'slurmgpu.jobfiles', 'slurmgpu.taskprolog']"
