"""Processes that hold device files open, from /proc: the epilog's stray processes (a job's
process still holding its GPU after the job ended)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PROC_ROOT = "/proc"


def find_device_holders(devices: Mapping[str, int], proc_root: str = PROC_ROOT, *, uid: int | None = None,
                        ignore: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Processes (other than this one) with one of these device files open, as
    ``{"pid", "gpus", "command"}``; only those of ``uid`` when given, and none whose
    executable is named by an ``ignore`` entry (``ignored``: never by its command line,
    which a user's stray may fill with any path or argument)."""
    me = os.getpid()
    ignore = [i for i in ignore if i]
    found = []
    try:
        pids = [int(p) for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            targets = {os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)}
        except OSError:
            continue  # gone, or not ours to look at
        held = sorted(devices[t] for t in targets if t in devices)
        if not held or (uid is not None and _owner(proc_root, pid) != uid):
            continue
        if ignored(executable(proc_root, pid), ignore):
            continue
        found.append({"pid": pid, "gpus": held, "command": _command(proc_root, pid)})
    return found


def _owner(proc_root: str, pid: int) -> int | None:
    try:
        return os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        return None


def _command(proc_root: str, pid: int) -> str:
    try:
        raw = Path(f"{proc_root}/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]


def executable(proc_root: str, pid: int) -> str:
    """The name of the program a process runs: the basename of /proc/PID/exe, else (not
    readable) its comm; "" when it is gone."""
    try:
        return os.path.basename(os.readlink(f"{proc_root}/{pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        pass
    try:
        return Path(f"{proc_root}/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def ignored(name: str, ignore: Iterable[str]) -> bool:
    """Whether an executable of this name is a node daemon: it is, or starts with, an
    entry ("dcgm" names dcgmi and dcgm-exporter; "slurmgpu" slurmgpu-agent)."""
    return bool(name) and any(name.startswith(entry) for entry in ignore)
