"""XIDs from the kernel log.

The NVIDIA driver logs every XID as a kernel message such as
``NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.``
and older drivers as ``NVRM: Xid (0000:03:00): 14, Channel 00000001`` (no ``PCI:``).
The text after the code is kept (bounded): NVIDIA's action for some XIDs depends on it.
Reading ``/dev/kmsg`` (records ``PRI,SEQ,USEC,FLAGS;MESSAGE``, USEC = monotonic
microseconds since boot) gives each XID with its time, so the epilog can ask
"which XIDs happened during this job?" without a daemon. The path is
injectable (``[paths] kmsg``, which ``$SLURMGPU_KMSG`` overrides): the simulator points it at a
regular file in the same record format: the simulator's fake kernel log, which
``append_xid`` writes. Reading is bounded (``MAX_BYTES``, ``READ_TIMEOUT_S``); a log that
is absent or closed to this user holds no XIDs, one that cannot be read within the bounds
raises ``KernelLogError`` (the checks then say UNKNOWN, never FAIL).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from slurmgpu.config.schema import Settings
from slurmgpu.facts import XID_MESSAGE_MAX, GpuFacts, NvmlFacts, XidEvent

DEFAULT_KMSG = "/dev/kmsg"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\):"
                  r"\s*(\d+)(?:,\s*(.*))?")
MAX_BYTES = 64 * 1024 * 1024  # bound the work on a huge regular file or a flooded ring
READ_TIMEOUT_S = 2.0
# A remembered XID and a logged one with the same code and GPU this close are one XID
# (an NVML event and the driver's kernel-log line for it).
SAME_XID_S = 5.0


class KernelLogError(OSError):
    """The kernel log could not be read within its bounds."""


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """'00000000:3B:00.0' or '0000:3b:00' -> (domain, bus, device)."""
    parts = bus_id.split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def gpus_by_pci(gpus: Iterable[GpuFacts]) -> dict[tuple[int, int, int], int]:
    """{(domain, bus, device): GPU index}: what maps a logged XID to its GPU."""
    return {key: g.index for g in gpus if (key := pci_key(g.pci_bus_id or "")) is not None}


def pci_map(nvml: NvmlFacts) -> dict[tuple[int, int, int], int]:
    """{(domain, bus, device): GPU index} over every GPU NVML named, those outside the
    collected scope too (``NvmlFacts.bus_ids``)."""
    by_index = {i: bus for i, bus in enumerate(nvml.bus_ids) if bus}
    by_index.update({g.index: g.pci_bus_id for g in nvml.gpus if g.pci_bus_id})
    return {key: i for i, bus in by_index.items() if (key := pci_key(bus)) is not None}


def _monotonic_to_wall(usec: int) -> float:
    return time.time() - time.monotonic() + usec / 1e6


def parse_records(lines: Iterable[str], gpu_by_pci: Mapping[tuple[int, int, int], int],
                  since: float | None = None) -> list[XidEvent]:
    events = []
    for line in lines:
        if "NVRM: Xid" not in line:  # most records: no regex
            continue
        head, sep, message = line.partition(";")
        match = _XID.search(message) if sep else None
        if not match:
            continue
        fields = head.split(",")
        when = _monotonic_to_wall(int(fields[2])) if len(fields) > 2 and fields[2].isdigit() else None
        if since is not None and when is not None and when < since:
            continue
        domain, bus, device, code, text = match.groups()
        gpu = gpu_by_pci.get((int(domain, 16), int(bus, 16), int(device, 16)))
        events.append(XidEvent(xid=int(code), gpu=gpu, timestamp=when, source="kmsg",
                               message=bounded(text)))
    return events


def bounded(text: str | None) -> str | None:
    """The message as kept: printable, one line, at most XID_MESSAGE_MAX characters."""
    if not text:
        return None
    clean = "".join(ch if ch.isprintable() else " " for ch in text.strip())
    return clean[:XID_MESSAGE_MAX] or None


def read_xids(path: str, gpu_by_pci: Mapping[tuple[int, int, int], int],
              since: float | None = None, *, timeout_s: float = READ_TIMEOUT_S,
              max_bytes: int = MAX_BYTES) -> list[XidEvent]:
    """XIDs logged at or after ``since`` (Unix time). A missing log, or one this user may
    not read, gives []; a read that fails or passes ``timeout_s``/``max_bytes`` raises
    ``KernelLogError``."""
    return parse_records(read_records(path, timeout_s=timeout_s, max_bytes=max_bytes), gpu_by_pci, since)


def read_records(path: str, *, timeout_s: float = READ_TIMEOUT_S, max_bytes: int = MAX_BYTES) -> list[str]:
    """The kernel log's records (XIDs, NVSwitch SXids), bounded as ``read_xids`` says."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return []
    deadline = time.monotonic() + timeout_s
    try:
        lines = _read_device(path, deadline, max_bytes) if stat.S_ISCHR(mode) else _read_file(path, max_bytes)
    except (PermissionError, FileNotFoundError):
        return []
    except OSError as exc:
        raise KernelLogError(f"{path}: {exc.strerror or exc}") from exc
    if time.monotonic() > deadline:
        raise KernelLogError(f"{path}: not read within {timeout_s:g} s")
    return lines


def _read_file(path: str, max_bytes: int) -> list[str]:
    """The last ``max_bytes`` of a kmsg-format file (the newest records)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            f.seek(size - max_bytes)
            f.readline()  # a partial record
        data = f.read(max_bytes)
    return data.decode("utf-8", "replace").splitlines()


def _read_device(path: str, deadline: float, max_bytes: int) -> list[str]:
    """Every record currently in the kernel ring buffer (one read() per record), until
    the end, ``deadline`` or ``max_bytes``."""
    records: list[str] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    total = 0
    try:
        while total < max_bytes and time.monotonic() <= deadline:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: skip ahead
                    continue
                if exc.errno == errno.EAGAIN:
                    break  # the end of the buffer
                raise
            if not chunk:
                break
            total += len(chunk)
            records.append(chunk.decode("utf-8", "replace").rstrip("\n"))
    finally:
        os.close(fd)
    return records


def window_start(now: float, lookback_s: float, previous_job_end: float | None) -> float:
    """Since when a hook, ``check`` or a starting agent takes the kernel log's XIDs: the
    latest of ``now - lookback_s``, the boot and the node's previous job's end."""
    booted = now - time.clock_gettime(time.CLOCK_BOOTTIME)
    return max(now - lookback_s, booted, min(previous_job_end or 0.0, now))


JOB_END_FILE = "job-ends.json"
ALL_GPUS = "*"


def xid_window(settings: Settings, now: float | None = None, gpus: Iterable[int] | None = None) -> float:
    """Since when the prolog, the healthcheck, ``check`` and a starting agent take the
    kernel log's XIDs for ``gpus`` (None: every GPU): ``[xid] kernel_log_lookback_s`` back,
    never before the boot or the end of the last job on each of them (its epilog judged
    their XIDs before)."""
    now = time.time() if now is None else now
    ended = previous_job_end(Path(settings.paths.state_dir), gpus)
    return window_start(now, settings.xid.kernel_log_lookback_s, ended)


def previous_job_end(state_dir: Path, gpus: Iterable[int] | None) -> float | None:
    """When the last job on every one of ``gpus`` had ended (the earliest of their
    epilogs; None: a GPU no epilog marked). ``gpus`` None: only an epilog that judged
    every GPU counts."""
    marks = _job_ends(state_dir)
    node_wide = marks.get(ALL_GPUS)
    if gpus is None:
        return node_wide
    ends = [max(filter(None, (marks.get(str(g)), node_wide)), default=None) for g in gpus]
    return None if not ends or None in ends else min(e for e in ends if e is not None)


def mark_job_end(state_dir: Path, at: float, gpus: Iterable[int] | None) -> None:
    """Note that an epilog judged ``gpus``' XIDs (None: every GPU's) up to ``at``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / (JOB_END_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # epilogs of concurrent jobs
        marks = _job_ends(state_dir)
        for key in [ALL_GPUS] if gpus is None else [str(g) for g in gpus]:
            marks[key] = max(marks.get(key, at), at)
        path = state_dir / JOB_END_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(marks))
        os.replace(tmp, path)


def _job_ends(state_dir: Path) -> dict[str, float]:
    try:
        data = json.loads((state_dir / JOB_END_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def merge_xids(logged: list[XidEvent], remembered: Iterable[XidEvent]) -> list[XidEvent]:
    """``logged`` and those ``remembered`` XIDs that are not one of them: each logged XID
    stands for at most one remembered XID with its code and GPU within ``SAME_XID_S``."""
    unused = list(logged)
    out = list(logged)
    for x in remembered:
        twin = next((e for e in unused if _same(e, x)), None)
        if twin is None:
            out.append(x)
        else:
            unused.remove(twin)
    return out


def _same(a: XidEvent, b: XidEvent) -> bool:
    if (a.xid, a.gpu) != (b.xid, b.gpu):
        return False
    return a.timestamp is None or b.timestamp is None or abs(a.timestamp - b.timestamp) <= SAME_XID_S


def kmsg_record(message: str, *, seq: int = 0, usec: int | None = None) -> str:
    """One record in /dev/kmsg format (used by the simulator and tests)."""
    if usec is None:
        usec = int(time.monotonic() * 1e6)
    return f"4,{seq},{usec},-;{message}\n"


def xid_message(pci_bus_id: str, xid: int, text: str = "simulated XID") -> str:
    key = pci_key(pci_bus_id)
    if key is None:
        raise ValueError(f"not a PCI bus id: {pci_bus_id!r}")
    domain, bus, device = key
    return f"NVRM: Xid (PCI:{domain:04x}:{bus:02x}:{device:02x}): {xid}, pid='<unknown>', name=<unknown>, {text}"


def append_xid(path: str, pci_bus_id: str, xid: int, text: str = "simulated XID") -> None:
    """Append one XID record to a kmsg-format file (simulation only)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(kmsg_record(xid_message(pci_bus_id, xid, text)))
