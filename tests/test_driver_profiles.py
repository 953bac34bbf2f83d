"""Driver-branch fidelity (issue 10): the fake libnvidia-ml.so.1 answers like the NVML of the
scenario's branch (R535 ... R580), and slurmgpu reads every branch right.

* the fake's capability profile per branch (functions, struct versions, field ids, events);
* every bundled fault is caught, and every healthy node is OK, on every branch profile;
* each NVML error code injected into each query gives the verdict the rule says.

Verdicts are computed in one interpreter per table (the real pynvml, the fake library, the
engine), switching scenario files through $SLURMGPU_SIM_SCENARIO, which the fake re-reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.scenario import write_scenario
from tests.simfixtures import bundled_scenario, run_pynvml, sim_env

# Branch -> (driver version, CUDA driver version) as real nodes report them.
BRANCHES = {
    525: ("525.147.05", 12000),
    535: ("535.183.01", 12020),
    550: ("550.90.07", 12040),
    560: ("560.35.03", 12060),
    570: ("570.133.20", 12080),
    575: ("575.57.08", 12090),
    580: ("580.159.04", 13000),
}
SUITE_BRANCHES = (525, 535, 550, 560, 570, 580)

NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND, VERSION_MISMATCH = 3, 2, 13, 25

# What a branch's NVML can answer, from the nvml.h of each branch's CUDA release.
PROBE = """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
fv = N.nvmlDeviceGetFieldValues(h, [82, 94, 226, 227, 230])
emit({
    "event_reasons": code_of(N.nvmlDeviceGetCurrentClocksEventReasons, h),
    "throttle_reasons": code_of(N.nvmlDeviceGetCurrentClocksThrottleReasons, h),
    "temperature_v": code_of(N.nvmlDeviceGetTemperatureV, h, 0),
    "temperature": code_of(N.nvmlDeviceGetTemperature, h, 0),
    "fabric_v3": code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(N.c_nvmlGpuFabricInfo_v3_t())),
    "fabric_v2": code_of(N.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(N.c_nvmlGpuFabricInfo_v2_t())),
    "fabric_v1": code_of(N.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(N.c_nvmlGpuFabricInfo_t())),
    "sram": code_of(N.nvmlDeviceGetSramEccErrorStatus, h,
                    ctypes.byref(N.c_nvmlEccSramErrorStatus_v1_t())),
    "fields": [f.nvmlReturn for f in fv],
    "events": N.nvmlDeviceGetSupportedEventTypes(h),
    "clock": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
    "violation": N.nvmlDeviceGetViolationStatus(h, 1).violationTime,
})
"""


def _on_branch(base: str, branch: int) -> dict[str, Any]:
    """A bundled scenario as a driver of ``branch`` would serve it (the fake's profile
    follows ``driver_version``; the node's data stay the same)."""
    data = bundled_scenario(base)
    driver, cuda = BRANCHES[branch]
    data["driver_version"], data["cuda_driver_version"] = driver, cuda
    data["nvml_version"] = f"{cuda // 1000}.{driver}"
    for gpu in data["gpus"]:
        gpu["supported_event_types"] = 0xFF9F
        gpu.setdefault("recovery_action", 0)
    return data


@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_fake_answers_like_the_branch(fake_nvml_lib: Path, tmp_path: Path, branch: int) -> None:
    path = write_scenario(tmp_path / "s.json", _on_branch("h100-sxm-8", branch))
    out = run_pynvml(PROBE, sim_env(fake_nvml_lib, path))
    older = FUNCTION_NOT_FOUND
    assert out["temperature_v"] == (None if branch >= 570 else older)
    assert out["temperature"] is None  # the deprecated call is on every branch up to R580
    assert out["fabric_v3"] == (older if branch < 550 else None if branch >= 580 else VERSION_MISMATCH)
    assert out["fabric_v2"] == (older if branch < 550 else None)
    assert out["fabric_v1"] is None
    assert out["sram"] == (older if branch < 550 else None)
    assert out["event_reasons"] == (older if branch < 535 else None)  # R535 renamed the call
    assert out["throttle_reasons"] is None  # the old name is on every branch up to R580
    # fields 82 and 94 are old; 226/227 (reset status) are past NVML_FI_MAX before R560,
    # 230 (recovery action) before R570
    reset = 0 if branch >= 560 else INVALID_ARGUMENT
    assert out["fields"] == [0, 0, reset, reset, 0 if branch >= 570 else INVALID_ARGUMENT]
    assert out["events"] == {525: 0x9F, 535: 0x9F, 550: 0x9F, 560: 0x3E9F}.get(branch, 0xFF9F)
    assert (out["clock"], out["violation"]) == (345, 0)


# Each fault: (bundled scenario, first branch whose NVML can show it, expected problems as
# (check, severity, gpu)). Below that branch the driver cannot report it: the node is OK.
FAULTS: dict[str, tuple[int, set[tuple[str, str, int | None]]]] = {
    "fault-ecc-dbe": (0, {("ecc.uncorrected", "FAIL", 3)}),
    "fault-row-remap-pending": (0, {("mem.row_remap", "FAIL", 2)}),
    "fault-row-remap-failure": (0, {("mem.row_remap", "FAIL", 6)}),
    "fault-gpu-lost": (0, {("gpu.lost", "FAIL", 5)}),
    "fault-gpu-missing": (0, {("gpu.count", "FAIL", None)}),
    "fault-hw-thermal": (0, {("thermal.throttle", "WARN", 4), ("thermal.temperature", "WARN", 4),
                             ("thermal.clock_brake", "WARN", 4)}),
    "fault-gpu-hot": (0, {("thermal.temperature", "FAIL", 0)}),
    "fault-hbm-hot": (0, {("thermal.memory_temperature", "FAIL", 3)}),
    "fault-power-brake": (0, {(c, "WARN", i) for i in range(8)
                              for c in ("thermal.throttle", "thermal.clock_brake")}),
    "fault-pcie-x8": (0, {("pcie.link", "WARN", 1)}),  # downtrained; FAIL needs a [pcie] pin
    "fault-nvlink-down": (0, {("nvlink.state", "FAIL", 7)}),
    "fault-fabric-not-started": (0, {("fabric.state", "FAIL", i) for i in range(8)}),
    "fault-nvml-unknown-error": (0, {("gpu.nvml_errors", "FAIL", 4)}),
    "fault-reset-required": (0, {("gpu.nvml_errors", "FAIL", 1)}),
    "fault-sram-threshold": (550, {("ecc.sram", "FAIL", 6)}),
    "fault-recovery-action": (560, {("gpu.recovery_action", "FAIL", 2)}),  # R560: fields 226/227
}
HEALTHY = ("h100-sxm-8", "h100-sxm-8-r535", "h100-sxm-8-r570", "a100-sxm-8", "a100-sxm-8-r535", "h200-r580")
CONFIG = """
[gpu]
count = {count}
mig = "disabled"
[fabric]
required = {required}
[checks]
disabled = ["ib.*", "pin.*"]
"""

EVALUATE = r"""
import json, os, sys
from slurmgpu.config.load import parse_config
from slurmgpu.engine import evaluate
from slurmgpu.facts import IbFacts, NodeFacts, SoftwareVersions
from slurmgpu.sources.nvml import PynvmlSource
cases = json.loads(sys.argv[1])
source = PynvmlSource(os.environ["SLURMGPU_NVML_LIBRARY"], retry_delay_s=0.01)
out = {}
for label, path, config in cases:
    os.environ["SLURMGPU_SIM_SCENARIO"] = path
    settings = parse_config(config).settings_for("n1")
    facts = NodeFacts(node="n1", collected_at=0.0, nvml=source.collect(),
                      ib=IbFacts(available=False), versions=SoftwareVersions())
    verdict = evaluate(facts, settings)
    out[label] = {"verdict": verdict.severity.name,
                  "problems": sorted([f.check, f.severity.name, f.gpu]
                                     for f in verdict.findings if f.severity.name != "OK")}
print("RESULT " + json.dumps(out))
"""


def evaluate_all(lib: Path, cases: list[tuple[str, Path, str]]) -> dict[str, Any]:
    env = sim_env(lib, cases[0][1])
    proc = subprocess.run([sys.executable, "-c", EVALUATE, json.dumps([(a, str(b), c) for a, b, c in cases])],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]
    raise AssertionError(f"rc={proc.returncode}\n{proc.stderr}")


def _problems(result: dict[str, Any]) -> set[tuple[str, str, int | None]]:
    return {(c, s, g) for c, s, g in result["problems"]}


@pytest.fixture(scope="module")
def fault_results(fake_nvml_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("branches")
    cases = []
    for branch in SUITE_BRANCHES:
        for name in FAULTS:
            path = write_scenario(tmp / f"{name}-{branch}.json", _on_branch(name, branch))
            cases.append((f"{name}@{branch}", path, CONFIG.format(required="true", count=8)))
    return evaluate_all(fake_nvml_lib, cases)


@pytest.mark.parametrize("branch", SUITE_BRANCHES)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_fault_is_caught_on_every_branch(fault_results: dict[str, Any], fault: str, branch: int) -> None:
    since, expected = FAULTS[fault]
    result = fault_results[f"{fault}@{branch}"]
    if branch < since:  # the driver has no way to say it (documented in docs/simulator.md)
        assert result["verdict"] == "OK", result
        return
    assert _problems(result) == expected, result


HOST_FAULTS = {"fault-disk-full", "fault-fabricmanager-down", "fault-peermem-missing",
               "fault-driver-mismatch", "fault-gpu-hang", "fault-sxid-fatal"}


def test_every_bundled_fault_is_in_the_suite() -> None:
    from slurmgpu.sim.scenario import list_scenarios, load_scenario

    # (faults only active tests see, in an "active" section: tests/test_validate.py)
    bundled = {name for name, _ in list_scenarios() if name.startswith("fault-") and "active" not in load_scenario(name)}
    # a pin fault and the layers around NVML (tests/test_host_checks.py): branch-independent
    assert bundled - {"fault-wrong-driver", *HOST_FAULTS} == set(FAULTS)


def test_every_healthy_node_is_ok(fake_nvml_lib: Path) -> None:
    from slurmgpu.sim.scenario import resolve_scenario

    cases = []
    for name in HEALTHY:
        data = bundled_scenario(name)
        nvswitch = any(g.get("fabric", {}).get("state") for g in data["gpus"])
        cases.append((name, resolve_scenario(name),
                      CONFIG.format(required=str(nvswitch).lower(), count=len(data["gpus"]))))
    results = evaluate_all(fake_nvml_lib, cases)
    assert {name: r["problems"] for name, r in results.items()} == {name: [] for name in HEALTHY}


def test_r550_fabric_is_read_through_the_v2_struct(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """Defect 2: on R550 the v3 struct is refused; before the fix every HGX node with
    [fabric] required = true failed, and a node with the fabric manager down passed."""
    healthy = write_scenario(tmp_path / "h.json", _on_branch("h100-sxm-8", 550))
    down = write_scenario(tmp_path / "d.json", _on_branch("fault-fabric-not-started", 550))
    r535 = write_scenario(tmp_path / "o.json", _on_branch("fault-fabric-not-started", 535))
    config = CONFIG.format(required="true", count=8)
    results = evaluate_all(fake_nvml_lib, [("healthy", healthy, config), ("down", down, config),
                                           ("down-r535", r535, config)])
    assert results["healthy"]["verdict"] == "OK"
    assert ["fabric.state", "FAIL", 0] in results["down"]["problems"]
    assert ["fabric.state", "FAIL", 0] in results["down-r535"]["problems"]  # the v1 call


def test_r535_temperature_falls_back_to_the_old_call(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """Defect 3: R535/R550 have no nvmlDeviceGetTemperatureV; a 95 C GPU must still fail."""
    hot = write_scenario(tmp_path / "hot.json", _on_branch("fault-gpu-hot", 535))
    results = evaluate_all(fake_nvml_lib, [("hot", hot, CONFIG.format(required="true", count=8))])
    assert results["hot"]["problems"] == [["thermal.temperature", "FAIL", 0]]


# -- every NVML error code into every query ------------------------------------------------

# Core queries: what a hung GPU fails first; a persistent error there fails the GPU.
CORE_QUERIES = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTemperatureV",
                "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEccMode")
# Others: a persistent error there alone is UNKNOWN (a driver quirk must not drain a fleet).
AUX_QUERIES = ("nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetViolationStatus",
               "nvmlDeviceGetMigMode", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetGpuFabricInfoV",
               "nvmlDeviceGetSramEccErrorStatus", "field:82", "field:230")
QUERIES = CORE_QUERIES + AUX_QUERIES
# code -> (verdict, check) under the gpu.nvml_errors rule (the error is forced on every
# read, so it persists across the source's retry).
CODES = {
    999: ("FAIL", "gpu.nvml_errors"),  # Unknown Error: what a hung GSP answers
    16: ("FAIL", "gpu.nvml_errors"),  # GPU_REQUIRES_RESET
    15: ("FAIL", "gpu.lost"),  # GPU_IS_LOST
    10: ("FAIL", "gpu.nvml_errors"),  # Timeout
    14: ("FAIL", "gpu.nvml_errors"),  # Corrupted infoROM
    18: ("FAIL", "gpu.nvml_errors"),  # RM/NVML version mismatch (driver upgraded, no reboot)
    4: ("UNKNOWN", "gpu.nvml_errors"),  # NoPermission: slurmgpu's trouble, never a drain
    2: ("UNKNOWN", "gpu.nvml_errors"),  # InvalidArgument
    3: ("OK", None),  # NotSupported: not applicable
    13: ("OK", None),  # FunctionNotFound: a driver older than the call
}
# A field value's own return code: InvalidArgument there is a field id newer than the
# driver (not applicable); FunctionNotFound is no per-field answer, so just an odd code.
FIELD_CODES = {**CODES, 2: ("OK", None), 13: ("UNKNOWN", "gpu.nvml_errors")}


def test_each_nvml_error_in_each_query(fake_nvml_lib: Path, tmp_path: Path) -> None:
    cases = []
    for query in QUERIES:
        for code in CODES:
            data = _on_branch("h100-sxm-8", 580)
            data["gpus"][3]["errors"] = {query: code}
            path = write_scenario(tmp_path / f"{query}-{code}.json", data)
            # required = false: an unreadable fabric is judged by gpu.nvml_errors alone
            cases.append((f"{query}={code}", path, CONFIG.format(required="false", count=8)))
    results = evaluate_all(fake_nvml_lib, cases)
    wrong = {}
    for query in QUERIES:
        for code, (verdict, check) in (FIELD_CODES if query.startswith("field:") else CODES).items():
            if query in AUX_QUERIES and verdict == "FAIL" and check == "gpu.nvml_errors" and code != 16:
                verdict = "UNKNOWN"  # persistent, but not on a core query
            got = results[f"{query}={code}"]
            want = [[check, verdict, 3]] if check else []
            if got["verdict"] != verdict or got["problems"] != want:
                wrong[f"{query}={code}"] = got
    assert not wrong, json.dumps(wrong, indent=1)


def test_recovery_action_is_not_asked_of_drivers_that_lack_it(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """Field 230 is past NVML_FI_MAX before R570, 226/227 before R560: whatever such a driver
    would answer, slurmgpu does not ask, so it can never become a finding there."""
    cases = []
    for branch, field in ((550, 230), (570, 230), (550, 226), (560, 226), (560, 230)):
        data = _on_branch("h100-sxm-8", branch)
        data["gpus"][3]["errors"] = {f"field:{field}": 999}
        path = write_scenario(tmp_path / f"{branch}-{field}.json", data)
        cases.append((f"{branch}:{field}", path, CONFIG.format(required="true", count=8)))
    results = evaluate_all(fake_nvml_lib, cases)
    asked = [["gpu.nvml_errors", "UNKNOWN", 3]]
    assert {k: r["problems"] for k, r in results.items()} == {
        "550:230": [], "570:230": asked, "550:226": [], "560:226": asked, "560:230": []}


@pytest.mark.parametrize("action", [0, 1, 4])
def test_r560_reset_verdict_is_read_from_fields_226_and_227(fake_nvml_lib: Path, tmp_path: Path,
                                                             action: int) -> None:
    """R560 has no field 230; its reset verdict is 226 (reset needed) and 227 (drain and
    reset needed). Before the fix an R560 GPU that needed a reset was OK."""
    data = _on_branch("h100-sxm-8", 560)
    data["gpus"][5]["recovery_action"] = action  # the fake derives 226/227 from it
    path = write_scenario(tmp_path / "s.json", data)
    result = evaluate_all(fake_nvml_lib, [("r560", path, CONFIG.format(required="true", count=8))])["r560"]
    assert result["problems"] == ([["gpu.recovery_action", "FAIL", 5]] if action else []), result
