"""Doctor check of the slurm.conf lines idle-time validation needs ([validate] every_days
> 0): Slurm preempts (PreemptType), by the kind of place slurmgpu submits to (a partition:
preempt/partition_prio; a QOS: preempt/qos), the place exists and is preemptible, and a
preempted validation is cancelled or requeued, never suspended (PreemptMode).
docs/admin-guide.md, "Idle-time validation"."""

from __future__ import annotations

from collections.abc import Iterator

from slurmgpu.config.schema import ValidateSettings
from slurmgpu.doctor.model import Context, Finding, fail, ok, skip
from slurmgpu.slurm.conf import Partition, SlurmConf

CHECK = "slurm.preempt"
#: PreemptModes under which a preempted validation ends (CANCEL) or waits again (REQUEUE).
YIELDING = frozenset({"cancel", "requeue"})
PARTITION_LINE = "PartitionName={name} Nodes=ALL PriorityTier=1 PreemptMode=CANCEL Hidden=YES"


def check_idle_validation(ctx: Context) -> Iterator[Finding]:
    """Nothing when idle-time validation is off; else one finding per problem, or one OK."""
    settings = ctx.settings.validate if ctx.settings is not None else None
    if settings is None or settings.every_days <= 0:
        return
    if ctx.slurm_conf is None:
        yield skip(CHECK, "needs slurm.conf (see the slurm.conf line)")
        return
    problems = list(idle_validation_problems(ctx.slurm_conf, settings))
    yield from problems or [ok(CHECK, _summary(ctx.slurm_conf, settings))]


def idle_validation_problems(conf: SlurmConf, settings: ValidateSettings) -> Iterator[Finding]:
    if not settings.idle_qos and not settings.idle_partition:
        yield fail(CHECK, "[validate] every_days is set but neither idle_qos nor idle_partition: idle "
                          "validations have no preemptible place to run",
                   f"set [validate] idle_partition and add `{PARTITION_LINE.format(name='idle-validate')}`")
        return
    kind = _preempt_type(conf)
    if settings.idle_partition:
        yield from _partition_problems(conf, settings.idle_partition, kind)
    if settings.idle_qos:
        yield from _qos_problems(conf, settings.idle_qos, kind)


def _preempt_type(conf: SlurmConf) -> str:
    found = conf.get("PreemptType")
    return found.value.strip().lower() if found is not None else "preempt/none"


def _partition_problems(conf: SlurmConf, name: str, kind: str) -> Iterator[Finding]:
    part = conf.partitions.get(name)
    if part is None:
        yield fail(CHECK, f"[validate] idle_partition {name!r} is not a partition of {conf.path}",
                   f"add `{PARTITION_LINE.format(name=name)}` to {conf.path}")
        return
    if kind != "preempt/partition_prio":
        yield fail(CHECK, f"PreemptType={kind}: jobs of partition {name} are never preempted by "
                          "another partition's", f"set `PreemptType=preempt/partition_prio` in {conf.path}")
    higher = [p.name for p in conf.partitions.values() if _tier(p) > _tier(part)]
    if not higher:
        yield fail(CHECK, f"partition {name} ({part.where}) has PriorityTier={_tier(part)}, no other "
                          "partition a higher one: nothing preempts its jobs",
                   f"give {name} `PriorityTier=1` and the partitions of real work a higher one")
    mode = _mode(conf, part)
    if mode not in YIELDING:
        yield fail(CHECK, f"partition {name} ({part.where}) preempts with PreemptMode={mode or 'OFF'}: "
                          "a preempted validation must be cancelled or requeued",
                   f"add `PreemptMode=CANCEL` to the PartitionName={name} line")


def _tier(part: Partition) -> int:
    try:
        return int(part.options.get("prioritytier", part.options.get("priority", "1")))
    except ValueError:
        return 1


def _mode(conf: SlurmConf, part: Partition | None) -> str:
    """The first PreemptMode word (the partition's, else the cluster's), lower case."""
    text = part.options.get("preemptmode") if part is not None else None
    if text is None:
        found = conf.get("PreemptMode")
        text = found.value if found is not None else "off"
    return text.split(",")[0].strip().lower()


def _qos_problems(conf: SlurmConf, qos: str, kind: str) -> Iterator[Finding]:
    if kind != "preempt/qos":
        yield fail(CHECK, f"PreemptType={kind}: jobs of QOS {qos} are never preempted by QOS",
                   f"set `PreemptType=preempt/qos` in {conf.path}")
    storage = conf.get("AccountingStorageType")
    if storage is None or "slurmdbd" not in storage.value.lower():
        yield fail(CHECK, f"[validate] idle_qos {qos!r} needs QOS, which need accounting "
                          "(AccountingStorageType=accounting_storage/slurmdbd)",
                   "use [validate] idle_partition instead, or set up slurmdbd")
    if _mode(conf, None) not in YIELDING:
        yield fail(CHECK, f"PreemptMode={_mode(conf, None) or 'OFF'}: a preempted validation must be "
                          "cancelled or requeued", f"set `PreemptMode=CANCEL` in {conf.path}")


def _summary(conf: SlurmConf, settings: ValidateSettings) -> str:
    where = " and ".join([f"partition {settings.idle_partition}"] * bool(settings.idle_partition)
                         + [f"QOS {settings.idle_qos}"] * bool(settings.idle_qos))
    note = (f"; QOS live in slurmdbd, which doctor does not read: `sacctmgr show qos "
            f"format=name,preempt,preemptmode` should show {settings.idle_qos} preempted") if settings.idle_qos else ""
    return (f"idle validations every {settings.every_days:g} days in {where}, preempted by "
            f"{_preempt_type(conf)}{note}")
