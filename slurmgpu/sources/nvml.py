"""GPU facts from NVML through nvidia-ml-py (import name ``pynvml``).

Every query goes through ``_Query``: NotSupported and FunctionNotFound (a driver
older than the call) become ``None`` (not applicable), GpuIsLost marks the GPU lost and
stops querying it, and any other NVML error is recorded in ``GpuFacts.errors`` and
``GpuFacts.error_codes`` under the fact's name; ``gpu.nvml_errors`` judges them. A GPU
with errors is read once more after ``retry_delay_s``, so an error is known to persist
(or to have been transient) within one run.

Driver branches differ (docs/simulator.md has the table): fabric state is read through
the v3 struct (R580+), then v2 (R550+), then the v1 call (R535); the temperature through
``nvmlDeviceGetTemperatureV`` (R570+), then ``nvmlDeviceGetTemperature``; field ids a
branch does not know answer InvalidArgument and are not applicable.

pynvml dlopens ``libnvidia-ml.so.1`` itself only while ``pynvml.nvmlLib`` is
None, and caches function pointers for the life of the process; so the library
path the source is given (``settings.nvml.library``: ``[nvml] library`` or
``$SLURMGPU_NVML_LIBRARY``) is loaded once per process with ``ctypes.CDLL`` and assigned
before ``nvmlInit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable
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

NVLINK_LINK_COUNT_FIELD = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP (HBM)
PCIE_REPLAY_FIELD = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R570+)
RESET_STATUS_FIELD = 226  # NVML_FI_DEV_RESET_STATUS (R560; deprecated by 230): 1 = reset needed
DRAIN_RESET_STATUS_FIELD = 227  # NVML_FI_DEV_DRAIN_AND_RESET_STATUS (R560; deprecated by 230)
HEALTH_FIELDS = (NVLINK_LINK_COUNT_FIELD, MEMORY_TEMP_FIELD, PCIE_REPLAY_FIELD)
# The driver's reset verdict is only asked of drivers that define it (nvml.h NVML_FI_MAX):
# fields 226/227 from R560, 230 from R570; what an older driver answers to an unknown
# field id is not a health signal worth a risk.
RESET_STATUS_BRANCH = 560
RECOVERY_ACTION_BRANCH = 570
# nvmlPerfPolicyType_t of the throttle-time counters read.
VIOLATION_POLICIES = (("power", 0), ("thermal", 1), ("board_limit", 3), ("reliability", 5))
DEFAULT_RETRY_DELAY_S = 0.2
MAX_RETRY_DELAY_S = 2.0
NO_LIBRARY = "NVIDIA driver not loaded / libnvidia-ml.so.1 not found"

T = TypeVar("T")


class _GpuLost(Exception):
    """NVML answered GpuIsLost: the GPU fell off the bus."""


class _Older(Exception):
    """The driver is older than the call or struct (FunctionNotFound / version mismatch)."""


class QueryWatch:
    """Where a gather is: the GPU (None: the system) and query it last asked, when, and
    the facts gathered so far; ``slurmgpu.sources.deadline`` reads it from another thread."""

    def __init__(self) -> None:
        self.gpu: int | None = None
        self.query = ""
        self.since = time.monotonic()
        self.facts: NvmlFacts | None = None

    def at(self, gpu: int | None, query: str) -> None:
        self.gpu, self.query, self.since = gpu, query, time.monotonic()

    def pause(self, seconds: float) -> None:
        """The gather waits on purpose (the retry delay): the next query's clock starts after."""
        self.since = time.monotonic() + seconds


class _Query:
    """Runs NVML calls for one GPU, translating errors into facts."""

    def __init__(self, nvml: Any, gpu: GpuFacts, watch: QueryWatch | None = None) -> None:
        self.nvml = nvml
        self.gpu = gpu
        self.watch = watch or QueryWatch()

    def __call__(self, fact: str, fn: Callable[..., T] | None, *args: Any) -> T | None:
        try:
            return self.newer(fact, fn, *args)
        except _Older:
            return None  # this driver has no such call: not applicable

    def newer(self, fact: str, fn: Callable[..., T] | None, *args: Any) -> T | None:
        """As ``__call__``, but raises ``_Older`` where the driver lacks the call or the
        struct version, so the caller can fall back to the older API."""
        nvml = self.nvml
        if fn is None:  # an nvidia-ml-py older than the call
            raise _Older()
        self.watch.at(self.gpu.index, getattr(fn, "__name__", fact))
        try:
            return fn(*args)
        except nvml.NVMLError_NotSupported:
            return None
        except nvml.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_ArgumentVersionMismatch):
            raise _Older() from None
        except nvml.NVMLError as exc:
            self.record(fact, int(exc.value), _describe(exc))
            return None

    def record(self, fact: str, code: int, message: str) -> None:
        self.gpu.errors[fact] = message
        self.gpu.error_codes[fact] = code


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

    def __init__(self, library: str | None = None, *, retry_delay_s: float = DEFAULT_RETRY_DELAY_S):
        self.library = library or None  # (None: the linker finds libnvidia-ml.so.1)
        # Bounded: a config value of inf or nan must not hang or crash a gather.
        self.retry_delay_s = min(retry_delay_s, MAX_RETRY_DELAY_S) if retry_delay_s > 0 else 0.0
        self.init_error_code: int | None = None  # the last nvmlInit's failure
        self.watch = QueryWatch()

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        try:
            import pynvml
        except ImportError as exc:  # packaging problem, not a node problem
            return NvmlFacts(available=False, error=f"nvidia-ml-py is not installed: {exc}")
        error = self._init(pynvml)
        library_version = _library_version(pynvml)
        if error:
            return NvmlFacts(available=False, error=error, library_version=library_version,
                             init_error_code=self.init_error_code)
        try:
            facts = self._collect(pynvml, gpus)
            facts.library_version = library_version
            return facts
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _init(self, nvml: Any) -> str | None:
        self.init_error_code = None
        self.watch.facts = None
        self.watch.at(None, "nvmlInit")
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
            self.init_error_code = int(exc.value)
            return f"nvmlInit failed: {_describe(exc)}"
        return None

    def _collect(self, nvml: Any, wanted: frozenset[int] | None) -> NvmlFacts:
        facts = NvmlFacts(available=True)
        self.watch.at(None, "nvmlSystemGetDriverVersion")
        try:
            facts.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            facts.cuda_driver_version = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion_v2())
            facts.device_count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return NvmlFacts(available=False, error=f"NVML system query failed: {_describe(exc)}")
        indices = range(facts.device_count) if wanted is None else sorted(wanted)
        self.watch.facts = facts
        for index in indices:
            if index >= facts.device_count:
                continue  # gpu.count reports requested GPUs the node does not have
            facts.gpus.append(_collect_gpu(nvml, index, _fields_for(facts.driver_version), self.watch))
        facts.bus_ids = _bus_ids(nvml, facts, self.watch)
        self._retry_errors(nvml, facts)
        return facts

    def _retry_errors(self, nvml: Any, facts: NvmlFacts) -> None:
        """Read GPUs that answered with errors once more: an error on both reads persists
        (``retried``); one that answered the second time is ``transient_errors``."""
        failed = [i for i, g in enumerate(facts.gpus) if g.errors and not g.lost]
        if not failed or self.retry_delay_s <= 0:
            return
        self.watch.pause(self.retry_delay_s)
        time.sleep(self.retry_delay_s)
        for i in failed:
            first = facts.gpus[i]
            again = _collect_gpu(nvml, first.index, _fields_for(facts.driver_version), self.watch)
            again.retried = True
            again.transient_errors = {k: v for k, v in first.errors.items() if k not in again.errors}
            facts.gpus[i] = again


def _library_version(nvml: Any) -> str | None:
    """The loaded library's own version ("550.90.07" from "12.550.90.07"); it answers
    without nvmlInit, so a library that refuses the kernel module still says it."""
    try:
        text = str(_text(nvml.nvmlSystemGetNVMLVersion()))
    except Exception:  # no library loaded, or one too old to say
        return None
    parts = text.split(".")
    return ".".join(parts[1:]) if len(parts) == 4 else text


def _bus_ids(nvml: Any, facts: NvmlFacts, watch: QueryWatch) -> list[str]:
    """Every GPU's PCI bus id: the collected GPUs' own, one query each for the others."""
    known = {g.index: g.pci_bus_id or "" for g in facts.gpus}
    return [known[i] if i in known else _bus_id(nvml, i, watch) for i in range(facts.device_count)]


def _bus_id(nvml: Any, index: int, watch: QueryWatch) -> str:
    watch.at(index, "nvmlDeviceGetPciInfo")
    try:
        return _text(nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(index)).busId) or ""
    except nvml.NVMLError:
        return ""


def driver_branch(version: str | None) -> int | None:
    """535 from "535.183.01"; None when unknown."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _fields_for(driver_version: str | None) -> tuple[int, ...]:
    branch = driver_branch(driver_version)
    if branch is not None and branch >= RECOVERY_ACTION_BRANCH:
        return (*HEALTH_FIELDS, RECOVERY_ACTION_FIELD)
    if branch is not None and branch >= RESET_STATUS_BRANCH:
        return (*HEALTH_FIELDS, RESET_STATUS_FIELD, DRAIN_RESET_STATUS_FIELD)
    return HEALTH_FIELDS


def _collect_gpu(nvml: Any, index: int, field_ids: tuple[int, ...] = HEALTH_FIELDS,
                 watch: QueryWatch | None = None) -> GpuFacts:
    gpu = GpuFacts(index=index)
    q = _Query(nvml, gpu, watch)
    try:
        handle = q("handle", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return gpu
        _identity(nvml, q, gpu, handle)
        _modes(nvml, q, gpu, handle)
        _memory_health(nvml, q, gpu, handle)
        _sram(nvml, q, gpu, handle)
        _thermal_power(nvml, q, gpu, handle)
        fields = _fields(nvml, q, handle, field_ids)
        _health_fields(gpu, fields)
        _links(nvml, q, gpu, handle, fields.get(NVLINK_LINK_COUNT_FIELD))
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


def _temperature(nvml: Any, q: _Query, h: Any) -> int | None:
    try:
        return q.newer("temperature", getattr(nvml, "nvmlDeviceGetTemperatureV", None), h,
                       nvml.NVML_TEMPERATURE_GPU)
    except _Older:  # before R570: the deprecated call is the only one
        return q("temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)


def _clock_reasons(nvml: Any, q: _Query, h: Any) -> int | None:
    try:
        return q.newer("clocks_event_reasons", getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None), h)
    except _Older:  # before R535: the same mask under its older name
        return q("clocks_event_reasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)


def _thermal_power(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    gpu.temperature_c = _temperature(nvml, q, h)
    gpu.slowdown_temp_c = q("slowdown_temp", nvml.nvmlDeviceGetTemperatureThreshold, h,
                            nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    gpu.shutdown_temp_c = q("shutdown_temp", nvml.nvmlDeviceGetTemperatureThreshold, h,
                            nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    gpu.memory_max_temp_c = q("memory_max_temp", nvml.nvmlDeviceGetTemperatureThreshold, h,
                              nvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    power = q("power", nvml.nvmlDeviceGetPowerUsage, h)
    gpu.power_w = None if power is None else power / 1000.0
    limit = q("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    gpu.power_limit_w = None if limit is None else limit / 1000.0
    gpu.clocks_event_reasons = _clock_reasons(nvml, q, h)
    gpu.sm_clock_mhz = q("sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
    gpu.sm_clock_max_mhz = q("sm_clock_max", nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM)
    for name, policy in VIOLATION_POLICIES:
        got = q(f"throttle_time.{name}", nvml.nvmlDeviceGetViolationStatus, h, policy)
        if got is not None:
            gpu.throttle_ns[name] = int(got.violationTime)


def _sram(nvml: Any, q: _Query, gpu: GpuFacts, h: Any) -> None:
    struct = getattr(nvml, "c_nvmlEccSramErrorStatus_v1_t", None)
    if struct is None:  # nvidia-ml-py older than R550
        return
    status = struct()
    if q("sram_ecc", nvml.nvmlDeviceGetSramEccErrorStatus, h, ctypes.byref(status)) is None:
        return
    gpu.sram_threshold_exceeded = bool(status.bThresholdExceeded)
    gpu.sram_uncorrected_volatile = int(status.volatileUncParity) + int(status.volatileUncSecDed)


def _links(nvml: Any, q: _Query, gpu: GpuFacts, h: Any, nvlink_count: int | None) -> None:
    pcie = PcieLink(
        gen_current=q("pcie", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        gen_max=q("pcie", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        width_current=q("pcie", nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        width_max=q("pcie", nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
    )
    gpu.pcie = pcie if any(v is not None for v in vars(pcie).values()) else None
    gpu.nvlinks = _nvlinks(nvml, q, h, nvlink_count)
    gpu.fabric = _fabric(nvml, q, h)


_FIELD_FACTS = {NVLINK_LINK_COUNT_FIELD: "nvlink", MEMORY_TEMP_FIELD: "memory_temp",
                PCIE_REPLAY_FIELD: "pcie_replay", RECOVERY_ACTION_FIELD: "recovery_action",
                RESET_STATUS_FIELD: "recovery_action", DRAIN_RESET_STATUS_FIELD: "recovery_action"}


def _fields(nvml: Any, q: _Query, h: Any, field_ids: tuple[int, ...]) -> dict[int, int]:
    """The scalar health fields in one call: field id -> value, for those the GPU answered.
    NotSupported, and InvalidArgument (a field id newer than the driver), are not
    applicable; other per-field errors are recorded like a failed query."""
    values = q("fields", nvml.nvmlDeviceGetFieldValues, h, list(field_ids))
    out: dict[int, int] = {}
    for field in values or []:
        rc, fid = int(field.nvmlReturn), int(field.fieldId)
        if rc == nvml.NVML_SUCCESS:
            out[fid] = int(_field_value(nvml, field))
        elif rc == nvml.NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost()
        elif rc not in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
            q.record(_FIELD_FACTS.get(fid, f"field:{fid}"), rc, _error_text(nvml, rc))
    return out


def _health_fields(gpu: GpuFacts, fields: dict[int, int]) -> None:
    gpu.memory_temp_c = fields.get(MEMORY_TEMP_FIELD)
    gpu.pcie_replay = fields.get(PCIE_REPLAY_FIELD)
    gpu.recovery_action = fields.get(RECOVERY_ACTION_FIELD, _reset_status(fields))


def _reset_status(fields: dict[int, int]) -> int | None:
    """R560's two flags as the recovery action R570 names: DRAIN_AND_RESET (4), GPU_RESET (1)
    or NONE (0); None where the driver answered neither."""
    if fields.get(DRAIN_RESET_STATUS_FIELD):
        return 4
    if fields.get(RESET_STATUS_FIELD):
        return 1
    if RESET_STATUS_FIELD in fields or DRAIN_RESET_STATUS_FIELD in fields:
        return 0
    return None


def _error_text(nvml: Any, code: int) -> str:
    try:
        return _text(nvml.nvmlErrorString(code))
    except Exception:
        return f"NVML error {code}"


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


def _nvlinks(nvml: Any, q: _Query, h: Any, count: int | None) -> list[NvLink] | None:
    # The link count comes from field 91; NVML_NVLINK_MAX_LINKS exceeds real hardware.
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
    """v3 struct (health summary, R580+) -> v2 (health mask, R550+) -> v1 call (R535)."""
    for version, name in ((3, "c_nvmlGpuFabricInfo_v3_t"), (2, "c_nvmlGpuFabricInfo_v2_t")):
        struct = getattr(nvml, name, None)
        if struct is None:
            continue
        info = struct()
        try:
            if q.newer("fabric", nvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info)) is None:
                return None
        except _Older:
            continue
        return _fabric_info(info, version)
    info = nvml.c_nvmlGpuFabricInfo_t()
    if q("fabric", nvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info)) is None:
        return None
    return _fabric_info(info, 1)


def _fabric_info(info: Any, version: int) -> FabricInfo | None:
    if info.state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        return None
    completed = info.state == 3
    return FabricInfo(
        state=int(info.state),
        status=int(info.status) if completed else None,
        health_summary=int(info.healthSummary) if version >= 3 else None,
        clique_id=int(info.cliqueId) if completed else None,
        health_mask=int(info.healthMask) if version >= 2 else None,
        struct_version=version,
    )
