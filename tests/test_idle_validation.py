"""Idle-time validation without a cluster: which nodes may take one, what an ended job
was, one pass of the submitter over the in-memory Slurm and a real SQLite store, the
names cleanup knows, the sbatch line, and the CLI's one-line refusal. (On the real
mini-cluster, preemption included: tests/test_slurm_idle_validation.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.root import cli
from slurmgpu.collector.idlevalidation import IdleJob, pass_lock, run_pass, time_limit_min
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.remediation import (
    ValidationRow,
    record_validation,
    save_ladder,
    validations,
)
from slurmgpu.config.schema import ValidateSettings
from slurmgpu.remediation.idle import IdleResult, ended_job, why_not_now
from slurmgpu.slurm import JobInfo, SlurmError
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.owned import cleanup, idle_job_name, node_of, owned_job
from slurmgpu.testing import FakeSlurmClient
from tests.test_slurm_owned import Runner

T0 = 1_790_000_000.0
SETTINGS = ValidateSettings(every_days=7, idle_partition="idle-validate")
JOB = IdleJob(partition="idle-validate")


@pytest.mark.parametrize(("state", "flags", "ladder", "why"), [
    ("idle", set(), False, None),
    ("idle", {"DRAIN"}, False, "flagged drain"),
    ("idle", {"RESERVED", "MAINTENANCE"}, False, "flagged maintenance,reserved"),
    ("down", set(), False, "down, not idle"),
    ("allocated", set(), False, "allocated, not idle"),
    ("idle", set(), True, "in a return-to-service ladder"),
])
def test_only_an_idle_node_nobody_has_plans_for_takes_one(state: str, flags: set[str], ladder: bool,
                                                          why: str | None) -> None:
    assert why_not_now(state, flags, ladder) == why


@pytest.mark.parametrize(("state", "exit_code", "reason", "want"), [
    ("COMPLETED", 0, None, ("pass", "passed")),
    ("COMPLETED", 1, None, ("pass", "passed")),  # WARN: no drain
    ("FAILED", 2, None, ("fail", "reported")),
    ("FAILED", 3, None, ("error", "retried")),  # UNKNOWN: judged nothing
    ("PREEMPTED", 0, None, ("preempted", "preempted")),
    ("CANCELLED", None, "Preempted", ("preempted", "preempted")),
    ("CANCELLED", None, None, ("cancelled", "retried")),
    ("DEADLINE", None, None, ("expired", "retried")),
    ("TIMEOUT", None, None, ("timeout", "retried")),
])
def test_what_an_ended_job_was(state: str, exit_code: int | None, reason: str | None,
                               want: tuple[str, str]) -> None:
    assert ended_job(state, exit_code, reason) == IdleResult(*want)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "fleet.db")


def test_a_pass_submits_on_idle_due_nodes_only_once_and_skips_the_others(store: Store) -> None:
    fake = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3", "gpu-n4", "gpu-n5"])
    fake.drain("gpu-n2", "slurmgpu: xid.recent GPU 1 XID 79")
    with store.transaction():
        save_ladder(store.db, "gpu-n3", {"node": "gpu-n3"}, T0)
        record_validation(store.db, ValidationRow("gpu-n4", T0 - 3600, "manual", "quick", "pass"))  # not due
        record_validation(store.db, ValidationRow("gpu-n5", T0 - 8 * 86400, "idle", "quick", "pass"))
    first = run_pass(store, fake, SETTINGS, T0, job=JOB, limit=8)
    assert [(r.node, r.trigger, r.verdict) for r in first.submitted] == [("gpu-n1", "idle", None),
                                                                         ("gpu-n5", "idle", None)]
    assert first.skipped == {"gpu-n2": "flagged drain", "gpu-n3": "in a return-to-service ladder"}
    assert [c[:3] for c in fake.calls if c[0] == "submit_idle_validation"] == [
        ("submit_idle_validation", "gpu-n1", "idle-validate"), ("submit_idle_validation", "gpu-n5", "idle-validate")]
    assert "validate --tier quick --json --send" in fake.calls[-1][3]
    again = run_pass(store, fake, SETTINGS, T0 + 600, job=JOB, limit=8)
    assert again.submitted == [] and again.skipped["gpu-n1"] == "an idle validation is active"


def test_ended_jobs_are_recorded_and_a_forgotten_one_is_lost(store_url: str) -> None:
    store = Store(store_url)
    fake = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3"])
    first = run_pass(store, fake, SETTINGS, T0, job=JOB, limit=8)
    n1, n2, n3 = (r.job_id for r in first.submitted)
    fake.jobs[str(n1)] = dataclasses.replace(fake.jobs[str(n1)], state="PREEMPTED")
    fake.jobs[str(n2)] = dataclasses.replace(fake.jobs[str(n2)], state="FAILED", exit_code=2,
                                             start_time=T0 + 30, end_time=T0 + 95.5)
    del fake.jobs[str(n3)]
    done = run_pass(store, fake, SETTINGS, T0 + 600, job=JOB, limit=0)
    assert [(r.node, r.verdict, r.outcome) for r in done.collected] == [
        ("gpu-n1", "preempted", "preempted"), ("gpu-n2", "fail", "reported"), ("gpu-n3", "lost", "retried")]
    assert [(r.node, r.trigger, r.verdict, r.duration_s) for r in validations(store.db)] == [
        ("gpu-n1", "idle", "preempted", None), ("gpu-n2", "idle", "fail", 65.5), ("gpu-n3", "idle", "lost", None)]
    retry = run_pass(store, fake, SETTINGS, T0 + 1200, job=JOB, limit=8)
    assert [r.node for r in retry.submitted] == ["gpu-n1", "gpu-n3"]  # gpu-n2 was judged
    store.close()


def test_one_pass_at_a_time_on_a_shared_postgresql_database(pg_url: str) -> None:
    """Two heads' timers: the second pass finds the first one's lock and does nothing."""
    first, second = Store(pg_url), Store(pg_url)
    fake = FakeSlurmClient(["gpu-n1"])
    try:
        with pass_lock(first) as mine:
            assert mine
            blocked = run_pass(second, fake, SETTINGS, T0, job=JOB, limit=8)
        assert (blocked.other_pass, blocked.submitted, fake.calls) == (True, [], [])
        assert [r.node for r in run_pass(second, fake, SETTINGS, T0, job=JOB, limit=8).submitted] == ["gpu-n1"]
    finally:
        first.close()
        second.close()


def test_the_limit_bounds_a_pass_and_off_only_collects(store: Store) -> None:
    fake = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3"])
    assert [r.node for r in run_pass(store, fake, SETTINGS, T0, job=JOB, limit=2).submitted] == ["gpu-n1", "gpu-n2"]
    fake.jobs["1000"] = dataclasses.replace(fake.jobs["1000"], state="COMPLETED", exit_code=0)
    off = run_pass(store, fake, ValidateSettings(), T0 + 60, job=JOB, limit=8)
    assert ([r.verdict for r in off.collected], off.submitted) == (["pass"], [])


def test_a_refused_sbatch_is_one_line_and_the_node_stays_due(store: Store) -> None:
    fake = FakeSlurmClient(["gpu-n1"])
    fake.unreachable = True
    done = run_pass(store, fake, SETTINGS, T0, job=JOB, limit=8)
    assert (done.submitted, len(done.errors)) == ([], 1) and "cannot list the nodes" in done.errors[0]
    assert validations(store.db) == []


def test_cleanup_knows_idle_validation_jobs() -> None:
    assert (idle_job_name("gpu-n1"), node_of("slurmgpu-idle-validate-gpu-n1")) == \
        ("slurmgpu-idle-validate-gpu-n1", "gpu-n1")
    assert not owned_job(JobInfo("7", "RUNNING", user="alice", name="slurmgpu-idle-validate-gpu-n1"), {"root"})
    fake = FakeSlurmClient(["gpu-n1"])
    job = fake.submit_idle_validation("gpu-n1", ["slurmgpu", "validate"], partition="idle-validate",
                                      time_limit_min=6, start_within_min=60)
    assert cleanup(fake).cancelled_jobs == [job]


def test_the_sbatch_line_is_preemptible_exclusive_and_never_requeued() -> None:
    runner = Runner({"scontrol --version": [(1, "", "")], "scontrol -o show": [(0, "No jobs in the system\n", "")],
                     "sbatch": [(0, "77\n", "")]})
    client = CliSlurmClient(runner=runner, retries=1, sleep=lambda _s: None)
    job = client.submit_idle_validation("gpu-n1", ["slurmgpu", "validate"], qos="scavenger",
                                        partition="idle-validate", time_limit_min=time_limit_min(SETTINGS),
                                        start_within_min=60)
    (sbatch,) = [c for c in runner.calls if c[0].endswith("/sbatch")]
    assert job == "77" and sbatch[1:-1] == [
        "--parsable", "--qos=scavenger", "--partition=idle-validate", "--nodelist=gpu-n1", "--exclusive",
        "--no-requeue", "--job-name=slurmgpu-idle-validate-gpu-n1", "--time=6", "--deadline=now+66minutes",
        "--output=/dev/null", "--chdir=/tmp", "--wrap"]
    with pytest.raises(SlurmError, match="preemptible QOS or partition"):
        client.submit_idle_validation("gpu-n1", ["true"], time_limit_min=6, start_within_min=60)


def test_the_cli_refuses_every_days_without_a_preemptible_place(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text("[validate]\nevery_days = 7\n")
    result = CliRunner().invoke(cli, ["validations", "idle", "--config", str(config), "--db",
                                      str(tmp_path / "fleet.db")])
    assert result.exit_code == 3
    assert "neither idle_qos nor idle_partition" in result.output
