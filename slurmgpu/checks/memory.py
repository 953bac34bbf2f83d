"""GPU memory health: ecc.mode, ecc.uncorrected, ecc.corrected, ecc.sram, mem.retired_pages,
mem.row_remap."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.registry import CheckContext, check, not_applicable, problem
from slurmgpu.result import Finding, Severity


@check("ecc.mode", severity=Severity.FAIL, reads=("gpu.ecc_enabled", "gpu.ecc_pending"),
       summary="ECC is enabled (when [ecc] require_enabled) and no ECC mode change is pending")
def ecc_mode(ctx: CheckContext) -> Iterator[Finding]:
    for gpu in ctx.live_gpus():
        if gpu.ecc_enabled is None:
            continue
        if gpu.ecc_pending is not None and gpu.ecc_pending != gpu.ecc_enabled:
            yield problem(Severity.FAIL, "ECC mode change pending: GPU reset needed", gpu=gpu.index)
        elif ctx.settings.ecc.require_enabled and not gpu.ecc_enabled:
            yield problem(Severity.FAIL, "ECC is disabled", gpu=gpu.index)


@check("ecc.uncorrected", severity=Severity.FAIL, reads=("gpu.ecc",),
       summary="volatile uncorrected ECC errors at or below [ecc] uncorrected_volatile_max")
def ecc_uncorrected(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.ecc
    for gpu in ctx.live_gpus():
        counts = gpu.ecc
        if counts is None:
            continue
        vol = counts.uncorrected_volatile
        if vol is not None and vol > cfg.uncorrected_volatile_max:
            yield problem(Severity.FAIL, f"{vol} uncorrected ECC errors since last reset "
                          f"(max {cfg.uncorrected_volatile_max})", gpu=gpu.index, count=vol)
        agg = counts.uncorrected_aggregate
        if cfg.uncorrected_aggregate_max is not None and agg is not None and agg > cfg.uncorrected_aggregate_max:
            yield problem(Severity.WARN, f"{agg} uncorrected ECC errors over the GPU's lifetime "
                          f"(max {cfg.uncorrected_aggregate_max})", gpu=gpu.index, count=agg)


@check("ecc.corrected", severity=Severity.WARN, reads=("gpu.ecc", "previous.gpu.ecc"),
       summary="corrected ECC errors below [ecc] corrected_volatile_max and their rate per hour "
               "below corrected_rate_per_hour_max (rate needs a previous sample)")
def ecc_corrected(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.ecc
    prev = ctx.facts.previous
    for gpu in ctx.live_gpus():
        now = gpu.ecc.corrected_volatile if gpu.ecc else None
        if now is None:
            continue
        if now > cfg.corrected_volatile_max:
            yield problem(Severity.WARN, f"{now} corrected ECC errors since last reset "
                          f"(max {cfg.corrected_volatile_max})", gpu=gpu.index, count=now)
        before = prev.gpu(gpu.index) if prev else None
        if prev is None or before is None or before.ecc is None or before.ecc.corrected_volatile is None:
            continue
        hours = (ctx.facts.collected_at - prev.collected_at) / 3600.0
        delta = now - before.ecc.corrected_volatile
        if hours > 0 and delta > 0 and delta / hours > cfg.corrected_rate_per_hour_max:
            rate = delta / hours
            yield problem(Severity.WARN, f"corrected ECC errors rising at {rate:.0f}/hour "
                          f"(max {cfg.corrected_rate_per_hour_max:g})", gpu=gpu.index, rate_per_hour=rate)


@check("mem.retired_pages", severity=Severity.FAIL, reads=("gpu.retired_pages",),
       summary="no page retirement pending and retired pages at or below [memory] retired_pages_max "
               "(pre-Ampere GPUs)")
def retired_pages(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.memory
    seen = False
    for gpu in ctx.live_gpus():
        pages = gpu.retired_pages
        if pages is None:
            continue
        seen = True
        if pages.pending:
            yield problem(cfg.pending_severity, "page retirement pending: GPU reset needed", gpu=gpu.index)
        total = pages.single_bit + pages.double_bit
        if total > cfg.retired_pages_max:
            yield problem(Severity.FAIL, f"{total} retired pages ({pages.single_bit} SBE, {pages.double_bit} DBE; "
                          f"max {cfg.retired_pages_max}): replace the GPU", gpu=gpu.index, count=total)
    if not seen:
        yield not_applicable("no GPU in scope reports page retirement (Ampere+ uses row remapping)")


@check("mem.row_remap", severity=Severity.FAIL, reads=("gpu.remapped_rows",),
       summary="no row-remap failure, no remap pending, uncorrectable remapped rows at or below "
               "[memory] row_remap_uncorrectable_max (Ampere+)")
def row_remap(ctx: CheckContext) -> Iterator[Finding]:
    cfg = ctx.settings.memory
    seen = False
    for gpu in ctx.live_gpus():
        rows = gpu.remapped_rows
        if rows is None:
            continue
        seen = True
        if rows.failure:
            yield problem(Severity.FAIL, "row remapping failed (no spare rows): replace the GPU", gpu=gpu.index)
        if rows.pending:
            yield problem(cfg.pending_severity, "row remap pending: GPU reset needed", gpu=gpu.index)
        if rows.uncorrectable > cfg.row_remap_uncorrectable_max:
            yield problem(Severity.FAIL, f"{rows.uncorrectable} rows remapped for uncorrectable errors "
                          f"(max {cfg.row_remap_uncorrectable_max})", gpu=gpu.index, count=rows.uncorrectable)
    if not seen:
        yield not_applicable("no GPU in scope supports row remapping (pre-Ampere, or MIG enabled)")


@check("ecc.sram", severity=Severity.FAIL, reads=("gpu.sram_threshold_exceeded",),
       summary="SRAM ECC errors have not crossed the driver's field-diagnostic threshold "
               "(R550+; severity [ecc] sram_threshold_severity)")
def ecc_sram(ctx: CheckContext) -> Iterator[Finding]:
    seen = False
    for gpu in ctx.live_gpus():
        if gpu.sram_threshold_exceeded is None:
            continue
        seen = True
        if gpu.sram_threshold_exceeded:
            yield problem(ctx.settings.ecc.sram_threshold_severity,
                          "SRAM ECC error threshold exceeded: run field diagnostics (likely RMA)",
                          gpu=gpu.index, volatile_uncorrected=gpu.sram_uncorrected_volatile)
    if not seen:
        yield not_applicable("no GPU in scope reports SRAM ECC status")
