"""Heat and clocks: thermal.temperature, thermal.throttle."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, problem
from slurmgpu.facts import (
    CLOCKS_EVENT_HW_POWER_BRAKE,
    CLOCKS_EVENT_HW_SLOWDOWN,
    CLOCKS_EVENT_HW_THERMAL,
    CLOCKS_EVENT_NAMES,
    CLOCKS_EVENT_SW_THERMAL,
)
from slurmgpu.result import Finding, Severity

HW_THROTTLE = CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_THERMAL | CLOCKS_EVENT_HW_POWER_BRAKE


@check("thermal.temperature", severity=Severity.FAIL,
       reads=("gpu.temperature_c", "gpu.slowdown_temp_c"),
       summary="GPU temperature stays [thermal] margin_warn_c/margin_fail_c below its slowdown threshold")
def temperature(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.thermal
    for gpu in ctx.live_gpus():
        if gpu.temperature_c is None or gpu.slowdown_temp_c is None:
            continue
        margin = gpu.slowdown_temp_c - gpu.temperature_c
        text = f"{gpu.temperature_c} C, {margin} C below slowdown at {gpu.slowdown_temp_c} C"
        if margin <= cfg.margin_fail_c:
            yield problem(Severity.FAIL, text, gpu=gpu.index, margin_c=margin)
        elif margin <= cfg.margin_warn_c:
            yield problem(Severity.WARN, text, gpu=gpu.index, margin_c=margin)


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCKS_EVENT_NAMES.items() if mask & bit]


@check("thermal.throttle", severity=Severity.WARN, reads=("gpu.clocks_event_reasons",),
       summary="no active HW slowdown, HW/SW thermal slowdown or power brake (idle and SW power cap are normal)")
def throttle(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.thermal
    for gpu in ctx.live_gpus():
        mask = gpu.clocks_event_reasons
        if mask is None:
            continue
        if mask & HW_THROTTLE:
            names = reason_names(mask & HW_THROTTLE)
            yield problem(cfg.hw_throttle_severity, "clocks held down by " + ", ".join(names),
                          gpu=gpu.index, reasons=names, mask=mask)
        elif mask & CLOCKS_EVENT_SW_THERMAL:
            yield problem(cfg.sw_thermal_severity, "clocks held down by sw_thermal_slowdown",
                          gpu=gpu.index, reasons=["sw_thermal_slowdown"], mask=mask)
