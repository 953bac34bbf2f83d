"""Gather facts -> run pure checks -> verdict.

``gather`` is the only step that touches hardware (through the sources);
``evaluate`` is pure over the facts and settings, so the agent, the prolog and
tests all call the same code. The hooks (``slurmgpu.gate.Gate``) ask a
``FactsProvider`` for their facts: ``SourceFacts`` (``gather`` over the node's
sources) on the cold path, the agent's cache on the warm path
(``slurmgpu.agent.local.CachedFacts``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from slurmgpu.checks.registry import CheckContext, CheckSpec, enabled_checks, unknown
from slurmgpu.config.env import apply_env
from slurmgpu.config.schema import Settings, ThermalSettings
from slurmgpu.facts import HostFacts, IbFacts, NodeFacts, NvmlFacts, SoftwareVersions, XidEvent
from slurmgpu.record import record
from slurmgpu.result import Finding, Severity, Verdict
from slurmgpu.sources import Clock, IbSource, NvmlSource, SystemClock, VersionSource, kmsg, procs
from slurmgpu.sources.host import HostSource
from slurmgpu.xid import XidPolicy


@record
class Sources:
    """The fact sources a gather reads."""

    nvml: NvmlSource
    ib: IbSource
    versions: VersionSource
    clock: Clock
    host: HostSource | None = None  # None: the host layers are not gathered


def system_sources(settings: Settings, *, sysfs_root: str | None = None,
                   versions_cache: str | None = None) -> Sources:
    """The node's real sources. ``versions_cache``: a file keeping NCCL/CUDA runtime
    versions between processes (one-shot commands pass one in the state dir; None, the
    default, loads the libraries on every collect, which keeps tests hermetic)."""
    from slurmgpu.sources.infiniband import SysfsIbSource
    from slurmgpu.sources.nvml import PynvmlSource
    from slurmgpu.sources.versions import SystemVersionSource

    ib = SysfsIbSource(sysfs_root or None, hw_counters=settings.ib.roce_hw_counters)
    versions = SystemVersionSource(settings.versions, cache_path=versions_cache)
    from slurmgpu.sources.deadline import DeadlineNvmlSource

    nvml = DeadlineNvmlSource(PynvmlSource(settings.nvml.library, retry_delay_s=settings.nvml.retry_delay_s),
                              settings.nvml.query_deadline_s)
    return Sources(nvml, ib, versions, SystemClock(), host_source(settings))


def host_source(settings: Settings) -> HostSource:
    """The host layers this node's settings ask for, under ``$SLURMGPU_HOST_ROOT`` (or /)."""
    from slurmgpu.sources.host import HostConfig, SystemctlReader, SystemHostSource, host_root

    root = host_root()
    config = HostConfig(settings.services.required, settings.services.fabricmanager, settings.services.imex,
                        sorted({*settings.disk.free_min, *settings.disk.writable}),
                        settings.paths.kmsg)
    reader = SystemctlReader(f"{root.rstrip('/')}/bin/systemctl", settings.services.timeout_s)
    return SystemHostSource(config, root=root, services=reader)


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name: ``SLURMD_NODENAME`` when ``environ`` (a hook's) has it, else the
    short host name."""
    if environ is not None and environ.get("SLURMD_NODENAME"):
        return environ["SLURMD_NODENAME"]
    import socket  # here, not at the top: the prolog's cold path does not need it otherwise

    return socket.gethostname().split(".")[0]


Progress = Callable[[str], None]


def _quiet(step: str) -> None:
    pass


class Background:
    """``work()`` run in a thread of its own from now on; ``result()`` waits for it and
    returns what it returned (or raises what it raised)."""

    def __init__(self, work: Callable[[], Any]) -> None:
        import threading

        self._work = work
        self._outcome: tuple[bool, Any] = (False, None)
        self._thread = threading.Thread(target=self._run, name="slurmgpu-gather", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome = (True, self._work())
        except BaseException as exc:  # handed to result(), in the caller's thread
            self._outcome = (False, exc)

    def result(self) -> Any:
        self._thread.join()
        done, value = self._outcome
        if not done:
            raise value
        return value


def gather(sources: Sources, *, node: str, scope: frozenset[int] | None = None,
           xids: Iterable[XidEvent] = (), previous: NodeFacts | None = None,
           want_ib: bool = True, want_versions: bool = True, ib: IbFacts | None = None,
           versions: SoftwareVersions | None = None, want_host: bool = True, kernel_log: str | None = None,
           xids_since: float | None = None, progress: Progress = _quiet) -> NodeFacts:
    """Collect facts; ``ib``/``versions`` given (a cache's) are taken as they are instead of
    read. With ``kernel_log`` and ``xids_since``, the XIDs logged there since then too
    (``add_kernel_xids``). ``progress`` is told each step first, so a watchdog can say
    which hung."""
    collected_at = sources.clock.time()
    # The host's layers (files, `systemctl show`: a child process) are read meanwhile.
    host_work = Background(sources.host.collect) if want_host and sources.host is not None else None
    progress("gather:nvml")
    nvml = sources.nvml.collect(scope)
    progress("gather:infiniband")
    if ib is None:
        ib = sources.ib.collect() if want_ib else IbFacts(available=False, error="not collected")
    progress("gather:versions")
    if versions is None:
        versions = sources.versions.collect() if want_versions else SoftwareVersions()
    progress("gather:host")
    host = host_work.result() if host_work is not None else None
    facts = assemble(node, nvml, collected_at=collected_at, ib=ib, versions=versions,
                     xids=xids, previous=previous, host=host)
    if kernel_log is not None and xids_since is not None:
        add_kernel_xids(facts, kernel_log, xids_since, progress)
    return facts


def assemble(node: str, nvml: NvmlFacts, *, collected_at: float, ib: IbFacts | None = None,
             versions: SoftwareVersions | None = None, xids: Iterable[XidEvent] = (),
             previous: NodeFacts | None = None, host: HostFacts | None = None) -> NodeFacts:
    """The one place a node's facts are put together (``gather``, the agent's cache and
    events, ``doctor``): nothing a caller holds (its XIDs, its previous sample) is left
    out. ``previous`` is kept one sample deep."""
    if previous is not None and previous.previous is not None:
        previous = dataclasses.replace(previous, previous=None)
    return NodeFacts(node=node, collected_at=collected_at, nvml=nvml,
                     ib=ib if ib is not None else IbFacts(available=False, error="not collected"),
                     versions=versions if versions is not None else SoftwareVersions(),
                     xids=list(xids), host=host if host is not None else HostFacts(), previous=previous)


def add_kernel_xids(facts: NodeFacts, kernel_log: str, since: float, progress: Progress = _quiet) -> None:
    """Make ``facts.xids`` the XIDs ``kernel_log`` holds from ``since`` on (each mapped to
    its GPU by PCI address), with those ``facts`` already held from then on (the agent's
    memory) that are not among them. A log that cannot be read is ``kernel_log_error``."""
    progress("kmsg")
    remembered = [x for x in facts.xids if x.timestamp is None or x.timestamp >= since]
    try:
        logged = kmsg.read_xids(kernel_log, kmsg.pci_map(facts.nvml), since=since)
    except kmsg.KernelLogError as exc:
        facts.kernel_log_error, logged = str(exc), []
    facts.xids = kmsg.merge_xids(logged, remembered)


class FactsProvider(Protocol):
    """Where a hook's facts come from (``slurmgpu.gate.Gate``): ``SourceFacts`` on the cold
    path, the agent's cache on the warm path (``slurmgpu.agent.local.CachedFacts``)."""

    def __call__(self, gpus: frozenset[int] | None, *, xids_since: float | None = None,
                 progress: Progress = _quiet) -> NodeFacts:
        """The node's facts now, its GPUs those in ``gpus`` (None: every GPU); with
        ``xids_since``, the kernel log's XIDs from then on (else none)."""
        ...

    def holders(self, devices: Mapping[str, int], *, uid: int | None,
                ignore: Iterable[str]) -> list[dict[str, Any]]:
        """Processes holding these device files (path -> GPU index) open: only ``uid``'s
        when given, none whose command line contains an ``ignore`` entry."""
        ...


@record
class SourceFacts:
    """The cold path's ``FactsProvider``: ``gather`` over the node's sources, device
    holders from /proc (``slurmgpu.sources.procs``)."""

    sources: Sources
    node: str
    kernel_log: str = kmsg.DEFAULT_KMSG
    proc_root: str = procs.PROC_ROOT
    thermal: ThermalSettings | None = None  # for second_brake_sample; None: one sample

    def __call__(self, gpus: frozenset[int] | None, *, xids_since: float | None = None,
                 progress: Progress = _quiet) -> NodeFacts:
        facts = gather(self.sources, node=self.node, scope=gpus, kernel_log=self.kernel_log,
                       xids_since=xids_since, progress=progress)
        return facts if self.thermal is None else second_brake_sample(facts, self.sources, self.thermal, progress)

    def holders(self, devices: Mapping[str, int], *, uid: int | None,
                ignore: Iterable[str]) -> list[dict[str, Any]]:
        return procs.find_device_holders(devices, self.proc_root, uid=uid, ignore=ignore)


def source_facts(sources: Sources, settings: Settings, environ: Mapping[str, str]) -> SourceFacts:
    """The cold path's facts for a hook run in ``environ``: its node (``node_name``), its
    kernel log (``[paths] kmsg``, as ``environ``'s ``$SLURMGPU_KMSG`` leaves it)."""
    return SourceFacts(sources, node_name(environ), apply_env(settings, environ).paths.kmsg,
                       thermal=settings.thermal)


def second_brake_sample(facts: NodeFacts, sources: Sources, thermal: ThermalSettings,
                        progress: Progress = _quiet) -> NodeFacts:
    """A fresh gather whose previous sample (none on the cold path; the agent's last poll on
    the warm one) does not show a GPU's clock brake cannot tell a held brake from a momentary
    one (``thermal.clock_brake``): sample those GPUs again ``[thermal] brake_resample_s``
    later, with the first gather as the previous sample."""
    from slurmgpu.checks.thermal import braked

    def seen_before(index: int) -> bool:
        prev = facts.previous.gpu(index) if facts.previous is not None else None
        return prev is not None and braked(prev, thermal.brake_fraction)

    held = frozenset(g.index for g in facts.gpus
                     if braked(g, thermal.brake_fraction) and not seen_before(g.index))
    if not held or thermal.brake_resample_s <= 0:
        return facts
    progress("gather:brake_resample")
    time.sleep(thermal.brake_resample_s)
    again = {g.index: g for g in sources.nvml.collect(held).gpus}
    gpus = [again.get(g.index, g) for g in facts.gpus]
    return dataclasses.replace(facts, nvml=dataclasses.replace(facts.nvml, gpus=gpus), previous=facts)


def evaluate(facts: NodeFacts, settings: Settings, *, scope: frozenset[int] | None = None,
             checks: Sequence[CheckSpec] | None = None, progress: Progress = _quiet) -> Verdict:
    """Run every enabled check over the facts. Pure: no I/O."""
    started = time.perf_counter()
    policy = XidPolicy(settings.xid.overrides, settings.xid.unknown_action)
    ctx = CheckContext(facts, settings, policy, scope)
    specs = checks
    if specs is None:
        if settings.checks.plugins:
            progress("load:plugins")  # a plugin import that hangs is named by the watchdog
        specs = enabled_checks(settings.checks.disabled, plugins=settings.checks.plugins)
    findings: list[Finding] = []
    for spec in specs:
        progress(f"check:{spec.id}")
        findings.extend(run_one(spec, ctx))
    duration = (time.perf_counter() - started) * 1000
    return Verdict(facts.node, tuple(findings), duration)


def run_one(spec: CheckSpec, ctx: CheckContext) -> list[Finding]:
    """One check's findings, stamped with its id. A crashing check (an exception, even
    SystemExit, or something that is not a Finding) becomes one UNKNOWN finding; a
    silent one an OK finding."""
    try:
        found = [_stamped(f, spec) for f in spec.func(ctx)]
    except (Exception, SystemExit) as exc:  # a bug in one check must not hide the others
        found = [_stamped(unknown(f"check crashed: {type(exc).__name__}: {exc}"), spec)]
    return found or [Finding(spec.id, Severity.OK, "ok")]


def _stamped(finding: object, spec: CheckSpec) -> Finding:
    if not isinstance(finding, Finding) or not isinstance(finding.severity, Severity):
        raise TypeError(f"a check yields Finding objects (ok(), problem(), ...), not {finding!r:.60}")
    if spec.origin is not None:  # a plugin's: it must travel as JSON (check --json, the agent)
        import json

        json.dumps(finding.data)
    return dataclasses.replace(finding, check=spec.id)
