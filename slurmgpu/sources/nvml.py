"""GPU facts from NVML through nvidia-ml-py (import name ``pynvml``).

Every query goes through ``_Query``: NotSupported becomes ``None`` (not
applicable), GpuIsLost marks the GPU lost and stops querying it, and any other
NVML error is recorded in ``GpuFacts.errors`` under the fact's name.

pynvml dlopens ``libnvidia-ml.so.1`` itself only while ``pynvml.nvmlLib`` is
None, and caches function pointers for the life of the process; so the library
path (``SLURMGPU_NVML_LIBRARY`` or ``[nvml] library``) is loaded once per process
with ``ctypes.CDLL`` and assigned before ``nvmlInit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from slurmgpu.facts import (
    EccCounts,
    FabricInfo,
    GpuFacts,
    NvLink,
    NvmlFacts,
    PcieLink,
    RemappedRows,
    RetiredPages,
)

LIBRARY_ENV = "SLURMGPU_NVML_LIBRARY"
NVLINK_LINK_COUNT_FIELD = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
NO_LIBRARY = "NVIDIA driver not loaded / libnvidia-ml.so.1 not found"

T = TypeVar("T")


class _GpuLost(Exception):
    """NVML answered GpuIsLost: the GPU fell off the bus."""


def library_path(configured: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    return environ.get(LIBRARY_ENV) or configured or None


class _Query:
    """Runs NVML calls for one GPU, translating errors into facts."""

    def __init__(self, nvml: Any, gpu: GpuFacts) -> None:
        self.nvml = nvml
        self.gpu = gpu

    def __call__(self, fact: str, fn: Callable[..., T], *args: Any) -> T | None:
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError_NotSupported:
            return None
        except nvml.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except nvml.NVMLError as exc:
            self.gpu.errors[fact] = _describe(exc)
            return None


def _describe(exc: Exception) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ itself calls into the library
        return f"NVML error {getattr(exc, 'value', '?')}"


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{(code % 1000) // 10}"


class PynvmlSource:
    """The real NVML source."""

    def __init__(self, library: str | None = None, *, environ: Mapping[str, str] = os.environ):
        self.library = library_path(library, environ)

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        try:
            import pynvml
        except ImportError as exc:  # packaging problem, not a node problem
            return NvmlFacts(available=False, error=f"nvidia-ml-py is not installed: {exc}")
        error = self._init(pynvml)
        if error:
            return NvmlFacts(available=False, error=error)
        try:
            return self._collect(pynvml, gpus)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _init(self, nvml: Any) -> str | None:
        if self.library and nvml.nvmlLib is None:
            try:
                nvml.nvmlLib = ctypes.CDLL(self.library)
            except OSError as exc:
                return f"{NO_LIBRARY} (cannot load {self.library}: {exc})"
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound:
            return NO_LIBRARY
        except nvml.NVMLError_DriverNotLoaded:
            return "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)"
        except nvml.NVMLError as exc:
            return f"nvmlInit failed: {_describe(exc)}"
        return None

    def _collect(self, nvml: Any, wanted: frozenset[int] | None) -> NvmlFacts:
        facts = NvmlFacts(available=True)
        try:
            facts.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            facts.cuda_driver_version = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion_v2())
            facts.device_count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return NvmlFacts(available=False, error=f"NVML system query failed: {_describe(exc)}")
        indices = range(facts.device_count) if wanted is None else sorted(wanted)
        for index in indices:
            if index >= facts.device_count:
                continue  # gpu.count reports requested GPUs the node does not have
            facts.gpus.append(_collect_gpu(nvml, index))
        return facts


def _collect_gpu(nvml: Any, index: int) -> GpuFacts:
    gpu = GpuFacts(index=index)
    q = _Query(nvml, gpu)
    try:
        handle = q("handle", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return gpu
        _identity(nvml, q, gpu, handle)
        _modes(nvml, q, gpu, handle)
        _memory_health(nvml, q, gpu, handle)
        _thermal_power(nvml, q, gpu, handle)
        _links(nvml, q, gpu, handle)
    except _GpuLost:
        gpu.lost = True
    return gpu


def _identity(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    gpu.name = _text(q("name", nvml.nvmlDeviceGetName, h))
    gpu.uuid = _text(q("uuid", nvml.nvmlDeviceGetUUID, h))
    gpu.serial = _text(q("serial", nvml.nvmlDeviceGetSerial, h))
    pci = q("pci_bus_id", nvml.nvmlDeviceGetPciInfo, h)
    gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
    gpu.vbios = _text(q("vbios", nvml.nvmlDeviceGetVbiosVersion, h))


def _modes(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    persistence = q("persistence_mode", nvml.nvmlDeviceGetPersistenceMode, h)
    gpu.persistence_mode = None if persistence is None else bool(persistence)
    mig = q("mig", nvml.nvmlDeviceGetMigMode, h)
    if mig is not None:
        gpu.mig_current, gpu.mig_pending = bool(mig[0]), bool(mig[1])
    ecc = q("ecc_mode", nvml.nvmlDeviceGetEccMode, h)
    if ecc is not None:
        gpu.ecc_enabled, gpu.ecc_pending = bool(ecc[0]), bool(ecc[1])


def _memory_health(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    if gpu.ecc_enabled is not False:
        def count(kind: int, counter: int, name: str) -> int | None:
            return q(f"ecc.{name}", nvml.nvmlDeviceGetTotalEccErrors, h, kind, counter)

        corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        counts = EccCounts(
            corrected_volatile=count(corrected, volatile, "corrected_volatile"),
            corrected_aggregate=count(corrected, aggregate, "corrected_aggregate"),
            uncorrected_volatile=count(uncorrected, volatile, "uncorrected_volatile"),
            uncorrected_aggregate=count(uncorrected, aggregate, "uncorrected_aggregate"),
        )
        if any(v is not None for v in vars(counts).values()):
            gpu.ecc = counts
    pending = q("retired_pages", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if pending is not None:
        sbe = q("retired_pages", nvml.nvmlDeviceGetRetiredPages, h,
                nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) or []
        dbe = q("retired_pages", nvml.nvmlDeviceGetRetiredPages, h,
                nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) or []
        gpu.retired_pages = RetiredPages(single_bit=len(sbe), double_bit=len(dbe), pending=bool(pending))
    rows = q("remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        corr, unc, is_pending, failure = rows
        gpu.remapped_rows = RemappedRows(int(corr), int(unc), bool(is_pending), bool(failure))


def _thermal_power(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    gpu.temperature_c = q("temperature", nvml.nvmlDeviceGetTemperatureV, h, nvml.NVML_TEMPERATURE_GPU)
    gpu.slowdown_temp_c = q("slowdown_temp", nvml.nvmlDeviceGetTemperatureThreshold, h,
                            nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    gpu.shutdown_temp_c = q("shutdown_temp", nvml.nvmlDeviceGetTemperatureThreshold, h,
                            nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    power = q("power", nvml.nvmlDeviceGetPowerUsage, h)
    gpu.power_w = None if power is None else power / 1000.0
    limit = q("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    gpu.power_limit_w = None if limit is None else limit / 1000.0
    gpu.clocks_event_reasons = q("clocks_event_reasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, h)


def _links(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    pcie = PcieLink(
        gen_current=q("pcie", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        gen_max=q("pcie", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        width_current=q("pcie", nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        width_max=q("pcie", nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
    )
    gpu.pcie = pcie if any(v is not None for v in vars(pcie).values()) else None
    gpu.nvlinks = _nvlinks(nvml, q, h)
    gpu.fabric = _fabric(nvml, q, h)


def _nvlink_count(nvml: Any, q: _Query, h: Any) -> int | None:
    values = q("nvlink", nvml.nvmlDeviceGetFieldValues, h, [NVLINK_LINK_COUNT_FIELD])
    if values is None:
        return None
    field = values[0]
    if field.nvmlReturn == nvml.NVML_ERROR_GPU_IS_LOST:
        raise _GpuLost()
    if field.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    return int(_field_value(nvml, field))


def _field_value(nvml: Any, field: Any) -> float | int:
    by_type = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    return getattr(field.value, by_type.get(field.valueType, "ullVal"))


def _nvlinks(nvml: Any, q: _Query, h: Any) -> list[NvLink] | None:
    # The link count comes from field 91; NVML_NVLINK_MAX_LINKS exceeds real hardware.
    count = _nvlink_count(nvml, q, h)
    if count is None:
        return None
    links = []
    for link in range(count):
        state = q(f"nvlink[{link}].state", nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue  # this link index is not supported / not present

        def counter(kind: int, name: str, link: int = link) -> int | None:
            return q(f"nvlink[{link}].{name}", nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, kind)

        links.append(NvLink(
            link=link,
            active=bool(state),
            replay=counter(nvml.NVML_NVLINK_ERROR_DL_REPLAY, "replay"),
            recovery=counter(nvml.NVML_NVLINK_ERROR_DL_RECOVERY, "recovery"),
            crc_flit=counter(nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_flit"),
            crc_data=counter(nvml.NVML_NVLINK_ERROR_DL_CRC_DATA, "crc_data"),
        ))
    return links


def _fabric(nvml: Any, q: _Query, h: Any) -> FabricInfo | None:
    info = nvml.c_nvmlGpuFabricInfo_v3_t()
    if q("fabric", nvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info)) is None:
        return None
    if info.state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        return None
    completed = info.state == 3
    return FabricInfo(
        state=int(info.state),
        status=int(info.status) if completed else None,
        health_summary=int(info.healthSummary),
        clique_id=int(info.cliqueId) if completed else None,
    )
