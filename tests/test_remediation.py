"""The remediation ladder (slurmgpu.remediation.ladder): every transition, as pure logic
over typed events, with time passed in."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import slurmgpu.remediation.steps as st
from slurmgpu.config.schema import RemediationSettings
from slurmgpu.remediation.ladder import (
    Decision,
    Ladder,
    Outcome,
    Stage,
    advance,
    entry_action,
    from_json,
    reservation_name,
    start,
)
from slurmgpu.remediation.status import ladder_status
from slurmgpu.result import Finding, Severity

NODE = "gpu-n1"
RES = reservation_name(NODE)
XID = Finding("xid.recent", Severity.FAIL, "XID 48 (DBE) -> reset", gpu=3, data={"xid": 48, "action": "reset"})
ECC = Finding("ecc.volatile", Severity.FAIL, "uncorrected volatile ECC 2", gpu=1)
BAD = Finding("validate.gemm", Severity.FAIL, "GPU 1 at 40% of the floor", gpu=1)
SETTINGS = RemediationSettings(enabled=True, validate_backoff_s=100, reset_backoff_s=50,
                               reboot_backoff_s=200, validation_timeout_s=1000)


def kinds(decision: Decision) -> list[str]:
    return [s.kind for s in decision.steps]


def drive(ladder: Ladder, *events: tuple[float, st.Event], settings: RemediationSettings = SETTINGS,
          dry_run: bool = False, breaker_open: bool = False) -> list[Decision]:
    """Feed events in order; every decision, the ladder going round-trip through JSON
    between two of them (as a leader would store it)."""
    out = []
    for now, event in events:
        ladder = from_json(json.loads(json.dumps(ladder.to_json())))
        decision = advance(ladder, event, now, settings, dry_run=dry_run, breaker_open=breaker_open)
        out.append(decision)
        ladder = decision.ladder
    return out


def validated_once(settings: RemediationSettings = SETTINGS) -> tuple[Ladder, list[Decision]]:
    first = start(NODE, [ECC], 0.0, settings)
    decisions = drive(first.ladder, (10, st.PassiveHealthy()), (11, st.ValidationSubmitted("77")), settings=settings)
    return decisions[-1].ladder, [first, *decisions]


# --------------------------------------------------------------------------- entry


def test_a_drain_waits_for_the_passive_checks_and_takes_no_step() -> None:
    decision = start(NODE, [ECC], 0.0, SETTINGS)
    assert decision.ladder.stage is Stage.DRAINED and decision.steps == ()
    assert decision.ladder.action == "drain" and decision.ladder.checks == ["ecc.volatile"]


@pytest.mark.parametrize(("findings", "action", "entry"), [
    ([ECC], None, "drain"), ([XID], None, "reset"), ([ECC], "reboot", "reboot"),
    ([XID, Finding("gpu.recovery_action", Severity.FAIL, "reboot", data={"action": "reboot"})], None, "reboot"),
    ([Finding("xid.recent", Severity.WARN, "warn", data={"action": "reset"})], None, "drain"),
])
def test_the_entry_follows_the_findings_action(findings: list[Finding], action: str | None, entry: str) -> None:
    assert entry_action(findings, action) == entry


def test_a_reset_action_starts_with_a_reset_of_the_failing_gpus() -> None:
    decision = start(NODE, [XID, ECC], 0.0, SETTINGS)
    assert decision.ladder.stage is Stage.RESETTING
    assert decision.steps == (st.ResetGpus(NODE, (1, 3)),)


def test_a_reboot_action_starts_with_a_reboot() -> None:
    decision = start(NODE, [ECC], 0.0, SETTINGS, action="reboot")
    assert decision.ladder.stage is Stage.REBOOTING and kinds(decision) == ["create_reservation", "reboot"]
    # The reservation first, for the reboot and the validation after it (ReturnToService=2).
    window = SETTINGS.reboot_timeout_s + SETTINGS.reservation_s
    assert decision.steps == (st.CreateReservation(NODE, RES, window),
                              st.Reboot(NODE, "slurmgpu: reboot (remediation): ecc.volatile"))
    assert decision.ladder.reservation == RES


def test_an_entry_remedy_with_no_attempts_validates_first() -> None:
    decision = start(NODE, [XID], 0.0, replace(SETTINGS, reset_attempts=0))
    assert decision.ladder.stage is Stage.DRAINED and decision.steps == ()


# --------------------------------------------------------------------------- transient


def test_transient_passes_validation_in_the_reservation_and_is_released() -> None:
    ladder, decisions = validated_once()
    assert decisions[1].steps == (st.CreateReservation(NODE, RES, SETTINGS.reservation_s),
                                  st.ResumeIntoReservation(NODE, RES),
                                  st.SubmitValidation(NODE, RES, "quick", 1000.0))
    assert ladder.stage is Stage.VALIDATING and ladder.job_id == "77"
    (passed,) = drive(ladder, (500, st.ValidationPassed("77")))
    assert passed.steps == (st.Release(NODE, RES),)
    assert passed.ladder.stage is Stage.VALIDATED and passed.ladder.closed
    assert passed.ladder.outcome is Outcome.CLEARED_BY_VALIDATION
    assert passed.ladder.returned_by == "validation" and passed.ladder.closed_at == 500
    assert [(r.verdict, r.job_id, r.started, r.finished) for r in passed.ladder.validations] == [
        ("pass", "77", 10, 500)]


def test_a_pass_after_a_reset_is_transient() -> None:
    first = start(NODE, [XID], 0.0, SETTINGS)
    *_, passed = drive(first.ladder, (5, st.ResetDone()), (6, st.ValidationSubmitted("8")), (9, st.ValidationPassed("8")))
    assert passed.ladder.outcome is Outcome.TRANSIENT and passed.ladder.returned_by == "reset"


def test_a_result_of_another_job_is_ignored() -> None:
    ladder, _ = validated_once()
    (stale,) = drive(ladder, (20, st.ValidationPassed("76")))
    assert stale.steps == () and stale.ladder.stage is Stage.VALIDATING
    assert stale.ladder.history[-1].note == "ignored: not the current validation"


def test_the_passive_checks_mean_nothing_outside_the_drained_stage() -> None:
    ladder, _ = validated_once()
    (again,) = drive(ladder, (20, st.PassiveHealthy()))
    assert again.steps == () and again.ladder.validations == ladder.validations


# --------------------------------------------------------------------------- persistent


def test_the_reset_takes_the_gpus_the_validation_failed_too() -> None:
    ladder, _ = validated_once()  # drained for GPU 1
    other = Finding("validate.gemm", Severity.FAIL, "GPU 3 wrong product", gpu=3)
    [d] = drive(ladder, (100, st.ValidationFailed("77", (other,))))
    assert d.steps[-1] == st.ResetGpus(NODE, (1, 3))


def test_persistent_climbs_reset_reboot_and_repair_exactly_once() -> None:
    ladder, _ = validated_once()
    d = drive(ladder, (100, st.ValidationFailed("77", (BAD,))))
    assert kinds(d[0]) == ["drain", "cleanup", "reset_gpus"]
    assert d[0].steps[0] == st.Drain(NODE, "slurmgpu: validation failed: validate.gemm GPU 1 GPU 1 at 40% of the floor")
    assert d[0].steps[1] == st.Cleanup(NODE, RES, "77") and d[0].steps[2] == st.ResetGpus(NODE, (1,))
    assert d[0].ladder.outcome is Outcome.CONFIRMED  # already: a validation failed
    d += drive(d[-1].ladder, (150, st.ResetDone()), (151, st.ValidationSubmitted("78")),
               (300, st.ValidationFailed("78", (BAD,))))
    assert kinds(d[-1]) == ["drain", "cleanup", "create_reservation", "reboot"] and d[-1].ladder.stage is Stage.REBOOTING
    d += drive(d[-1].ladder, (900, st.NodeBack()), (901, st.ValidationSubmitted("79")),
               (999, st.ValidationFailed("79", (BAD,))))
    assert kinds(d[-1]) == ["drain", "cleanup", "drain", "run_repair"]
    ladder = d[-1].ladder
    assert ladder.stage is Stage.REPAIR and ladder.closed and ladder.outcome is Outcome.CONFIRMED
    assert d[-1].steps[-1] == st.RunRepair(NODE, "slurmgpu: repair (tried: reset, reboot): ecc.volatile")
    later = drive(ladder, (1000, st.Tick()), (5000, st.Restart()), (6000, st.ValidationFailed("79")),
                  (7000, st.PassiveHealthy()), (8000, st.RepairDone(0)))
    repairs = [s for x in d + later for s in x.steps if isinstance(s, st.RunRepair)]
    assert len(repairs) == 1 and all(x.steps == () for x in later)
    assert [r.verdict for r in later[-1].ladder.validations] == ["fail", "fail", "fail"]
    assert later[-1].ladder.history[-1].note == "repair command exit 0"


def test_a_rung_with_no_attempts_is_skipped() -> None:
    ladder, _ = validated_once(replace(SETTINGS, reset_attempts=0))
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))), settings=replace(SETTINGS, reset_attempts=0))
    assert kinds(failed) == ["drain", "cleanup", "create_reservation", "reboot"]


def test_no_remedies_at_all_goes_straight_to_repair() -> None:
    settings = replace(SETTINGS, reset_attempts=0, reboot_attempts=0)
    ladder, _ = validated_once(settings)
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))), settings=settings)
    assert kinds(failed) == ["drain", "cleanup", "drain", "run_repair"]


def test_a_failed_reset_is_retried_after_its_backoff_then_climbs() -> None:
    settings = replace(SETTINGS, reset_attempts=2)
    first = start(NODE, [XID], 0.0, settings)
    d = drive(first.ladder, (10, st.ResetFailed("nvidia-smi: error")), (40, st.Tick()), (60, st.Tick()),
              (61, st.ResetFailed("again")), settings=settings)
    assert [kinds(x) for x in d] == [[], [], ["reset_gpus"], ["create_reservation", "reboot"]]
    assert d[0].ladder.due == 10 + 50 and d[0].ladder.history[-1].note == "reset failed: nvidia-smi: error; retry"


def test_a_busy_gpu_waits_without_using_an_attempt() -> None:
    first = start(NODE, [XID], 0.0, SETTINGS)  # one reset attempt
    d = drive(first.ladder, (1, st.ResetFailed("process 4242 on GPU 3", busy=True)), (51, st.Tick()),
              (52, st.ResetDone()))
    assert [kinds(x) for x in d] == [[], ["reset_gpus"], ["create_reservation", "resume_into_reservation",
                                                          "submit_validation"]]


def test_a_reset_that_never_answers_times_out() -> None:
    first = start(NODE, [XID], 0.0, SETTINGS)
    (late,) = drive(first.ladder, (SETTINGS.reset_timeout_s, st.Tick()))
    assert kinds(late) == ["create_reservation", "reboot"]
    assert late.ladder.history[-1].note == "reset timed out; climbing"


def test_a_node_that_does_not_come_back_from_its_reboot_goes_to_repair() -> None:
    first = start(NODE, [ECC], 0.0, SETTINGS, action="reboot")
    d = drive(first.ladder, (SETTINGS.reboot_timeout_s - 1, st.Tick()), (SETTINGS.reboot_timeout_s, st.Tick()))
    assert kinds(d[0]) == [] and kinds(d[1]) == ["drain", "cleanup", "drain", "run_repair"]
    assert d[1].steps[1] == st.Cleanup(NODE, RES, None) and d[1].ladder.reservation is None


def test_a_reboot_retried_after_a_timeout_drains_and_makes_its_reservation_again() -> None:
    """Drained while it waits out the backoff: a node that boots late stays out of
    service (Slurm keeps DRAIN across a registration) and the retry starts clean."""
    settings = replace(SETTINGS, reboot_attempts=2)
    first = start(NODE, [ECC], 0.0, settings, action="reboot")
    late, retry = drive(first.ladder, (settings.reboot_timeout_s, st.Tick()),
                        (settings.reboot_timeout_s + 200, st.Tick()), settings=settings)
    assert late.steps == (st.Drain(NODE, "slurmgpu: the node did not come back from its reboot (node held drained)"),
                          st.Cleanup(NODE, RES, None))
    assert late.ladder.stage is Stage.REBOOTING and late.ladder.reservation is None
    assert kinds(retry) == ["create_reservation", "reboot"] and retry.ladder.reservation == RES


def test_no_reboot_without_its_reservation() -> None:
    """Slurm refused the reservation: slurmgpu's own trouble holds the node drained; it
    neither reboots it unguarded nor counts a failed reboot (which would climb to repair)."""
    first = start(NODE, [ECC], 0.0, SETTINGS, action="reboot")
    (failed,) = drive(first.ladder, (1, st.StepFailed("create_reservation", "slurmctld busy")))
    assert kinds(failed) == ["drain", "cleanup"] and failed.steps[1] == st.Cleanup(NODE, RES, None)
    held = failed.ladder
    assert held.stage is Stage.HELD and held.attempts == {} and held.deadline is None and not held.closed
    assert held.history[-1].note == "create_reservation failed: slurmctld busy; held, not rebooted"
    (again,) = drive(held, (SETTINGS.reboot_timeout_s * 2, st.Tick()))
    assert again.steps == () and again.ladder.stage is Stage.HELD


def test_node_back_before_a_reboot_was_asked_is_ignored() -> None:
    ladder, _ = validated_once()
    (back,) = drive(ladder, (20, st.NodeBack()))
    assert back.steps == () and back.ladder.stage is Stage.VALIDATING


# --------------------------------------------------------------------------- timeouts, trouble


def test_a_validation_past_its_deadline_is_cleaned_up_and_retried_then_held() -> None:
    ladder, _ = validated_once()  # issued at 10, deadline 1010
    d = drive(ladder, (1009, st.Tick()), (1010, st.Tick()))
    assert d[0].steps == () and kinds(d[1]) == ["drain", "cleanup"]
    assert d[1].steps[1] == st.Cleanup(NODE, RES, "77") and d[1].ladder.due == 1110
    assert d[1].ladder.validations[-1].verdict == "timeout"
    d += drive(d[-1].ladder, (1110, st.Tick()), (1111, st.ValidationTimedOut()))
    assert kinds(d[2])[0] == "create_reservation" and kinds(d[3]) == ["drain", "cleanup"]
    held = d[3].ladder
    assert held.stage is Stage.HELD and held.outcome is None and not held.confirmed
    assert drive(held, (99999, st.Tick()))[0].steps == ()  # no climbing on slurmgpu's own trouble


def test_a_step_that_slurm_refused_is_retried_and_never_climbs() -> None:
    ladder, _ = validated_once()
    (failed,) = drive(ladder, (12, st.StepFailed("submit_validation", "sbatch: error: invalid reservation")))
    assert kinds(failed) == ["drain", "cleanup"] and failed.ladder.stage is Stage.VALIDATING
    assert failed.ladder.remedies == [] and failed.ladder.rung == 0


def test_the_backoff_doubles_with_each_failure() -> None:
    settings = replace(SETTINGS, validate_attempts=4)
    ladder, _ = validated_once(settings)
    d = drive(ladder, (20, st.ValidationTimedOut("77")), (120, st.Tick()), (130, st.ValidationTimedOut()),
              (330, st.Tick()), (340, st.ValidationTimedOut()), settings=settings)
    assert [d[i].ladder.due for i in (0, 2, 4)] == [120, 330, 740]


# --------------------------------------------------------------------------- restart, operator


def test_a_restart_mid_validation_cleans_up_and_validates_again() -> None:
    ladder, _ = validated_once()
    (taken,) = drive(ladder, (30, st.Restart()))
    assert kinds(taken) == ["drain", "cleanup", "create_reservation", "resume_into_reservation",
                            "submit_validation"]
    assert taken.steps[1] == st.Cleanup(NODE, RES, "77")
    assert [r.verdict for r in taken.ladder.validations] == ["cancelled", None]
    assert taken.ladder.attempts == {}  # the old leader's run is no failed attempt


def test_a_restart_mid_ladder_resumes_the_same_rung() -> None:
    ladder, _ = validated_once()
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))))
    (taken,) = drive(failed.ladder, (120, st.Restart()))
    assert kinds(taken) == ["reset_gpus"] and taken.ladder.stage is Stage.RESETTING
    (rebooting,) = drive(start(NODE, [ECC], 0.0, SETTINGS, action="reboot").ladder, (10, st.Restart()))
    assert rebooting.steps == () and rebooting.ladder.deadline == SETTINGS.reboot_timeout_s


def test_a_restart_gives_a_held_node_one_more_try() -> None:
    settings = replace(SETTINGS, validate_attempts=1)
    ladder, _ = validated_once(settings)
    (held,) = drive(ladder, (20, st.ValidationTimedOut()), settings=settings)
    assert held.ladder.stage is Stage.HELD
    (again,) = drive(held.ladder, (30, st.Restart()), settings=settings)
    assert kinds(again)[0] == "create_reservation"


def test_an_operator_resume_cleans_up_and_closes_as_unknown() -> None:
    ladder, _ = validated_once()
    (resumed,) = drive(ladder, (40, st.OperatorResume("alice")))
    assert resumed.steps == (st.Cleanup(NODE, RES, "77"),)
    assert resumed.ladder.outcome is Outcome.UNKNOWN and resumed.ladder.stage is Stage.OPERATOR_RESUMED
    assert drive(resumed.ladder, (50, st.PassiveHealthy()))[0].steps == ()


def test_an_operator_resume_after_a_failed_validation_stays_confirmed() -> None:
    ladder, _ = validated_once()
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))))
    (resumed,) = drive(failed.ladder, (120, st.OperatorResume()))
    assert resumed.steps == () and resumed.ladder.outcome is Outcome.CONFIRMED


def test_an_open_ladder_has_no_outcome() -> None:
    assert start(NODE, [ECC], 0.0, SETTINGS).ladder.outcome is None


# --------------------------------------------------------------------------- dry run


def test_dry_run_records_every_step_and_takes_none() -> None:
    first = start(NODE, [XID], 0.0, SETTINGS, dry_run=True)
    assert first.steps == () and first.ladder.stage is Stage.RESETTING
    assert first.ladder.history[-1].dry_run and first.ladder.history[-1].steps == [
        {"step": "reset_gpus", "node": NODE, "gpus": [3]}]
    later = drive(first.ladder, (10_000, st.Tick()), (10_001, st.ResetDone()), dry_run=True)
    assert all(x.steps == () for x in later)
    assert later[0].ladder.stage is Stage.RESETTING  # nothing was started: nothing timed out
    assert [s["step"] for s in later[-1].ladder.history[-1].steps] == [
        "create_reservation", "resume_into_reservation", "submit_validation"]


# --------------------------------------------------------------------------- JSON


def test_the_ladder_goes_to_json_and_back_unchanged() -> None:
    ladder, _ = validated_once()
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))))
    text = json.dumps(failed.ladder.to_json())
    assert from_json(json.loads(text)) == failed.ladder


def test_a_ladder_of_another_version_is_refused() -> None:
    data = start(NODE, [ECC], 0.0, SETTINGS).ladder.to_json()
    with pytest.raises(ValueError, match="version 99"):
        from_json({**data, "version": 99})
    with pytest.raises(ValueError, match="remediation ladder"):
        from_json({**data, "stage": "bogus"})


@pytest.mark.parametrize("event", [st.ValidationFailed("1", (BAD,)), st.ResetFailed("x", busy=True), st.StepFailed("s", "e"),
                                   st.OperatorResume("bob"), st.Tick(), st.RepairDone(None, "timed out")])
def test_events_go_to_json_and_back(event: st.Event) -> None:
    assert st.event_from_json(json.loads(json.dumps(st.event_to_json(event)))) == event


def test_steps_go_to_json_and_back() -> None:
    for step in (st.ResetGpus(NODE, (1, 2)), st.Cleanup(NODE, None, "5"), st.RunRepair(NODE, "why")):
        assert st.step_from_json(json.loads(json.dumps(st.step_to_json(step)))) == step
    with pytest.raises(ValueError, match="unknown remediation step"):
        st.step_from_json({"step": "format_disk"})


# --------------------------------------------------------------------------- settings


def test_the_settings_come_from_the_remediation_and_validate_tables() -> None:
    from slurmgpu.config.load import parse_config

    text = ('[remediation]\nenabled = true\ntier = "full"\nreset_attempts = 0\n'
            'repair_command = "/usr/local/sbin/rma --queue \'gpu repair\'"\n[validate]\nevery_days = 7\n')
    settings = parse_config(text, path="site.toml").settings_for("gpu-n1")
    assert settings.remediation.enabled and settings.remediation.tier == "full"
    assert settings.remediation.reset_attempts == 0 and settings.validate.every_days == 7.0


@pytest.mark.parametrize(("body", "line", "key", "says"), [
    ('tier = "ful"', 3, "remediation.tier", 'must be one of "quick", "full"'),
    ("reset_attempts = -1", 3, "remediation.reset_attempts", "must be from 0 to 100"),
    ("validation_timeout_s = 5", 3, "remediation.validation_timeout_s", "must be from 60 to 172800"),
    ('repair_command = "rma \'open"', 3, "remediation.repair_command", "not a command line"),
    ('operator_tag = " "', 3, "remediation.operator_tag", "non-empty tag"),
    ("retry = 3", 3, "remediation.retry", "unknown key 'retry'"),
])
def test_a_bad_setting_names_the_file_line_and_key(body: str, line: int, key: str, says: str) -> None:
    from slurmgpu.config.load import parse_config
    from slurmgpu.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(f"# site\n[remediation]\n{body}\n", path="/etc/slurmgpu/slurmgpu.toml")
    assert (info.value.path, info.value.line, info.value.key) == ("/etc/slurmgpu/slurmgpu.toml", line, key)
    assert says in info.value.message


def test_every_days_zero_is_off_and_a_tiny_value_is_refused() -> None:
    from slurmgpu.config.load import parse_config
    from slurmgpu.errors import ConfigError

    assert parse_config("[validate]\nevery_days = 0\n").settings_for(None).validate.every_days == 0
    with pytest.raises(ConfigError, match="every_days"):
        parse_config("[validate]\nevery_days = 0.001\n", path="x.toml")


# --------------------------------------------------------------------------- the breaker


def test_the_open_breaker_holds_a_remedy_back_without_using_an_attempt() -> None:
    """A fleet-wide storm (the automation's breaker open) must not reset, reboot or send
    to repair every node it drained: the remedy waits, said once, until the breaker closes."""
    ladder, _ = validated_once()
    d = drive(ladder, (100, st.ValidationFailed("77", (BAD,))), (130, st.Tick()), (170, st.Tick()),
              breaker_open=True)
    assert [kinds(x) for x in d] == [["drain", "cleanup"], [], []]
    held = d[-1].ladder
    assert held.stage is Stage.RESETTING and held.issued_at is None and held.attempts == {}
    assert held.due == 170 + 60 and not held.closed  # due at 160, looked at again at 170 and held.outcome is Outcome.CONFIRMED
    notes = [h.note for h in held.history if "breaker" in h.note]
    assert notes == ["validation failed; reset waits: the automation's breaker is open"]
    assert ladder_status(held).text(200) == "reset: held back while the automation's breaker is open " \
                                            "(`slurmgpu breaker status`)"
    (closed,) = drive(held, (230, st.Tick()))
    assert ladder_status(closed.ladder).text(230).startswith("reset: reset to finish, timeout in")
    assert closed.steps == (st.ResetGpus(NODE, (1,)),) and closed.ladder.issued_at == 230


def test_the_open_breaker_holds_a_repair_back_and_the_ladder_stays_open() -> None:
    settings = replace(SETTINGS, reset_attempts=0, reboot_attempts=0)
    ladder, _ = validated_once(settings)
    (failed,) = drive(ladder, (100, st.ValidationFailed("77", (BAD,))), settings=settings, breaker_open=True)
    assert kinds(failed) == ["drain", "cleanup"] and failed.ladder.stage is Stage.REPAIR
    assert not failed.ladder.closed and not failed.ladder.repair_requested
    (repair,) = drive(failed.ladder, (160, st.Tick()), settings=settings)
    assert kinds(repair) == ["drain", "run_repair"] and repair.ladder.closed


def test_the_open_breaker_lets_validation_and_release_go_on() -> None:
    held = start(NODE, [XID], 0.0, SETTINGS, breaker_open=True)
    assert held.ladder.stage is Stage.RESETTING and held.steps == ()
    drained = start(NODE, [ECC], 0.0, SETTINGS, breaker_open=True)
    d = drive(drained.ladder, (10, st.PassiveHealthy()), (11, st.ValidationSubmitted("77")),
              (50, st.ValidationPassed("77")), breaker_open=True)
    assert kinds(d[0]) == ["create_reservation", "resume_into_reservation", "submit_validation"]
    assert kinds(d[-1]) == ["release"] and d[-1].ladder.stage is Stage.VALIDATED


def test_a_new_leader_keeps_a_held_back_remedy_held_back() -> None:
    first = start(NODE, [XID], 0.0, SETTINGS, breaker_open=True)
    d = drive(first.ladder, (5, st.Restart()), (70, st.Tick()), breaker_open=True)
    assert [kinds(x) for x in d] == [[], []] and d[-1].ladder.attempts == {}
    assert d[0].ladder.history[-1].note == "taken over; reset waits: the automation's breaker is open"
    assert ladder_status(d[-1].ladder).next.startswith("held back") and len(d[-1].ladder.history) == 2
