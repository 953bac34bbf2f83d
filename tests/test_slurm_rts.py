"""Return to service on the real Slurm mini-cluster: slurmgpu's maintenance reservation,
the validation job in it, ``scontrol reboot`` that holds the node, and a cleanup that
removes only what slurmgpu created (slurmgpu.slurm.owned). Run with `pytest -m slurm`."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

from slurmgpu.sim.cluster import SimCluster
from slurmgpu.sim.cluster.render import slurmgpu_command
from slurmgpu.slurm import JobInfo
from slurmgpu.slurm.cli import CliSlurmClient
from slurmgpu.slurm.owned import ENDED_JOB_STATES, cleanup, service_users, validation_command
from tests.agenthelpers import NEEDS_NOBODY, wait_until

pytestmark = pytest.mark.slurm

wait_for = functools.partial(wait_until, timeout=60, interval=0.3)


@pytest.fixture
def client(cluster: SimCluster) -> CliSlurmClient:
    return CliSlurmClient(retries=2, retry_delay_s=0.3, command_timeout_s=10)


def node_state(cluster: SimCluster, node: str) -> str:
    return cluster.scontrol("-o", "show", "node", node).split("State=", 1)[1].split()[0]


def submit_as_nobody(cluster: SimCluster, *args: str) -> str:
    """A job of an ordinary user (not slurmgpu's, not root)."""
    proc = subprocess.run(["runuser", "-u", "nobody", "--", "sbatch", "--parsable", "-o", "/dev/null", *args],
                          env={**os.environ, **cluster.env()}, cwd="/tmp", capture_output=True, text=True,
                          timeout=30, check=True)
    return proc.stdout.strip().split(";")[0]


def validate_argv(cluster: SimCluster, node: str) -> list[str]:
    """`slurmgpu validate` as the validation job runs it, seeing ``node``'s simulated GPUs."""
    exports = [f"{key}={value}" for key, value in cluster.node_env(node).items()]
    return validation_command("quick", program=["env", *exports, *slurmgpu_command().split()],
                              extra=["--tests", "gemm", "--node", node])


def ended(client: CliSlurmClient, job_id: str) -> JobInfo:
    wait_for(lambda: client.job(job_id).state in ENDED_JOB_STATES, what=f"job {job_id} ended")
    return client.job(job_id)


@NEEDS_NOBODY
def test_the_reservation_keeps_users_off_the_resumed_node_until_deleted(cluster: SimCluster,
                                                                        client: CliSlurmClient,
                                                                        tmp_path: Path) -> None:
    node = "gpu-n1"
    client.drain(node, "slurmgpu: xid.recent GPU 2 XID 79")
    res = client.create_reservation(node, duration_min=30, users=service_users())
    assert (res.name, res.nodes) == ("slurmgpu-rts-gpu-n1", (node,))
    assert {"MAINT", "IGNORE_JOBS"} <= res.flags
    assert client.create_reservation(node, duration_min=30, users=service_users()) == res  # reused
    client.resume(node)
    assert "DRAIN" not in node_state(cluster, node)
    users_job = submit_as_nobody(cluster, "-w", node, "--wrap", "true")
    report = cluster.dir / "jobs" / f"validate-{node}.json"
    job = client.submit_validation(node, validate_argv(cluster, node), reservation=res.name,
                                   time_limit_min=5, output=str(report))
    assert client.submit_validation(node, ["true"], reservation=res.name, time_limit_min=5) == job
    done = ended(client, job)
    assert (done.state, done.exit_code, done.name, done.nodes) == ("COMPLETED", 0, "slurmgpu-validate-gpu-n1",
                                                                   (node,))
    text = report.read_text()
    assert json.loads(text[text.index("{"):])["verdict"] == "OK"
    waiting = cluster.job(users_job)
    assert waiting["JobState"] == "PENDING" and "reserved" in waiting["Reason"].lower(), waiting
    assert client.delete_reservation(res.name) and not client.delete_reservation(res.name)
    assert cluster.wait_job(users_job) == "COMPLETED"
    assert cluster.job(users_job)["NodeList"] == node


def test_a_failed_validation_reports_its_exit_code(cluster: SimCluster, client: CliSlurmClient) -> None:
    node = "gpu-n2"
    cluster.inject(node, "fault-sdc")  # GPU 3's GEMM is wrong: validate exits 2 (FAIL)
    res = client.create_reservation(node, duration_min=30, users=service_users())
    job = client.submit_validation(node, validate_argv(cluster, node), reservation=res.name, time_limit_min=5)
    done = ended(client, job)
    assert (done.state, done.exit_code) == ("FAILED", 2)


def test_reboot_and_hold_keeps_the_node_out_after_the_boot(cluster: SimCluster, client: CliSlurmClient) -> None:
    """RebootProgram=/bin/true (the mini-cluster's) lets slurmctld issue the reboot;
    ``cluster.boot`` plays the node coming back (slurmd -b)."""
    node = "gpu-n3"
    client.drain(node, "slurmgpu: validate.gemm GPU 3 wrong product")
    client.reboot_and_hold(node, "slurmgpu: reboot (return to service)")
    wait_for(lambda: "REBOOT_ISSUED" in client.node(node).flags, what="reboot issued")
    cluster.boot(node)
    wait_for(lambda: "reboot complete" in (client.node(node).reason or ""), what="boot registered")
    after = client.node(node)
    assert after.state == "down" and not after.rebooting and after.owned_by_slurmgpu, after
    job = cluster.sbatch("", "-w", node, "-o", "/dev/null", "--wrap", "true")
    res = client.create_reservation(node, duration_min=30, users=service_users())
    client.resume(node)  # into the reservation: the waiting job still does not start
    wait_for(lambda: "reserved" in cluster.job(job)["Reason"].lower(), what="job held off by the reservation")
    assert cluster.job(job)["JobState"] == "PENDING"
    client.delete_reservation(res.name)
    assert cluster.wait_job(job) == "COMPLETED"


@NEEDS_NOBODY
def test_cleanup_removes_only_slurmgpus_leftovers(cluster: SimCluster, client: CliSlurmClient) -> None:
    mine = client.create_reservation("gpu-n3", duration_min=30, users=service_users())
    kept = client.create_reservation("gpu-n2", duration_min=30, users=service_users())
    validation = client.submit_validation("gpu-n3", ["sleep", "300"], reservation=mine.name, time_limit_min=5)
    cluster.scontrol("create", "reservation", "reservationname=site-maint-gpu-n4", "nodes=gpu-n4", "users=root",
                     "starttime=now", "duration=30", "flags=MAINT")
    site_job = cluster.sbatch("", "--reservation=site-maint-gpu-n4", "-w", "gpu-n4", "-J", "burn-in",
                              "-o", "/dev/null", "--wrap", "sleep 300")
    borrowed = submit_as_nobody(cluster, "-w", "gpu-n1", "-J", "slurmgpu-validate-gpu-n1", "--wrap", "sleep 300")
    for job in (validation, site_job, borrowed):
        assert cluster.wait_job(job, states=("RUNNING",)) == "RUNNING"
    assert client.job(validation).gpus == {"gpu-n3": tuple(range(8))}  # --exclusive: every GPU
    done = cleanup(client, keep_nodes={"gpu-n2"})
    assert (done.cancelled_jobs, done.deleted_reservations) == ([validation], [mine.name])
    assert ended(client, validation).state == "CANCELLED"
    assert {r.name for r in client.reservations()} == {kept.name, "site-maint-gpu-n4"}
    assert [cluster.job(j)["JobState"] for j in (site_job, borrowed)] == ["RUNNING", "RUNNING"]
    assert cleanup(client, keep_nodes={"gpu-n2"}).deleted_reservations == []
