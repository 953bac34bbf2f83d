#!/usr/bin/env -S python3 -I -S
"""``slurmgpu-taskprolog``: Slurm ``TaskProlog=``, standard library only.

Prints ``export SLURMGPU_CHECKPOINT_FILE=<jobs_dir>/<SLURM_JOB_ID>/checkpoint`` (Slurm
sets what a TaskProlog prints as ``export NAME=value`` in the task's environment), so
a job finds the file the node's agent writes when it asks the job to checkpoint (see
``slurmgpu ckpt``). jobs_dir: ``$SLURMGPU_JOBS_DIR``, else ``[agent] jobs_dir`` of
``$SLURMGPU_CONFIG`` or /etc/slurmgpu/slurmgpu.toml, else /run/slurmgpu/jobs.

It never fails a task: it always exits 0, and prints nothing without a (valid)
SLURM_JOB_ID. Run with ``python3 -I -S`` (no site-packages): the logic lives in
``slurmgpu.jobfiles``, found next to this file (through the symlink Slurm runs).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


def _jobfiles() -> Any:
    try:
        from slurmgpu import jobfiles
    except ImportError:  # -I -S: a checkout holds the package next to this file (a symlink)
        sys.path.append(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        try:
            from slurmgpu import jobfiles
        except ImportError:  # an installed file: this interpreter's site-packages have it
            import site

            site.main()
            from slurmgpu import jobfiles
    return jobfiles


def export_line(environ: Mapping[str, str]) -> str | None:
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    jobfiles = _jobfiles()
    if not job_id or not jobfiles.valid_job_id(job_id):
        return None
    path = os.path.join(jobfiles.configured_jobs_dir(environ), job_id, jobfiles.CHECKPOINT_NAME)
    return f"export {jobfiles.CHECKPOINT_FILE_ENV}={path}"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        line = export_line(os.environ)
        if line:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except Exception as exc:  # never fail the task
        import contextlib

        with contextlib.suppress(Exception):
            sys.stderr.write(f"slurmgpu-taskprolog: {type(exc).__name__}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
