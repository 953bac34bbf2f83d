"""The settings model: every key the TOML file may set, its type and default.

The loader (``slurmgpu.config.load``) validates a file against these
dataclasses: a key not declared here is an error (with a did-you-mean), and a
value whose type does not match the annotation is an error naming the key.
Top-level tables map to the fields of ``Settings``; ``[[hosts]]`` sections may
set any of the same keys for the nodes in their ``nodes`` hostlist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SeverityName = Literal["warn", "fail"]
MigMode = Literal["disabled", "enabled", "any"]


@dataclass
class GpuSettings:
    # Expected GPUs on the node. None: do not check the count. 0: this node has no GPUs,
    # so a missing NVML library is fine.
    count: int | None = None
    # Require persistence mode (avoids slow first-contact init and lost state between jobs).
    persistence: bool = True
    mig: MigMode = "any"


@dataclass
class PinSettings:
    """Accepted versions. Each entry is an exact version ("550.54.15"), a glob ("550.*")
    or a minimum (">=2.21"). An empty list means not pinned."""

    driver: list[str] = field(default_factory=list)
    cuda: list[str] = field(default_factory=list)  # CUDA toolkit/runtime on the node
    cuda_driver: list[str] = field(default_factory=list)  # CUDA version the driver supports
    nccl: list[str] = field(default_factory=list)
    vbios: list[str] = field(default_factory=list)
    ib_firmware: list[str] = field(default_factory=list)
    ofed: list[str] = field(default_factory=list)
    # All GPUs on a node must share one VBIOS version.
    vbios_uniform: bool = True
    severity: SeverityName = "fail"


@dataclass
class EccSettings:
    require_enabled: bool = True
    # Volatile (since last reset) uncorrected errors above this fail the node.
    uncorrected_volatile_max: int = 0
    # Aggregate (lifetime) uncorrected errors above this warn. None: not checked.
    uncorrected_aggregate_max: int | None = None
    corrected_volatile_max: int = 10000
    # Needs a previous sample (the agent keeps one); errors per hour.
    corrected_rate_per_hour_max: float = 1000.0
    # SRAM (on-chip) ECC errors past the driver's field-diagnostic threshold (R550+):
    # NVIDIA's guidance is field diagnostics and likely RMA.
    sram_threshold_severity: SeverityName = "fail"


@dataclass
class MemorySettings:
    # Retired pages (SBE + DBE) above this fail; NVIDIA's RMA guidance is 60 (of 64 slots).
    retired_pages_max: int = 60
    # Uncorrectable remapped rows above this fail (the bank is running out of spares).
    row_remap_uncorrectable_max: int = 8
    # A pending retirement/remap needs a GPU reset before it takes effect.
    pending_severity: SeverityName = "fail"


@dataclass
class ThermalSettings:
    # Degrees below the slowdown threshold at which to warn, and to fail.
    margin_warn_c: int = 5
    margin_fail_c: int = 0
    # Severity for an active hardware slowdown, HW thermal slowdown or power brake.
    hw_throttle_severity: SeverityName = "warn"
    sw_thermal_severity: SeverityName = "warn"
    # Clock brake: SM clock below this fraction of its maximum while HW slowdown / power
    # brake is active. One sample warns; two polls in a row, or throttle time of at least
    # brake_fail_s between polls (NVML violation counters), fail.
    brake_fraction: float = 0.5
    brake_fail_s: float = 10.0


@dataclass
class PcieSettings:
    # Pinned expectation; None: compare against the GPU's own maximum.
    gen: int | None = None
    width: int | None = None
    # Current below the device maximum (GPUs drop link gen at idle: width is what matters).
    downtrained_severity: SeverityName = "warn"
    below_pin_severity: SeverityName = "fail"
    # Idle GPUs legitimately lower link generation to save power; only width counts then.
    check_gen_when_idle: bool = False
    # PCIe replays per minute between two samples above this warn (DCGM's default is 8).
    replay_rate_per_min_max: float = 8.0
    replay_severity: SeverityName = "warn"


@dataclass
class NvlinkSettings:
    # Active links expected per GPU. None: every link NVML reports must be active.
    links: int | None = None
    replay_max: int = 1000
    recovery_max: int = 10
    crc_flit_max: int = 1000
    crc_data_max: int = 100
    errors_severity: SeverityName = "warn"


@dataclass
class FabricSettings:
    # None: check only where NVML reports a fabric (NVSwitch systems); True: require one.
    required: bool | None = None


@dataclass
class IbSettings:
    # Ports expected in scope (see devices): each one must be ACTIVE/LinkUp (ib.port_state),
    # so this is the number of ports expected active. None: do not check.
    count: int | None = None
    # Expected rate per port in Gb/s (e.g. 400 for NDR). None: do not check.
    rate_gbps: float | None = None
    # Ports in scope: "<device glob>" (every port of the matching /sys/class/infiniband
    # devices) or "<device glob>/<port glob>" ("mlx5_0/1", "mlx4_*/1"). Ports whose link
    # layer is Ethernet are out of scope unless include_ethernet, whatever their name.
    devices: list[str] = field(default_factory=lambda: ["*"])
    include_ethernet: bool = False
    # Absolute counter ceilings (counter name -> max); above raises counters_severity.
    counters_max: dict[str, int] = field(default_factory=lambda: {
        "symbol_error": 1000,
        "link_downed": 5,
        "link_error_recovery": 100,
        "port_rcv_errors": 1000,
        "local_link_integrity_errors": 10,
        "excessive_buffer_overrun_errors": 10,
    })
    # Growth since the previous sample (counter name -> max delta); above raises counters_severity.
    counters_delta_max: dict[str, int] = field(default_factory=lambda: {
        "symbol_error": 100,
        "link_downed": 0,
        "link_error_recovery": 10,
        "port_rcv_errors": 100,
        "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0,
    })
    counters_severity: SeverityName = "warn"
    # ib.flap (the agent keeps the history): link_downed rising in `flap_count` samples
    # within `flap_window_s` is a strike (WARN); `flap_strikes` strikes fail the port.
    # Formerly [agent] flap_*; the loader still reads those names.
    flap_window_s: float = 300.0
    flap_count: int = 2
    flap_strikes: int = 2
    # RoCE: read ports/<n>/hw_counters (driver counters) of Ethernet ports in scope (so
    # include_ethernet too) and warn when one grows by more than hw_counters_delta_max
    # between two samples (ib.roce_counters). Off by default: the names are the driver's.
    roce_hw_counters: bool = False
    hw_counters_delta_max: dict[str, int] = field(default_factory=lambda: {
        "local_ack_timeout_err": 10,  # transport retries ran out: lost packets, a bad link
        "req_cqe_error": 10,  # requests completed in error
        "rnr_nak_retry_err": 10,  # receiver not ready, retries exhausted
        "out_of_sequence": 1000,  # dropped packets seen by the responder
    })


XidAction = Literal["ignore", "warn", "checkpoint", "drain", "reset", "reboot"]


@dataclass
class XidSettings:
    # Site overrides of the bundled policy table: XID number (as a string key) -> action.
    overrides: dict[str, XidAction] = field(default_factory=dict)
    # Action for an XID the table does not know.
    unknown_action: XidAction = "warn"


@dataclass
class ChecksSettings:
    # Check ids (or globs like "ib.*") that do not run on these nodes.
    disabled: list[str] = field(default_factory=list)


@dataclass
class NvmlSettings:
    # Absolute path of libnvidia-ml.so.1; SLURMGPU_NVML_LIBRARY overrides it.
    library: str | None = None
    # A GPU query that fails (other than NotSupported) is asked once more after this many
    # seconds in the same run: an error on both reads is persistent (FAIL). 0: no retry.
    retry_delay_s: float = 0.2


@dataclass
class VersionsSettings:
    nccl_library: str | None = None  # default: linker path, then the nvidia-nccl-cu* wheel
    cudart_library: str | None = None
    cuda_root: str = "/usr/local/cuda"


OnError = Literal["fail-open", "fail-closed"]


@dataclass
class PrologSettings:
    # The whole prolog (gather + checks + drain) is bounded by this watchdog.
    timeout_s: float = 10.0
    # An internal error or timeout: fail-open lets the job run (loud log line, reason
    # recorded) so a slurmgpu bug can never drain a cluster; fail-closed drains.
    on_error: OnError = "fail-open"
    # Drain the node when the gate fails (off: only refuse the job).
    drain: bool = True


@dataclass
class EpilogSettings:
    timeout_s: float = 30.0
    on_error: OnError = "fail-open"
    drain: bool = True
    # Processes still holding the job's GPUs after it ended: ignore, report or kill.
    strays: Literal["ignore", "report", "kill"] = "report"
    # GPU device node; {index} is the GPU index.
    device_pattern: str = "/dev/nvidia{index}"
    # Holders that are never strays (substrings of the command line): node daemons keep
    # /dev/nvidia* open by design. Only processes of the job's user count as strays.
    strays_ignore: list[str] = field(default_factory=lambda: [
        "slurmgpu", "nvidia-persistenced", "nv-hostengine", "dcgm"])


@dataclass
class HealthcheckSettings:
    # Resume nodes drained by slurmgpu once they check healthy again.
    resume: bool = True


@dataclass
class SlurmSettings:
    # Directory holding scontrol/squeue/sinfo/scancel (default: PATH, then /usr/bin).
    bin_dir: str | None = None
    # Tries for a command when slurmctld does not answer, and the pause between them.
    retries: int = 3
    retry_delay_s: float = 1.0
    command_timeout_s: float = 10.0


@dataclass
class PathsSettings:
    # Per-job state (prolog -> epilog), pending actions; SLURMGPU_STATE_DIR overrides.
    state_dir: str = "/var/lib/slurmgpu"
    # Kernel log to read XIDs from; SLURMGPU_KMSG overrides.
    kmsg: str = "/dev/kmsg"


@dataclass
class AgentSettings:
    # Full poll of every fact (checks run on each); NVML events arrive in between.
    interval_s: float = 15.0
    # Software versions (NCCL, CUDA, OFED) change rarely and cost more: refreshed this often.
    versions_interval_s: float = 300.0
    # Local query socket for the prolog/epilog (root and slurm_user only).
    socket: str = "/run/slurmgpu/agent.sock"
    slurm_user: str = "slurm"
    # A cached verdict older than this is refreshed (just the requested GPUs) before answering.
    max_age_s: float = 30.0
    # The prolog waits this long for the agent before falling back to the direct path.
    query_timeout_s: float = 0.5
    # Outgoing messages wait here until the collector acknowledges them.
    spool_dir: str = "/var/spool/slurmgpu"
    spool_max_mb: float = 64.0
    heartbeat_s: float = 5.0
    # NVML event watching (XID, ECC, clock changes) in a thread.
    events: bool = True
    # flap_window_s, flap_count and flap_strikes moved to [ib]; the loader reads them here too.
    # Per-job directories (<jobs_dir>/<job id>/checkpoint): made by the prolog, owned by
    # the job's user, removed by the epilog; SLURMGPU_JOBS_DIR overrides.
    jobs_dir: str = "/run/slurmgpu/jobs"
    # While a checkpoint request is open, look for the job's ack this often.
    checkpoint_poll_s: float = 0.25
    # Collector unreachable and a drain-now-class event (GPU lost, XID 79): signal the
    # jobs' local processes with this signal ("" turns the fallback off).
    fallback_signal: str = "USR1"


@dataclass
class CollectorSettings:
    # Where agents connect (the head node), and what the collector binds.
    address: str = "tcp://localhost:7150"
    bind: str = "tcp://*:7150"
    db: str = "/var/lib/slurmgpu/fleet.db"
    # CURVE keys: collector keypair, node keypairs, allow-list (see `slurmgpu keys`).
    keys_dir: str = "/etc/slurmgpu/keys"
    heartbeat_s: float = 5.0
    # A node silent for this many heartbeat intervals is marked unreachable.
    unreachable_after: int = 3
    retention_days: int = 90
    # Prometheus /metrics ("host:port"; "" = off), e.g. "0.0.0.0:9750".
    metrics_bind: str = ""
    # Per-node history for `slurmgpu report`: counts (reports, throttled reports) per interval.
    sample_interval_s: float = 3600.0
    # Ask Slurm for drained/resumed nodes this often (the report's drain history); 0 = never.
    slurm_poll_s: float = 60.0


AutomationAction = Literal["none", "warn", "checkpoint", "drain", "drain-now", "reboot"]


@dataclass
class AutomationSettings:
    """The collector's automatic drains/resumes (``slurmgpu.collector.policy``)."""

    # Run the automation in the collector (off: the collector only records).
    enabled: bool = False
    # Record every decision but make no Slurm call.
    dry_run: bool = False
    # Allow the "reboot" action (XIDs the table marks reboot); otherwise such nodes drain.
    reboot_allowed: bool = False
    # Consecutive reports with a strike-counted WARN (thermal.throttle) before it drains.
    strikes: int = 3
    # Site overrides: "check" or "check:SEVERITY" -> action.
    policy: dict[str, AutomationAction] = field(default_factory=dict)
    # Circuit breaker: at most this fraction of the fleet drained by slurmgpu at once ...
    max_fraction: float = 0.10
    # ... and at most this many new drains in any rolling hour.
    max_per_hour: int = 5
    # The same check failing on this fraction of the fleet within the window trips it at once.
    storm_fraction: float = 0.25
    storm_window_s: float = 300.0
    # Auto-resume: this many consecutive OK reports spanning at least resume_after_s.
    resume_healthy_reports: int = 3
    resume_after_s: float = 600.0
    # Lemon: this many drains within the window -> stays drained, never auto-resumed.
    lemon_drains: int = 3
    lemon_window_s: float = 7 * 86400.0
    # Checkpoint coordination ("checkpoint" and "drain-now" actions on a node running jobs):
    # the signal sent to each job (scancel --signal), to the batch shell or, with
    # checkpoint_full, to every process of the job ...
    checkpoint_signal: str = "USR1"
    checkpoint_full: bool = False
    # ... and how long a job has to ack before the node is drained (and, for drain-now,
    # the job requeued) anyway.
    checkpoint_deadline_s: float = 300.0


@dataclass
class ReportSettings:
    """The nightly fleet report (`slurmgpu report-nightly`, daemon/slurmgpu-report.timer)."""

    # Where YYYY-MM-DD.html and .json are written.
    dir: str = "/var/lib/slurmgpu/reports"
    # Reports dated more than this many days ago are deleted at each run (0: keep all).
    keep_days: int = 90
    # Recipients of the nightly mail (Markdown report as the body, HTML attached); [] = no mail.
    mail_to: list[str] = field(default_factory=list)
    mail_from: str = "slurmgpu@localhost"
    # SMTP relay host; "" = hand the mail to the local `sendmail -t` below.
    smtp_host: str = ""
    smtp_port: int = 25
    sendmail: str = "/usr/sbin/sendmail"
    # {date} and any key of the report's summary: {availability_pct}, {drains}, {drained_at_end}, ...
    subject: str = "slurmgpu fleet report {date}: {availability_pct}% available, {drains} drains"


@dataclass
class Settings:
    gpu: GpuSettings = field(default_factory=GpuSettings)
    pins: PinSettings = field(default_factory=PinSettings)
    ecc: EccSettings = field(default_factory=EccSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    thermal: ThermalSettings = field(default_factory=ThermalSettings)
    pcie: PcieSettings = field(default_factory=PcieSettings)
    nvlink: NvlinkSettings = field(default_factory=NvlinkSettings)
    fabric: FabricSettings = field(default_factory=FabricSettings)
    ib: IbSettings = field(default_factory=IbSettings)
    xid: XidSettings = field(default_factory=XidSettings)
    checks: ChecksSettings = field(default_factory=ChecksSettings)
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    versions: VersionsSettings = field(default_factory=VersionsSettings)
    prolog: PrologSettings = field(default_factory=PrologSettings)
    epilog: EpilogSettings = field(default_factory=EpilogSettings)
    healthcheck: HealthcheckSettings = field(default_factory=HealthcheckSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    paths: PathsSettings = field(default_factory=PathsSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    automation: AutomationSettings = field(default_factory=AutomationSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
