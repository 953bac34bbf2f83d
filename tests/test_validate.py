"""`slurmgpu validate` end to end on the simulator: the real CLI in a subprocess, over the
fake libnvidia-ml.so.1 and the scenario's ``active`` section, whose tools
(``python -m slurmgpu.sim.active``) print the real tools' formats into the real parsers.
Every bundled active fault fails with its test named; healthy scenarios pass; a hung test
ends within its budget with nothing left running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.scenario import resolve_scenario
from tests.simfixtures import bundled_scenario, sim_env, write_scenario_atomic
from tests.test_validate_runner import alive

#: bundled scenario -> (the failing finding's check, where)
FAULTS = {
    "fault-sdc": ("validate.gemm", "gpu3"),
    "fault-hbm-slow": ("validate.hbm", "gpu5"),
    "fault-pcie-slow": ("validate.pcie", "gpu1"),
    "fault-nvlink-slow": ("validate.p2p", "gpu2->gpu5"),
    "fault-nccl-slow": ("validate.nccl", "8 GPUs"),
    "fault-ib-bw-low": ("validate.ib", "mlx5_3->mlx5_2"),
    "fault-test-hang": ("validate.nccl", None),
    "fault-dcgm-diag": ("validate.dcgm", "memory"),  # (on gpu6: the message names it)
}
HEALTHY = ["h100-sxm-8", "h100-sxm-8-r535", "h100-sxm-8-r570", "h200-r580", "a100-sxm-8", "a100-sxm-8-r535"]
# Short tiers for tests (IB: 8 HCA pairs, each a server and a client process).
FAST = "[validate]\nquick_test_timeout_s = 10\nquick_burn_s = 0.1\n"
HANG_FAST = "[validate]\nquick_test_timeout_s = 1\n"


def validate(lib: Path, scenario: str | Path, *args: str, config: str = FAST, tmp: Path,
             **env: str) -> tuple[int, dict[str, Any]]:
    conf = tmp / "slurmgpu.toml"
    conf.write_text(config)
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "validate", "--json", "--config", str(conf), *args],
                          env=sim_env(lib, resolve_scenario(scenario), **env), capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def failing(doc: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(f["check"], f["subject"] or (f"gpu{f['gpu']}" if f["gpu"] is not None else None))
            for f in doc["findings"] if f["severity"] == "FAIL"}


@pytest.mark.parametrize("scenario", sorted(FAULTS))
def test_each_bundled_fault_fails_quick_with_its_test_named(fake_nvml_lib: Path, tmp_path: Path,
                                                            scenario: str) -> None:
    config = HANG_FAST if scenario == "fault-test-hang" else FAST
    code, doc = validate(fake_nvml_lib, scenario, "--tier", "quick", tmp=tmp_path, config=config)
    check, where = FAULTS[scenario]
    assert (code, doc["verdict"]) == (2, "FAIL")
    assert {c for c, _ in failing(doc)} == {check}
    assert (check, where) in failing(doc)


def test_every_bundled_active_fault_is_tested() -> None:
    from slurmgpu.sim.scenario import list_scenarios, load_scenario

    active = {name for name, _ in list_scenarios() if name.startswith("fault-") and "active" in load_scenario(name)}
    assert active == set(FAULTS)


@pytest.mark.parametrize("scenario", HEALTHY)
def test_healthy_scenarios_pass(fake_nvml_lib: Path, tmp_path: Path, scenario: str) -> None:
    code, doc = validate(fake_nvml_lib, scenario, tmp=tmp_path)
    assert (code, doc["verdict"]) == (0, "OK"), [f for f in doc["findings"] if f["severity"] != "OK"]
    ran = {t["test"]: t["result"] for t in doc["tests"]}
    pairs = "OK" if len(bundled_scenario(scenario)["gpus"]) > 1 else "N/A"  # (one GPU: no pair)
    assert ran == {"gemm": "OK", "hbm": "OK", "pcie": "OK", "p2p": pairs, "nccl": pairs, "dcgm": "OK", "ib": "N/A"}


def test_a_hang_ends_within_the_budget_and_leaves_nothing_running(fake_nvml_lib: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pids"
    started = time.monotonic()
    code, doc = validate(fake_nvml_lib, "fault-test-hang", "--tests", "nccl,dcgm", tmp=tmp_path,
                         config="[validate]\nquick_test_timeout_s = 30\nquick_budget_s = 2\n",
                         SLURMGPU_SIM_HANG_PIDFILE=str(pidfile))
    elapsed = time.monotonic() - started
    hang = next(f for f in doc["findings"] if f["check"] == "validate.nccl")
    assert (code, hang["severity"]) == (2, "FAIL")
    assert hang["message"].startswith("validate.nccl did not finish in 2 s")
    dcgm = next(f for f in doc["findings"] if f["check"] == "validate.dcgm")
    assert dcgm["severity"] == "UNKNOWN" and "budget of 2 s was spent" in dcgm["message"]
    assert elapsed < 60  # (the 3600 s sleep was cut at the 2 s budget)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and [p for p in pids if alive(p)] == []


def test_hang_severity_is_configurable(fake_nvml_lib: Path, tmp_path: Path) -> None:
    code, doc = validate(fake_nvml_lib, "fault-test-hang", "--tests", "nccl", tmp=tmp_path,
                         config="[validate]\nquick_test_timeout_s = 0.5\nhang_severity = \"warn\"\n")
    assert (code, doc["verdict"]) == (1, "WARN")


def test_host_thresholds_apply_per_hosts_section(fake_nvml_lib: Path, tmp_path: Path) -> None:
    config = FAST + ('[[hosts]]\nnodes = "gpu-[1-4]"\n[hosts.validate]\nnccl_busbw_gbps = 500\n'
                     'gemm_tflops = 650\n')
    code, doc = validate(fake_nvml_lib, "h100-sxm-8", "--tests", "gemm,nccl", "--node", "gpu-2",
                         tmp=tmp_path, config=config)
    bad = [f for f in doc["findings"] if f["severity"] == "FAIL"]
    assert code == 2 and [f["check"] for f in bad] == ["validate.nccl"]
    assert "below 500.0 GB/s ([validate] nccl_busbw_gbps)" in bad[0]["message"]
    code, _ = validate(fake_nvml_lib, "h100-sxm-8", "--tests", "gemm,nccl", "--node", "gpu-9",
                       tmp=tmp_path, config=config)
    assert code == 0


def test_missing_tools_are_not_applicable_and_builtins_take_over(fake_nvml_lib: Path, tmp_path: Path) -> None:
    data = bundled_scenario("fault-nvlink-slow")
    data["active"]["tools"] = ["probe"]  # no nvbandwidth, nccl-tests, DCGM or perftest
    path = write_scenario_atomic(tmp_path / "probe-only.json", data)
    code, doc = validate(fake_nvml_lib, path, tmp=tmp_path)
    assert code == 2
    results = {t["test"]: t["result"] for t in doc["tests"]}
    assert results == {"gemm": "OK", "hbm": "OK", "pcie": "OK", "p2p": "FAIL", "nccl": "OK", "dcgm": "N/A",
                       "ib": "N/A"}
    dcgm = next(f for f in doc["findings"] if f["check"] == "validate.dcgm")
    assert dcgm["not_applicable"] and "dcgmi is not installed" in dcgm["message"]


def test_gpus_and_tests_scope_the_run(fake_nvml_lib: Path, tmp_path: Path) -> None:
    code, doc = validate(fake_nvml_lib, "fault-sdc", "--tests", "gemm,pcie", "--gpus", "0-2", tmp=tmp_path)
    assert code == 0 and doc["gpus"] == [0, 1, 2]
    assert {t["test"] for t in doc["tests"]} == {"gemm", "pcie"}
    assert {f["gpu"] for f in doc["findings"]} == {0, 1, 2}
    code, doc = validate(fake_nvml_lib, "fault-sdc", "--tests", "gemm", "--gpus", "2-4", tmp=tmp_path)
    assert code == 2 and failing(doc) == {("validate.gemm", "gpu3")}


@pytest.mark.parametrize(("args", "message"), [
    (["--tests", "gemm,burn"], "--tests: unknown test burn"),
    (["--gpus", "x"], "--gpus: 'x' is not a GPU index"),
    (["--tier", "slow"], "Invalid value for '--tier'"),
])
def test_bad_arguments_are_one_line_and_exit_3(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "validate", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_bad_threshold_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text('[validate]\nquick_budget_s = 60\n\n[[hosts]]\nnodes = "gpu-1"\n[hosts.validate]\nhbm_gbps = -3\n')
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "validate", "--config", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.strip() == (f"slurmgpu: error: {conf}:7: hosts[0].validate.hbm_gbps: "
                                   "must be from 0.001 to 100000; got -3")


@pytest.mark.parametrize(("mutate", "check", "words"), [
    (lambda a: a.update(gpus={"4": {"wrong_result": "sometimes"}}), "validate.gemm", "2 different results over 640"),
    (lambda a: a.update(gpus={"2": {"hbm_mismatches": 12}}), "validate.hbm", "12 words read back wrong"),
    (lambda a: a.update(nccl_wrong=5), "validate.nccl", "5 wrong elements"),
])
def test_corruption_is_fail(fake_nvml_lib: Path, tmp_path: Path, mutate: Any, check: str, words: str) -> None:
    data = bundled_scenario("h100-sxm-8")
    data["active"] = {}
    mutate(data["active"])
    path = write_scenario_atomic(tmp_path / "corrupt.json", data)
    code, doc = validate(fake_nvml_lib, path, "--tests", check.split(".")[1], tmp=tmp_path)
    bad = [f for f in doc["findings"] if f["severity"] == "FAIL"]
    assert code == 2 and len(bad) == 1 and bad[0]["check"] == check and words in bad[0]["message"]


def test_the_probe_imports_without_cuda_and_says_why_it_cannot_run() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys, slurmgpu.validate.probe as p; "
                           "sys.modules['cupy'] = None; sys.modules['torch'] = None; sys.exit(p.main(['gemm']))"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "neither CuPy nor PyTorch is usable" in proc.stderr


def test_node_platform_finds_tools_and_active_hcas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.config.schema import ValidateSettings
    from slurmgpu.validate.platform import NodePlatform

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dcgmi", "all_reduce_perf"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    sysfs = tmp_path / "infiniband"
    for hca, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN"), ("mlx5_2", "4: ACTIVE")):
        (sysfs / hca / "ports" / "1").mkdir(parents=True)
        (sysfs / hca / "ports" / "1" / "state").write_text(state + "\n")
    platform = NodePlatform(ValidateSettings(nvbandwidth=str(tmp_path / "none")), sysfs=str(sysfs))
    assert platform.tool("dcgmi") == [str(bin_dir / "dcgmi")]
    assert platform.tool("ib_write_bw") is None and platform.tool("nvbandwidth") is None
    assert platform.hcas() == ["mlx5_0", "mlx5_2"]
    assert "pip install slurmgpu[validate]" in platform.describe("probe")


@pytest.mark.parametrize("busy_s", [0.0, 1.5])
def test_send_hands_the_findings_to_the_agent_socket(fake_nvml_lib: Path, tmp_path: Path, busy_s: float) -> None:
    """Also to an agent slower than a hook's half-second query timeout (under load: seen
    as a return-to-service validation whose findings never reached the collector)."""
    import threading

    from slurmgpu.agent.local import serve_local
    from slurmgpu.config.schema import Settings
    from tests.test_validate_fleet import RecordingAgent

    class BusyAgent(RecordingAgent):
        def submit(self, mtype: str, body: dict[str, Any], *, ts: float | None = None) -> int | None:
            time.sleep(busy_s)
            return super().submit(mtype, body, ts=ts)

    agent = BusyAgent()
    agent.settings = Settings()
    sock = tmp_path / "agent.sock"
    stop, ready = threading.Event(), threading.Event()
    server = threading.Thread(target=serve_local, args=(agent, str(sock), stop), kwargs={"ready": ready}, daemon=True)
    server.start()
    assert ready.wait(10)
    try:
        code, doc = validate(fake_nvml_lib, "fault-pcie-slow", "--tests", "pcie", "--send", tmp=tmp_path,
                             config=FAST + f'[agent]\nsocket = "{sock}"\n')
    finally:
        stop.set()
        server.join(10)
    [(_, body)] = agent.sent
    assert code == 2 and body["kind"] == "validation" and body["verdict"] == "FAIL"
    assert body["findings"] == doc["findings"]


def test_send_without_an_agent_warns_and_keeps_the_verdict(fake_nvml_lib: Path, tmp_path: Path) -> None:
    conf = tmp_path / "slurmgpu.toml"
    conf.write_text(FAST + f'[agent]\nsocket = "{tmp_path / "none.sock"}"\n')
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "validate", "--tests", "pcie", "--send", "--config",
                           str(conf)], env=sim_env(fake_nvml_lib, resolve_scenario("fault-pcie-slow")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "validate.pcie" in proc.stdout
    assert proc.stderr.startswith(f"slurmgpu: warning: not sent: no agent at {tmp_path / 'none.sock'}")


BROKEN = {"send": "import slurmgpu.validate.report as r; r.validation_request = boom",
          "run": "import slurmgpu.validate.session as s; s.run_tier = boom"}


@pytest.mark.parametrize(("broken", "want"), [("send", 2), ("run", 3)])
def test_a_bug_of_ours_never_exits_1_which_passes_the_node(fake_nvml_lib: Path, tmp_path: Path, broken: str,
                                                          want: int) -> None:
    """A return-to-service ladder reads exit 0 or 1 (OK, WARN) as a pass: Python's exit 1
    for an uncaught exception would put a failing node back in service. The sending
    breaking keeps the FAIL (2); the run breaking is UNKNOWN (3)."""
    conf = tmp_path / "slurmgpu.toml"
    conf.write_text(FAST + f'[agent]\nsocket = "{tmp_path / "none.sock"}"\n')
    code = (f"def boom(*a, **k): raise KeyError('a bug')\n{BROKEN[broken]}\nfrom slurmgpu.cli import main\n"
            f"main(['validate', '--tests', 'pcie', '--send', '--json', '--config', {str(conf)!r}])")
    proc = subprocess.run([sys.executable, "-c", code], env=sim_env(fake_nvml_lib, resolve_scenario("fault-pcie-slow")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == want, proc.stderr
    assert "KeyError: 'a bug'" in proc.stderr and "Traceback" not in proc.stderr


def test_the_probe_can_run_in_another_python(tmp_path: Path) -> None:
    from slurmgpu.config.schema import ValidateSettings
    from slurmgpu.validate import runner
    from slurmgpu.validate.platform import NodePlatform

    argv = NodePlatform(ValidateSettings(probe_python=sys.executable)).tool("probe")
    assert argv is not None and argv[0] == sys.executable
    result = runner.run([*argv, "gemm"], 60, env={"PATH": "/usr/bin:/bin"})  # (no PYTHONPATH: it finds slurmgpu)
    assert result.rc == 3 and "neither CuPy nor PyTorch is usable" in result.stderr
    missing = NodePlatform(ValidateSettings(probe_python=str(tmp_path / "python9")))
    assert missing.tool("probe") is None and "python9 is not an executable" in missing.describe("probe")


def test_a_run_in_which_no_test_applied_is_unknown_not_a_pass(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """No probe (neither CuPy nor PyTorch), no tool: nothing was measured, so the node is
    not validated (exit 3: a returning node stays drained, retried, then held)."""
    data = bundled_scenario("h100-sxm-8")
    data["active"] = {"tools": []}
    code, doc = validate(fake_nvml_lib, write_scenario_atomic(tmp_path / "no-tools.json", data), tmp=tmp_path)
    assert (code, doc["verdict"]) == (3, "UNKNOWN")
    assert {t["result"] for t in doc["tests"]} == {"N/A"}
    [nothing] = [f for f in doc["findings"] if f["severity"] == "UNKNOWN"]
    assert nothing["check"] == "validate.quick"
    assert nothing["message"].startswith("no quick test could run on this node, nothing was validated (validate.gemm:")


ECC_ERROR = "CUDARuntimeError: cudaErrorECCUncorrectable: uncorrectable ECC error encountered"


@pytest.mark.parametrize(("broken", "error", "want"), [
    ({"3": {"cuda_error": ECC_ERROR}}, ECC_ERROR, {(3, "FAIL")}),  # one GPU: its own fault
    ({str(g): {"cuda_error": ECC_ERROR} for g in range(8)}, ECC_ERROR, {(g, "UNKNOWN") for g in range(8)}),
    ({"3": {"cuda_error": "TypeError: a bug of ours"}}, "TypeError: a bug of ours", {(3, "UNKNOWN")}),
])
def test_a_gpu_the_probe_breaks_on_is_never_passed(fake_nvml_lib: Path, tmp_path: Path, broken: dict[str, Any],
                                                   error: str, want: set[tuple[int, str]]) -> None:
    """Before, a GPU whose test thread died (a CUDA error) was left out and the rest passed.
    A CUDA error on some GPUs is theirs; on every GPU alike, or an error of ours, UNKNOWN."""
    data = bundled_scenario("h100-sxm-8")
    data["active"] = {"gpus": broken}
    code, doc = validate(fake_nvml_lib, write_scenario_atomic(tmp_path / "broken.json", data), "--tests", "gemm",
                         tmp=tmp_path)
    bad = [f for f in doc["findings"] if f["severity"] != "OK"]
    assert {(f["gpu"], f["severity"]) for f in bad} == want
    assert all(f["check"] == "validate.gemm" and f["message"].endswith(error) for f in bad)
    assert code == (2 if "FAIL" in {s for _, s in want} else 3)
