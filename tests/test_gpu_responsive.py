"""gpu.responsive (issue 33): every NVML query answers within [nvml] query_deadline_s, or
its GPU is "not responding"; a hung GPU never hangs `check`, a hook or the agent's
warm path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from slurmgpu.agent.core import Agent
from slurmgpu.agent.local import LocalService
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources, evaluate
from slurmgpu.facts import HungProcess, NvmlFacts
from slurmgpu.result import Severity
from slurmgpu.sim.scenario import sim_environment
from slurmgpu.sources import SystemClock
from slurmgpu.sources.deadline import DeadlineNvmlSource
from slurmgpu.sources.nvml import QueryWatch
from slurmgpu.testing import FakeIbSource, FakeVersionSource, healthy_host, make_facts

BLOCKED = "nvmlDeviceGetName"


class HangingNvml:
    """A source that blocks on one GPU's query until released, as NVML on a hung GPU."""

    def __init__(self, hung_gpu: int) -> None:
        self.facts = make_facts().nvml
        self.hung_gpu = hung_gpu
        self.release = threading.Event()
        self.watch = QueryWatch()
        self.collects = 0

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        self.collects += 1
        so_far = NvmlFacts(True, None, self.facts.driver_version, "12.4", self.facts.device_count)
        self.watch.facts = so_far
        for gpu in self.facts.gpus:
            if gpus is None or gpu.index in gpus:
                self.watch.at(gpu.index, BLOCKED)
                if gpu.index == self.hung_gpu:
                    self.release.wait()
                so_far.gpus.append(gpu)
        return so_far


def test_a_query_past_the_deadline_is_left_behind_and_not_asked_again() -> None:
    nvml = HangingNvml(3)
    source = DeadlineNvmlSource(nvml, deadline_s=0.3)
    facts = source.collect()
    assert [g.index for g in facts.gpus] == list(range(8))
    assert facts.gpus[3].unresponsive == f"{BLOCKED} did not answer within 0.3 s"
    assert facts.gpus[5].unresponsive == "not asked: NVML did not answer on GPU 3"
    assert facts.gpus[2].unresponsive is None and facts.gpus[2].name
    again = source.collect(frozenset({3}))  # still stuck: no second worker, an answer at once
    assert nvml.collects == 1 and again.gpus[0].unresponsive == f"{BLOCKED} did not answer within 0.3 s"
    nvml.release.set()
    deadline = time.monotonic() + 10
    while source._stuck is not None and source._stuck.thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(g.unresponsive is None for g in source.collect().gpus)


def test_gpu_responsive_fails_the_hung_gpu_and_warns_for_the_rest() -> None:
    facts = make_facts()
    facts.nvml = DeadlineNvmlSource(HangingNvml(3), deadline_s=0.2).collect()
    facts.host = healthy_host()
    facts.host.hung_processes = [HungProcess(4242, "python3", ["/dev/nvidia3", "/dev/nvidiactl"])]
    found = [(f.severity.name, f.gpu, f.message) for f in evaluate(facts, Settings()).findings
             if f.check == "gpu.responsive"]
    assert found[0] == ("FAIL", 3, f"GPU not responding: {BLOCKED} did not answer within 0.2 s")
    assert ("WARN", 3, "process 4242 (python3) in D state (uninterruptible) holding /dev/nvidia3, "
            "/dev/nvidiactl") in found
    assert {(s, g) for s, g, _ in found[1:]} == {("WARN", i) for i in range(3, 8)}
    scoped = evaluate(facts, Settings(), scope=frozenset({0, 1})).findings
    assert all(f.severity is Severity.OK for f in scoped if f.check == "gpu.responsive")
    hung = [f for f in scoped if f.severity is not Severity.OK]
    assert not hung, hung  # the GPUs that answered are judged as usual; none is blamed


def test_the_warm_gate_answers_while_the_agents_poll_is_stuck(tmp_path: Path) -> None:
    settings = Settings()
    settings.paths.state_dir = str(tmp_path)
    settings.agent.spool_dir = str(tmp_path / "spool")
    nvml = HangingNvml(3)
    sources = Sources(DeadlineNvmlSource(nvml, deadline_s=1.0), FakeIbSource(make_facts().ib),
                      FakeVersionSource(make_facts().versions), SystemClock())
    agent = Agent(settings, "gpu-h100-001", sources=sources, environ={})
    poll = threading.Thread(target=agent.poll, daemon=True)
    poll.start()
    started = time.monotonic()
    reply = LocalService(agent).gate([3])
    took = time.monotonic() - started
    try:
        assert reply["verdict"] == "FAIL" and any("GPU not responding" in p for p in reply["problems"])
        assert took < settings.prolog.timeout_s / 2, took
        assert LocalService(agent).gate([0])["verdict"] == "OK"
    finally:
        nvml.release.set()
        poll.join(10)


def test_check_on_a_hung_gpu_ends_within_its_deadline(sim_dir_env: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[nvml]\nquery_deadline_s = 1.0\n")
    env = {**os.environ, **sim_environment("fault-gpu-hang")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - started
    result = json.loads(proc.stdout)
    failing = {(f["check"], f["gpu"]) for f in result["findings"] if f["severity"] == "FAIL"}
    assert (proc.returncode, failing) == (2, {("gpu.responsive", 3)})
    assert any("D state" in f["message"] for f in result["findings"] if f["check"] == "gpu.responsive")
    assert took < 1.0 + 10, took  # the deadline plus the interpreter's start, on a busy machine


def test_the_cold_prolog_on_a_hung_gpu_refuses_the_job_within_its_budget(fake_nvml_lib: Path,
                                                                          tmp_path: Path) -> None:
    """The shipped path (quick client, no agent -> `slurmgpu prolog`) on a node whose GPU 3
    hangs in NVML. Before the deadline the gather never ended: the watchdog failed the job open."""
    from slurmgpu.sim.hostroot import materialize
    from slurmgpu.sim.scenario import SCENARIO_DIR
    from tests.simfixtures import bundled_scenario, sim_env

    repo = Path(__file__).resolve().parent.parent
    config = tmp_path / "slurmgpu.toml"
    config.write_text((repo / "etc" / "sim-h100.toml").read_text() + "\n[nvml]\nquery_deadline_s = 1.0\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "scontrol").chmod(0o755)
    (tmp_path / "kmsg").write_text("")
    host = materialize(bundled_scenario("fault-gpu-hang"), tmp_path / "host")
    env = sim_env(fake_nvml_lib, SCENARIO_DIR / "fault-gpu-hang.json", SLURMGPU_STATE_DIR=str(tmp_path / "state"),
                  SLURMGPU_KMSG=str(tmp_path / "kmsg"), SLURMD_NODENAME="gpu-h100-001", SLURM_JOB_ID="4242",
                  SLURM_JOB_GPUS="2,3", SLURMGPU_CONFIG=str(config), SLURMGPU_PYTHON=sys.executable,
                  SLURMGPU_AGENT_SOCKET=str(tmp_path / "no-agent.sock"), SLURMGPU_HOST_ROOT=str(host),
                  PATH=f"{bindir}:{os.environ['PATH']}")
    env.pop("SLURMGPU_BIN", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-I", "-S", str(repo / "slurmgpu" / "quickgate.py"), "prolog"],
                          env=env, capture_output=True, text=True, timeout=60, check=False, cwd="/")
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "state" / "gate.jsonl").read_text().splitlines()]
    assert record["verdict"] == "FAIL" and "gpu.responsive" in record["reason"], record
    assert took < Settings().prolog.timeout_s / 2, took


def test_a_real_agent_on_a_hung_gpu_keeps_answering_the_warm_prolog(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """The agent process polls a node whose GPU 3 hangs in NVML; the shipped quick client
    asks it for a job on GPU 3 (refused) and one on GPU 0 (runs), each well within budget."""
    from slurmgpu.sim.hostroot import materialize
    from slurmgpu.sim.scenario import SCENARIO_DIR
    from tests.agenthelpers import AgentProcess, free_port, make_bundle, wait_until, write_config
    from tests.simfixtures import bundled_scenario, sim_env

    repo = Path(__file__).resolve().parent.parent
    spool = tmp_path / "spool"
    config = write_config(tmp_path / "agent.toml", port=free_port(), spool=spool,
                          extra=f'[nvml]\nquery_deadline_s = 1.0\n\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "scontrol").chmod(0o755)
    (tmp_path / "kmsg").write_text("")
    env = sim_env(fake_nvml_lib, SCENARIO_DIR / "fault-gpu-hang.json", SLURMGPU_KMSG=str(tmp_path / "kmsg"),
                  SLURMGPU_HOST_ROOT=str(materialize(bundled_scenario("fault-gpu-hang"), tmp_path / "host")),
                  SLURMGPU_STATE_DIR=str(tmp_path / "state"), PATH=f"{bindir}:{os.environ['PATH']}")
    agent = AgentProcess(config, make_bundle(tmp_path)[0], env, tmp_path / "agent.log", node="gpu-h100-001")
    try:
        wait_until(lambda: (spool / "agent.sock").exists(), timeout=30, what="the agent's socket")
        hook = {**env, "SLURMD_NODENAME": "gpu-h100-001", "SLURM_JOB_ID": "7", "SLURMGPU_PYTHON": sys.executable,
                "SLURMGPU_AGENT_SOCKET": str(spool / "agent.sock"), "SLURMGPU_CONFIG": str(config)}
        hook.pop("SLURMGPU_BIN", None)
        for gpus, expected in (("3", 1), ("0", 0)):
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-I", "-S", str(repo / "slurmgpu" / "quickgate.py"), "prolog"],
                                  env={**hook, "SLURM_JOB_GPUS": gpus}, capture_output=True, text=True,
                                  timeout=60, check=False, cwd="/")
            took = time.monotonic() - started
            assert proc.returncode == expected, (gpus, proc.stderr, agent.output()[-2000:])
            assert took < Settings().prolog.timeout_s / 2, (gpus, took)
        records = [json.loads(line) for line in (tmp_path / "state" / "gate.jsonl").read_text().splitlines()]
        assert [(r.get("path"), r["verdict"]) for r in records] == [("agent", "FAIL"), ("agent", "OK")], records
        assert "gpu.responsive" in records[0]["reason"]
    finally:
        agent.stop()


def test_the_retry_pause_is_not_a_query_past_its_deadline(sim_dir_env: Path, tmp_path: Path) -> None:
    """A GPU answering errors is read again after [nvml] retry_delay_s (2 s here): that pause
    is no NVML call, so a 1 s deadline must not call the GPU unresponsive."""
    config = tmp_path / "c.toml"
    config.write_text("[nvml]\nquery_deadline_s = 1.0\nretry_delay_s = 2.0\n")
    env = {**os.environ, **sim_environment("fault-nvml-unknown-error")}
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    found = json.loads(proc.stdout)["findings"]
    assert {(f["check"], f["gpu"]) for f in found if f["severity"] == "FAIL"} == {("gpu.nvml_errors", 4)}
    assert all(f["severity"] == "OK" for f in found if f["check"] == "gpu.responsive")


class HangingInit(HangingNvml):
    """nvmlInit itself does not answer (the driver is wedged for every GPU)."""

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        self.watch.facts = None
        self.watch.at(None, "nvmlInit")
        self.release.wait()
        return self.facts


def test_nvml_that_does_not_start_fails_the_node_not_one_gpu() -> None:
    nvml = HangingInit(hung_gpu=-1)
    facts = make_facts()
    facts.nvml = DeadlineNvmlSource(nvml, deadline_s=0.2).collect()
    try:
        assert not facts.nvml.available and facts.nvml.error == "NVML not responding: nvmlInit did not answer within 0.2 s"
        found = [(f.severity.name, f.gpu, f.message) for f in evaluate(facts, Settings()).findings
                 if f.check == "gpu.responsive"]
        assert found == [("FAIL", None, "NVML not responding: nvmlInit did not answer within 0.2 s")]
    finally:
        nvml.release.set()
