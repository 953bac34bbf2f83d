"""GPU presence and modes: gpu.count, gpu.lost, gpu.persistence, gpu.mig."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem
from slurmgpu.result import Finding, Severity


@check("gpu.count", severity=Severity.FAIL, reads=("nvml.device_count", "nvml.available"),
       summary="NVML works and the node has the expected number of GPUs (and every GPU a job asked for)")
def gpu_count(ctx: CheckContext) -> Iterator[Finding]:
    nvml, expected = ctx.facts.nvml, ctx.settings.gpu.count
    if not nvml.available:
        if expected or ctx.scope:
            yield problem(Severity.FAIL, f"{nvml.error}; expected {expected or len(ctx.scope or ())} GPUs")
        else:
            yield not_applicable(f"no GPUs expected here ({nvml.error})")
        return
    if expected is not None and nvml.device_count != expected:
        yield problem(Severity.FAIL, f"{nvml.device_count} GPUs present, {expected} expected",
                      present=nvml.device_count, expected=expected)
    missing = sorted(i for i in ctx.scope or () if i >= nvml.device_count)
    if missing:
        yield problem(Severity.FAIL, f"requested GPU(s) {missing} not present (node has {nvml.device_count})",
                      missing=missing)
    if (expected is None or nvml.device_count == expected) and not missing:
        yield ok(f"{nvml.device_count} GPUs present", present=nvml.device_count)


@check("gpu.lost", severity=Severity.FAIL, reads=("gpu.lost",),
       summary="no GPU answers NVML with GpuIsLost (fell off the bus)")
def gpu_lost(ctx: CheckContext) -> Iterator[Finding]:
    for gpu in ctx.gpus():
        if gpu.lost:
            yield problem(Severity.FAIL, "GPU is lost (fell off the bus); node needs a reboot", gpu=gpu.index)
        elif "handle" in gpu.errors:
            yield problem(Severity.FAIL, f"cannot get a handle: {gpu.errors['handle']}", gpu=gpu.index)


@check("gpu.persistence", severity=Severity.WARN, reads=("gpu.persistence_mode",),
       summary="persistence mode is on (when [gpu] persistence = true)")
def gpu_persistence(ctx: CheckContext) -> Iterator[Finding]:
    if not ctx.settings.gpu.persistence:
        yield not_applicable("persistence mode not required")
        return
    for gpu in ctx.live_gpus():
        if gpu.persistence_mode is False:
            yield problem(Severity.WARN, "persistence mode is off", gpu=gpu.index)


@check("gpu.mig", severity=Severity.FAIL, reads=("gpu.mig_current", "gpu.mig_pending"),
       summary="MIG mode matches [gpu] mig and no MIG change is pending")
def gpu_mig(ctx: CheckContext) -> Iterator[Finding]:
    want = ctx.settings.gpu.mig
    for gpu in ctx.live_gpus():
        if gpu.mig_current is None:
            continue
        if gpu.mig_pending is not None and gpu.mig_pending != gpu.mig_current:
            yield problem(Severity.FAIL, "MIG mode change pending: GPU reset needed", gpu=gpu.index)
        elif want != "any" and gpu.mig_current != (want == "enabled"):
            state = "enabled" if gpu.mig_current else "disabled"
            yield problem(Severity.FAIL, f"MIG is {state}, expected {want}", gpu=gpu.index)
