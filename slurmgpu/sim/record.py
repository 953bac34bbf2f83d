"""Capture a node's NVML state as a simulator scenario (the format in docs/simulator.md).

Run on a real GPU node (``slurmgpu sim record``) to get a fixture; run under the fake to
check the round trip. NotSupported leaves the key out, GpuIsLost records ``"lost": true``,
any other error is recorded under the GPU's (or the top level's) ``"errors"`` with the C
symbol that failed, so replaying the scenario reproduces it.

When a C function is called several times for one key (four thresholds, 18 NVLinks) and any
call fails with a real error, the whole key is left out: replay then fails every such call,
and recording the replay gives the same scenario.

The node's capability profile is recorded too: a function the driver lacks
(FunctionNotFound) goes into the top-level ``"missing_functions"`` (the fake answers
FunctionNotFound for it), and an older fabric struct shows as a fabric entry without
``"health_summary"`` (v2) or without ``"health_mask"`` (the v1 call).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Callable
from typing import Any

from slurmgpu.errors import SimError
from slurmgpu.sim.hostroot import record_host
from slurmgpu.sim.scenario import ENV_LIBRARY

_FIELD_NVLINK_LINK_COUNT = 91
_NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
_THRESHOLDS = (("shutdown", 0), ("slowdown", 1), ("mem_max", 2), ("gpu_max", 3))
_CLOCKS = (("graphics", 0), ("sm", 1), ("mem", 2))
_VIOLATIONS = (("power", 0), ("thermal", 1), ("board_limit", 3), ("reliability", 5))
_FIELD_MEMORY_TEMP, _FIELD_RECOVERY_ACTION = 82, 230
_SRAM_KEYS = (
    ("aggregate_unc_parity", "aggregateUncParity"), ("aggregate_unc_sec_ded", "aggregateUncSecDed"),
    ("aggregate_cor", "aggregateCor"), ("volatile_unc_parity", "volatileUncParity"),
    ("volatile_unc_sec_ded", "volatileUncSecDed"), ("volatile_cor", "volatileCor"),
    ("aggregate_unc_bucket_l2", "aggregateUncBucketL2"), ("aggregate_unc_bucket_sm", "aggregateUncBucketSm"),
    ("aggregate_unc_bucket_pcie", "aggregateUncBucketPcie"),
    ("aggregate_unc_bucket_mcu", "aggregateUncBucketMcu"),
    ("aggregate_unc_bucket_other", "aggregateUncBucketOther"),
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Missing:
    """NotSupported: leave the key out."""


MISSING = _Missing()


class _Lost(Exception):
    """The GPU answered GpuIsLost."""


class _Failed(Exception):
    """A call failed with an error other than NotSupported/GpuIsLost."""

    def __init__(self, symbol: str, code: int) -> None:
        super().__init__(symbol, code)
        self.symbol = symbol
        self.code = code


def load_nvml() -> Any:
    """Import pynvml, pointing it at $SLURMGPU_NVML_LIBRARY when that is set."""
    import pynvml

    path = os.environ.get(ENV_LIBRARY)
    if path and pynvml.nvmlLib is None:
        try:
            pynvml.nvmlLib = ctypes.CDLL(path)
        except OSError as exc:
            raise SimError(f"cannot load {ENV_LIBRARY}={path}: {exc}") from exc
    return pynvml


class _Recorder:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.missing: set[str] = set()  # functions this driver lacks (FunctionNotFound)

    def call(self, symbol: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """fn(*args); NotSupported -> MISSING; FunctionNotFound -> MISSING and the symbol
        in ``missing``; GpuIsLost -> _Lost; other errors -> _Failed."""
        nvml = self.nvml
        if fn is None:  # an nvidia-ml-py without the call: nothing to record
            return MISSING
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return MISSING
            if exc.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                self.missing.add(symbol)
                return MISSING
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from exc
            raise _Failed(symbol, int(exc.value)) from exc

    # -- one key per method; each returns a JSON value or MISSING ---------------------

    def pci(self, h: Any) -> Any:
        info = self.call("nvmlDeviceGetPciInfo_v3", self.nvml.nvmlDeviceGetPciInfo_v3, h)
        if info is MISSING:
            return MISSING
        return {
            "bus_id": _text(info.busId),
            "pci_device_id": f"0x{info.pciDeviceId:08X}",
            "pci_subsystem_id": f"0x{info.pciSubSystemId:08X}",
        }

    def pair(self, symbol: str, fn: Callable[..., Any], h: Any) -> Any:
        got = self.call(symbol, fn, h)
        if got is MISSING:
            return MISSING
        return {"current": int(got[0]), "pending": int(got[1])}

    def ecc(self, h: Any) -> Any:
        nvml = self.nvml
        out: dict[str, Any] = {}
        for kind, etype in (("corrected", 0), ("uncorrected", 1)):
            counts = {}
            for counter, ctype in (("volatile", 0), ("aggregate", 1)):
                v = self.call(
                    "nvmlDeviceGetTotalEccErrors", nvml.nvmlDeviceGetTotalEccErrors, h, etype, ctype
                )
                if v is not MISSING:
                    counts[counter] = int(v)
            if counts:
                out[kind] = counts
        return out or MISSING

    def retired_pages(self, h: Any) -> Any:
        nvml = self.nvml
        out: dict[str, Any] = {}
        for key, cause in (("sbe", 0), ("dbe", 1)):
            pages = self.call("nvmlDeviceGetRetiredPages", nvml.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not MISSING:
                out[key] = [int(p) for p in pages]
        pending = self.call(
            "nvmlDeviceGetRetiredPagesPendingStatus", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h
        )
        if pending is not MISSING:
            out["pending"] = int(pending)
        return out or MISSING

    def remapped_rows(self, h: Any) -> Any:
        got = self.call("nvmlDeviceGetRemappedRows", self.nvml.nvmlDeviceGetRemappedRows, h)
        if got is MISSING:
            return MISSING
        corr, unc, pending, failure = (int(x) for x in got)
        return {"correctable": corr, "uncorrectable": unc, "pending": pending, "failure": failure}

    def temperature(self, h: Any) -> Any:
        nvml = self.nvml
        got = self.call("nvmlDeviceGetTemperatureV", getattr(nvml, "nvmlDeviceGetTemperatureV", None),
                        h, nvml.NVML_TEMPERATURE_GPU)
        if got is not MISSING or "nvmlDeviceGetTemperatureV" not in self.missing:
            return got
        # drivers before TemperatureV (R570)
        return self.call(
            "nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
        )

    def thresholds(self, h: Any) -> Any:
        out = {}
        for key, which in _THRESHOLDS:
            v = self.call(
                "nvmlDeviceGetTemperatureThreshold", self.nvml.nvmlDeviceGetTemperatureThreshold, h, which
            )
            if v is not MISSING:
                out[key] = int(v)
        return out or MISSING

    def clocks_event_reasons(self, h: Any) -> Any:
        nvml = self.nvml
        symbol = "nvmlDeviceGetCurrentClocksEventReasons"
        got = self.call(symbol, getattr(nvml, symbol, None), h)
        if got is not MISSING or symbol not in self.missing:
            return got
        return self.call(
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
            h,
        )

    def pcie(self, h: Any) -> Any:
        nvml = self.nvml
        out = {}
        for key, name in (
            ("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            v = self.call(name, getattr(nvml, name), h)
            if v is not MISSING:
                out[key] = int(v)
        return out or MISSING

    def nvlink_count(self, h: Any) -> Any:
        return self.field(h, _FIELD_NVLINK_LINK_COUNT)

    def nvlink(self, h: Any, errors: dict[str, int]) -> Any:
        """The link list; per-function failures go to ``errors`` and drop that key on all links."""
        nvml = self.nvml
        count = self.nvlink_count(h)
        if count is MISSING:
            return MISSING
        links: list[dict[str, Any]] = [{} for _ in range(count)]
        for key, symbol in (("state", "nvmlDeviceGetNvLinkState"), ("version", "nvmlDeviceGetNvLinkVersion")):
            try:
                for i, link in enumerate(links):
                    v = self.call(symbol, getattr(nvml, symbol), h, i)
                    if v is not MISSING:
                        link[key] = int(v)
            except _Failed as exc:
                errors[exc.symbol] = exc.code
                for link in links:
                    link.pop(key, None)
        try:
            for i, link in enumerate(links):
                counters = {}
                for c, name in enumerate(_NVLINK_COUNTERS):
                    v = self.call(
                        "nvmlDeviceGetNvLinkErrorCounter", nvml.nvmlDeviceGetNvLinkErrorCounter, h, i, c
                    )
                    if v is not MISSING:
                        counters[name] = int(v)
                if counters:
                    link["errors"] = counters
        except _Failed as exc:
            errors[exc.symbol] = exc.code
            for link in links:
                link.pop("errors", None)
        return links

    def fabric(self, h: Any) -> Any:
        """v3 struct, else v2 (no health summary), else the v1 call (no health mask)."""
        nvml = self.nvml
        for version, struct in ((3, "c_nvmlGpuFabricInfo_v3_t"), (2, "c_nvmlGpuFabricInfo_v2_t")):
            info = getattr(nvml, struct)()
            try:
                got = self.call("nvmlDeviceGetGpuFabricInfoV", nvml.nvmlDeviceGetGpuFabricInfoV, h,
                                ctypes.byref(info))
            except _Failed as exc:
                if exc.code != nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                    raise
                continue  # a driver without this struct version: try the older one
            if got is MISSING and "nvmlDeviceGetGpuFabricInfoV" in self.missing:
                break  # R535: only the v1 call
            return MISSING if got is MISSING else _fabric_json(info, version)
        info = nvml.c_nvmlGpuFabricInfo_t()
        got = self.call("nvmlDeviceGetGpuFabricInfo", nvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info))
        return MISSING if got is MISSING else _fabric_json(info, 1)

    def field(self, h: Any, field_id: int) -> Any:
        """One scalar field value; InvalidArgument (a field newer than the driver) -> MISSING."""
        nvml = self.nvml
        values = self.call("nvmlDeviceGetFieldValues", nvml.nvmlDeviceGetFieldValues, h, [field_id])
        if values is MISSING:
            return MISSING
        rc = int(values[0].nvmlReturn)
        if rc in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
            return MISSING
        if rc == nvml.NVML_ERROR_GPU_IS_LOST:
            raise _Lost
        if rc != nvml.NVML_SUCCESS:
            raise _Failed(f"field:{field_id}", rc)
        value = values[0]
        if int(value.valueType) == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
            return int(value.value.ullVal)
        return int(value.value.uiVal)

    def clocks(self, h: Any, symbol: str) -> Any:
        out = {}
        for key, which in _CLOCKS:
            v = self.call(symbol, getattr(self.nvml, symbol), h, which)
            if v is not MISSING:
                out[key] = int(v)
        return out or MISSING

    def violations(self, h: Any) -> Any:
        out = {}
        for key, policy in _VIOLATIONS:
            v = self.call("nvmlDeviceGetViolationStatus", self.nvml.nvmlDeviceGetViolationStatus, h, policy)
            if v is not MISSING:
                out[key] = int(v.violationTime)
        return out or MISSING

    def sram_ecc(self, h: Any) -> Any:
        struct = getattr(self.nvml, "c_nvmlEccSramErrorStatus_v1_t", None)
        if struct is None:
            return MISSING
        status = struct()
        got = self.call("nvmlDeviceGetSramEccErrorStatus", self.nvml.nvmlDeviceGetSramEccErrorStatus, h,
                        ctypes.byref(status))
        if got is MISSING:
            return MISSING
        out = {key: int(getattr(status, attr)) for key, attr in _SRAM_KEYS}
        out["threshold_exceeded"] = int(status.bThresholdExceeded)
        return out

    def memory(self, h: Any) -> Any:
        mem = self.call("nvmlDeviceGetMemoryInfo", self.nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is MISSING:
            return MISSING
        return {"total": int(mem.total), "free": int(mem.free), "used": int(mem.used)}

    # -- a whole GPU ------------------------------------------------------------------

    def gpu(self, index: int) -> dict[str, Any]:
        nvml = self.nvml
        try:
            h = self.call("nvmlDeviceGetHandleByIndex_v2", nvml.nvmlDeviceGetHandleByIndex, index)
        except _Lost:
            return {"lost": True}
        except _Failed as exc:
            return {"errors": {exc.symbol: exc.code}}
        if h is MISSING:
            return {"errors": {"nvmlDeviceGetHandleByIndex_v2": int(nvml.NVML_ERROR_NOT_SUPPORTED)}}

        def simple(symbol: str, *args: Any, conv: Callable[[Any], Any] = int) -> Callable[[], Any]:
            def get() -> Any:
                fn = getattr(nvml, symbol.removesuffix("_v2").removesuffix("_v3"))
                v = self.call(symbol, fn, h, *args)
                return v if v is MISSING else conv(v)

            return get

        errors: dict[str, int] = {}
        sections: list[tuple[str, Callable[[], Any]]] = [
            ("name", simple("nvmlDeviceGetName", conv=_text)),
            ("uuid", simple("nvmlDeviceGetUUID", conv=_text)),
            ("serial", simple("nvmlDeviceGetSerial", conv=_text)),
            ("pci", lambda: self.pci(h)),
            ("vbios", simple("nvmlDeviceGetVbiosVersion", conv=_text)),
            ("architecture", simple("nvmlDeviceGetArchitecture")),
            ("brand", simple("nvmlDeviceGetBrand")),
            ("persistence_mode", simple("nvmlDeviceGetPersistenceMode")),
            ("mig", lambda: self.pair("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, h)),
            ("ecc_mode", lambda: self.pair("nvmlDeviceGetEccMode", nvml.nvmlDeviceGetEccMode, h)),
            ("ecc", lambda: self.ecc(h)),
            ("retired_pages", lambda: self.retired_pages(h)),
            ("remapped_rows", lambda: self.remapped_rows(h)),
            ("temperature", lambda: self.temperature(h)),
            ("thresholds", lambda: self.thresholds(h)),
            ("power_usage_mw", simple("nvmlDeviceGetPowerUsage")),
            ("power_management_limit_mw", simple("nvmlDeviceGetPowerManagementLimit")),
            ("enforced_power_limit_mw", simple("nvmlDeviceGetEnforcedPowerLimit")),
            ("clocks_event_reasons", lambda: self.clocks_event_reasons(h)),
            ("clocks", lambda: self.clocks(h, "nvmlDeviceGetClockInfo")),
            ("max_clocks", lambda: self.clocks(h, "nvmlDeviceGetMaxClockInfo")),
            ("violations", lambda: self.violations(h)),
            ("memory_temperature", lambda: self.field(h, _FIELD_MEMORY_TEMP)),
            ("pcie_replay_counter", simple("nvmlDeviceGetPcieReplayCounter")),
            ("recovery_action", lambda: self.field(h, _FIELD_RECOVERY_ACTION)),
            ("sram_ecc", lambda: self.sram_ecc(h)),
            ("pcie", lambda: self.pcie(h)),
            ("nvlink", lambda: self.nvlink(h, errors)),
            ("fabric", lambda: self.fabric(h)),
            ("performance_state", simple("nvmlDeviceGetPerformanceState")),
            ("memory", lambda: self.memory(h)),
            ("supported_event_types", simple("nvmlDeviceGetSupportedEventTypes")),
        ]
        gpu: dict[str, Any] = {}
        try:
            for key, get in sections:
                try:
                    value = get()
                except _Failed as exc:
                    errors[exc.symbol] = exc.code
                    continue
                if value is not MISSING:
                    gpu[key] = value
        except _Lost:
            return {"lost": True}
        if errors:
            gpu["errors"] = dict(sorted(errors.items()))
        return gpu


def record_node(*, name: str | None = None, description: str | None = None) -> dict[str, Any]:
    """This node's NVML state as a scenario dict (see docs/simulator.md).

    Honours $SLURMGPU_NVML_LIBRARY (so it also records the fake). Raises SimError when
    NVML cannot be initialised.
    """
    nvml = load_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise SimError(f"NVML init failed: {exc} (code {exc.value})") from exc
    host = socket.gethostname()
    rec = _Recorder(nvml)
    try:
        scenario: dict[str, Any] = {
            "name": name or host,
            "description": description or f"recorded on {host} by slurmgpu sim record",
        }
        errors: dict[str, int] = {}
        for key, symbol, conv in (
            ("driver_version", "nvmlSystemGetDriverVersion", _text),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2", int),
            ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
        ):
            try:
                value = rec.call(symbol, getattr(nvml, symbol))
            except (_Failed, _Lost) as exc:
                if isinstance(exc, _Failed):
                    errors[exc.symbol] = exc.code
                continue
            if value is not MISSING:
                scenario[key] = conv(value)
        try:
            count = rec.call("nvmlDeviceGetCount_v2", nvml.nvmlDeviceGetCount)
        except _Failed as exc:
            errors[exc.symbol] = exc.code
            count = 0
        except _Lost:
            count = 0
        if count is MISSING:
            count = 0
        scenario["errors"] = dict(sorted(errors.items()))
        scenario["events"] = []
        scenario["gpus"] = [rec.gpu(i) for i in range(int(count))]
        if rec.missing:
            scenario["missing_functions"] = sorted(rec.missing)
        scenario["host"] = record_host()
        return scenario
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _fabric_json(info: Any, version: int) -> dict[str, Any]:
    raw = bytes(info.clusterUuid).hex()
    out: dict[str, Any] = {
        "state": int(info.state) & 0xFF,
        "status": int(info.status),
        "clique_id": int(info.cliqueId),
        "cluster_uuid": f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}",
    }
    if version >= 2:
        out["health_mask"] = int(info.healthMask)
    if version >= 3:
        out["health_summary"] = int(info.healthSummary)
    return out
