"""GPU interconnects: pcie.link, pcie.replay, nvlink.state, nvlink.errors, fabric.state."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, problem
from slurmgpu.facts import CLOCKS_EVENT_GPU_IDLE, FABRIC_STATE_COMPLETED, FabricInfo, GpuFacts
from slurmgpu.result import Finding, Severity

FABRIC_UNHEALTHY = 2
FABRIC_LIMITED = 3
# healthMask fields (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*): (shift, width mask, bad value).
# R550-R575 drivers have the mask but no summary; these are what the summary sums up.
_MASK_UNHEALTHY = ((4, 0x3, 1),)  # ROUTE_UNHEALTHY = TRUE
_MASK_LIMITED = ((0, 0x3, 1),)  # DEGRADED_BW = TRUE
_MASK_CONFIG_SHIFT, _MASK_CONFIG_WIDTH = 8, 0xF  # INCORRECT_CONFIGURATION: > 1 is wrong


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


@check("pcie.replay", severity=Severity.WARN, reads=("gpu.pcie_replay",),
       summary="PCIe replays per minute between two samples at or below [pcie] "
               "replay_rate_per_min_max (needs the agent's previous sample)")
def pcie_replay(ctx: CheckContext) -> Iterator[Finding]:
    cfg, previous = ctx.settings.pcie, ctx.facts.previous
    if previous is None:
        return
    minutes = (ctx.facts.collected_at - previous.collected_at) / 60.0
    for gpu in ctx.live_gpus():
        prev = previous.gpu(gpu.index)
        if minutes <= 0 or prev is None or gpu.pcie_replay is None or prev.pcie_replay is None:
            continue
        grown = gpu.pcie_replay - prev.pcie_replay
        if grown > 0 and grown / minutes > cfg.replay_rate_per_min_max:
            yield problem(cfg.replay_severity, f"{grown} PCIe replays in {minutes:.1f} min "
                          f"(max {cfg.replay_rate_per_min_max:g}/min)", gpu=gpu.index,
                          replays=grown, per_min=round(grown / minutes, 1))


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
        elif _fabric_health(fabric) == FABRIC_UNHEALTHY:
            yield problem(Severity.FAIL, "fabric health UNHEALTHY", gpu=gpu.index,
                          health_mask=fabric.health_mask)
        elif _fabric_health(fabric) == FABRIC_LIMITED:
            yield problem(Severity.WARN, "fabric health LIMITED_CAPACITY", gpu=gpu.index,
                          health_mask=fabric.health_mask)
    if not seen and not required:
        yield not_applicable("no GPU in scope reports fabric state (not an NVSwitch system)")


def _fabric_health(fabric: FabricInfo) -> int | None:
    """The health summary (v3 struct), else the same verdict from the v2 health mask."""
    if fabric.health_summary or fabric.health_mask is None:  # 0: summary NOT_SUPPORTED
        return fabric.health_summary
    mask = fabric.health_mask

    def bad(fields: tuple[tuple[int, int, int], ...]) -> bool:
        return any((mask >> shift) & width == value for shift, width, value in fields)

    config = (mask >> _MASK_CONFIG_SHIFT) & _MASK_CONFIG_WIDTH
    if bad(_MASK_UNHEALTHY) or config > 1:
        return FABRIC_UNHEALTHY
    return FABRIC_LIMITED if bad(_MASK_LIMITED) else None
