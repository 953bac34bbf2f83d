"""The collector's automation with ``[remediation]`` on (``collector.remediate``), over the
fake Slurm client and a real SQLite store: a drained node returns only through its
ladder, an operator resume ends it (outcome ``unknown``), dry run records and does
nothing, a follower makes none of its calls, `slurmgpu fleet` shows where it is. The real
Slurm calls: tests/test_remediation_e2e.py."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmgpu import wire
from slurmgpu.cli import fleet_cmd
from slurmgpu.collector.app import attach
from slurmgpu.collector.coordination import FencedSlurm, NotLeader
from slurmgpu.collector.policy import Automation
from slurmgpu.collector.remediate import EVENT_WAIT_S, Remediation
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.automation import Breaker, DrainedNode
from slurmgpu.collector.store.automation import Stage as AutoStage
from slurmgpu.collector.store.remediation import drain_outcomes, load_ladders
from slurmgpu.config.schema import AutomationSettings, RemediationSettings
from slurmgpu.decision import Action
from slurmgpu.result import Finding, Severity
from slurmgpu.slurm import SlurmError
from slurmgpu.testing import FakeSlurmClient
from slurmgpu.validate.report import validation_event

NODE = "gpu-a"
ECC = Finding("ecc.uncorrected", Severity.FAIL, "3 volatile uncorrected ECC errors", gpu=0)
SETTINGS = RemediationSettings(enabled=True, validate_backoff_s=0)


def wired(tmp_path: Path, *, dry_run: bool = False) -> tuple[Automation, Remediation, FakeSlurmClient]:
    client = FakeSlurmClient([NODE, "gpu-b"])
    auto = Automation(AutomationSettings(resume_healthy_reports=1, resume_after_s=0, max_fraction=1.0,
                                         dry_run=dry_run), client, tmp_path / "state",
                      store=Store(tmp_path / "fleet.db"))
    return auto, attach(auto, SETTINGS, tmp_path / "state", poll_s=0, node_poll_s=0), client


def drained_then_healthy(auto: Automation, rem: Remediation, now: float = 100.0) -> None:
    auto.on_report(NODE, Severity.FAIL, [ECC], now)
    rem.take_over(now + 1)
    auto.on_report(NODE, Severity.OK, [], now + 2)


def finish(client: FakeSlurmClient, job_id: str, exit_code: int) -> None:
    state = "COMPLETED" if exit_code == 0 else "FAILED"
    client.jobs[job_id] = dataclasses.replace(client.jobs[job_id], state=state, exit_code=exit_code)


def test_a_drained_node_returns_only_through_a_passing_validation(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    names = [c[0] for c in client.calls]
    assert names == ["drain", "create_reservation", "resume", "submit_validation"]  # no plain resume
    assert NODE in auto.state.drained and rem.owns(NODE)
    [job] = client.jobs
    rem.tick(110.0)
    assert rem.owns(NODE)  # still running: nothing released
    finish(client, job, 0)
    rem.tick(120.0)
    assert client.calls[-1] == ("delete_reservation", f"slurmgpu-rts-{NODE}")
    assert not rem.owns(NODE) and NODE not in auto.state.drained
    assert [o.outcome for o in drain_outcomes(auto.store.db)] == ["cleared_by_validation"]
    assert load_ladders(auto.store.db) == {}


def test_a_failed_validation_drains_again_with_its_findings_and_climbs(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    [job] = client.jobs
    finish(client, job, 2)
    rem.tick(120.0)
    drains = [c for c in client.calls if c[0] == "drain"]
    assert drains[-1][2].startswith("slurmgpu: validation failed: validate.job")
    assert rem.ladders[NODE].stage == "reset"
    assert ("cancel_job", job) in client.calls and ("delete_reservation", f"slurmgpu-rts-{NODE}") in client.calls
    assert [o.outcome for o in drain_outcomes(auto.store.db)] == ["confirmed"]


def sent_validation(store: Store, findings: list[Finding], ts: float, seq: int, verdict: str = "FAIL") -> None:
    """A `validate --send` of ``NODE``, as the collector stores the agent's event."""
    body = validation_event({"verdict": verdict, "findings": wire.encode_findings(findings)})
    store.store_batch([(NODE, wire.Envelope(type=wire.EVENT, node=NODE, seq=seq, body=body, ts=ts))])


GEMM3 = Finding("validate.gemm", Severity.FAIL, "gpu3: checksum differs", gpu=3)


def test_without_a_shared_file_system_a_failed_validation_has_its_findings_from_its_event(tmp_path: Path) -> None:
    """The head cannot read the job's output: the findings the job sent through its
    node's agent name the drain and pick the GPUs to reset; an older validation's do not."""
    auto, rem, client = wired(tmp_path)
    sent_validation(auto.store, [Finding("validate.hbm", Severity.FAIL, "gpu1: slow", gpu=1)], 50.0, 1)  # before
    drained_then_healthy(auto, rem)
    [job] = client.jobs
    assert "validate --tier quick --json --send" in client.calls[-1][3]
    sent_validation(auto.store, [GEMM3, Finding("validate.pcie", Severity.OK, "gpu3: 55 GB/s", gpu=3)], 110.0, 2)
    finish(client, job, 2)
    rem.tick(120.0)
    drains = [c for c in client.calls if c[0] == "drain"]
    assert drains[-1][2] == "slurmgpu: validation failed: validate.gemm GPU 3 gpu3: checksum differs"
    assert rem.ladders[NODE].validations[0].findings == [GEMM3.to_json()]
    assert client.calls[-1][:2] == ("submit_validation", NODE)  # the reset: the drain's GPU and the event's
    assert client.calls[-1][3] == "sh -c slurmgpu remediate reset --gpu 0 && slurmgpu remediate reset --gpu 3"


def validation_ended(tmp_path: Path, exit_code: int, end_time: float) -> tuple[Remediation, FakeSlurmClient, str]:
    """A ladder's validation job ended with ``exit_code`` at ``end_time``, no findings
    anywhere (no output the head reads, no event); the ladder looked at 120."""
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    [job] = client.jobs
    finish(client, job, exit_code)
    client.jobs[job] = dataclasses.replace(client.jobs[job], end_time=end_time)
    rem.tick(120.0)
    return rem, client, job


def test_a_failed_validation_waits_a_moment_for_its_event_then_names_its_exit_code(tmp_path: Path) -> None:
    rem, client, _ = validation_ended(tmp_path, 2, 115.0)
    assert rem.ladders[NODE].stage == "awaiting_validation" and client.calls[-1][0] == "submit_validation"
    rem.tick(115.0 + EVENT_WAIT_S)
    drains = [c for c in client.calls if c[0] == "drain"]
    assert drains[-1][2] == "slurmgpu: validation failed: validate.job validation job exit 2"


def test_a_validation_that_could_not_judge_the_node_does_not_wait_for_findings(tmp_path: Path) -> None:
    """Exit 3 (UNKNOWN: slurmgpu's own trouble) is retried at once, findings or none."""
    rem, client, job = validation_ended(tmp_path, 3, 119.0)
    assert rem.ladders[NODE].validations[0].verdict == "cancelled"
    notes = [h.note for h in rem.ladders[NODE].history]
    assert f"validation failed: job {job} ended FAILED (exit 3); retry" in notes
    assert len(client.jobs) == 2  # submitted again (validate_backoff_s 0)


def test_a_warn_verdict_passes_only_where_its_findings_say_warn(tmp_path: Path) -> None:
    """Exit 1 is WARN (a pass), and Slurm calls the job FAILED; a Python that could not
    start slurmgpu exits 1 too: without findings that say WARN it is slurmgpu's trouble
    (retried, then held), never a node put back in service."""
    rem, client, job = validation_ended(tmp_path, 1, 115.0)
    assert rem.ladders[NODE].stage == "awaiting_validation" and client.calls[-1][0] == "submit_validation"
    rem.tick(115.0 + EVENT_WAIT_S)
    assert f"validation failed: job {job} ended FAILED (exit 1); retry" in [h.note for h in rem.ladders[NODE].history]
    assert ("delete_reservation", f"slurmgpu-rts-{NODE}") in client.calls and client.calls[-1][0] == "submit_validation"
    assert not [c for c in client.calls if c[0] == "release"] and rem.ladders[NODE].stage == "awaiting_validation"
    warn = Finding("validate.pcie", Severity.WARN, "gpu0: 36 GB/s, 10 % under the fleet", gpu=0)
    sent_validation(rem.store, [warn], 200.0, 1, verdict="WARN")
    again = list(client.jobs)[-1]
    finish(client, again, 1)
    rem.tick(210.0)
    assert not rem.owns(NODE) and client.calls[-1] == ("delete_reservation", f"slurmgpu-rts-{NODE}")


def test_an_operator_resume_ends_the_ladder_as_unknown(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    auto.on_report(NODE, Severity.FAIL, [ECC], 100.0)
    client.resume(NODE)  # an operator, without a validation
    rem.tick(110.0)
    assert not rem.owns(NODE) and NODE not in auto.state.drained
    assert [o.outcome for o in drain_outcomes(auto.store.db)] == ["unknown"]


def test_dry_run_records_the_ladder_and_makes_no_call(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path, dry_run=True)
    drained_then_healthy(auto, rem)
    rem.tick(110.0)
    assert client.calls == []
    history = rem.ladders[NODE].history
    assert [h.event for h in history] == ["start", "restart", "passive_healthy"]
    assert history[-1].dry_run and [s["step"] for s in history[-1].steps] == [
        "create_reservation", "resume_into_reservation", "submit_validation"]


def test_a_new_leader_cleans_up_what_no_open_ladder_owns(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    client.create_reservation("gpu-b", duration_min=5, users=["root"])  # a leftover of a closed ladder
    rem.take_over(130.0)
    assert [r.name for r in client.reservations()] == [f"slurmgpu-rts-{NODE}"]
    assert [h.event for h in rem.ladders[NODE].history][-2:] == ["restart", "validation_submitted"]


def test_a_follower_makes_no_return_to_service_call() -> None:
    class Follower:
        def still_leading(self) -> bool:
            return False

    fenced: Any = FencedSlurm(FakeSlurmClient([NODE]), Follower())  # type: ignore[arg-type]
    for call in (lambda: fenced.create_reservation(NODE, duration_min=5, users=["root"]),
                 lambda: fenced.submit_validation(NODE, ["true"], reservation="r", time_limit_min=5),
                 lambda: fenced.reboot_and_hold(NODE, "x"), lambda: fenced.cancel_job("1"),
                 lambda: fenced.delete_reservation("r")):
        with pytest.raises(NotLeader):
            call()


def test_fleet_shows_where_the_node_is_in_its_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto, rem, _ = wired(tmp_path)
    drained_then_healthy(auto, rem, time.time())
    auto.store.close()
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[collector]\ndb = "{tmp_path / "fleet.db"}"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    monkeypatch.setattr("slurmgpu.slurm.factory.make_client", lambda *a, **k: FakeSlurmClient([NODE]))
    result = CliRunner().invoke(fleet_cmd.fleet, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    assert f"{NODE}: return to service: awaiting_validation: result of job 1000, timeout in 30 min" in result.output


def test_a_reset_runs_as_a_job_in_the_reservation_and_a_reboot_counts_towards_a_lemon(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    auto.settings.lemon_drains = 2
    drained_then_healthy(auto, rem)
    finish(client, "1000", 2)  # the validation fails: reset
    rem.tick(110.0)
    reset = client.calls[-1]
    assert reset[:3] == ("submit_validation", NODE, f"slurmgpu-rts-{NODE}") and "remediate reset --gpu 0" in reset[3]
    finish(client, "1001", 0)  # the reset job: validate again
    rem.tick(120.0)
    assert [c[0] for c in client.calls[-5:]] == ["drain", "delete_reservation", "create_reservation", "resume",
                                               "submit_validation"]  # drained before the reservation goes
    finish(client, "1002", 2)  # fails again: reboot
    rem.tick(130.0)
    # drained and its validation cleaned up, then the reservation the reboot keeps
    assert [c[0] for c in client.calls[-5:]] == ["drain", "cancel_job", "delete_reservation", "create_reservation",
                                               "reboot_and_hold"]
    assert rem.ladders[NODE].stage == "reboot"
    assert len(auto.state.history[NODE]) == 2 and NODE in auto.state.lemons  # the drain and the reboot


def test_a_reset_job_has_its_output_directory_when_it_is_the_first_job_this_head_submits(tmp_path: Path) -> None:
    """A new leader, whose state dir never held a validation, taking a ladder over at its
    reset: Slurm 22.05 fails a job whose output directory is missing (JobLaunchFailure)."""
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    finish(client, "1000", 2)  # the validation fails: reset
    shutil.rmtree(tmp_path / "state" / "validations")
    rem.tick(110.0)
    assert client.calls[-1][0] == "submit_validation" and (tmp_path / "state" / "validations").is_dir()


def test_an_operator_drain_that_opted_in_is_validated_before_resume(tmp_path: Path) -> None:
    auto, rem, client = wired(tmp_path)
    client.drain(NODE, "disk swap [validate]")
    client.drain("gpu-b", "disk swap")  # no tag: never the automation's
    auto.operator_drains(client.nodes(), 100.0)
    assert rem.owns(NODE) and not rem.owns("gpu-b")
    for node in (NODE, "gpu-b"):
        auto.on_report(node, Severity.OK, [], 101.0)
    assert [c[:2] for c in client.calls[2:]] == [("create_reservation", NODE), ("resume", NODE),
                                                 ("submit_validation", NODE)]


def failed_while_the_breaker_is_open(tmp_path: Path) -> tuple[Automation, Remediation, FakeSlurmClient]:
    """A storm opened the breaker, then the node's validation failed (its reset is due)."""
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    auto.state.breaker = Breaker(open=True, since=105.0, why="storm")
    auto._record.save()
    finish(client, "1000", 2)
    rem.tick(110.0)
    return auto, rem, client


def test_the_automations_open_breaker_holds_the_ladders_remedies(tmp_path: Path) -> None:
    """A storm opened the breaker: a failed validation drains the node again, and its reset
    waits (no job, no reboot, no repair) until an operator closes the breaker."""
    auto, rem, client = failed_while_the_breaker_is_open(tmp_path)
    assert [c[0] for c in client.calls[-3:]] == ["drain", "cancel_job", "delete_reservation"]
    assert rem.ladders[NODE].stage == "reset" and list(client.jobs) == ["1000"]
    rem.tick(500.0)
    assert list(client.jobs) == ["1000"]  # still held back
    auto.release("operator", 600.0)
    rem.tick(600.0)
    assert list(client.jobs) == ["1000", "1001"] and "remediate reset" in client.calls[-1][3]


REBOOT = Finding("gpu.recovery_action", Severity.FAIL, "the driver asks for a node reboot", gpu=0,
                 data={"action": "reboot"})


def test_a_reboot_decision_is_the_ladders_one_reboot_held_down_until_validated(tmp_path: Path) -> None:
    """Before, the automation rebooted with nextstate=RESUME (back in service unvalidated)
    and the ladder rebooted again: now the automation drains and the ladder reboots once."""
    auto, rem, client = wired(tmp_path)
    auto.settings.reboot_allowed = True
    [decision] = auto.on_report(NODE, Severity.FAIL, [REBOOT], 100.0)
    assert (decision.action, decision.result) == ("reboot", "drained")
    assert [c[0] for c in client.calls] == ["drain", "create_reservation", "reboot_and_hold"]
    assert rem.ladders[NODE].stage == "reboot"


def test_no_reboot_when_slurm_refuses_the_reservation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its reservation a rebooted node could come back to anyone's jobs (25.11,
    ReturnToService=2): slurmgpu holds it drained instead, and climbs nothing."""
    auto, rem, client = wired(tmp_path)
    auto.settings.reboot_allowed = True

    def refused(node: str, **_: Any) -> None:
        client.calls.append(("create_reservation", node))
        raise SlurmError("cannot create reservation slurmgpu-rts-gpu-a: Requested nodes are busy")

    monkeypatch.setattr(client, "create_reservation", refused)
    auto.on_report(NODE, Severity.FAIL, [REBOOT], 100.0)
    assert [c[0] for c in client.calls] == ["drain", "create_reservation", "drain", "delete_reservation"]
    ladder = rem.ladders[NODE]
    assert ladder.stage == "held" and ladder.attempts == {} and "reboot" not in ladder.remedies
    assert client.states[NODE].drained and not client.states[NODE].rebooting
    assert ladder.history[-1].note.startswith("create_reservation failed: cannot create reservation")


def test_a_drain_now_that_waited_for_checkpoints_opens_its_ladder_at_the_drain(tmp_path: Path) -> None:
    """A drain-now for a fault only a reboot clears, once the jobs checkpointed: the ladder
    starts there (and reboots once), not when the node would have been resumed."""
    auto, rem, client = wired(tmp_path)
    auto.settings.reboot_allowed = True
    auto.state.drained[NODE] = DrainedNode(100.0, "xid.recent", "XID 79", AutoStage.CHECKPOINTING,
                                           Action.DRAIN_NOW, then_reboot=True)
    decision = auto.finish_pending(NODE, Action.DRAIN_NOW, "slurmgpu: XID 79", "xid.recent", 160.0)
    assert decision.result == "drained" and rem.owns(NODE)
    assert [c[0] for c in client.calls] == ["drain", "create_reservation", "reboot_and_hold"]
    assert rem.ladders[NODE].checks == ["xid.recent"]


def stored_report(auto: Automation, findings: list[Finding], seq: int = 1) -> None:
    """The node's latest report in the collector's store, as ingest keeps it."""
    body = {"verdict": "FAIL", "findings": wire.encode_findings(findings), "ok_checks": []}
    auto.store.store_batch([(NODE, wire.Envelope(type=wire.REPORT, node=NODE, seq=seq, body=body, ts=100.0))])


XID48 = Finding("xid.recent", Severity.FAIL, "XID 48 (DBE) on GPU 3", gpu=3, data={"xid": 48, "action": "reset"})


def test_a_drain_now_that_waited_for_checkpoints_starts_where_its_finding_asks(tmp_path: Path) -> None:
    """A DBE (XID 48: a GPU reset clears it) on a busy node: the jobs checkpoint, then the
    ladder starts with the reset of GPU 3, as an immediate drain's would, not with a
    validation of a GPU known to need the reset."""
    auto, rem, client = wired(tmp_path)
    stored_report(auto, [ECC, XID48])
    auto.state.drained[NODE] = DrainedNode(100.0, "xid.recent", "XID 48", AutoStage.CHECKPOINTING,
                                           Action.DRAIN_NOW)
    auto.finish_pending(NODE, Action.DRAIN_NOW, "slurmgpu: XID 48 (DBE) on GPU 3", "xid.recent", 160.0)
    ladder = rem.ladders[NODE]
    assert (ladder.action, ladder.stage, ladder.checks) == ("reset", "reset", ["xid.recent"])
    reset = client.calls[-1]
    assert reset[:3] == ("submit_validation", NODE, f"slurmgpu-rts-{NODE}") and "remediate reset --gpu 3" in reset[3]
    assert "--gpu 0" not in reset[3]


@pytest.mark.parametrize("latest", [None, [ECC], "unreadable"])
def test_a_pending_drain_without_its_finding_stored_validates_first(tmp_path: Path, latest: Any) -> None:
    """No report, the trigger healed since, or a body that does not decode: the ladder
    starts from the drain's check and reason (validate first), and the drain stands."""
    auto, rem, client = wired(tmp_path)
    if latest == "unreadable":
        body = {"verdict": "FAIL", "findings": [{"check": 7}], "ok_checks": []}
        auto.store.store_batch([(NODE, wire.Envelope(type=wire.REPORT, node=NODE, seq=1, body=body, ts=100.0))])
    elif latest is not None:
        stored_report(auto, latest)
    auto.state.drained[NODE] = DrainedNode(100.0, "xid.recent", "XID 48", AutoStage.CHECKPOINTING,
                                           Action.DRAIN_NOW)
    decision = auto.finish_pending(NODE, Action.DRAIN_NOW, "slurmgpu: XID 48", "xid.recent", 160.0)
    assert decision.result == "drained" and [c[0] for c in client.calls] == ["drain"]
    ladder = rem.ladders[NODE]
    assert (ladder.action, ladder.stage) == ("drain", "drained")
    assert ladder.findings == [Finding("xid.recent", Severity.FAIL, "slurmgpu: XID 48").to_json()]


def test_an_operator_resume_while_a_remedy_waits_ends_the_ladder(tmp_path: Path) -> None:
    """A remedy waiting (for the breaker, or its backoff) on a node an operator put back in
    service must never be carried out later: no reset or reboot of a node in service."""
    auto, rem, client = failed_while_the_breaker_is_open(tmp_path)
    assert rem.ladders[NODE].stage == "reset"
    client.resume(NODE)  # the operator
    rem.tick(120.0)
    assert not rem.owns(NODE)
    auto.release("operator", 600.0)
    rem.tick(600.0)
    assert list(client.jobs) == ["1000"] and [o.outcome for o in drain_outcomes(auto.store.db)] == ["confirmed"]


def test_the_ladders_waiting_on_their_nodes_share_one_query_of_slurm(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A storm's worth of drained nodes must not become a `scontrol show node` per ladder
    per second: every node poll asks Slurm once for all of them."""
    auto, rem, client = wired(tmp_path)
    auto.on_report(NODE, Severity.FAIL, [ECC], 100.0)
    auto.on_report("gpu-b", Severity.FAIL, [Finding("pcie.link", Severity.FAIL, "x4, expected x16", gpu=1)], 100.0)
    asked: list[str] = []
    monkeypatch.setattr(client, "node", lambda name: asked.append(name))
    real_nodes = client.nodes
    monkeypatch.setattr(client, "nodes", lambda: asked.append("*") or real_nodes())
    rem.tick(110.0)
    assert asked == ["*"] and {rem.ladders[n].stage for n in (NODE, "gpu-b")} == {"drained"}


@pytest.mark.parametrize(("state", "flags", "reason", "back"), [
    ("down", set(), "slurmgpu: reboot (remediation): x : reboot issued : reboot complete", True),  # nextstate=DOWN
    ("idle", set(), None, True),  # ReturnToService=2 returned it on registration (its reason then hidden)
    ("down", {"NOT_RESPONDING"}, "slurmgpu: reboot (remediation): x : reboot issued", False),  # still booting
    ("idle", {"DRAIN", "REBOOT_ISSUED"}, "slurmgpu: reboot (remediation): x", False),
])
def test_a_rebooted_node_is_seen_back_whatever_returntoservice_does(
        tmp_path: Path, state: str, flags: set[str], reason: str | None, back: bool) -> None:
    """Seen on Slurm 25.11 with ReturnToService=2: the node came back DOWN "reboot complete"
    and was IDLE within the second, its reason then hidden: a ladder looking every few
    seconds missed it, and its reboot timed out into a repair (a false RMA)."""
    auto, rem, client = wired(tmp_path)
    drained_then_healthy(auto, rem)
    finish(client, "1000", 2)
    rem.tick(110.0)
    finish(client, "1001", 0)
    rem.tick(120.0)
    finish(client, "1002", 2)
    rem.tick(130.0)
    assert rem.ladders[NODE].stage == "reboot"
    res = f"slurmgpu-rts-{NODE}"
    assert list(client.reserved) == [res]  # before the boot: an IDLE node (RTS=2) is nobody else's
    client.states[NODE] = dataclasses.replace(client.states[NODE], state=state, flags=frozenset(flags), reason=reason)
    calls = len(client.calls)
    rem.tick(140.0)
    assert (rem.ladders[NODE].stage == "awaiting_validation") is back
    if back:  # validated in the reservation the reboot kept (not deleted and made again)
        assert [c[:3] for c in client.calls[calls:]] == [("resume", NODE), ("submit_validation", NODE, res)]
