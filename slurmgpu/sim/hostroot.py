"""A simulated host's layers around NVML, as a directory ``$SLURMGPU_HOST_ROOT`` points at.

A scenario's ``host`` object (docs/simulator.md) becomes the files slurmgpu's host source
reads on a node: ``proc/driver/nvidia/version``, NVSwitch devices, ``sys/module/*``,
``etc/nvidia-imex``, a ``bin/systemctl`` answering ``show`` from the scenario's units,
``statvfs.json`` for the disks, and ``proc/<pid>`` entries for processes stuck in D state.
Keys left out take healthy values derived from the NVML part (the kernel module of
``driver_version``; NVSwitches and nvidia-fabricmanager where the GPUs report a fabric).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from slurmgpu.sources.host import ENV_HOST_ROOT
from slurmgpu.sources.kmsg import kmsg_record

ENV_KMSG = "SLURMGPU_KMSG"
KERNEL_MODULE = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  "
                 "Thu Jun  6 04:29:46 UTC 2024")
HEALTHY_UNIT = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running",
                "NRestarts": 0, "Result": "success"}
MISSING_UNIT = {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead",
                "NRestarts": 0, "Result": "success"}
ROOMY_DISK = {"total": 500 << 30, "free": 400 << 30, "read_only": False}

SYSTEMCTL = '''#!{python}
"""The simulated host's systemctl: `show -p PROPS UNIT...` from units.json, nothing else."""
import json, os, sys
units = json.load(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "units.json")))
args = sys.argv[1:]
if not args or args[0] != "show":
    sys.exit("simulated systemctl: only `show` is simulated")
props, names, i = ["Id"], [], 1
while i < len(args):
    if args[i] == "-p":
        props = args[i + 1].split(","); i += 2
    elif args[i].startswith("-"):
        i += 1
    else:
        names.append(args[i]); i += 1
missing = {missing}
blocks = []
for name in names:
    unit = dict(units.get(name.removesuffix(".service"), missing), Id=name)
    blocks.append("\\n".join(f"{{p}}={{unit.get(p, '')}}" for p in props))
print("\\n\\n".join(blocks))
'''


def host_spec(scenario: dict[str, Any]) -> dict[str, Any]:
    """The scenario's ``host`` object with every key filled in."""
    given = scenario.get("host") or {}
    fabric = any(isinstance(g, dict) and g.get("fabric") for g in scenario.get("gpus", []))
    units = {"nvidia-persistenced": HEALTHY_UNIT}
    if fabric:
        units["nvidia-fabricmanager"] = HEALTHY_UNIT
    spec = {
        "kernel_module": KERNEL_MODULE.format(version=scenario.get("driver_version") or "550.90.07"),
        "kernel_release": "6.8.0-45-generic",
        "nvswitches": 4 if fabric else 0,
        "imex": False,
        "modules": ["nvidia_peermem"],
        "services": units,
        "disks": {"/tmp": ROOMY_DISK, "/var": ROOMY_DISK},
        "hung_processes": [],
        "kmsg": [],
    }
    spec.update(given)
    spec["services"] = {**units, **given.get("services", {})}
    return spec


def materialize(scenario: dict[str, Any], dest: Path) -> Path:
    """Write the host tree of ``scenario`` into ``dest`` (made new) and return it."""
    spec = host_spec(scenario)
    _write(dest / "proc/driver/nvidia/version", spec["kernel_module"] + "\n") if spec["kernel_module"] else None
    _write(dest / "proc/sys/kernel/osrelease", spec["kernel_release"] + "\n")
    for n in range(int(spec["nvswitches"])):
        _write(dest / f"proc/driver/nvidia-nvswitch/devices/0000:{0x5 + n:02x}:00.0", "")
    if spec["imex"]:
        (dest / "etc/nvidia-imex").mkdir(parents=True)
    for module in spec["modules"]:
        (dest / "sys/module" / module).mkdir(parents=True)
    (dest / "run/systemd/system").mkdir(parents=True)
    _write(dest / "units.json", json.dumps(spec["services"]))
    _write(dest / "bin/systemctl", SYSTEMCTL.format(python=sys.executable, missing=repr(MISSING_UNIT)))
    (dest / "bin/systemctl").chmod(0o755)
    _write(dest / "statvfs.json", json.dumps(spec["disks"]))
    for proc in spec["hung_processes"]:
        _hung_process(dest / "proc" / str(proc["pid"]), proc)
    _write(dest / "kmsg", "".join(kmsg_record(line, seq=n, usec=1_000_000 + n)
                                  for n, line in enumerate(spec["kmsg"])))
    return dest


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _hung_process(where: Path, proc: dict[str, Any]) -> None:
    _write(where / "stat", f"{proc['pid']} ({proc['command']}) D 1 1 1 0 -1\n")
    _write(where / "comm", proc["command"] + "\n")
    (where / "fd").mkdir()
    for n, device in enumerate(proc["devices"], start=3):
        os.symlink(device, where / "fd" / str(n))


def host_environment(scenario: dict[str, Any], cache_dir: Path) -> dict[str, str]:
    """``{SLURMGPU_HOST_ROOT: dir}``: the scenario's host tree under ``cache_dir``, one
    directory per distinct host (written once, atomically renamed into place); with
    kernel-log lines, ``SLURMGPU_KMSG`` too."""
    text = json.dumps(host_spec(scenario), sort_keys=True) + sys.executable
    dest = cache_dir / "hosts" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=dest.parent))
        materialize(scenario, scratch / "root")
        with contextlib.suppress(OSError):  # another process put the same tree there first
            os.rename(scratch / "root", dest)
        shutil.rmtree(scratch, ignore_errors=True)
    if not host_spec(scenario)["kmsg"]:
        return {ENV_HOST_ROOT: str(dest)}
    return {ENV_HOST_ROOT: str(dest), ENV_KMSG: str(dest / "kmsg")}


def record_host() -> dict[str, Any]:
    """This host's layers around NVML as a scenario's ``host`` object (what can be read:
    the kernel module, NVSwitches, IMEX, peermem, the GPU services systemd knows, /tmp and
    /var, D-state GPU holders, SXid lines in the kernel log)."""
    from slurmgpu.config.schema import Settings
    from slurmgpu.engine import host_source
    from slurmgpu.sources.sxids import sxid_message

    host = host_source(Settings()).collect()
    return {
        "kernel_module": host.kernel_module_text, "kernel_release": host.kernel_release,
        "nvswitches": host.nvswitches, "imex": host.imex,
        "modules": ["nvidia_peermem"] if host.peermem_loaded else [],
        "services": {s.name: {"LoadState": s.load_state, "ActiveState": s.active_state, "SubState": s.sub_state,
                              "NRestarts": s.n_restarts or 0, "Result": s.result} for s in host.services},
        "disks": {d.path: {"total": d.total_bytes, "free": d.free_bytes, "read_only": d.read_only}
                  for d in host.disks if d.error is None},
        "hung_processes": [{"pid": p.pid, "command": p.command, "devices": p.devices} for p in host.hung_processes],
        "kmsg": [sxid_message(e.pci or "0000:00:00.0", e.sxid, e.message or "", e.switch) for e in host.sxids],
    }
