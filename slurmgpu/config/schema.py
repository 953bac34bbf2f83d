"""The settings model: every key the TOML file may set, its type and default.

The loader (``slurmgpu.config.load``) validates a file against these
dataclasses: a key not declared here is an error (with a did-you-mean), and a
value whose type does not match the annotation is an error naming the key.
Top-level tables map to the fields of ``Settings``; ``[[hosts]]`` sections may
set any of the same keys for the nodes in their ``nodes`` hostlist.

Every numeric setting carries its allowed range next to it:
``Annotated[float, Range(lo, hi)]`` (bounds inclusive). The loader refuses a value
outside it, and NaN or +-inf everywhere, because a number the code cannot act on
sanely (``heartbeat_s = inf``, ``interval_s = 0``, ``gpu.count = 10**26``) would
otherwise kill a thread, burn a CPU or overflow the store far from the file that
caused it. ``slurmgpu config ranges`` prints them all (docs/config-ranges.md).
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from slurmgpu.record import record


@record(frozen=True)
class Range:
    """The allowed values of a numeric setting: ``lo <= value <= hi``, finite. ``off``:
    one more value outside that span that means "disabled" (``slurm_poll_s = 0``), so
    that "off" does not drag the span down to values that would busy-loop."""

    lo: float
    hi: float
    off: float | None = None

    def __contains__(self, value: object) -> bool:
        # int and float compare exactly in Python, so a huge int is never rounded into range.
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        return value == self.off or self.lo <= value <= self.hi

    def describe(self, lead: str = "") -> str:
        """ "0.05 to 3600", "0 (off) or 1 to 86400"; ``lead`` goes before the span."""
        span = f"{lead}{_num(self.lo)} to {_num(self.hi)}"
        return span if self.off is None else f"{_num(self.off)} (off) or {span}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


DAY = 86400
# Error-counter thresholds (ECC, NVLink, InfiniBand, PCIe replays): a billion errors is
# "never" for any real counter, and anything above cannot be stored as a sane int.
COUNTER = Range(0, 1_000_000_000)
FRACTION = Range(0, 1)
# A command or query that may wait this long: > 0 (0 would never succeed) and at most an
# hour, past which a hung slurmctld looks like a hung node.
TIMEOUT = Range(0.05, 3600)
# The prolog/epilog watchdogs: any positive value is a working watchdog (a tiny one just
# always trips, which the fail-open/fail-closed tests rely on); an hour at most.
HOOK_TIMEOUT = Range(0.001, 3600)
# Agent <-> collector heartbeats: below 0.1 s they flood the link, above an hour a
# node's silence goes unseen (inf killed the agent's link thread).
HEARTBEAT = Range(0.1, 3600)

SeverityName = Literal["warn", "fail"]
MigMode = Literal["disabled", "enabled", "any"]


@record
class GpuSettings:
    """The ``[gpu]`` table: how many GPUs, persistence mode, MIG."""

    # Expected GPUs on the node. None: do not check the count. 0: this node has no GPUs,
    # so a missing NVML library is fine. Up to 1024 (no node comes near it).
    count: Annotated[int | None, Range(0, 1024)] = None
    # Require persistence mode (avoids slow first-contact init and lost state between jobs).
    persistence: bool = True
    mig: MigMode = "any"
    # GPU models every GPU must be, as NVML names them ("NVIDIA H100 80GB HBM3"); globs
    # allowed ("NVIDIA H100*"). Empty: not checked.
    model: list[str] = field(default_factory=list)


@record
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


@record
class EccSettings:
    """The ``[ecc]`` table: ECC mode and error-counter limits."""

    require_enabled: bool = True
    # Volatile (since last reset) uncorrected errors above this fail the node.
    uncorrected_volatile_max: Annotated[int, COUNTER] = 0
    # Aggregate (lifetime) uncorrected errors above this warn. None: not checked.
    uncorrected_aggregate_max: Annotated[int | None, COUNTER] = None
    corrected_volatile_max: Annotated[int, COUNTER] = 10000
    # Needs a previous sample (the agent keeps one); errors per hour.
    corrected_rate_per_hour_max: Annotated[float, COUNTER] = 1000.0
    # SRAM (on-chip) ECC errors past the driver's field-diagnostic threshold (R550+):
    # NVIDIA's guidance is field diagnostics and likely RMA.
    sram_threshold_severity: SeverityName = "fail"


@record
class MemorySettings:
    """The ``[memory]`` table: retired pages and row remapping."""

    # Retired pages (SBE + DBE) above this fail; NVIDIA's RMA guidance is 60 (of 64 slots).
    retired_pages_max: Annotated[int, Range(0, 1024)] = 60
    # Uncorrectable remapped rows above this fail (the bank is running out of spares).
    row_remap_uncorrectable_max: Annotated[int, Range(0, 1_000_000)] = 8
    # A pending retirement/remap needs a GPU reset before it takes effect.
    pending_severity: SeverityName = "fail"


@record
class ThermalSettings:
    """The ``[thermal]`` table: temperatures and clock brakes."""

    # Degrees below the slowdown threshold at which to warn, and to fail.
    margin_warn_c: Annotated[int, Range(0, 150)] = 5
    margin_fail_c: Annotated[int, Range(0, 150)] = 0
    # Severity for an active hardware slowdown, HW thermal slowdown or power brake.
    hw_throttle_severity: SeverityName = "warn"
    sw_thermal_severity: SeverityName = "warn"
    # Clock brake: SM clock below this fraction of its maximum while HW slowdown / power
    # brake is active. One sample warns; two polls in a row, or throttle time of at least
    # brake_fail_s between polls (NVML violation counters), fail.
    brake_fraction: Annotated[float, FRACTION] = 0.5
    brake_fail_s: Annotated[float, Range(0, 3600)] = 10.0
    # One-shot checks (`check`, the cold prolog/epilog/healthcheck) have no previous poll:
    # where the first sample shows a clock brake, the braked GPUs are sampled again this many
    # seconds later, so a held brake fails there too (0: never; a healthy node never waits).
    brake_resample_s: Annotated[float, Range(0, 5)] = 1.0


@record
class PcieSettings:
    """The ``[pcie]`` table: link generation, width and replays."""

    # Pinned expectation; None: compare against the GPU's own maximum. Gen 1-7 and
    # width x1-x32 are all the PCIe specification defines.
    gen: Annotated[int | None, Range(1, 7)] = None
    width: Annotated[int | None, Range(1, 32)] = None
    # Current below the device maximum (GPUs drop link gen at idle: width is what matters).
    downtrained_severity: SeverityName = "warn"
    below_pin_severity: SeverityName = "fail"
    # Idle GPUs legitimately lower link generation to save power; only width counts then.
    check_gen_when_idle: bool = False
    # PCIe replays per minute between two samples above this warn (DCGM's default is 8).
    replay_rate_per_min_max: Annotated[float, COUNTER] = 8.0
    replay_severity: SeverityName = "warn"


@record
class NvlinkSettings:
    """The ``[nvlink]`` table: NVLink state and error counters."""

    # Active links expected per GPU. None: every link NVML reports must be active.
    links: Annotated[int | None, Range(0, 64)] = None
    replay_max: Annotated[int, COUNTER] = 1000
    recovery_max: Annotated[int, COUNTER] = 10
    crc_flit_max: Annotated[int, COUNTER] = 1000
    crc_data_max: Annotated[int, COUNTER] = 100
    errors_severity: SeverityName = "warn"


@record
class FabricSettings:
    """The ``[fabric]`` table: the NVSwitch fabric."""

    # None: check only where NVML reports a fabric (NVSwitch systems); True: require one.
    required: bool | None = None


@record
class IbSettings:
    """The ``[ib]`` table: InfiniBand ports, rates and counters."""

    # Ports expected in scope (see devices): each one must be ACTIVE/LinkUp (ib.port_state),
    # so this is the number of ports expected active. None: do not check.
    count: Annotated[int | None, Range(0, 256)] = None
    # Expected rate per port in Gb/s (e.g. 400 for NDR). None: do not check.
    rate_gbps: Annotated[float | None, Range(1, 10_000)] = None
    # Ports in scope: "<device glob>" (every port of the matching /sys/class/infiniband
    # devices) or "<device glob>/<port glob>" ("mlx5_0/1", "mlx4_*/1"). Ports whose link
    # layer is Ethernet are out of scope unless include_ethernet, whatever their name.
    devices: list[str] = field(default_factory=lambda: ["*"])
    include_ethernet: bool = False
    # Absolute counter ceilings (counter name -> max); above raises counters_severity.
    counters_max: dict[str, Annotated[int, COUNTER]] = field(default_factory=lambda: {
        "symbol_error": 1000,
        "link_downed": 5,
        "link_error_recovery": 100,
        "port_rcv_errors": 1000,
        "local_link_integrity_errors": 10,
        "excessive_buffer_overrun_errors": 10,
    })
    # Growth since the previous sample (counter name -> max delta); above raises counters_severity.
    counters_delta_max: dict[str, Annotated[int, COUNTER]] = field(default_factory=lambda: {
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
    flap_window_s: Annotated[float, Range(1, DAY)] = 300.0
    flap_count: Annotated[int, Range(1, 1000)] = 2
    flap_strikes: Annotated[int, Range(1, 1000)] = 2
    # RoCE: read ports/<n>/hw_counters (driver counters) of Ethernet ports in scope (so
    # include_ethernet too) and warn when one grows by more than hw_counters_delta_max
    # between two samples (ib.roce_counters). Off by default: the names are the driver's.
    roce_hw_counters: bool = False
    hw_counters_delta_max: dict[str, Annotated[int, COUNTER]] = field(default_factory=lambda: {
        "local_ack_timeout_err": 10,  # transport retries ran out: lost packets, a bad link
        "req_cqe_error": 10,  # requests completed in error
        "rnr_nak_retry_err": 10,  # receiver not ready, retries exhausted
        "out_of_sequence": 1000,  # dropped packets seen by the responder
    })


XidAction = Literal["ignore", "warn", "checkpoint", "drain", "reset", "reboot"]


@record
class XidSettings:
    """The ``[xid]`` table: the XID policy and the kernel-log look-back."""

    # Site overrides of the bundled policy table: XID number (as a string key) -> action.
    overrides: dict[str, XidAction] = field(default_factory=dict)
    # Action for an XID the table does not know.
    unknown_action: XidAction = "warn"
    # How far back the hooks, `check` and a starting agent read the kernel log's XIDs: at
    # most this long, never before the boot or the last epilog that judged those GPUs.
    kernel_log_lookback_s: Annotated[float, Range(0, 7 * 86400)] = 3600.0


@record
class DiskSettings:
    """host.disk (NHC's check_fs_free and check_fs_mount_rw)."""

    # Path -> least free space on the file system holding it: a share ("3%") or a size
    # ("10G", "500M", "2T"; powers of 1024). A path that does not exist is skipped.
    free_min: dict[str, str] = field(default_factory=lambda: {"/tmp": "1%", "/var": "1%"})
    # Paths whose file system must be mounted read-write.
    writable: list[str] = field(default_factory=lambda: ["/tmp", "/var"])
    free_severity: SeverityName = "fail"


@record
class ServicesSettings:
    """host.services: systemd units the GPUs depend on, read with ``systemctl show``."""

    # Units that must be active on every GPU node (besides the automatic ones below). A
    # site running DCGM adds "nvidia-dcgm" (or "nv-hostengine").
    required: list[str] = field(default_factory=lambda: ["nvidia-persistenced"])
    # nvidia-fabricmanager: None: where the driver shows NVSwitches; true/false: always/never.
    fabricmanager: bool | None = None
    # nvidia-imex: None: where nvidia-imex is installed (GB200/GB300 NVL); true/false.
    imex: bool | None = None
    # A unit restarted by systemd this many times (NRestarts) warns; rising between two
    # polls of the agent, or restarting now (auto-restart), fails.
    restarts_max: Annotated[int, Range(1, 1_000_000)] = 3
    # `systemctl show` must answer within this; otherwise the check is UNKNOWN.
    timeout_s: Annotated[float, TIMEOUT] = 3.0


@record
class NvswitchSettings:
    """The ``[nvswitch]`` table: NVSwitch SXids."""

    # nvswitch.sxid: a fatal SXid counts since boot (until the NVSwitch is reset); a
    # non-fatal or notable one only within this many seconds.
    nonfatal_window_s: Annotated[float, Range(1, 30 * DAY)] = 3600.0


@record
class RdmaSettings:
    """The ``[rdma]`` table: GPUDirect RDMA."""

    # rdma.gpudirect: require GPUDirect RDMA (nvidia_peermem loaded, or dma-buf: the open
    # kernel module on Linux 5.12+). Off: not checked.
    gpudirect: bool = False
    gpudirect_severity: SeverityName = "fail"


@record
class ChecksSettings:
    """The ``[checks]`` table: disabled checks and site plugins."""

    # Check ids (or globs like "ib.*") that do not run on these nodes.
    disabled: list[str] = field(default_factory=list)
    # Load site checks from the "slurmgpu.checks" entry points (docs/adding-a-check.md);
    # false: scan for none and import none.
    plugins: bool = True


@record
class NvmlSettings:
    """The ``[nvml]`` table: the NVML library."""

    # Absolute path of libnvidia-ml.so.1; SLURMGPU_NVML_LIBRARY overrides it.
    library: str | None = None
    # A GPU query that fails (other than NotSupported) is asked once more after this many
    # seconds in the same run: an error on both reads is persistent (FAIL). 0: no retry.
    retry_delay_s: Annotated[float, Range(0, 10)] = 0.2
    # Every NVML query answers within this many seconds, or its GPU is "not responding"
    # (gpu.responsive FAIL) and the gather goes on without it (docs/reliability.md).
    query_deadline_s: Annotated[float, Range(0.1, 600)] = 5.0


@record
class VersionsSettings:
    """The ``[versions]`` table: where software versions are read."""

    nccl_library: str | None = None  # default: linker path, then the nvidia-nccl-cu* wheel
    cudart_library: str | None = None
    cuda_root: str = "/usr/local/cuda"


OnError = Literal["fail-open", "fail-closed"]


@record
class PrologSettings:
    """The ``[prolog]`` table: the Prolog hook."""

    # The whole prolog (gather + checks + drain) is bounded by this watchdog; its Slurm
    # calls (tries and pauses) get half of it at most (slurmgpu.gate.SLURM_SHARE).
    timeout_s: Annotated[float, HOOK_TIMEOUT] = 20.0
    # An internal error or timeout before a verdict: fail-open lets the job run (loud log
    # line, reason recorded) so a slurmgpu bug can never drain a cluster; fail-closed
    # drains. After a FAIL verdict a timeout refuses the job whatever this says.
    on_error: OnError = "fail-open"
    # Drain the node when the gate fails (off: only refuse the job).
    drain: bool = True


@record
class EpilogSettings:
    """The ``[epilog]`` table: the Epilog hook."""

    timeout_s: Annotated[float, HOOK_TIMEOUT] = 30.0
    on_error: OnError = "fail-open"
    drain: bool = True
    # Processes still holding the job's GPUs after it ended: ignore, report or kill.
    strays: Literal["ignore", "report", "kill"] = "report"
    # GPU device node; {index} is the GPU index.
    device_pattern: str = "/dev/nvidia{index}"
    # Holders that are never strays: node daemons keep /dev/nvidia* open by design. An
    # entry names an executable (the name of /proc/PID/exe is it or starts with it), never
    # a command line. Only processes of the job's user count as strays.
    strays_ignore: list[str] = field(default_factory=lambda: [
        "slurmgpu", "nvidia-persistenced", "nv-hostengine", "dcgm"])


@record
class HealthcheckSettings:
    """The ``[healthcheck]`` table: the HealthCheckProgram hook."""

    # Resume nodes drained by slurmgpu once they check healthy again.
    resume: bool = True


@record
class SlurmSettings:
    """The ``[slurm]`` table: how slurmgpu talks to Slurm."""

    # Directory holding scontrol/squeue/sinfo/scancel (default: PATH, then /usr/bin).
    bin_dir: str | None = None
    # Tries for a command when slurmctld does not answer (at least 1), and the pause
    # between them. In a prolog or epilog all tries and pauses end within half of its
    # timeout_s (cut short when they would not): the defaults, 2 x 4 s + 1 s, fit the
    # default prolog's 20 s.
    retries: Annotated[int, Range(1, 100)] = 2
    retry_delay_s: Annotated[float, Range(0, 600)] = 1.0
    command_timeout_s: Annotated[float, TIMEOUT] = 4.0


@record
class PathsSettings:
    """The ``[paths]`` table: state directory and kernel log."""

    # Per-job state (prolog -> epilog), pending actions; SLURMGPU_STATE_DIR overrides.
    state_dir: str = "/var/lib/slurmgpu"
    # Kernel log to read XIDs from; SLURMGPU_KMSG overrides.
    kmsg: str = "/dev/kmsg"


@record
class AgentSettings:
    """The ``[agent]`` table: the node agent."""

    # Full poll of every fact (checks run on each); NVML events arrive in between.
    # At least 1 s: 0 made the poll loop spin (87 % of a CPU).
    interval_s: Annotated[float, Range(1, 3600)] = 15.0
    # Software versions (NCCL, CUDA, OFED) change rarely and cost more: refreshed this often.
    versions_interval_s: Annotated[float, Range(1, DAY)] = 300.0
    # Reports carry the node's full facts (~13 KB for 8 GPUs) this often, and whenever the
    # verdict changes; the others carry the verdict, findings and summary (~1 KB) and the
    # collector keeps the last facts. 0: facts in every report.
    full_report_s: Annotated[float, Range(1, DAY, off=0)] = 600.0
    # Local query socket for the prolog/epilog (root and slurm_user only).
    socket: str = "/run/slurmgpu/agent.sock"
    slurm_user: str = "slurm"
    # A cached verdict older than this is refreshed (just the requested GPUs) before answering.
    max_age_s: Annotated[float, Range(0, 3600)] = 30.0
    # The prolog waits this long for the agent before falling back to the direct path.
    query_timeout_s: Annotated[float, Range(0.05, 60)] = 0.5
    # Outgoing messages wait here until the collector acknowledges them.
    spool_dir: str = "/var/spool/slurmgpu"
    spool_max_mb: Annotated[float, Range(1, 1_048_576)] = 64.0
    heartbeat_s: Annotated[float, HEARTBEAT] = 5.0
    # NVML event watching (XID, ECC, clock changes) in a thread.
    events: bool = True
    # flap_window_s, flap_count and flap_strikes moved to [ib]; the loader reads them here too.
    # Per-job directories (<jobs_dir>/<job id>/checkpoint): made by the prolog, owned by
    # the job's user, moved into <jobs_dir>/.trash by the epilog and deleted within a
    # budget (jobfiles.sweep_trash); SLURMGPU_JOBS_DIR overrides.
    jobs_dir: str = "/run/slurmgpu/jobs"
    # While a checkpoint request is open, look for the job's ack this often.
    checkpoint_poll_s: Annotated[float, Range(0.01, 60)] = 0.25
    # Collector unreachable and a drain-now-class event (GPU lost, XID 79): signal the
    # jobs' local processes with this signal ("" turns the fallback off).
    fallback_signal: str = "USR1"


@record
class CollectorSettings:
    """The ``[collector]`` table: the fleet collector."""

    # Where agents connect (the head node), and what the collector binds. ``address``: one
    # endpoint, or a list of them for two or more collectors sharing one PostgreSQL
    # database and one keys_dir (one server key). An agent connects to the first and moves
    # to the next, round-robin, when the one it is on is silent for three heartbeats; it
    # stays on the one that works (docs/postgresql.md, "Two or more collectors").
    address: str | list[str] = "tcp://localhost:7150"
    bind: str = "tcp://*:7150"
    db: str = "/var/lib/slurmgpu/fleet.db"
    # CURVE keys: collector keypair, node keypairs, allow-list (see `slurmgpu keys`).
    keys_dir: str = "/etc/slurmgpu/keys"
    heartbeat_s: Annotated[float, HEARTBEAT] = 5.0
    # A node silent for this many heartbeat intervals is marked unreachable.
    unreachable_after: Annotated[int, Range(1, 1000)] = 3
    # At least 1: 0 would prune every stored report at the next sweep.
    retention_days: Annotated[int, Range(1, 36_500)] = 90
    # Prometheus /metrics ("host:port"; "" = off), e.g. "127.0.0.1:9750".
    metrics_bind: str = ""
    # Serve /metrics over TLS with this certificate and key (PEM files; both or neither),
    # and with metrics_client_ca, only to clients with a certificate that CA signed.
    metrics_tls_cert: str = ""
    metrics_tls_key: str = ""
    metrics_client_ca: str = ""
    # Per-node history for `slurmgpu report`: counts (reports, throttled reports) per interval.
    sample_interval_s: Annotated[float, Range(1, DAY)] = 3600.0
    # Ask Slurm for drained/resumed nodes this often (the report's drain history); 0 = never.
    # Otherwise at least 1 s, so "almost off" cannot hammer slurmctld.
    slurm_poll_s: Annotated[float, Range(1, DAY, off=0)] = 60.0
    # Several collectors on one PostgreSQL database: a leader (the one running the
    # automation) that died or was cut off is replaced within this many seconds.
    leader_timeout_s: Annotated[float, Range(2, 600)] = 10.0
    # A second port, on the same hosts as address/bind, for events and command results only
    # (a fault, a job's checkpoint ack): they are not queued behind the reports thousands
    # of agents send at once after an outage. 0 = off (they go with the reports). The
    # collector runs without it (logged) when it cannot bind it; agents send there only
    # once connected, so a closed port costs nothing but the latency it was meant to save.
    events_port: Annotated[int, Range(0, 65535)] = 7151
    # Frames an agent draining a backlog may send in one message (its acks offer this);
    # 1 = one at a time. A round over the fleet's backlogs (nodes x bundle frames) should
    # take well under the unreachable window at the drain rate (docs/benchmarks.md).
    bundle: Annotated[int, Range(1, 256)] = 16
    # `slurmgpu validate` results: a node this fraction below the fleet median (same GPU
    # model and measurement) gets a validate.straggler WARN, once this many nodes have results.
    straggler_fraction: Annotated[float, FRACTION] = 0.15
    straggler_min_nodes: Annotated[int, Range(2, 100_000)] = 3

    @property
    def addresses(self) -> list[str]:
        """``address`` as a list: the collectors an agent tries, in order."""
        return [self.address] if isinstance(self.address, str) else list(self.address)

    def events_endpoint(self, endpoint: str) -> str | None:
        """``endpoint`` (an address or the bind) with ``events_port`` for its port; None when
        there is no events port (0) or the endpoint has no port to replace (ipc://)."""
        return with_port(endpoint, self.events_port) if self.events_port else None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def free_threshold(text: str) -> tuple[float, str]:
    """``"3%"`` -> (3.0, "%"); ``"10G"`` -> (10 * 2**30, "B"). ValueError on anything else."""
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    if raw.endswith("%"):
        share = float(raw[:-1])
        if not 0 <= share <= 100:
            raise ValueError(f"share out of range: {text!r} (0% to 100%)")
        return share, "%"
    number, unit = (raw[:-1], raw[-1]) if raw[-1:] in tuple("KMGTP") else (raw, "")
    size = float(number) * _SIZE_UNITS[unit]
    if not 0 <= size < 1 << 60:
        raise ValueError(f"size out of range: {text!r}")
    return size, "B"


def with_port(endpoint: str, port: int) -> str | None:
    """``tcp://HOST:PORT`` with another port; None for any other endpoint."""
    head, sep, old = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not (old.isdigit() or old == "*"):
        return None
    return f"{head}:{port}"


AutomationAction = Literal["none", "warn", "checkpoint", "drain", "drain-now", "reboot"]


@record
class AutomationSettings:
    """The collector's automatic drains/resumes (``slurmgpu.collector.policy``)."""

    # Run the automation in the collector (off: the collector only records).
    enabled: bool = False
    # Record every decision but make no Slurm call.
    dry_run: bool = False
    # Allow the "reboot" action (XIDs the table marks reboot); otherwise such nodes drain.
    reboot_allowed: bool = False
    # Consecutive reports with a strike-counted WARN (thermal.throttle) before it drains.
    strikes: Annotated[int, Range(1, 1000)] = 3
    # Site overrides: "check" or "check:SEVERITY" -> action.
    policy: dict[str, AutomationAction] = field(default_factory=dict)
    # Circuit breaker: at most this fraction of the fleet drained by slurmgpu at once ...
    max_fraction: Annotated[float, FRACTION] = 0.10
    # ... and at most this many new drains in any rolling hour.
    max_per_hour: Annotated[int, Range(0, 10_000)] = 5
    # The same check failing on this fraction of the fleet within the window trips it at once.
    storm_fraction: Annotated[float, FRACTION] = 0.25
    storm_window_s: Annotated[float, Range(1, DAY)] = 300.0
    # The breaker's floor for small fleets: up to this many nodes may be drained by slurmgpu
    # at once whatever max_fraction gives, and this many nodes failing one check are not a
    # storm whatever storm_fraction gives; but the floor never covers the whole fleet (at
    # most fleet - 1 nodes). 1: the fractions alone (at least one drain, storms from 2).
    min_nodes: Annotated[int, Range(1, 100_000)] = 2
    # Auto-resume: this many consecutive OK reports spanning at least resume_after_s.
    resume_healthy_reports: Annotated[int, Range(1, 1000)] = 3
    resume_after_s: Annotated[float, Range(0, 30 * DAY)] = 600.0
    # Lemon: this many drains within the window -> stays drained, never auto-resumed.
    lemon_drains: Annotated[int, Range(1, 1000)] = 3
    lemon_window_s: Annotated[float, Range(1, 365 * DAY)] = 7 * 86400.0
    # Checkpoint coordination ("checkpoint" and "drain-now" actions on a node running jobs):
    # the signal sent to each job (scancel --signal), to the batch shell or, with
    # checkpoint_full, to every process of the job ...
    checkpoint_signal: str = "USR1"
    checkpoint_full: bool = False
    # ... and how long a job has to ack before the node is drained (and, for drain-now,
    # the job requeued) anyway.
    checkpoint_deadline_s: Annotated[float, Range(1, DAY)] = 300.0


@record
class ReportSettings:
    """The nightly fleet report (`slurmgpu report-nightly`, daemon/slurmgpu-report.timer)."""

    # Where YYYY-MM-DD.html and .json are written.
    dir: str = "/var/lib/slurmgpu/reports"
    # Reports dated more than this many days ago are deleted at each run (0: keep all).
    keep_days: Annotated[int, Range(0, 36_500)] = 90
    # Recipients of the nightly mail (Markdown report as the body, HTML attached); [] = no mail.
    mail_to: list[str] = field(default_factory=list)
    mail_from: str = "slurmgpu@localhost"
    # SMTP relay host; "" = hand the mail to the local `sendmail -t` below.
    smtp_host: str = ""
    smtp_port: Annotated[int, Range(1, 65_535)] = 25
    sendmail: str = "/usr/sbin/sendmail"
    # {date} and any key of the report's summary: {availability_pct}, {drains}, {drained_at_end}, ...
    subject: str = "slurmgpu fleet report {date}: {availability_pct}% available, {drains} drains"


HangSeverity = Literal["warn", "fail", "unknown"]
Tier = Literal["quick", "full"]
BANDWIDTH = Range(0.001, 100_000)  # GB/s or Gb/s: well past any link that exists


@record
class ValidateSettings:
    """`slurmgpu validate` (docs/validation.md): budgets, floors in GB/s, Gb/s (InfiniBand)
    and TFLOP/s (None: the GPU model's built-in floor), outliers, stragglers."""

    # Total wall time of a tier (every test together); validate ends within it + ~2 s.
    quick_budget_s: Annotated[float, TIMEOUT] = 60.0
    full_budget_s: Annotated[float, TIMEOUT] = 900.0
    # One test's hard limit (its process group is killed then); capped by what is left.
    quick_test_timeout_s: Annotated[float, TIMEOUT] = 20.0
    full_test_timeout_s: Annotated[float, TIMEOUT] = 300.0
    # How long the GEMM burn / bandwidth loops run per test.
    quick_burn_s: Annotated[float, Range(0.01, 600)] = 5.0
    full_burn_s: Annotated[float, Range(0.01, 3600)] = 120.0
    # Share of free GPU memory the HBM write/verify pattern covers.
    quick_hbm_share: Annotated[float, FRACTION] = 0.1
    full_hbm_share: Annotated[float, FRACTION] = 0.8
    # dcgmi diag level per tier.
    quick_dcgm_level: Annotated[int, Range(1, 4)] = 1
    full_dcgm_level: Annotated[int, Range(1, 4)] = 3
    # What a test that did not finish in time is.
    hang_severity: HangSeverity = "fail"
    # Floors (None: the GPU model's built-in floor, or none).
    gemm_tflops: Annotated[float | None, Range(0.001, 100_000)] = None
    hbm_gbps: Annotated[float | None, BANDWIDTH] = None
    pcie_gbps: Annotated[float | None, BANDWIDTH] = None
    p2p_gbps: Annotated[float | None, BANDWIDTH] = None
    nccl_busbw_gbps: Annotated[float | None, BANDWIDTH] = None
    ib_gbps: Annotated[float | None, BANDWIDTH] = None
    # A GPU, GPU pair or IB pair this fraction below the node's median for the same
    # measurement fails (the slow one among identical parts, whatever the floors say).
    outlier_fraction: Annotated[float, FRACTION] = 0.25
    # InfiniBand: GPUDirect (ib_write_bw --use_cuda=<gpu>); tools' paths ("" = $PATH).
    ib_use_cuda: bool = False
    nccl_tests_dir: str = ""
    nvbandwidth: str = ""
    # The Python that runs the built-in probe ("": slurmgpu's own); one with CuPy or PyTorch.
    probe_python: str = ""
    # Idle-time validation (docs/remediation.md): every node is validated this often, as a
    # low-priority job in a preemptible QOS or partition that real work preempts; 0 = never.
    every_days: Annotated[float, Range(0.01, 365, off=0)] = 0.0
    idle_tier: Tier = "quick"
    idle_qos: str = ""
    idle_partition: str = ""


@record
class RemediationSettings:
    """Return to service (docs/remediation.md): a node slurmgpu drained passes validation in
    a maintenance reservation before it takes jobs again; on a fail it climbs the ladder
    GPU reset -> reboot -> repair hand-off. Each step: attempts (0 for reset or reboot
    skips that rung) and a backoff that doubles with each failed attempt."""

    enabled: bool = False
    # The validation tier run in the reservation, and how long the run may take.
    tier: Tier = "quick"
    validation_timeout_s: Annotated[float, Range(60, 2 * DAY)] = 1800.0
    # The reservation's duration (it ends on its own even if slurmgpu never deletes it).
    reservation_s: Annotated[float, Range(300, 7 * DAY)] = 7200.0
    validate_attempts: Annotated[int, Range(1, 100)] = 2
    validate_backoff_s: Annotated[float, Range(0, DAY)] = 300.0
    reset_attempts: Annotated[int, Range(0, 100)] = 1
    reset_backoff_s: Annotated[float, Range(0, DAY)] = 300.0
    reset_timeout_s: Annotated[float, Range(10, DAY)] = 600.0
    reboot_attempts: Annotated[int, Range(0, 100)] = 1
    reboot_backoff_s: Annotated[float, Range(0, DAY)] = 900.0
    # How long a rebooting node has to come back before the attempt counts as failed.
    reboot_timeout_s: Annotated[float, Range(60, 7 * DAY)] = 3600.0
    # Run with the repair ticket (JSON, docs/remediation.md) on stdin; "" = no hand-off
    # beyond the drain reason. Split like a shell line, not run by a shell.
    repair_command: str = ""
    repair_timeout_s: Annotated[float, TIMEOUT] = 60.0
    # Operator drains: validated before resume when their reason holds operator_tag, or
    # all of them with operator_drains.
    operator_drains: bool = False
    operator_tag: str = "[validate]"
    # slurmgpu on the nodes, as the validation and reset jobs run it (split like a shell
    # line): e.g. "sudo -n /usr/bin/slurmgpu" where a GPU reset needs root.
    job_program: str = "slurmgpu"


@record
class Settings:
    """Every table of the config file, each with its defaults."""

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
    disk: DiskSettings = field(default_factory=DiskSettings)
    services: ServicesSettings = field(default_factory=ServicesSettings)
    rdma: RdmaSettings = field(default_factory=RdmaSettings)
    nvswitch: NvswitchSettings = field(default_factory=NvswitchSettings)
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
    validate: ValidateSettings = field(default_factory=ValidateSettings)
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
