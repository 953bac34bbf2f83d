"""Doctor check: the ``scontrol`` the hooks run is the cluster's Slurm, not a second one.

A site with its own Slurm build (in /opt/slurm, say) can also have a distribution's
slurm-client installed; the hook wrappers put /usr/bin before slurmd's PATH, so they may
drain and resume with that other ``scontrol``. The cluster's version is that of the Slurm
daemon running here (slurmctld on the head node, else slurmd), read from the binary the
running process was started from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

from slurmgpu.doctor.model import STEP_TIMEOUT_S, Context, Finding, ok, skip, warn

#: The PATH the hook wrappers put first (prolog/slurmgpu-prolog), before slurmd's own.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROC_ROOT = "/proc"
DAEMONS = ("slurmctld", "slurmd")


def check_scontrol_version(ctx: Context) -> Iterator[Finding]:
    """WARN when the hooks' scontrol is another Slurm release than the daemon running here."""
    hooks = hooks_scontrol(ctx)
    daemon = running_daemon()
    hooks_version = slurm_version([hooks, "--version"]) if hooks else None
    daemon_version = slurm_version([daemon, "-V"]) if daemon else None
    if hooks_version is None or daemon_version is None:
        missing = "no Slurm daemon running here" if daemon_version is None else f"{hooks} --version"
        yield skip("slurm.scontrol", f"cannot compare Slurm versions ({missing} says none)")
    elif release(hooks_version) != release(daemon_version):
        yield warn("slurm.scontrol", f"the hooks run {hooks} (Slurm {hooks_version}), but "
                                     f"{os.path.basename(str(daemon))} here is {daemon} "
                                     f"(Slurm {daemon_version})",
                   f"set [slurm] bin_dir = \"{os.path.dirname(str(daemon))}\" (the directory of "
                   "the cluster's scontrol) in a drop-in, or remove the other Slurm's client "
                   "(Debian: apt-get remove slurm-client)")
    else:
        yield ok("slurm.scontrol", f"the hooks run {hooks} (Slurm {hooks_version}), as "
                                   f"{os.path.basename(str(daemon))} here ({daemon_version})")


def hooks_scontrol(ctx: Context) -> str | None:
    """[slurm] bin_dir's scontrol, else the first on the wrappers' PATH."""
    bin_dir = ctx.settings.slurm.bin_dir if ctx.settings is not None else None
    if bin_dir and os.access(os.path.join(bin_dir, "scontrol"), os.X_OK):
        return os.path.join(bin_dir, "scontrol")
    path = ":".join(p for p in (HOOK_PATH, ctx.environ.get("PATH", "")) if p)
    return shutil.which("scontrol", path=path)


def running_daemon() -> str | None:
    """The program a running slurmctld (first) or slurmd was started from: argv[0] when
    it names a file, else the process's executable."""
    found: dict[str, str] = {}
    for pid in (p for p in os.listdir(PROC_ROOT) if p.isdigit()):
        name, program = _process(os.path.join(PROC_ROOT, pid))
        if name in DAEMONS and program:
            found.setdefault(name, program)
    return next((found[d] for d in DAEMONS if d in found), None)


def _process(proc: str) -> tuple[str, str | None]:
    """(comm, program) of one /proc entry; ("", None) for one that is gone or not ours to read."""
    try:
        with open(os.path.join(proc, "comm"), encoding="utf-8", errors="replace") as fh:
            name = fh.read().strip()
        if name not in DAEMONS:
            return name, None
        with open(os.path.join(proc, "cmdline"), "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return "", None
    if os.path.isabs(argv0) and os.path.isfile(argv0):
        return name, argv0
    try:
        return name, os.readlink(os.path.join(proc, "exe"))
    except OSError:
        return name, None


def slurm_version(argv: list[str]) -> str | None:
    """``22.05.8`` from ``slurm 22.05.8`` / ``slurm-wlm 22.05.8``; None when it says none."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                             stdin=subprocess.DEVNULL).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if len(out) == 2 and out[0].startswith("slurm") and out[1][:1].isdigit():
        return out[1]
    return None


def release(version: str) -> str:
    """The release a version belongs to (``23.11.4`` -> ``23.11``): its patch levels talk."""
    return ".".join(version.split(".")[:2])
