"""The warm prolog (the node's agent answers over its socket) and the cold one (no agent:
`slurmgpu prolog`) decide alike: the shipped `prolog/slurmgpu-prolog` wrapper, run both
ways over the same simulated node state, gives the same exit code, verdict, action and
drain reason. The states: every bundled scenario (as the agent's last poll saw it, and
appearing after that poll), XIDs as NVML events and as kernel-log lines, agent restarts,
XIDs on GPUs the job was not given, XIDs judged by an earlier job's epilog, an unwritable
state_dir. A scenario added to slurmgpu/sim/scenarios/ joins the matrix by itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.agent.core import Agent
from slurmgpu.agent.local import serve_local
from slurmgpu.config.load import load_config
from slurmgpu.sim import scenario as sim
from slurmgpu.sources.kmsg import mark_job_end
from slurmgpu.testing import FakeSlurmClient
from tests.agenthelpers import wait_until

REPO = Path(__file__).resolve().parent.parent
NODE = "gpu-wc1"
BASE = "h100-sxm-8"
CONFIG = """\
[prolog]
drain = false
"""
ALL = "0,1,2,3,4,5,6,7"
FAULTS = [name for name, _ in sim.list_scenarios()]
# Faults no NVML event announces, which the warm path admitted from its cache (issue 36).
UNANNOUNCED = ("fault-row-remap-pending", "fault-nvlink-down", "fault-fabric-not-started",
               "fault-ecc-dbe")


@dataclass(frozen=True)
class Decision:
    exit: int
    verdict: str | None
    action: str | None
    reason: str | None
    path: str | None = field(compare=False, default=None)


@dataclass
class SimNode:
    """One simulated node: its scenario file, kernel log and state dir, its agent (in this
    process, serving the local socket) when up."""

    tmp: Path
    lib: Path
    monkeypatch: pytest.MonkeyPatch
    state_dir: Path
    data: dict[str, Any] = field(default_factory=dict)
    agent: Agent | None = None
    stop: threading.Event | None = None
    server: threading.Thread | None = None
    jobs: int = 0

    @property
    def scenario(self) -> Path:
        return self.tmp / "scenario.json"

    @property
    def kmsg(self) -> Path:
        return self.tmp / "kmsg"

    @property
    def socket(self) -> str:
        return str(self.tmp / "agent.sock")

    def env(self) -> dict[str, str]:
        return {sim.ENV_LIBRARY: str(self.lib), sim.ENV_SCENARIO: str(self.scenario),
                "SLURMGPU_CONFIG": str(self.tmp / "slurmgpu.toml"), "SLURMGPU_STATE_DIR": str(self.state_dir),
                "SLURMGPU_KMSG": str(self.kmsg), "SLURMGPU_JOBS_DIR": str(self.tmp / "jobs")}

    def show(self, name: str, mutate: Callable[[dict[str, Any]], None] | None = None) -> None:
        """The node's GPUs become those of scenario ``name`` (no NVML event)."""
        self.data = sim.load_scenario(name)
        if mutate is not None:
            mutate(self.data)
        sim.write_scenario(self.scenario, self.data)

    def xid(self, gpu: int, xid: int, text: str = "simulated XID", *, event: bool = True) -> None:
        """The driver reports an XID: a kernel-log line and (``event``) an NVML event; with
        the agent up, wait until it judged the event."""
        before = self.agent.events_evaluated if self.agent is not None else 0
        sim.inject_xid(self.data, gpu, xid, kernel_log=self.kmsg, text=text, event=event)
        sim.write_scenario(self.scenario, self.data)
        if event and self.agent is not None and self.agent.events is not None:
            agent = self.agent
            wait_until(lambda: agent.events_evaluated > before, 20, f"the agent judging XID {xid}")

    def start_agent(self, *, events: bool = True) -> Agent:
        settings = load_config(str(self.tmp / "slurmgpu.toml")).settings_for(NODE)
        settings.agent.events = events
        agent = Agent(settings, NODE, environ=self.env())
        agent.poll()
        agent.start_events()
        self.stop, ready = threading.Event(), threading.Event()
        client = FakeSlurmClient([NODE])
        self.server = threading.Thread(target=serve_local, args=(agent, self.socket, self.stop),
                                       kwargs={"client_factory": lambda env: client, "ready": ready},
                                       daemon=True)
        self.server.start()
        assert ready.wait(10)
        self.agent = agent
        return agent

    def stop_agent(self) -> None:
        if self.agent is None:
            return
        assert self.stop is not None and self.server is not None
        self.stop.set()
        self.agent.stop_event.set()
        self.server.join(10)
        if self.agent.events is not None:
            self.agent.events.join(10)
        self.agent = None

    def restart_agent(self) -> None:
        """A new agent; the driver's past events are not delivered to its new event set."""
        events = self.agent is not None and self.agent.settings.agent.events
        self.stop_agent()
        self.data["events"] = []
        sim.write_scenario(self.scenario, self.data)
        self.start_agent(events=events)

    def prolog(self, gpus: str = ALL) -> Decision:
        """The shipped wrapper, as slurmd runs it (agent up: warm; down: cold)."""
        self.jobs += 1
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "SLURMGPU_PYTHON": sys.executable, "SLURMGPU_AGENT_SOCKET": self.socket,
               "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": str(7000 + self.jobs), "SLURM_JOB_GPUS": gpus,
               "CUDA_VISIBLE_DEVICES": gpus, "SLURM_JOB_USER": "alice",
               "SLURMGPU_AGENT_TIMEOUT": "10", **self.env()}  # a loaded CI machine is no agent down
        proc = subprocess.run([str(REPO / "prolog" / "slurmgpu-prolog")], env=env, capture_output=True,
                              text=True, timeout=60, check=False, cwd="/")
        record = decision_record(proc.stderr)
        return Decision(proc.returncode, record.get("verdict"), record.get("action"), record.get("reason"),
                        record.get("path", "full"))

    def warm_then_cold(self, gpus: str = ALL) -> tuple[Decision, Decision]:
        assert self.agent is not None, "the warm half needs the agent up"
        warm = self.prolog(gpus)
        self.stop_agent()
        cold = self.prolog(gpus)
        assert warm.path == "agent" and cold.path != "agent"
        return warm, cold


def decision_record(stderr: str) -> dict[str, Any]:
    for line in reversed(stderr.strip().splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("phase") == "prolog":
            return record
    raise AssertionError(f"no prolog decision on stderr:\n{stderr}")


@pytest.fixture
def node(tmp_path: Path, fake_nvml_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    (tmp_path / "slurmgpu.toml").write_text(CONFIG)
    (tmp_path / "kmsg").write_text("")
    simulated = SimNode(tmp_path, fake_nvml_lib, monkeypatch, tmp_path / "state")
    for key, value in simulated.env().items():  # the agent's own environment (paths, NVML)
        monkeypatch.setenv(key, value)
    simulated.show(BASE)
    yield simulated
    simulated.stop_agent()


def same(warm: Decision, cold: Decision, expect: tuple[int, str] | None = None) -> None:
    assert warm == cold, f"warm {warm} != cold {cold}"
    if expect is not None:
        assert (cold.exit, cold.verdict) == expect, cold


# ------------------------------------------------------------------ every bundled scenario


@pytest.mark.parametrize("name", FAULTS)
def test_a_state_the_agent_polled(node: SimNode, name: str) -> None:
    node.show(name)
    node.start_agent()
    same(*node.warm_then_cold(_all_gpus(node)))


@pytest.mark.parametrize("name", [n for n in FAULTS
                                  if len(sim.load_scenario(n).get("gpus") or []) >= 7])
def test_a_fault_that_appears_after_the_agents_poll(node: SimNode, name: str) -> None:
    """No NVML event says so (row remap pending, NVLink down, fabric manager gone, an
    uncorrected ECC count with no DBE event, ...): was admitted warm, drained cold."""
    node.start_agent()
    node.show(name)
    same(*node.warm_then_cold(), expect=(1, "FAIL") if name in UNANNOUNCED else None)


def test_a_lost_gpu_with_events_off(node: SimNode) -> None:
    node.start_agent(events=False)
    node.show("fault-gpu-lost")
    same(*node.warm_then_cold(), expect=(1, "FAIL"))


def _all_gpus(node: SimNode) -> str:
    return ",".join(str(i) for i in range(len(node.data.get("gpus") or [])))


# ------------------------------------------------------------------ XIDs


@pytest.mark.parametrize(("xid", "text"), [(79, "GPU has fallen off the bus."),
                                           (48, "An uncorrectable double bit error (DBE) has been detected"),
                                           (154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")])
def test_a_fatal_xid_as_an_nvml_event(node: SimNode, xid: int, text: str) -> None:
    """The agent's own status said FAIL while its warm prolog said OK; the cold one never
    read the kernel log."""
    node.start_agent()
    node.xid(2, xid, text)
    same(*node.warm_then_cold(), expect=(1, "FAIL"))


@pytest.mark.parametrize("xid", [79, 48])
def test_a_fatal_xid_in_the_kernel_log_before_the_agent_started(node: SimNode, xid: int) -> None:
    node.xid(5, xid, event=False)
    node.start_agent()
    same(*node.warm_then_cold(), expect=(1, "FAIL"))


def test_xid_119_then_154_on_r535(node: SimNode) -> None:
    """R535-R560 have no recovery-action field: only the kernel log says the GPU needs a
    reset (was: OK, exit 0)."""
    node.show("h100-sxm-8-r535")
    node.xid(4, 119, "Timeout after 6s of waiting for RPC response from GPU4 GSP!", event=False)
    node.xid(4, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
             event=False)
    node.start_agent()
    same(*node.warm_then_cold(), expect=(1, "FAIL"))


def test_a_warn_xid_reaches_the_record(node: SimNode) -> None:
    node.start_agent()
    node.xid(1, 94, "Contained ECC error")
    warm, cold = node.warm_then_cold()
    same(warm, cold, expect=(0, "WARN"))


def test_an_xid_on_a_gpu_the_job_was_not_given(node: SimNode) -> None:
    node.start_agent()
    node.xid(6, 79)
    same(*node.warm_then_cold("0,1"), expect=(0, "OK"))


@pytest.mark.parametrize(("judged", "expect"), [(range(8), (0, "OK")), ((0, 1), (1, "FAIL"))])
def test_an_xid_before_the_previous_jobs_epilog(node: SimNode, judged: range | tuple[int, ...],
                                                expect: tuple[int, str]) -> None:
    """That epilog judged its own GPUs' XIDs, not another GPU's (a shared node)."""
    node.start_agent()
    node.xid(3, 79)
    mark_job_end(node.state_dir, time.time(), judged)
    same(*node.warm_then_cold(), expect=expect)


def test_an_agent_restart_after_an_xid(node: SimNode) -> None:
    node.start_agent()
    node.xid(2, 79)
    node.restart_agent()
    same(*node.warm_then_cold(), expect=(1, "FAIL"))


@pytest.mark.parametrize("xid", [None, 79])
def test_an_unwritable_state_dir(node: SimNode, xid: int | None) -> None:
    """A state dir under a regular file: every write fails, even as root."""
    (node.tmp / "blocker").write_text("")
    node.state_dir = node.tmp / "blocker" / "state"
    node.monkeypatch.setenv("SLURMGPU_STATE_DIR", str(node.state_dir))
    node.start_agent()
    if xid is not None:
        node.xid(0, xid)
    same(*node.warm_then_cold(), expect=(1, "FAIL") if xid else (0, "OK"))
