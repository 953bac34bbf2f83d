#!/usr/bin/env -S python3 -I -S
"""``slurmgpu-quickgate prolog|epilog``: the warm hook path, standard library only. It asks
the node agent over its unix socket (``localproto``) and exits with its decision; when
no agent answers in time it execs the full path (``slurmgpu prolog|epilog``), so a missing
agent never changes a decision.

Design notes: docs/design-notes.md (``slurmgpu/quickgate.py``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs ~3 ms of start-up; only type checkers need it
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

DEFAULT_CONFIG = "/etc/slurmgpu/slurmgpu.toml"
CONFIG_ENV = "SLURMGPU_CONFIG"
BIN_ENV = "SLURMGPU_BIN"
PHASES = ("prolog", "epilog", "healthcheck")
#: The socket protocol, shared with the agent: slurmgpu/localproto.py, beside this file.
PROTOCOL_FILE = "localproto.py"
_protocol: Any = None


def protocol() -> Any:
    """``slurmgpu.localproto``: imported when this module is (``python -m``, the console
    script); else loaded by path from this file's directory, symlinks resolved (``python
    -I -S quickgate.py``, /usr/libexec/slurmgpu/slurmgpu-quickgate: no slurmgpu on
    sys.path). Standard library only, like this module."""
    global _protocol
    if _protocol is None:
        if __package__:
            import importlib

            _protocol = importlib.import_module(__package__ + ".localproto")
        else:
            from importlib.machinery import SourceFileLoader

            path = os.path.join(os.path.dirname(os.path.realpath(__file__)), PROTOCOL_FILE)
            module = type(sys)("slurmgpu_localproto")
            module.__file__ = path
            SourceFileLoader(module.__name__, path).exec_module(module)
            _protocol = module
    return _protocol


def config_file(args: Sequence[str], environ: Mapping[str, str]) -> str:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def read_text(path: str) -> str | None:
    """A config file's text, or None when it is absent or unreadable (the full path
    reports config errors; this one only needs a few settings)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, ValueError):
        return None


def parse_config(text: str | None) -> dict[str, Any]:
    """A config file's tables, or {} when there is no text or it is not TOML."""
    if text is None:
        return {}
    try:
        import tomllib
    except ImportError:  # Python < 3.11 runs the quick client, not slurmgpu: no config
        return {}
    try:
        data = tomllib.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def config_files(path: str) -> list[str]:
    """The config file, then its drop-ins."""
    return [path, *dropin_files(path)]


def read_config(path: str) -> dict[str, Any]:
    """The config's top-level tables: the file's, then each drop-in's (``slurmgpu.config.load``:
    ``<name>.d/*.toml`` beside it, in byte order of their names) merged over them key by
    key; {} for a file that is absent or unreadable (the full path reports config errors;
    this one only needs a few keys)."""
    merged: dict[str, Any] = {}
    for one in config_files(path):
        for name, table in parse_config(read_text(one)).items():
            if isinstance(table, dict) and isinstance(merged.get(name), dict):
                merged[name] = {**merged[name], **table}
            else:
                merged[name] = table
    return merged


def dropin_files(path: str) -> list[str]:
    """``slurmgpu.config.load.dropin_files`` with the standard library only (no errors)."""
    root, ext = os.path.splitext(path)
    directory = (root if ext == ".toml" else path) + ".d"
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    wanted = [n for n in names if n.endswith(".toml") and not n.startswith(".")]
    return [os.path.join(directory, n) for n in sorted(wanted, key=os.fsencode)]


def agent_settings(path: str) -> Mapping[str, Any]:
    """``[agent] socket`` and ``query_timeout_s`` of the config file and its drop-ins:
    scanned line by line (``localproto.scan_table``: no TOML parser on the warm path),
    parsed (``read_config``) when the scan of any of them cannot be sure."""
    found: dict[str, Any] = {}
    for one in config_files(path):
        text = read_text(one)
        scanned = protocol().scan_table(text, "agent", protocol().AGENT_KEYS) if text is not None else {}
        if scanned is None:
            return _table(read_config(path), "agent")
        found.update(scanned)
    return found


def _table(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = config.get(name)
    return table if isinstance(table, dict) else {}


def agent_endpoint(args: Sequence[str], environ: Mapping[str, str]) -> tuple[str, float]:
    """(socket path, query timeout): the environment, else ``[agent]`` of the config file
    (read only when the environment does not say both)."""
    proto = protocol()
    agent: Mapping[str, Any] = {}
    if not environ.get(proto.SOCKET_ENV) or not environ.get(proto.TIMEOUT_ENV):
        agent = agent_settings(config_file(args, environ))
    return (proto.socket_path(environ, agent.get("socket")),
            proto.query_timeout(environ, agent.get("query_timeout_s")))


#: The full path's exit code when the interpreter cannot even import slurmgpu (see
#: BOOTSTRAP); the hooks themselves only exit 0, 1 or 3.
CANNOT_START = 97
PYTHON_ENV = "SLURMGPU_PYTHON"
#: The pipe (a file descriptor number) on which the full path says it decided.
DECIDED_FD_ENV = "SLURMGPU_DECIDED_FD"
#: Set by the hook wrappers: exit with the code plus WRAPPED_OFFSET, so that a wrapper can
#: tell this client's answer from an interpreter that could not run it at all.
WRAPPER_ENV = "SLURMGPU_WRAPPER"
WRAPPED_OFFSET = 100
#: The oldest Python this client runs on (localproto's syntax, os.posix_spawn): an older
#: one says so and exits NOT_AN_ANSWER, so that a wrapper tries its next interpreter.
MIN_PYTHON = (3, 8)
NOT_AN_ANSWER = 2
#: Interpreters a package installs slurmgpu for, tried after $SLURMGPU_PYTHON and a
#: ``slurmgpu`` console script on PATH: the RPM's private venv, then Debian's python3.
PACKAGED_PYTHONS = ("/usr/lib/slurmgpu/venv/bin/python", "/usr/bin/python3")
#: Run as ``python -c BOOTSTRAP <phase> <args>``: an interpreter that cannot import
#: slurmgpu (not installed there, too old, a broken dependency) exits CANNOT_START
#: instead of 1, which Slurm would answer by draining the node. The hook's working
#: directory is not searched for modules (-c puts it first). (Old-Python syntax.)
BOOTSTRAP = (
    "import sys\n"
    "if sys.path[:1] == ['']:\n"
    "    del sys.path[0]\n"
    "try:\n"
    "    if sys.version_info < (3, 11):\n"
    "        raise ImportError('Python %d.%d is older than 3.11' % sys.version_info[:2])\n"
    "    from slurmgpu.cli import main\n"
    "except BaseException as exc:\n"
    "    sys.stderr.write('slurmgpu cannot start with %s: %s: %s\\n' % (sys.executable, type(exc).__name__, exc))\n"
    "    sys.exit(97)\n"
    "sys.argv[0] = 'slurmgpu'\n"
    "main()\n"
)


def which(name: str, environ: Mapping[str, str]) -> str | None:
    """``name`` as an executable path (searched on $PATH when it has no slash)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else None
    for directory in environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return path
    return None


def python_of(script: str) -> str | None:
    """The Python interpreter a console script's shebang names, if it names one."""
    try:
        with open(script, "rb") as f:
            line = f.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    words = line[2:].split() if line.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = words[1:]
    if words and os.path.basename(words[0]).startswith("python") and os.path.isabs(words[0]):
        return words[0]
    return None


def pythons(environ: Mapping[str, str]) -> list[str]:
    """Interpreters to run BOOTSTRAP with, best first: $SLURMGPU_PYTHON, the one of a
    ``slurmgpu`` script on PATH, this one when it imported this module from the package,
    the packaged ones present (the last packaged one when none is)."""
    script = which("slurmgpu", environ)
    packaged = [p for p in PACKAGED_PYTHONS if os.access(p, os.X_OK)] or [PACKAGED_PYTHONS[-1]]
    found = [environ.get(PYTHON_ENV, ""), (python_of(script) if script else None) or "",
             sys.executable if __name__ == "slurmgpu.quickgate" else "", *packaged]
    return list(dict.fromkeys(p for p in found if p))


def full_path_commands(phase: str, args: Sequence[str], environ: Mapping[str, str]) -> list[list[str]]:
    """Every way to run ``slurmgpu <phase> <args>``, tried in order until one decides:
    $SLURMGPU_BIN as given, then each of ``pythons`` running BOOTSTRAP."""
    configured = environ.get(BIN_ENV, "").split()
    commands = [[*configured, phase, *args]] if configured else []
    return commands + [[python, "-c", BOOTSTRAP, phase, *args] for python in pythons(environ)]


def run_full_path(phase: str, args: Sequence[str], environ: Mapping[str, str]) -> int | str:
    """The exit code of the first full path that reaches a decision of its own, or why
    none did (nothing to execute, no slurmgpu there, another program, killed)."""
    failures: list[str] = []
    for command in full_path_commands(phase, args, environ):
        result = run_one(command, environ)
        if isinstance(result, int):
            return result
        failures.append(result)
    return "; ".join(failures)


def run_one(command: list[str], environ: Mapping[str, str]) -> int | str:
    """Run one full path as a child with a pipe on which slurmgpu says it decided
    (``tell_decided``): its exit code when it did, else why it did not."""
    executable = which(command[0], environ)
    if executable is None:
        return f"{command[0]}: no such executable (set {PYTHON_ENV} in /etc/default/slurmgpu)"
    sys.stdout.flush()
    sys.stderr.flush()
    said, tell = os.pipe()
    try:
        status = _spawn_and_wait(executable, command, environ, tell)
    except OSError as exc:
        return f"{command[0]}: {exc.strerror or exc}"
    finally:
        os.close(tell)
        decided = _read_decision(said)
    return _outcome(command, status, decided)


def _spawn_and_wait(executable: str, command: list[str], environ: Mapping[str, str], tell: int) -> int:
    """The child's wait status; it inherits ``tell`` (named by $SLURMGPU_DECIDED_FD)."""
    os.set_inheritable(tell, True)
    env = {k: v for k, v in environ.items() if k != WRAPPER_ENV}
    pid = os.posix_spawn(executable, command, {**env, DECIDED_FD_ENV: str(tell)})
    return os.waitpid(pid, 0)[1]


def _read_decision(said: int) -> str:
    """What the child wrote on the decision pipe ('' when nothing): never waits (a
    grandchild may still hold the pipe open)."""
    try:
        os.set_blocking(said, False)
        return os.read(said, 256).decode("ascii", "replace")
    except OSError:  # nothing written (EAGAIN)
        return ""
    finally:
        os.close(said)


def _outcome(command: list[str], status: int, decided: str) -> int | str:
    """The child's exit code once it decided (a child killed after a FAIL verdict still
    refuses: exit 1); else why this full path could not judge the node."""
    if os.WIFSIGNALED(status):
        if "FAIL" in decided:
            return 1
        return f"{command[0]} was killed by signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    if decided:
        return code
    if code == CANNOT_START and command[1:2] == ["-c"]:
        return f"{command[0]} cannot import slurmgpu (set {PYTHON_ENV} in /etc/default/slurmgpu)"
    return f"{command[0]} exited {code} before slurmgpu decided (is it slurmgpu?)"


def tell_decided(what: str, environ: Mapping[str, str] = os.environ) -> None:
    """The full path tells the quick client that slurmgpu itself decided (``what``: the
    verdict, or the hook's own on_error decision): from then on its exit code stands.
    A no-op unless the quick client gave this process its pipe."""
    fd = environ.get(DECIDED_FD_ENV, "")
    if not fd.isdigit():
        return
    try:
        import stat

        if stat.S_ISFIFO(os.fstat(int(fd)).st_mode):
            os.write(int(fd), what.encode("ascii", "replace") + b"\n")
    except OSError:  # the quick client is gone: nobody to tell
        pass


def cannot_run(phase: str, args: Sequence[str], environ: Mapping[str, str], error: str) -> int:
    """slurmgpu itself cannot judge the node (not installed, import error, a bug here):
    follow ``[<phase>] on_error`` (default fail-open) with one loud line on stderr
    (slurmd's log) and in syslog. It never refuses a job for its own install problem
    unless the site asked for fail-closed; the health check says UNKNOWN (3)."""
    policy = _table(read_config(config_file(args, environ)), phase).get("on_error")
    policy = policy if policy in ("fail-open", "fail-closed") else "fail-open"
    if phase == "healthcheck":
        code, action = 3, "none"
    else:
        code, action = (1, "fail-closed") if policy == "fail-closed" else (0, "fail-open")
    import json

    line = json.dumps({"event": f"{phase}_decision", "level": "error", "phase": phase,
                       "action": action, "path": "none", "error": f"cannot run slurmgpu: {error}",
                       "node": environ.get("SLURMD_NODENAME"), "job": environ.get("SLURM_JOB_ID")})
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        import syslog

        syslog.openlog("slurmgpu", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, line)
    except Exception:  # no stderr, no syslog: the exit code still follows the policy
        pass
    return code


def gate(phase: str, args: Sequence[str], environ: Mapping[str, str]) -> int:
    try:
        proto = protocol()
    except Exception:  # no localproto.py beside this file (a broken install): the full path
        proto = None
    if proto is not None:
        path, timeout = agent_endpoint(args, environ)
        try:
            code, record = proto.hook_decision(proto.ask(path, proto.hook_request(phase, environ), timeout))
        except proto.AgentUnavailable:
            pass
        else:
            sys.stderr.write(proto.dumps(record, default=str) + "\n")
            return code
    result = run_full_path(phase, args, environ)
    return result if isinstance(result, int) else cannot_run(phase, args, environ, result)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.version_info < MIN_PYTHON:
        old, oldest = ".".join(map(str, sys.version_info[:2])), ".".join(map(str, MIN_PYTHON))
        sys.stderr.write(f"slurmgpu-quickgate: {sys.executable} is Python {old}, older than {oldest}\n")
        return NOT_AN_ANSWER
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in PHASES:
        sys.stderr.write("usage: slurmgpu-quickgate prolog|epilog|healthcheck [--config FILE]\n")
        return 2
    phase, rest = args[0], args[1:]
    offset = WRAPPED_OFFSET if os.environ.get(WRAPPER_ENV) == "1" else 0
    try:
        return offset + gate(phase, rest, os.environ)
    except Exception as exc:  # a bug here must not drain the node
        return offset + cannot_run(phase, rest, os.environ, f"quickgate: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
