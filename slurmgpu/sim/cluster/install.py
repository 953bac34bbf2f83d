"""Slurm and munge on this host: their version, and an apt-get install when missing; or a
Slurm built into a prefix (tools/build_slurm.sh), with Debian's munge."""

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


#: The programs of SLURM_PROGRAMS that come from Debian's munge package, even with a prefix.
MUNGE_PROGRAMS = ("munged", "mungekey")


def prefix_dirs(prefix: str | os.PathLike[str] | None) -> list[str]:
    """Where a Slurm built into ``prefix`` keeps its programs ([] for Debian's packages)."""
    return [] if prefix is None else [str(Path(prefix) / "bin"), str(Path(prefix) / "sbin")]


def slurm_version(prefix: str | os.PathLike[str] | None = None) -> tuple[int, int, int]:
    """The Slurm version from ``slurmd -V`` ("slurm-wlm 22.05.8" -> (22, 5, 8)): Debian's
    packages, or the build in ``prefix``."""
    slurmd = str(Path(prefix) / "sbin" / "slurmd") if prefix is not None else "slurmd"
    try:
        out = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot run `{slurmd} -V`: {exc}") from exc
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise ClusterError(f"cannot parse the Slurm version from `slurmd -V`: {out.strip()!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def path_additions() -> list[str]:
    """The directories of SANE_PATH that $PATH lacks (the Slurm clients live in /usr/bin)."""
    have = os.environ.get("PATH", "").split(os.pathsep)
    return [p for p in SANE_PATH.split(os.pathsep) if p not in have]


def missing_programs(prefix: str | os.PathLike[str] | None = None) -> list[str]:
    """SLURM_PROGRAMS not found: Slurm's in ``prefix`` when given, munge's on the PATH."""
    path = os.pathsep.join([os.environ.get("PATH", ""), SANE_PATH])
    slurm_path = os.pathsep.join(prefix_dirs(prefix)) if prefix is not None else path
    return [p for p in SLURM_PROGRAMS
            if shutil.which(p, path=path if p in MUNGE_PROGRAMS else slurm_path) is None]


def check_slurm_prefix(prefix: str | os.PathLike[str] | None) -> None:
    """A ``SlurmNotAvailable`` naming what ``prefix`` lacks (None: nothing to check)."""
    if prefix is None:
        return
    lacking = [p for p in missing_programs(prefix) if p not in MUNGE_PROGRAMS]
    if lacking:
        raise SlurmNotAvailable(f"no Slurm in {prefix} ({', '.join(lacking)} missing); "
                                f"build it first: tools/build_slurm.sh {prefix}")


def ensure_slurm_installed(prefix: str | os.PathLike[str] | None = None) -> None:
    """apt-get install the Slurm and munge packages if a program is missing (root only);
    with ``prefix``, Slurm must be built there already and only munge is installed."""
    check_slurm_prefix(prefix)
    missing = missing_programs(prefix)
    if not missing:
        return
    packages = ("munge",) if prefix is not None else SLURM_PACKAGES
    if os.geteuid() != 0:
        raise SlurmNotAvailable(
            f"Slurm is not installed ({', '.join(missing)} missing) and this is not root; "
            f"run: apt-get install -y --no-install-recommends {' '.join(packages)}"
        )
    if shutil.which("apt-get") is None:
        raise SlurmNotAvailable(f"Slurm is not installed and there is no apt-get; install {' '.join(packages)}")
    _apt_install(packages)
    missing = missing_programs(prefix)
    if missing:
        raise SlurmNotAvailable(f"still missing after apt-get install: {', '.join(missing)}")


def _apt_install(packages: tuple[str, ...] = SLURM_PACKAGES) -> None:
    created_policy = False
    if not POLICY_RC_D.exists():  # keep Debian's init scripts from starting the daemons
        POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n", encoding="utf-8")
        POLICY_RC_D.chmod(0o755)
        created_policy = True
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
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
        raise SlurmNotAvailable(f"apt-get install {' '.join(packages)} failed: {last}")
