"""slurmgpu.sim: scenarios, build, and the `slurmgpu sim` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmgpu.cli.sim import sim
from slurmgpu.errors import SimError
from slurmgpu.sim import build as build_mod
from slurmgpu.sim.build import SimToolchainError, build_library
from slurmgpu.sim.hostroot import materialize
from slurmgpu.sim.scenario import (
    SCENARIO_DIR,
    dump_scenario,
    list_scenarios,
    load_scenario,
    resolve_scenario,
    sim_environment,
    validate_scenario,
    write_scenario,
)
from tests.simfixtures import ScenarioFactory, bundled_scenario, sim_env

FAULTS = {
    "fault-ecc-dbe": {"gpus[3].ecc.uncorrected.volatile", "gpus[3].ecc.uncorrected.aggregate"},
    "fault-row-remap-pending": {"gpus[2].remapped_rows.uncorrectable", "gpus[2].remapped_rows.pending"},
    "fault-row-remap-failure": {"gpus[6].remapped_rows.uncorrectable", "gpus[6].remapped_rows.failure"},
    "fault-gpu-lost": {"gpus[5].lost"},
    "fault-hw-thermal": {"gpus[4].clocks_event_reasons", "gpus[4].temperature"},
    "fault-pcie-x8": {"gpus[1].pcie.width_current"},
    "fault-nvlink-down": {"gpus[7].nvlink[11].state"},
    "fault-fabric-not-started": {
        f"gpus[{i}].fabric.{k}" for i in range(8) for k in ("state", "health_mask")
    },
    "fault-wrong-driver": {"driver_version", "cuda_driver_version", "nvml_version"},
    "fault-nvml-unknown-error": {"gpus[4].errors"},
    "fault-reset-required": {"gpus[1].errors"},
    "fault-power-brake": {
        f"gpus[{i}].{k}" for i in range(8)
        for k in ("clocks_event_reasons", "clocks.graphics", "clocks.sm", "violations.board_limit")
    },
    "fault-hbm-hot": {"gpus[3].memory_temperature"},
    "fault-sram-threshold": {f"gpus[6].sram_ecc.{k}" for k in
                             ("volatile_unc_parity", "aggregate_unc_parity", "threshold_exceeded")},
    "fault-gpu-hot": {"gpus[0].temperature"},
    "fault-recovery-action": {"gpus[2].recovery_action"},
    "fault-disk-full": {"host"},
    "fault-fabricmanager-down": {"host"},
    "fault-peermem-missing": {"host"},
    "fault-driver-mismatch": {"init_error", "nvml_version"},
    "fault-gpu-hang": {"host", "gpus[3].hang"},
    "fault-sxid-fatal": {"host"},
}
# The healthy node each fault was made from (tools/make_scenarios.py); default h100-sxm-8.
FAULT_BASES = {"fault-recovery-action": "h100-sxm-8-r570"}


def _diff(a: Any, b: Any, path: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for k in set(a) | set(b):
            sub = f"{path}.{k}" if path else k
            out |= _diff(a.get(k), b.get(k), sub) if k in a and k in b else {sub}
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(*(_diff(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))))
    return set() if a == b else {path}


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(sim, list(args), prog_name="slurmgpu sim")


# -- scenarios ---------------------------------------------------------------------------


def test_bundled_scenarios_are_listed_and_consistent() -> None:
    names = dict(list_scenarios())
    assert {"h100-sxm-8", "a100-sxm-8", "fault-gpu-missing", *FAULTS} <= set(names)
    for name, description in names.items():
        data = load_scenario(name)
        assert data["name"] == name
        assert description
        gpus = data["gpus"]
        for key in ("uuid", "serial"):
            assert len({g[key] for g in gpus}) == len(gpus), (name, key)
        assert len({g["pci"]["bus_id"] for g in gpus}) == len(gpus)
        json.loads((SCENARIO_DIR / f"{name}.json").read_text())  # standalone valid JSON


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_scenarios_change_only_the_fault(name: str) -> None:
    healthy = bundled_scenario(FAULT_BASES.get(name, "h100-sxm-8"))
    fault = bundled_scenario(name)
    assert _diff(healthy, fault) - {"name", "description"} == FAULTS[name]


def test_fault_values() -> None:
    assert bundled_scenario("fault-ecc-dbe")["gpus"][3]["ecc"]["uncorrected"]["volatile"] > 0
    assert bundled_scenario("fault-hw-thermal")["gpus"][4]["clocks_event_reasons"] == 0x48
    assert bundled_scenario("fault-wrong-driver")["driver_version"] == "535.104.05"
    missing = bundled_scenario("fault-gpu-missing")
    healthy = bundled_scenario("h100-sxm-8")
    assert len(missing["gpus"]) == 7
    assert missing["gpus"] == healthy["gpus"][:3] + healthy["gpus"][4:]
    h100 = healthy["gpus"][0]
    assert (len(h100["nvlink"]), h100["nvlink"][0]["version"]) == (18, 6)
    assert h100["fabric"]["state"] == 3 and h100["fabric"]["health_mask"] == 0xAA
    a100 = bundled_scenario("a100-sxm-8")["gpus"][0]
    assert (len(a100["nvlink"]), a100["nvlink"][0]["version"], "fabric" in a100) == (12, 4, False)


def test_resolve_scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_scenario("h100-sxm-8") == SCENARIO_DIR / "h100-sxm-8.json"
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert resolve_scenario(own) == own.resolve()
    monkeypatch.chdir(tmp_path)
    assert resolve_scenario("mine.json") == own.resolve()
    with pytest.raises(SimError, match="did you mean 'h100-sxm-8'"):
        resolve_scenario("h100-sxm8")
    with pytest.raises(SimError, match="scenario file not found"):
        resolve_scenario(tmp_path / "nope.json")


def test_load_scenario_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "gpus": [,]\n}')
    with pytest.raises(SimError, match=r"bad\.json:2:\d+: invalid JSON"):
        load_scenario(bad)
    with pytest.raises(SimError, match="'gpus' must be a list"):
        validate_scenario({"gpus": {}})
    with pytest.raises(SimError, match="must be a JSON object"):
        validate_scenario([])
    with pytest.raises(SimError, match=r"gpus\[0\]\.nvlink must be a list"):
        validate_scenario({"gpus": [{"nvlink": 3}]})


def test_dump_and_write_scenario(tmp_path: Path) -> None:
    data = bundled_scenario("h100-sxm-8")
    text = dump_scenario(data)
    assert json.loads(text) == data
    assert max(len(line) for line in text.splitlines()) <= 200
    assert '{"state": 1, "version": 6, "errors":' in text  # one NVLink per line
    target = write_scenario(tmp_path / "s.json", data)
    assert json.loads(target.read_text()) == data
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp file left behind


def test_scenario_factory(scenario_file: ScenarioFactory) -> None:
    path = scenario_file("a100-sxm-8", lambda s: s["gpus"].pop())
    assert len(json.loads(path.read_text())["gpus"]) == 7
    scenario_file.update(path, lambda s: s.update(init_error=9))
    assert json.loads(path.read_text())["init_error"] == 9


# -- build -------------------------------------------------------------------------------


def test_build_is_cached_and_force_rebuilds(fake_nvml_lib: Path) -> None:
    assert fake_nvml_lib.name == "libnvidia-ml.so.1"
    before = fake_nvml_lib.stat()
    again = build_library(fake_nvml_lib.parent)
    assert again == fake_nvml_lib
    assert again.stat().st_ino == before.st_ino  # not rebuilt
    out = subprocess.run(["readelf", "-d", str(fake_nvml_lib)], capture_output=True, text=True,
                         check=False).stdout
    if out:
        assert "libnvidia-ml.so.1" in out  # SONAME


def test_build_force(tmp_path: Path, fake_nvml_lib: Path) -> None:
    lib = build_library(tmp_path)
    ino = lib.stat().st_ino
    assert build_library(tmp_path, force=True).stat().st_ino != ino


def test_build_default_dir_honours_env(sim_dir_env: Path) -> None:
    assert build_library() == sim_dir_env


def test_build_toolchain_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(SimToolchainError, match="apt-get install gcc"):
        build_library(tmp_path)
    monkeypatch.delenv("CC")

    monkeypatch.setenv("SLURMGPU_NVML_INCLUDE", str(tmp_path))
    with pytest.raises(SimToolchainError, match=r"has no nvml\.h"):
        build_mod.find_nvml_header()
    monkeypatch.delenv("SLURMGPU_NVML_INCLUDE")

    def no_dist(name: str) -> None:
        raise build_mod.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(build_mod.importlib.metadata, "files", no_dist)
    if not Path("/usr/local/cuda/include/nvml.h").exists():
        with pytest.raises(SimToolchainError, match="pip install nvidia-nvml-dev"):
            build_mod.find_nvml_header()

    monkeypatch.setattr(build_mod, "_CJSON_DIRS", ())
    monkeypatch.delenv("CPATH", raising=False)
    monkeypatch.delenv("C_INCLUDE_PATH", raising=False)
    with pytest.raises(SimToolchainError, match="apt-get install libcjson-dev"):
        build_mod.find_cjson_header()


def test_sim_environment(sim_dir_env: Path) -> None:
    env = sim_environment("fault-pcie-x8")
    host_root = env.pop("SLURMGPU_HOST_ROOT")
    assert env == {
        "SLURMGPU_NVML_LIBRARY": str(sim_dir_env),
        "SLURMGPU_SIM_SCENARIO": str(SCENARIO_DIR / "fault-pcie-x8.json"),
    }
    assert "Kernel Module  550.90.07 " in Path(host_root, "proc/driver/nvidia/version").read_text()
    assert all(os.path.isabs(v) for v in env.values())


# -- CLI ---------------------------------------------------------------------------------


def test_cli_help_for_every_command() -> None:
    for args in ([], ["build"], ["list"], ["show"], ["env"], ["run"], ["record"]):
        result = _invoke(*args, "--help")
        assert result.exit_code == 0, args
        assert "Usage:" in result.stdout


def test_cli_list_and_show() -> None:
    result = _invoke("list")
    assert result.exit_code == 0
    assert any(line.startswith("h100-sxm-8 ") for line in result.stdout.splitlines())
    listed = json.loads(_invoke("list", "--json").stdout)
    assert {"name": "fault-gpu-lost", "description": dict(list_scenarios())["fault-gpu-lost"]} in listed
    shown = _invoke("show", "a100-sxm-8")
    assert shown.exit_code == 0
    assert json.loads(shown.stdout) == load_scenario("a100-sxm-8")


def test_cli_bad_scenario_is_one_line_exit_3() -> None:
    for args in (["show", "h100-sxm"], ["env", "nope"], ["run", "-s", "nope", "--", "true"]):
        result = _invoke(*args)
        assert result.exit_code == 3, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("slurmgpu: error: unknown scenario"), lines
    assert "did you mean 'h100-sxm-8'" in _invoke("show", "h100-sxm").stderr


def test_cli_build_and_env(sim_dir_env: Path, tmp_path: Path) -> None:
    result = _invoke("build", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"library": str(sim_dir_env)}
    assert _invoke("build").stdout.strip() == str(sim_dir_env)

    scen = tmp_path / "it's here.json"  # needs shell quoting
    write_scenario(scen, bundled_scenario("h100-sxm-8"))
    result = _invoke("env", str(scen))
    assert result.exit_code == 0
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1"; echo "$SLURMGPU_NVML_LIBRARY"; echo "$SLURMGPU_SIM_SCENARIO"',
         "_", result.stdout],
        capture_output=True, text=True, check=True,
    )
    assert shell.stdout.splitlines() == [str(sim_dir_env), str(scen)]


def _cli_subprocess(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from slurmgpu.cli.sim import sim; sim(prog_name='slurmgpu sim')"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_cli_run_execs_command_with_fake(fake_nvml_lib: Path) -> None:
    env = sim_env(fake_nvml_lib, None, SLURMGPU_SIM_DIR=str(fake_nvml_lib.parent))
    env.pop("SLURMGPU_NVML_LIBRARY")
    child = (
        "import os, pynvml; pynvml.nvmlInit();"  # plain dlopen via LD_LIBRARY_PATH
        "h = pynvml.nvmlDeviceGetHandleByIndex(1);"
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),"
        " os.environ['SLURMGPU_SIM_SCENARIO'].endswith('fault-pcie-x8.json'),"
        " os.environ['SLURMGPU_NVML_LIBRARY'])"
    )
    proc = _cli_subprocess(["run", "--scenario", "fault-pcie-x8", "--", sys.executable, "-c", child], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["8", "8", "True", str(fake_nvml_lib)]

    proc = _cli_subprocess(["run", "-s", "h100-sxm-8", "--", "no-such-command-xyz", "--flag"], env)
    assert proc.returncode == 127
    assert proc.stderr.strip() == "slurmgpu: error: command not found: no-such-command-xyz"


def test_cli_record(fake_nvml_lib: Path, tmp_path: Path) -> None:
    host = materialize(bundled_scenario("fault-gpu-lost"), tmp_path / "host")  # not this machine's disks
    env = sim_env(fake_nvml_lib, SCENARIO_DIR / "fault-gpu-lost.json", SLURMGPU_HOST_ROOT=str(host))
    proc = _cli_subprocess(["record", "--name", "rec"], env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["name"] == "rec"
    assert data["gpus"][5] == {"lost": True}
    assert data["gpus"][0] == bundled_scenario("fault-gpu-lost")["gpus"][0]

    out = tmp_path / "rec.json"
    proc = _cli_subprocess(["record", "--out", str(out), "--name", "rec"], env)
    assert proc.returncode == 0 and proc.stdout == ""
    assert json.loads(out.read_text()) == data

    env.pop("SLURMGPU_SIM_SCENARIO")  # fake with no scenario: driver not loaded
    proc = _cli_subprocess(["record"], env)
    assert proc.returncode == 3
    assert proc.stderr.strip() == "slurmgpu: error: NVML init failed: Driver Not Loaded (code 9)"
