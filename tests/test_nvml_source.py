"""The real NVML source (slurmgpu.sources.nvml) through the real pynvml and the fake
libnvidia-ml.so.1. pynvml caches its library per process, so each case runs in a
subprocess that prints the collected facts as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.facts import NvmlFacts, from_dict
from tests.simfixtures import ScenarioFactory, sim_env

COLLECT = """
import json, os, sys
from dataclasses import asdict
from slurmgpu.sources.nvml import PynvmlSource
scope = json.loads(sys.argv[1])
facts = PynvmlSource(os.environ["SLURMGPU_NVML_LIBRARY"]).collect(frozenset(scope) if scope is not None else None)
print(json.dumps(asdict(facts)))
"""


def collect(env: dict[str, str], scope: list[int] | None = None) -> NvmlFacts:
    proc = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(scope)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return from_dict(NvmlFacts, json.loads(proc.stdout))


def test_healthy_h100_node(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    facts = collect(sim_env(fake_nvml_lib, scenario_file("h100-sxm-8")))
    assert facts.available and facts.error is None
    assert facts.driver_version == "550.90.07" and facts.cuda_driver_version == "12.4"
    assert facts.device_count == 8 and [g.index for g in facts.gpus] == list(range(8))
    g = facts.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.uuid and g.uuid.startswith("GPU-")
    assert g.serial and g.pci_bus_id and g.vbios and g.vbios.startswith("96.00")
    assert g.persistence_mode is True and g.mig_current is False and g.ecc_enabled is True
    assert g.ecc is not None and g.ecc.uncorrected_volatile == 0
    assert g.remapped_rows is not None and not g.remapped_rows.pending
    assert g.retired_pages is None  # not in the scenario -> NotSupported -> not applicable
    assert g.temperature_c is not None and g.slowdown_temp_c == 87 and g.shutdown_temp_c == 92
    assert g.power_limit_w == 700.0 and g.power_w is not None
    assert g.clocks_event_reasons == 0x1
    assert g.pcie is not None and (g.pcie.gen_max, g.pcie.width_max) == (5, 16)
    assert g.nvlinks is not None and len(g.nvlinks) == 18 and all(link.active for link in g.nvlinks)
    assert g.nvlinks[0].replay == 0
    assert g.fabric is not None and g.fabric.state == 3 and g.fabric.status == 0
    # R550: no v3 struct, so the v2 struct's health mask (no summary); no TemperatureV, so
    # the temperature comes from the deprecated call
    assert g.fabric.health_summary is None and g.fabric.health_mask == 0xAA
    assert g.fabric.struct_version == 2 and g.temperature_c == 34
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz, g.memory_temp_c, g.memory_max_temp_c) == (345, 1980, 33, 95)
    assert g.throttle_ns == {"power": 0, "thermal": 0, "board_limit": 0, "reliability": 0}
    assert g.pcie_replay == 0 and g.sram_threshold_exceeded is False
    assert g.recovery_action is None  # field 230 is R570+: not applicable on R550
    assert all(not gpu.errors for gpu in facts.gpus), [gpu.errors for gpu in facts.gpus]
    assert len({gpu.uuid for gpu in facts.gpus}) == 8


def test_a100_has_12_links_and_no_fabric(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    facts = collect(sim_env(fake_nvml_lib, scenario_file("a100-sxm-8")))
    g = facts.gpus[0]
    assert g.nvlinks is not None and len(g.nvlinks) == 12
    assert g.fabric is None
    assert g.pcie is not None and g.pcie.gen_max == 4


def test_not_supported_is_not_applicable(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def strip(data: dict[str, Any]) -> None:
        for key in ("nvlink", "fabric", "remapped_rows", "ecc", "mig", "pcie"):
            data["gpus"][1].pop(key, None)

    facts = collect(sim_env(fake_nvml_lib, scenario_file("h100-sxm-8", strip)))
    g = facts.gpus[1]
    assert (g.nvlinks, g.fabric, g.remapped_rows, g.ecc, g.mig_current, g.pcie) == (None,) * 6
    assert g.errors == {}


def test_other_errors_are_recorded_not_raised(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def forced(data: dict[str, Any]) -> None:
        data["gpus"][2]["errors"] = {"nvmlDeviceGetPowerUsage": 4, "nvmlDeviceGetRemappedRows": 999}

    facts = collect(sim_env(fake_nvml_lib, scenario_file("h100-sxm-8", forced)))
    g = facts.gpus[2]
    assert g.power_w is None and "power" in g.errors and "Permission" in g.errors["power"]
    assert g.remapped_rows is None and "remapped_rows" in g.errors
    assert g.temperature_c is not None  # the rest still collected


def test_lost_gpu(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    facts = collect(sim_env(fake_nvml_lib, scenario_file("fault-gpu-lost")))
    lost = [g.index for g in facts.gpus if g.lost]
    assert lost == [5] and facts.gpus[5].uuid is None
    assert not facts.gpus[4].lost and facts.gpus[4].uuid


def test_driver_not_loaded_is_a_clear_fact(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    facts = collect(sim_env(fake_nvml_lib, scenario_file("h100-sxm-8", lambda d: d.update(init_error=9))))
    assert not facts.available and facts.error and "driver not loaded" in facts.error.lower()


def test_missing_library_is_a_clear_fact(tmp_path: Path, scenario_file: ScenarioFactory) -> None:
    env = sim_env(tmp_path / "nowhere" / "libnvidia-ml.so.1", scenario_file())
    facts = collect(env)
    assert not facts.available and facts.error
    assert facts.error.startswith("NVIDIA driver not loaded / libnvidia-ml.so.1 not found")


def test_scope_collects_only_requested_gpus(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    facts = collect(sim_env(fake_nvml_lib, scenario_file()), scope=[1, 6, 12])
    assert [g.index for g in facts.gpus] == [1, 6] and facts.device_count == 8


def test_fault_injected_while_process_runs(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    """One process collects, the scenario changes under it, the next collect sees it."""
    path = scenario_file()
    code = textwrap.dedent("""
        import json, os, sys
        from slurmgpu.sources.nvml import PynvmlSource
        source = PynvmlSource(os.environ["SLURMGPU_NVML_LIBRARY"])
        before = source.collect()
        print(json.dumps([before.gpus[3].remapped_rows.pending, before.gpus[3].lost]), flush=True)
        sys.stdin.readline()  # the test rewrites the scenario now
        after = source.collect()
        print(json.dumps([after.gpus[3].remapped_rows.pending, after.gpus[6].lost]), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=sim_env(fake_nvml_lib, path),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert json.loads(proc.stdout.readline()) == [False, False]

        def inject(data: dict[str, Any]) -> None:
            data["gpus"][3]["remapped_rows"]["pending"] = True
            data["gpus"][6]["lost"] = True

        scenario_file.update(path, inject)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == [True, True]
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_retry_delay_is_bounded() -> None:
    """A config value of inf or nan must neither hang a gather nor crash it."""
    from slurmgpu.sources.nvml import MAX_RETRY_DELAY_S, PynvmlSource

    assert PynvmlSource(retry_delay_s=float("inf")).retry_delay_s == MAX_RETRY_DELAY_S
    assert PynvmlSource(retry_delay_s=float("nan")).retry_delay_s == 0.0
    assert PynvmlSource(retry_delay_s=-1).retry_delay_s == 0.0
    assert PynvmlSource(retry_delay_s=0.2).retry_delay_s == 0.2


def test_the_source_takes_its_library_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources take plain arguments: ``$SLURMGPU_NVML_LIBRARY`` reaches the source through
    the settings (the caller passes ``settings.nvml.library``), not read by the source."""
    from slurmgpu.config.load import parse_config
    from slurmgpu.sources.nvml import PynvmlSource

    monkeypatch.setenv("SLURMGPU_NVML_LIBRARY", "/env/libnvidia-ml.so.1")
    assert PynvmlSource().library is None
    assert PynvmlSource("").library is None
    assert PynvmlSource("/given/libnvidia-ml.so.1").library == "/given/libnvidia-ml.so.1"
    settings = parse_config('[nvml]\nlibrary = "/file/libnvidia-ml.so.1"\n').settings_for(None)
    assert settings.nvml.library == "/env/libnvidia-ml.so.1"  # (the variable still wins)
    assert PynvmlSource(settings.nvml.library).library == "/env/libnvidia-ml.so.1"
