"""One-shot checks take their own second sample of a clock brake (issue 28, item 5): a node
power-braked to 4 % of its clock fails `slurmgpu check` and the cold prolog as it fails the
agent's second poll; a brake flag at full clock stays a warning, and costs no second sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources, evaluate, gather, second_brake_sample
from slurmgpu.facts import CLOCKS_EVENT_HW_THROTTLE, NodeFacts, NvmlFacts
from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource, make_facts
from tests.simfixtures import ScenarioFactory, sim_env

REPO = Path(__file__).resolve().parent.parent
SIM_CONFIG = (REPO / "etc" / "sim-h100.toml").read_text(encoding="utf-8")
POWER_BRAKE = 0x80


def check_json(tmp_path: Path, env: dict[str, str], resample_s: float) -> tuple[int, dict[str, Any]]:
    config = tmp_path / "check.toml"
    config.write_text(SIM_CONFIG + f"\n[thermal]\nbrake_resample_s = {resample_s}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--node", "gpu-h100-001",
                           "--config", str(config)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def problems(report: dict[str, Any], check: str) -> list[tuple[str, int | None]]:
    return sorted((f["severity"], f["gpu"]) for f in report["findings"]
                  if f["check"] == check and f["severity"] != "OK")


def test_a_held_power_brake_fails_the_one_shot_check(tmp_path: Path, fake_nvml_lib: Path,
                                                     scenario_file: ScenarioFactory) -> None:
    """All 8 GPUs held at 86 of 1,980 MHz by the power brake: FAIL (was WARN, exit 1)."""
    code, report = check_json(tmp_path, sim_env(fake_nvml_lib, scenario_file("fault-power-brake")), 0.2)
    assert problems(report, "thermal.clock_brake") == [("FAIL", i) for i in range(8)]
    assert all("(sustained)" in f["message"] for f in report["findings"] if f["check"] == "thermal.clock_brake")
    assert code == 2 == report["exit_code"]


def test_a_brake_flag_at_full_clock_warns_and_takes_no_second_sample(
        tmp_path: Path, fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    def full_clock(data: dict[str, Any]) -> None:
        for gpu in data["gpus"]:
            gpu["clocks"]["sm"] = gpu["clocks"]["graphics"] = gpu["max_clocks"]["sm"]

    path = scenario_file("fault-power-brake", full_clock)
    code, report = check_json(tmp_path, sim_env(fake_nvml_lib, path), 5.0)
    assert problems(report, "thermal.throttle") == [("WARN", i) for i in range(8)]
    assert problems(report, "thermal.clock_brake") == []
    assert code == 1
    assert report["duration_ms"] < 4000  # a second sample would have waited brake_resample_s (5 s)


COLD_PROLOG = r"""
import json, os, sys
from slurmgpu.config.load import parse_config
from slurmgpu.engine import source_facts, system_sources
from slurmgpu.gate import Gate
from slurmgpu.testing import FakeSlurmClient
settings = parse_config(sys.argv[1]).settings_for("gpu-n1")
environ = {**os.environ, "SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1",
           "SLURM_JOB_USER": "alice"}
client = FakeSlurmClient(["gpu-n1"])
gate = Gate(settings, environ, lambda: client, source_facts(system_sources(settings), settings, environ),
            exit=lambda code: None)
print("RESULT " + json.dumps({"rc": gate.prolog(), "drains": [reason for _, _, reason in client.calls]}))
"""


def test_the_cold_prolog_refuses_a_held_power_brake(tmp_path: Path, fake_nvml_lib: Path,
                                                    scenario_file: ScenarioFactory) -> None:
    """The cold path's facts (``source_facts`` over the real NVML source) on the simulator;
    only Slurm is a stand-in."""
    env = {**sim_env(fake_nvml_lib, scenario_file("fault-power-brake")),
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_KMSG": str(tmp_path / "kmsg")}
    config = SIM_CONFIG + "\n[thermal]\nbrake_resample_s = 0.2\n"
    proc = subprocess.run([sys.executable, "-c", COLD_PROLOG, config], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr
    result = json.loads(line[len("RESULT "):])
    assert result["rc"] != 0
    assert [r.split(" GPU")[0] for r in result["drains"]] == ["slurmgpu: thermal.clock_brake"]


class RecoveringNvml(FakeNvmlSource):
    """A brake that is gone by the second sample."""

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        facts = super().collect(gpus)
        if len(self.calls) > 1:
            for gpu in facts.gpus:
                gpu.clocks_event_reasons, gpu.sm_clock_mhz = 0, gpu.sm_clock_max_mhz
        return facts


def braked_node() -> NodeFacts:
    facts = make_facts("n1", gpus=8)
    for gpu in facts.gpus[:2]:
        gpu.clocks_event_reasons, gpu.sm_clock_mhz, gpu.sm_clock_max_mhz = POWER_BRAKE, 86, 1980
    assert POWER_BRAKE & CLOCKS_EVENT_HW_THROTTLE
    return facts


def test_a_brake_gone_by_the_second_sample_is_no_failure() -> None:
    first = braked_node()
    nvml = RecoveringNvml(first.nvml)
    sources = Sources(nvml, FakeIbSource(first.ib), FakeVersionSource(first.versions), FakeClock())
    settings = Settings()
    settings.thermal.brake_resample_s = 0.01
    facts = second_brake_sample(gather(sources, node="n1"), sources, settings.thermal)
    assert nvml.calls == [None, frozenset({0, 1})]  # only the braked GPUs are sampled again
    assert facts.previous is not None and facts.previous.gpus[0].sm_clock_mhz == 86
    assert evaluate(facts, settings).severity.name == "OK"  # judged as the GPUs are now
