"""What a real H100 (driver 580.159.04) recorded with bench/real_gpu.sh, held against the code
that must understand it. The run's files are in tests/data/real-gpu/h100-r580-20261126/;
`tests/test_recorded.py` replays its `sim record` (tests/data/recorded/h100-r580.*)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from slurmgpu.sources import kmsg
from slurmgpu.validate import floors
from tests.simfixtures import sim_env

RUN = Path(__file__).parent / "data" / "real-gpu" / "h100-r580-20261126"
RECORDING = Path(__file__).parent / "data" / "recorded" / "h100-r580.scenario.json"


def xml_text(root: ET.Element, path: str) -> str:
    node = root.find(path)
    assert node is not None and node.text is not None, path
    return node.text.strip()


def number(text: str) -> float:
    match = re.match(r"[-\d.]+", text)
    assert match, text
    return float(match.group())


def test_the_kernels_xid_line_parses_to_the_gpu_that_faulted() -> None:
    """dmesg printed the application fault bench/real_gpu.sh provoked; the same message as
    a /dev/kmsg record must name XID 31 on GPU 0 (PCI 0000:00:06, as NVML numbers it)."""
    line = next(x for x in (RUN / "xid-kmsg.txt").read_text().splitlines() if "NVRM: Xid" in x)
    stamp, _, message = line.partition("] ")
    usec = int(float(stamp.strip("[ ")) * 1e6)
    bus_id = json.loads(RECORDING.read_text())["gpus"][0]["pci"]["bus_id"]
    gpu_by_pci = {kmsg.pci_key(bus_id): 0}
    [event] = kmsg.parse_records([kmsg.kmsg_record(message, seq=7, usec=usec)], gpu_by_pci)
    assert (event.xid, event.gpu, event.source) == (31, 0, "kmsg")
    assert event.message and "MMU Fault" in event.message and "pid=" in event.message


def test_replayed_h100_facts_match_nvidia_smi(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """The recording, replayed through the fake libnvidia-ml.so.1 and gathered by slurmgpu,
    reads what nvidia-smi -q -x read on the real node at the same time."""
    config = tmp_path / "replay.toml"
    config.write_text('[checks]\ndisabled = ["ib.*", "pin.*"]\n')
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config),
                           "--node", "recorded"], env=sim_env(fake_nvml_lib, RECORDING),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["facts"]["nvml"]["gpus"][0]
    smi = ET.parse(RUN / "nvidia-smi-q.xml").getroot().find("gpu")
    assert smi is not None
    assert gpu["name"] == xml_text(smi, "product_name")
    assert gpu["uuid"] == xml_text(smi, "uuid")
    assert gpu["serial"] == xml_text(smi, "serial")
    assert gpu["vbios"] == xml_text(smi, "vbios_version")
    assert gpu["persistence_mode"] is (xml_text(smi, "persistence_mode") == "Enabled")
    assert gpu["ecc_enabled"] is (xml_text(smi, "ecc_mode/current_ecc") == "Enabled")
    assert gpu["remapped_rows"]["pending"] is (xml_text(smi, "remapped_rows/remapped_row_pending") == "Yes")
    assert gpu["temperature_c"] == number(xml_text(smi, "temperature/gpu_temp"))
    assert gpu["power_limit_w"] == number(xml_text(smi, "gpu_power_readings/current_power_limit"))
    assert gpu["sm_clock_max_mhz"] == number(xml_text(smi, "max_clocks/sm_clock"))
    assert gpu["pcie"]["gen_max"] == number(xml_text(smi, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"))
    assert gpu["pcie"]["width_current"] == number(
        xml_text(smi, "pci/pci_gpu_link_info/link_widths/current_link_width"))
    assert gpu["pcie_replay"] == number(xml_text(smi, "pci/replay_counter"))
    assert xml_text(smi, "gpu_recovery_action") == "None" and gpu["recovery_action"] == 0
    # No NVSwitch fabric on this node: NVML's fabric state NOT_SUPPORTED must not read as a fault.
    assert json.loads(proc.stdout)["verdict"] == "OK"


RUN_1128 = Path(__file__).parent / "data" / "real-gpu" / "h100-r580-20261128"


def test_the_built_in_floors_sit_70_to_80_percent_of_a_real_h100() -> None:
    """`validate --tier quick` on a healthy H100 (2026-11-28, after a 20 s load): every
    measurement with a built-in floor measured 1.25 to 1.43 times that floor, loose as
    floors.py promises and never a false FAIL."""
    report = json.loads((RUN_1128 / "validate.json").read_text())
    assert report["verdict"] == "OK"
    judged = [f["data"] for f in report["findings"] if floors.builtin(f["data"].get("model"), f["data"].get("metric", ""))]
    assert {d["metric"] for d in judged} == {"gemm_tflops", "hbm_gbps", "pcie_gbps"}
    for data in judged:
        floor = floors.builtin(data["model"], data["metric"])
        assert floor is not None and 0.70 <= floor.value / data["value"] <= 0.80, data


def test_the_gemm_floor_holds_against_the_sustained_rate_of_each_backend() -> None:
    """bench/gemm_probe.py on the same H100 at its 700 W cap: the products' sustained rate
    of the dtype the floor judges (fp16 with CuPy, bf16 with PyTorch), with and without
    deterministic cuBLAS, is 1.25 to 1.43 times the H100's built-in GEMM floor."""
    for name in ("cupy-ws", "cupy-nows", "torch-ws", "torch-nows"):
        bench = json.loads((RUN_1128 / "gemm-probe" / f"{name}.json").read_text())
        floor = floors.builtin(bench["gpu"], "gemm_tflops")
        assert floor is not None and 0.70 <= floor.value / bench["rows"][0]["raw_tflops"] <= 0.80, name


def test_before_the_fix_the_probe_failed_this_healthy_h100() -> None:
    """The first run (the CuPy digest kernels compiled inside the timed window, the digests'
    time counted as products') read 403.4 TFLOP/s and failed the H100: the false FAIL that
    made gemm_one time the products alone."""
    before = json.loads((RUN_1128 / "before-fix" / "validate.json").read_text())
    gemm = next(f for f in before["findings"] if f["data"].get("metric") == "gemm_tflops")
    assert (gemm["severity"], gemm["data"]["value"]) == ("FAIL", 403.37)


def test_a_healthy_h100_gives_one_bit_exact_product_for_every_iteration() -> None:
    """The SDC test's premise on real hardware: with deterministic cuBLAS the same product
    of fixed inputs has one checksum over 1,264 fp16 and 120 fp32 products (CuPy 14.2)."""
    lines = (RUN_1128 / "gemm-probe" / "probe-gemm-old.jsonl").read_text().splitlines()
    items = [json.loads(line) for line in lines]
    assert [(i["dtype"], len(i["digests"]), i["iterations"]) for i in items] == [("fp16", 1, 1264), ("fp32", 1, 120)]


def test_the_a100_hbm_floors_follow_the_copy_efficiency_a_real_h100_measured() -> None:
    """No A100 recorded yet: a copy moved 88 % of the H100's 3,350 GB/s peak, so each A100's
    built-in HBM floor sits at 70-80 % of 88 % of its own peak (40 GB: 1,555; 80 GB: 2,039)."""
    report = json.loads((RUN_1128 / "validate.json").read_text())
    hbm = next(f["data"]["value"] for f in report["findings"] if f["data"].get("metric") == "hbm_gbps")
    efficiency = hbm / 3350.0
    assert 0.85 <= efficiency <= 0.92
    for model, peak in (("NVIDIA A100-SXM4-40GB", 1555.0), ("NVIDIA A100-SXM4-80GB", 2039.0)):
        floor = floors.builtin(model, "hbm_gbps")
        assert floor is not None and 0.70 <= floor.value / (peak * efficiency) <= 0.80, model
