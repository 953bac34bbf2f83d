#!/usr/bin/env python3
"""Regenerate the derived simulator scenarios in slurmgpu/sim/scenarios/.

Hand-written bases: ``h100-sxm-8`` (HGX H100 on R550) and ``a100-sxm-8`` (DGX A100 on
R550); ``h200-r580`` comes from the real H200 recorded in ../shared/reference/real-h200
(tests/data/recorded/h200-r580.scenario.json), with the facts the recorder of the day did
not read yet taken from that node's ``nvidia-smi -q -x``. From them this writes:

* branch profiles: the same healthy node as a driver of another branch reports it (the
  fake's profile follows ``driver_version``; the keys here follow what that branch's NVML
  can answer: no SRAM status before R550, no recovery action before R570, fabric health
  summary only from R580);
* every fault scenario gets the per-GPU health keys of its base (clocks, throttle time,
  HBM temperature, PCIe replays, SRAM status) so the new checks have something to read;
* the faults added for issue 10 (NVML errors, recovery action, power brake, HBM heat,
  SRAM threshold, a hot GPU).

Run from the repository root: ``python3 tools/make_scenarios.py``. Idempotent.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmgpu.sim.scenario import dump_scenario  # noqa: E402

SCENARIOS = ROOT / "slurmgpu" / "sim" / "scenarios"
H200_RECORD = ROOT / "tests" / "data" / "recorded" / "h200-r580.scenario.json"

# Idle clocks and limits as nvidia-smi reports them on HGX H100 / H200 and DGX A100.
H100_HEALTH = {
    "clocks": {"graphics": 345, "sm": 345, "mem": 2619},
    "max_clocks": {"graphics": 1980, "sm": 1980, "mem": 2619},
    "violations": {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0},
    "memory_temperature": 33,
    "pcie_replay_counter": 0,
}
A100_HEALTH = {
    "clocks": {"graphics": 210, "sm": 210, "mem": 1593},
    "max_clocks": {"graphics": 1410, "sm": 1410, "mem": 1593},
    "violations": {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0},
    "memory_temperature": 31,
    "pcie_replay_counter": 0,
}
SRAM_CLEAN = {key: 0 for key in (
    "aggregate_unc_parity", "aggregate_unc_sec_ded", "aggregate_cor", "volatile_unc_parity",
    "volatile_unc_sec_ded", "volatile_cor", "aggregate_unc_bucket_l2", "aggregate_unc_bucket_sm",
    "aggregate_unc_bucket_pcie", "aggregate_unc_bucket_mcu", "aggregate_unc_bucket_other",
    "threshold_exceeded")}
# Event types a healthy GPU of each branch supports (R580 measured on the H200: 0xff9f).
EVENTS = {535: 0x9F, 550: 0x9F, 570: 0xFF9F, 580: 0xFF9F}


def load(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def save(name: str, data: dict[str, Any]) -> None:
    data["name"] = name
    (SCENARIOS / f"{name}.json").write_text(dump_scenario(data))


def with_health(gpu: dict[str, Any], health: dict[str, Any]) -> None:
    """Add the issue-10 health keys a GPU lacks, and keep what an R550 driver cannot
    answer out (the fabric health summary is R580+)."""
    for key, value in health.items():
        gpu.setdefault(key, copy.deepcopy(value))
    gpu.setdefault("sram_ecc", dict(SRAM_CLEAN))
    if isinstance(gpu.get("fabric"), dict):
        gpu["fabric"].pop("health_summary", None)


def as_branch(base: dict[str, Any], branch: int, driver: str, cuda: int, what: str) -> dict[str, Any]:
    """The base node as a driver of ``branch`` reports it."""
    node = copy.deepcopy(base)
    node["driver_version"], node["cuda_driver_version"] = driver, cuda
    node["nvml_version"] = f"{cuda // 1000}.{driver}"
    node["description"] = what
    for gpu in node["gpus"]:
        gpu["supported_event_types"] = EVENTS[branch]
        if branch < 550:
            gpu.pop("sram_ecc", None)  # nvmlDeviceGetSramEccErrorStatus arrived in R550
        if branch >= 570:
            gpu["recovery_action"] = 0
        else:
            gpu.pop("recovery_action", None)
        fabric = gpu.get("fabric")
        if fabric is not None:
            if branch < 580:
                fabric.pop("health_summary", None)  # the v3 struct arrived in R580
            if branch < 550:
                fabric.pop("health_mask", None)  # only the v1 call before R550
    return node


def h200_node() -> dict[str, Any]:
    node = json.loads(H200_RECORD.read_text())
    node["description"] = ("Real H200 141GB (driver 580.159.04, CUDA 13.0), recorded with slurmgpu sim "
                           "record; clocks, HBM temperature, PCIe replays, recovery action and SRAM "
                           "status from the same node's nvidia-smi -q -x")
    gpu = node["gpus"][0]
    gpu.update({
        "clocks": {"graphics": 345, "sm": 345, "mem": 3201},
        "max_clocks": {"graphics": 1980, "sm": 1980, "mem": 3201},
        "violations": {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0},
        "memory_temperature": 40,
        "pcie_replay_counter": 0,
        "recovery_action": 0,
        "sram_ecc": dict(SRAM_CLEAN),
    })
    return node


def fault(base: dict[str, Any], name: str, what: str, change: dict[int, dict[str, Any]]) -> None:
    node = copy.deepcopy(base)
    node["description"] = what
    for index, keys in change.items():
        node["gpus"][index].update(copy.deepcopy(keys))
    save(name, node)


def host_fault(base: dict[str, Any], name: str, what: str, top: dict[str, Any],
               gpus: dict[int, dict[str, Any]] | None = None) -> None:
    """A fault outside NVML's GPU objects: top-level keys (``host``, ``init_error``)."""
    node = copy.deepcopy(base)
    node.update(copy.deepcopy(top))
    fault(node, name, what, gpus or {})


def host_faults(h100: dict[str, Any]) -> None:
    host_fault(h100, "fault-disk-full", "h100-sxm-8 with /tmp full: 200 MiB free of 500 GiB",
               {"host": {"disks": {"/tmp": {"total": 500 << 30, "free": 200 << 20, "read_only": False},
                                   "/var": {"total": 500 << 30, "free": 400 << 30, "read_only": False}}}})
    host_fault(h100, "fault-fabricmanager-down",
               "h100-sxm-8 with nvidia-fabricmanager failed (CUDA fails on every GPU)",
               {"host": {"services": {"nvidia-fabricmanager": {
                   "LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "NRestarts": 0,
                   "Result": "exit-code"}}}})
    host_fault(h100, "fault-peermem-missing",
               "h100-sxm-8 without nvidia_peermem (proprietary kernel module: no dma-buf either)",
               {"host": {"modules": []}})
    host_fault(h100, "fault-driver-mismatch",
               "h100-sxm-8 after a driver upgrade without a reboot: kernel module 550.90.07, NVML "
               "library 550.127.05, nvmlInit fails with LIB_RM_VERSION_MISMATCH",
               {"init_error": 18, "nvml_version": "12.550.127.05"})
    sxid = ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 30 Sub-engine instance 00")
    host_fault(h100, "fault-sxid-fatal",
               "h100-sxm-8 whose kernel log holds a fatal NVSwitch SXid: 20034 LTSSM Fault Up on nvidia-nvswitch0",
               {"host": {"kmsg": list(sxid)}})
    host_fault(h100, "fault-gpu-hang",
               "h100-sxm-8 with GPU 3 hung: every NVML call on it blocks; a process in D state holds "
               "/dev/nvidia3",
               {"host": {"hung_processes": [{"pid": 4242, "command": "python3", "devices": ["/dev/nvidia3"]}]}},
               {3: {"hang": True}})


def main() -> None:
    h100, a100 = load("h100-sxm-8"), load("a100-sxm-8")
    for gpu in h100["gpus"]:
        with_health(gpu, H100_HEALTH)
    for gpu in a100["gpus"]:
        with_health(gpu, A100_HEALTH)
    save("h100-sxm-8", h100)
    save("a100-sxm-8", a100)
    for path in sorted(SCENARIOS.glob("fault-*.json")):
        node = json.loads(path.read_text())
        for gpu in node["gpus"]:
            with_health(gpu, H100_HEALTH)
        save(path.stem, node)

    save("h100-sxm-8-r535", as_branch(h100, 535, "535.183.01", 12020,
         "Healthy HGX H100 80GB SXM5 node on R535: driver 535.183.01 / CUDA 12.2 (no TemperatureV, "
         "no GpuFabricInfoV, no SRAM status, no recovery action)"))
    save("h100-sxm-8-r570", as_branch(h100, 570, "570.133.20", 12080,
         "Healthy HGX H100 80GB SXM5 node on R570: driver 570.133.20 / CUDA 12.8 (fabric v2 struct, "
         "recovery action and health events)"))
    save("a100-sxm-8-r535", as_branch(a100, 535, "535.183.01", 12020,
         "Healthy DGX A100 80GB SXM4 node on R535: driver 535.183.01 / CUDA 12.2"))
    save("h200-r580", h200_node())

    unknown = {name: 999 for name in (
        "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrPcieLinkWidth")}
    fault(h100, "fault-nvml-unknown-error",
          "h100-sxm-8 with GPU 4 answering Unknown Error to its ECC, remap, temperature, clock and PCIe "
          "queries (a hung GSP)", {4: {"errors": unknown}})
    reset = {name: 16 for name in unknown}
    fault(h100, "fault-reset-required",
          "h100-sxm-8 with GPU 1 answering GPU_REQUIRES_RESET to its ECC, remap, temperature, clock and "
          "PCIe queries", {1: {"errors": reset}})
    brake = {gpu: {"clocks_event_reasons": 0x88, "clocks": {"graphics": 86, "sm": 86, "mem": 2619},
                   "violations": {"power": 0, "thermal": 0, "board_limit": 40_000_000_000,
                                  "reliability": 0}}
             for gpu in range(8)}
    fault(h100, "fault-power-brake",
          "h100-sxm-8 with all 8 GPUs power-braked (HW slowdown + HW power brake) to 86 of 1980 MHz",
          brake)
    fault(h100, "fault-hbm-hot", "h100-sxm-8 with GPU 3's HBM at 95 C (memory max 95 C)",
          {3: {"memory_temperature": 95}})
    fault(h100, "fault-sram-threshold", "h100-sxm-8 with GPU 6's SRAM ECC errors over the threshold",
          {6: {"sram_ecc": {**SRAM_CLEAN, "volatile_unc_parity": 3, "aggregate_unc_parity": 3,
                            "threshold_exceeded": 1}}})
    fault(h100, "fault-gpu-hot", "h100-sxm-8 with GPU 0 at 95 C (slowdown at 87 C)",
          {0: {"temperature": 95}})
    h100_570 = load("h100-sxm-8-r570")
    fault(h100_570, "fault-recovery-action",
          "h100-sxm-8-r570 with GPU 2's driver recovery action GPU_RESET "
          "(NVML field 230, R570+; fields 226/227 on R560)",
          {2: {"recovery_action": 1}})
    host_faults(h100)


if __name__ == "__main__":
    main()
