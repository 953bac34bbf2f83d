"""Run one command hang-proof: its own process group (a new session), its output to
files (a child left holding a pipe cannot block us), a hard deadline after which the
whole group is killed with SIGKILL, and the group swept after a normal exit too, so
nothing a test started outlives it. A command that cannot start is a ``ToolRun`` with
``error`` set, never an exception. Its stdin: nothing, or bytes given (from a file, so
a command that never reads them cannot block us either)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

#: Output kept per stream (a tool gone mad must not fill our memory).
MAX_OUTPUT = 4 << 20
#: How long to watch a killed group empty (its members reaped) before going on.
GROUP_GONE_S = 1.0


@dataclass(frozen=True)
class ToolRun:
    argv: tuple[str, ...]
    rc: int | None  # None: killed at the deadline, or never started
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    error: str | None = None  # why it could not start

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out


class Running:
    """A started command: its process group and output files, until ``finish``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None, stdin: bytes | None = None) -> None:
        self.argv = tuple(argv)
        self.started = time.monotonic()
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in finish)
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in finish)
        with _input(stdin) as given:
            self.proc = subprocess.Popen(self.argv, stdin=given, stdout=self._out,
                                         stderr=self._err, env=None if env is None else dict(env),
                                         start_new_session=True)

    def wait(self, timeout_s: float) -> bool:
        """True when it exited within ``timeout_s``."""
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill_group(self) -> None:
        """SIGKILL to the whole group, then watch it empty (bounded: ``GROUP_GONE_S``)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.poll()  # (reap our child, so the group can empty)
        until = time.monotonic() + GROUP_GONE_S
        while time.monotonic() < until:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.01)

    def finish(self, timeout_s: float) -> ToolRun:
        """Wait up to ``timeout_s``; kill the group either way; the result."""
        exited = self.wait(timeout_s)
        self.kill_group()
        self.proc.wait()
        return ToolRun(self.argv, self.proc.returncode if exited else None, _read(self._out),
                       _read(self._err), time.monotonic() - self.started, timed_out=not exited)


@contextlib.contextmanager
def _input(data: bytes | None) -> Iterator[IO[bytes] | int]:
    """The child's stdin: /dev/null, or a file holding ``data``."""
    if data is None:
        yield subprocess.DEVNULL
        return
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        handle.seek(0)
        yield handle


def _read(handle: IO[bytes]) -> str:
    with handle:
        handle.seek(0)
        return handle.read(MAX_OUTPUT).decode("utf-8", "replace")


def start(argv: Sequence[str], env: Mapping[str, str] | None = None,
          stdin: bytes | None = None) -> Running | ToolRun:
    """The started command, or a ``ToolRun`` saying why it could not start."""
    try:
        return Running(argv, env, stdin)
    except OSError as exc:
        return ToolRun(tuple(argv), None, "", "", 0.0, error=f"{argv[0]}: {exc.strerror or exc}")


def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None,
        stdin: bytes | None = None) -> ToolRun:
    """Run ``argv`` to its end or ``timeout_s``, whichever comes first."""
    started = start(argv, env, stdin)
    if isinstance(started, ToolRun):
        return started
    return started.finish(timeout_s)
