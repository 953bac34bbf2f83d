"""What one test runs with: the tier's knobs, the node's GPUs, its platform, and its own
deadline (``run``/``start`` never outlive it; a tool still running then is a ``Hung``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurmgpu.config.schema import ValidateSettings
from slurmgpu.validate import runner
from slurmgpu.validate.floors import Floor, floor_for
from slurmgpu.validate.platform import SIM_MODULE, Platform


class NotApplicable(Exception):
    """The test cannot run here (its tool is missing, one GPU for a pair test, ...)."""


class Hung(Exception):
    """A tool of the test was still running at the test's deadline (its group was killed)."""


class ToolFailed(Exception):
    """A tool ended with an error and no output we can judge."""


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index
    model: str | None


@dataclass
class Context:
    settings: ValidateSettings
    tier: str
    gpus: list[Gpu]
    platform: Platform
    deadline: float  # time.monotonic()
    env: Mapping[str, str]
    runs: list[runner.ToolRun] = field(default_factory=list)

    # ---------------------------------------------------------------- the tier's knobs

    def knob(self, name: str) -> float:
        return float(getattr(self.settings, f"{self.tier}_{name}"))

    @property
    def burn_s(self) -> float:
        return self.knob("burn_s")

    # ---------------------------------------------------------------- GPUs

    def gpu_env(self) -> dict[str, str]:
        """The child's environment: only the selected GPUs, in NVML (PCI bus) order."""
        return {**self.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(str(g.index) for g in self.gpus)}

    def gpu(self, ordinal: int) -> Gpu:
        """The GPU a tool calls ``ordinal`` (its CUDA device number under ``gpu_env``)."""
        if not 0 <= ordinal < len(self.gpus):
            raise ToolFailed(f"a tool reported CUDA device {ordinal}; {len(self.gpus)} were visible")
        return self.gpus[ordinal]

    def need_gpus(self, least: int = 1) -> None:
        if len(self.gpus) < least:
            raise NotApplicable(f"needs {least} GPU{'s' if least > 1 else ''}; {len(self.gpus)} seen")

    def floors(self, metric: str) -> dict[str | None, Floor | None]:
        configured = getattr(self.settings, metric, None)
        models = {g.model for g in self.gpus} | {None}
        return {m: floor_for(configured, m, metric) for m in models}

    # ---------------------------------------------------------------- tools

    def need(self, tool: str) -> list[str]:
        argv = self.platform.tool(tool)
        if argv is None:
            raise NotApplicable(self.platform.describe(tool))
        return argv

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> runner.ToolRun:
        """Run to the end or the test's deadline; Hung at the deadline."""
        return self.checked(runner.run(argv, self.left(), env or self.gpu_env()))

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> runner.Running:
        started = runner.start(argv, env or self.gpu_env())
        if isinstance(started, runner.ToolRun):
            raise ToolFailed(started.error or "could not start")
        return started

    def checked(self, result: runner.ToolRun, *, overlapped: bool = False) -> runner.ToolRun:
        """``overlapped``: it ran alongside another counted run (a server): not counted
        in the test's time inside tools."""
        if not overlapped:
            self.runs.append(result)
        if result.timed_out:
            raise Hung(" ".join(result.argv))
        if result.error:
            raise ToolFailed(result.error)
        return result


def tool_name(argv: Sequence[str]) -> str:
    """The tool an argv runs (``python -m MODULE TOOL ...``: TOOL)."""
    if len(argv) > 3 and argv[1] == "-m":
        return argv[3] if argv[2] == SIM_MODULE else argv[2].rsplit(".", 1)[-1]
    if len(argv) > 2 and argv[1] == "-c":
        return "probe"
    return argv[0].rsplit("/", 1)[-1]


def failed(result: runner.ToolRun) -> ToolFailed:
    tail = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
    return ToolFailed(f"{tool_name(result.argv)} exited {result.rc}: {tail[:200]}")
