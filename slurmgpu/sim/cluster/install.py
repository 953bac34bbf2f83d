"""Slurm and munge on this host: their version, and an apt-get install when missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from slurmgpu.sim.cluster.common import SANE_PATH, ClusterError, SlurmNotAvailable

SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
#: Programs `up` needs; any one missing triggers the apt-get install.
SLURM_PROGRAMS = ("slurmctld", "slurmd", "scontrol", "sbatch", "sinfo", "squeue", "scancel",
                  "munged", "mungekey")
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def slurm_version() -> tuple[int, int, int]:
    """The installed Slurm version from ``slurmd -V`` ("slurm-wlm 22.05.8" -> (22, 5, 8))."""
    try:
        out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot run `slurmd -V`: {exc}") from exc
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise ClusterError(f"cannot parse the Slurm version from `slurmd -V`: {out.strip()!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def path_additions() -> list[str]:
    """The directories of SANE_PATH that $PATH lacks (the Slurm clients live in /usr/bin)."""
    have = os.environ.get("PATH", "").split(os.pathsep)
    return [p for p in SANE_PATH.split(os.pathsep) if p not in have]


def missing_programs() -> list[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), SANE_PATH])
    return [p for p in SLURM_PROGRAMS if shutil.which(p, path=path) is None]


def ensure_slurm_installed() -> None:
    """apt-get install the Slurm and munge packages if a program is missing (root only)."""
    missing = missing_programs()
    if not missing:
        return
    packages = " ".join(SLURM_PACKAGES)
    if os.geteuid() != 0:
        raise SlurmNotAvailable(
            f"Slurm is not installed ({', '.join(missing)} missing) and this is not root; "
            f"run: apt-get install -y --no-install-recommends {packages}"
        )
    if shutil.which("apt-get") is None:
        raise SlurmNotAvailable(f"Slurm is not installed and there is no apt-get; install {packages}")
    _apt_install()
    missing = missing_programs()
    if missing:
        raise SlurmNotAvailable(f"still missing after apt-get install: {', '.join(missing)}")


def _apt_install() -> None:
    created_policy = False
    if not POLICY_RC_D.exists():  # keep Debian's init scripts from starting the daemons
        POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
        POLICY_RC_D.chmod(0o755)
        created_policy = True
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *SLURM_PACKAGES]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:  # stale or empty package lists: update once, then retry
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        if created_policy:
            POLICY_RC_D.unlink(missing_ok=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SlurmNotAvailable(f"apt-get install {' '.join(SLURM_PACKAGES)} failed: {last}")
