"""NVSwitch SXids from kernel-log lines.

The NVSwitch driver logs ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal,
Link 32 egress non-posted PRIV error (First)``; one error often takes several lines with
the same code (``..., Severity 1 Engine instance 60 ...``, ``..., Data {0x...}``). Lines
are ``/dev/kmsg`` records (``PRI,SEQ,USEC,FLAGS;MESSAGE``: each SXid gets its time) or
plain ``dmesg`` lines (no time).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from slurmgpu.facts import SxidEvent
from slurmgpu.sources.kmsg import bounded

_SXID = re.compile(r"(nvidia-nvswitch\d+): SXid \((?:PCI:)?([0-9a-fA-F:.]+)\):\s*(\d+)(?:,\s*(.*))?")
MAX_EVENTS = 1000  # a storm of lines is counted, not kept line by line


def parse_sxids(lines: Iterable[str], *, boot_wall: float | None = None) -> list[SxidEvent]:
    """The SXids in ``lines`` (kmsg records or dmesg lines), at most MAX_EVENTS (the last)."""
    boot = time.time() - time.monotonic() if boot_wall is None else boot_wall
    events: list[SxidEvent] = []
    for line in lines:
        head, sep, message = line.partition(";")
        found = _SXID.search(message if sep else line)
        if not found:
            continue
        fields = head.split(",") if sep else []
        when = boot + int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else None
        switch, pci, code, text = found.groups()
        events.append(SxidEvent(int(code), switch, pci, when, bounded(text)))
    return events[-MAX_EVENTS:]


def sxid_message(pci: str, code: int, text: str, switch: str = "nvidia-nvswitch0") -> str:
    """One SXid kernel message, as the NVSwitch driver words it (the simulator's)."""
    return f"{switch}: SXid (PCI:{pci}): {code}, {text}"


def merge_sxids(logged: list[SxidEvent], remembered: list[SxidEvent]) -> list[SxidEvent]:
    """The SXids read now, with those an earlier read had that the log no longer holds (the
    agent's memory across a rotated ring buffer), oldest first, at most MAX_EVENTS."""
    seen = {(e.switch, e.sxid, e.timestamp, e.message) for e in logged}
    kept = [e for e in remembered if (e.switch, e.sxid, e.timestamp, e.message) not in seen]
    return (kept + logged)[-MAX_EVENTS:]
