"""`slurmgpu doctor`'s check of the slurm.conf lines idle-time validation needs, over
good and bad slurm.conf files (the mini-cluster's own passes it:
tests/test_slurm_idle_validation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgpu.config.schema import Settings, ValidateSettings
from slurmgpu.doctor import Context, Level
from slurmgpu.doctor.idlevalidate import check_idle_validation
from slurmgpu.slurm.conf import parse_slurm_conf

GOOD = """\
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=DEFAULT Nodes=ALL MaxTime=INFINITE
PartitionName=gpu Default=YES PriorityTier=10
PartitionName=idle-validate PriorityTier=1 PreemptMode=CANCEL Hidden=YES
"""
PARTITION = ValidateSettings(every_days=7, idle_partition="idle-validate")
QOS = ValidateSettings(every_days=7, idle_qos="scavenger")


def findings(tmp_path: Path, text: str, validate: ValidateSettings) -> list[tuple[Level, str]]:
    path = tmp_path / "slurm.conf"
    path.write_text(text)
    ctx = Context(role="head", role_reason="", node="head", keys_dir="", config_file=None, config_path="",
                  slurm_conf_file=None, environ={})
    ctx.settings = Settings(validate=validate)
    ctx.slurm_conf = parse_slurm_conf(str(path))
    return [(f.level, f.message) for f in check_idle_validation(ctx)]


def test_the_documented_lines_pass(tmp_path: Path) -> None:
    ((level, message),) = findings(tmp_path, GOOD, PARTITION)
    assert level is Level.OK and "partition idle-validate, preempted by preempt/partition_prio" in message


def test_off_checks_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, "", ValidateSettings()) == []


@pytest.mark.parametrize(("text", "validate", "line"), [
    (GOOD.replace("PreemptType=preempt/partition_prio\n", ""), PARTITION,
     "PreemptType=preempt/none: jobs of partition idle-validate are never preempted"),
    (GOOD.replace("PriorityTier=1 ", "PriorityTier=10 "), PARTITION,
     "has PriorityTier=10, no other partition a higher one: nothing preempts its jobs"),
    (GOOD.replace("PreemptMode=CANCEL Hidden", "PreemptMode=SUSPEND,GANG Hidden"), PARTITION,
     "preempts with PreemptMode=suspend: a preempted validation must be cancelled or requeued"),
    (GOOD.replace("PreemptMode=CANCEL\n", "").replace(" PreemptMode=CANCEL", ""), PARTITION,
     "preempts with PreemptMode=off"),
    (GOOD.replace("idle-validate", "scavenge"), PARTITION,
     "[validate] idle_partition 'idle-validate' is not a partition of"),
    (GOOD + "AccountingStorageType=accounting_storage/slurmdbd\n", QOS, "PreemptType=preempt/partition_prio: jobs of QOS scavenger are never preempted by QOS"),
    (GOOD.replace("partition_prio", "qos"), QOS, "needs QOS, which need accounting"),
    (GOOD, ValidateSettings(every_days=7), "neither idle_qos nor idle_partition"),
])
def test_a_missing_or_wrong_line_is_one_clear_failure(tmp_path: Path, text: str, validate: ValidateSettings,
                                                     line: str) -> None:
    found = findings(tmp_path, text, validate)
    assert [level for level, _ in found] == [Level.FAIL] and line in found[0][1], found


def test_qos_preemption_with_accounting_passes_and_names_the_sacctmgr_check(tmp_path: Path) -> None:
    text = "PreemptType=preempt/qos\nPreemptMode=REQUEUE\nAccountingStorageType=accounting_storage/slurmdbd\n"
    ((level, message),) = findings(tmp_path, text, QOS)
    assert level is Level.OK and "sacctmgr show qos" in message
