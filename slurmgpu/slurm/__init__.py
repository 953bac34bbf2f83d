"""Talking to Slurm: one ``SlurmClient`` Protocol, two implementations
(``cli.py``: scontrol/scancel/squeue/sinfo; ``pyslurm_client.py``: pyslurm).

Every reason slurmgpu writes starts with ``REASON_PREFIX``; slurmgpu only ever
resumes nodes whose reason starts with it. A drain by a node hook or by ``slurmgpu
drain`` ends with an actor tag (``slurmgpu: xid.recent GPU 3 XID 79 [by epilog]``,
``slurmgpu: replace PSU [by operator alice]``), so whoever reads the reason later (the
collector's Slurm poll) knows who drained the node; the automation's reasons carry none
(the collector records its own decisions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Protocol

# The reason vocabulary lives in slurmgpu.decision (shared with the collector); the names
# stay importable from here.
from slurmgpu.decision import REASON_PREFIX as REASON_PREFIX
from slurmgpu.decision import TAGGED_ACTORS as TAGGED_ACTORS
from slurmgpu.decision import actor_tag as actor_tag
from slurmgpu.decision import reason_actor as reason_actor
from slurmgpu.errors import SlurmGpuError
from slurmgpu.record import record


class SlurmError(SlurmGpuError):
    """A Slurm command failed (bad node name, request denied...)."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer after the configured retries."""


class JobGone(SlurmError):
    """Slurm does not know this job id (never existed, or finished longer than
    MinJobAge ago and purged)."""


@record(frozen=True)
class NodeState:
    name: str
    # Base state, lower case: "idle", "allocated", "mixed", "down", "future", "unknown"...
    state: str
    # Flags, upper case: "DRAIN", "NOT_RESPONDING", "REBOOT_REQUESTED", "REBOOT_ISSUED",
    # "COMPLETING", "MAINTENANCE", "RESERVED", "POWERED_DOWN", ...
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: float | None = None  # Unix time the reason was set

    @property
    def drained(self) -> bool:
        """DRAIN flag set (drained or draining)."""
        return "DRAIN" in self.flags

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}) or self.state == "reboot"

    @property
    def owned_by_slurmgpu(self) -> bool:
        return bool(self.reason) and self.reason.startswith(REASON_PREFIX)  # type: ignore[union-attr]


#: Job states after which a job holds nothing.
ENDED_JOB_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT",
})


def ended_at(state: str, end_time: float | None) -> float | None:
    """Slurm's end time of a job in ``state``, once it ended (None before)."""
    return end_time if state in ENDED_JOB_STATES else None


@record(frozen=True)
class JobInfo:
    job_id: str
    state: str  # upper case: "RUNNING", "PENDING", "COMPLETED", ...
    user: str | None = None
    nodes: tuple[str, ...] = ()  # expanded node names
    # NVML/GRES indices of the GPUs the job holds, per node.
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batch_host: str | None = None
    restart_count: int = 0
    state_reason: str | None = None
    admin_comment: str | None = None
    name: str | None = None
    # The batch script's exit status once the job ended (None while it runs or unknown).
    exit_code: int | None = None
    # When it started, and when it ended (epoch seconds; None while not known or, for the
    # end, until it ended: a running job's end time is Slurm's projection).
    start_time: float | None = None
    end_time: float | None = None


@record(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...] = ()  # expanded node names
    flags: frozenset[str] = frozenset()  # upper case: "MAINT", "IGNORE_JOBS", ...
    users: tuple[str, ...] = ()
    state: str = ""  # "ACTIVE" or "INACTIVE"


class SlurmClient(Protocol):
    def node(self, name: str) -> NodeState: ...

    def nodes(self) -> list[NodeState]: ...

    def drain(self, node: str, reason: str) -> None:
        """Set DRAIN with this reason (sanitised: one line, bounded length)."""
        ...

    def resume(self, node: str) -> None: ...

    def reboot(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=RESUME reason=<reason> <node>``: drain now,
        reboot when idle, resume after. Reason sanitised like ``drain``'s. Needs a
        ``RebootProgram`` in slurm.conf: without one Slurm refuses and a ``SlurmError``
        saying so is raised."""
        ...

    def jobs_on_node(self, node: str) -> list[JobInfo]:
        """Running (and completing) jobs with an allocation on this node."""
        ...

    def job(self, job_id: str) -> JobInfo: ...

    def signal_job(self, job_id: str, signal: str = "USR1", *, full: bool = False) -> None:
        """Signal the batch shell only (default) or, with full, every process of the job."""
        ...

    def requeue(self, job_id: str) -> None: ...

    def set_admin_comment(self, job_id: str, comment: str) -> None: ...

    # ---- return to service (the names: slurmgpu.slurm.owned)

    def reboot_and_hold(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=DOWN reason=<reason> <node>``: drain now, reboot
        when idle, and keep the node out of service after the boot (DOWN, the reason
        ending in ``: reboot complete``) until it is resumed. Slurm 22.05 takes no
        ``nextstate=DRAIN``. Same RebootProgram rule as ``reboot``."""
        ...

    def reservations(self) -> list[Reservation]: ...

    def create_reservation(self, node: str, *, duration_min: int, users: Sequence[str]) -> Reservation:
        """The maintenance reservation ``reservation_name(node)`` on this node alone
        (``Flags=MAINT,IGNORE_JOBS``, starting now, for ``users``); an existing one of that
        name is returned as it is. ``resume`` then brings the node back into it."""
        ...

    def delete_reservation(self, name: str) -> bool:
        """Delete it; False when there was none of that name."""
        ...

    def submit_validation(self, node: str, command: Sequence[str], *, reservation: str,
                          time_limit_min: int, output: str = "/dev/null") -> str:
        """``sbatch --reservation --nodelist=<node> --exclusive --job-name=
        validation_job_name(node) --wrap <command>``; the job id. An active job of that
        name and this user is returned instead of submitting another."""
        ...

    def submit_idle_validation(self, node: str, command: Sequence[str], *, qos: str = "", partition: str = "",
                               time_limit_min: int, start_within_min: int) -> str:
        """``sbatch --qos/--partition --nodelist=<node> --exclusive --no-requeue
        --job-name=idle_job_name(node) --deadline --wrap <command>``: a low-priority run
        that real work preempts; the job id. An active job of that name and this user is
        returned instead of submitting another."""
        ...

    def all_jobs(self) -> list[JobInfo]:
        """Every job slurmctld still knows (pending, running and recently ended)."""
        ...

    def cancel_job(self, job_id: str) -> None:
        """scancel; a job that has ended or is unknown is no error."""
        ...


#: The ``SlurmClient`` calls that change Slurm (a follower collector makes none).
CHANGING_CALLS = frozenset({
    "drain", "resume", "reboot", "signal_job", "requeue", "set_admin_comment",
    "reboot_and_hold", "create_reservation", "delete_reservation", "submit_validation",
    "submit_idle_validation", "cancel_job",
})
