"""Quiet, complete NVML events in the agent (issue 10): only health events are
registered, at most one re-evaluation per GPU per second for repeats and non-health events
(a new health code is judged at once), and only XID/ECC/recovery events or a change of
verdict/findings go on the wire."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from slurmgpu import wire
from slurmgpu.agent import Agent
from slurmgpu.agent.core import COALESCE_S
from slurmgpu.agent.events import WANTED
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources
from slurmgpu.testing import FakeClock, FakeIbSource, FakeNvmlSource, FakeVersionSource, make_facts
from tests.agenthelpers import (
    AgentProcess,
    FakeCollector,
    free_port,
    make_bundle,
    wait_until,
    write_config,
)
from tests.simfixtures import ScenarioFactory, run_pynvml, sim_env

# How long the clock-flood test runs: the 60 s (SLURMGPU_FLOOD_S shortens it locally).
FLOOD_S = float(os.environ.get("SLURMGPU_FLOOD_S", "60"))


def agent_with_fakes(tmp_path: Path) -> tuple[Agent, FakeClock, FakeNvmlSource]:
    clock = FakeClock()
    facts = make_facts("n1", gpus=4, ib_ports=2)
    nvml = FakeNvmlSource(facts.nvml)
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path)
    agent = Agent(settings, "n1", sources=Sources(nvml, FakeIbSource(facts.ib),
                                                  FakeVersionSource(facts.versions), clock), clock=clock)
    agent.open_spool()
    agent.poll()
    return agent, clock, nvml


def agent_and_collector(tmp_path: Path, lib: Path, scenario: Path, *,
                        interval: float) -> tuple[FakeCollector, AgentProcess]:
    """A real agent process on the fake NVML, talking CURVE to a test collector."""
    keys, collector_secret = make_bundle(tmp_path)
    port = free_port()
    config = write_config(tmp_path / "agent.toml", port=port, spool=tmp_path / "spool", interval=interval)
    collector = FakeCollector(port, collector_secret).start()
    return collector, AgentProcess(config, keys, sim_env(lib, scenario), tmp_path / "agent.log")


def sent(agent: Agent) -> list[wire.Envelope]:
    assert agent.spool is not None
    return [e for e in (wire.decode(f) for _, f in agent.spool.pending()) if e.type == "event"]


def test_only_health_events_are_registered() -> None:
    assert WANTED & 0x10 == 0 and WANTED & 0x4 == 0 and WANTED & 0x80 == 0  # clock, pstate, power
    assert WANTED & 0x1 == 0  # single-bit ECC only as a storm (0x200)
    assert WANTED == 0x8 | 0x2 | 0x200 | 0x400 | 0x800 | 0x1000 | 0x2000 | 0x4000 | 0x8000


def test_repeats_of_one_code_within_a_second_share_one_evaluation_but_each_is_sent(tmp_path: Path) -> None:
    agent, clock, _ = agent_with_fakes(tmp_path)
    agent.on_nvml_event("xid", 3, 13)
    assert agent.events_evaluated == 1 and len(sent(agent)) == 1
    clock.advance(0.2)
    agent.on_nvml_event("xid", 3, 13)
    agent.on_nvml_event("clock", 3, 0)
    agent.on_nvml_event("xid", 3, 13)
    assert agent.events_evaluated == 1  # repeats and non-health events wait for the window's end
    assert agent.run_deferred() == pytest.approx(COALESCE_S - 0.2)
    clock.advance(COALESCE_S)
    assert agent.run_deferred() is None
    assert agent.events_evaluated == 2
    assert [(e.body["kind"], e.body["data"]) for e in sent(agent)] == [("xid", 13)] * 3
    agent.on_nvml_event("xid", 1, 13)  # another GPU is not held back
    assert agent.events_evaluated == 3


def test_a_burst_of_distinct_health_events_is_judged_one_by_one_at_once(tmp_path: Path) -> None:
    """XIDs 20-60 ms apart on one GPU (issue 28 item 4): each new code is evaluated and sent
    when it arrives, taking any waiting repeat along; none waits for the window."""
    agent, clock, _ = agent_with_fakes(tmp_path)
    burst = [("xid", 13), ("xid", 31), ("xid", 13), ("ecc_dbe", None), ("xid", 48), ("xid", 79)]
    evaluated = []
    for kind, data in burst:
        agent.on_nvml_event(kind, 2, data)
        evaluated.append(agent.events_evaluated)
        clock.advance(0.04)
    assert evaluated == [1, 2, 2, 3, 4, 5]  # only the repeated 13 waited
    assert [(e.body["kind"], e.body["data"]) for e in sent(agent)] == [
        ("xid", 13), ("xid", 31), ("xid", 13), ("ecc_dbe", None), ("xid", 48), ("xid", 79)]
    assert sent(agent)[-1].body["verdict"] == "FAIL"
    assert agent.run_deferred() is None  # the waiting repeat went with the next new code


def test_an_unchanged_reevaluation_is_not_a_message(tmp_path: Path) -> None:
    agent, clock, nvml = agent_with_fakes(tmp_path)
    for _ in range(50):  # e.g. pstate/clock events, were they ever registered
        agent.on_nvml_event("clock", 2, 0)
        clock.advance(1.5)
    assert agent.events_evaluated == 50
    assert len(sent(agent)) == 1  # the first evaluation said what the GPU looks like; no change since
    nvml.facts.gpus[2].temperature_c = 200  # now something changed
    agent.on_nvml_event("clock", 2, 0)
    bodies = [e.body for e in sent(agent)]
    assert len(bodies) == 2 and bodies[-1]["verdict"] == "FAIL"


def test_fake_emits_clock_events_at_real_rates(fake_nvml_lib: Path, scenario_file: ScenarioFactory) -> None:
    """The simulator is as noisy as a real driver: ~10/s per GPU idle, ~35/s under load."""
    path = scenario_file("h100-sxm-8", lambda s: s["gpus"][1].update(load=True))
    out = run_pynvml(
        """
        N.nvmlInit()
        counts = {}
        for index in (0, 1):
            es = N.nvmlEventSetCreate()
            N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(index), N.nvmlEventTypeClock, es)
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < 2.0:
                try:
                    d = N.nvmlEventSetWait_v2(es, 100)
                    n += d.eventType == N.nvmlEventTypeClock
                except N.NVMLError_Timeout:
                    pass
            counts[index] = n / (time.monotonic() - t0)
            N.nvmlEventSetFree(es)
        emit(counts)
        """,
        sim_env(fake_nvml_lib, path),
    )
    assert 5 <= out["0"] <= 13, out  # idle: 10/s
    assert 20 <= out["1"] <= 40, out  # under load: 35/s


def test_clock_event_flood_sends_nothing(tmp_path: Path, fake_nvml_lib: Path,
                                         scenario_file: ScenarioFactory) -> None:
    """8 GPUs under load emit ~280 clock events/s; for FLOOD_S seconds the agent puts no
    event on the wire (before the fix: one message, a WARNING line and a DB row each)."""
    path = scenario_file("h100-sxm-8", lambda s: [g.update(load=True) for g in s["gpus"]])
    collector, agent = agent_and_collector(tmp_path, fake_nvml_lib, path, interval=5.0)
    try:
        collector.wait_for(lambda e: e.type == "report", timeout=30)
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert agent.proc.poll() is None, agent.output()[-2000:]
        # an XID still arrives, and only it: the watcher is alive and registered
        started = time.monotonic()
        scenario_file.update(path, lambda d: d["events"].append({"gpu": 2, "type": 8, "data": 79, "id": 1}))
        xid = collector.wait_for(lambda e: e.type == "event", timeout=10, after=started)
        assert (xid.envelope.body["kind"], xid.envelope.body["data"]) == ("xid", 79)
        wait_until(lambda: len(collector.of_type("report")) >= 2, what="reports", timeout=30)
    finally:
        rc = agent.stop()
        collector.stop()
    events = [m.envelope.body["kind"] for m in collector.messages if m.envelope.type == "event"]
    assert events == ["xid"], events
    event_lines = re.findall(r"\bnvml_event\b", agent.output())
    assert len(event_lines) == 1, agent.output()[-3000:]  # the XID's one WARNING line
    assert rc == 0


def test_recovery_action_event_reaches_the_collector(tmp_path: Path, fake_nvml_lib: Path,
                                                     scenario_file: ScenarioFactory) -> None:
    """R570+: the driver's GpuRecoveryAction event (0x8000) is registered, re-judged at once
    and sent with the gpu.recovery_action finding naming the action."""
    path = scenario_file("h100-sxm-8-r570")
    collector, agent = agent_and_collector(tmp_path, fake_nvml_lib, path, interval=30.0)
    try:
        collector.wait_for(lambda e: e.type == "report", timeout=30)
        wait_until(lambda: "nvml_events_watching" in agent.output(), what="the event watcher")
        started = time.monotonic()

        def recover(d: dict) -> None:  # type: ignore[type-arg]
            d["gpus"][6]["recovery_action"] = 2  # NODE_REBOOT
            d["events"].append({"gpu": 6, "type": 0x8000, "data": 2, "id": 7})

        scenario_file.update(path, recover)
        event = collector.wait_for(lambda e: e.type == "event", timeout=10, after=started).envelope
        assert (event.body["kind"], event.body["gpu"], event.body["verdict"]) == ("recovery_action", 6, "FAIL")
        (finding,) = [f for f in event.body["findings"] if f["check"] == "gpu.recovery_action"]
        assert finding["severity"] == "FAIL" and finding["data"]["recovery_action"] == "NODE_REBOOT"
    finally:
        rc = agent.stop()
        collector.stop()
    assert rc == 0


def test_an_nvml_xid_takes_its_text_from_the_kernel_log(tmp_path: Path) -> None:
    """NVML reports only the code; the decision for the NVLink5 family needs the driver's
    text, which the agent takes from the kernel log line logged with it."""
    from slurmgpu.sources.kmsg import kmsg_record, xid_message

    clock = FakeClock(now=time.time())
    facts = make_facts("n1", gpus=4, ib_ports=2)
    log = tmp_path / "kmsg"
    fatal = "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000)"
    log.write_text(kmsg_record(xid_message(facts.gpus[2].pci_bus_id or "", 149, fatal)) +
                   kmsg_record(xid_message(facts.gpus[1].pci_bus_id or "", 149, "NETIR_BER_EVENT Nonfatal XC0")))
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    agent = Agent(settings, "n1", sources=Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                                                  FakeVersionSource(facts.versions), clock),
                  clock=clock, environ={"SLURMGPU_KMSG": str(log), "SLURMGPU_STATE_DIR": str(tmp_path / "state")})
    agent.open_spool()
    agent.poll()
    agent.on_nvml_event("xid", 2, 149)
    agent.on_nvml_event("xid", 1, 149)
    bodies = {e.body["gpu"]: e.body for e in sent(agent)}
    assert bodies[2]["message"].endswith(fatal) and bodies[1]["message"].endswith("NETIR_BER_EVENT Nonfatal XC0")
    actions = {g: [f["data"]["action"] for f in b["findings"] if f["check"] == "xid.recent"]
               for g, b in bodies.items()}
    assert actions == {2: ["reset"], 1: ["ignore"]}
