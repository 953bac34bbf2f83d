"""The simulator's ``nvidia-smi -r -i N`` (``python -m slurmgpu.sim.nvidia_smi -r -i N``):
a GPU reset applied to the node's scenario (``$SLURMGPU_SIM_SCENARIO``), as strict as the
real tool: it refuses a GPU that a process holds, and cannot reset a lost GPU.

What a reset clears (``reset_scenario_gpu``) is what the driver's reset clears: volatile
ECC counts, a pending row remap or page retirement (applied by the reset), the driver's
recovery action, NVLink states and error counters, and the active tests' per-GPU faults
(a marginal GPU that the reset cleared measures healthy again). What lives in the
hardware's records stays: aggregate ECC counts, remapped rows and their failure, retired
pages. A GPU marked ``"persistent": true`` is broken hardware: the reset succeeds and
every fault is still there. docs/simulator.md, "GPU reset".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from slurmgpu.sim.scenario import load_scenario, write_scenario

#: nvidia-smi's return codes (its man page): bad argument, no such GPU, GPU lost, other.
RC_ARGUMENT, RC_NOT_FOUND, RC_GPU_LOST, RC_OTHER = 2, 6, 15, 255


def reset_scenario_gpu(data: dict[str, Any], index: int) -> None:
    """Apply a successful reset of GPU ``index`` to the scenario ``data`` in place."""
    gpu = data["gpus"][index]
    gpu["resets"] = int(gpu.get("resets", 0)) + 1
    if gpu.get("persistent"):
        return
    _clear_volatile(gpu)
    active = data.get("active") or {}
    (active.get("gpus") or {}).pop(str(index), None)
    pairs = active.get("p2p_pairs") or {}
    for key in [k for k in pairs if str(index) in k.split("-")]:
        del pairs[key]


def _clear_volatile(gpu: dict[str, Any]) -> None:
    for kind in ("corrected", "uncorrected"):
        counts = (gpu.get("ecc") or {}).get(kind)
        if isinstance(counts, dict):
            counts["volatile"] = 0
    for section in ("remapped_rows", "retired_pages"):
        if isinstance(gpu.get(section), dict):
            gpu[section]["pending"] = 0
    if "recovery_action" in gpu:
        gpu["recovery_action"] = 0
    for link in gpu.get("nvlink") or ():
        link["state"] = 1
        link["errors"] = {name: 0 for name in link.get("errors") or {}}


def _refusal(data: dict[str, Any], index: int) -> tuple[int, str] | None:
    """Why the real tool would not reset this GPU, as (return code, its words); None: it would."""
    gpus = data.get("gpus") or []
    if not 0 <= index < len(gpus):
        return RC_NOT_FOUND, f"No GPU with index {index} was found (this node has {len(gpus)})."
    gpu = gpus[index]
    bus = (gpu.get("pci") or {}).get("bus_id", f"GPU {index}")
    if gpu.get("lost"):
        return RC_GPU_LOST, f"Unable to determine the device handle for GPU {bus}: GPU is lost. " \
                            "Reboot the system to recover this GPU"
    if gpu.get("processes"):
        return RC_OTHER, f"GPU {bus} is currently in use by another process.\n\n1 device is currently being " \
                         "used by one or more other processes. Please first kill all processes using this " \
                         "device and all compute applications running in the system."
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi", add_help=False)
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-i", "--id", type=int)
    args, rest = parser.parse_known_args(argv)
    if rest or not args.gpu_reset or args.id is None:
        print("the simulated nvidia-smi only resets: nvidia-smi -r -i N", file=sys.stderr)
        return RC_ARGUMENT
    path = os.environ["SLURMGPU_SIM_SCENARIO"]
    data = load_scenario(path)
    refused = _refusal(data, args.id)
    if refused is not None:
        print(refused[1], file=sys.stderr)
        return refused[0]
    reset_scenario_gpu(data, args.id)
    write_scenario(path, data)
    bus = (data["gpus"][args.id].get("pci") or {}).get("bus_id", args.id)
    print(f"GPU {bus} was successfully reset.\nAll done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
