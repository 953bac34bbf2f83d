#!/usr/bin/env -S python3 -I -S
"""``slurmgpu-quickgate prolog|epilog``: the warm hook path, standard library only.

Asks the node's agent (``slurmgpu.agent.local``) to run the prolog/epilog gate on its
cached facts, exits with the agent's exit code and writes the agent's gate record as
one JSON line on stderr (it carries ``"path": "agent"``). When the agent does not
answer (no socket, refused, timeout, bad reply) it execs the full path,
``slurmgpu prolog|epilog`` (``$SLURMGPU_BIN``, split on whitespace), so an agent that is
down never blocks a job nor skips the gate.

Socket: ``$SLURMGPU_AGENT_SOCKET``, else ``[agent] socket`` of the config file
(``--config``, ``$SLURMGPU_CONFIG`` or /etc/slurmgpu/slurmgpu.toml, read only when it
exists), else /run/slurmgpu/agent.sock. The agent must accept within
``$SLURMGPU_AGENT_TIMEOUT`` / ``[agent] query_timeout_s`` (default 0.5 s).

Keep this module to the standard library: it runs once per job, and every import
costs start-up time (tests check it).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

TYPE_CHECKING = False  # typing costs ~3 ms of start-up; only type checkers need it
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, NoReturn

DEFAULT_SOCKET = "/run/slurmgpu/agent.sock"
DEFAULT_CONFIG = "/etc/slurmgpu/slurmgpu.toml"
DEFAULT_TIMEOUT_S = 0.5
SOCKET_ENV = "SLURMGPU_AGENT_SOCKET"
TIMEOUT_ENV = "SLURMGPU_AGENT_TIMEOUT"
CONFIG_ENV = "SLURMGPU_CONFIG"
BIN_ENV = "SLURMGPU_BIN"
PHASES = ("prolog", "epilog", "healthcheck")
#: Extra wait past the agent's own bound (from its ack) for the decision to arrive.
ACK_MARGIN_S = 1.0
ENV_PREFIXES = ("SLURM", "SLURMGPU")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)


class AgentUnavailable(Exception):
    """The agent did not give a usable answer; the caller takes the full path."""


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the agent's gate reads: SLURM*, SLURMGPU*, CUDA_VISIBLE_DEVICES."""
    return {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def config_file(args: Sequence[str], environ: Mapping[str, str]) -> str:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def read_config(path: str) -> dict[str, Any]:
    """The config file's tables, or {} when it is absent or unreadable (the full path
    reports config errors; this one only needs ``[agent]``)."""
    if not os.path.isfile(path):
        return {}
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _table(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = config.get(name)
    return table if isinstance(table, dict) else {}


def agent_endpoint(args: Sequence[str], environ: Mapping[str, str]) -> tuple[str, float]:
    """(socket path, query timeout)."""
    path = environ.get(SOCKET_ENV)
    timeout_text = environ.get(TIMEOUT_ENV)
    agent: Mapping[str, Any] = {}
    if not path or not timeout_text:
        agent = _table(read_config(config_file(args, environ)), "agent")
    if not path:
        path = agent.get("socket") if isinstance(agent.get("socket"), str) else DEFAULT_SOCKET
    timeout = DEFAULT_TIMEOUT_S
    try:
        if timeout_text:
            timeout = float(timeout_text)
        elif isinstance(agent.get("query_timeout_s"), (int, float)):
            timeout = float(agent["query_timeout_s"])
    except ValueError:
        pass
    return str(path), timeout if timeout > 0 else DEFAULT_TIMEOUT_S


def ask_agent(path: str, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request line, return the reply object. With ``"ack": true`` the agent
    must accept within ``timeout`` and then decide within the bound its ack names."""
    deadline = time.monotonic() + timeout
    buf = b""

    def read_line(until: float) -> dict[str, Any]:
        nonlocal buf
        while b"\n" not in buf:
            left = until - time.monotonic()
            if left <= 0:
                raise AgentUnavailable("timed out")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                raise AgentUnavailable("connection closed")
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise AgentUnavailable(f"bad reply: {exc}") from None
        if not isinstance(reply, dict):
            raise AgentUnavailable("bad reply: not an object")
        return reply

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            check_peer(sock)
            sock.sendall(json.dumps(request).encode() + b"\n")
            reply = read_line(deadline)
            if reply.get("ack") is True:
                wait = reply.get("wait_s")
                wait = float(wait) if isinstance(wait, (int, float)) else 0.0
                reply = read_line(time.monotonic() + wait + ACK_MARGIN_S)
    except OSError as exc:  # no socket, refused, permission, timeout
        raise AgentUnavailable(str(exc)) from None
    return reply


def check_peer(sock: socket.socket) -> None:
    """Only the agent (root, or this hook's own user) may answer: whoever else created a
    socket at that path would decide whether jobs run (SO_PEERCRED: pid, uid, gid)."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    if uid not in (0, os.geteuid()):
        raise AgentUnavailable(f"the socket's server runs as uid {uid}, not root: not the agent")


def decision(reply: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """(exit code, record) of a prolog/epilog reply; AgentUnavailable when it has none."""
    code = reply.get("exit")
    if reply.get("ok") is not True or not isinstance(code, int) or isinstance(code, bool):
        raise AgentUnavailable(f"agent said: {reply.get('error') or 'no decision'}")
    record = reply.get("record")
    out = dict(record) if isinstance(record, dict) else {"exit": code}
    out.setdefault("path", "agent")
    return code, out


def full_path(phase: str, args: Sequence[str], environ: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``slurmgpu <phase> <args>``."""
    sys.stdout.flush()
    sys.stderr.flush()
    configured = environ.get(BIN_ENV, "").split()
    command = [*(configured or ["slurmgpu"]), phase, *args]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        error = f"{command[0]}: {exc}"
    if not configured:  # not on PATH: this interpreter has slurmgpu (it runs this module)
        try:
            os.execv(sys.executable, [sys.executable, "-m", "slurmgpu", phase, *args])
        except OSError as exc:
            error += f"; {sys.executable} -m slurmgpu: {exc}"
    # Neither path can run. Follow the configured on_error (default fail-open), loudly.
    policy = _table(read_config(config_file(args, environ)), phase).get("on_error", "fail-open")
    code = 1 if policy == "fail-closed" else 0
    sys.stderr.write(json.dumps({"phase": phase, "path": "none", "action": policy,
                                 "error": f"cannot run the slurmgpu {phase}: {error}"}) + "\n")
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in PHASES:
        sys.stderr.write("usage: slurmgpu-quickgate prolog|epilog|healthcheck [--config FILE]\n")
        return 2
    phase, rest = args[0], args[1:]
    environ = os.environ
    path, timeout = agent_endpoint(rest, environ)
    request = {"op": phase, "env": job_environment(environ), "ack": True}
    try:
        code, record = decision(ask_agent(path, request, timeout))
    except AgentUnavailable:
        full_path(phase, rest, environ)
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
