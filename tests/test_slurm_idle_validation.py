"""Idle-time validation on the real Slurm mini-cluster: the submitter's job in the
preemptible ``idle-validate`` partition (PreemptType=preempt/partition_prio, the
partition's PreemptMode=CANCEL) yields to a real job, and each run lands in the
``validations`` table with trigger ``idle``; on the fleet cluster (agents, collector) a
failing one drains its node through the collector. Run with `pytest -m slurm`."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmgpu.cli.root import cli
from slurmgpu.collector.idlevalidation import IdleJob, run_pass
from slurmgpu.collector.store import Store
from slurmgpu.collector.store.remediation import ValidationRow, record_validation, validations
from slurmgpu.config.schema import ValidateSettings
from slurmgpu.doctor.idlevalidate import idle_validation_problems
from slurmgpu.sim.cluster import SimCluster
from slurmgpu.sim.cluster.render import IDLE_PARTITION, slurmgpu_command
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.conf import parse_slurm_conf
from slurmgpu.slurm.owned import ENDED_JOB_STATES
from tests.agenthelpers import wait_until

pytestmark = pytest.mark.slurm

wait_for = functools.partial(wait_until, timeout=60, interval=0.3)
SETTINGS = ValidateSettings(every_days=1, idle_partition=IDLE_PARTITION)


@pytest.fixture
def client(cluster: SimCluster) -> CliSlurmClient:
    return CliSlurmClient(retries=2, retry_delay_s=0.3, command_timeout_s=10)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "fleet.db")


def only_due(store: Store, cluster: SimCluster, node: str, now: float) -> None:
    """Every other node passed a validation just now: ``node`` alone is due."""
    with store.transaction():
        for other in cluster.nodes:
            if other != node:
                record_validation(store.db, ValidationRow(other, now - 60, "manual", "quick", "pass"))


def validate_job(cluster: SimCluster, node: str) -> IdleJob:
    """`slurmgpu validate` as the idle job runs it, seeing ``node``'s simulated GPUs."""
    exports = [f"{key}={value}" for key, value in cluster.node_env(node).items()]
    return IdleJob(partition=IDLE_PARTITION, program=("env", *exports, *slurmgpu_command().split()),
                   extra=("--tests", "gemm", "--node", node))


def run_to_the_end(store: Store, client: CliSlurmClient, cluster: SimCluster, node: str) -> ValidationRow:
    now = time.time()
    only_due(store, cluster, node, now)
    (submitted,) = run_pass(store, client, SETTINGS, now, job=validate_job(cluster, node), limit=4).submitted
    assert (submitted.node, submitted.trigger, submitted.verdict) == (node, "idle", None)
    wait_for(lambda: client.job(str(submitted.job_id)).state in ENDED_JOB_STATES, what="idle validation ended")
    (collected,) = run_pass(store, client, SETTINGS, now + 1, job=validate_job(cluster, node), limit=0).collected
    assert validations(store.db, node)[-1] == collected
    return collected


@pytest.fixture(params=["CANCEL", "REQUEUE"])
def preempt_mode(request: pytest.FixtureRequest, cluster: SimCluster) -> Iterator[str]:
    """The idle partition's PreemptMode, set for this test (slurm.conf says CANCEL)."""
    cluster.scontrol("update", f"partitionname={IDLE_PARTITION}", f"preemptmode={request.param}")
    assert f"PreemptMode={request.param}" in cluster.scontrol("-o", "show", "partition", IDLE_PARTITION)
    yield request.param
    cluster.scontrol("update", f"partitionname={IDLE_PARTITION}", "preemptmode=CANCEL")


def test_an_idle_validation_yields_to_a_real_job_and_is_recorded_as_preempted(
        cluster: SimCluster, client: CliSlurmClient, store: Store, preempt_mode: str) -> None:
    """REQUEUE too ends the run: the job is submitted --no-requeue."""
    node, now = "gpu-n1", time.time()
    assert list(idle_validation_problems(parse_slurm_conf(str(cluster.conf)), SETTINGS)) == []  # doctor agrees
    only_due(store, cluster, node, now)
    long_run = IdleJob(partition=IDLE_PARTITION, program=("sh", "-c", "sleep 300", "--"))
    (idle,) = run_pass(store, client, SETTINGS, now, job=long_run, limit=4).submitted
    assert cluster.wait_job(str(idle.job_id), states=("RUNNING",)) == "RUNNING"
    assert client.job(str(idle.job_id)).name == "slurmgpu-idle-validate-gpu-n1"
    asked = time.monotonic()
    real = cluster.sbatch("", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 2")
    assert cluster.wait_job(real, states=("RUNNING",)) in ("RUNNING", "COMPLETED")
    waited = time.monotonic() - asked
    assert client.job(str(idle.job_id)).state == "PREEMPTED"
    assert run_pass(store, client, SETTINGS, now + 1, job=long_run, limit=4).submitted == []  # busy node
    (row,) = [r for r in validations(store.db, node) if r.trigger == "idle"]
    assert (row.verdict, row.outcome, row.job_id) == ("preempted", "preempted", idle.job_id)
    assert not client.node(node).drained
    assert waited < 30, f"the real job waited {waited:.1f} s for the preemption"  # 1.1 s measured


def test_a_passing_idle_validation_is_recorded_as_a_pass(cluster: SimCluster, client: CliSlurmClient,
                                                         store: Store) -> None:
    row = run_to_the_end(store, client, cluster, "gpu-n2")
    assert (row.trigger, row.verdict, row.outcome) == ("idle", "pass", "passed")
    assert row.duration_s is not None and 0 <= row.duration_s < 600  # the job's run time, by Slurm


def test_a_failing_idle_validation_is_recorded_as_a_fail(cluster: SimCluster, client: CliSlurmClient,
                                                         store: Store) -> None:
    cluster.inject("gpu-n3", "fault-sdc")  # GPU 3's GEMM is wrong: validate exits 2 (FAIL)
    row = run_to_the_end(store, client, cluster, "gpu-n3")
    assert (row.trigger, row.verdict, row.outcome) == ("idle", "fail", "reported")


def test_the_timer_command_submits_then_records(cluster: SimCluster, client: CliSlurmClient, store: Store,
                                                tmp_path: Path) -> None:
    """`slurmgpu validations idle`, as the timer runs it, twice: a submission, then its end."""
    now = time.time()
    only_due(store, cluster, "gpu-n4", now)
    store.close()
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[validate]\nevery_days = 1\nidle_partition = "{IDLE_PARTITION}"\n')
    argv = ["validations", "idle", "--config", str(config), "--db", str(tmp_path / "fleet.db"),
            "--program", "sh -c true --"]  # a stand-in that passes: the CLI's plumbing is under test
    first = CliRunner().invoke(cli, argv)
    assert first.exit_code == 0 and "gpu-n4: submitted job" in first.output, first.output
    job = first.output.split("submitted job ")[1].split()[0]
    wait_for(lambda: client.job(job).state in ENDED_JOB_STATES, what="idle validation ended")
    second = CliRunner().invoke(cli, [*argv, "--json"])
    assert second.exit_code == 0, second.output
    (row,) = json.loads(second.output)["collected"]
    assert (row["node"], row["trigger"], row["verdict"], row["job_id"]) == ("gpu-n4", "idle", "pass", job)


def test_a_failing_idle_validation_drains_its_node_through_the_collector(fleet: SimCluster) -> None:
    """The job's `validate --send` hands the FAIL to the node's agent; the collector's
    automation drains (the pass itself only records the run)."""
    node, now = "gpu-n1", time.time()
    fleet.set_automation("")
    fleet.inject(node, "fault-sdc")
    client = CliSlurmClient(retries=2, retry_delay_s=0.3, command_timeout_s=10)
    store = Store(fleet.collector_db())
    try:
        only_due(store, fleet, node, now)
        (submitted,) = run_pass(store, client, SETTINGS, now, job=validate_job(fleet, node), limit=4).submitted
        wait_for(lambda: client.node(node).drained, what=f"{node} drained by the collector")
        assert "validate.gemm" in (client.node(node).reason or ""), client.node(node)
        wait_for(lambda: client.job(str(submitted.job_id)).state in ENDED_JOB_STATES, what="idle validation ended")
        (row,) = run_pass(store, client, SETTINGS, now + 1, job=validate_job(fleet, node), limit=0).collected
        assert (row.verdict, row.outcome) == ("fail", "reported")
    finally:
        store.close()
