"""Where the tests' tools come from: ``NodePlatform`` (this node: the tools on $PATH or
configured, the built-in probe when CuPy or PyTorch is importable, the HCAs in sysfs) or
``SimPlatform`` (the simulator's scenario, ``$SLURMGPU_SIM_SCENARIO``: its ``active``
section says which tools exist, and each "tool" is ``python -m slurmgpu.sim.active
<tool>``, printing the real tool's output format). Either way a tool is an argv prefix
run through ``slurmgpu.validate.runner``, and its output goes through the same parser."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Protocol

from slurmgpu.config.schema import ValidateSettings

PROBE = "probe"
TOOLS = ("all_reduce_perf", "dcgmi", "ib_write_bw", "nvbandwidth", PROBE)
SIM_MODULE = "slurmgpu.sim.active"  # run as a program, never imported here
SYSFS_IB = "/sys/class/infiniband"


class Platform(Protocol):
    def tool(self, name: str) -> list[str] | None:
        """The argv prefix that runs tool ``name``; None when it is not installed."""

    def hcas(self) -> list[str]:
        """The node's InfiniBand HCAs with an active port, sorted."""

    def describe(self, name: str) -> str:
        """Why ``name`` is missing, for the not-applicable finding."""


def probe_backend() -> str | None:
    """"cupy" or "torch" when importable (not imported: no CUDA context here)."""
    for module in ("cupy", "torch"):
        if importlib.util.find_spec(module) is not None:
            return module
    return None


class NodePlatform:
    def __init__(self, settings: ValidateSettings, sysfs: str = SYSFS_IB) -> None:
        self.settings = settings
        self.sysfs = Path(sysfs)

    def _path(self, name: str) -> str | None:
        if name == "all_reduce_perf" and self.settings.nccl_tests_dir:
            candidate = Path(self.settings.nccl_tests_dir) / name
            return str(candidate) if os.access(candidate, os.X_OK) else None
        if name == "nvbandwidth" and self.settings.nvbandwidth:
            return self.settings.nvbandwidth if os.access(self.settings.nvbandwidth, os.X_OK) else None
        return shutil.which(name)

    def tool(self, name: str) -> list[str] | None:
        if name == PROBE:
            return self._probe()
        path = self._path(name)
        return [path] if path else None

    def _probe(self) -> list[str] | None:
        """slurmgpu's Python when it has CuPy or PyTorch; else ``probe_python``, which is
        handed this slurmgpu's package directory (it needs only the standard library)."""
        other = self.settings.probe_python
        if not other:
            return [sys.executable, "-m", "slurmgpu.validate.probe"] if probe_backend() else None
        if not os.access(other, os.X_OK):
            return None
        root = str(Path(__file__).resolve().parents[2])
        return [other, "-c", f"import sys; sys.path.insert(0, {root!r}); from slurmgpu.validate.probe import main; "
                "sys.exit(main(sys.argv[1:]))"]

    def hcas(self) -> list[str]:
        if not self.sysfs.is_dir():
            return []
        return sorted(p.name for p in self.sysfs.iterdir() if _active(p))

    def describe(self, name: str) -> str:
        if name == PROBE and self.settings.probe_python:
            return f"[validate] probe_python {self.settings.probe_python} is not an executable"
        if name == PROBE:
            return "neither CuPy nor PyTorch is installed (pip install slurmgpu[validate])"
        return f"{name} is not installed (not on $PATH)"


def _active(hca: Path) -> bool:
    try:
        return any("ACTIVE" in (port / "state").read_text() for port in (hca / "ports").iterdir())
    except OSError:
        return False


class SimPlatform:
    """The simulator's node: tools per the scenario's ``active`` section (no section, or
    no ``tools`` in it: every tool is installed)."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.active = _active_section(scenario)

    def tool(self, name: str) -> list[str] | None:
        if name not in self.active.get("tools", TOOLS):
            return None
        return [sys.executable, "-m", SIM_MODULE, name]

    def hcas(self) -> list[str]:
        return sorted(self.active.get("ib") or {})

    def describe(self, name: str) -> str:
        return f"{name} is not installed (simulated: not in the scenario's active.tools)"


def _active_section(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    active = data.get("active") if isinstance(data, dict) else None
    return active if isinstance(active, dict) else {}


def platform_for(settings: ValidateSettings, environ: dict[str, str] | None = None) -> Platform:
    """The simulator's when ``$SLURMGPU_SIM_SCENARIO`` is set, else this node's."""
    env = os.environ if environ is None else environ
    scenario = env.get("SLURMGPU_SIM_SCENARIO")
    return SimPlatform(scenario) if scenario else NodePlatform(settings)
