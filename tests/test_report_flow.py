"""Where the fleet report's "jobs requeued" and "who drained" come from, traced through the
path each takes in production: the hooks (slurmgpu.gate, warm through the agent's local
socket or full) and the agent on the node, the wire, the collector's store, its Slurm poll
(Store.record_slurm_states) and the automation (slurmgpu.collector.policy), then the
report. Only Slurm is faked (slurmgpu.testing.FakeSlurmClient)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner

from slurmgpu import wire
from slurmgpu.agent.core import Agent
from slurmgpu.agent.gatelog import POSITION, GateLogForwarder
from slurmgpu.agent.local import LocalService
from slurmgpu.cli import cli
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings, Settings
from slurmgpu.engine import Sources, source_facts
from slurmgpu.facts import NodeFacts
from slurmgpu.gate import Gate
from slurmgpu.report.model import report_from_path
from slurmgpu.result import Finding, Severity
from slurmgpu.testing import (
    FakeClock,
    FakeIbSource,
    FakeNvmlSource,
    FakeSlurmClient,
    FakeVersionSource,
    make_facts,
)
from slurmgpu.wire import decode_received

NODE = "gpu-n1"
NODES = [f"gpu-n{i}" for i in range(1, 41)]


def _settings(tmp_path: Path) -> Settings:
    settings = Settings()
    settings.gpu.count = 8
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.paths.state_dir = str(tmp_path / "state")
    return settings


def _sources(facts: NodeFacts) -> Sources:
    return Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                   FakeVersionSource(facts.versions), FakeClock(now=time.time()))


def _bad_facts() -> NodeFacts:
    facts = make_facts(NODE)
    facts.gpus[3].lost = True
    return facts


def _agent(tmp_path: Path, facts: NodeFacts) -> Agent:
    agent = Agent(_settings(tmp_path), NODE, sources=_sources(facts),
                  clock=FakeClock(now=time.time()), environ={})
    agent.open_spool()
    return agent


def _hook_env(tmp_path: Path, job: str) -> dict[str, str]:
    return {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": "2,3",
            "SLURM_JOB_USER": "alice", "SLURMGPU_STATE_DIR": str(tmp_path / "state"),
            "SLURMGPU_KMSG": str(tmp_path / "kmsg"), "SLURMGPU_JOBS_DIR": str(tmp_path / "jobs")}


def _bad_gate(tmp_path: Path, job: str, client: FakeSlurmClient) -> Gate:
    """The full path's gate (slurmgpu prolog/epilog) on a node with a lost GPU."""
    settings, env = _settings(tmp_path), _hook_env(tmp_path, job)
    return Gate(settings, env, lambda: client, source_facts(_sources(_bad_facts()), settings, env),
                exit=lambda code: None)


def _deliver(agent: Agent, store: Store) -> list[wire.Envelope]:
    """What the link and the collector do with the spooled messages: decode, store."""
    assert agent.spool is not None
    envs = [decode_received(frame) for _, frame in agent.spool.pending(limit=1000)]
    store.store_batch([(env.node, env, body) for env, body in envs])
    return [env for env, _ in envs]


def _report(store: Store) -> dict[str, Any]:
    now = time.time()
    return report_from_path(store.path, now - 3600, now + 3600, config=None, generated_at=now)


# --------------------------------------------------------------------------- requeues


def test_warm_path_prolog_refusal_is_a_requeued_job(tmp_path: Path) -> None:
    """The agent answers the prolog (slurmgpu-quickgate -> LocalService), refuses the
    job (Slurm requeues it) and sends prolog_blocked: the report counts a requeued job."""
    agent = _agent(tmp_path, _bad_facts())
    client = FakeSlurmClient([NODE])
    reply = LocalService(agent, client_factory=lambda env: client).hook(
        "prolog", _hook_env(tmp_path, "4242"))
    assert reply["exit"] == 1 and reply["record"]["action"] == "drained"
    store = Store(tmp_path / "fleet.db")
    (event,) = _deliver(agent, store)
    m = _report(store)
    assert m["summary"]["jobs_requeued"] == 1 and m["summary"]["jobs_prolog_blocked"] == 1
    assert m["jobs"]["requeued"] == {"events": 0, "jobs": 1, "checkpoint_jobs": 0, "prolog_jobs": 1}
    assert (event.type, event.body["kind"], event.body["job_id"]) == ("event", "prolog_blocked", "4242")
    assert (event.body["action"], event.body["path"]) == ("drained", "agent")
    assert m["jobs"]["prolog_blocked"]["recent"][0]["action"] == "drained"


def test_full_path_prolog_refusal_reaches_the_report(tmp_path: Path) -> None:
    """The agent did not answer: the hook ran `slurmgpu prolog` (slurmgpu.gate.Gate),
    which writes gate.jsonl only. The agent forwards that record after its next poll."""
    agent = _agent(tmp_path, make_facts(NODE))
    assert agent.forward_gate_log() == 0  # no gate.jsonl yet: read it from its start
    client = FakeSlurmClient([NODE])
    gate = _bad_gate(tmp_path, "777", client)
    assert gate.prolog() == 1
    record = gate.records[-1]
    assert (record["action"], record["exit"]) == ("drained", 1) and "path" not in record
    agent.poll_and_report()  # the report, then the gate records written since the last poll
    assert agent.forward_gate_log() == 0  # sent once
    store = Store(tmp_path / "fleet.db")
    envs = _deliver(agent, store)
    blocked = [e for e in envs if e.type == "event"]
    assert [(e.body["job_id"], e.body["path"], e.body["action"]) for e in blocked] == [
        ("777", "full", "drained")]
    assert blocked[0].ts == pytest.approx(record["time"])  # when the prolog refused it
    m = _report(store)
    assert m["summary"]["jobs_requeued"] == 1 and m["jobs"]["requeued"]["prolog_jobs"] == 1


def test_requeued_counts_each_job_once(tmp_path: Path) -> None:
    """A job the prolog refused twice (requeued, refused again) and requeued after a
    checkpoint is one requeued job."""
    store = Store(tmp_path / "fleet.db")
    now = time.time()
    body = msgpack.packb({"kind": "prolog_blocked", "gpu": None, "data": None, "verdict": "FAIL",
                          "findings": [], "job_id": "9"})
    for seq in (1, 2):
        env = wire.Envelope(type=wire.EVENT, node=NODE, seq=seq, ts=now - 100 + seq,
                            body=msgpack.unpackb(body))
        store.store_batch([(NODE, env)])
    with store.transaction():
        store.add_job_event("9", now - 50, "requeued", NODE)
        store.add_job_event("10", now - 40, "requeued", NODE)
    m = _report(store)
    assert m["jobs"]["requeued"] == {"events": 2, "jobs": 2, "checkpoint_jobs": 2, "prolog_jobs": 1}


# --------------------------------------------------------------------------- gate.jsonl


def _line(**record: Any) -> str:
    base = {"time": time.time(), "phase": "prolog", "node": NODE, "job": "1", "verdict": "FAIL",
            "action": "drained", "exit": 1, "problems": ["gpu.lost GPU 3: lost"]}
    return json.dumps({**base, **record}) + "\n"


def test_gate_log_forwards_only_full_path_prolog_refusals(tmp_path: Path) -> None:
    sent: list[tuple[dict[str, Any], float | None]] = []
    log = tmp_path / "gate.jsonl"
    fwd = GateLogForwarder(tmp_path, NODE, lambda body, ts: sent.append((body, ts)))
    assert fwd.poll() == 0 and not (tmp_path / POSITION).exists()
    log.write_text("".join([
        _line(job="1"),
        _line(job="2", path="agent"),                       # the warm path sent it already
        _line(job="3", phase="epilog", exit=0),
        _line(job="4", action="none", exit=0, verdict="OK"),
        _line(job="5", action="fail-open", exit=0, verdict=None),
        _line(job="6", action="fail-closed:drained", exit=1, verdict=None),
        _line(job="7", node="gpu-n9"),                      # not this node's
        _line(job="8", action="refuse", exit=None),         # before records had "exit"
        "not json\n",
        _line(job="9", phase="replay"),
    ]))
    assert fwd.poll() == 3
    assert [(b["job_id"], b["action"], b["verdict"]) for b, _ in sent] == [
        ("1", "drained", "FAIL"), ("6", "fail-closed:drained", "FAIL"), ("8", "refuse", "FAIL")]
    assert all(b["kind"] == "prolog_blocked" and b["path"] == "full" for b, _ in sent)
    for body, ts in sent:  # what the wire accepts
        wire.decode(wire.encode(wire.Envelope(type=wire.EVENT, node=NODE, seq=1, body=body,
                                              ts=ts or time.time())))
    assert fwd.poll() == 0


def test_gate_log_position_survives_restarts_and_rotation(tmp_path: Path) -> None:
    sent: list[str] = []
    log = tmp_path / "gate.jsonl"

    def forwarder() -> GateLogForwarder:
        return GateLogForwarder(tmp_path, NODE, lambda body, ts: sent.append(body["job_id"]))

    log.write_text(_line(job="old"))
    first = forwarder()
    assert first.poll() == 0  # first run: what is there already is history
    with open(log, "a") as f:
        f.write(_line(job="a") + _line(job="b")[:20])  # b: still being written
    assert first.poll() == 1 and sent == ["a"]
    with open(log, "a") as f:
        f.write(_line(job="b")[20:])
    again = forwarder()  # the agent restarted: goes on where it was
    assert again.poll() == 1 and sent == ["a", "b"]
    log.rename(tmp_path / "gate.jsonl.1")  # rotated: a new file from its start
    log.write_text(_line(job="c"))
    assert again.poll() == 1 and sent[-1] == "c"
    log.write_text("")  # truncated
    with open(log, "a") as f:
        f.write(_line(job="d"))
    assert again.poll() == 1 and sent[-1] == "d"


# --------------------------------------------------------------------------- who drained


def _stamp(client: FakeSlurmClient, node: str, ts: float, user: str = "root") -> None:
    """Slurm's reason time and user (the fake leaves a placeholder)."""
    client.states[node] = dataclasses.replace(client.states[node], reason_time=ts, reason_user=user)


def test_epilog_drain_near_an_automation_decision_is_the_epilogs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The automation drains gpu-n1, an operator resumes it, 60 s later the epilog of the
    job that ran there drains it again (the old report called that the automation's: a
    decision within 120 s). Then `slurmgpu drain` by alice, and someone's scontrol."""
    client = FakeSlurmClient(NODES)
    store = Store(tmp_path / "fleet.db")
    t = time.time() - 600
    for node in NODES[:4]:  # the nodes the report knows
        store.store_batch([(node, wire.Envelope(type=wire.HELLO, node=node, seq=1, ts=t,
                                                body={"version": "x", "gpus": 8, "interval_s": 15.0}))],
                          received_at=t)
    auto = Automation(AutomationSettings(), client, tmp_path / "auto", FakeClock(now=t), store=store)
    auto.fleet_size(len(NODES))
    failing = [Finding("ecc.uncorrected", Severity.FAIL, "3 volatile uncorrected ECC errors", gpu=0)]
    decisions = auto.on_report(NODE, Severity.FAIL, failing, t)
    assert [d.result for d in decisions] == ["drained"]
    store.add_decisions(decisions)
    _stamp(client, NODE, t + 1)
    store.record_slurm_states(client.nodes(), t + 5)
    client.resume(NODE)  # an operator: scontrol update state=resume
    store.record_slurm_states(client.nodes(), t + 30)

    gate = _bad_gate(tmp_path, "42", client)
    assert gate.epilog() == 0
    epilog_reason = client.states[NODE].reason
    _stamp(client, NODE, t + 60)

    monkeypatch.setenv("SUDO_USER", "alice")
    monkeypatch.setattr("slurmgpu.cli.slurm_cmds._client", lambda settings: client)
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "admin"}"\n')
    result = CliRunner().invoke(cli, ["drain", "gpu-n2", "--reason", "replace PSU",
                                      "--config", str(config)])
    assert result.exit_code == 0, result.output
    operator_reason = client.states["gpu-n2"].reason
    _stamp(client, "gpu-n2", t + 70)
    client.states["gpu-n3"] = dataclasses.replace(client.states["gpu-n3"], flags=frozenset({"DRAIN"}),
                                                  reason="disk swap", reason_time=t + 80,
                                                  reason_user="carol")
    store.record_slurm_states(client.nodes(), t + 90)

    m = _report(store)
    got = [(r["node"], r["by"], r["drained_by"]) for r in m["drains"]["drains"]]
    assert got == [
        (NODE, "automation", "slurmgpu automation"),
        (NODE, "hook", "slurmgpu epilog"),  # not the automation's
        ("gpu-n2", "operator", "operator alice (slurmgpu drain)"),
        ("gpu-n3", "outside", "carol (outside slurmgpu)"),
    ]
    assert [(r["hook"], r["attribution"]) for r in m["drains"]["drains"]] == [
        (None, "recorded"), ("epilog", "recorded"), (None, "recorded"), (None, "recorded")]
    assert m["drains"]["by"] == {"automation": 1, "hook": 1, "operator": 1, "outside": 1}
    # (the hook and `slurmgpu drain` said who they are in the reason, which Slurm keeps)
    assert epilog_reason.startswith("slurmgpu: gpu.lost GPU 3 ") and epilog_reason.endswith(" [by epilog]")
    assert operator_reason == "slurmgpu: replace PSU [by operator alice]"
