"""Reset one GPU of this node: refused while NVML lists any process on it (or cannot say),
else ``nvidia-smi -r -i N``; the outcome as a ``ResetOutcome``. Under the simulator
(``$SLURMGPU_SIM_SCENARIO``) the tool is ``python -m slurmgpu.sim.nvidia_smi``, which
applies the reset to the scenario. docs/admin-guide.md, "Return to service"."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmgpu.errors import SlurmGpuError

SIM_TOOL = "slurmgpu.sim.nvidia_smi"  # run as a program, never imported here
REAL_TOOL = "nvidia-smi"
#: The outcome's ``action``: done, refused (a process holds the GPU), or the tool failed.
RESET, REFUSED, FAILED = "reset", "refused", "failed"

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


class NvmlUnanswered(SlurmGpuError):
    """NVML could not say which processes are on the GPU (so nothing is reset)."""


@dataclass
class ResetOutcome:
    gpu: int
    action: str
    message: str
    processes: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    exit_code: int | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def reset_tool(environ: Mapping[str, str]) -> list[str]:
    """The argv prefix of ``nvidia-smi``: the simulator's when a scenario is set."""
    if environ.get("SLURMGPU_SIM_SCENARIO"):
        return [sys.executable, "-m", SIM_TOOL]
    return [shutil.which(REAL_TOOL, path=environ.get("PATH")) or f"/usr/bin/{REAL_TOOL}"]


def gpu_processes(index: int, library: str | None) -> list[int]:
    """PIDs of the compute and graphics processes NVML lists on GPU ``index``."""
    import pynvml

    if library and pynvml.nvmlLib is None:
        pynvml.nvmlLib = ctypes.CDLL(library)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnanswered(f"cannot list GPU {index}'s processes: nvmlInit: {exc}") from exc
    try:
        return _pids(pynvml, index)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _pids(nvml: Any, index: int) -> list[int]:
    try:
        count = nvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise NvmlUnanswered(f"no GPU {index} on this node (it has {count})")
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        procs = [*nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                 *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
    except nvml.NVMLError as exc:
        raise NvmlUnanswered(f"cannot list GPU {index}'s processes: {exc}") from exc
    return sorted({int(p.pid) for p in procs})


def _run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)


def reset_gpu(index: int, *, library: str | None, environ: Mapping[str, str] = os.environ,
              timeout_s: float = 120.0, runner: Runner = _run) -> ResetOutcome:
    """Refuse while a process is on GPU ``index``; else reset it with the tool."""
    pids = gpu_processes(index, library)
    if pids:
        return ResetOutcome(index, REFUSED, f"GPU {index} is in use by process(es) "
                            f"{', '.join(map(str, pids))}: not reset", processes=pids)
    argv = [*reset_tool(environ), "-r", "-i", str(index)]
    start = time.monotonic()
    try:
        done = runner(argv, timeout_s)
    except subprocess.TimeoutExpired:
        return ResetOutcome(index, FAILED, f"{argv[0]} -r did not finish in {timeout_s:g}s",
                            command=argv, duration_s=round(time.monotonic() - start, 3))
    except OSError as exc:
        return ResetOutcome(index, FAILED, f"cannot run {argv[0]}: {exc}", command=argv)
    return _judged(index, argv, done, time.monotonic() - start)


def _judged(index: int, argv: list[str], done: subprocess.CompletedProcess[str], took: float) -> ResetOutcome:
    lines = [ln.strip() for ln in f"{done.stdout}\n{done.stderr}".splitlines() if ln.strip()]
    message = lines[0] if lines else f"exit status {done.returncode}"
    action = RESET if done.returncode == 0 else FAILED
    return ResetOutcome(index, action, message, command=argv, exit_code=done.returncode,
                        duration_s=round(took, 3))
