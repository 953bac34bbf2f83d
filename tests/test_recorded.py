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


@pytest.mark.parametrize("scenario", ["h100-sxm-8", "fault-ecc-dbe", "fault-gpu-lost", "fault-nvlink-down"])
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
