"""The kernel log's XIDs (slurmgpu.sources.kmsg): read by the cold path (`check`, the
prolog, the healthcheck) over one window (kmsg.xid_window), bounded in time and bytes, an
unreadable log UNKNOWN and never a drain; the agent's XIDs saved in its state dir and
seeded from the kernel log at start; the warm path's facts carry the agent's XIDs and its
previous sample (tests/test_warm_cold.py runs both paths against each other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgpu import testing
from slurmgpu.agent.core import XIDS_FILE, Agent
from slurmgpu.agent.local import CachedFacts
from slurmgpu.config.schema import Settings
from slurmgpu.engine import SourceFacts, Sources, add_kernel_xids, assemble, evaluate
from slurmgpu.facts import NvmlFacts, XidEvent
from slurmgpu.gate import Gate
from slurmgpu.result import Severity
from slurmgpu.sources import kmsg
from slurmgpu.testing import FakeNvmlSource, FakeSlurmClient, make_facts
from tests.simfixtures import ScenarioFactory, sim_env

NODE = "gpu-n1"
REPO = Path(__file__).resolve().parent.parent
RESET_REQUIRED = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"


def settings_in(tmp_path: Path) -> Settings:
    settings = Settings()
    settings.gpu.count = 8
    settings.paths.state_dir = str(tmp_path / "state")
    settings.paths.kmsg = str(tmp_path / "kmsg")
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.agent.jobs_dir = str(tmp_path / "jobs")
    return settings


def make_agent(settings: Settings, nvml: FakeNvmlSource | None = None) -> Agent:
    sources = cold_facts(Path(settings.paths.state_dir)).sources
    if nvml is not None:
        sources.nvml = nvml
    return Agent(settings, NODE, sources=sources, clock=sources.clock, environ={})


def log_xid(tmp_path: Path, gpu: int, xid: int, text: str = "simulated XID") -> None:
    kmsg.append_xid(str(tmp_path / "kmsg"), make_facts(NODE).gpus[gpu].pci_bus_id or "", xid, text)


# ------------------------------------------------------------------ the warm path's facts


def test_the_warm_path_keeps_the_agents_xids_and_previous_sample(tmp_path: Path) -> None:
    """CachedFacts rebuilt NodeFacts from nvml/ib/versions and dropped both."""
    agent = make_agent(settings_in(tmp_path))
    agent.poll()
    agent.on_nvml_event("xid", 2, 79)
    facts = CachedFacts(agent, str(tmp_path / "kmsg"))(frozenset({2, 3}))
    assert [(x.xid, x.gpu) for x in facts.xids] == [(79, 2)]
    assert facts.previous is not None and facts.previous.previous is None  # one sample deep
    assert evaluate(facts, agent.settings, scope=frozenset({2, 3})).severity is Severity.FAIL


def test_the_warm_path_reads_the_jobs_gpus_afresh(tmp_path: Path) -> None:
    """A fault no NVML event announces (a row remap pending) was invisible for up to
    [agent] max_age_s."""
    facts = make_facts(NODE)
    nvml = FakeNvmlSource(facts.nvml)
    agent = make_agent(settings_in(tmp_path), nvml)
    agent.poll()
    assert nvml.facts.gpus[2].remapped_rows is not None
    nvml.facts.gpus[2].remapped_rows.pending = True
    fresh = CachedFacts(agent, str(tmp_path / "kmsg"))(frozenset({2}))
    assert fresh.gpus[0].remapped_rows is not None and fresh.gpus[0].remapped_rows.pending
    assert nvml.calls[-1] == frozenset({2})  # the job's GPUs only


def test_facts_are_assembled_one_sample_deep() -> None:
    older = make_facts(NODE)
    old = assemble(NODE, older.nvml, collected_at=1.0, previous=older)
    new = assemble(NODE, older.nvml, collected_at=2.0, previous=old, xids=[XidEvent(79, 1)])
    assert new.previous is not None and new.previous.previous is None and old.previous is older
    assert new.xids == [XidEvent(79, 1)] and not new.ib.available


# ------------------------------------------------------------------ the agent's XID memory


def test_a_restarted_agent_remembers_its_xids_with_their_text(tmp_path: Path) -> None:
    """Even once the kernel log no longer holds them (a wrapped ring buffer)."""
    settings = settings_in(tmp_path)
    first = make_agent(settings)
    first.poll()
    log_xid(tmp_path, 4, 154, RESET_REQUIRED)
    first.on_nvml_event("xid", 4, 154)
    saved = json.loads((tmp_path / "state" / XIDS_FILE).read_text())
    assert [(x["xid"], x["gpu"]) for x in saved] == [(154, 4)] and saved[0]["message"].endswith(RESET_REQUIRED)
    (tmp_path / "kmsg").write_text("")
    facts, verdict = make_agent(settings).poll()
    assert [(x.xid, x.gpu, x.message) for x in facts.xids] == [(154, 4, saved[0]["message"])]
    assert verdict.severity is Severity.FAIL


def test_a_starting_agent_takes_the_kernel_logs_xids_of_the_window(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    log_xid(tmp_path, 3, 48)
    kmsg.mark_job_end(tmp_path / "state", time.time(), None)  # judged by a whole-node epilog
    log_xid(tmp_path, 4, 119)
    log_xid(tmp_path, 4, 154, RESET_REQUIRED)
    facts, verdict = make_agent(settings).poll()
    assert [(x.xid, x.gpu) for x in facts.xids] == [(119, 4), (154, 4)]
    assert verdict.severity is Severity.FAIL


def test_an_agent_started_before_the_driver_seeds_once_nvml_answers(tmp_path: Path) -> None:
    """Without NVML no PCI address maps a logged XID to its GPU (it would count for every
    job): the agent seeds at its first poll that reached NVML."""
    log_xid(tmp_path, 3, 79)
    facts = make_facts(NODE)
    nvml = FakeNvmlSource(NvmlFacts(available=False, error="NVIDIA driver not loaded"))
    agent = make_agent(settings_in(tmp_path), nvml)
    assert agent.poll()[0].xids == []
    nvml.facts = facts.nvml
    assert [(x.xid, x.gpu) for x in agent.poll()[0].xids] == [(79, 3)]


def test_an_unwritable_state_dir_keeps_the_xids_in_memory_and_says_so(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    (tmp_path / "blocker").write_text("")
    settings.paths.state_dir = str(tmp_path / "blocker" / "state")
    agent = make_agent(settings)
    agent.poll()
    agent.on_nvml_event("xid", 1, 79)
    _, verdict = agent.poll()
    assert {(f.check, f.severity) for f in verdict.problems()} >= {
        ("xid.recent", Severity.FAIL), ("agent.state_dir", Severity.WARN)}


def test_a_bad_xids_file_is_no_xid(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / XIDS_FILE).write_text('[{"xid": "x"}]')
    facts, verdict = make_agent(settings).poll()
    assert facts.xids == [] and verdict.severity is Severity.OK


# ------------------------------------------------------------------ the window and the bounds


def test_the_window_starts_at_the_lookback_the_boot_or_the_previous_jobs_end(tmp_path: Path) -> None:
    now = time.time()
    booted = now - time.clock_gettime(time.CLOCK_BOOTTIME)
    assert kmsg.window_start(now, 60, None) == pytest.approx(max(now - 60, booted), abs=0.01)
    assert kmsg.window_start(now, 10**6, now - 5) == now - 5
    assert kmsg.window_start(now, 10**6, now + 3600) == now  # a job end in the future: now
    settings = settings_in(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / kmsg.JOB_END_FILE).write_text('{"*": "inf", "0": 1e999}')
    assert kmsg.xid_window(settings, now) == pytest.approx(kmsg.window_start(now, 3600, None), abs=0.01)


def test_each_gpus_window_starts_at_the_last_epilog_that_judged_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    kmsg.mark_job_end(state, 100.0, [0, 1])
    kmsg.mark_job_end(state, 200.0, [1])
    kmsg.mark_job_end(state, 150.0, [1])  # an epilog that finished earlier writes later
    assert kmsg.previous_job_end(state, [0, 1]) == 100.0 and kmsg.previous_job_end(state, [1]) == 200.0
    assert kmsg.previous_job_end(state, [0, 5]) is None  # GPU 5: no epilog judged it
    assert kmsg.previous_job_end(state, None) is None
    kmsg.mark_job_end(state, 120.0, None)  # a job that had every GPU
    assert kmsg.previous_job_end(state, [0, 5]) == 120.0 and kmsg.previous_job_end(state, None) == 120.0
    assert kmsg.previous_job_end(state, [1]) == 200.0


def test_a_huge_kernel_log_file_is_read_from_its_end(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("4,1,1,-;" + "x" * 4000 + "\n")
    log_xid(tmp_path, 2, 79)
    xids = kmsg.read_xids(str(path), kmsg.pci_map(make_facts(NODE).nvml), max_bytes=1000)
    assert [(x.xid, x.gpu) for x in xids] == [(79, 2)]


def test_a_kernel_log_that_cannot_be_read_is_unknown_and_never_a_drain(tmp_path: Path) -> None:
    """A directory where the log should be: read() fails (EISDIR)."""
    (tmp_path / "kmsg").mkdir()
    facts = make_facts(NODE)
    with pytest.raises(kmsg.KernelLogError):
        kmsg.read_xids(str(tmp_path / "kmsg"), {})
    add_kernel_xids(facts, str(tmp_path / "kmsg"), 0.0)
    verdict = evaluate(facts, settings_in(tmp_path))
    assert [(f.check, f.severity) for f in verdict.problems()] == [("xid.recent", Severity.UNKNOWN)]
    client = FakeSlurmClient([NODE])
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}
    gate = Gate(settings_in(tmp_path), env, lambda: client, exit=lambda code: None,
                facts=cold_facts(tmp_path))
    assert gate.prolog() == 0 and gate.records[-1]["action"] == "fail-open" and client.calls == []


def cold_facts(tmp_path: Path) -> SourceFacts:
    """The cold path's provider over fake NVML/IB/versions and the test's kernel log."""
    facts = make_facts(NODE)
    sources = Sources(FakeNvmlSource(facts.nvml), testing.FakeIbSource(facts.ib),
                      testing.FakeVersionSource(facts.versions), testing.FakeClock(now=time.time()))
    return SourceFacts(sources, NODE, kernel_log=str(tmp_path / "kmsg"))


def test_the_kernel_log_device_is_read_within_its_time_bound() -> None:
    if not os.access(kmsg.DEFAULT_KMSG, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    with pytest.raises(kmsg.KernelLogError, match="not read within"):
        kmsg.read_xids(kmsg.DEFAULT_KMSG, {}, timeout_s=-1.0)
    kmsg.read_xids(kmsg.DEFAULT_KMSG, {})  # the whole ring buffer, within the default bound


# ------------------------------------------------------------------ the cold path's commands


def test_check_reads_the_kernel_log(tmp_path: Path, fake_nvml_lib: Path,
                                    scenario_file: ScenarioFactory) -> None:
    """R535: XID 119 then 154 "GPU Reset Required" between two jobs was OK, exit 0."""
    scenario = scenario_file("h100-sxm-8-r535")
    data = json.loads(scenario.read_text())
    for xid, text in ((119, "Timeout after 6s of waiting for RPC response"), (154, RESET_REQUIRED)):
        kmsg.append_xid(str(tmp_path / "kmsg"), data["gpus"][4]["pci"]["bus_id"], xid, text)
    env = sim_env(fake_nvml_lib, scenario, SLURMGPU_KMSG=str(tmp_path / "kmsg"),
                  SLURMGPU_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--json", "--gpus", "4"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    report = json.loads(proc.stdout)
    xids = [f for f in report["findings"] if f["check"] == "xid.recent" and f["severity"] != "OK"]
    assert proc.returncode == 2 and {f["data"]["xid"] for f in xids} == {119, 154}, proc.stdout[-2000:]
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "check", "--gpus", "0-3"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout  # GPU 4's XIDs are no other GPU's


def test_the_cold_healthcheck_reads_the_kernel_log(tmp_path: Path) -> None:
    log_xid(tmp_path, 6, 79)
    client = FakeSlurmClient([NODE])
    gate = Gate(settings_in(tmp_path), {"SLURMD_NODENAME": NODE}, lambda: client, exit=lambda code: None,
                facts=cold_facts(tmp_path))
    assert gate.healthcheck() == 2 and client.states[NODE].drained
    assert "XID 79" in (client.states[NODE].reason or "")
