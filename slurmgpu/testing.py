"""Pure-Python fakes of every fact source, for logic tests and for site authors
writing their own checks. (Tests of the NVML integration use the fake
``libnvidia-ml.so.1`` in ``slurmgpu.sim`` instead.)"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from slurmgpu.facts import (
    CLOCKS_EVENT_GPU_IDLE,
    DiskState,
    EccCounts,
    FabricInfo,
    GpuFacts,
    HostFacts,
    IbFacts,
    IbHca,
    IbPort,
    NodeFacts,
    NvLink,
    NvmlFacts,
    PcieLink,
    RemappedRows,
    ServiceState,
    SoftwareVersions,
)

IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


@dataclass
class FakeNvmlSource:
    facts: NvmlFacts
    calls: list[frozenset[int] | None] = field(default_factory=list)

    def collect(self, gpus: frozenset[int] | None = None) -> NvmlFacts:
        self.calls.append(gpus)
        result = copy.deepcopy(self.facts)
        result.bus_ids = result.bus_ids or [g.pci_bus_id or "" for g in result.gpus]  # as NVML: every GPU's
        if gpus is not None:
            result.gpus = [g for g in result.gpus if g.index in gpus]
        return result


@dataclass
class FakeIbSource:
    facts: IbFacts

    def collect(self) -> IbFacts:
        return copy.deepcopy(self.facts)


@dataclass
class FakeVersionSource:
    versions: SoftwareVersions

    def collect(self) -> SoftwareVersions:
        return copy.deepcopy(self.versions)


@dataclass
class FakeHostSource:
    facts: HostFacts

    def collect(self) -> HostFacts:
        return copy.deepcopy(self.facts)


@dataclass
class FakeServiceReader:
    """``ServiceReader`` answering from a table; a unit it lacks is not-found."""

    states: dict[str, ServiceState] = field(default_factory=dict)
    asked: list[list[str]] = field(default_factory=list)

    def show(self, units: list[str]) -> list[ServiceState]:
        self.asked.append(list(units))
        return [copy.deepcopy(self.states.get(u, ServiceState(u, "not-found", "inactive", "dead", 0)))
                for u in units]


def running(unit: str, restarts: int = 0) -> ServiceState:
    return ServiceState(unit, "loaded", "active", "running", restarts, "success")


def healthy_host() -> HostFacts:
    """An HGX H100 node's host layers: driver 550.90.07 (proprietary module), 4 NVSwitches,
    persistenced and fabricmanager running, nvidia_peermem loaded, roomy disks."""
    disk = DiskState("/tmp", 500 << 30, 400 << 30, False)
    return HostFacts(
        available=True, kernel_module_version="550.90.07",
        kernel_module_text="NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Thu Jun  6 04:29:46 UTC 2024",
        open_kernel_module=False, kernel_release="6.8.0-45-generic", nvswitches=4, peermem_loaded=True,
        systemd=True, services=[running("nvidia-persistenced"), running("nvidia-fabricmanager")],
        disks=[disk, dataclasses.replace(disk, path="/var")])


@dataclass
class FakeClock:
    now: float = 1_790_000_000.0
    mono: float = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


def h100_gpu(index: int) -> GpuFacts:
    return GpuFacts(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-00000000-0000-0000-0000-00000000000{index}",
        serial=f"165322000000{index}",
        pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
        vbios="96.00.99.00.01",
        persistence_mode=True,
        mig_current=False,
        mig_pending=False,
        ecc_enabled=True,
        ecc_pending=True,
        ecc=EccCounts(0, 0, 0, 0),
        remapped_rows=RemappedRows(0, 0, False, False),
        temperature_c=35,
        slowdown_temp_c=87,
        shutdown_temp_c=92,
        power_w=70.0,
        power_limit_w=700.0,
        clocks_event_reasons=CLOCKS_EVENT_GPU_IDLE,
        pcie=PcieLink(5, 5, 16, 16),
        nvlinks=[NvLink(link, True, 0, 0, 0, 0) for link in range(18)],
        fabric=FabricInfo(state=3, status=0, health_summary=1, clique_id=1),
    )


def ib_hca(index: int, *, rate: float = 400.0) -> IbHca:
    port = IbPort(1, "ACTIVE", "LinkUp", rate, f"{rate:g} Gb/sec (4X NDR)", "InfiniBand",
                  dict.fromkeys(IB_COUNTERS, 0))
    return IbHca(f"mlx5_{index}", "28.39.1002", "MT_0000000838", "MT4129", [port])


def make_facts(node: str = "gpu-h100-001", *, gpus: int = 8, ib_ports: int = 8,
               collected_at: float = 1_790_000_000.0) -> NodeFacts:
    """A healthy 8x H100 SXM node with 8 NDR ports; tests mutate what they need."""
    return NodeFacts(
        node=node,
        collected_at=collected_at,
        nvml=NvmlFacts(True, None, "550.90.07", "12.4", gpus, [h100_gpu(i) for i in range(gpus)]),
        ib=IbFacts(True, [ib_hca(i) for i in range(ib_ports)]),
        versions=SoftwareVersions(cuda_runtime="12.4", cuda_toolkit="12.4.1", nccl="2.21.5",
                                  ofed="MLNX_OFED_LINUX-23.10-1.1.9.0", kernel="6.1.0-28-amd64"),
    )


class FakeSlurmClient:
    """In-memory Slurm for logic tests (the real one is tested on the mini-cluster)."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        from slurmgpu.slurm import NodeState

        self.states = {n: NodeState(n, "idle") for n in (nodes or ["gpu-n1"])}
        self.unreachable = False
        self.calls: list[tuple[str, ...]] = []
        self.jobs: dict[str, Any] = {}  # job id -> JobInfo (add_job)
        self.reserved: dict[str, Any] = {}  # reservation name -> Reservation

    def add_job(self, job_id: str, nodes: list[str], state: str = "RUNNING", user: str | None = None) -> Any:
        from slurmgpu.slurm import JobInfo

        job = JobInfo(job_id, state, user=user, nodes=tuple(nodes), batch_host=nodes[0] if nodes else None)
        self.jobs[job_id] = job
        return job

    def _check(self) -> None:
        from slurmgpu.slurm import SlurmUnreachable

        if self.unreachable:
            raise SlurmUnreachable("slurmctld unreachable after 3 tries: Unable to contact slurm controller")

    def node(self, name: str) -> Any:
        from slurmgpu.slurm import SlurmError

        self._check()
        if name not in self.states:
            raise SlurmError(f"no such node: {name}")
        return self.states[name]

    def nodes(self) -> list[Any]:
        self._check()
        return list(self.states.values())

    def drain(self, node: str, reason: str) -> None:
        self.node(node)
        self.calls.append(("drain", node, reason))
        self.states[node] = dataclasses.replace(self.states[node], flags=frozenset({"DRAIN"}), reason=reason,
                                                reason_time=1.0)

    def resume(self, node: str) -> None:
        self.node(node)
        self.calls.append(("resume", node))
        self.states[node] = dataclasses.replace(self.states[node], flags=frozenset(), reason=None)

    def reboot(self, node: str, reason: str) -> None:
        """Like ``scontrol reboot ASAP nextstate=RESUME``: drained, reboot requested."""
        self.node(node)
        self.calls.append(("reboot", node, reason))
        self.states[node] = dataclasses.replace(
            self.states[node], flags=frozenset({"DRAIN", "REBOOT_REQUESTED"}), reason=reason,
            reason_time=1.0)

    def jobs_on_node(self, node: str) -> list[Any]:
        self._check()
        return [j for j in self.jobs.values() if node in j.nodes and j.state in ("RUNNING", "COMPLETING")]

    def job(self, job_id: str) -> Any:
        from slurmgpu.slurm import JobGone

        self._check()
        if job_id not in self.jobs:
            raise JobGone(f"no such job: {job_id}")
        return self.jobs[job_id]

    def signal_job(self, job_id: str, signal: str = "USR1", *, full: bool = False) -> None:
        self._check()
        self.calls.append(("signal", job_id, signal, str(full)))

    def requeue(self, job_id: str) -> None:
        self._check()
        self.calls.append(("requeue", job_id))
        if job_id in self.jobs:
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], state="PENDING", nodes=(),
                                                    restart_count=self.jobs[job_id].restart_count + 1)

    def set_admin_comment(self, job_id: str, comment: str) -> None:
        self._check()
        self.calls.append(("admin_comment", job_id, comment))

    # ---- return to service (the real calls: slurmgpu.slurm.cli, tested on the mini-cluster)

    def reboot_and_hold(self, node: str, reason: str) -> None:
        """Like ``scontrol reboot ASAP nextstate=DOWN``: drained, reboot requested."""
        self.reboot(node, reason)
        self.calls[-1] = ("reboot_and_hold", node, reason)

    def reservations(self) -> list[Any]:
        self._check()
        return list(self.reserved.values())

    def create_reservation(self, node: str, *, duration_min: int, users: Any) -> Any:
        from slurmgpu.slurm import Reservation
        from slurmgpu.slurm.owned import reservation_name

        self.node(node)
        name = reservation_name(node)
        reserved = self.reserved
        if name not in reserved:
            self.calls.append(("create_reservation", node, str(duration_min)))
            reserved[name] = Reservation(name, (node,), frozenset({"MAINT", "IGNORE_JOBS"}), tuple(users), "ACTIVE")
        return reserved[name]

    def delete_reservation(self, name: str) -> bool:
        self._check()
        self.calls.append(("delete_reservation", name))
        return self.reserved.pop(name, None) is not None

    def submit_validation(self, node: str, command: Any, *, reservation: str, time_limit_min: int,
                          output: str = "/dev/null") -> str:
        from slurmgpu.slurm import SlurmError
        from slurmgpu.slurm.owned import service_users, validation_job_name

        self.node(node)
        if reservation not in self.reserved:
            raise SlurmError(f"sbatch of the validation failed: no such reservation ({reservation})")
        job_id = str(1000 + len(self.jobs))
        self.calls.append(("submit_validation", node, reservation, " ".join(command)))
        job = self.add_job(job_id, [node], state="PENDING", user=service_users()[-1])
        self.jobs[job_id] = dataclasses.replace(job, name=validation_job_name(node))
        return job_id

    def submit_idle_validation(self, node: str, command: Any, *, qos: str = "", partition: str = "",
                               time_limit_min: int, start_within_min: int) -> str:
        from slurmgpu.slurm.owned import ENDED_JOB_STATES, idle_job_name, service_users

        self.node(node)
        name = idle_job_name(node)
        active = [j for j in self.jobs.values() if j.name == name and j.state not in ENDED_JOB_STATES]
        if active:
            return str(active[0].job_id)
        job_id = str(1000 + len(self.jobs))
        self.calls.append(("submit_idle_validation", node, qos or partition, " ".join(command)))
        job = self.add_job(job_id, [node], state="PENDING", user=service_users()[-1])
        self.jobs[job_id] = dataclasses.replace(job, name=name)
        return job_id

    def all_jobs(self) -> list[Any]:
        return list(self.jobs.values())

    def cancel_job(self, job_id: str) -> None:
        self._check()
        self.calls.append(("cancel_job", job_id))
        if job_id in self.jobs and self.jobs[job_id].state in ("PENDING", "RUNNING"):
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], state="CANCELLED")
