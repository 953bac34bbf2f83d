"""Replays: a recorded node, run through the fake libnvidia-ml.so.1, must give the verdict
the real driver gave. Recordings come from GPU machines (tools/gpu-window.sh); the
record -> replay pipeline itself is proven here on simulated nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simfixtures import ScenarioFactory, sim_env

RECORDED = Path(__file__).parent / "data" / "recorded"
RECORDINGS = sorted(RECORDED.glob("*.scenario.json"))
# What tools/gpu-window.sh checks on a lent machine: no site pins, no InfiniBand.
REPLAY_CONFIG = '[checks]\ndisabled = ["ib.*", "pin.*"]\n'


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def problems(report: dict) -> list[tuple[str, str, int | None]]:
    return sorted((f["check"], f["severity"], f["gpu"]) for f in report["findings"] if f["severity"] != "OK")


def check_json(env: dict[str, str], config: Path) -> dict:
    proc = run("check", "--json", "--config", str(config), "--node", "recorded", env=env)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("recording", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_recorded_node_replays_to_the_same_verdict(fake_nvml_lib: Path, tmp_path: Path,
                                                   recording: Path) -> None:
    expected = json.loads(recording.with_name(recording.name.replace(".scenario.", ".check.")).read_text())
    config = tmp_path / "replay.toml"
    config.write_text(REPLAY_CONFIG)
    replay = check_json(sim_env(fake_nvml_lib, recording), config)
    assert replay["verdict"] == expected["verdict"]
    assert problems(replay) == problems(expected)


@pytest.mark.parametrize("scenario", ["h100-sxm-8", "fault-ecc-dbe", "fault-gpu-lost", "fault-nvlink-down",
                                      "h100-sxm-8-r535", "h100-sxm-8-r570", "h200-r580"])
def test_record_then_replay_keeps_the_verdict(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                              tmp_path: Path, scenario: str) -> None:
    """What tools/gpu-window.sh does on a real node, done on a simulated one."""
    config = tmp_path / "replay.toml"
    config.write_text(REPLAY_CONFIG)
    source_env = sim_env(fake_nvml_lib, scenario_file(scenario))
    original = check_json(source_env, config)
    recording = tmp_path / "node.scenario.json"
    proc = run("sim", "record", "--out", str(recording), env=source_env)
    assert proc.returncode == 0, proc.stderr
    replay = check_json(sim_env(fake_nvml_lib, recording), config)
    assert replay["verdict"] == original["verdict"]
    assert problems(replay) == problems(original)
    assert replay["facts"]["nvml"]["gpus"] == original["facts"]["nvml"]["gpus"]


def test_recording_keeps_the_capability_profile(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                                 tmp_path: Path) -> None:
    """An R535 node lacks calls: the recording says which, and its replay lacks them too
    (even under a newer driver_version), so the same fallbacks run."""
    source_env = sim_env(fake_nvml_lib, scenario_file("h100-sxm-8-r535"))
    recording = tmp_path / "r535.scenario.json"
    assert run("sim", "record", "--out", str(recording), env=source_env).returncode == 0
    data = json.loads(recording.read_text())
    assert data["missing_functions"] == ["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetSramEccErrorStatus",
                                         "nvmlDeviceGetTemperatureV"]
    gpu = data["gpus"][0]
    assert "health_mask" not in gpu["fabric"] and "sram_ecc" not in gpu and "recovery_action" not in gpu
    data["driver_version"] = "580.159.04"  # replay under a driver the fake takes as newest
    recording.write_text(json.dumps(data))
    replay = sim_env(fake_nvml_lib, recording)
    config = tmp_path / "replay.toml"
    config.write_text(REPLAY_CONFIG)
    facts = check_json(replay, config)["facts"]["nvml"]["gpus"][0]
    assert facts["fabric"]["struct_version"] == 1 and facts["temperature_c"] == 34
