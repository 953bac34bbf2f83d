"""Return-to-service Slurm calls without a cluster: parsing what Slurm prints, the naming
and ownership rule, a retried sbatch that never submits twice, Slurm's error texts as one
clear line, and cleanup's choice over the in-memory fake. (On the real mini-cluster:
tests/test_slurm_rts.py.)"""

from __future__ import annotations

import getpass
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurmgpu.slurm import JobGone, JobInfo, SlurmError, SlurmUnreachable
from slurmgpu.slurm.cli import CliSlurmClient, parse_job_json, parse_job_text
from slurmgpu.slurm.owned import cleanup, node_of, owned_job, reservation_name, validation_job_name
from slurmgpu.slurm.reservations import parse_reservations_text
from slurmgpu.testing import FakeSlurmClient

ME = getpass.getuser()
RESERVATIONS_22_05 = (
    "ReservationName=slurmgpu-rts-gpu-n1 StartTime=2026-11-27T18:54:23 EndTime=2026-11-27T19:54:23 "
    "Duration=01:00:00 Nodes=gpu-n1 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) "
    "Flags=MAINT,IGNORE_JOBS,SPEC_NODES TRES=cpu=2 Users=root Groups=(null) Accounts=(null) "
    "Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)


def test_names_follow_one_rule() -> None:
    assert (reservation_name("gpu-n1"), validation_job_name("gpu-n1")) == ("slurmgpu-rts-gpu-n1",
                                                                           "slurmgpu-validate-gpu-n1")
    assert [node_of(n) for n in ("slurmgpu-rts-gpu-n1", "slurmgpu-validate-a", "slurmgpu-rts-", "maint")] == \
        ["gpu-n1", "a", None, None]


def test_a_borrowed_job_name_is_not_slurmgpus() -> None:
    job = JobInfo("7", "RUNNING", user="alice", name="slurmgpu-validate-gpu-n1")
    assert not owned_job(job, {"root", "slurmgpu"})
    assert owned_job(JobInfo("8", "RUNNING", user="slurmgpu", name="slurmgpu-validate-gpu-n1"), {"slurmgpu"})


def test_parse_reservations() -> None:
    (res,) = parse_reservations_text(RESERVATIONS_22_05)
    assert (res.name, res.nodes, res.users, res.state) == ("slurmgpu-rts-gpu-n1", ("gpu-n1",), ("root",), "ACTIVE")
    assert res.flags == {"MAINT", "IGNORE_JOBS", "SPEC_NODES"}
    assert parse_reservations_text("No reservations in the system\n") == []


@pytest.mark.parametrize(("value", "want"), [
    (768, 3),  # 22.05 squeue --json: the wait status (measured for `exit 3`)
    (0, 0),
    (9, 137),  # killed by SIGKILL
    ({"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 2}}, 2),  # >= 23.02
    (None, None),
])
def test_exit_code_from_json(value: object, want: int | None) -> None:
    assert parse_job_json({"job_id": 5, "job_state": "FAILED", "exit_code": value, "name": "x"}).exit_code == want


@pytest.mark.parametrize(("text", "want"), [("2:0", 2), ("0:9", 137), ("0:0", 0)])
def test_exit_code_from_text(text: str, want: int) -> None:
    job = parse_job_text(f"JobId=5 JobName=slurmgpu-validate-gpu-n1 UserId=root(0) JobState=FAILED ExitCode={text}")
    assert (job.exit_code, job.name) == (want, "slurmgpu-validate-gpu-n1")


@pytest.mark.parametrize(("value", "want"), [
    (1795659608, 1795659608.0),  # 22.05 squeue --json (recorded)
    ({"set": True, "infinite": False, "number": 1795659608}, 1795659608.0),  # >= 23.02
    ({"set": False, "infinite": False, "number": 0}, None), (0, None), (None, None),  # not started
])
def test_start_and_end_time_from_json(value: object, want: float | None) -> None:
    job = parse_job_json({"job_id": 5, "job_state": "COMPLETED", "start_time": value, "end_time": value})
    assert (job.start_time, job.end_time) == (want, want)
    running = parse_job_json({"job_id": 5, "job_state": "RUNNING", "start_time": value, "end_time": value})
    assert running.end_time is None  # (Slurm's projection: start + time limit)


def test_start_and_end_time_from_text_are_scontrols_local_time() -> None:
    """Running jobs recorded on Slurm 22.05 and 25.11 (tests/data/slurm/*/
    scontrol_job_multinode.txt): the start read, the end a projection (None until it ends)."""
    for version in ("22.05", "25.11"):
        text = (Path(__file__).parent / "data" / "slurm" / version / "scontrol_job_multinode.txt").read_text()
        job = parse_job_text(text)
        start = re.search(r"StartTime=(\S+)", text)
        assert start is not None and job.start_time == time.mktime(time.strptime(start[1], "%Y-%m-%dT%H:%M:%S"))
        assert job.state == "RUNNING" and job.end_time is None
    done = parse_job_text("JobId=5 JobState=COMPLETED StartTime=2026-11-28T02:00:00 EndTime=2026-11-28T02:01:05")
    assert done.end_time is not None and done.start_time is not None and done.end_time - done.start_time == 65
    pending = parse_job_text("JobId=5 JobState=PENDING StartTime=Unknown EndTime=Unknown")
    assert (pending.start_time, pending.end_time) == (None, None)


class Runner:
    """Slurm commands answered from a table keyed by the tool and its first argument;
    a list is consumed one answer per call."""

    def __init__(self, answers: dict[str, list[object]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        key = " ".join([argv[0].rsplit("/", 1)[-1], *argv[1:3]])
        queue = next((v for k, v in self.answers.items() if key.startswith(k)), None)
        answer = queue.pop(0) if queue and len(queue) > 1 else (queue or [(1, "", "unexpected")])[0]
        if isinstance(answer, BaseException):
            raise answer
        code, out, err = answer  # type: ignore[misc]
        return subprocess.CompletedProcess(list(argv), code, out, err)

    def count(self, tool: str) -> int:
        return sum(1 for c in self.calls if c[0].endswith("/" + tool))


def test_a_timed_out_sbatch_that_landed_is_not_submitted_again() -> None:
    landed = f"JobId=41 JobName=slurmgpu-validate-gpu-n1 UserId={ME}(0) JobState=PENDING ExitCode=0:0\n"
    runner = Runner({"scontrol --version": [(1, "", "")],
                     "scontrol -o show": [(0, "No jobs in the system\n", ""), (0, landed, "")],
                     "sbatch": [subprocess.TimeoutExpired(["sbatch"], 10)]})
    client = CliSlurmClient(runner=runner, retries=3, retry_delay_s=0, sleep=lambda _s: None)
    job = client.submit_validation("gpu-n1", ["slurmgpu", "validate"], reservation="slurmgpu-rts-gpu-n1",
                                   time_limit_min=5)
    assert (job, runner.count("sbatch")) == ("41", 1)


def test_a_cancelled_validation_still_completing_is_not_taken_for_the_new_one() -> None:
    """A new leader cancels the old leader's validation and submits again at once: the
    cancelled job is COMPLETING for a while (its node cleans up), and is not waited for."""
    completing = f"JobId=3 JobName=slurmgpu-validate-gpu-n1 UserId={ME}(0) JobState=COMPLETING ExitCode=0:15\n"
    runner = Runner({"scontrol --version": [(1, "", "")], "scontrol -o show": [(0, completing, "")],
                     "sbatch": [(0, "4\n", "")]})
    client = CliSlurmClient(runner=runner, retries=3, retry_delay_s=0, sleep=lambda _s: None)
    job = client.submit_validation("gpu-n1", ["slurmgpu", "validate"], reservation="slurmgpu-rts-gpu-n1",
                                   time_limit_min=5)
    assert (job, runner.count("sbatch")) == ("4", 1)


@pytest.mark.parametrize(("answer", "line"), [
    ("Error creating the reservation: Invalid node name specified",
     "cannot create reservation slurmgpu-rts-gpu-n1: no such node (Error creating the reservation: "
     "Invalid node name specified)"),
    ("Error creating the reservation: Invalid user id",
     "cannot create reservation slurmgpu-rts-gpu-n1: a user in users= is unknown, or this user lacks Slurm "
     "operator rights (root, SlurmUser, or AdminLevel=Operator in the accounting database) "
     "(Error creating the reservation: Invalid user id)"),
])
def test_slurm_refusals_become_one_clear_line(answer: str, line: str) -> None:
    runner = Runner({"scontrol -o show": [(0, "No reservations in the system\n", "")],
                     "scontrol create": [(1, "", answer + "\n")]})
    client = CliSlurmClient(runner=runner, retries=3, sleep=lambda _s: None)
    with pytest.raises(SlurmError) as exc:
        client.create_reservation("gpu-n1", duration_min=30, users=["root"])
    assert str(exc.value) == line
    assert runner.count("scontrol") == 2  # one look, one refused create: not retried


@pytest.mark.parametrize("bad", [
    {"node": "gpu-n1,gpu-n2"}, {"duration_min": 0}, {"users": []}, {"users": ["root;id"]},
])
def test_bad_input_changes_nothing(bad: dict[str, object]) -> None:
    runner = Runner({"scontrol -o show": [(0, "No reservations in the system\n", "")]})
    client = CliSlurmClient(runner=runner, sleep=lambda _s: None)
    args: dict[str, object] = {"node": "gpu-n1", "duration_min": 30, "users": ["root"], **bad}
    with pytest.raises(SlurmError):
        client.create_reservation(str(args.pop("node")), **args)  # type: ignore[arg-type]
    assert runner.calls == []


@pytest.mark.parametrize("command", [[], [""]])
def test_an_empty_validation_command_is_refused(command: list[str]) -> None:
    runner = Runner({})
    client = CliSlurmClient(runner=runner, sleep=lambda _s: None)
    with pytest.raises(SlurmError, match="invalid validation command"):
        client.submit_validation("gpu-n1", command, reservation="slurmgpu-rts-gpu-n1", time_limit_min=5)
    assert runner.calls == []


def test_cleanup_keeps_what_is_not_slurmgpus() -> None:
    fake = FakeSlurmClient(["gpu-n1", "gpu-n2", "gpu-n3"])
    for node in ("gpu-n1", "gpu-n2"):
        fake.create_reservation(node, duration_min=30, users=["root"])
    mine = fake.submit_validation("gpu-n1", ["slurmgpu", "validate"], reservation="slurmgpu-rts-gpu-n1",
                                  time_limit_min=5)
    fake.add_job("90", ["gpu-n3"], user="alice")
    fake.jobs["90"] = JobInfo("90", "RUNNING", user="alice", nodes=("gpu-n3",), name="slurmgpu-validate-gpu-n3")
    done = cleanup(fake, keep_nodes={"gpu-n2"})
    assert (done.cancelled_jobs, done.deleted_reservations) == ([mine], ["slurmgpu-rts-gpu-n1"])
    assert fake.jobs["90"].state == "RUNNING" and list(fake.reserved) == ["slurmgpu-rts-gpu-n2"]


def test_an_unreachable_slurmctld_gets_retries_tries_of_sbatch_then_unreachable() -> None:
    refused = (1, "", "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
                      "(connect failure)\n")
    runner = Runner({"scontrol --version": [(1, "", "")],
                     "scontrol -o show": [(0, "No jobs in the system\n", "")], "sbatch": [refused]})
    sleeps: list[float] = []
    client = CliSlurmClient(runner=runner, retries=3, retry_delay_s=0.5, sleep=sleeps.append)
    with pytest.raises(SlurmUnreachable):
        client.submit_validation("gpu-n1", ["true"], reservation="slurmgpu-rts-gpu-n1", time_limit_min=5)
    assert (runner.count("sbatch"), sleeps) == (3, [0.5, 0.5])


def test_a_job_slurm_no_longer_knows_is_gone() -> None:
    gone = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    runner = Runner({"scontrol --version": [(1, "", "")], "scontrol -o show": [gone],
                     "scancel": [(1, "", "scancel: error: Kill job error on job id 7: Invalid job id specified\n")]})
    client = CliSlurmClient(runner=runner, sleep=lambda _s: None)
    with pytest.raises(JobGone):
        client.job("7")
    client.cancel_job("7")  # nothing left to cancel: no error


def test_the_ladder_names_its_reservation_by_the_slurm_side_rule() -> None:
    from slurmgpu.remediation import ladder
    assert ladder.reservation_name("gpu-n7") == reservation_name("gpu-n7")
    assert node_of(ladder.reservation_name("gpu-n7")) == "gpu-n7"
