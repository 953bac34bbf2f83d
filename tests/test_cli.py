"""`slurmgpu check` / `checks list` end to end: a real subprocess, the real pynvml on
the fake libnvidia-ml.so.1, fixture /sys trees, exit codes and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.checks.registry import all_checks
from tests.simfixtures import ScenarioFactory, sim_env

REPO = Path(__file__).resolve().parent.parent
SIM_CONFIG = REPO / "etc" / "sim-h100.toml"
SYSFS = REPO / "tests" / "data" / "sysfs"


def slurmgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def check_json(env: dict[str, str], *args: str) -> tuple[int, dict]:
    proc = slurmgpu("check", "--json", "--node", "gpu-h100-001", *args, env=env)
    assert proc.returncode in (0, 1, 2, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def failing(report: dict) -> set[tuple[str, str, int | None]]:
    return {(f["check"], f["severity"], f["gpu"]) for f in report["findings"] if f["severity"] != "OK"}


@pytest.mark.parametrize(("scenario", "rc", "expected"), [
    ("h100-sxm-8", 0, set()),
    ("fault-ecc-dbe", 2, {("ecc.uncorrected", "FAIL", 3)}),
    ("fault-row-remap-pending", 2, {("mem.row_remap", "FAIL", 2)}),
    ("fault-row-remap-failure", 2, {("mem.row_remap", "FAIL", 6)}),
    ("fault-gpu-lost", 2, {("gpu.lost", "FAIL", 5)}),
    # a held brake: the one-shot check samples it again (brake_resample_s) and fails it
    ("fault-hw-thermal", 2, {("thermal.throttle", "WARN", 4), ("thermal.temperature", "WARN", 4),
                             ("thermal.clock_brake", "FAIL", 4)}),
    ("fault-pcie-x8", 2, {("pcie.link", "FAIL", 1)}),
    ("fault-nvlink-down", 2, {("nvlink.state", "FAIL", 7)}),
    ("fault-wrong-driver", 2, {("pin.driver", "FAIL", None), ("pin.cuda", "FAIL", None)}),
    ("fault-gpu-missing", 2, {("gpu.count", "FAIL", None)}),
    ("fault-fabric-not-started", 2, {("fabric.state", "FAIL", i) for i in range(8)}),
])
def test_each_bundled_scenario_gives_its_verdict(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                                 scenario: str, rc: int, expected: set) -> None:
    env = sim_env(fake_nvml_lib, scenario_file(scenario))
    code, report = check_json(env, "--config", str(SIM_CONFIG))
    assert failing(report) == expected
    assert code == rc == report["exit_code"]


def test_json_schema(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    _, report = check_json(sim_env(fake_nvml_lib, scenario_file()), "--config", str(SIM_CONFIG))
    assert report["schema"] == "slurmgpu.check/1"
    assert {"node", "verdict", "findings", "facts", "duration_ms", "gpus"} <= report.keys()
    assert report["node"] == "gpu-h100-001" and report["verdict"] == "OK"
    assert {"check", "severity", "gpu", "message"} <= report["findings"][0].keys()
    assert len(report["facts"]["nvml"]["gpus"]) == 8
    assert report["facts"]["nvml"]["gpus"][0]["nvlinks"][17]["active"] is True


def test_job_gpus_scope_the_gate(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    env = sim_env(fake_nvml_lib, scenario_file("fault-gpu-lost"))
    code, report = check_json(env, "--config", str(SIM_CONFIG), "--gpus", "0-3,7")
    assert code == 0 and report["gpus"] == [0, 1, 2, 3, 7]
    code, report = check_json(env, "--config", str(SIM_CONFIG), "--gpus", "5")
    assert code == 2 and failing(report) == {("gpu.lost", "FAIL", 5)}


def test_xid_from_command_line(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    env = sim_env(fake_nvml_lib, scenario_file())
    code, report = check_json(env, "--config", str(SIM_CONFIG), "--xid", "79:3", "--xid", "13:1")
    assert code == 2
    xids = {(f["data"]["xid"], f["severity"]) for f in report["findings"] if f["check"] == "xid.recent"}
    assert xids == {(79, "FAIL"), (13, "OK")}


def test_no_driver_fails_only_when_gpus_expected(tmp_path: Path) -> None:
    env = sim_env(tmp_path / "libnvidia-ml.so.1", None)
    code, report = check_json(env, "--config", str(SIM_CONFIG))
    assert code == 2
    count = next(f for f in report["findings"] if f["check"] == "gpu.count")
    assert "libnvidia-ml.so.1 not found" in count["message"]
    no_gpus = tmp_path / "login.toml"
    no_gpus.write_text("[gpu]\ncount = 0\n")
    code, report = check_json(env, "--config", str(no_gpus))
    assert code == 0, failing(report)


@pytest.mark.parametrize(("tree", "expected"), [
    ("ib-healthy", set()),
    ("ib-port-down", {("ib.port_state", "FAIL", "mlx5_3/1")}),
    ("ib-rate-downgraded", {("ib.rate", "FAIL", "mlx5_5/1")}),
])
def test_infiniband_fixture_trees(fake_nvml_lib: Path, scenario_file: ScenarioFactory, tmp_path: Path,
                                  tree: str, expected: set) -> None:
    config = tmp_path / "ib.toml"
    config.write_text('[gpu]\ncount = 8\n[ib]\ncount = 8\nrate_gbps = 400\n'
                      '[pins]\nib_firmware = ["28.39.*"]\n')
    env = sim_env(fake_nvml_lib, scenario_file(), SLURMGPU_SYSFS_ROOT=str(SYSFS / tree))
    _, report = check_json(env, "--config", str(config))
    problems = {(f["check"], f["severity"], f["subject"]) for f in report["findings"]
                if f["severity"] != "OK" and f["check"].startswith(("ib.", "pin.ib"))}
    assert problems == expected
    assert report["facts"]["ib"]["hcas"][0]["fw_ver"] == "28.39.1002"


def test_table_output_lists_problems_and_summary(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    env = sim_env(fake_nvml_lib, scenario_file("fault-nvlink-down"))
    proc = slurmgpu("check", "--config", str(SIM_CONFIG), "--node", "n1", env=env)
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["SEVERITY", "CHECK", "WHERE", "MESSAGE"]
    assert lines[1].split()[:3] == ["FAIL", "nvlink.state", "gpu7"]
    assert lines[-1].startswith("n1: FAIL - ")


@pytest.mark.parametrize(("args", "needle"), [
    (["check", "--gpus", "x"], "--gpus: 'x' is not a GPU index"),
    (["check", "--xid", "abc"], "--xid: 'abc' is not XID[:GPU[:MESSAGE]]"),
    (["check", "--bogus"], "No such option '--bogus'"),
    (["check", "--config", "/nonexistent/slurmgpu.toml"], "config file not found"),
])
def test_bad_arguments_are_one_line_and_exit_3(args: list[str], needle: str) -> None:
    proc = slurmgpu(*args)
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr
    assert proc.stderr.startswith("slurmgpu: error: ")


def test_bad_config_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu]\ncuont = 8\n")
    proc = slurmgpu("check", "--config", str(bad))
    assert proc.returncode == 3 and proc.stdout == ""
    assert str(bad) in proc.stderr and "gpu.cuont" in proc.stderr and "did you mean 'count'" in proc.stderr


def test_checks_list() -> None:
    proc = slurmgpu("checks", "list", "--json")
    assert proc.returncode == 0
    rows = json.loads(proc.stdout)
    assert [r["id"] for r in rows] == [c.id for c in all_checks()]
    assert all(r["severity"] in ("WARN", "FAIL") and r["reads"] and r["summary"] for r in rows)
    table = slurmgpu("checks", "list")
    assert "mem.row_remap" in table.stdout and table.returncode == 0


@pytest.mark.parametrize("command", [
    ["--help"], ["check", "--help"], ["checks", "list", "--help"], ["config", "check", "--help"],
    ["config", "explain", "--help"], ["sim", "--help"], ["prolog", "--help"], ["epilog", "--help"],
    ["healthcheck", "--help"], ["drain", "--help"], ["resume", "--help"], ["nodes", "--help"],
    ["sim", "cluster", "--help"], ["breaker", "status", "--help"], ["breaker", "release", "--help"],
    ["agent", "--help"], ["collector", "--help"], ["fleet", "--help"], ["keys", "--help"],
])
def test_help(command: list[str]) -> None:
    proc = slurmgpu(*command)
    assert proc.returncode == 0 and "Usage:" in proc.stdout


def test_canonical_log_line_per_check_result(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    env = sim_env(fake_nvml_lib, scenario_file("fault-gpu-lost"))
    proc = slurmgpu("check", "--json", "--config", str(SIM_CONFIG), "--log-level", "info", env=env)
    report = json.loads(proc.stdout)
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    results = [x for x in lines if x["event"] == "check_result"]
    assert len(results) == len(report["findings"])
    lost = next(x for x in results if x["check"] == "gpu.lost")
    assert lost["severity"] == "FAIL" and lost["gpu"] == 5 and lost["level"] == "warning"
    assert lines[-1]["event"] == "verdict" and lines[-1]["verdict"] == "FAIL"
    quiet = slurmgpu("check", "--json", "--config", str(SIM_CONFIG), env=env)
    assert quiet.stderr == ""
