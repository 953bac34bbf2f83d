"""Fixtures and helpers for tests that drive the real pynvml against the fake libnvidia-ml.

tests/conftest.py star-imports this module. pynvml caches the loaded library and its
function pointers for the whole process, so anything that calls pynvml runs in a
subprocess (``run_pynvml``); the test process itself never loads the fake.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.build import SimToolchainError, build_library
from slurmgpu.sim.scenario import (
    ENV_LIBRARY,
    ENV_SCENARIO,
    load_scenario,
    write_scenario,
)

__all__ = [
    "PYNVML_PRELUDE",
    "ScenarioFactory",
    "bundled_scenario",
    "fake_nvml_lib",
    "run_pynvml",
    "scenario_file",
    "sim_dir_env",
    "sim_env",
    "write_scenario_atomic",
]

REPO_ROOT = Path(__file__).resolve().parent.parent

Mutator = Callable[[dict[str, Any]], object]  # changes the dict in place; return value ignored

#: Code run before a ``run_pynvml`` snippet: loads the fake via $SLURMGPU_NVML_LIBRARY and
#: defines ``N`` (pynvml), ``code_of(fn, *args)`` (the NVML error code, or None on success)
#: ``txt(bytes_or_str)`` and ``emit(obj)`` (print the JSON result line).
PYNVML_PRELUDE = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading, time
    import pynvml as N
    N.nvmlLib = ctypes.CDLL(os.environ["SLURMGPU_NVML_LIBRARY"])

    def code_of(fn, *args):
        try:
            fn(*args)
        except N.NVMLError as exc:
            return exc.value
        return None

    def txt(value):
        return value.decode() if isinstance(value, bytes) else value

    def emit(obj):
        print("RESULT " + json.dumps(obj), flush=True)
    """
)


def bundled_scenario(name: str) -> dict[str, Any]:
    """A deep copy of a bundled scenario, to mutate freely."""
    return copy.deepcopy(load_scenario(name))


def write_scenario_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write JSON via temp file + rename: a running fake sees the old or the new file."""
    return write_scenario(path, data)


def sim_env(lib: Path, scenario: Path | None, **extra: str) -> dict[str, str]:
    """os.environ plus the simulator variables (scenario None: SLURMGPU_SIM_SCENARIO unset)."""
    env = dict(os.environ)
    env[ENV_LIBRARY] = str(lib)
    env.pop(ENV_SCENARIO, None)
    if scenario is not None:
        env[ENV_SCENARIO] = str(scenario)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def run_pynvml(code: str, env: dict[str, str], *, timeout: float = 30) -> Any:
    """Run PYNVML_PRELUDE + code in a fresh interpreter; return what it ``emit``-ted."""
    proc = subprocess.run(
        [sys.executable, "-c", PYNVML_PRELUDE + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(
        f"subprocess emitted no result (rc={proc.returncode})\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


class ScenarioFactory:
    """Copies bundled scenarios into a tmp dir, mutated, and rewrites them atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(
        self,
        base: str = "h100-sxm-8",
        mutate: Mutator | None = None,
        *,
        filename: str = "scenario.json",
    ) -> Path:
        data = bundled_scenario(base)
        if mutate is not None:
            mutate(data)
        return write_scenario_atomic(self.directory / filename, data)

    def update(self, path: Path, mutate: Mutator) -> Path:
        """Re-read path, apply mutate (in place), write it back atomically (fault injection)."""
        data = json.loads(path.read_text(encoding="utf-8"))
        mutate(data)
        return write_scenario_atomic(path, data)


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1, built once per session into a tmp dir."""
    try:
        return build_library(tmp_path_factory.mktemp("fake-nvml"))
    except SimToolchainError as exc:
        if os.environ.get("CI"):  # CI installs the toolchain: a skip there would hide failures
            raise
        pytest.skip(f"cannot build the fake NVML library: {exc}")


@pytest.fixture
def scenario_file(tmp_path: Path) -> ScenarioFactory:
    """Factory: ``scenario_file("h100-sxm-8", mutate)`` -> Path of a tmp scenario copy."""
    return ScenarioFactory(tmp_path)


@pytest.fixture
def sim_dir_env(fake_nvml_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point $SLURMGPU_SIM_DIR at the session build, so default builds reuse it."""
    monkeypatch.setenv("SLURMGPU_SIM_DIR", str(fake_nvml_lib.parent))
    yield fake_nvml_lib
