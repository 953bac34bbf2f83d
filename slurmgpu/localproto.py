"""The agent's local socket protocol: one module for both ends.

Used by ``slurmgpu.quickgate`` (the hooks' client), ``slurmgpu.agent.local`` (the agent's
server), ``slurmgpu doctor`` and the simulator (``slurmgpu.sim.cluster.procs.local_query``).

A Unix-domain stream socket (``$SLURMGPU_AGENT_SOCKET``, else ``[agent] socket``, else
``DEFAULT_SOCKET``). One JSON object per line, UTF-8, newline-terminated: the client sends
one request line (``{"op": ...}``, see ``OPS``), the server answers one reply line
(``{"ok": true, ...}`` or ``error_reply``), preceded by ``ack_reply`` when the request
asked for it (``"ack": true``). Each end checks the other's credentials (``SO_PEERCRED``):
the server serves root, the slurm user and itself (``allowed_uids``); the client believes
only a server run by root or by itself (``check_server``).

Standard library only, and loadable as a bare file: quickgate, run as
``python -I -S quickgate.py`` (no slurmgpu on sys.path), loads this module by path from
its own directory, so it imports nothing of slurmgpu. Python 3.8 syntax (the quick client
runs on any python3 >= 3.8), and only cheap imports (the quick client runs once per job).
"""

from __future__ import annotations

import _socket  # socket.py's enums cost the quick client ~4 ms; the C module does the same
import os
import struct
import time

TYPE_CHECKING = False  # typing costs ~3 ms of start-up; only type checkers need it
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

try:  # the C codec under the json package, whose import (re, enum) costs ~6 ms a job
    import _json
except ImportError:  # another Python implementation: the json package itself
    _json = None  # type: ignore[assignment]

DEFAULT_SOCKET = "/run/slurmgpu/agent.sock"
SOCKET_ENV = "SLURMGPU_AGENT_SOCKET"
#: How long a client waits for the agent to accept a request (``[agent] query_timeout_s``).
DEFAULT_TIMEOUT_S = 0.5
TIMEOUT_ENV = "SLURMGPU_AGENT_TIMEOUT"

#: Requests: ``{"op": <one of these>, ...}``. ``gate``: ``"gpus": [..]``; the hooks:
#: ``"env": {SLURM*, CUDA_VISIBLE_DEVICES}`` (``job_environment``) and ``"ack": true``.
OPS = ("status", "gate", "prolog", "epilog", "healthcheck")
HOOK_OPS = ("prolog", "epilog", "healthcheck")
#: Bounds of one line: a request (the server reads it) and a reply (the client reads it).
MAX_REQUEST_BYTES = 256 * 1024
MAX_REPLY_BYTES = 16 * 1024 * 1024
#: How long the server waits for a client's request line.
READ_TIMEOUT_S = 5.0
#: Extra wait past the agent's own bound (from its ack) for the decision to arrive.
ACK_MARGIN_S = 1.0

#: Job variables a hook passes: these prefixes and names. SLURMGPU_* never reach the
#: agent's gate (``job_env``): the root agent writes and chowns where they point.
ENV_PREFIXES = ("SLURM", "SLURMGPU")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)
OWN_PREFIX = "SLURMGPU_"
_PEERCRED = struct.Struct("3i")


class ProtocolError(ValueError):
    """A line that breaks the protocol: not JSON, too long, cut off."""


class AgentUnavailable(Exception):
    """The agent did not give a usable answer; the caller takes the full path."""


# ------------------------------------------------------------------------ where


def socket_path(environ: Mapping[str, str], configured: object = None) -> str:
    """The agent's socket: ``$SLURMGPU_AGENT_SOCKET``, else ``configured`` (``[agent]
    socket``) when it is a path, else ``DEFAULT_SOCKET``."""
    path = environ.get(SOCKET_ENV)
    if path:
        return path
    return configured if isinstance(configured, str) and configured else DEFAULT_SOCKET


def query_timeout(environ: Mapping[str, str], configured: object = None) -> float:
    """``$SLURMGPU_AGENT_TIMEOUT``, else ``configured`` (``[agent] query_timeout_s``), else
    ``DEFAULT_TIMEOUT_S``; anything that is not a positive number is the default."""
    timeout = DEFAULT_TIMEOUT_S
    text = environ.get(TIMEOUT_ENV)
    try:
        if text:
            timeout = float(text)
        elif isinstance(configured, (int, float)):
            timeout = float(configured)
    except ValueError:
        pass
    return timeout if timeout > 0 else DEFAULT_TIMEOUT_S


# ------------------------------------------------------------------------ lines


#: The ``[agent]`` keys the quick client reads from the config file.
AGENT_KEYS = ("socket", "query_timeout_s")


class Unsure(ValueError):
    """A TOML line that ``scan_table`` cannot read for sure: parse the file instead."""


def scan_table(text: str, table: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """``keys`` of ``[table]`` in a TOML text, read line by line without a TOML parser
    (the quick client runs once per job; tomllib costs ~7 ms): plain ``key = "text"``,
    ``key = 'text'`` or ``key = number`` lines. None when the text may say more than such
    lines show: a multi-line string anywhere, a quoted table name, ``table`` as a dotted
    key or an inline table at the top level, a quoted key or another kind of value for
    one of ``keys``."""
    found: dict[str, Any] = {}
    current: str | None = ""
    try:
        for raw in text.splitlines():
            line = raw.strip()
            if '"""' in line or "'''" in line:
                raise Unsure(line)
            if line.startswith("["):
                current = _header(line)
            elif line and not line.startswith("#"):
                _scan_line(line, current, table, keys, found)
    except Unsure:
        return None
    return found


def _header(line: str) -> str | None:
    """A table header's name (None: an array of tables, never ``[agent]``); a line of a
    multi-line array or a quoted name is Unsure."""
    name = line.split("#", 1)[0].strip()
    if name.startswith("[[") and name.endswith("]]"):
        return None
    if not name.endswith("]") or any(not (c.isalnum() or c in "_-. ") for c in name[1:-1]):
        raise Unsure(line)
    return ".".join(part.strip() for part in name[1:-1].split("."))


def _scan_line(line: str, current: str | None, table: str, keys: tuple[str, ...],
               found: dict[str, Any]) -> None:
    key, _, value = line.partition("=")
    key = key.strip()
    if current == "" and key.split(".", 1)[0].strip().strip("\"'") == table:
        raise Unsure(line)  # agent.socket = ..., agent = { ... }
    if current != table:
        return
    if key[:1] in ("\"", "'"):
        raise Unsure(line)
    if key in keys:
        found[key] = _scalar(value.strip())


def _scalar(text: str) -> str | int | float:
    """A one-line TOML string (no escapes) or number, with an optional comment after it."""
    if text[:1] in ("\"", "'"):
        end = text.find(text[0], 1)
        rest = text[end + 1:].strip() if end > 0 else "?"
        if end < 0 or (text[0] == '"' and "\\" in text[1:end]) or (rest and not rest.startswith("#")):
            raise Unsure(text)
        return text[1:end]
    number = text.split("#", 1)[0].strip()
    try:
        return int(number)
    except ValueError:
        pass
    try:
        return float(number)
    except ValueError:
        raise Unsure(text) from None


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line."""
    return dumps(message, default=str).encode() + b"\n"


def decode(line: bytes) -> Any:
    """A line's JSON value (the caller checks its shape)."""
    try:
        return loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not JSON ({exc})") from None


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``json.dumps(value, default=default)``, by the C encoder json.dumps itself uses."""
    if _json is None:
        import json

        return json.dumps(value, default=default)
    if isinstance(value, str):
        return str(_json.encode_basestring_ascii(value))
    encoder = _json.make_encoder({}, default or _not_serializable, _json.encode_basestring_ascii, None,
                                 ": ", ", ", False, False, True)
    return "".join(encoder(value, 0))


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Decoding:
    """What the C scanner reads of a ``json.JSONDecoder``: ``json.loads``' defaults."""

    def __init__(self) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
        self.memo: dict[str, str] = {}


def loads(data: bytes) -> Any:
    """``json.loads`` of UTF-8 text, by the C scanner json.loads itself uses. ValueError
    for what is not one JSON value."""
    if _json is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8", "surrogatepass")
    try:
        scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # (typeshed: a JSONDecoder)
        value, end = scan(text, _after_blanks(text, 0))
    except StopIteration as stop:
        raise ValueError(f"Expecting value: char {stop.value}") from None
    if _after_blanks(text, end) != len(text):
        raise ValueError(f"Extra data: char {end}")
    return value


def _after_blanks(text: str, index: int) -> int:
    return len(text) - len(text[index:].lstrip(" \t\n\r"))


class LineReader:
    """Newline-terminated lines from a stream socket, each bounded in size and in time."""

    def __init__(self, sock: _socket.socket, max_bytes: int = MAX_REPLY_BYTES) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.buf = b""

    def read(self, deadline: float) -> bytes:
        """The next line, without its newline, by ``deadline`` (``time.monotonic()``); at
        the end of the stream, what is left of it. TimeoutError past the deadline;
        ProtocolError for a line over ``max_bytes`` or a stream that ends empty."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                if not self.buf:
                    raise ProtocolError("connection closed")
                line, self.buf = self.buf, b""
                return line
            self.buf += chunk
            if len(self.buf) > self.max_bytes:
                raise ProtocolError("too long")
        line, self.buf = self.buf.split(b"\n", 1)
        return line


# ------------------------------------------------------------------------ peers


def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def uid_of(user: str | None) -> int | None:
    if not user:
        return None
    import pwd  # the server's side only

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def allowed_uids(slurm_user: str | None) -> frozenset[int]:
    """Who may ask the agent: uid 0, this process's uid, and the uid of ``slurm_user``
    (when that user exists)."""
    uids = {0, os.geteuid()}
    slurm_uid = uid_of(slurm_user)
    if slurm_uid is not None:
        uids.add(slurm_uid)
    return frozenset(uids)


def peer_allowed(uid: int, allowed: frozenset[int]) -> bool:
    return uid in allowed


def check_server(sock: _socket.socket) -> None:
    """Only the agent (root, or this client's own user) may answer: whoever else created a
    socket at that path would decide whether jobs run."""
    _pid, uid, _gid = peer_credentials(sock)
    if uid not in (0, os.geteuid()):
        raise AgentUnavailable(f"the socket's server runs as uid {uid}, not root: not the agent")


# ------------------------------------------------------------------------ client


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a hook sends as ``"env"``: SLURM*, SLURMGPU*, CUDA_VISIBLE_DEVICES."""
    return {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def hook_request(phase: str, environ: Mapping[str, str]) -> dict[str, Any]:
    return {"op": phase, "env": job_environment(environ), "ack": True}


def ask(path: str, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request line, return the reply object. With ``"ack": true`` the agent
    must accept within ``timeout`` and then answer within the bound its ack names.
    AgentUnavailable when it does not (no socket, refused, not the agent, timeout, a bad
    reply)."""
    deadline = time.monotonic() + timeout
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            reply = _exchange(sock, path, request, timeout, deadline)
        finally:
            sock.close()
    except OSError as exc:  # no socket, refused, permission, timeout
        raise AgentUnavailable(str(exc)) from None
    except ProtocolError as exc:
        raise AgentUnavailable(f"bad reply: {exc}") from None
    return reply


def _exchange(sock: _socket.socket, path: str, request: Mapping[str, Any], timeout: float,
              deadline: float) -> dict[str, Any]:
    sock.settimeout(timeout)
    sock.connect(path)
    check_server(sock)
    try:  # noqa: SIM105  (contextlib costs the quick client start-up time)
        sock.sendall(encode(request))
    except (BrokenPipeError, ConnectionResetError):
        pass  # a refusal may be answered, and the socket closed, before the request is read
    lines = LineReader(sock)
    reply = _reply(lines.read(deadline))
    if reply.get("ack") is True:
        wait = reply.get("wait_s")
        wait = float(wait) if isinstance(wait, (int, float)) else 0.0
        reply = _reply(lines.read(time.monotonic() + wait + ACK_MARGIN_S))
    return reply


def _reply(line: bytes) -> dict[str, Any]:
    reply = decode(line)
    if not isinstance(reply, dict):
        raise ProtocolError("not an object")
    return reply


def hook_decision(reply: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """(exit code, record) of a prolog/epilog/healthcheck reply; AgentUnavailable when it
    has none."""
    code = reply.get("exit")
    if reply.get("ok") is not True or not isinstance(code, int) or isinstance(code, bool):
        raise AgentUnavailable(f"agent said: {reply.get('error') or 'no decision'}")
    record = reply.get("record")
    out = dict(record) if isinstance(record, dict) else {"exit": code}
    out.setdefault("path", "agent")
    return code, out


# ------------------------------------------------------------------------ server


def job_env(raw: Any) -> dict[str, str]:
    """The job variables of a request, filtered to the names a hook may pass. SLURMGPU_*
    variables (state and jobs directories, kernel log, device pattern, ...) are never taken
    from a socket client: the root agent writes and chowns where they point, so its own
    environment supplies them (``agent_paths``)."""
    if not isinstance(raw, dict):
        raise ValueError("'env' must be an object of strings")
    env = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError("'env' must be an object of strings")
        if (key in ENV_NAMES or key.startswith(ENV_PREFIXES)) and not key.startswith(OWN_PREFIX):
            env[key] = value
    return env


def agent_paths(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's own SLURMGPU_* settings, which a request's gate runs with."""
    return {k: v for k, v in environ.items() if k.startswith(OWN_PREFIX)}


def read_request(sock: _socket.socket) -> dict[str, Any]:
    """The client's request line (bounded: ``MAX_REQUEST_BYTES``, ``READ_TIMEOUT_S``):
    ValueError (``bad request: ...``) or a timeout when it is none."""
    try:
        request = decode(LineReader(sock, MAX_REQUEST_BYTES).read(time.monotonic() + READ_TIMEOUT_S))
    except ProtocolError as exc:
        raise ValueError(f"bad request: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        raise ValueError("bad request: expected an object with an 'op'")
    return request


def error_reply(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def ack_reply(wait_s: float) -> dict[str, Any]:
    """Sent first, once a request with ``"ack": true`` is accepted: the longest the
    answer may take."""
    return {"ok": True, "ack": True, "wait_s": wait_s}


def hook_reply(code: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A prolog/epilog/healthcheck answer: the exit code and the gate's records."""
    return {"ok": True, "exit": code, "record": records[-1] if records else None, "records": records}
