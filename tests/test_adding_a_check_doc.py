"""docs/adding-a-check.md stays true: its built-in example registers as a built-in check and
its test passes, its config snippets load, and its site plugin builds with pip, is listed
with its source, passes its own test and runs on the simulated node."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.checks.registry import all_checks
from slurmgpu.config.load import parse_config

REPO = Path(__file__).resolve().parent.parent
DOC = (REPO / "docs" / "adding-a-check.md").read_text()
SLURMGPU = str(Path(sys.executable).parent / "slurmgpu")


def doc_files() -> dict[str, str]:
    """``<!-- file: PATH -->`` followed by a fenced block: PATH -> the block's text."""
    found = re.findall(r"<!-- file: (\S+)(?: \(append\))? -->\n```\w*\n(.*?)```", DOC, re.S)
    return dict(found)


def doc_command(start: str) -> list[str]:
    """The doc's shell command line starting with ``start``, split, comment dropped."""
    line = next(x for block in re.findall(r"```sh\n(.*?)```", DOC, re.S) for x in block.splitlines()
                if x.startswith(start))
    return [SLURMGPU if a == "slurmgpu" else a for a in shlex.split(line, comments=True)]


def test_the_built_in_example_registers_and_its_test_passes() -> None:
    files = doc_files()
    code = """
import json, sys, types
import slurmgpu.checks
from slurmgpu.checks.registry import all_checks
from tests import test_checks

check, test = json.loads(sys.argv[1])
module = types.ModuleType("slurmgpu.checks.power")  # as if imported from slurmgpu/checks/__init__.py
sys.modules[module.__name__] = module
exec(compile(check, "slurmgpu/checks/power.py", "exec"), module.__dict__)
names = dict(vars(test_checks))
exec(compile(test, "tests/test_checks.py", "exec"), names)
tests = [n for n in names if n.startswith("test_power")]
for name in tests:
    names[name]()
spec = next(s for s in all_checks() if s.id == "gpu.power_uniform")
print(json.dumps({"tests": tests, "source": spec.source}))
"""
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([files["slurmgpu/checks/power.py"],
                                                                   files["tests/test_checks.py"]])],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"tests": ["test_power_uniform_warns_for_the_odd_gpu"], "source": "built-in"}


def test_the_config_snippets_load() -> None:
    known = [c.id for c in all_checks()] + ["gpu.power_uniform"]  # the built-in example's id
    snippets = re.findall(r"<!-- config: [\w-]+ -->\n```toml\n(.*?)```", DOC, re.S)
    assert len(snippets) == 2
    for text in snippets:
        loaded = parse_config(text, known_checks=known)
        assert loaded.settings_for("gpu-h100-007").checks.disabled == []
        assert loaded.settings_for("login01").checks.disabled != []


@pytest.fixture
def plugin_site(tmp_path: Path) -> Path:
    """The doc's plugin project, written out and installed with pip into a target dir
    (the doc installs into slurmgpu's own environment; --target keeps the test's venv clean)."""
    for rel, text in doc_files().items():
        if rel.startswith("acme-gpu-checks/"):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                           str(tmp_path / "acme-gpu-checks")], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    offline = re.search(r"No matching distribution|Could not find a version|NewConnectionError", proc.stderr)
    if proc.returncode and offline and not os.environ.get("CI"):
        pytest.skip(f"pip cannot fetch the build backend here: {offline.group(0)}")
    assert proc.returncode == 0, proc.stderr
    return site


def test_the_plugin_example_installs_lists_and_passes_its_test(plugin_site: Path, sim_dir_env: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_site), str(REPO)])}
    listing = subprocess.run(doc_command("slurmgpu checks list")[:3], env=env, capture_output=True,
                             text=True, timeout=60, check=True).stdout.splitlines()
    assert "SOURCE" in listing[0]
    (line,) = [x for x in listing if x.startswith("site.")]
    assert line.split()[:2] == ["site.power_uniform", "WARN"] and "plugin acme (acme-gpu-checks 0.1)" in line

    pytest_run = doc_command("python -m pytest")
    proc = subprocess.run([sys.executable, *pytest_run[1:], "-q", "-p", "no:cacheprovider"], env=env,
                          cwd=plugin_site.parent, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr

    sim = subprocess.run(doc_command("slurmgpu sim run"), env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)
    assert sim.returncode == 0, sim.stderr
    assert re.search(r"^OK +site\.power_uniform +- +8 GPUs at 700 W$", sim.stdout, re.M), sim.stdout
