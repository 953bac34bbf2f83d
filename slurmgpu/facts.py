"""Typed facts about one node, gathered once per run and read by pure checks.

Convention: ``None`` means *not applicable* (NVML said NotSupported, the file is
absent, the hardware has no such feature). A query that failed for any other
reason is recorded in the owning object's ``errors`` map (field name -> error),
so a check can tell "this GPU has no NVLink" from "asking about NVLink broke".
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any, TypeVar

from slurmgpu.record import record

# Clock-event reason bits (nvmlClocksEventReason*).
CLOCKS_EVENT_GPU_IDLE = 0x1
CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING = 0x2
CLOCKS_EVENT_SW_POWER_CAP = 0x4
CLOCKS_EVENT_HW_SLOWDOWN = 0x8
CLOCKS_EVENT_SYNC_BOOST = 0x10
CLOCKS_EVENT_SW_THERMAL = 0x20
CLOCKS_EVENT_HW_THERMAL = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE = 0x80
CLOCKS_EVENT_DISPLAY_CLOCK = 0x100

CLOCKS_EVENT_NAMES = {
    CLOCKS_EVENT_GPU_IDLE: "gpu_idle",
    CLOCKS_EVENT_APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    CLOCKS_EVENT_SW_POWER_CAP: "sw_power_cap",
    CLOCKS_EVENT_HW_SLOWDOWN: "hw_slowdown",
    CLOCKS_EVENT_SYNC_BOOST: "sync_boost",
    CLOCKS_EVENT_SW_THERMAL: "sw_thermal_slowdown",
    CLOCKS_EVENT_HW_THERMAL: "hw_thermal_slowdown",
    CLOCKS_EVENT_HW_POWER_BRAKE: "hw_power_brake_slowdown",
    CLOCKS_EVENT_DISPLAY_CLOCK: "display_clock_setting",
}
# The HW slowdown family (thermal.throttle, thermal.clock_brake, the epilog's job summary):
# HW slowdown is the umbrella bit; HW thermal and power brake say why.
CLOCKS_EVENT_HW_THROTTLE = CLOCKS_EVENT_HW_SLOWDOWN | CLOCKS_EVENT_HW_THERMAL | CLOCKS_EVENT_HW_POWER_BRAKE


def clocks_event_names(mask: int) -> list[str]:
    """The names of the clock-event reason bits set in ``mask``."""
    return [name for bit, name in CLOCKS_EVENT_NAMES.items() if mask & bit]


# nvmlGpuFabricState_t
FABRIC_STATE_NAMES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
FABRIC_STATE_COMPLETED = 3
# Health summary values (NVML_GPU_FABRIC_HEALTH_SUMMARY_*)
FABRIC_HEALTH_NAMES = {0: "NOT_SUPPORTED", 1: "HEALTHY", 2: "UNHEALTHY", 3: "LIMITED_CAPACITY"}

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvmlDeviceGpuRecoveryAction_t, R570+).
RECOVERY_ACTION_NAMES = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P",
                         4: "DRAIN_AND_RESET"}

# NVML return codes a check needs to tell apart (nvmlReturn_t).
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25


@record
class EccCounts:
    """One GPU's ECC error counters (None: not reported)."""

    corrected_volatile: int | None = None
    corrected_aggregate: int | None = None
    uncorrected_volatile: int | None = None
    uncorrected_aggregate: int | None = None


@record
class RetiredPages:
    """Dynamic page retirement (Kepler..Volta/Turing; Ampere+ uses row remapping)."""

    single_bit: int = 0
    double_bit: int = 0
    pending: bool = False


@record
class RemappedRows:
    """Row remapping (Ampere+): nvmlDeviceGetRemappedRows."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


@record
class PcieLink:
    """One GPU's PCIe link: generation, width, replays."""

    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None


@record
class NvLink:
    """One NVLink of a GPU: state and error counters."""

    link: int
    active: bool
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None


@record
class FabricInfo:
    """nvmlDeviceGetGpuFabricInfoV (Hopper+ NVSwitch systems)."""

    state: int
    status: int | None = None  # nvmlReturn_t, valid when state is COMPLETED
    health_summary: int | None = None  # v3 struct (R580+); None on older drivers
    clique_id: int | None = None
    health_mask: int | None = None  # v2+ struct (R550+); None from the v1 call (R535)
    struct_version: int | None = None  # which nvmlGpuFabricInfo the driver answered

    @property
    def state_name(self) -> str:
        return FABRIC_STATE_NAMES.get(self.state, f"UNKNOWN({self.state})")


@record
class GpuFacts:
    """What NVML says about one GPU."""

    index: int
    # True when NVML answered GpuIsLost: the GPU fell off the bus; nothing else is valid.
    lost: bool = False
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    vbios: str | None = None
    persistence_mode: bool | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None
    ecc: EccCounts | None = None
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    temperature_c: int | None = None
    slowdown_temp_c: int | None = None
    shutdown_temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    clocks_event_reasons: int | None = None
    # SM clock now and its maximum (MHz), and time held below application clocks by each
    # limiter since boot (ns; nvmlDeviceGetViolationStatus: power, thermal, reliability,
    # board_limit), so two samples give the share of time throttled.
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_ns: dict[str, int] = field(default_factory=dict)
    # HBM temperature (field 82) and the memory's max operating temperature.
    memory_temp_c: int | None = None
    memory_max_temp_c: int | None = None
    # The driver's own verdict (field 230, R570+; from 226/227 on R560): RECOVERY_ACTION_NAMES.
    recovery_action: int | None = None
    # SRAM ECC errors past the driver's threshold (nvmlDeviceGetSramEccErrorStatus, R550+).
    sram_threshold_exceeded: bool | None = None
    sram_uncorrected_volatile: int | None = None
    pcie_replay: int | None = None  # PCIe replay counter (field 94)
    pcie: PcieLink | None = None
    # None: NVLink not supported. Empty list: supported, zero links.
    nvlinks: list[NvLink] | None = None
    fabric: FabricInfo | None = None
    # The NVML query that did not answer within [nvml] query_deadline_s (the GPU is not
    # responding), or why the GPU was not asked at all; None: it answered.
    unresponsive: str | None = None
    # Queries NVML answered with an error (not NotSupported / FunctionNotFound): fact ->
    # message, and fact -> nvmlReturn_t code. ``retried``: the source asked again after
    # [nvml] retry_delay_s and these errors came back both times; ``transient_errors``
    # failed first and answered on the retry.
    errors: dict[str, str] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    retried: bool = False
    transient_errors: dict[str, str] = field(default_factory=dict)


@record
class NvmlFacts:
    """What NVML says about the node: driver, GPUs."""

    # False when the library or driver is absent; ``error`` says which.
    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    # Number of GPUs NVML reports (before scoping to a job's GPUs).
    device_count: int = 0
    gpus: list[GpuFacts] = field(default_factory=list)
    # The user-space library's own version (nvmlSystemGetNVMLVersion, which answers without
    # nvmlInit: "550.90.07"), and the nvmlReturn_t code when nvmlInit failed.
    library_version: str | None = None
    init_error_code: int | None = None
    # NVML itself did not answer within [nvml] query_deadline_s (nvmlInit or a system
    # query): what was asked and for how long.
    unresponsive: str | None = None
    # Every GPU's PCI bus id by index, those outside a job's scope too ("" when NVML did
    # not say): what maps a logged XID to its GPU.
    bus_ids: list[str] = field(default_factory=list)


@record
class IbPort:
    """One InfiniBand port from sysfs."""

    port: int
    state: str | None = None  # e.g. "ACTIVE" from "4: ACTIVE"
    phys_state: str | None = None  # e.g. "LinkUp" from "5: LinkUp"
    rate_gbps: float | None = None  # from "400 Gb/sec (4X NDR)"
    rate_text: str | None = None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"
    counters: dict[str, int] = field(default_factory=dict)
    # Counters the kernel could not read ("N/A (no PMA)": no Performance Management Agent).
    counters_unavailable: list[str] = field(default_factory=list)
    # Driver counters from ports/<n>/hw_counters (RoCE ports, when [ib] roce_hw_counters);
    # None: not read.
    hw_counters: dict[str, int] | None = None
    # link_downed history kept by the agent across polls (slurmgpu.agent.flap): rises within
    # the flap window, and strikes. None: nobody tracks them (a one-shot check).
    flap_rises: int | None = None
    flap_strikes: int | None = None


@record
class IbHca:
    """One InfiniBand HCA from sysfs, with its ports."""

    name: str
    fw_ver: str | None = None
    board_id: str | None = None
    hca_type: str | None = None
    ports: list[IbPort] = field(default_factory=list)


@record
class IbFacts:
    """The node's InfiniBand HCAs."""

    # False when /sys/class/infiniband does not exist (no IB stack loaded).
    available: bool
    hcas: list[IbHca] = field(default_factory=list)
    error: str | None = None


@record
class SoftwareVersions:
    """Versions of the driver, CUDA, NCCL, OFED and firmware."""

    cuda_runtime: str | None = None  # libcudart cudaRuntimeGetVersion, e.g. "12.4"
    cuda_toolkit: str | None = None  # /usr/local/cuda/version.json
    nccl: str | None = None  # "2.21.5"
    ofed: str | None = None  # MLNX_OFED / DOCA-OFED release, when installed
    ib_driver: str | None = None  # mlx5_core/ib_core module version, when present
    kernel: str | None = None
    # Where each version came from (file path, library), for `check --json` readers.
    sources: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


# Longest XID message text kept (the kernel line after the code): enough for NVIDIA's
# sub-unit names and Fatal/Nonfatal, bounded for the wire and the store.
XID_MESSAGE_MAX = 240


@record
class XidEvent:
    """One XID: its code, GPU, time and driver message."""

    xid: int
    gpu: int | None = None
    timestamp: float | None = None
    source: str = "caller"
    # The driver's text after the code ("pid=..., name=..., NETIR_LINK_EVT ... Fatal"), at
    # most XID_MESSAGE_MAX characters; None when the source has none (an NVML event).
    message: str | None = None


@record
class ServiceState:
    """One systemd unit as ``systemctl show`` reports it."""

    name: str
    load_state: str | None = None  # "loaded", "not-found", "masked"
    active_state: str | None = None  # "active", "activating", "inactive", "failed"
    sub_state: str | None = None  # "running", "auto-restart", "dead", ...
    n_restarts: int | None = None  # restarts by systemd since the unit was last started
    result: str | None = None  # "success", "exit-code", "core-dump", ...


@record
class DiskState:
    """The file system holding one configured path (statvfs)."""

    path: str
    total_bytes: int | None = None
    free_bytes: int | None = None  # available to unprivileged users (f_bavail)
    read_only: bool | None = None
    error: str | None = None


@record
class HungProcess:
    """A process in D state (uninterruptible sleep) holding a GPU device file open."""

    pid: int
    command: str
    devices: list[str] = field(default_factory=list)


@record
class SxidEvent:
    """An NVSwitch SXid from the kernel log:
    ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress ...``."""

    sxid: int
    switch: str  # "nvidia-nvswitch3"
    pci: str | None = None  # "0000:05:00.0"
    timestamp: float | None = None
    message: str | None = None  # the text after the code, at most XID_MESSAGE_MAX characters


@record
class HostFacts:
    """The layers around NVML: the kernel module, GPU services, disks, GPUDirect RDMA."""

    # False: not gathered (a caller without a host source); the checks are not applicable.
    available: bool = False
    # /proc/driver/nvidia/version's kernel module version ("550.90.07"), its first line,
    # and whether it is the open kernel module.
    kernel_module_version: str | None = None
    kernel_module_text: str | None = None
    open_kernel_module: bool | None = None
    kernel_release: str | None = None  # uname -r
    nvswitches: int = 0  # NVSwitch devices the driver exposes
    imex: bool = False  # an IMEX system (nvidia-imex installed)
    peermem_loaded: bool | None = None  # /sys/module/nvidia_peermem
    systemd: bool = False  # systemd runs this host (services can be asked)
    services: list[ServiceState] = field(default_factory=list)
    disks: list[DiskState] = field(default_factory=list)
    hung_processes: list[HungProcess] = field(default_factory=list)
    # NVSwitch SXids in the kernel log (since boot, as far as the log reaches).
    sxids: list[SxidEvent] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


@record
class NodeFacts:
    """Everything gathered about one node at one time."""

    node: str
    collected_at: float
    nvml: NvmlFacts
    ib: IbFacts
    versions: SoftwareVersions
    xids: list[XidEvent] = field(default_factory=list)
    host: HostFacts = field(default_factory=HostFacts)
    # Why the kernel log's XIDs could not be read (timed out, too large, I/O error); None
    # when read or not asked for. xid.recent then says UNKNOWN.
    kernel_log_error: str | None = None
    # The previous sample of the same node, when a caller (the agent) keeps one;
    # rate checks (ECC corrected per hour, IB counters rising) use it.
    previous: NodeFacts | None = None

    @property
    def gpus(self) -> list[GpuFacts]:
        return self.nvml.gpus

    def gpu(self, index: int) -> GpuFacts | None:
        for g in self.nvml.gpus:
            if g.index == index:
                return g
        return None

    def to_json(self, *, include_previous: bool = False) -> dict[str, Any]:
        """``dataclasses.asdict`` of these facts (without ``previous`` unless asked)."""
        skip = () if include_previous else ("previous",)
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeFacts:
        return from_dict(cls, data)


T = TypeVar("T")


def plain(value: Any) -> Any:
    """What ``dataclasses.asdict`` makes of a value (dataclasses as dicts; lists, tuples
    and dicts rebuilt), without deep copies of the values inside: facts hold numbers,
    strings, booleans and None there. A check's --json costs ~4 ms less."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a facts dataclass tree from ``dataclasses.asdict`` output."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, vt = typing.get_args(tp)
        return {k: _convert(vt, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value)
    return value
