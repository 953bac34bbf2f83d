"""The agent's local query socket: the warm prolog/epilog path.

A Unix-domain stream socket (``[agent] socket``, default ``/run/slurmgpu/agent.sock``,
mode 0600). Only uid 0, the uid of ``[agent] slurm_user`` and the agent's own uid may
ask; the peer is identified with ``SO_PEERCRED``. The protocol (``slurmgpu.localproto``,
shared with the hooks' client): one JSON request line, one JSON response line (UTF-8,
newline-terminated):

Design notes: docs/design-notes.md (``slurmgpu/agent/local.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from slurmgpu import wire
from slurmgpu.config.env import apply_env
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Progress, add_kernel_xids, evaluate
from slurmgpu.facts import NodeFacts
from slurmgpu.gate import EXIT_OK, EXIT_REFUSE, Gate
from slurmgpu.localproto import (
    ack_reply,
    agent_paths,
    allowed_uids,
    encode,
    error_reply,
    hook_reply,
    job_env,
    peer_allowed,
    peer_credentials,
    read_request,
    uid_of,
)
from slurmgpu.result import Verdict
from slurmgpu.slurm import SlurmClient
from slurmgpu.sources import procs
from slurmgpu.validate.report import validation_event

POLL_S = 0.2

ClientFactory = Callable[[Mapping[str, str]], SlurmClient]


class AgentLike(Protocol):
    """What the server needs of ``slurmgpu.agent.core.Agent``."""

    settings: Settings
    node: str

    def latest(self) -> tuple[NodeFacts, Verdict, float] | None: ...

    def facts_for(self, gpus: frozenset[int] | None, max_age_s: float) -> NodeFacts: ...

    def sweep_soon(self) -> None:
        """A job directory was retired (warm-path epilog): delete it soon."""

    def bookkeeping_failed(self, errors: list[str]) -> None:
        """A gate run decided but could not record (its next report says so)."""

    def prolog_blocked(self, job_id: str | None, record: dict[str, Any]) -> None:
        """The warm-path prolog refused a job (for the fleet report)."""

    def submit(self, mtype: str, body: dict[str, Any], *, ts: float | None = None) -> int | None: ...


# ------------------------------------------------------------------------ facts


class CachedFacts:
    """The warm path's ``FactsProvider`` (``slurmgpu.engine``): the agent's facts
    (``facts_for``) with the GPUs asked for read afresh (``max_age_s``, 0 for the hooks:
    a fault that raises no NVML event is seen as on the cold path), IB and versions from
    its cache, its XIDs and previous sample passed through. The kernel log and /proc are
    read as on the cold path."""

    def __init__(self, agent: AgentLike, kernel_log: str, max_age_s: float = 0.0) -> None:
        self.agent = agent
        self.kernel_log = kernel_log
        self.max_age_s = max_age_s

    def __call__(self, gpus: frozenset[int] | None, *, xids_since: float | None = None,
                 progress: Progress = lambda step: None) -> NodeFacts:
        progress("gather:nvml")
        facts = self.agent.facts_for(gpus, self.max_age_s)
        facts = dataclasses.replace(facts, xids=list(facts.xids))
        if xids_since is not None:
            add_kernel_xids(facts, self.kernel_log, xids_since, progress)
        return facts

    def holders(self, devices: Mapping[str, int], *, uid: int | None,
                ignore: Iterable[str]) -> list[dict[str, Any]]:
        return procs.find_device_holders(devices, uid=uid, ignore=ignore)


# ---------------------------------------------------------------------- requests


def _problems(verdict: Verdict) -> list[str]:
    return [f"{f.check}{'' if f.gpu is None else f' GPU {f.gpu}'}: {f.message}"
            for f in verdict.problems()]


def _default_client_factory(settings: Settings) -> ClientFactory:
    def factory(env: Mapping[str, str]) -> SlurmClient:
        from slurmgpu.slurm.factory import make_client

        return make_client(settings.slurm, env={**os.environ, **env})

    return factory


class LocalService:
    """The request logic, apart from the socket (tests call ``handle`` directly)."""

    def __init__(self, agent: AgentLike, client_factory: ClientFactory | None = None) -> None:
        self.agent = agent
        self.client_factory = client_factory or _default_client_factory(agent.settings)

    def handle(self, request: Mapping[str, Any],
               ack: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "gate":
            return self.gate(request.get("gpus"))
        if op in ("prolog", "epilog"):
            return self.hook(str(op), {**agent_paths(os.environ), **job_env(request.get("env", {}))}, ack)
        if op == "healthcheck":
            return self.healthcheck({**agent_paths(os.environ), **job_env(request.get("env", {}))}, ack)
        if op == "validation":
            return self.validation(request)
        return error_reply(f"unknown op {op!r} (status, gate, prolog, epilog, healthcheck, validation)")

    def validation(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """`slurmgpu validate --send`: its findings, spooled as a ``validation`` event."""
        try:
            body = validation_event(request)
        except ValueError as exc:
            return error_reply(f"bad validation: {exc}")
        seq = self.agent.submit(wire.EVENT, body)
        return {"ok": seq is not None, "seq": seq, **({} if seq is not None else {"error": "no spool"})}

    def healthcheck(self, env: dict[str, str],
                    ack: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """``Gate.healthcheck`` on the agent's facts (whole node; drains/resumes)."""
        node = env.setdefault("SLURMD_NODENAME", self.agent.node)
        if node != self.agent.node:
            return error_reply(f"this agent serves {self.agent.node}, not {node}")
        settings = self.agent.settings
        if ack is not None:
            ack(ack_reply(settings.slurm.command_timeout_s * 3 + 5))
        gate = Gate(settings, env, lambda: self.client_factory(env), facts=self.cached_facts(env),
                    exit=lambda code: None, record_extra={"path": "agent"})
        code = gate.healthcheck()
        return hook_reply(code, list(gate.records))

    def cached_facts(self, env: Mapping[str, str]) -> CachedFacts:
        """The facts a gate run with ``env`` decides on (its kernel log: the hook's
        ``$SLURMGPU_KMSG``, else the agent's)."""
        return CachedFacts(self.agent, apply_env(self.agent.settings, env).paths.kmsg)

    def status(self) -> dict[str, Any]:
        latest = self.agent.latest()
        if latest is None:
            return {"ok": True, "node": self.agent.node, "verdict": None, "problems": [],
                    "age_s": None}
        facts, verdict, at = latest
        return {"ok": True, "node": self.agent.node, "verdict": verdict.severity.name,
                "problems": _problems(verdict), "at": at,
                "age_s": round(max(0.0, time.time() - facts.collected_at), 3)}

    def gate(self, gpus: Any) -> dict[str, Any]:
        if gpus is None:
            scope = None
        elif isinstance(gpus, list) and all(isinstance(g, int) and not isinstance(g, bool)
                                            for g in gpus):
            scope = frozenset(gpus)
        else:
            raise ValueError("'gpus' must be a list of GPU indices")
        settings = self.agent.settings
        facts = self.agent.facts_for(scope, settings.agent.max_age_s)
        verdict = evaluate(facts, settings, scope=scope)
        return {"ok": True, "node": self.agent.node, "verdict": verdict.severity.name,
                "exit": verdict.severity.exit_code, "problems": _problems(verdict),
                "age_s": round(max(0.0, time.time() - facts.collected_at), 3)}

    def hook(self, phase: str, env: dict[str, str],
             ack: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Run ``Gate.prolog``/``Gate.epilog`` on the agent's facts; the watchdog's
        decision (fail-open/closed) becomes the reply instead of a process exit."""
        settings = self.agent.settings
        node = env.setdefault("SLURMD_NODENAME", self.agent.node)
        if node != self.agent.node:
            return error_reply(f"this agent serves {self.agent.node}, not {node}")
        cfg = getattr(settings, phase)
        # The watchdog answers after timeout_s; allow for its own (fail-closed) drain.
        bound = cfg.timeout_s + settings.slurm.command_timeout_s * 2 + 5
        if ack is not None:
            ack(ack_reply(bound))
        decided = threading.Event()
        lock = threading.Lock()
        outcome: dict[str, Any] = {}
        gate: Gate

        def finish(code: int) -> None:
            with lock:  # the first decision stands: the watchdog's when it fired
                if "exit" not in outcome:
                    outcome["exit"] = int(code)
                    outcome["records"] = list(gate.records)
                    decided.set()

        gate = Gate(settings, env, lambda: self.client_factory(env), facts=self.cached_facts(env),
                    exit=finish, record_extra={"path": "agent"},
                    sweep_job_dirs=self.agent.sweep_soon)

        def run() -> None:
            try:
                code = getattr(gate, phase)()
            except BaseException:  # Gate catches Exception; anything else follows on_error
                code = EXIT_OK if cfg.on_error == "fail-open" else EXIT_REFUSE
            finish(code)

        threading.Thread(target=run, name=f"slurmgpu-{phase}", daemon=True).start()
        if not decided.wait(bound):
            return error_reply(f"{phase} did not decide in time")
        records = outcome["records"]
        record = records[-1] if records else None
        if gate.bookkeeping_errors:
            self.agent.bookkeeping_failed(list(gate.bookkeeping_errors))
        if phase == "prolog" and outcome["exit"] != 0:
            self.agent.prolog_blocked(env.get("SLURM_JOB_ID"), record or {})  # for the fleet report
        return hook_reply(outcome["exit"], records)


# ------------------------------------------------------------------------ server


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            pid, uid, _gid = peer_credentials(sock)
        except OSError as exc:
            self._send(error_reply(f"cannot identify the peer: {exc}"))
            return
        if not peer_allowed(uid, self.server.allowed):
            _log().warning("local_query_refused", pid=pid, uid=uid, socket=self.server.path)
            self._send(error_reply(f"uid {uid} may not query the agent"))
            return
        service = self.server.service
        try:
            request = read_request(sock)
            reply = service.handle(request, self._send if request.get("ack") else None)
        except (ValueError, TimeoutError) as exc:
            reply = error_reply(str(exc))
        except Exception as exc:  # a bug answers an error (the client falls back)
            _log().error("local_query_failed", error=f"{type(exc).__name__}: {exc}")
            reply = error_reply(f"internal error: {type(exc).__name__}: {exc}")
        self._send(reply)

    def _send(self, reply: dict[str, Any]) -> None:
        # OSError: the client gave up (and fell back); nothing to tell it.
        with contextlib.suppress(OSError):
            self.request.sendall(encode(reply))


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, service: LocalService, allowed: frozenset[int]) -> None:
        self.path = path
        self.service = service
        self.allowed = allowed
        super().__init__(path, _Handler)


def _prepare_path(path: str) -> None:
    directory = Path(path).parent
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: nobody listens
        return
    finally:
        probe.close()
    raise OSError(f"another process already serves {path}")


def serve_local(agent: AgentLike, path: str, stop_event: threading.Event, *,
                client_factory: ClientFactory | None = None,
                ready: threading.Event | None = None) -> None:
    """Serve the local socket at ``path`` until ``stop_event`` is set (run it in a thread)."""
    settings = agent.settings
    _prepare_path(path)
    allowed = allowed_uids(settings.agent.slurm_user)
    server = _Server(path, LocalService(agent, client_factory), allowed)
    inode = None
    try:
        os.chmod(path, 0o600)
        slurm_uid = uid_of(settings.agent.slurm_user)
        if os.geteuid() == 0 and slurm_uid not in (None, 0):
            os.chown(path, slurm_uid, -1)  # 0600 yet connectable by the slurm user
        inode = os.stat(path).st_ino
        server.timeout = POLL_S
        _log().info("local_socket_listening", socket=path, allowed_uids=sorted(allowed))
        if ready is not None:
            ready.set()
        while not stop_event.is_set():
            server.handle_request()
    finally:
        server.server_close()
        try:
            if inode is not None and os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass


def _log() -> Any:
    from slurmgpu import log

    return log.get_logger()
