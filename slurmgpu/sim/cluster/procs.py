"""Processes of the simulated cluster: liveness by /proc, free ports, detached daemons,
termination, and the agents' local socket and the collector's hellos."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmgpu import localproto
from slurmgpu.sim.cluster.common import BASE_PORT, ClusterError, log_tail


def proc_alive(pid: int) -> bool:
    """True for a running process; zombies (not reaped by a minimal init) count as dead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, start: int = BASE_PORT, prefer: list[int] | None = None) -> list[int]:
    """``count`` consecutive free TCP ports from ``start`` (``prefer`` first, if all free)."""
    if prefer and len(prefer) == count and all(port_free(p) for p in prefer):
        return prefer
    port = start
    while port + count < 65000:
        block = list(range(port, port + count))
        busy = [p for p in block if not port_free(p)]
        if not busy:
            return block
        port = busy[-1] + 1
    raise ClusterError(f"no {count} consecutive free TCP ports from {start}")


def terminate(pids: list[int], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(proc_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if proc_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def spawn_detached(args: list[str], *, env: Mapping[str, str], log: Path, pid_file: Path,
                   cwd: Path | None = None) -> int:
    """Start ``args`` as a daemon: its own session, reparented to init (so nobody has to
    reap it), output appended to ``log``, PID written to ``pid_file``. Returns the PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    # sh starts `setsid prog` in the background (not a group leader: setsid execs in
    # place, so $! is the program's PID) and exits; the program is orphaned to init.
    script = 'exec </dev/null >>"$1" 2>&1; shift; setsid "$@" & echo $! >"$0.tmp" && mv "$0.tmp" "$0"'
    with open(log, "ab") as fh:
        fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {shlex.join(args)}\n".encode())
    proc = subprocess.run(["sh", "-c", script, str(pid_file), str(log), *args], env=dict(env),
                          cwd=cwd, timeout=30, check=False)
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise ClusterError(f"could not start {args[0]} (status {proc.returncode}); "
                           f"{log_tail(log)}") from exc
    return pid


def local_query(path: str | os.PathLike[str], request: Mapping[str, Any],
                timeout: float = 2.0) -> dict[str, Any]:
    """One request to an agent's local socket (``slurmgpu.localproto``);
    ``{"ok": False, "error": ...}`` when it does not answer."""
    try:
        return localproto.ask(str(path), request, timeout)
    except localproto.AgentUnavailable as exc:
        return {"ok": False, "error": f"{path}: {exc}"}


def hello_times(db: Path) -> dict[str, float]:
    """{node: received_at of its latest hello} in a collector database (read-only)."""
    import sqlite3

    from slurmgpu.collector.store import queries

    if not db.exists():
        return {}
    try:
        with queries.snapshot(db, timeout_s=2) as conn:
            return queries.hello_times(conn)
    except sqlite3.Error:
        return {}
