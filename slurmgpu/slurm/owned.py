"""What slurmgpu creates in Slurm to return a node to service, and how it knows its own.

One naming rule: the maintenance reservation of node N is ``slurmgpu-rts-N``, its
validation job ``slurmgpu-validate-N`` and its idle-time validation job
``slurmgpu-idle-validate-N``, submitted by slurmgpu's own user. ``cleanup``
removes such leftovers (jobs first, then reservations) and never touches a reservation
or job that does not follow the rule. docs/admin-guide.md, "Return to service".
"""

from __future__ import annotations

import getpass
import shlex
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from slurmgpu.slurm import ENDED_JOB_STATES, JobInfo, Reservation, SlurmClient

RESERVATION_PREFIX = "slurmgpu-rts-"
VALIDATION_JOB_PREFIX = "slurmgpu-validate-"
IDLE_JOB_PREFIX = "slurmgpu-idle-validate-"
JOB_PREFIXES = (VALIDATION_JOB_PREFIX, IDLE_JOB_PREFIX)
#: How long a reservation lasts when nobody deletes it (a collector that died mid-ladder).
DEFAULT_RESERVATION_MIN = 120
DEFAULT_VALIDATION_TIME_MIN = 30


def reservation_name(node: str) -> str:
    return f"{RESERVATION_PREFIX}{node}"


def validation_job_name(node: str) -> str:
    return f"{VALIDATION_JOB_PREFIX}{node}"


def idle_job_name(node: str) -> str:
    return f"{IDLE_JOB_PREFIX}{node}"


def node_of(name: str) -> str | None:
    """The node a slurmgpu reservation or (idle) validation job is for; None for any other name."""
    for prefix in (RESERVATION_PREFIX, *JOB_PREFIXES):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return None


def service_users() -> tuple[str, ...]:
    """Who may run jobs in slurmgpu's reservations: this process's user (slurmgpu's
    service user, which submits the validation) and root."""
    return tuple(sorted({getpass.getuser(), "root"}))


def owned_reservation(res: Reservation) -> bool:
    return res.name.startswith(RESERVATION_PREFIX) and node_of(res.name) is not None


def owned_job(job: JobInfo, users: Collection[str]) -> bool:
    """A validation or idle validation job by name and submitted by one of ``users`` (a
    user's job that merely borrows the name is not slurmgpu's)."""
    name = job.name or ""
    return name.startswith(JOB_PREFIXES) and node_of(name) is not None and job.user in users


def validation_command(tier: str, *, program: Sequence[str] = ("slurmgpu",),
                       extra: Sequence[str] = ()) -> list[str]:
    """The argv the validation job runs: ``slurmgpu validate --tier T --json [extra]``."""
    return [*program, "validate", "--tier", tier, "--json", *extra]


def wrap_text(command: Sequence[str]) -> str:
    """``sbatch --wrap`` takes one shell line: every word quoted."""
    return shlex.join(command)


@dataclass
class Cleanup:
    cancelled_jobs: list[str] = field(default_factory=list)
    deleted_reservations: list[str] = field(default_factory=list)


def cleanup(client: SlurmClient, *, users: Collection[str] | None = None,
            keep_nodes: Collection[str] = ()) -> Cleanup:
    """Cancel slurmgpu's unfinished validation jobs and delete its reservations, except
    those of ``keep_nodes`` (a ladder still running there). Nothing else is touched."""
    owners = service_users() if users is None else users
    done = Cleanup()
    for job in leftover_jobs(client.all_jobs(), owners, keep_nodes):
        client.cancel_job(job.job_id)
        done.cancelled_jobs.append(job.job_id)
    for res in client.reservations():
        kept = node_of(res.name) in keep_nodes
        if owned_reservation(res) and not kept and client.delete_reservation(res.name):
            done.deleted_reservations.append(res.name)
    return done


def leftover_jobs(jobs: Iterable[JobInfo], owners: Collection[str], keep_nodes: Collection[str]) -> list[JobInfo]:
    """slurmgpu's validation jobs that have not ended, but for the nodes in ``keep_nodes``."""
    return [job for job in jobs if owned_job(job, owners) and job.state not in ENDED_JOB_STATES
            and node_of(job.name or "") not in keep_nodes]
