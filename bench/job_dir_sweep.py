#!/usr/bin/env python3
"""Deleting what a job left in its job directory: ``shutil.rmtree`` (what the epilog did
before issue 37) against ``jobfiles.retire_job_dir`` + ``jobfiles.sweep_trash`` (what it
does now), on a tmpfs (/dev/shm, as /run is), each in a fresh process so its peak RSS
(VmHWM) is its own.

    python bench/job_dir_sweep.py [--entries 150000] [--name-len 200] [--json]

Reports, for each: seconds to delete, the process's peak RSS growth (MB), and for the
sweep the seconds the rename took (what the epilog waits for before it answers).

Targets: the rename under 1 ms whatever the entries; the sweep's RSS growth under 2 MB
(rmtree's grows with the entries: it lists a directory whole).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, shutil, sys, time
from slurmgpu import jobfiles

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

how, jobs = sys.argv[1], sys.argv[2]
before = hwm()
start = time.perf_counter()
rename_s = None
if how == "rmtree":
    shutil.rmtree(os.path.join(jobs, "1"))
else:
    jobfiles.retire_job_dir(jobs, "1")
    rename_s = time.perf_counter() - start
    while not jobfiles.sweep_trash(jobs).done:
        pass
print(json.dumps({"how": how, "seconds": round(time.perf_counter() - start, 3),
                  "rename_ms": None if rename_s is None else round(rename_s * 1000, 3),
                  "rss_growth_mb": round(hwm() - before, 1)}))
"""


def fill(jobs: Path, entries: int, name_len: int) -> None:
    directory = jobs / "1"
    directory.mkdir(parents=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stem = "x" * max(1, name_len - 8)
        for i in range(entries):
            os.mknod(f"{stem}{i:08d}", 0o600 | stat.S_IFREG, dir_fd=fd)
    finally:
        os.close(fd)


def run(how: str, entries: int, name_len: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="slurmgpu-bench-", dir="/dev/shm"))
    try:
        fill(base / "jobs", entries, name_len)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-c", CHILD, how, str(base / "jobs")], env=env,
                             check=True, capture_output=True, text=True).stdout
        result: dict[str, Any] = json.loads(out)
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=150_000)
    parser.add_argument("--name-len", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [run(how, args.entries, args.name_len) for how in ("rmtree", "sweep")]
    if args.json:
        print(json.dumps({"entries": args.entries, "name_len": args.name_len, "runs": results}))
        return
    print(f"{args.entries} entries, names of {args.name_len} characters, on /dev/shm")
    for r in results:
        rename = "" if r["rename_ms"] is None else f", rename {r['rename_ms']} ms"
        print(f"  {r['how']:7s} {r['seconds']:6.2f} s, peak RSS +{r['rss_growth_mb']} MB{rename}")


if __name__ == "__main__":
    main()
