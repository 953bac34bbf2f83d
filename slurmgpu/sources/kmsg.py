"""XIDs from the kernel log.

The NVIDIA driver logs every XID as a kernel message such as
``NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.``
and older drivers as ``NVRM: Xid (0000:03:00): 14, Channel 00000001`` (no ``PCI:``).
The text after the code is kept (bounded): NVIDIA's action for some XIDs depends on it.
Reading ``/dev/kmsg`` (records ``PRI,SEQ,USEC,FLAGS;MESSAGE``, USEC = monotonic
microseconds since boot) gives each XID with its time, so the epilog can ask
"which XIDs happened during this job?" without a daemon. The path is
injectable (``[paths] kmsg``, which ``$SLURMGPU_KMSG`` overrides): the simulator points it at a
regular file in the same record format.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping

from slurmgpu.facts import XID_MESSAGE_MAX, GpuFacts, XidEvent

DEFAULT_KMSG = "/dev/kmsg"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\):"
                  r"\s*(\d+)(?:,\s*(.*))?")
_MAX_BYTES = 64 * 1024 * 1024  # bound the work on a huge regular file


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


def _monotonic_to_wall(usec: int) -> float:
    return time.time() - time.monotonic() + usec / 1e6


def parse_records(lines: Iterable[str], gpu_by_pci: Mapping[tuple[int, int, int], int],
                  since: float | None = None) -> list[XidEvent]:
    events = []
    for line in lines:
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
              since: float | None = None) -> list[XidEvent]:
    """XIDs logged at or after ``since`` (Unix time). A missing or unreadable log gives []."""
    return parse_records(read_records(path), gpu_by_pci, since)


def read_records(path: str) -> list[str]:
    """Every record of the kernel log at ``path`` (``/dev/kmsg`` or a file in its format);
    a missing or unreadable log gives []."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return []
    if stat.S_ISCHR(mode):
        return _read_device(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES)
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def _read_device(path: str) -> list[str]:
    """Every record currently in the kernel ring buffer (one read() per record)."""
    records = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: skip ahead
                    continue
                break  # EAGAIN: end of buffer
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").rstrip("\n"))
    finally:
        os.close(fd)
    return records


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
