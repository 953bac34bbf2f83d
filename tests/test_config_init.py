"""`slurmgpu config init --from-this-node`: a drop-in pinning what the node has, run on the
simulator's healthy nodes and on the recorded real H200, then held against other nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slurmgpu.config.from_node import baseline, render
from slurmgpu.config.schema import IbSettings
from slurmgpu.testing import make_facts
from tests.simfixtures import ScenarioFactory, sim_env

REPO = Path(__file__).resolve().parent.parent
REAL_H200 = REPO / "tests" / "data" / "recorded" / "h200-r580.scenario.json"
SYSFS = REPO / "tests" / "data" / "sysfs"
LIVE = REPO / "etc" / "slurmgpu.toml"
HEALTHY = ("h100-sxm-8", "h100-sxm-8-r570", "a100-sxm-8-r535", "h200-r580")


def slurmgpu(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """The packages' live config, copied: drop-ins go to <tmp>/etc/slurmgpu.d."""
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "slurmgpu.toml"
    config.write_text(LIVE.read_text())
    return config


def node_env(lib: Path, scenario: Path, tmp_path: Path, ib: str = "ib-healthy") -> dict[str, str]:
    return sim_env(lib, scenario, SLURMGPU_SYSFS_ROOT=str(SYSFS / ib),
                   SLURMGPU_STATE_DIR=str(tmp_path / "state"))


def init_then_check(env: dict[str, str], config: Path, check_env: dict[str, str] | None = None
                    ) -> tuple[dict, dict]:
    """Run config init (default drop-in), then check with it; (the drop-in, the check JSON)."""
    made = slurmgpu("config", "init", "--from-this-node", "--config", str(config), env=env)
    assert made.returncode == 0, made.stderr
    dropin = config.parent / "slurmgpu.d" / "50-this-node.toml"
    checked = slurmgpu("check", "--json", "--config", str(config), env=check_env or env)
    assert checked.returncode in (0, 1, 2), checked.stderr
    return tomllib.loads(dropin.read_text()), json.loads(checked.stdout)


def failing(report: dict) -> set[tuple[str, int | None]]:
    return {(f["check"], f["gpu"]) for f in report["findings"] if f["severity"] == "FAIL"}


def pinned_ok(report: dict) -> set[str]:
    return {f["check"] for f in report["findings"] if f["severity"] == "OK" and "not" not in f["message"]}


@pytest.mark.parametrize("scenario", HEALTHY)
def test_a_healthy_node_passes_its_own_pins(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                            etc: Path, tmp_path: Path, scenario: str) -> None:
    env = node_env(fake_nvml_lib, scenario_file(scenario), tmp_path)
    pins, report = init_then_check(env, etc)
    assert pins["gpu"]["count"] >= 1 and pins["pins"]["driver"] and pins["gpu"]["model"]
    assert pins["ib"] == {"count": 8, "rate_gbps": 400.0}
    assert report["verdict"] in ("OK", "WARN") and not failing(report)
    assert {"gpu.count", "gpu.model", "pin.driver", "pin.vbios", "ib.count", "ib.rate"} <= pinned_ok(report)


def test_the_recorded_real_h200(fake_nvml_lib: Path, etc: Path, tmp_path: Path) -> None:
    """One H200, no NVLink, no InfiniBand, as the real node was (tests/data/recorded)."""
    env = node_env(fake_nvml_lib, REAL_H200, tmp_path, ib="none")
    pins, report = init_then_check(env, etc)
    assert pins["gpu"] == {"count": 1, "model": ["NVIDIA H200"]}
    assert pins["pins"]["driver"] == ["580.159.04"] and pins["pins"]["vbios"] == ["96.00.A5.00.1A"]
    assert "ib" not in pins and "nvlink" not in pins
    text = (etc.parent / "slurmgpu.d" / "50-this-node.toml").read_text()
    assert "# Not pinned: nvlink.links: no active NVLink" in text and "no InfiniBand port" in text
    assert report["verdict"] == "OK", failing(report)


@pytest.mark.parametrize(("other", "ib", "caught"), [
    ("h100-sxm-8-r535", "ib-healthy", {("pin.driver", None)}),
    ("fault-gpu-missing", "ib-healthy", {("gpu.count", None)}),
    ("fault-nvlink-down", "ib-healthy", {("nvlink.state", 7)}),
    ("a100-sxm-8", "ib-healthy", {("pin.vbios", i) for i in range(8)} | {("gpu.model", i) for i in range(8)}),
    ("h100-sxm-8", "ib-rate-downgraded", None),
])
def test_the_pins_catch_a_node_that_differs(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                            etc: Path, tmp_path: Path, other: str, ib: str,
                                            caught: set[tuple[str, int | None]] | None) -> None:
    env = node_env(fake_nvml_lib, scenario_file("h100-sxm-8"), tmp_path)
    other_node = scenario_file(other, filename="other.json")
    _, report = init_then_check(env, etc, node_env(fake_nvml_lib, other_node, tmp_path, ib))
    fails = failing(report)
    if caught is None:
        assert {check for check, _ in fails} == {"ib.rate"}
    else:
        assert caught <= fails, fails


def test_init_never_replaces_a_file_and_prints_with_dash(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                                        etc: Path, tmp_path: Path) -> None:
    env = node_env(fake_nvml_lib, scenario_file("h100-sxm-8"), tmp_path)
    target = etc.parent / "site.toml"
    target.write_text("# the site's\n")
    refused = slurmgpu("config", "init", "--from-this-node", "--out", str(target), env=env)
    assert refused.returncode == 3 and "exists (--force replaces it)" in refused.stderr
    assert target.read_text() == "# the site's\n"
    printed = slurmgpu("config", "init", "--from-this-node", "--out", "-", env=env)
    assert printed.returncode == 0 and tomllib.loads(printed.stdout)["gpu"]["count"] == 8
    assert slurmgpu("config", "init", env=env).returncode == 3


def test_what_looks_wrong_is_said_not_blessed() -> None:
    facts = make_facts(gpus=2, ib_ports=2)
    facts.gpus[1].nvlinks = facts.gpus[1].nvlinks[:-1]  # type: ignore[index]
    facts.ib.hcas[1].ports[0].state = "DOWN"
    found = baseline(facts, IbSettings())
    assert found.tables["nvlink"]["links"] == len(facts.gpus[0].nvlinks or [])
    assert found.tables["ib"]["count"] == 2
    assert any("GPU 1 has" in n for n in found.notes)
    assert any("not ACTIVE: " + facts.ib.hcas[1].name + "/" in n for n in found.notes)
    assert "# NOTE: GPU 1 has" in render(facts, found, generator="test")
