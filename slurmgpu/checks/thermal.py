"""Heat and clocks: thermal.temperature, thermal.throttle, thermal.clock_brake,
thermal.memory_temperature."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, problem
from slurmgpu.facts import (
    CLOCKS_EVENT_GPU_IDLE,
    CLOCKS_EVENT_HW_THROTTLE,
    CLOCKS_EVENT_SW_THERMAL,
    GpuFacts,
    clocks_event_names,
)
from slurmgpu.result import Finding, Severity


@check("thermal.temperature", severity=Severity.FAIL,
       reads=("gpu.temperature_c", "gpu.slowdown_temp_c"),
       summary="GPU temperature stays [thermal] margin_warn_c/margin_fail_c below its slowdown threshold")
def temperature(ctx: CheckContext) -> Iterator[Finding]:
    for gpu in ctx.live_gpus():
        if gpu.temperature_c is None or gpu.slowdown_temp_c is None:
            continue
        margin = gpu.slowdown_temp_c - gpu.temperature_c
        text = f"{gpu.temperature_c} C, {margin} C below slowdown at {gpu.slowdown_temp_c} C"
        yield from _margin(ctx, gpu, margin, text)


def _margin(ctx: CheckContext, gpu: GpuFacts, margin: int, text: str) -> Iterator[Finding]:
    """FAIL/WARN by how many degrees are left below a limit ([thermal] margins)."""
    cfg = ctx.settings.thermal
    if margin <= cfg.margin_fail_c:
        yield problem(Severity.FAIL, text, gpu=gpu.index, margin_c=margin)
    elif margin <= cfg.margin_warn_c:
        yield problem(Severity.WARN, text, gpu=gpu.index, margin_c=margin)


@check("thermal.throttle", severity=Severity.WARN, reads=("gpu.clocks_event_reasons",),
       summary="no active HW slowdown, HW/SW thermal slowdown or power brake (idle and SW power cap are normal)")
def throttle(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.thermal
    for gpu in ctx.live_gpus():
        mask = gpu.clocks_event_reasons
        if mask is None:
            continue
        if mask & CLOCKS_EVENT_HW_THROTTLE:
            names = clocks_event_names(mask & CLOCKS_EVENT_HW_THROTTLE)
            yield problem(cfg.hw_throttle_severity, "clocks held down by " + ", ".join(names),
                          gpu=gpu.index, reasons=names, mask=mask)
        elif mask & CLOCKS_EVENT_SW_THERMAL:
            yield problem(cfg.sw_thermal_severity, "clocks held down by sw_thermal_slowdown",
                          gpu=gpu.index, reasons=["sw_thermal_slowdown"], mask=mask)


# The HW slowdown family is a brake; SW power cap is normal under load and is not.
BRAKE = CLOCKS_EVENT_HW_THROTTLE


def braked(gpu: GpuFacts, fraction: float) -> bool:
    """HW slowdown / power brake active and the SM clock below ``fraction`` of its max."""
    mask, cur, top = gpu.clocks_event_reasons, gpu.sm_clock_mhz, gpu.sm_clock_max_mhz
    if mask is None or cur is None or not top:
        return False
    return bool(mask & BRAKE) and cur < fraction * top


# Violation counters that count a brake. "power" is left out: it also counts SW power
# cap, which is normal under a full load and must never fail a node.
_BRAKE_COUNTERS = ("thermal", "board_limit", "reliability")


def _throttled_s(gpu: GpuFacts, prev: GpuFacts) -> float:
    """Seconds held below application clocks between two samples by a brake-type limiter
    (NVML violation counters; they only grow)."""
    grown = [gpu.throttle_ns[k] - prev.throttle_ns[k] for k in _BRAKE_COUNTERS
             if k in gpu.throttle_ns and k in prev.throttle_ns]
    return max([g for g in grown if g > 0], default=0) / 1e9


@check("thermal.clock_brake", severity=Severity.FAIL,
       reads=("gpu.sm_clock_mhz", "gpu.sm_clock_max_mhz", "gpu.clocks_event_reasons", "gpu.throttle_ns"),
       summary="SM clock not held below [thermal] brake_fraction of its max by HW slowdown / "
               "power brake: one sample warns; two polls in a row (a one-shot check samples "
               "again after brake_resample_s), or brake_fail_s of throttle time between them, fail")
def clock_brake(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.thermal
    previous = ctx.facts.previous
    for gpu in ctx.live_gpus():
        if not braked(gpu, cfg.brake_fraction):
            continue
        prev = previous.gpu(gpu.index) if previous is not None else None
        # An idle GPU's clock is low anyway: a brake seen only then warns, never drains.
        idle = bool((gpu.clocks_event_reasons or 0) & CLOCKS_EVENT_GPU_IDLE)
        sustained = prev is not None and not idle and (
            braked(prev, cfg.brake_fraction) or _throttled_s(gpu, prev) >= cfg.brake_fail_s)
        names = clocks_event_names((gpu.clocks_event_reasons or 0) & BRAKE)
        text = (f"SM clock {gpu.sm_clock_mhz} of {gpu.sm_clock_max_mhz} MHz, held down by "
                f"{', '.join(names)}" + (" (sustained)" if sustained else " (one sample)"))
        yield problem(Severity.FAIL if sustained else Severity.WARN, text, gpu=gpu.index,
                      clock_mhz=gpu.sm_clock_mhz, max_mhz=gpu.sm_clock_max_mhz, reasons=names)


@check("thermal.memory_temperature", severity=Severity.FAIL,
       reads=("gpu.memory_temp_c", "gpu.memory_max_temp_c"),
       summary="HBM temperature stays [thermal] margin_warn_c/margin_fail_c below the memory's "
               "max operating temperature")
def memory_temperature(ctx: CheckContext) -> Iterator[Finding]:
    for gpu in ctx.live_gpus():
        if gpu.memory_temp_c is None or not gpu.memory_max_temp_c:
            continue
        margin = gpu.memory_max_temp_c - gpu.memory_temp_c
        text = f"HBM {gpu.memory_temp_c} C, {margin} C below its max {gpu.memory_max_temp_c} C"
        yield from _margin(ctx, gpu, margin, text)
