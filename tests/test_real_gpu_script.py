"""bench/real_gpu.sh can only run on a lent GPU node, so CI runs it end to end against the
simulator (--sim, short phases): every step succeeds or is skipped with a reason, every
file a real run commits as fixtures is written, and the agent put no clock event on the
wire while the simulated GPUs were under load."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.simfixtures import REPO_ROOT

FILES = ("summary.md", "steps.jsonl", "env.json", "probe.json", "record.json", "check.json",
         "timings.json", "footprint.json", "agent-messages.json", "xid.json", "xid-kmsg.txt",
         "xid-check.json", "validate.json", "validate-summary.json")


def test_real_gpu_script_in_sim_mode(fake_nvml_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "IDLE_S": "2", "LOAD_S": "1", "TIMING_RUNS": "2",
           "WARM_RUNS": "2", "FALLBACK_RUNS": "1", "SLURMGPU_SIM_DIR": str(fake_nvml_lib.parent),
           "VENV_GPU": str(tmp_path / "venv-gpu"), "PIP_ONLINE": "0"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "bench" / "real_gpu.sh"), "--sim"], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [f for f in FILES if not (out / f).is_file()] == []
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert {s["status"] for s in steps} <= {"ok", "skipped"}, [s for s in steps if s["status"] not in ("ok", "skipped")]
    skipped = {s["step"] for s in steps if s["status"] == "skipped"}
    assert skipped == {"nvidia-smi", "time-nvidia-smi-q", "xid-provoke"}  # no driver in sim mode
    messages = json.loads((out / "agent-messages.json").read_text())["messages"]
    assert [m["kind"] for m in messages if m["type"] == "event"] == ["xid"]  # the injected XID 31 only
    assert json.loads((out / "record.json").read_text())["gpus"]
    validated = json.loads((out / "validate-summary.json").read_text())
    assert validated["verdict"] == "OK" and {t["test"] for t in validated["tests"]} >= {"gemm", "nccl", "dcgm"}
    assert validated["overhead_s"] > 0 and "slurmgpu validate --tier quick" in (out / "summary.md").read_text()
