"""The fake libnvidia-ml.so.1 driven through the REAL pynvml code path.

Every pynvml call runs in a subprocess (pynvml caches its library per process); each
subprocess batches many checks and prints one JSON result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.hostroot import host_spec, materialize
from tests.simfixtures import (
    PYNVML_PRELUDE,
    ScenarioFactory,
    bundled_scenario,
    run_pynvml,
    sim_env,
)

NOT_SUPPORTED = 3
NO_PERMISSION = 4
INVALID_ARGUMENT = 2
UNINITIALIZED = 1
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

READ_ALL = """
N.nvmlInit()
out = {
    "driver": N.nvmlSystemGetDriverVersion(),
    "cuda": N.nvmlSystemGetCudaDriverVersion_v2(),
    "cuda_v1": N.nvmlSystemGetCudaDriverVersion(),
    "nvml": N.nvmlSystemGetNVMLVersion(),
    "count": N.nvmlDeviceGetCount(),
    "gpus": [],
}
for i in range(out["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo(h)
    fields = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT, 142, (161, 0)])
    nlinks = fields[0].value.uiVal if fields[0].nvmlReturn == 0 else None
    g = {
        "index": N.nvmlDeviceGetIndex(h),
        "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h),
        "serial": N.nvmlDeviceGetSerial(h),
        "bus_id": txt(pci.busId),
        "bus_id_legacy": txt(pci.busIdLegacy),
        "domain_bus_device": [pci.domain, pci.bus, pci.device],
        "pci_device_id": pci.pciDeviceId,
        "pci_subsystem_id": pci.pciSubSystemId,
        "vbios": N.nvmlDeviceGetVbiosVersion(h),
        "architecture": N.nvmlDeviceGetArchitecture(h),
        "brand": N.nvmlDeviceGetBrand(h),
        "persistence_mode": N.nvmlDeviceGetPersistenceMode(h),
        "mig": N.nvmlDeviceGetMigMode(h),
        "ecc_mode": N.nvmlDeviceGetEccMode(h),
        "ecc": [[N.nvmlDeviceGetTotalEccErrors(h, e, c) for c in (0, 1)] for e in (0, 1)],
        "remapped_rows": list(N.nvmlDeviceGetRemappedRows(h)),
        "retired_pages": code_of(N.nvmlDeviceGetRetiredPages, h, 0),
        "temperature_v": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "temperature": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "thresholds": [N.nvmlDeviceGetTemperatureThreshold(h, t) for t in range(4)],
        "power": [N.nvmlDeviceGetPowerUsage(h), N.nvmlDeviceGetPowerManagementLimit(h),
                  N.nvmlDeviceGetEnforcedPowerLimit(h)],
        "reasons": [N.nvmlDeviceGetCurrentClocksEventReasons(h),
                    N.nvmlDeviceGetCurrentClocksThrottleReasons(h)],
        "pcie": [N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkGeneration(h),
                 N.nvmlDeviceGetCurrPcieLinkWidth(h), N.nvmlDeviceGetMaxPcieLinkWidth(h)],
        "link_count": nlinks,
        "other_fields": [fields[1].nvmlReturn, fields[2].nvmlReturn],
        "nvlink": [[N.nvmlDeviceGetNvLinkState(h, l), N.nvmlDeviceGetNvLinkVersion(h, l),
                    [N.nvmlDeviceGetNvLinkErrorCounter(h, l, c) for c in range(4)]]
                   for l in range(nlinks or 0)],
        "nvlink_out_of_range": code_of(N.nvmlDeviceGetNvLinkState, h, nlinks or 0),
        "performance_state": N.nvmlDeviceGetPerformanceState(h),
        "memory": [getattr(N.nvmlDeviceGetMemoryInfo(h), k) for k in ("total", "free", "used")],
        "supported_event_types": N.nvmlDeviceGetSupportedEventTypes(h),
        "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
        "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busId)),
        "by_legacy_bus": N.nvmlDeviceGetIndex(
            N.nvmlDeviceGetHandleByPciBusId(txt(pci.busIdLegacy).lower())),
    }
    g["fabric_v3"] = code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(N.c_nvmlGpuFabricInfo_v3_t()))
    fi = N.c_nvmlGpuFabricInfo_v2_t()  # what an R550 driver knows
    rc = code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(fi))
    g["fabric"] = {"rc": rc, "state": fi.state, "status": fi.status, "clique_id": fi.cliqueId,
                   "health_mask": fi.healthMask, "cluster_uuid": bytes(fi.clusterUuid).hex()}
    out["gpus"].append(g)
out["bad_index"] = code_of(N.nvmlDeviceGetHandleByIndex, 99)
out["bad_uuid"] = code_of(N.nvmlDeviceGetHandleByUUID, "GPU-nope")
out["bad_bus"] = code_of(N.nvmlDeviceGetHandleByPciBusId, "00000000:01:00.0")
out["error_string"] = str(N.NVMLError(N.NVML_ERROR_GPU_IS_LOST))
N.nvmlShutdown()
emit(out)
"""


def _bus_parts(bus_id: str) -> list[int]:
    dom, bus, rest = bus_id.split(":")
    return [int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)]


def _expected_gpu(index: int, g: dict[str, Any]) -> dict[str, Any]:
    ecc = g["ecc"]
    bus_id = g["pci"]["bus_id"]
    dom, bus, dev = _bus_parts(bus_id)
    return {
        "index": index,
        "name": g["name"],
        "uuid": g["uuid"],
        "serial": g["serial"],
        "bus_id": bus_id,
        "bus_id_legacy": f"{dom:04X}:{bus:02X}:{dev:02X}.0",
        "domain_bus_device": [dom, bus, dev],
        "pci_device_id": int(g["pci"]["pci_device_id"], 16),
        "pci_subsystem_id": int(g["pci"]["pci_subsystem_id"], 16),
        "vbios": g["vbios"],
        "architecture": g["architecture"],
        "brand": g["brand"],
        "persistence_mode": g["persistence_mode"],
        "mig": [g["mig"]["current"], g["mig"]["pending"]],
        "ecc_mode": [g["ecc_mode"]["current"], g["ecc_mode"]["pending"]],
        "ecc": [[ecc[k]["volatile"], ecc[k]["aggregate"]] for k in ("corrected", "uncorrected")],
        "remapped_rows": [g["remapped_rows"][k] for k in ("correctable", "uncorrectable", "pending", "failure")],
        "retired_pages": NOT_SUPPORTED,  # Hopper/Ampere: row remapping instead
        "temperature_v": g["temperature"],
        "temperature": g["temperature"],
        "thresholds": [g["thresholds"][k] for k in ("shutdown", "slowdown", "mem_max", "gpu_max")],
        "power": [g["power_usage_mw"], g["power_management_limit_mw"], g["enforced_power_limit_mw"]],
        "reasons": [g["clocks_event_reasons"]] * 2,
        "pcie": [g["pcie"][k] for k in ("gen_current", "gen_max", "width_current", "width_max")],
        "link_count": len(g["nvlink"]),
        "other_fields": [NOT_SUPPORTED, NOT_SUPPORTED],
        "nvlink": [
            [link["state"], link["version"],
             [link["errors"][k] for k in ("replay", "recovery", "crc_flit", "crc_data")]]
            for link in g["nvlink"]
        ],
        "nvlink_out_of_range": INVALID_ARGUMENT,
        "performance_state": g["performance_state"],
        "memory": [g["memory"][k] for k in ("total", "free", "used")],
        "supported_event_types": g["supported_event_types"],
        "by_uuid": index,
        "by_bus": index,
        "by_legacy_bus": index,
    }


def test_healthy_h100_reads_back_every_field(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    path = scenario_file("h100-sxm-8")
    scen = bundled_scenario("h100-sxm-8")
    out = run_pynvml(READ_ALL, sim_env(fake_nvml_lib, path))

    assert out["driver"] == "550.90.07"
    assert out["cuda"] == out["cuda_v1"] == 12040
    assert out["nvml"] == scen["nvml_version"]
    assert out["count"] == 8
    for i, (got, g) in enumerate(zip(out["gpus"], scen["gpus"], strict=True)):
        fabric = got.pop("fabric")
        assert got.pop("fabric_v3") == ARGUMENT_VERSION_MISMATCH  # R550: no v3 struct
        assert got == _expected_gpu(i, g), f"GPU {i}"
        assert fabric == {"rc": None, "state": 3, "status": 0, "clique_id": 0, "health_mask": 0xAA,
                          "cluster_uuid": "00" * 16}
    assert out["gpus"][0]["link_count"] == 18
    assert out["gpus"][0]["nvlink"][0][1] == 6  # NVML_NVLINK_VERSION_4_0
    assert len({g["uuid"] for g in out["gpus"]}) == 8
    assert (out["bad_index"], out["bad_uuid"], out["bad_bus"]) == (INVALID_ARGUMENT, 6, 6)
    assert out["error_string"] == "GPU is lost"


def test_a100_has_12_links_and_no_fabric(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    path = scenario_file("a100-sxm-8")
    out = run_pynvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])
        fi = N.c_nvmlGpuFabricInfo_v2_t()
        emit({"name": N.nvmlDeviceGetName(h), "links": fv[0].value.ullVal,
              "version": N.nvmlDeviceGetNvLinkVersion(h, 11),
              "gen": N.nvmlDeviceGetMaxPcieLinkGeneration(h),
              "fabric": code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(fi)),
              "fabric_v1": code_of(N.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(N.c_nvmlGpuFabricInfo_t())),
              "link12": code_of(N.nvmlDeviceGetNvLinkState, h, 12)})
        """,
        sim_env(fake_nvml_lib, path),
    )
    assert out == {"name": "NVIDIA A100-SXM4-80GB", "links": 12, "version": 4, "gen": 4,
                   "fabric": NOT_SUPPORTED, "fabric_v1": NOT_SUPPORTED, "link12": INVALID_ARGUMENT}


def test_missing_keys_are_not_supported(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def strip(s: dict[str, Any]) -> None:
        g = s["gpus"][0]
        for key in ("serial", "temperature", "fabric", "nvlink", "remapped_rows", "memory",
                    "mig", "performance_state", "clocks_event_reasons"):
            del g[key]
        del g["pcie"]["gen_max"]
        del g["ecc"]["uncorrected"]
        g["thresholds"]["mem_max"] = None  # null reads as missing
        g["retired_pages"] = {"sbe": [4096, {"address": 8192, "timestamp": 1700000000}], "dbe": 2}
        s["gpus"][1]["supported_event_types"] = None  # default mask
        del s["nvml_version"]

    path = scenario_file("h100-sxm-8", strip)
    out = run_pynvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])
        emit({
            "serial": code_of(N.nvmlDeviceGetSerial, h),
            "temperature": code_of(N.nvmlDeviceGetTemperature, h, 0),
            "fabric": code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(N.c_nvmlGpuFabricInfo_v2_t())),
            "nvlink_state": code_of(N.nvmlDeviceGetNvLinkState, h, 0),
            "field91": fv[0].nvmlReturn,
            "remapped_rows": code_of(N.nvmlDeviceGetRemappedRows, h),
            "memory": code_of(N.nvmlDeviceGetMemoryInfo, h),
            "mig": code_of(N.nvmlDeviceGetMigMode, h),
            "pstate": code_of(N.nvmlDeviceGetPerformanceState, h),
            "reasons": code_of(N.nvmlDeviceGetCurrentClocksEventReasons, h),
            "gen_max": code_of(N.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "gen_current": N.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "ecc_unc": code_of(N.nvmlDeviceGetTotalEccErrors, h, 1, 0),
            "ecc_corr": N.nvmlDeviceGetTotalEccErrors(h, 0, 0),
            "mem_max": code_of(N.nvmlDeviceGetTemperatureThreshold, h, 2),
            "slowdown": N.nvmlDeviceGetTemperatureThreshold(h, 1),
            "sbe": N.nvmlDeviceGetRetiredPages(h, 0),
            "sbe_v2": [[p["address"], p["timestamp"]] for p in N.nvmlDeviceGetRetiredPages_v2(h, 0)],
            "dbe": len(N.nvmlDeviceGetRetiredPages(h, 1)),
            "pending": code_of(N.nvmlDeviceGetRetiredPagesPendingStatus, h),
            "events_default": N.nvmlDeviceGetSupportedEventTypes(N.nvmlDeviceGetHandleByIndex(1)),
            "nvml_version": code_of(N.nvmlSystemGetNVMLVersion),
            "other_gpu_serial": N.nvmlDeviceGetSerial(N.nvmlDeviceGetHandleByIndex(1)),
        })
        """,
        sim_env(fake_nvml_lib, path),
    )
    ns = NOT_SUPPORTED
    assert out == {
        "serial": ns, "temperature": ns, "fabric": ns, "nvlink_state": ns, "field91": ns,
        "remapped_rows": ns, "memory": ns, "mig": ns, "pstate": ns, "reasons": ns,
        "gen_max": ns, "gen_current": 5, "ecc_unc": ns, "ecc_corr": 0, "mem_max": ns,
        "slowdown": 87, "sbe": [4096, 8192], "sbe_v2": [[4096, 0], [8192, 1700000000]],
        "dbe": 2, "pending": ns, "events_default": 0x1B, "nvml_version": ns,
        "other_gpu_serial": "1654922000001",
    }


def test_gpu_lost_and_forced_errors(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def faults(s: dict[str, Any]) -> None:
        s["gpus"][5]["lost"] = True
        s["gpus"][2]["errors"] = {"nvmlDeviceGetPowerUsage": NO_PERMISSION,
                                  "nvmlDeviceGetPciInfo": UNKNOWN,  # "_v3" suffix may be omitted
                                  "field:91": 17}
        s["errors"] = {"nvmlSystemGetDriverVersion": UNKNOWN, "nvmlDeviceGetVbiosVersion": 26}
        s["gpus"][4]["fabric"]["health_summary"] = 1  # the R550 driver still refuses v3

    path = scenario_file("h100-sxm-8", faults)
    lost_uuid = bundled_scenario("h100-sxm-8")["gpus"][5]["uuid"]
    out = run_pynvml(
        f"""
        N.nvmlInit()
        h2 = N.nvmlDeviceGetHandleByIndex(2)
        h4 = N.nvmlDeviceGetHandleByIndex(4)
        fv = N.nvmlDeviceGetFieldValues(h2, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])
        v2 = N.c_nvmlGpuFabricInfo_v2_t()
        emit({{
            "count": N.nvmlDeviceGetCount(),
            "lost_by_index": code_of(N.nvmlDeviceGetHandleByIndex, 5),
            "lost_by_uuid": code_of(N.nvmlDeviceGetHandleByUUID, "{lost_uuid}"),
            "lost_class": type(N.NVMLError(15)).__name__,
            "power": code_of(N.nvmlDeviceGetPowerUsage, h2),
            "power_other_gpu": N.nvmlDeviceGetPowerUsage(N.nvmlDeviceGetHandleByIndex(3)) > 0,
            "pci": code_of(N.nvmlDeviceGetPciInfo, h2),
            "field91": fv[0].nvmlReturn,
            "driver": code_of(N.nvmlSystemGetDriverVersion),
            "vbios_all_gpus": [code_of(N.nvmlDeviceGetVbiosVersion, N.nvmlDeviceGetHandleByIndex(i))
                               for i in (0, 7)],
            "fabric_v3_old_driver": code_of(N.nvmlDeviceGetGpuFabricInfoV, h4,
                                            ctypes.byref(N.c_nvmlGpuFabricInfo_v3_t())),
            "fabric_v2_old_driver": [code_of(N.nvmlDeviceGetGpuFabricInfoV, h4, ctypes.byref(v2)),
                                     v2.state, v2.healthMask],
        }})
        """,
        sim_env(fake_nvml_lib, path),
    )
    assert out == {
        "count": 8, "lost_by_index": GPU_IS_LOST, "lost_by_uuid": GPU_IS_LOST,
        "lost_class": "NVMLError_GpuIsLost", "power": NO_PERMISSION, "power_other_gpu": True,
        "pci": UNKNOWN, "field91": 17, "driver": UNKNOWN, "vbios_all_gpus": [26, 26],
        "fabric_v3_old_driver": ARGUMENT_VERSION_MISMATCH,
        "fabric_v2_old_driver": [None, 3, 0xAA],
    }


def test_init_errors_and_uninitialized(fake_nvml_lib: Path, scenario_file: ScenarioFactory, tmp_path: Path) -> None:
    good = scenario_file("h100-sxm-8")
    init_err = scenario_file("h100-sxm-8", lambda s: s.update(init_error=NO_PERMISSION),
                             filename="init-error.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"gpus": [', encoding="utf-8")
    out = run_pynvml(
        f"""
        res = {{"before_init": code_of(N.nvmlDeviceGetCount)}}
        os.environ.pop("SLURMGPU_SIM_SCENARIO", None)
        res["no_env"] = code_of(N.nvmlInit)
        res["no_env_class"] = type(N.NVMLError(9)).__name__
        os.environ["SLURMGPU_SIM_SCENARIO"] = "{tmp_path}/does-not-exist.json"
        res["missing_file"] = code_of(N.nvmlInit)
        os.environ["SLURMGPU_SIM_SCENARIO"] = "{broken}"
        res["broken_file"] = code_of(N.nvmlInit)
        os.environ["SLURMGPU_SIM_SCENARIO"] = "{init_err}"
        res["init_error"] = code_of(N.nvmlInit)
        res["still_uninit"] = code_of(N.nvmlSystemGetDriverVersion)
        os.environ["SLURMGPU_SIM_SCENARIO"] = "{good}"
        res["ok"] = code_of(N.nvmlInit)
        res["count"] = N.nvmlDeviceGetCount()
        N.nvmlShutdown()
        res["after_shutdown"] = code_of(N.nvmlDeviceGetCount)
        res["double_shutdown"] = code_of(N.nvmlShutdown)
        emit(res)
        """,
        sim_env(fake_nvml_lib, None),
    )
    assert out == {
        "before_init": UNINITIALIZED, "no_env": DRIVER_NOT_LOADED,
        "no_env_class": "NVMLError_DriverNotLoaded", "missing_file": DRIVER_NOT_LOADED,
        "broken_file": DRIVER_NOT_LOADED, "init_error": NO_PERMISSION,
        "still_uninit": UNINITIALIZED, "ok": None, "count": 8, "after_shutdown": UNINITIALIZED,
        "double_shutdown": UNINITIALIZED,
    }


def test_fault_injected_into_running_process(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    """The parent rewrites the scenario while the child keeps its NVML session and handles."""
    path = scenario_file("h100-sxm-8")
    code = PYNVML_PRELUDE + textwrap.dedent(
        """
        N.nvmlInit()
        h3 = N.nvmlDeviceGetHandleByIndex(3)
        h5 = N.nvmlDeviceGetHandleByIndex(5)
        def snap():
            return {"dbe": N.nvmlDeviceGetTotalEccErrors(h3, 1, 0),
                    "gpu5": code_of(N.nvmlDeviceGetTemperature, h5, 0),
                    "width": N.nvmlDeviceGetCurrPcieLinkWidth(h3)}
        before = snap()
        print("ready", flush=True)
        sys.stdin.readline()
        emit({"before": before, "after": snap()})
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=sim_env(fake_nvml_lib, path),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"

        def inject(s: dict[str, Any]) -> None:
            s["gpus"][3]["ecc"]["uncorrected"]["volatile"] = 2
            s["gpus"][3]["pcie"]["width_current"] = 8
            s["gpus"][5]["lost"] = True

        scenario_file.update(path, inject)
        stdout, stderr = proc.communicate("go\n", timeout=20)
    finally:
        proc.kill()
    result = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert result, stderr
    out = json.loads(result[-1][len("RESULT "):])
    assert out == {"before": {"dbe": 0, "gpu5": None, "width": 16},
                   "after": {"dbe": 2, "gpu5": GPU_IS_LOST, "width": 8}}


def test_events_xid_timeout_and_registration(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def setup(s: dict[str, Any]) -> None:
        s["gpus"][6]["supported_event_types"] = 0x1  # SBE only

    path = scenario_file("h100-sxm-8", setup)
    out = run_pynvml(
        f"""
        from slurmgpu.sim.scenario import write_scenario
        path = "{path}"
        def update(change):
            with open(path) as fh:
                data = json.load(fh)
            change(data)
            write_scenario(path, data)  # atomic rename
        N.nvmlInit()
        h3 = N.nvmlDeviceGetHandleByIndex(3)
        h6 = N.nvmlDeviceGetHandleByIndex(6)
        es = N.nvmlEventSetCreate()
        res = {{}}
        res["unsupported"] = code_of(N.nvmlDeviceRegisterEvents, h6, N.nvmlEventTypeXidCriticalError, es)
        res["unsupported_pstate"] = code_of(N.nvmlDeviceRegisterEvents, h3, N.nvmlEventTypePState, es)
        # Health events only, as the agent registers them: a clock-registered set gets a
        # clock event every ~100 ms (tests/test_driver_profiles.py covers those).
        supported = N.nvmlDeviceGetSupportedEventTypes(h3) & ~N.nvmlEventTypeClock
        N.nvmlDeviceRegisterEvents(h3, supported, es)
        N.nvmlDeviceRegisterEvents(h6, N.nvmlDeviceGetSupportedEventTypes(h6), es)
        t0 = time.monotonic()
        res["timeout"] = code_of(N.nvmlEventSetWait_v2, es, 50)
        res["timeout_s"] = time.monotonic() - t0

        got = {{}}
        def waiter():
            t = time.monotonic()
            try:
                d = N.nvmlEventSetWait_v2(es, 5000)
                got.update(index=N.nvmlDeviceGetIndex(d.device), type=d.eventType, data=d.eventData,
                           gi=d.gpuInstanceId, ci=d.computeInstanceId)
            except N.NVMLError as exc:
                got.update(error=exc.value)
            got["waited_s"] = time.monotonic() - t
        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.2)
        # while the waiter blocks, this thread still gets answers
        res["temp_while_blocked"] = N.nvmlDeviceGetTemperature(h3, 0)
        def add(s):
            s["events"] += [
                {{"gpu": 4, "type": 8, "data": 31, "id": 1}},   # GPU 4 not registered
                {{"gpu": 6, "type": 8, "data": 13, "id": 2}},   # type not registered on GPU 6
                {{"gpu": 3, "type": 8, "data": 79, "id": 3}},
            ]
        update(add)
        th.join(10)
        res["event"] = got
        res["again"] = code_of(N.nvmlEventSetWait_v2, es, 30)  # id 3 is delivered once
        es2 = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h3, 8, es2)
        res["other_set"] = N.nvmlEventSetWait(es2, 0).eventData  # each set gets it once
        update(lambda s: s["gpus"][3].update(lost=True))
        res["lost"] = code_of(N.nvmlEventSetWait_v2, es, 1000)
        N.nvmlEventSetFree(es)
        N.nvmlEventSetFree(es2)
        N.nvmlShutdown()
        emit(res)
        """,
        sim_env(fake_nvml_lib, path),
    )
    event = out.pop("event")
    assert event.pop("waited_s") < 3
    assert event == {"index": 3, "type": 8, "data": 79, "gi": 0xFFFFFFFF, "ci": 0xFFFFFFFF}
    assert 0.04 <= out.pop("timeout_s") < 2
    assert out == {"unsupported": NOT_SUPPORTED, "unsupported_pstate": NOT_SUPPORTED,
                   "timeout": TIMEOUT, "temp_while_blocked": 33, "again": TIMEOUT,
                   "other_set": 79, "lost": GPU_IS_LOST}


@pytest.mark.parametrize("name", ["h100-sxm-8", "a100-sxm-8", "fault-gpu-lost"])
def test_record_round_trip(fake_nvml_lib: Path, scenario_file: ScenarioFactory, name: str) -> None:
    """record(X) = R1; record(R1) = R2; R1 == R2, and R1 reproduces the bundled GPUs."""
    path = scenario_file(name)
    out = run_pynvml(
        f"""
        from slurmgpu.sim.record import record_node
        from slurmgpu.sim.scenario import write_scenario
        r1 = record_node(name="r", description="d")
        write_scenario("{path.parent}/r1.json", r1)
        os.environ["SLURMGPU_SIM_SCENARIO"] = "{path.parent}/r1.json"
        r2 = record_node(name="r", description="d")
        emit({{"r1": r1, "r2": r2}})
        """,
        sim_env(fake_nvml_lib, path, SLURMGPU_HOST_ROOT=str(materialize(bundled_scenario(name), path.parent / "host"))),
    )
    assert out["r1"] == out["r2"]
    original = bundled_scenario(name)
    spec = host_spec(original)  # the host around NVML, recorded from the simulated host's tree
    recorded = out["r1"]["host"]
    assert {k: recorded[k] for k in ("kernel_release", "nvswitches", "modules", "disks")} == \
        {k: spec[k] for k in ("kernel_release", "nvswitches", "modules", "disks")}
    assert recorded["kernel_module"] == spec["kernel_module"]
    assert recorded["services"] == {"nvidia-persistenced": spec["services"]["nvidia-persistenced"]} | (
        {"nvidia-fabricmanager": spec["services"]["nvidia-fabricmanager"]} if spec["nvswitches"] else {})
    r1 = out["r1"]
    for key in ("driver_version", "cuda_driver_version", "nvml_version", "errors", "events"):
        assert r1[key] == original[key]
    expected = [{"lost": True} if g.get("lost") else g for g in original["gpus"]]
    assert r1["gpus"] == expected
