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
