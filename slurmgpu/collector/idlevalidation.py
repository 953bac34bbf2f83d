"""One pass of idle-time validation (``slurmgpu validations idle``): record the idle
validation jobs that ended (``validations``, trigger ``idle``), then submit ``slurmgpu
validate --send`` as a preemptible job on each idle node that is due; a FAIL drains through
the agent and the automation like any ``validate --send``. One pass at a time per database.
docs/remediation.md, "Idle-time validation"."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from slurmgpu.collector.store import Store
from slurmgpu.collector.store.backend import is_postgres
from slurmgpu.collector.store.remediation import (
    ValidationRow,
    idle_pass_lock,
    last_validated,
    load_ladders,
    record_validation,
    validations,
)
from slurmgpu.config.schema import ValidateSettings
from slurmgpu.remediation.idle import IdleResult, ended_job, lost_job, why_not_now
from slurmgpu.remediation.triggers import due_for_idle_validation
from slurmgpu.slurm import JobGone, JobInfo, SlurmClient, SlurmError
from slurmgpu.slurm.owned import ENDED_JOB_STATES, idle_job_name, validation_command

TRIGGER = "idle"
#: How long a submitted idle validation may wait for its node before Slurm drops it.
START_WITHIN_MIN = 60
#: Minutes a job gets beyond its tier's budget (start-up, the probe's import).
SLACK_MIN = 5


@dataclass
class IdlePass:
    """What one pass did: runs recorded as ended, runs submitted, nodes skipped (and
    why), Slurm calls that failed (one line each; the node is tried again next pass)."""

    collected: list[ValidationRow] = field(default_factory=list)
    submitted: list[ValidationRow] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Set when another head's pass held the lock: this pass did nothing.
    other_pass: bool = False


@dataclass(frozen=True)
class IdleJob:
    """How the job is submitted: where (QOS and/or partition), the command that runs
    slurmgpu on the nodes, and extra ``validate`` arguments."""

    qos: str = ""
    partition: str = ""
    program: Sequence[str] = ("slurmgpu",)
    extra: Sequence[str] = ()


def run_pass(store: Store, client: SlurmClient, settings: ValidateSettings, now: float, *, job: IdleJob,
             limit: int) -> IdlePass:
    """Collect the ended runs, then submit at most ``limit`` new ones."""
    done = IdlePass()
    with pass_lock(store) as mine:
        if not mine:
            done.other_pass = True
            return done
        still_open = collect(store, client, now, done)
        if settings.every_days > 0:
            submit_due(store, client, settings, now, job=job, limit=limit, busy=still_open, done=done)
    return done


def pass_lock(store: Store) -> contextlib.AbstractContextManager[bool]:
    """Whether this pass may run (held for the pass): ``store.remediation.idle_pass_lock``."""
    return idle_pass_lock(store.db, postgres=is_postgres(store.path))


def open_runs(store: Store) -> list[ValidationRow]:
    """Idle runs submitted and not yet recorded as ended."""
    return [r for r in validations(store.db) if r.trigger == TRIGGER and r.verdict is None]


def collect(store: Store, client: SlurmClient, now: float, done: IdlePass) -> set[str]:
    """Record every open run whose job ended; the nodes whose run is still open."""
    still_open: set[str] = set()
    for run in open_runs(store):
        ended = _ended(client, run, done)
        if ended is None:
            still_open.add(run.node)
            continue
        result, job = ended
        row = replace(run, verdict=result.verdict, outcome=result.outcome, duration_s=_ran_for(job))
        with store.transaction():
            record_validation(store.db, row)
        done.collected.append(row)
    return still_open


def _ended(client: SlurmClient, run: ValidationRow, done: IdlePass) -> tuple[IdleResult, JobInfo | None] | None:
    """What the run's job came to, and the job (None once Slurm forgot it); None: it runs."""
    try:
        job = client.job(str(run.job_id))
    except JobGone:
        return lost_job(), None
    except SlurmError as exc:
        done.errors.append(f"{run.node}: cannot look up idle validation job {run.job_id}: {exc}")
        return None
    if job.name != idle_job_name(run.node):
        return lost_job(), None  # the id now names another job: ours was purged long ago
    if job.state not in ENDED_JOB_STATES:
        return None
    return ended_job(job.state, job.exit_code, job.state_reason), job


def _ran_for(job: JobInfo | None) -> float | None:
    """The job's run time, where Slurm says when it started and ended."""
    if job is None or job.start_time is None or job.end_time is None or job.end_time < job.start_time:
        return None
    return round(job.end_time - job.start_time, 3)


def submit_due(store: Store, client: SlurmClient, settings: ValidateSettings, now: float, *, job: IdleJob,
               limit: int, busy: set[str], done: IdlePass) -> None:
    """Submit on the idle nodes due, never-validated first, at most ``limit``."""
    try:
        nodes = client.nodes()
    except SlurmError as exc:
        done.errors.append(f"cannot list the nodes: {exc}")
        return
    ladders = load_ladders(store.db)
    for node in nodes:
        why = "an idle validation is active" if node.name in busy else \
            why_not_now(node.state, node.flags, node.name in ladders)
        if why is not None:
            done.skipped[node.name] = why
    ready = [n.name for n in nodes if n.name not in done.skipped]
    for name in due_for_idle_validation(ready, last_validated(store.db), now, settings.every_days, limit):
        _submit(store, client, name, settings, now, job, done)


def _submit(store: Store, client: SlurmClient, node: str, settings: ValidateSettings, now: float,
            job: IdleJob, done: IdlePass) -> None:
    tier = settings.idle_tier
    command = validation_command(tier, program=job.program, extra=["--send", *job.extra])
    try:
        job_id = client.submit_idle_validation(node, command, qos=job.qos, partition=job.partition,
                                               time_limit_min=time_limit_min(settings),
                                               start_within_min=START_WITHIN_MIN)
    except SlurmError as exc:
        done.errors.append(f"{node}: {exc}")
        return
    row = ValidationRow(node, now, TRIGGER, tier, job_id=job_id)
    with store.transaction():
        record_validation(store.db, row)
    done.submitted.append(row)


def time_limit_min(settings: ValidateSettings) -> int:
    """The idle tier's budget in whole minutes, plus ``SLACK_MIN``."""
    budget = settings.quick_budget_s if settings.idle_tier == "quick" else settings.full_budget_s
    return math.ceil(budget / 60) + SLACK_MIN
