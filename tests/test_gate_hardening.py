"""Issue 12: nothing the disk, the config or a bad request does changes a health decision
or drains a node by accident (items 2 and 4 and the hook items of "Also")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgpu.config.schema import Settings
from slurmgpu.gate import job_context
from slurmgpu.testing import FakeSlurmClient, make_facts
from tests.test_gate import NODE, make_gate


def lost_gpu() -> object:
    facts = make_facts(NODE)
    facts.gpus[2].lost = True
    return facts


def unwritable_state_dir(tmp_path: Path) -> str:
    """A state dir path under a regular file: every mkdir/write there fails (even as root)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    return str(blocker / "state")


@pytest.mark.parametrize("phase", ["prolog", "epilog"])
def test_unwritable_state_dir_never_opens_the_gate(tmp_path: Path, phase: str) -> None:
    """Before: _save_job_state raised inside the gate's try -> internal error -> fail-open:
    a lost GPU passed with rc 0 and no drain."""
    gate, client = make_gate(tmp_path, lost_gpu(),  # type: ignore[arg-type]
                             env={"SLURMGPU_STATE_DIR": unwritable_state_dir(tmp_path)})
    code = getattr(gate, phase)()
    assert code == (1 if phase == "prolog" else 0)  # the epilog drains and lets Slurm go on
    assert client.states[NODE].drained and "gpu.lost GPU 2" in client.states[NODE].reason
    assert gate.bookkeeping_errors  # and it says what it could not record
    assert gate.records[-1]["action"] == "drained"


def test_a_failing_drain_call_still_refuses_the_job(tmp_path: Path) -> None:
    """[slurm] command_timeout_s = inf used to raise OverflowError in the drain call, which
    was taken for an internal error (fail-open): whatever breaks after a FAIL, it stands."""
    class Exploding(FakeSlurmClient):
        def drain(self, node: str, reason: str) -> None:
            raise OverflowError("timeout value is too large")

    gate, _ = make_gate(tmp_path, lost_gpu(), client=Exploding([NODE]))  # type: ignore[arg-type]
    assert gate.prolog() == 1
    assert gate.records[-1]["action"] == "drain-failed" and "OverflowError" in gate.records[-1]["error"]


@pytest.mark.parametrize("gpus", ["-1", "0,-3", "99999"])
def test_bad_gpu_indices_are_a_bad_request_not_a_drain(tmp_path: Path, gpus: str) -> None:
    """Before: SLURM_JOB_GPUS=-1 drained a healthy node with "gpu.lost GPU -1"."""
    assert job_context({"SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": gpus}).bad_gpus
    gate, client = make_gate(tmp_path, env={"SLURM_JOB_GPUS": gpus})
    assert gate.prolog() == 0  # on_error = fail-open by default
    assert not client.states[NODE].drained and gate.records[-1]["action"] == "fail-open"
    assert "bad request" in gate.records[-1]["error"]
    closed = Settings()
    closed.prolog.on_error = "fail-closed"
    gate, client = make_gate(tmp_path, env={"SLURM_JOB_GPUS": gpus}, settings=closed)
    assert gate.prolog() == 1


def test_strays_are_never_killed_without_the_jobs_uid(tmp_path: Path) -> None:
    settings = Settings()
    settings.epilog.strays = "kill"
    dev = tmp_path / "nvidia2"
    dev.write_text("")
    with open(dev) as device:  # the "stray" holds the GPU's device file open
        sleeper = subprocess.Popen(["sleep", "30"], stdin=device)
    try:
        gate, _ = make_gate(tmp_path, env={"SLURMGPU_DEVICE_PATTERN": str(tmp_path / "nvidia{index}"),
                                           "SLURM_JOB_GPUS": "2"}, settings=settings)
        assert "SLURM_JOB_UID" not in gate.environ
        found = gate._strays(job_context(gate.environ))
        assert [p["pid"] for p in found] == [sleeper.pid]
        assert not found[0].get("killed") and sleeper.poll() is None  # reported, not killed
    finally:
        sleeper.kill()
        sleeper.wait()


def run_hook(phase: str, config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0",
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_NVML_LIBRARY": "/nonexistent.so.1"}
    return subprocess.run([sys.executable, "-m", "slurmgpu", phase, "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("text,code,action", [
    ('[gpu]\ncount = "eight"\n', 0, "fail-open"),  # invalid value: the packaged default policy
    ("not toml [[[\n", 0, "fail-open"),  # not even TOML
    ('[gpu]\ncount = "eight"\n[prolog]\non_error = "fail-closed"\n', 1, "fail-closed"),  # as configured
])
def test_a_bad_config_follows_on_error_in_the_prolog(tmp_path: Path, text: str, code: int, action: str) -> None:
    """Before: `slurmgpu prolog` exited 3 on a config error, and Slurm drains a node whose
    prolog exits non-zero: one bad config push drained every node that started a job."""
    config = tmp_path / "slurmgpu.toml"
    config.write_text(text)
    proc = run_hook("prolog", config, tmp_path)
    assert proc.returncode == code, proc.stderr
    (line,) = [json.loads(ln) for ln in proc.stderr.splitlines() if ln.startswith("{")]
    assert (line["event"], line["action"]) == ("prolog_decision", action) and "config" in line["error"]


def test_a_missing_config_file_named_by_the_hook_is_fail_open(tmp_path: Path) -> None:
    proc = run_hook("epilog", tmp_path / "absent.toml", tmp_path)
    assert proc.returncode == 0 and "fail-open" in proc.stderr


def test_the_agent_reports_bookkeeping_it_could_not_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm path: the agent's gate decides (FAIL, drain) with a full state dir, and its next
    report carries an agent.state_dir WARN saying what could not be recorded."""
    import time

    from slurmgpu.agent import Agent
    from slurmgpu.agent.local import LocalService
    from slurmgpu.engine import Sources
    from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource

    monkeypatch.setenv("SLURMGPU_STATE_DIR", unwritable_state_dir(tmp_path))
    monkeypatch.setenv("SLURMGPU_JOBS_DIR", str(tmp_path / "jobs"))
    facts = lost_gpu()
    clock = FakeClock(now=time.time())
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    agent = Agent(settings, NODE, sources=Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),  # type: ignore[attr-defined]
                                                  FakeVersionSource(facts.versions), clock),  # type: ignore[attr-defined]
                  clock=clock, environ={})
    agent.poll()
    client = FakeSlurmClient([NODE])
    reply = LocalService(agent, lambda env: client).handle(
        {"op": "prolog", "env": {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "2"}})
    assert reply["exit"] == 1 and client.states[NODE].drained
    _, verdict = agent.poll()
    (finding,) = [f for f in verdict.findings if f.check == "agent.state_dir"]
    assert finding.severity.name == "WARN" and "could not record" in finding.message


def test_a_bug_before_the_gate_runs_is_fail_open(tmp_path: Path) -> None:
    """Anything that breaks while the hook sets up (after the config, before the gate's own
    error handling) follows on_error too, instead of a traceback and exit 1. (In a child
    process: the hook configures logging for the whole process.)"""
    config = tmp_path / "slurmgpu.toml"
    config.write_text("")
    code = ("import slurmgpu.engine as engine\n"
            "def broken(*a, **k):\n"
            "    raise RuntimeError('a bug in setting up the sources')\n"
            "engine.system_sources = broken\n"
            "from slurmgpu.cli import main\n"
            f"main(['prolog', '--config', {str(config)!r}])\n")
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0",
           "SLURMGPU_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert '"action": "fail-open"' in proc.stderr and "a bug in setting up the sources" in proc.stderr
