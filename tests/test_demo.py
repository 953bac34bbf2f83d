"""`slurmgpu demo`: bad arguments exit 3 with one line; end to end (root, the real Slurm
mini-cluster in its own directory) every expected effect is observed within 4 minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.cluster import SimCluster


def slurmgpu(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # Nothing from the test session (SLURMGPU_JOBS_DIR, another cluster's config) leaks in.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURMGPU_", "PYTEST")) and k != "SLURM_CONF"}
    return subprocess.run([sys.executable, "-m", "slurmgpu", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(("args", "needle"), [
    (["--bogus"], "No such option '--bogus'"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "soon"], "--timeout"),
    (["--dir", "/tmp/" + "x" * 120], "too long" if os.geteuid() == 0 else "root"),
    (["--dir", "/etc"], "holds no simulated cluster" if os.geteuid() == 0 else "root"),
    (["--dir", "/etc/hostname"], "--dir"),
])
def test_bad_arguments_exit_3_with_one_line(args: list[str], needle: str) -> None:
    proc = slurmgpu("demo", *args)
    assert proc.returncode == 3, proc
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
    assert proc.stderr.startswith("slurmgpu: error: ")


def jobs_after_return(result: dict[str, Any]) -> list[str]:
    return [j["state"] for j in result["jobs"] if j["name"] == "demo-back"]


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="the demo's mini-cluster needs root")
def test_demo_end_to_end() -> None:
    directory = Path(f"/tmp/slurmgpu-demo-test-{os.getpid()}")
    passed = False
    try:
        started = time.monotonic()
        proc = slurmgpu("demo", "--dir", str(directory), "--json", timeout=420)
        took = time.monotonic() - started
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["ok"] and result["missing"] == [], result["missing"]
        steps = {s["name"]: s for s in result["steps"]}
        assert list(steps) == ["cluster", "jobs", "xid", "row-remap", "driver", "breaker",
                               "finish", "report", "remediation", "return", "ladder", "validations"]
        for step in steps.values():
            assert step["ok"] and step["effects"], step
            assert all(e["ok"] and e["at_s"] is not None for e in step["effects"]), step
        xid = [e["name"] for e in steps["xid"]["effects"]]
        assert xid == ["injected", "decision", "signal", "ack", "drain", "requeue", "resume"]
        print(f"demo: {result['total_s']} s ({took:.1f} s with the interpreter's start)")
        assert result["total_s"] < 240 and took < 240, (result["total_s"], took)
        # The final states, as the summary table shows them.
        nodes = {n["node"]: n for n in result["nodes"]}
        assert nodes["gpu-n2"]["reason"].startswith("slurmgpu: mem.row_remap GPU 2")
        assert nodes["gpu-n3"]["reason"].startswith("slurmgpu: pin.driver")
        spare = next(n for n in ("gpu-n1", "gpu-n4") if "xid.recent" not in nodes[n]["reason"])
        # The spare node came back from a transient fault, then went to repair with a persistent one.
        assert nodes[spare]["reason"].startswith("slurmgpu: repair (tried: reset, reboot)")
        assert [e["name"] for e in steps["ladder"]["effects"]] == ["drain", "injected", "validation", "reset",
                                                                     "revalidation", "reboot", "after-reboot",
                                                                     "repair"]
        ticket = json.loads((directory / "demo" / "repair-ticket.json").read_text())
        assert ticket["node"] == spare and ticket["ladder"]["remedies"] == ["reset", "reboot"]
        assert jobs_after_return(result) == ["COMPLETED"]
        quality = next(e["detail"] for e in steps["validations"]["effects"] if e["name"] == "verdict-quality")
        assert "ecc.uncorrected: 2 drain(s), 1 confirmed, 1 cleared_by_validation" in quality
        jobs = {j["name"]: j for j in result["jobs"]}
        assert [e["name"] for e in steps["return"]["effects"]] == ["drain", "healed", "validation", "released",
                                                                   "takes-jobs"]
        assert jobs["demo-train"]["state"] == "COMPLETED" and jobs["demo-train"]["node"] == spare
        assert jobs["demo-train"]["restarts"] == "1" and jobs["demo-gpu8"]["restarts"] == "1"
        assert result["breaker"]["breaker_open"]
        assert Path(result["report"]).is_file() and result["report"].startswith(str(directory))
        assert result["teardown"] == f"slurmgpu sim cluster down --dir {directory}"
        # Left up for a look.
        assert SimCluster(directory).status()["up"]
        passed = True
    finally:
        SimCluster(directory).down(purge=passed)  # a failed run keeps its logs
