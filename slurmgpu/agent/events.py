"""NVML event watching (health events only) in a thread.

Only health events are registered: XID, double-bit ECC, single-bit ECC *storms*, DRAM
retirement and retirement failure, poison, GPU unavailable, recovery action (each where
the GPU supports it). Never clock, pstate or power-source changes: a real driver emits
clock events all the time (~10/s per GPU idle, ~34/s under load, measured on an H200).

pynvml is process-global: the library is loaded once through ``PynvmlSource``'s
path (``SLURMGPU_NVML_LIBRARY`` / ``[nvml] library``) and ``nvmlInit`` is
reference-counted, so this thread holds one init for its life while polls init and
shut down around each collection.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from slurmgpu.log import get_logger
from slurmgpu.sources.nvml import PynvmlSource

EVENT_SBE, EVENT_DBE, EVENT_XID, EVENT_CLOCK = 0x1, 0x2, 0x8, 0x10
# nvmlEventType* (nvml.h): R560 added the storm, retirement and poison types, R570 the
# last two.
KINDS = {
    EVENT_XID: "xid",
    EVENT_DBE: "ecc_dbe",
    0x200: "ecc_sbe_storm",
    0x400: "dram_retirement",
    0x800: "dram_retirement_failure",
    0x1000: "poison_nonfatal",
    0x2000: "poison_fatal",
    0x4000: "gpu_unavailable",
    0x8000: "recovery_action",
}
WANTED = sum(KINDS)
OTHER_KINDS = {EVENT_SBE: "ecc_sbe", EVENT_CLOCK: "clock", 0x4: "pstate", 0x80: "power_source"}
WAIT_MS = 500
RETRY_S = 30.0

# on_event(kind, gpu, data); for "gpu_lost" gpu is the lost GPU (None: could not tell).
EventHandler = Callable[[str, "int | None", "int | None"], None]


def event_kind(event_type: int) -> str:
    for bit, kind in (*KINDS.items(), *OTHER_KINDS.items()):
        if event_type & bit:
            return kind
    return f"type_0x{event_type:x}"


class EventWatcher(threading.Thread):
    def __init__(self, library: str | None, on_event: EventHandler, stop: threading.Event,
                 *, node: str = "") -> None:
        super().__init__(name="slurmgpu-nvml-events", daemon=True)
        self.source = PynvmlSource(library)
        self.on_event = on_event
        self.stop_event = stop
        self.lost: set[int] = set()  # GPUs whose loss was reported; not re-registered
        self.registered: list[int] = []
        self.gave_up = False  # ended for good (no pynvml): not a thread to start again
        self.log = get_logger(component="events", node=node)

    def run(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            self.log.error("nvml_events_unavailable", error=str(exc))
            self.gave_up = True  # nothing to start again
            return
        error = self.source._init(pynvml)
        while error is not None:
            self.log.warning("nvml_events_init_failed", error=error, retry_s=RETRY_S)
            if self.stop_event.wait(RETRY_S):
                return
            error = self.source._init(pynvml)
        try:
            self._watch(pynvml)
        except Exception as exc:  # never take the agent down
            self.log.exception("nvml_events_crashed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()

    def _watch(self, nvml: Any) -> None:
        replay = False
        while not self.stop_event.is_set():
            event_set = self._create(nvml, drain=replay)
            replay = True
            if event_set is None or not self.registered:
                if event_set is not None:
                    with contextlib.suppress(nvml.NVMLError):
                        nvml.nvmlEventSetFree(event_set)
                if self.stop_event.wait(RETRY_S):
                    return
                continue
            try:
                self._loop(nvml, event_set)
            finally:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlEventSetFree(event_set)

    def _create(self, nvml: Any, *, drain: bool) -> Any:
        try:
            event_set = nvml.nvmlEventSetCreate()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self.log.warning("nvml_event_set_failed", error=str(exc))
            return None
        self.registered = []
        for index in range(count):
            if index in self.lost:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                mask = nvml.nvmlDeviceGetSupportedEventTypes(handle) & WANTED
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    self.registered.append(index)
            except nvml.NVMLError_GpuIsLost:
                self.log.warning("nvml_event_register_lost", gpu=index)
            except nvml.NVMLError as exc:
                self.log.warning("nvml_event_register_failed", gpu=index, error=str(exc))
        self.log.info("nvml_events_watching", gpus=self.registered)
        if drain:
            # A recreated set is handed events it already delivered (NVML keeps no
            # per-process cursor for a new set): skip what is queued right now.
            for _ in range(10_000):
                try:
                    nvml.nvmlEventSetWait_v2(event_set, 0)
                except nvml.NVMLError:
                    break
        return event_set

    def _loop(self, nvml: Any, event_set: Any) -> None:
        while not self.stop_event.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError_GpuIsLost:
                newly = self._find_lost(nvml)
                for index in newly:
                    self.lost.add(index)
                    self._dispatch("gpu_lost", index, None)
                if not newly:  # cannot tell which: say so once, then back off
                    self._dispatch("gpu_lost", None, None)
                    self.stop_event.wait(5.0)
                return  # recreate the set without the lost GPU(s)
            except nvml.NVMLError as exc:
                self.log.warning("nvml_event_wait_failed", error=str(exc))
                self.stop_event.wait(1.0)
                return
            gpu: int | None
            try:
                gpu = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                gpu = None
            etype = int(data.eventType)
            self._dispatch(event_kind(etype), gpu, int(data.eventData))

    def _find_lost(self, nvml: Any) -> list[int]:
        lost = []
        for index in self.registered:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceGetIndex(handle)
            except nvml.NVMLError_GpuIsLost:
                lost.append(index)
            except nvml.NVMLError:
                continue
        return lost

    def _dispatch(self, kind: str, gpu: int | None, data: int | None) -> None:
        try:
            self.on_event(kind, gpu, data)
        except Exception as exc:
            self.log.exception("nvml_event_handler_failed", kind=kind, gpu=gpu,
                               error=f"{type(exc).__name__}: {exc}")
