"""Version pins: pin.driver, pin.cuda, pin.nccl, pin.vbios, pin.ib_firmware, pin.ofed.

A pin is a list of accepted versions (exact, glob or comparison). A pinned
version that cannot be found is off-pin too: a node without the pinned NCCL
cannot run the site's jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.checks.infiniband import ib_ports
from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem
from slurmgpu.config.versions_match import match_any
from slurmgpu.result import Finding, Severity


def _pin(ctx: CheckContext, what: str, actual: str | None, specs: list[str], *,
         missing: str = "not found", subject: str | None = None, gpu: int | None = None) -> Finding:
    if not specs:
        return not_applicable(f"{what} not pinned", subject=subject, gpu=gpu)
    accepted = " or ".join(specs)
    if actual is None:
        return problem(ctx.settings.pins.severity, f"{what} {missing}; pinned {accepted}",
                       subject=subject, gpu=gpu, expected=specs)
    if not match_any(actual, specs):
        return problem(ctx.settings.pins.severity, f"{what} {actual} is off-pin (pinned {accepted})",
                       subject=subject, gpu=gpu, actual=actual, expected=specs)
    return ok(f"{what} {actual}", subject=subject, gpu=gpu, actual=actual)


@check("pin.driver", severity=Severity.FAIL, reads=("nvml.driver_version",),
       summary="NVIDIA driver version matches [pins] driver")
def pin_driver(ctx: CheckContext) -> Iterator[Finding]:
    nvml = ctx.facts.nvml
    yield _pin(ctx, "NVIDIA driver", nvml.driver_version, ctx.settings.pins.driver,
               missing=f"version unknown ({nvml.error})" if nvml.error else "version unknown")


@check("pin.cuda", severity=Severity.FAIL,
       reads=("versions.cuda_toolkit", "versions.cuda_runtime", "nvml.cuda_driver_version"),
       summary="CUDA toolkit/runtime matches [pins] cuda; driver's CUDA version matches [pins] cuda_driver")
def pin_cuda(ctx: CheckContext) -> Iterator[Finding]:
    pins, versions = ctx.settings.pins, ctx.facts.versions
    toolkit = versions.cuda_toolkit or versions.cuda_runtime
    what = "CUDA runtime (libcudart)" if toolkit and not versions.cuda_toolkit else "CUDA toolkit"
    yield _pin(ctx, what, toolkit, pins.cuda,
               missing="not found (no /usr/local/cuda/version.json or libcudart)")
    if pins.cuda_driver:
        yield _pin(ctx, "driver's CUDA version", ctx.facts.nvml.cuda_driver_version, pins.cuda_driver)


@check("pin.nccl", severity=Severity.FAIL, reads=("versions.nccl",),
       summary="NCCL (libnccl.so.2 ncclGetVersion) matches [pins] nccl")
def pin_nccl(ctx: CheckContext) -> Iterator[Finding]:
    versions = ctx.facts.versions
    reason = versions.errors.get("nccl", "libnccl.so.2 not found")
    yield _pin(ctx, "NCCL", versions.nccl, ctx.settings.pins.nccl, missing=f"not found ({reason})")


@check("pin.vbios", severity=Severity.FAIL, reads=("gpu.vbios",),
       summary="every GPU's VBIOS matches [pins] vbios, and all GPUs share one VBIOS (WARN)")
def pin_vbios(ctx: CheckContext) -> Iterator[Finding]:
    gpus = [g for g in ctx.live_gpus() if g.vbios is not None]
    pins = ctx.settings.pins
    if pins.vbios:
        for gpu in gpus:
            finding = _pin(ctx, "VBIOS", gpu.vbios, pins.vbios, gpu=gpu.index)
            if finding.severity is not Severity.OK:
                yield finding
    found = sorted({g.vbios for g in gpus if g.vbios})
    if pins.vbios_uniform and len(found) > 1:
        by_version = {v: [g.index for g in gpus if g.vbios == v] for v in found}
        text = "; ".join(f"{v} on GPU {idx}" for v, idx in by_version.items())
        yield problem(Severity.WARN, f"GPUs run different VBIOS versions: {text}", versions=by_version)
    elif not pins.vbios and not found:
        yield not_applicable("VBIOS not pinned")


@check("pin.ib_firmware", severity=Severity.FAIL, reads=("ib.hcas.fw_ver",),
       summary="every InfiniBand HCA's firmware matches [pins] ib_firmware")
def pin_ib_firmware(ctx: CheckContext) -> Iterator[Finding]:
    specs = ctx.settings.pins.ib_firmware
    # The HCAs whose ports the IB checks judge (Ethernet-only NICs excluded by default).
    hcas = list({id(h): h for h, _ in ib_ports(ctx)}.values())
    if not specs or not hcas:
        yield not_applicable("IB firmware not pinned" if not specs else "no InfiniBand HCAs")
        return
    for hca in hcas:
        finding = _pin(ctx, "IB firmware", hca.fw_ver, specs, subject=hca.name)
        if finding.severity is not Severity.OK:
            yield finding


@check("pin.ofed", severity=Severity.FAIL, reads=("versions.ofed",),
       summary="the OFED / DOCA-OFED release matches [pins] ofed")
def pin_ofed(ctx: CheckContext) -> Iterator[Finding]:
    yield _pin(ctx, "OFED", ctx.facts.versions.ofed, ctx.settings.pins.ofed)
