"""Issue 28 item 2: a timeout after a FAIL verdict never fails the job open, and a hook's
Slurm calls fit inside its watchdog. The shipped path (quick client -> `slurmgpu prolog`)
against the simulated node with a lost GPU and an `scontrol` slower than the watchdog;
the mini-cluster version (slurmctld stopped) is in test_slurm_integration.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgpu.config.schema import Settings
from slurmgpu.gate import SLURM_SHARE
from slurmgpu.slurm import SlurmUnreachable
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.testing import FakeSlurmClient
from tests.simfixtures import ScenarioFactory, sim_env
from tests.test_gate import NODE, make_gate
from tests.test_gate_hardening import lost_gpu

REPO = Path(__file__).resolve().parent.parent
SIM_CONFIG = REPO / "etc" / "sim-h100.toml"


def slow_scontrol(tmp: Path, seconds: float) -> Path:
    """A directory with an `scontrol` that answers nothing for ``seconds`` (a busy slurmctld)."""
    bindir = tmp / "slow-bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\nexec sleep {seconds}\n")
    (bindir / "scontrol").chmod(0o755)
    return bindir


def test_a_lost_gpu_with_a_slow_scontrol_refuses_the_job(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                                         tmp_path: Path) -> None:
    """Was: the drain's scontrol (10 s x 3 tries) outlived the 4 s watchdog, which failed the
    job open: exit 0, "verdict": null, the job ran on the lost GPU."""
    config = tmp_path / "slurmgpu.toml"
    config.write_text(SIM_CONFIG.read_text() + "\n[prolog]\ntimeout_s = 4\n")
    env = sim_env(fake_nvml_lib, scenario_file("fault-gpu-lost"), SLURMGPU_STATE_DIR=str(tmp_path / "state"),
                  SLURMGPU_KMSG=str(tmp_path / "kmsg"), SLURMD_NODENAME="gpu-h100-001", SLURM_JOB_ID="4242",
                  SLURMGPU_CONFIG=str(config), SLURMGPU_PYTHON=sys.executable,
                  SLURMGPU_AGENT_SOCKET=str(tmp_path / "no-agent.sock"),
                  PATH=f"{slow_scontrol(tmp_path, 12)}:{os.environ['PATH']}")
    (tmp_path / "kmsg").write_text("")
    env.pop("SLURMGPU_BIN", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-I", "-S", str(REPO / "slurmgpu" / "quickgate.py"), "prolog"],
                          env=env, capture_output=True, text=True, timeout=60, check=False, cwd="/")
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "state" / "gate.jsonl").read_text().splitlines()]
    assert record["verdict"] == "FAIL" and record["exit"] == 1 and "gpu.lost" in record["reason"]
    assert record["action"] == "drain-failed" and "timed out" in record["error"]
    assert took < 12, f"the Slurm calls took the whole watchdog: {took:.1f} s"


class Hanging(FakeSlurmClient):
    """A drain that outlives the watchdog (a Slurm call no timeout bounds)."""

    def drain(self, node: str, reason: str) -> None:
        time.sleep(1.5)


def test_the_watchdog_after_a_fail_verdict_refuses(tmp_path: Path) -> None:
    """Was: the watchdog followed on_error whatever the state: fail-open, exit 0."""
    settings = Settings()
    settings.prolog.timeout_s = 0.3
    gate, _ = make_gate(tmp_path, lost_gpu(), settings=settings, client=Hanging([NODE]))  # type: ignore[arg-type]
    gate.prolog()
    assert gate.exits == [1]  # type: ignore[attr-defined]
    timed_out = next(r for r in gate.records if r["action"] == "timed-out")
    assert timed_out["verdict"] == "FAIL" and timed_out["exit"] == 1 and "watchdog" in timed_out["error"]


def test_the_watchdog_after_an_ok_verdict_keeps_it_even_fail_closed(tmp_path: Path) -> None:
    """After an OK verdict a slow bookkeeping step is no reason to refuse or drain."""
    settings = Settings()
    settings.epilog.timeout_s = 0.3
    settings.epilog.on_error = "fail-closed"
    gate, client = make_gate(tmp_path, settings=settings)
    gate._record_summary = lambda *a: time.sleep(1.5)  # type: ignore[method-assign]
    gate.epilog()
    assert gate.exits == [0] and not client.states[NODE].drained  # type: ignore[attr-defined]


def test_the_default_slurm_calls_fit_the_default_prolog() -> None:
    """Was: command_timeout_s 10 x retries 3 (+ 2 pauses of 1 s) = 32 s, watchdog 10 s."""
    s = Settings()
    worst = s.slurm.command_timeout_s * s.slurm.retries + s.slurm.retry_delay_s * (s.slurm.retries - 1)
    assert worst <= SLURM_SHARE * min(s.prolog.timeout_s, s.epilog.timeout_s)


def test_a_deadline_cuts_every_try_and_pause() -> None:
    calls: list[float] = []

    def runner(argv: object, env: object, timeout: float) -> subprocess.CompletedProcess[str]:
        calls.append(timeout)
        time.sleep(timeout)
        raise subprocess.TimeoutExpired("scontrol", timeout)

    client = CliSlurmClient(runner=runner, retries=5, retry_delay_s=0.2, command_timeout_s=10).within(0.5)
    start = time.monotonic()
    with pytest.raises(SlurmUnreachable, match="unreachable after"):
        client.run("scontrol", "show", "node", "n1")
    assert time.monotonic() - start < 5
    assert calls and calls[0] <= 0.5 and len(calls) < 5
