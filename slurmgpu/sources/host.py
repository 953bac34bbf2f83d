"""The layers around NVML, read from the host: the NVIDIA kernel module's version
(``/proc/driver/nvidia/version``), NVSwitch and IMEX presence, ``nvidia_peermem``, the
systemd units the GPUs depend on (``systemctl show``, under a deadline, read-only),
disk space and read-only mounts (statvfs), processes in D state holding
``/dev/nvidia*``, and NVSwitch SXids in the kernel log (``[paths] kmsg``, since boot).

Every path is read under a root (``/``, or ``$SLURMGPU_HOST_ROOT`` for fixture trees and
the simulator); a fixture root brings its own ``bin/systemctl`` and may answer statvfs
from ``statvfs.json`` (``{path: {"total", "free", "read_only"}}``). Nothing here raises:
what could not be read is in ``HostFacts.errors``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Protocol

from slurmgpu.facts import DiskState, HostFacts, HungProcess, ServiceState
from slurmgpu.record import record
from slurmgpu.sources import kmsg
from slurmgpu.sources.sxids import parse_sxids

ENV_HOST_ROOT = "SLURMGPU_HOST_ROOT"
DEFAULT_ROOT = "/"
FABRICMANAGER = "nvidia-fabricmanager"
IMEX = "nvidia-imex"
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
_MODULE_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "NRestarts", "Result")


def host_root(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(ENV_HOST_ROOT) or DEFAULT_ROOT


class ServiceReader(Protocol):
    def show(self, units: list[str]) -> list[ServiceState]:
        """Each unit's state; raises ``ServiceReadError`` when systemd cannot be asked."""
        ...


class ServiceReadError(Exception):
    """systemctl missing, failing or past its deadline."""


@record
class SystemctlReader:
    """``systemctl show -p ...`` under a deadline: reads, never starts anything."""

    systemctl: str
    timeout_s: float = 3.0

    def show(self, units: list[str]) -> list[ServiceState]:
        command = [self.systemctl, "show", "--no-pager", "-p", ",".join(_SHOW_PROPERTIES),
                   *(u if "." in u else f"{u}.service" for u in units)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ServiceReadError(f"systemctl show did not answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ServiceReadError(f"cannot run {self.systemctl}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise ServiceReadError(f"systemctl show failed ({done.returncode}): {done.stderr.strip()[:200]}")
        return parse_show(done.stdout, units)


def parse_show(text: str, units: list[str]) -> list[ServiceState]:
    """``systemctl show`` output (one block of ``Key=Value`` lines per unit, in the order
    asked) as states named as ``units`` names them."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    states = []
    for unit, block in zip(units, blocks, strict=False):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        restarts = props.get("NRestarts", "")
        states.append(ServiceState(unit, props.get("LoadState") or None, props.get("ActiveState") or None,
                                   props.get("SubState") or None,
                                   int(restarts) if restarts.isdigit() else None, props.get("Result") or None))
    return states


Statvfs = Callable[[str], DiskState]


def real_statvfs(path: str, shown: str) -> DiskState:
    st = os.statvfs(path)
    return DiskState(shown, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize,
                     bool(st.f_flag & os.ST_RDONLY))


@record
class HostConfig:
    """What the host source is asked for (from ``Settings``)."""

    units: list[str] = field(default_factory=list)
    fabricmanager: bool | None = None
    imex: bool | None = None
    disk_paths: list[str] = field(default_factory=list)
    # The kernel log NVSwitch SXids are read from ([paths] kmsg); None: not read.
    kernel_log: str | None = None


class HostSource(Protocol):
    def collect(self) -> HostFacts: ...


class SystemHostSource:
    """``HostSource`` over a root directory (``/`` on a node)."""

    def __init__(self, config: HostConfig, *, root: str = DEFAULT_ROOT,
                 services: ServiceReader | None = None):
        self.config = config
        self.root = root
        self.services = services or SystemctlReader(self._path("bin/systemctl"))
        self._fixture_statvfs = _fixture_statvfs(root)

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, relative.lstrip("/"))

    def collect(self) -> HostFacts:
        facts = HostFacts(available=True)
        self._driver(facts)
        facts.nvswitches = self._nvswitches()
        facts.imex = os.path.isdir(self._path("etc/nvidia-imex")) or os.path.exists(self._path("usr/bin/nvidia-imex"))
        facts.peermem_loaded = any(os.path.isdir(self._path(f"sys/module/{m}")) for m in PEERMEM_MODULES)
        facts.systemd = os.path.isdir(self._path("run/systemd/system"))
        if facts.systemd:
            self._services(facts)
        facts.disks = [self._disk(p) for p in self.config.disk_paths]
        facts.hung_processes = hung_gpu_processes(self._path("proc"))
        if self.config.kernel_log is not None:
            self._sxids(facts, self.config.kernel_log)
        return facts

    def _sxids(self, facts: HostFacts, kernel_log: str) -> None:
        try:
            facts.sxids = parse_sxids(kmsg.read_records(kernel_log))
        except kmsg.KernelLogError as exc:
            facts.errors["sxids"] = str(exc)

    def _driver(self, facts: HostFacts) -> None:
        with contextlib.suppress(OSError):
            facts.kernel_release = Path(self._path("proc/sys/kernel/osrelease")).read_text().strip() or None
        try:
            text = Path(self._path("proc/driver/nvidia/version")).read_text(errors="replace")
        except FileNotFoundError:
            return  # no NVIDIA kernel module loaded
        except OSError as exc:
            facts.errors["kernel_module"] = f"/proc/driver/nvidia/version: {exc.strerror or exc}"
            return
        first = text.splitlines()[0].strip() if text.strip() else ""
        found = _MODULE_VERSION.search(first)
        facts.kernel_module_text = first[:200] or None
        facts.kernel_module_version = found.group(1) if found else None
        facts.open_kernel_module = "Open Kernel Module" in first

    def _nvswitches(self) -> int:
        with contextlib.suppress(OSError):
            return len(os.listdir(self._path("proc/driver/nvidia-nvswitch/devices")))
        return len(glob.glob(self._path("dev/nvidia-nvswitch[0-9]*")))

    def wanted_units(self, facts: HostFacts) -> list[str]:
        units = list(dict.fromkeys(self.config.units))
        fm = self.config.fabricmanager
        if fm or (fm is None and facts.nvswitches > 0):
            units.append(FABRICMANAGER)
        imex = self.config.imex
        if imex or (imex is None and facts.imex):
            units.append(IMEX)
        return list(dict.fromkeys(units))

    def _services(self, facts: HostFacts) -> None:
        units = self.wanted_units(facts)
        if not units:
            return
        try:
            facts.services = self.services.show(units)
        except ServiceReadError as exc:
            facts.errors["services"] = str(exc)

    def _disk(self, path: str) -> DiskState:
        try:
            if self._fixture_statvfs is not None:
                return self._fixture_statvfs(path)
            return real_statvfs(self._path(path), path)
        except FileNotFoundError:
            return DiskState(path, error="not found")
        except OSError as exc:
            return DiskState(path, error=exc.strerror or str(exc))


def _fixture_statvfs(root: str) -> Statvfs | None:
    """A fixture root's ``statvfs.json`` answers statvfs; None for ``/`` or without one."""
    if os.path.realpath(root) == "/":
        return None
    try:
        table = json.loads(Path(root, "statvfs.json").read_text())
    except (OSError, ValueError):
        return None

    def lookup(path: str) -> DiskState:
        entry = table.get(path)
        if not isinstance(entry, dict):
            raise FileNotFoundError(path)
        return DiskState(path, int(entry["total"]), int(entry["free"]), bool(entry.get("read_only")))
    return lookup


def hung_gpu_processes(proc_root: str, limit: int = 32) -> list[HungProcess]:
    """Processes in D state (uninterruptible sleep, often stuck in the driver) holding a
    ``/dev/nvidia*`` file open, at most ``limit``."""
    found = []
    for pid in _pids(proc_root):
        if _state(proc_root, pid) != "D":
            continue
        devices = _nvidia_fds(proc_root, pid)
        if devices:
            found.append(HungProcess(pid, _comm(proc_root, pid), devices))
            if len(found) >= limit:
                break
    return found


def _pids(proc_root: str) -> Iterable[int]:
    try:
        return sorted(int(p) for p in os.listdir(proc_root) if p.isdigit())
    except OSError:
        return []


def _state(proc_root: str, pid: int) -> str:
    try:
        stat = Path(proc_root, str(pid), "stat").read_text(errors="replace")
    except OSError:
        return ""
    tail = stat.rpartition(")")[2].split()
    return tail[0] if tail else ""


def _nvidia_fds(proc_root: str, pid: int) -> list[str]:
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        targets = {os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)}
    except OSError:
        return []
    return sorted(t for t in targets if t.startswith("/dev/nvidia"))


def _comm(proc_root: str, pid: int) -> str:
    try:
        return Path(proc_root, str(pid), "comm").read_text(errors="replace").strip()[:64]
    except OSError:
        return "?"
