"""Prolog/epilog/healthcheck decisions over fake sources and a fake Slurm (logic tests;
tests/test_slurm_integration.py runs the same hooks on the real mini-cluster)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.actions import Actions, drain_reason
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources, source_facts
from slurmgpu.facts import NodeFacts, NvmlFacts
from slurmgpu.gate import Gate, job_context, parse_gpu_indices
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import NodeState, SlurmUnreachable
from slurmgpu.sources import kmsg
from slurmgpu.sources.procs import find_device_holders
from slurmgpu.testing import (
    FakeClock,
    FakeIbSource,
    FakeNvmlSource,
    FakeSlurmClient,
    FakeVersionSource,
    make_facts,
)

NODE = "gpu-n1"


def sources(facts: NodeFacts) -> Sources:
    return Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib), FakeVersionSource(facts.versions),
                   FakeClock(now=time.time()))


def make_gate(tmp_path: Path, facts: NodeFacts | None = None, *, env: dict[str, str] | None = None,
              settings: Settings | None = None, client: FakeSlurmClient | None = None,
              src: Sources | Any = None) -> tuple[Gate, FakeSlurmClient]:
    client = client or FakeSlurmClient([NODE])
    environ = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3",
               "SLURM_JOB_USER": "alice", "SLURMGPU_STATE_DIR": str(tmp_path / "state"),
               "SLURMGPU_KMSG": str(tmp_path / "kmsg")}
    environ.update(env or {})
    settings = settings or Settings()
    settings.gpu.count = 8
    exits: list[int] = []
    gate = Gate(settings, environ, lambda: client,
                source_facts(src or sources(facts or make_facts(NODE)), settings, environ), exit=exits.append)
    gate.exits = exits  # type: ignore[attr-defined]
    return gate, client


def records(tmp_path: Path, name: str = "gate.jsonl") -> list[dict[str, Any]]:
    path = tmp_path / "state" / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# job context

@pytest.mark.parametrize(("env", "expected"), [
    ({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "5"}, frozenset({0, 1})),
    ({"CUDA_VISIBLE_DEVICES": "3"}, frozenset({3})),
    ({"SLURM_JOB_GPUS": ""}, frozenset()),
    ({"CUDA_VISIBLE_DEVICES": "GPU-1234-abcd"}, None),
    ({}, None),
])
def test_job_gpus_from_environment(env: dict[str, str], expected: frozenset[int] | None) -> None:
    assert job_context({"SLURMD_NODENAME": "n", **env}).gpus == expected


def test_parse_gpu_indices_rejects_garbage() -> None:
    assert parse_gpu_indices("NoDevFiles") is None


# prolog

def test_prolog_healthy_job_runs(tmp_path: Path) -> None:
    gate, client = make_gate(tmp_path)
    assert gate.prolog() == 0
    assert client.calls == []
    [rec] = records(tmp_path)
    assert rec["phase"] == "prolog" and rec["verdict"] == "OK" and rec["gpus"] == [2, 3] and rec["job"] == "42"
    assert (tmp_path / "state" / "jobs" / "42.json").exists()


def test_prolog_fail_on_job_gpu_drains_with_reason(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    assert facts.gpus[3].remapped_rows is not None
    facts.gpus[3].remapped_rows.failure = True
    gate, client = make_gate(tmp_path, facts)
    assert gate.prolog() == 1
    [(_, node, reason)] = client.calls
    assert node == NODE
    assert reason.startswith("slurmgpu: mem.row_remap GPU 3 row remapping failed")
    assert records(tmp_path)[0]["action"] == "drained"


def test_prolog_fault_on_other_gpu_does_not_block(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[6].lost = True
    gate, client = make_gate(tmp_path, facts)
    assert gate.prolog() == 0 and client.calls == []


def test_prolog_warn_runs_and_is_recorded(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[2].persistence_mode = False
    gate, client = make_gate(tmp_path, facts)
    assert gate.prolog() == 0 and client.calls == []
    rec = records(tmp_path)[0]
    assert rec["verdict"] == "WARN" and any("gpu.persistence GPU 2" in p for p in rec["problems"])


def test_prolog_keeps_an_operator_drain_reason(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[2].lost = True
    client = FakeSlurmClient([NODE])
    client.states[NODE] = NodeState(NODE, "idle", frozenset({"DRAIN"}), "bad fan, ticket 123")
    gate, _ = make_gate(tmp_path, facts, client=client)
    assert gate.prolog() == 1
    assert client.calls == [] and client.states[NODE].reason == "bad fan, ticket 123"
    assert records(tmp_path)[0]["action"] == "operator-drain-kept"


def test_prolog_drain_disabled_only_refuses(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[2].lost = True
    settings = Settings()
    settings.prolog.drain = False
    gate, client = make_gate(tmp_path, facts, settings=settings)
    assert gate.prolog() == 1 and client.calls == []


class BrokenNvml:
    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        raise RuntimeError("simulated bug")


def broken_sources() -> Sources:
    facts = make_facts(NODE)
    return Sources(BrokenNvml(), FakeIbSource(facts.ib), FakeVersionSource(facts.versions), FakeClock())


def test_internal_error_fails_open_by_default(tmp_path: Path) -> None:
    gate, client = make_gate(tmp_path, src=broken_sources())
    assert gate.prolog() == 0 and client.calls == []
    rec = records(tmp_path)[0]
    assert rec["action"] == "fail-open" and "RuntimeError: simulated bug" in rec["error"]


def test_internal_error_fail_closed_drains(tmp_path: Path) -> None:
    settings = Settings()
    settings.prolog.on_error = "fail-closed"
    gate, client = make_gate(tmp_path, settings=settings, src=broken_sources())
    assert gate.prolog() == 1
    assert client.calls[0][2].startswith("slurmgpu: internal error in prolog: RuntimeError: simulated bug")


def test_crashing_check_is_an_internal_error_not_a_drain(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[2].pcie = "garbage"  # type: ignore[assignment]
    gate, client = make_gate(tmp_path, facts)
    assert gate.prolog() == 0 and client.calls == []
    assert "pcie.link: check crashed" in records(tmp_path)[0]["error"]


class SlowNvml:
    def __init__(self, inner: FakeNvmlSource, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        time.sleep(self.seconds)
        return self.inner.collect(gpus)


def test_watchdog_names_the_slow_step(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    src = sources(facts)
    src.nvml = SlowNvml(FakeNvmlSource(facts.nvml), 0.6)
    settings = Settings()
    settings.prolog.timeout_s = 0.2
    gate, _ = make_gate(tmp_path, settings=settings, src=src)
    gate.prolog()
    assert gate.exits == [0]  # type: ignore[attr-defined]
    timeout = next(r for r in records(tmp_path) if r["action"] == "fail-open")
    assert "watchdog: prolog exceeded 0.2 s in gather:nvml" in timeout["error"]


def test_unreachable_slurmctld_journals_the_drain_and_replays_it(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[3].lost = True
    client = FakeSlurmClient([NODE])
    client.unreachable = True
    gate, _ = make_gate(tmp_path, facts, client=client)
    assert gate.prolog() == 1
    assert "drain-failed" in [r["action"] for r in records(tmp_path)]
    journal = tmp_path / "state" / "pending-actions.jsonl"
    assert "gpu.lost GPU 3" in journal.read_text()
    client.unreachable = False
    healthy, _ = make_gate(tmp_path, client=client)
    assert healthy.prolog() == 0
    assert client.states[NODE].drained and "gpu.lost GPU 3" in (client.states[NODE].reason or "")
    assert not journal.exists()


# epilog

def test_epilog_drains_on_xid_during_the_job(tmp_path: Path) -> None:
    kmsg.append_xid(str(tmp_path / "kmsg"), make_facts(NODE).gpus[2].pci_bus_id or "", 48)  # before the job
    time.sleep(0.01)
    kmsg.mark_job_end(tmp_path / "state", time.time(), {2, 3})  # ... and before the last epilog on 2, 3
    gate, client = make_gate(tmp_path)
    assert gate.prolog() == 0
    time.sleep(0.01)
    kmsg.append_xid(str(tmp_path / "kmsg"), make_facts(NODE).gpus[3].pci_bus_id or "", 79)
    gate2, _ = make_gate(tmp_path, client=client)
    assert gate2.epilog() == 0
    assert client.calls and client.calls[0][2].startswith("slurmgpu: xid.recent GPU 3 XID 79")
    [summary] = records(tmp_path, "job-summaries.jsonl")
    assert summary["xids"] == [{"xid": 79, "gpu": 3}] and summary["job"] == "42" and summary["user"] == "alice"
    assert not (tmp_path / "state" / "jobs" / "42.json").exists()


def test_epilog_ignores_xid_on_another_jobs_gpu(tmp_path: Path) -> None:
    gate, client = make_gate(tmp_path)
    assert gate.prolog() == 0
    kmsg.append_xid(str(tmp_path / "kmsg"), make_facts(NODE).gpus[6].pci_bus_id or "", 79)
    gate2, _ = make_gate(tmp_path, client=client)
    assert gate2.epilog() == 0 and client.calls == []


def test_epilog_summary_reports_ecc_growth_and_throttle(tmp_path: Path) -> None:
    gate, client = make_gate(tmp_path)
    assert gate.prolog() == 0
    later = make_facts(NODE)
    assert later.gpus[2].ecc is not None
    later.gpus[2].ecc.corrected_volatile = 12
    later.gpus[3].clocks_event_reasons = 0x40
    later.gpus[3].temperature_c = 80
    gate2, _ = make_gate(tmp_path, later, client=client)
    assert gate2.epilog() == 0
    [summary] = records(tmp_path, "job-summaries.jsonl")
    assert summary["ecc_delta"] == {"2": {"ecc_corrected": 12, "ecc_uncorrected": 0, "remapped_rows": 0}}
    assert summary["throttle_seen"] == ["hw_thermal_slowdown"] and summary["max_temp_c"] == 80


def test_epilog_finds_and_kills_stray_processes(tmp_path: Path) -> None:
    device = tmp_path / "nvidia3"
    device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(device)!r}); import time; time.sleep(60)"])
    try:
        deadline = time.time() + 10
        while not find_device_holders({str(device): 3}) and time.time() < deadline:
            time.sleep(0.05)
        settings = Settings()
        settings.epilog.strays = "kill"
        gate, _ = make_gate(tmp_path, settings=settings,
                            env={"SLURMGPU_DEVICE_PATTERN": str(tmp_path / "nvidia{index}"),
                                 "SLURM_JOB_UID": str(os.getuid())})  # never killed without it
        assert gate.epilog() == 0
        [summary] = records(tmp_path, "job-summaries.jsonl")
        assert summary["strays"][0]["pid"] == holder.pid and summary["strays"][0]["killed"] is True
        assert holder.wait(timeout=10) == -9
    finally:
        holder.kill()


def test_a_stray_is_found_whatever_its_command_line_mentions(tmp_path: Path) -> None:
    """Issue 28 item 9: strays_ignore matched substrings of the whole command line, so a
    stray run from a directory named slurmgpu with an argument naming dcgm was never
    reported nor killed (and the test above failed in a clone named slurmgpu)."""
    device = tmp_path / "nvidia3"
    device.write_text("")
    workdir = tmp_path / "slurmgpu" / "dcgm-bench"
    workdir.mkdir(parents=True)
    script = workdir / "train.py"
    script.write_text(f"import sys, time\nf = open({str(device)!r})\nprint('open', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, str(script), "--profile=dcgm"], cwd=workdir, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        settings = Settings()
        settings.epilog.strays = "kill"
        gate, _ = make_gate(tmp_path, settings=settings,
                            env={"SLURMGPU_DEVICE_PATTERN": str(tmp_path / "nvidia{index}"),
                                 "SLURM_JOB_UID": str(os.getuid())})
        assert gate.epilog() == 0
        [summary] = records(tmp_path, "job-summaries.jsonl")
        assert [(s["pid"], s["killed"]) for s in summary["strays"]] == [(holder.pid, True)]
        assert holder.wait(timeout=10) == -9
    finally:
        holder.kill()
        holder.wait()


def test_node_daemons_are_ignored_by_their_executable(tmp_path: Path) -> None:
    """An executable named by strays_ignore (or starting with an entry) is no stray."""
    from slurmgpu.sources.procs import ignored

    entries = Settings().epilog.strays_ignore
    assert ignored("nv-hostengine", entries) and ignored("dcgm-exporter", entries)
    assert ignored("slurmgpu", entries) and not ignored("python3.11", entries) and not ignored("", entries)


class RecordingFacts:
    """A FactsProvider (slurmgpu.engine) that says what the gate asked of it."""

    def __init__(self, facts: NodeFacts) -> None:
        self.facts = facts
        self.calls: list[tuple[frozenset[int] | None, float | None]] = []
        self.holder_calls: list[tuple[dict[str, int], int | None]] = []

    def __call__(self, gpus: frozenset[int] | None, *, xids_since: float | None = None,
                 progress: Any = None) -> NodeFacts:
        self.calls.append((gpus, xids_since))
        return copy.deepcopy(self.facts)

    def holders(self, devices: Any, *, uid: int | None, ignore: Any) -> list[dict[str, Any]]:
        self.holder_calls.append((dict(devices), uid))
        return [{"pid": 4242, "gpus": [3], "command": "python train.py"}]


def test_the_gate_takes_every_fact_from_its_provider(tmp_path: Path) -> None:
    """The job's GPUs with the kernel log since the window's start (kmsg.xid_window) for
    the prolog; every GPU with the kernel log since the job started for the epilog; the
    holders of the job's device files for its strays."""
    facts = make_facts(NODE)
    provider = RecordingFacts(facts)
    settings = Settings()
    settings.gpu.count = 8
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_UID": "1000",
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_DEVICE_PATTERN": "/dev/x{index}"}
    gate = Gate(settings, env, lambda: FakeSlurmClient([NODE]), provider, exit=lambda code: None)
    before = time.time()
    assert gate.prolog() == 0 and gate.epilog() == 0
    [(prolog_gpus, prolog_since), epilog_call] = provider.calls
    assert prolog_gpus == frozenset({2, 3}) and before - 3600 - 1 <= prolog_since <= before  # or the boot
    assert epilog_call == (None, facts.collected_at)
    assert provider.holder_calls == [({"/dev/x2": 2, "/dev/x3": 3}, 1000)]
    [summary] = records(tmp_path, "job-summaries.jsonl")
    assert [p["pid"] for p in summary["strays"]] == [4242]
    assert gate.healthcheck() == 0
    gpus, since = provider.calls[-1]  # every GPU, the kernel log since the epilog at least
    assert gpus is None and since is not None and since >= facts.collected_at


# healthcheck and actions

def test_healthcheck_drains_then_resumes_its_own_drain(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[6].lost = True
    gate, client = make_gate(tmp_path, facts, env={"SLURM_JOB_ID": "", "SLURM_JOB_GPUS": ""})
    assert gate.healthcheck() == 2 and client.states[NODE].owned_by_slurmgpu
    healthy, _ = make_gate(tmp_path, client=client)
    assert healthy.healthcheck() == 0 and not client.states[NODE].drained


@pytest.mark.parametrize(("state", "expected_action"), [
    (NodeState(NODE, "idle", frozenset({"DRAIN"}), "maintenance by bob"), "operator-drain-kept"),
    (NodeState(NODE, "idle", frozenset({"DRAIN", "REBOOT_REQUESTED"}), "slurmgpu: gpu.lost GPU 1 lost"),
     "rebooting-left-alone"),
    (NodeState(NODE, "idle", frozenset({"DRAIN"}), "slurmgpu: xid.recent GPU 1 XID 79: fell off"),
     "sticky-drain-kept"),
])
def test_healthcheck_never_resumes_what_it_must_not(tmp_path: Path, state: NodeState,
                                                    expected_action: str) -> None:
    client = FakeSlurmClient([NODE])
    client.states[NODE] = state
    gate, _ = make_gate(tmp_path, client=client)
    assert gate.healthcheck() == 0
    assert client.calls == [] and records(tmp_path)[0]["action"] == expected_action


def test_drain_is_idempotent(tmp_path: Path) -> None:
    client = FakeSlurmClient([NODE])
    actions = Actions(client, tmp_path)
    assert actions.drain(NODE, "gpu.lost GPU 1").action == "drained"
    assert actions.drain(NODE, "gpu.lost GPU 1").action == "already-drained"
    assert len(client.calls) == 1 and client.states[NODE].reason == "slurmgpu: gpu.lost GPU 1"


def test_drain_reason_is_one_line_and_names_the_worst() -> None:
    findings = [
        Finding("thermal.throttle", Severity.WARN, "hot", gpu=1),
        Finding("ib.port_state", Severity.FAIL, "port DOWN\nhostile; $(rm -rf /)", subject="mlx5_0/1"),
        Finding("gpu.lost", Severity.FAIL, "GPU is lost", gpu=4),
    ]
    reason = drain_reason(findings)
    assert reason.startswith("slurmgpu: gpu.lost GPU 4 GPU is lost (+2 more)")
    assert drain_reason([findings[1]]).startswith("slurmgpu: ib.port_state mlx5_0/1 port DOWN")


def test_resume_refuses_operator_drain_without_force(tmp_path: Path) -> None:
    client = FakeSlurmClient([NODE])
    client.states[NODE] = NodeState(NODE, "idle", frozenset({"DRAIN"}), "bob's drain")
    actions = Actions(client, tmp_path)
    assert actions.resume(NODE).action == "operator-drain-kept"
    assert actions.resume(NODE, force=True).action == "resumed"


def test_unreachable_during_healthcheck_is_unknown(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[1].lost = True
    client = FakeSlurmClient([NODE])
    client.unreachable = True
    gate, _ = make_gate(tmp_path, facts, client=client)
    assert gate.healthcheck() == 3
    assert records(tmp_path)[0]["action"] == "drain-deferred"
    with pytest.raises(SlurmUnreachable):
        Actions(client, tmp_path).drain(NODE, "x")


def test_stray_scan_ignores_daemons_and_other_users(tmp_path: Path) -> None:
    device = tmp_path / "nvidia0"
    device.write_text("")
    # A "daemon" holding the GPU: an executable whose name starts with an ignored one.
    program = tmp_path / "slurmgpu-agent"
    shutil.copy("/bin/sleep", program)
    with open(device) as held:
        daemon = subprocess.Popen([str(program), "60"], stdin=held)
    try:
        deadline = time.time() + 10
        while not find_device_holders({str(device): 0}) and time.time() < deadline:
            time.sleep(0.05)
        assert [p["pid"] for p in find_device_holders({str(device): 0})] == [daemon.pid]
        assert find_device_holders({str(device): 0}, ignore=["slurmgpu"]) == []
        assert find_device_holders({str(device): 0}, uid=12345) == []  # not the job user's
    finally:
        daemon.kill()


# who drained: the actor tag at the end of the reason (the fleet report's drains)

def test_each_hook_names_itself_in_its_drain_reason(tmp_path: Path) -> None:
    facts = make_facts(NODE)
    facts.gpus[3].lost = True
    gate, client = make_gate(tmp_path / "p", facts)
    assert gate.prolog() == 1
    reason = client.states[NODE].reason
    assert reason.startswith("slurmgpu: gpu.lost GPU 3 ") and reason.endswith(" [by prolog]")
    assert client.states[NODE].owned_by_slurmgpu  # still slurmgpu's own: resumable
    rec = records(tmp_path / "p")[0]
    assert (rec["action"], rec["exit"], rec["reason"]) == ("drained", 1, reason)
    gate, client = make_gate(tmp_path / "e", facts)
    assert gate.epilog() == 0
    assert client.states[NODE].reason.endswith(" [by epilog]")
    assert records(tmp_path / "e")[0]["exit"] == 0
    gate, client = make_gate(tmp_path / "h", facts, env={"SLURM_JOB_ID": "", "SLURM_JOB_GPUS": ""})
    assert gate.healthcheck() == 2
    assert client.states[NODE].reason.endswith(" [by healthcheck]")
    settings = Settings()
    settings.prolog.on_error = "fail-closed"
    gate, client = make_gate(tmp_path / "f", settings=settings, src=broken_sources())
    assert gate.prolog() == 1
    assert client.states[NODE].reason.endswith(" [by prolog]")
    assert records(tmp_path / "f")[0]["exit"] == 1


def test_prolog_that_lets_the_job_run_records_exit_0(tmp_path: Path) -> None:
    gate, _ = make_gate(tmp_path, src=broken_sources())  # fail-open
    assert gate.prolog() == 0
    assert [(r["action"], r["exit"]) for r in records(tmp_path)] == [("fail-open", 0)]


@pytest.mark.parametrize(("reason", "expected_action"), [
    ("slurmgpu: gpu.lost GPU 1 GPU is lost [by prolog]", "resumed"),
    ("slurmgpu: xid.recent GPU 1 XID 79: fell off [by epilog]", "sticky-drain-kept"),
])
def test_healthcheck_resume_rules_hold_for_tagged_reasons(tmp_path: Path, reason: str,
                                                          expected_action: str) -> None:
    client = FakeSlurmClient([NODE])
    client.states[NODE] = NodeState(NODE, "idle", frozenset({"DRAIN"}), reason)
    gate, _ = make_gate(tmp_path, client=client)
    assert gate.healthcheck() == 0
    assert records(tmp_path)[0]["action"] == expected_action
