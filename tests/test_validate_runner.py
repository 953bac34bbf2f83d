"""The hang-proof runner: a command's whole process group dies at its deadline (and
after a normal exit), output comes back even from a killed command, and a command that
cannot start is a result, not an exception."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from slurmgpu.validate import runner

# A parent that prints, starts a grandchild (same process group), records both pids, sleeps.
FAMILY = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
open(sys.argv[1], "w").write(f"{{__import__('os').getpid()}} {{child.pid}}")
print("started", flush=True)
{tail}
"""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def family(tmp_path: Path, tail: str, timeout_s: float) -> tuple[runner.ToolRun, list[int]]:
    pids = tmp_path / "pids"
    result = runner.run([sys.executable, "-c", FAMILY.format(tail=tail), str(pids)], timeout_s)
    return result, [int(p) for p in pids.read_text().split()]


def test_a_hung_command_and_its_child_are_killed_at_the_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    result, pids = family(tmp_path, "time.sleep(3600)", timeout_s=1.0)
    assert result.timed_out and result.rc is None and not result.ok
    assert result.stdout == "started\n"  # what it printed before the kill comes back
    assert time.monotonic() - started < 30  # (bounded by the deadline, not the sleep)
    assert [p for p in pids if alive(p)] == []


def test_a_child_left_behind_by_a_finished_command_is_killed(tmp_path: Path) -> None:
    result, pids = family(tmp_path, "sys.exit(0)", timeout_s=30.0)
    assert result.ok and not result.timed_out
    assert [p for p in pids if alive(p)] == []


def test_the_command_runs_in_its_own_session() -> None:
    result = runner.run([sys.executable, "-c", "import os; print(os.getsid(0), os.getpgid(0), os.getpid())"], 30)
    sid, pgid, pid = (int(x) for x in result.stdout.split())
    assert sid == pgid == pid != os.getsid(0)


def test_a_missing_tool_is_a_result() -> None:
    result = runner.run(["/nonexistent/all_reduce_perf", "-g", "8"], 5)
    assert result.error is not None and "all_reduce_perf" in result.error
    assert result.rc is None and not result.timed_out


def test_exit_code_and_stderr() -> None:
    result = runner.run([sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"], 30)
    assert (result.rc, result.stderr, result.ok) == (3, "boom\n", False)
