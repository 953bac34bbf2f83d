"""`slurmgpu remediate reset --gpu N` over the fake libnvidia-ml.so.1 and the simulator's
`nvidia-smi -r`: refused while a process holds the GPU; a reset clears a transient fault
and not a persistent one; the fake's process list through the unmodified pynvml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.nvidia_smi import reset_scenario_gpu
from slurmgpu.sim.scenario import load_scenario
from tests.simfixtures import ScenarioFactory, run_pynvml, sim_env

BIG = 4 << 30


def slurmgpu(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def reset(env: dict[str, str], gpu: int) -> tuple[int, dict[str, Any]]:
    proc = slurmgpu(env, "remediate", "reset", "--gpu", str(gpu), "--json")
    return proc.returncode, json.loads(proc.stdout)


def gemm_verdict(env: dict[str, str]) -> str:
    proc = slurmgpu(env, "validate", "--tests", "gemm", "--json")
    verdict: str = json.loads(proc.stdout)["verdict"]
    return verdict


def test_the_fake_lists_a_gpus_processes_through_pynvml(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def busy(data: dict[str, Any]) -> None:
        data["gpus"][1]["processes"] = [{"pid": 4242, "used_memory": BIG},
                                        {"pid": 77, "type": "graphics"}, {"pid": 4243}]

    env = sim_env(fake_nvml_lib, scenario_file("h100-sxm-8", busy))
    got = run_pynvml("""
        N.nvmlInit()
        h = [N.nvmlDeviceGetHandleByIndex(i) for i in (0, 1)]
        emit({"idle": len(N.nvmlDeviceGetComputeRunningProcesses(h[0])),
              "compute": [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(h[1])],
              "graphics": [p.pid for p in N.nvmlDeviceGetGraphicsRunningProcesses(h[1])]})
    """, env)
    assert got == {"idle": 0, "compute": [[4242, BIG], [4243, 0]], "graphics": [77]}


def test_reset_is_refused_while_a_process_holds_the_gpu(fake_nvml_lib: Path,
                                                        scenario_file: ScenarioFactory) -> None:
    def busy(data: dict[str, Any]) -> None:
        data["gpus"][3]["processes"] = [{"pid": 31337, "used_memory": BIG}]

    path = scenario_file("fault-sdc", busy)
    env = sim_env(fake_nvml_lib, path)
    code, out = reset(env, 3)
    assert (code, out["action"], out["processes"], out["command"]) == (1, "refused", [31337], [])
    assert "in use by process(es) 31337" in out["message"]
    assert "resets" not in load_scenario(path)["gpus"][3]  # nvidia-smi never ran
    assert gemm_verdict(env) == "FAIL"


def test_a_reset_clears_a_transient_fault(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    path = scenario_file("fault-sdc")  # GPU 3 computes a wrong product
    env = sim_env(fake_nvml_lib, path)
    assert gemm_verdict(env) == "FAIL"
    code, out = reset(env, 3)
    assert (code, out["action"], out["exit_code"]) == (0, "reset", 0), out
    assert "was successfully reset" in out["message"]
    assert gemm_verdict(env) == "OK"


def test_a_reset_leaves_a_persistent_fault(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def persistent(data: dict[str, Any]) -> None:
        data["gpus"][3]["persistent"] = True

    path = scenario_file("fault-sdc", persistent)
    env = sim_env(fake_nvml_lib, path)
    code, out = reset(env, 3)
    assert (code, out["action"]) == (0, "reset")
    assert load_scenario(path)["gpus"][3]["resets"] == 1
    assert gemm_verdict(env) == "FAIL"


def test_a_lost_gpu_cannot_be_reset(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    path = scenario_file("fault-gpu-lost")  # GPU 5
    proc = slurmgpu(sim_env(fake_nvml_lib, path), "remediate", "reset", "--gpu", "5", "--json")
    assert proc.returncode == 3  # NVML cannot say who holds a lost GPU: nothing is reset
    assert json.loads(proc.stdout)["action"] == "unknown" and "GPU 5" in proc.stderr
    assert "resets" not in load_scenario(path)["gpus"][5]


def test_what_a_reset_clears_and_keeps() -> None:
    data = load_scenario("fault-row-remap-pending")
    gpu = data["gpus"][2]
    gpu["ecc"]["uncorrected"] = {"volatile": 2, "aggregate": 5}
    gpu["remapped_rows"]["failure"] = 1
    gpu["nvlink"][0]["state"] = 0
    reset_scenario_gpu(data, 2)
    assert gpu["remapped_rows"]["pending"] == 0 and gpu["remapped_rows"]["failure"] == 1
    assert gpu["ecc"]["uncorrected"] == {"volatile": 0, "aggregate": 5}
    assert gpu["nvlink"][0]["state"] == 1 and gpu["resets"] == 1


@pytest.mark.parametrize("args", [["--gpu", "-1"], []])
def test_bad_arguments_change_nothing(fake_nvml_lib: Path, scenario_file: ScenarioFactory, args: list[str]) -> None:
    path = scenario_file("fault-sdc")
    proc = slurmgpu(sim_env(fake_nvml_lib, path), "remediate", "reset", *args)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1
    assert "resets" not in load_scenario(path)["gpus"][3]
