"""Checkpoint coordination logic (collector side): a real Store, the real Automation,
a fake Slurm and a fake agent link. The end-to-end path (real Slurm, agents, ZeroMQ)
is in tests/test_checkpoint_e2e.py."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.collector.checkpoint import Checkpoints
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.store import Store
from slurmgpu.config.schema import AutomationSettings
from slurmgpu.result import Severity
from slurmgpu.testing import FakeClock, FakeSlurmClient
from slurmgpu.wire import decode_finding, decode_severity

NODES = [f"gpu-{i:03d}" for i in range(1, 21)]
XID79 = [{"check": "xid.recent", "severity": "FAIL", "gpu": 3, "subject": None,
          "message": "XID 79 GPU has fallen off the bus", "not_applicable": False,
          "data": {"xid": 79, "action": "reset"}}]
REMAP = [{"check": "mem.row_remap", "severity": "WARN", "gpu": 1, "subject": None,
          "message": "row remapping pending (needs a GPU reset)", "not_applicable": False, "data": {}}]


class Rig:
    def __init__(self, tmp_path: Path, *, connected: set[str] | None = None, **kw: Any) -> None:
        self.tmp = tmp_path
        self.client = FakeSlurmClient(NODES)
        self.clock = FakeClock()
        self.settings = AutomationSettings(checkpoint_deadline_s=60.0, **kw)
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.connected = set(NODES) if connected is None else connected
        self.open()

    def open(self) -> None:
        """(Re)start the collector side: a new Store, Automation and Checkpoints on the
        same files, as after a collector restart."""
        self.store = Store(self.tmp / "fleet.db")
        self.auto = Automation(self.settings, self.client, self.tmp, self.clock, store=self.store,
                               checkpoints=functools.partial(Checkpoints, self.store, self.client,
                                                             self.settings, send=self.send,
                                                             clock=self.clock.time))
        self.auto.fleet_size(len(NODES))
        assert self.auto.checkpoints is not None
        self.cp: Checkpoints = self.auto.checkpoints

    def send(self, node: str, command: str, args: dict[str, Any]) -> str:
        if node not in self.connected:
            raise RuntimeError(f"node {node} is not connected")
        self.sent.append((node, command, args))
        return f"cmd-{len(self.sent)}"

    def report(self, node: str, findings: list[dict[str, Any]], verdict: str = "FAIL") -> list[Any]:
        """A report as the collector decodes it (``findings`` in their wire form)."""
        return self.auto.on_report(node, decode_severity(verdict), [decode_finding(f) for f in findings],
                                   self.clock.time())

    def ack(self, node: str, job_id: str) -> list[Any]:
        return self.cp.on_result(node, {"command_id": "x", "ok": True, "result": {
            "job_id": job_id, "state": "acked", "acked_at": self.clock.time(), "note": "step 40"}},
            self.clock.time())

    def kinds(self, job_id: str) -> list[str]:
        return [e["kind"] for e in self.store.job_events(job_id)]

    def calls(self, kind: str) -> list[tuple[str, ...]]:
        return [c for c in self.client.calls if c[0] == kind]


def test_drain_now_signals_waits_for_ack_then_drains_and_requeues(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("101", ["gpu-001", "gpu-002"], user="alice")
    [d] = rig.report("gpu-001", XID79)
    assert (d.action, d.result) == ("drain-now", "checkpointing")
    assert rig.calls("signal") == [("signal", "101", "USR1", "False")]
    assert rig.calls("drain") == []  # not before the job's ack
    assert [(n, c) for n, c, _ in rig.sent] == [("gpu-001", "checkpoint"), ("gpu-002", "checkpoint")]
    args = rig.sent[0][2]
    assert args["job_id"] == "101" and args["action"] == "drain-now" and args["user"] == "alice"
    assert args["deadline"] == pytest.approx(rig.clock.time() + 60)
    # A second report of the same fault is not a second signal.
    rig.clock.advance(5)
    assert rig.report("gpu-001", XID79) == []
    assert len(rig.calls("signal")) == 1
    # The job acks from its other node: drain, then requeue.
    rig.clock.advance(3)
    [done] = rig.ack("gpu-002", "101")
    assert (done.node, done.action, done.result) == ("gpu-001", "drain-now", "drained")
    assert [c[0] for c in rig.client.calls] == ["signal", "drain", "admin_comment", "requeue"]
    assert rig.client.states["gpu-001"].reason.startswith("slurmgpu: xid.recent GPU 3")
    # Its user reads why it moved on the job itself (issue 29 item 1).
    assert rig.calls("admin_comment") == [("admin_comment", "101", "slurmgpu: requeued from gpu-001: xid.recent GPU 3 "
                                                                  "XID 79 GPU has fallen off the bus")]
    assert rig.kinds("101") == ["detected", "signalled", "acked", "drained", "requeued"]
    assert rig.cp.pending() == [] and rig.cp.open_count() == 0
    assert rig.store.checkpoints(job_id="101")[0]["state"] == "acked"


def test_checkpoint_action_drains_after_ack_and_keeps_the_job(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("7", ["gpu-003"])
    [d] = rig.report("gpu-003", REMAP, "WARN")
    assert (d.action, d.result) == ("checkpoint", "checkpointing")
    rig.ack("gpu-003", "7")
    assert [c[0] for c in rig.client.calls] == ["signal", "drain"]  # no requeue
    assert rig.client.jobs["7"].state == "RUNNING"


def test_no_ack_drains_and_requeues_at_the_deadline(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("55", ["gpu-004"])
    rig.report("gpu-004", XID79)
    rig.clock.advance(59)
    assert rig.cp.tick(rig.clock.time()) == []
    rig.clock.advance(1)
    [d] = rig.cp.tick(rig.clock.time())
    assert d.result == "drained"
    assert rig.kinds("55") == ["detected", "signalled", "deadline", "drained", "requeued"]
    assert rig.store.checkpoints(job_id="55")[0]["state"] == "expired"
    # A late ack is recorded, and changes nothing.
    assert rig.ack("gpu-004", "55") == []
    assert rig.kinds("55")[-1] == "acked-late"


def test_idle_node_drains_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    [d] = rig.report("gpu-005", XID79)
    assert d.result == "drained" and rig.sent == [] and rig.calls("signal") == []


def test_node_waits_for_every_job(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("1", ["gpu-006"])
    rig.client.add_job("2", ["gpu-006", "gpu-007"])
    rig.report("gpu-006", XID79)
    assert rig.ack("gpu-006", "1") == []
    assert rig.calls("drain") == []
    [d] = rig.ack("gpu-007", "2")
    assert d.result == "drained"
    assert sorted(c[1] for c in rig.calls("requeue")) == ["1", "2"]


def test_ack_from_a_node_outside_the_job_is_ignored(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("9", ["gpu-008"])
    rig.report("gpu-008", XID79)
    assert rig.ack("gpu-010", "9") == []
    assert rig.calls("drain") == [] and "acked" not in rig.kinds("9")


def test_unconnected_agent_is_recorded_and_signal_still_sent(tmp_path: Path) -> None:
    rig = Rig(tmp_path, connected={"gpu-011"})
    rig.client.add_job("12", ["gpu-011", "gpu-012"])
    rig.report("gpu-011", XID79)
    assert rig.calls("signal") and [n for n, _, _ in rig.sent] == ["gpu-011"]
    events = rig.store.job_events("12")
    assert ("notify-failed", "gpu-012") in [(e["kind"], e["node"]) for e in events]


def test_collector_restart_mid_checkpoint_resumes_from_the_db(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("77", ["gpu-013"])
    rig.report("gpu-013", XID79)
    rig.store.close()
    rig.open()  # a new process: nothing in memory
    assert [p["node"] for p in rig.cp.pending()] == ["gpu-013"]
    assert rig.report("gpu-013", XID79) == []  # still waiting: no second signal
    assert len(rig.calls("signal")) == 1
    [d] = rig.ack("gpu-013", "77")
    assert d.result == "drained" and rig.calls("requeue") == [("requeue", "77")]
    # and the deadline survives a restart too
    rig.client.add_job("78", ["gpu-014"])
    rig.report("gpu-014", XID79)
    rig.store.close()
    rig.open()
    rig.clock.advance(61)
    [d] = rig.cp.tick(rig.clock.time())
    assert d.node == "gpu-014" and rig.kinds("78")[-2:] == ["drained", "requeued"]


def test_held_drain_now_still_asks_the_jobs_to_checkpoint(tmp_path: Path) -> None:
    """A drain-now held by the breaker used to leave the job alone: it ran on, on a node
    with a lost GPU, until it ended. Now only the drain waits; the job is signalled and
    told at once, and the release does not signal it again."""
    rig = Rig(tmp_path, max_per_hour=1)
    rig.client.add_job("1", ["gpu-001"])
    rig.client.add_job("2", ["gpu-002", "gpu-003"], user="bob")
    assert rig.report("gpu-001", XID79)[0].result == "checkpointing"
    [held] = rig.report("gpu-002", XID79)
    assert held.held and held.result == "held" and "1 job(s) asked to checkpoint" in held.reason
    assert [c[1] for c in rig.calls("signal")] == ["1", "2"]
    assert [(n, c, a["job_id"], a["action"]) for n, c, a in rig.sent[1:]] == [
        ("gpu-002", "checkpoint", "2", "drain-now"), ("gpu-003", "checkpoint", "2", "drain-now")]
    assert rig.kinds("2") == ["detected", "signalled"]
    assert "circuit breaker holds the drain" in rig.store.job_events("2")[0]["detail"]
    # ... and the job reads it in its request (issue 29 item 2: `slurmgpu ckpt status`).
    assert rig.sent[1][2]["reason"].endswith(
        "(drain held by the circuit breaker; the job is requeued when an admin releases it)")
    assert rig.auto.status()["held"][0]["checkpoints"] == 1
    # More reports of the held node: no second request.
    rig.clock.advance(15)
    assert rig.report("gpu-002", XID79)[0].held
    assert len(rig.calls("signal")) == 2 and len(rig.sent) == 3
    # The job acks; the drain still waits for the operator.
    rig.clock.advance(5)
    assert rig.ack("gpu-003", "2") == []
    assert rig.calls("drain") == [] and rig.calls("requeue") == []
    assert [p["node"] for p in rig.cp.pending()] == ["gpu-001"]  # gpu-002's drain is held
    # Released: drained and requeued on the ack already given, not signalled again.
    rig.auto.release(by="alice")
    [d] = rig.auto.run_released(rig.clock.time())
    assert (d.node, d.action, d.result, d.released_by) == ("gpu-002", "drain-now", "checkpointing", "alice")
    [done] = rig.cp.tick(rig.clock.time())
    assert (done.node, done.result) == ("gpu-002", "drained")
    assert rig.calls("requeue") == [("requeue", "2")]
    assert len(rig.calls("signal")) == 2 and len(rig.sent) == 3
    assert rig.kinds("2") == ["detected", "signalled", "acked", "drain-released", "drained", "requeued"]
    assert "released by alice" in rig.store.job_events("2")[3]["detail"]
    assert rig.store.checkpoints(job_id="2")[0]["closed"] is not None


def test_held_drain_released_before_the_ack_waits_for_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0)  # every drain trips the breaker
    rig.client.add_job("5", ["gpu-004"])
    assert rig.report("gpu-004", XID79)[0].held
    rig.auto.release(by="alice")
    [d] = rig.auto.run_released(rig.clock.time())
    assert d.result == "checkpointing" and "released by alice" in d.reason
    assert rig.calls("drain") == [] and len(rig.calls("signal")) == 1
    [done] = rig.ack("gpu-004", "5")
    assert done.result == "drained" and rig.calls("requeue") == [("requeue", "5")]
    assert len(rig.calls("signal")) == 1


def test_held_drain_past_its_deadline_drains_at_once_when_released(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0)
    rig.client.add_job("6", ["gpu-005"])
    rig.report("gpu-005", XID79)
    rig.clock.advance(61)
    assert rig.cp.tick(rig.clock.time()) == []  # expired, but the drain is held
    assert rig.kinds("6") == ["detected", "signalled", "deadline"]
    rig.auto.release(by="alice")
    rig.auto.run_released(rig.clock.time())
    [done] = rig.cp.tick(rig.clock.time())
    assert done.result == "drained" and rig.calls("requeue") == [("requeue", "6")]
    assert len(rig.calls("signal")) == 1


def test_held_requests_survive_a_collector_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0)
    rig.client.add_job("7", ["gpu-006"])
    rig.report("gpu-006", XID79)
    rig.store.close()
    rig.open()
    assert rig.report("gpu-006", XID79)[0].held and len(rig.calls("signal")) == 1
    rig.auto.release(by="alice")
    rig.auto.run_released(rig.clock.time())
    [done] = rig.ack("gpu-006", "7")
    assert done.result == "drained" and len(rig.calls("signal")) == 1


def test_held_node_healthy_again_closes_its_requests(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0)
    rig.client.add_job("8", ["gpu-007"])
    rig.report("gpu-007", XID79)
    assert rig.cp.open_count() == 1
    rig.auto.on_report("gpu-007", Severity.OK, [], rig.clock.time())
    assert rig.auto.status()["held"] == [] and rig.cp.open_count() == 0
    assert rig.kinds("8")[-1] == "request-closed"
    assert rig.store.checkpoints(job_id="8")[0]["closed"] is not None


def test_released_node_whose_job_ended_drains_and_closes_the_request(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0)
    rig.client.add_job("9", ["gpu-008"])
    rig.report("gpu-008", XID79)
    rig.client.add_job("9", ["gpu-008"], state="COMPLETED")
    rig.auto.release(by="alice")
    [d] = rig.auto.run_released(rig.clock.time())
    assert d.result == "drained" and rig.calls("requeue") == []
    assert rig.kinds("9")[-1] == "request-closed" and rig.cp.open_count() == 0


def test_dry_run_held_drain_signals_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_per_hour=0, dry_run=True)
    rig.client.add_job("10", ["gpu-009"])
    [d] = rig.report("gpu-009", XID79)
    assert d.held and rig.client.calls == [] and rig.sent == []


def test_dry_run_signals_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, dry_run=True)
    rig.client.add_job("3", ["gpu-001"])
    [d] = rig.report("gpu-001", XID79)
    assert d.result == "dry-run" and rig.client.calls == [] and rig.sent == []


def test_job_that_ended_is_not_requeued(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("4", ["gpu-001"])
    rig.report("gpu-001", XID79)
    rig.client.add_job("4", ["gpu-001"], state="COMPLETED")
    rig.clock.advance(60)
    rig.cp.tick(rig.clock.time())
    assert rig.calls("requeue") == [] and rig.kinds("4")[-1] == "requeue-skipped"


def test_a_prolog_refusal_goes_to_the_jobs_timeline_and_on_the_job(tmp_path: Path) -> None:
    """Issue 29 item 1: `jobs events` said "no slurmgpu events" for a job the prolog refused."""
    rig = Rig(tmp_path)
    body = {"kind": "prolog_blocked", "job_id": "31", "verdict": "FAIL", "action": "drain",
            "problems": ["pin.driver: NVIDIA driver 535.104.05 is off-pin (pinned 550.90.07)"]}
    rig.cp.on_prolog_refusal("gpu-003", body)
    assert [(e["kind"], e["node"], e["detail"]) for e in rig.store.job_events("31")] == [
        ("prolog-refused", "gpu-003", "pin.driver: NVIDIA driver 535.104.05 is off-pin (pinned 550.90.07)")]
    assert rig.calls("admin_comment") == [("admin_comment", "31", "slurmgpu: refused by the prolog on gpu-003: "
                                                                 "pin.driver: NVIDIA driver 535.104.05 is off-pin "
                                                                 "(pinned 550.90.07)")]
    rig.cp.on_prolog_refusal("gpu-003", {"kind": "prolog_blocked", "job_id": None})  # a refusal of no job
    assert len(rig.calls("admin_comment")) == 1


def test_a_failing_job_comment_never_stops_the_requeue(tmp_path: Path) -> None:
    from slurmgpu.slurm import SlurmError

    rig = Rig(tmp_path)

    def refuse(job_id: str, comment: str) -> None:
        raise SlurmError("Access/permission denied")

    rig.client.set_admin_comment = refuse  # type: ignore[method-assign]
    rig.client.add_job("9", ["gpu-001"])
    rig.report("gpu-001", XID79)
    rig.clock.advance(60)
    rig.cp.tick(rig.clock.time())
    assert rig.calls("requeue") == [("requeue", "9")] and rig.kinds("9")[-1] == "requeued"
    # Tried again at later turns (a job Slurm is requeueing refuses updates for a moment).
    del rig.client.set_admin_comment
    rig.clock.advance(1)
    rig.cp.tick(rig.clock.time())
    assert rig.calls("admin_comment") == []
    rig.clock.advance(1)
    rig.cp.tick(rig.clock.time())
    assert [c[1] for c in rig.calls("admin_comment")] == ["9"]


def test_local_fallback_is_recorded(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.cp.on_local("gpu-001", {"kind": "local_checkpoint", "jobs": [
        {"job_id": "5", "pids": [10, 11], "signal": "USR1", "at": 100.0}, {"bad": 1}]})
    [e] = rig.store.job_events("5")
    assert (e["kind"], e["node"], e["ts"]) == ("signalled-locally", "gpu-001", 100.0)
    assert "2 local process" in e["detail"]


def test_healthy_reports_do_not_resume_a_node_waiting_for_checkpoints(tmp_path: Path) -> None:
    rig = Rig(tmp_path, resume_healthy_reports=1, resume_after_s=0)
    rig.client.add_job("6", ["gpu-001"])
    rig.report("gpu-001", XID79)
    for _ in range(3):
        rig.clock.advance(30)
        assert rig.auto.on_report("gpu-001", Severity.OK, [], rig.clock.time()) == []
    assert rig.auto.status()["checkpointing"] == ["gpu-001"]


# ---- the CLI views: `slurmgpu jobs events` and the pending checkpoints in `slurmgpu fleet`


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "slurmgpu.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[collector]\ndb = "{tmp_path / "fleet.db"}"\n')
    return path


def test_jobs_events_cli(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from slurmgpu.cli import jobs_cmd

    rig = Rig(tmp_path)
    rig.client.add_job("101", ["gpu-001"])
    rig.report("gpu-001", XID79)
    rig.clock.advance(2.5)
    rig.ack("gpu-001", "101")
    config = str(_config(tmp_path))
    result = CliRunner().invoke(jobs_cmd.jobs, ["events", "101", "--config", config])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[3] for line in lines[:5]] == ["detected", "signalled", "acked", "drained", "requeued"]
    assert "   +2.50s  acked" in lines[2] and "acked by gpu-001 after 2.5 s" in lines[-1]
    doc = json.loads(CliRunner().invoke(jobs_cmd.jobs, ["events", "101", "--json", "--config", config]).output)
    assert doc["checkpoints"][0]["state"] == "acked" and len(doc["events"]) == 5
    missing = CliRunner().invoke(jobs_cmd.jobs, ["events", "999", "--config", config])
    assert missing.exit_code == 1


def test_fleet_shows_pending_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner

    from slurmgpu.cli import fleet_cmd

    rig = Rig(tmp_path)
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: rig.client)
    rig.client.add_job("31", ["gpu-002"])
    rig.report("gpu-002", XID79)
    config = str(_config(tmp_path))
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", config])
    assert result.exit_code == 0, result.output
    assert "checkpointing: gpu-002 drain-now waits for job(s) 31 (open" in result.output
    doc = json.loads(CliRunner().invoke(fleet_cmd.fleet, ["--config", config, "--json"]).output)
    assert doc["pending_checkpoints"][0]["jobs"][0]["job_id"] == "31"
    assert doc["automation"]["breaker_open"] is False and doc["automation"]["checkpointing"] == ["gpu-002"]


def test_checkpoint_escalates_to_drain_now(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("8", ["gpu-001"])
    assert rig.report("gpu-001", REMAP, "WARN")[0].result == "checkpointing"
    [d] = rig.report("gpu-001", XID79)
    assert (d.action, d.result) == ("drain-now", "escalated")
    assert len(rig.calls("signal")) == 1  # the job was already told
    rig.ack("gpu-001", "8")
    assert [c[0] for c in rig.client.calls] == ["signal", "drain", "admin_comment", "requeue"]
    assert "escalated" in rig.kinds("8")
    assert rig.report("gpu-001", XID79) == []


def test_jobs_events_without_a_database_is_one_line_exit_3(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "jobs", "events", "1", "--db",
                           str(tmp_path / "missing.db")], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"slurmgpu: error: no fleet database at {tmp_path / 'missing.db'} (from --db); is the collector "
        "running, and is this its database? (set --db, $SLURMGPU_DB or [collector] db)"]
    assert not (tmp_path / "missing.db").exists()


XID79_REBOOT = [dict(XID79[0], data={"xid": 79, "action": "reboot"})]  # NVIDIA: RESTART_BM


def test_xid79_reboots_after_the_checkpoint_when_allowed(tmp_path: Path) -> None:
    """79 is drain-now (the jobs checkpoint and are requeued) and, with reboot_allowed,
    the node is then rebooted rather than only drained: only a reboot clears it."""
    rig = Rig(tmp_path, reboot_allowed=True)
    rig.client.add_job("9", ["gpu-006"])
    [d] = rig.report("gpu-006", XID79_REBOOT)
    assert (d.action, d.result) == ("drain-now", "checkpointing")
    [done] = rig.ack("gpu-006", "9")
    assert done.result == "reboot-requested"
    assert [c[0] for c in rig.client.calls] == ["signal", "reboot", "admin_comment", "requeue"]
    entry = rig.auto.state.drained["gpu-006"]
    assert (entry.trigger, entry.stage, entry.pending, entry.then_reboot) == ("xid.recent", "drained", None, False)


def test_xid79_on_an_idle_node_reboots_at_once_when_allowed(tmp_path: Path) -> None:
    rig = Rig(tmp_path, reboot_allowed=True)
    [d] = rig.report("gpu-007", XID79_REBOOT)
    assert d.result == "reboot-requested" and [c[0] for c in rig.client.calls] == ["reboot"]


def test_xid79_only_drains_without_reboot_allowed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("10", ["gpu-008"])
    rig.report("gpu-008", XID79_REBOOT)
    rig.ack("gpu-008", "10")
    assert [c[0] for c in rig.client.calls] == ["signal", "drain", "admin_comment", "requeue"]


def test_without_automation_a_prolog_refusal_still_reaches_jobs_events(tmp_path: Path) -> None:
    """The collector stores the agent's prolog_blocked event; with no automation (no Slurm
    writes) the refusal still goes to the job's timeline."""
    from slurmgpu.collector.counters import Counters
    from slurmgpu.collector.fleet import Fleet
    from slurmgpu.config.schema import CollectorSettings
    from slurmgpu.wire import EVENT, Envelope

    store = Store(tmp_path / "fleet.db")
    fleet = Fleet(CollectorSettings(), store, Counters(), allowed={})
    body = {"kind": "prolog_blocked", "gpu": None, "data": None, "verdict": "FAIL", "findings": [],
            "job_id": "12", "problems": ["mem.row_remap: row remapping failed"], "action": "drain"}
    batch = [("gpu-002", Envelope(type=EVENT, node="gpu-002", seq=1, body=body), b"")]
    stored = fleet.commit(batch, 100.0)
    assert stored is not None
    fleet.acked(batch, stored.new, 100.0)
    assert [(e["kind"], e["node"]) for e in store.job_events("12")] == [("prolog-refused", "gpu-002")]
    store.close()


def test_a_delivery_handled_again_by_a_new_leader_is_recorded_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.client.add_job("105", ["gpu-001"], user="alice")
    rig.report("gpu-001", XID79)
    delivered = {"command_id": "x", "ok": True, "result": {"job_id": "105", "state": "delivered", "file": "/f"}}
    rig.cp.on_result("gpu-001", delivered, rig.clock.time())
    rig.open()  # a new leader handles the same inbox row again
    rig.clock.advance(1)
    rig.cp.on_result("gpu-001", delivered, rig.clock.time())
    assert rig.kinds("105") == ["detected", "signalled", "delivered"]
