"""tools/build_slurm.sh: it refuses a tarball that does not match SHA256SUMS or is missing
(one clear line, nothing built), and returns at once when the prefix holds its build."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "build_slurm.sh"


def build(prefix: Path, vendor: Path, version: str = "25.11.7") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURMGPU_VENDOR_DIR": str(vendor), "SLURM_VERSION": version}
    return subprocess.run(["bash", str(SCRIPT), str(prefix)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def vendor_dir(tmp_path: Path, listed: str) -> Path:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "slurm-25.11.7.tar.xz").write_bytes(b"not the real tarball")
    (vendor / "SHA256SUMS").write_text(f"{listed}  slurm-25.11.7.tar.xz\n")
    return vendor


def test_a_tarball_that_does_not_match_its_checksum_is_refused(tmp_path: Path) -> None:
    proc = build(tmp_path / "prefix", vendor_dir(tmp_path, "0" * 64))
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == ("build_slurm.sh: slurm-25.11.7.tar.xz does not match "
                                            "SHA256SUMS: refusing to build")
    assert not (tmp_path / "prefix").exists()


def test_a_missing_tarball_says_where_it_looked(tmp_path: Path) -> None:
    vendor = vendor_dir(tmp_path, hashlib.sha256(b"not the real tarball").hexdigest())
    proc = build(tmp_path / "prefix", vendor, version="99.1.1")
    assert proc.returncode == 1
    assert proc.stderr == (f"build_slurm.sh: no slurm-99.1.1.tar.xz in {vendor} "
                           "(set SLURMGPU_VENDOR_DIR)\n")


def test_a_prefix_that_holds_the_build_returns_at_once() -> None:
    """Against the real build (CI's cache, or $SLURMGPU_SLURM_PREFIX)."""
    prefix = Path(os.environ.get("SLURMGPU_SLURM_PREFIX") or "/var/cache/slurmgpu-ci/slurm-25.11.7")
    vendor = Path(os.environ.get("SLURMGPU_VENDOR_DIR") or SCRIPT.parents[2] / "shared" / "vendor")
    if not (prefix / ".slurmgpu-build").is_file() or not (vendor / "SHA256SUMS").is_file():
        pytest.skip(f"no Slurm build in {prefix} or no source in {vendor}")
    started = time.monotonic()
    proc = build(prefix, vendor)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"build_slurm.sh: Slurm 25.11.7 already built in {prefix}\n"
    assert time.monotonic() - started < 30  # a checksum, no build
