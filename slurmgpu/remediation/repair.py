"""The runner of ``[remediation] repair_command``: the command (split like a shell line,
run without a shell) gets the ticket on stdin, runs in a process group of its own under a
timeout (then the whole group is killed), and what it did comes back as a
``RepairRun``. It never raises: a missing, failing or hanging command is said in the
result and changes nothing about the node, which stays drained for repair.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from slurmgpu.validate.runner import run

#: Kept of the command's stderr (its last characters: where the error usually is).
STDERR_KEPT = 2000


@dataclass(frozen=True)
class RepairRun:
    """``exit_code`` None: it could not start or was killed at the timeout (``error``
    says which); ``ok``: it ran and exited 0."""

    command: str
    exit_code: int | None
    stderr: str
    duration_s: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error


def run_repair(command: str, ticket: dict[str, Any], timeout_s: float) -> RepairRun:
    """Run ``command`` with ``ticket`` (JSON, one object) on stdin."""
    try:
        argv = shlex.split(command)
        data = json.dumps(ticket, sort_keys=True).encode()
    except (ValueError, TypeError) as exc:
        return RepairRun(command, None, "", 0.0, error=f"not run: {exc}")
    if not argv:
        return RepairRun(command, None, "", 0.0, error="not run: no repair_command")
    try:
        done = run(argv, timeout_s, stdin=data)
    except Exception as exc:  # (slurmgpu's trouble never reaches the caller)
        return RepairRun(command, None, "", 0.0, error=f"not run: {type(exc).__name__}: {exc}")
    error = done.error or (f"killed after {timeout_s:g} s" if done.timed_out else "")
    if not error and done.rc != 0:
        error = f"exit {done.rc}"
    return RepairRun(command, done.rc, done.stderr[-STDERR_KEPT:], round(done.duration_s, 3), error)
