"""What starts a ladder or a validation (slurmgpu.remediation.triggers) and how a ladder
reads in `fleet`/`nodes` (slurmgpu.remediation.status)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import slurmgpu.remediation.steps as st
from slurmgpu.config.schema import RemediationSettings
from slurmgpu.remediation.ladder import advance, start
from slurmgpu.remediation.status import ladder_status
from slurmgpu.remediation.triggers import DAY, due_for_idle_validation, operator_opted_in
from slurmgpu.result import Finding, Severity

SETTINGS = RemediationSettings(enabled=True)
ECC = Finding("ecc.volatile", Severity.FAIL, "uncorrected", gpu=0)


@pytest.mark.parametrize(("reason", "all_drains", "opted"), [
    ("swap DIMM [validate]", False, True),
    ("swap DIMM", False, False),
    ("swap DIMM", True, True),
    ("slurmgpu: reseated GPU 3 [validate] [by operator alice]", False, True),
    ("slurmgpu: ecc.volatile GPU 0 uncorrected [validate]", False, False),  # the automation's own
    ("slurmgpu: xid.recent GPU 1 XID 79 [by prolog]", True, False),  # a hook's: slurmgpu's own ladder
])
def test_an_operator_drain_opts_in_by_its_tag_or_the_switch(reason: str, all_drains: bool, opted: bool) -> None:
    assert operator_opted_in(reason, replace(SETTINGS, operator_drains=all_drains)) is opted


def test_idle_validation_picks_the_never_validated_then_the_oldest() -> None:
    now = 100 * DAY
    last = {"n1": now - 8 * DAY, "n2": now - 1 * DAY, "n3": now - 30 * DAY, "n4": now - 7 * DAY}
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    assert due_for_idle_validation(nodes, last, now, 7, limit=10) == ["n5", "n3", "n1", "n4"]
    assert due_for_idle_validation(nodes, last, now, 7, limit=2) == ["n5", "n3"]
    assert due_for_idle_validation(nodes, last, now, 0, limit=10) == []  # off


def test_the_status_says_what_comes_next_and_when() -> None:
    drained = start("gpu-n1", [ECC], 0.0, SETTINGS).ladder
    assert ladder_status(drained).text(0) == "drained: validation once the passive checks pass"
    validating = advance(drained, st.PassiveHealthy(), 10.0, SETTINGS).ladder
    validating = advance(validating, st.ValidationSubmitted("77"), 11.0, SETTINGS).ladder
    status = ladder_status(validating)
    assert status.at == 10 + SETTINGS.validation_timeout_s
    assert status.text(110) == "awaiting_validation: result of job 77, timeout in 28 min"
    retry = advance(validating, st.StepFailed("submit_validation", "down"), 120.0, SETTINGS).ladder
    assert ladder_status(retry).text(120) == "awaiting_validation: validation again in 5 min"
    assert ladder_status(retry).to_json() == {"node": "gpu-n1", "stage": "awaiting_validation",
                                              "next": "validation again", "at": 120 + SETTINGS.validate_backoff_s}


def test_a_dry_run_ladder_says_nothing_was_started() -> None:
    ladder = start("gpu-n1", [ECC], 0.0, SETTINGS, action="reboot", dry_run=True).ladder
    assert ladder_status(ladder).text(5) == "reboot: node back from its reboot (dry run: nothing started)"
