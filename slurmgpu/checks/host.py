"""The layers around NVML (``HostFacts``): disks, the GPU services, the kernel module
against the NVML library, GPUDirect RDMA."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from slurmgpu.checks.registry import CheckContext, check, not_applicable, ok, problem, unknown
from slurmgpu.config.schema import free_threshold
from slurmgpu.facts import DiskState, HostFacts, ServiceState
from slurmgpu.result import Finding, Severity

NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
DMA_BUF_KERNEL = (5, 12)  # dma-buf GPUDirect RDMA: Linux 5.12+ with the open kernel module


def _size(size: float) -> str:
    return f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.0f} MiB"


@check("host.disk", severity=Severity.FAIL, reads=("host.disks",),
       summary="free space ([disk] free_min) and read-write mounts ([disk] writable) per path")
def host_disk(ctx: CheckContext) -> Iterator[Finding]:
    host = ctx.facts.host
    disks = [d for d in host.disks if d.error != "not found"]
    if not host.available or not disks:
        yield not_applicable("no configured path on this host")
        return
    bad = False
    for disk in disks:
        for finding in _disk_problems(ctx, disk):
            bad = True
            yield finding
    if not bad:
        yield ok(f"{len(disks)} paths writable with space", paths=[d.path for d in disks])


def _disk_problems(ctx: CheckContext, disk: DiskState) -> Iterator[Finding]:
    settings = ctx.settings.disk
    if disk.error:
        yield problem(Severity.WARN, f"{disk.path}: cannot read: {disk.error}", subject=disk.path)
        return
    if disk.read_only and disk.path in settings.writable:
        yield problem(Severity.FAIL, f"{disk.path} is mounted read-only", subject=disk.path)
    threshold = settings.free_min.get(disk.path)
    if threshold is None or disk.free_bytes is None or not disk.total_bytes:
        return
    least, unit = free_threshold(threshold)
    free_pct = 100.0 * disk.free_bytes / disk.total_bytes
    if (free_pct if unit == "%" else disk.free_bytes) < least:
        yield problem(settings.free_severity,
                      f"{disk.path}: {_size(disk.free_bytes)} free ({free_pct:.1f} %), below {threshold}",
                      subject=disk.path, free_bytes=disk.free_bytes, total_bytes=disk.total_bytes)


@check("nvml.driver_mismatch", severity=Severity.FAIL,
       reads=("host.kernel_module_version", "nvml.library_version", "nvml.init_error_code"),
       summary="the NVIDIA kernel module and the NVML library are one version (else: reboot after a driver upgrade)")
def driver_mismatch(ctx: CheckContext) -> Iterator[Finding]:
    kernel = ctx.facts.host.kernel_module_version
    nvml = ctx.facts.nvml
    refused = nvml.init_error_code == NVML_ERROR_LIB_RM_VERSION_MISMATCH
    library = nvml.library_version
    if kernel is None:
        yield not_applicable("no NVIDIA kernel module version (/proc/driver/nvidia/version)")
    elif refused or (library is not None and library != kernel):
        yield problem(Severity.FAIL, f"Driver/library version mismatch: kernel module {kernel}, "
                      f"NVML library {library or 'unknown'} (reboot, or reload the nvidia modules, "
                      "after a driver upgrade)", kernel_module=kernel, library=library)
    elif library is None:
        yield not_applicable("the NVML library does not say its version")
    else:
        yield ok(f"kernel module and NVML library {kernel}", version=kernel)


def _release(text: str | None) -> tuple[int, int]:
    parts = (text or "").split("-")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def dma_buf(host: HostFacts) -> bool:
    """GPUDirect RDMA through dma-buf: the open kernel module on Linux 5.12 or later."""
    return bool(host.open_kernel_module) and _release(host.kernel_release) >= DMA_BUF_KERNEL


@check("rdma.gpudirect", severity=Severity.FAIL, reads=("host.peermem_loaded", "host.open_kernel_module"),
       summary="with [rdma] gpudirect: nvidia_peermem is loaded or dma-buf works (open module, Linux 5.12+)")
def gpudirect(ctx: CheckContext) -> Iterator[Finding]:
    host = ctx.facts.host
    if not ctx.settings.rdma.gpudirect:
        yield not_applicable("[rdma] gpudirect is off")
    elif not host.available or host.kernel_module_text is None:
        yield not_applicable("no NVIDIA kernel module loaded")
    elif host.peermem_loaded:
        yield ok("nvidia_peermem loaded")
    elif dma_buf(host):
        yield ok(f"dma-buf: open kernel module on Linux {host.kernel_release}")
    else:
        module = "the open kernel module" if host.open_kernel_module else "the proprietary kernel module"
        yield problem(ctx.settings.rdma.gpudirect_severity,
                      f"GPUDirect RDMA unavailable: nvidia_peermem not loaded and no dma-buf ({module}, "
                      f"Linux {host.kernel_release or '?'}): modprobe nvidia_peermem",
                      kernel_release=host.kernel_release)


@check("host.services", severity=Severity.FAIL, reads=("host.services",),
       summary="nvidia-persistenced, nvidia-fabricmanager (NVSwitch), nvidia-imex (IMEX), [services] required: "
               "active, not crash-looping")
def services(ctx: CheckContext) -> Iterator[Finding]:
    host = ctx.facts.host
    if not host.available or host.kernel_module_text is None:
        yield not_applicable("no NVIDIA kernel module loaded")
        return
    if not host.systemd:
        yield not_applicable("systemd does not run this host")
        return
    if "services" in host.errors:
        yield unknown(host.errors["services"])
        return
    before = _previous_restarts(ctx)
    for state in host.services:
        yield from _service(state, before.get(state.name), ctx.settings.services.restarts_max)


_IMPACT = {"nvidia-fabricmanager": ": CUDA fails on every GPU of an NVSwitch system while it is down",
           "nvidia-imex": ": multi-node NVLink memory sharing fails while it is down"}


def _previous_restarts(ctx: CheckContext) -> dict[str, int]:
    previous = ctx.facts.previous
    if previous is None:
        return {}
    return {s.name: s.n_restarts for s in previous.host.services if s.n_restarts is not None}


def _service(state: ServiceState, before: int | None, restarts_max: int) -> Iterator[Finding]:
    name, restarts = state.name, state.n_restarts or 0
    data: dict[str, Any] = {"active_state": state.active_state, "sub_state": state.sub_state, "restarts": restarts}
    if state.load_state in ("not-found", "masked"):
        yield problem(Severity.FAIL, f"{name} is {state.load_state}", subject=name, **data)
    elif state.sub_state == "auto-restart" or (state.active_state == "activating" and restarts > 0):
        yield problem(Severity.FAIL, f"{name} is crash-looping ({restarts} restarts, last result "
                      f"{state.result or '?'})", subject=name, **data)
    elif state.active_state != "active":
        yield problem(Severity.FAIL, f"{name} is {state.active_state or '?'}/{state.sub_state or '?'} "
                      f"(result {state.result or '?'}){_IMPACT.get(name, '')}", subject=name, **data)
    elif before is not None and restarts > before:
        yield problem(Severity.FAIL, f"{name} restarted {restarts - before} times since the last poll "
                      f"(crash loop)", subject=name, **data)
    elif restarts >= restarts_max:
        yield problem(Severity.WARN, f"{name} active, restarted {restarts} times by systemd",
                      subject=name, **data)
    else:
        yield ok(f"{name} active", subject=name, **data)
