"""GPU interconnects: pcie.link, nvlink.state, nvlink.errors, fabric.state."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, problem
from slurmgpu.facts import CLOCKS_EVENT_GPU_IDLE, FABRIC_STATE_COMPLETED, GpuFacts
from slurmgpu.result import Finding, Severity

FABRIC_UNHEALTHY = 2
FABRIC_LIMITED = 3


def _idle(gpu: GpuFacts) -> bool:
    return gpu.clocks_event_reasons is not None and bool(gpu.clocks_event_reasons & CLOCKS_EVENT_GPU_IDLE)


@check("pcie.link", severity=Severity.FAIL, reads=("gpu.pcie", "gpu.clocks_event_reasons"),
       summary="PCIe link width (and generation, when busy) at the device maximum (WARN) "
               "and at least the pinned [pcie] gen/width (FAIL)")
def pcie_link(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.pcie
    for gpu in ctx.live_gpus():
        link = gpu.pcie
        if link is None:
            continue
        # Idle GPUs drop to a lower PCIe generation to save power; that is not a fault.
        judge_gen = cfg.check_gen_when_idle or not _idle(gpu)
        cur_w, max_w, cur_g, max_g = link.width_current, link.width_max, link.gen_current, link.gen_max
        if cfg.width is not None and cur_w is not None and cur_w < cfg.width:
            yield problem(cfg.below_pin_severity, f"PCIe link x{cur_w}, pinned x{cfg.width}",
                          gpu=gpu.index, width=cur_w, expected=cfg.width)
        elif cur_w is not None and max_w is not None and cur_w < max_w:
            yield problem(cfg.downtrained_severity, f"PCIe link downtrained to x{cur_w} (max x{max_w})",
                          gpu=gpu.index, width=cur_w, max=max_w)
        if not judge_gen or cur_g is None:
            continue
        if cfg.gen is not None and cur_g < cfg.gen:
            yield problem(cfg.below_pin_severity, f"PCIe gen{cur_g}, pinned gen{cfg.gen}",
                          gpu=gpu.index, gen=cur_g, expected=cfg.gen)
        elif max_g is not None and cur_g < max_g:
            yield problem(cfg.downtrained_severity, f"PCIe link at gen{cur_g} while busy (max gen{max_g})",
                          gpu=gpu.index, gen=cur_g, max=max_g)


@check("nvlink.state", severity=Severity.FAIL, reads=("gpu.nvlinks",),
       summary="every NVLink is up, or at least [nvlink] links per GPU")
def nvlink_state(ctx: CheckContext) -> Iterator[Finding]:
    expected = ctx.settings.nvlink.links
    seen = False
    for gpu in ctx.live_gpus():
        if gpu.nvlinks is None:
            if expected:
                yield problem(Severity.FAIL, f"no NVLink reported, {expected} links expected", gpu=gpu.index)
            continue
        seen = True
        down = [link.link for link in gpu.nvlinks if not link.active]
        active = len(gpu.nvlinks) - len(down)
        if expected is not None and active < expected:
            which = f" (down: {down})" if down else f" (of {len(gpu.nvlinks)} reported)"
            yield problem(Severity.FAIL, f"{active} NVLinks active, {expected} expected{which}",
                          gpu=gpu.index, down=down)
        elif expected is None and down:
            yield problem(Severity.FAIL, f"NVLink(s) {down} down ({active}/{len(gpu.nvlinks)} active)",
                          gpu=gpu.index, down=down)
    if not seen and not expected:
        yield not_applicable("no GPU in scope has NVLink")


_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


@check("nvlink.errors", severity=Severity.WARN, reads=("gpu.nvlinks",),
       summary="NVLink replay/recovery/CRC counters at or below [nvlink] *_max")
def nvlink_errors(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.nvlink
    for gpu in ctx.live_gpus():
        for link in gpu.nvlinks or []:
            over = {}
            for name in _COUNTERS:
                value, limit = getattr(link, name), getattr(cfg, f"{name}_max")
                if value is not None and value > limit:
                    over[name] = value
            if over:
                text = ", ".join(f"{k} {v} (max {getattr(cfg, k + '_max')})" for k, v in over.items())
                yield problem(cfg.errors_severity, f"NVLink {link.link}: {text}", gpu=gpu.index,
                              link=link.link, counters=over)


@check("fabric.state", severity=Severity.FAIL, reads=("gpu.fabric",),
       summary="on NVSwitch systems (Hopper+), GPU fabric registration COMPLETED, status success, healthy")
def fabric_state(ctx: CheckContext) -> Iterator[Finding]:
    required = ctx.settings.fabric.required
    seen = False
    for gpu in ctx.live_gpus():
        fabric = gpu.fabric
        if fabric is None:
            if required:
                yield problem(Severity.FAIL, "no GPU fabric information, but [fabric] required = true",
                              gpu=gpu.index)
            continue
        seen = True
        if fabric.state != FABRIC_STATE_COMPLETED:
            yield problem(Severity.FAIL, f"fabric registration {fabric.state_name} "
                          "(is nvidia-fabricmanager running?)", gpu=gpu.index, state=fabric.state_name)
        elif fabric.status not in (None, 0):
            yield problem(Severity.FAIL, f"fabric registration failed with NVML status {fabric.status}",
                          gpu=gpu.index, status=fabric.status)
        elif fabric.health_summary == FABRIC_UNHEALTHY:
            yield problem(Severity.FAIL, "fabric health UNHEALTHY", gpu=gpu.index)
        elif fabric.health_summary == FABRIC_LIMITED:
            yield problem(Severity.WARN, "fabric health LIMITED_CAPACITY", gpu=gpu.index)
    if not seen and not required:
        yield not_applicable("no GPU in scope reports fabric state (not an NVSwitch system)")
