"""The warm hook path: the agent's local socket (slurmgpu.agent.local) and the
stdlib-only client (slurmgpu.quickgate) with its fallback to the full path; both speak
slurmgpu.localproto."""

from __future__ import annotations

import ast
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import localproto
from slurmgpu.agent.local import (
    LocalService,
    allowed_uids,
    job_env,
    peer_allowed,
    peer_credentials,
    serve_local,
)
from slurmgpu.config.schema import Settings
from slurmgpu.engine import evaluate
from slurmgpu.facts import NodeFacts
from slurmgpu.result import Verdict
from slurmgpu.testing import FakeSlurmClient, make_facts

NODE = "gpu-n1"
REPO = Path(__file__).resolve().parent.parent
BANNED = ("click", "structlog", "pynvml", "zmq", "msgpack", "ClusterShell")


@dataclass
class FakeAgent:
    """The members of slurmgpu.agent.core.Agent that the local server uses."""

    facts: NodeFacts
    settings: Settings = field(default_factory=Settings)
    node: str = NODE
    hang: threading.Event | None = None
    calls: list[tuple[frozenset[int] | None, float]] = field(default_factory=list)
    told: list[str] = field(default_factory=list)  # sweep_soon, bookkeeping_failed, prolog_blocked

    def latest(self) -> tuple[NodeFacts, Verdict, float] | None:
        return self.facts, evaluate(self.facts, self.settings), time.time()

    def facts_for(self, gpus: frozenset[int] | None, max_age_s: float) -> NodeFacts:
        self.calls.append((gpus, max_age_s))
        if self.hang is not None:
            self.hang.wait(10)
        out = copy.deepcopy(self.facts)
        if gpus is not None:
            out.nvml.gpus = [g for g in out.nvml.gpus if g.index in gpus]
        return out

    def sweep_soon(self) -> None:
        self.told.append("sweep_soon")

    def bookkeeping_failed(self, errors: list[str]) -> None:
        self.told.append("bookkeeping_failed")

    def prolog_blocked(self, job_id: str | None, record: dict[str, Any]) -> None:
        self.told.append("prolog_blocked")


@dataclass
class Served:
    agent: FakeAgent
    client: FakeSlurmClient
    path: str
    tmp: Path

    def ask(self, request: Any) -> dict[str, Any]:
        """One request (an object, or raw bytes: garbage too), its reply object."""
        if not isinstance(request, bytes):
            return localproto.ask(self.path, request, 5.0)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.path)
            sock.sendall(request)
            reply: dict[str, Any] = localproto.decode(localproto.LineReader(sock).read(time.monotonic() + 5))
        return reply

    def env(self, **extra: str) -> dict[str, str]:
        """A hook's environment (slurmd gives no PATH; keep it for the interpreter)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURMD_NODENAME": NODE,
               "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3",
               "SLURM_JOB_USER": "alice", "SLURMGPU_STATE_DIR": str(self.tmp / "state"),
               "SLURMGPU_KMSG": str(self.tmp / "kmsg"), "SLURMGPU_AGENT_SOCKET": self.path,
               "SLURMGPU_CONFIG": str(self.tmp / "absent.toml"),
               "PYTHONPATH": str(REPO)}
        env.update(extra)
        return env


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sgq-", dir="/tmp"))  # AF_UNIX paths: <= 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _settings() -> Settings:
    settings = Settings()
    settings.gpu.count = 8
    return settings


@pytest.fixture
def served(short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    # The agent's own paths (a request cannot move them: see test_env_filter).
    monkeypatch.setenv("SLURMGPU_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLURMGPU_KMSG", str(tmp_path / "kmsg"))
    monkeypatch.setenv("SLURMGPU_JOBS_DIR", str(tmp_path / "jobs"))
    agent = FakeAgent(make_facts(NODE), _settings())
    client = FakeSlurmClient([NODE])
    path = str(short_dir / "run" / "agent.sock")
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve_local, args=(agent, path, stop),
                              kwargs={"client_factory": lambda env: client, "ready": ready},
                              daemon=True)
    thread.start()
    assert ready.wait(5)
    yield Served(agent, client, path, tmp_path)
    stop.set()
    if agent.hang is not None:
        agent.hang.set()
    thread.join(5)
    assert not os.path.exists(path)


def quickgate(env: Mapping[str, str], phase: str = "prolog",
              timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmgpu.quickgate", phase], env=dict(env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def fake_bin(tmp: Path, code: int = 7) -> tuple[str, Path]:
    marker = tmp / "fallback-ran"
    script = tmp / "fake-slurmgpu"
    # (as slurmgpu does once it decided: says so on the quick client's pipe)
    script.write_text(f'#!/bin/sh\necho "$@" > {marker}\necho decided > /dev/fd/$SLURMGPU_DECIDED_FD\n'
                      f'exit {code}\n')
    script.chmod(0o755)
    return f"/bin/sh {script}", marker


# ----------------------------------------------------------------------- socket


def test_socket_is_private_and_dir_is_0755(served: Served) -> None:
    assert os.stat(served.path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(served.path)).st_mode & 0o777 == 0o755


def test_status(served: Served) -> None:
    reply = served.ask({"op": "status"})
    assert reply["ok"] is True and reply["node"] == NODE and reply["verdict"] == "OK"
    assert reply["age_s"] >= 0


def test_gate_op_decides_without_acting(served: Served) -> None:
    served.agent.facts.gpus[3].lost = True
    assert served.ask({"op": "gate", "gpus": [0, 1]})["verdict"] == "OK"
    reply = served.ask({"op": "gate", "gpus": [3]})
    assert reply["verdict"] == "FAIL" and reply["exit"] == 2
    assert any("gpu.lost GPU 3" in p for p in reply["problems"])
    assert served.client.calls == []
    assert served.agent.calls[-1] == (frozenset({3}), 30.0)


def test_garbage_then_still_serving(served: Served) -> None:
    assert served.ask(b"this is not json\n")["ok"] is False
    assert served.ask(b"[1, 2]\n")["ok"] is False
    assert "unknown op" in served.ask({"op": "reboot"})["error"]
    assert served.ask({"op": "gate", "gpus": "all"})["ok"] is False
    assert served.ask({"op": "status"})["ok"] is True


def test_wrong_node_is_refused(served: Served) -> None:
    reply = served.ask({"op": "prolog", "env": {"SLURMD_NODENAME": "gpu-n9"}})
    assert reply["ok"] is False and "gpu-n9" in reply["error"]


def test_stale_socket_file_is_replaced(short_dir: Path) -> None:
    path = str(short_dir / "a.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()  # the file stays; nobody listens
    stop, ready = threading.Event(), threading.Event()
    agent = FakeAgent(make_facts(NODE), _settings())
    thread = threading.Thread(target=serve_local, args=(agent, path, stop),
                              kwargs={"ready": ready}, daemon=True)
    thread.start()
    assert ready.wait(5)
    stop.set()
    thread.join(5)


def test_env_filter() -> None:
    # A client never moves the root agent's state/jobs directories (it writes and chowns there).
    env = job_env({"SLURM_JOB_ID": "1", "SLURMGPU_STATE_DIR": "/x", "SLURMGPU_JOBS_DIR": "/etc",
                   "CUDA_VISIBLE_DEVICES": "0", "LD_PRELOAD": "/evil.so", "PATH": "/tmp"})
    assert env == {"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(ValueError):
        job_env({"SLURM_JOB_ID": 1})


# ------------------------------------------------------------------------ peers


def test_allowed_uids() -> None:
    assert allowed_uids("no-such-user-slurmgpu") == frozenset({0, os.geteuid()})
    assert 0 in allowed_uids("root")
    assert peer_allowed(0, frozenset({0}))
    assert not peer_allowed(65534, frozenset({0}))


def test_peer_credentials_of_a_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid to another user")
def test_disallowed_uid_gets_an_error(served: Served) -> None:
    # The socket is 0600; open it up so the peer check (not the file mode) must refuse.
    os.chmod(served.path, 0o666)
    os.chmod(os.path.dirname(os.path.dirname(served.path)), 0o755)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: nobody asks
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            reply = served.ask({"op": "status"})
            os.write(write_end, json.dumps(reply).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    reply = json.loads(data)
    assert reply["ok"] is False and "uid 65534" in reply["error"]
    assert served.ask({"op": "status"})["ok"] is True


# -------------------------------------------------------------- the gate, warm


def test_prolog_ok_through_quickgate(served: Served) -> None:
    proc = quickgate(served.env())
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stderr.strip().splitlines()[-1])
    assert record["path"] == "agent" and record["verdict"] == "OK" and record["job"] == "42"
    assert record["gpus"] == [2, 3]
    assert served.agent.calls[0] == (frozenset({2, 3}), 0.0)  # the job's GPUs read afresh
    assert served.client.calls == []
    saved = json.loads((served.tmp / "state" / "gate.jsonl").read_text().splitlines()[-1])
    assert saved["path"] == "agent"
    assert (served.tmp / "state" / "jobs" / "42.json").exists()  # for the epilog


def test_prolog_fail_in_scope_drains(served: Served) -> None:
    served.agent.facts.gpus[3].lost = True
    proc = quickgate(served.env())
    assert proc.returncode == 1, proc.stderr
    record = json.loads(proc.stderr.strip().splitlines()[-1])
    assert record["verdict"] == "FAIL" and record["action"] == "drained"
    (call,) = served.client.calls
    assert call[:2] == ("drain", NODE) and call[2].startswith("slurmgpu: gpu.lost GPU 3")


def test_prolog_fail_outside_scope_runs(served: Served) -> None:
    served.agent.facts.gpus[6].lost = True
    assert quickgate(served.env()).returncode == 0
    assert served.client.calls == []


def test_epilog_through_quickgate(served: Served) -> None:
    assert quickgate(served.env()).returncode == 0  # prolog leaves the job state
    proc = quickgate(served.env(), "epilog")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.strip().splitlines()[-1])["phase"] == "epilog"
    assert not (served.tmp / "state" / "jobs" / "42.json").exists()
    assert served.agent.calls[-1][0] is None  # the epilog looks at every GPU


@pytest.mark.parametrize(("policy", "code"), [("fail-open", 0), ("fail-closed", 1)])
def test_watchdog_decision_becomes_the_reply(tmp_path: Path, policy: str, code: int) -> None:
    settings = _settings()
    settings.prolog.timeout_s = 0.2
    settings.prolog.on_error = policy  # type: ignore[assignment]
    agent = FakeAgent(make_facts(NODE), settings, hang=threading.Event())
    client = FakeSlurmClient([NODE])
    acks: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        reply = LocalService(agent, lambda env: client).handle(
            {"op": "prolog", "env": {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "5",
                                     "SLURMGPU_STATE_DIR": str(tmp_path)}}, acks.append)
    finally:
        agent.hang.set()  # type: ignore[union-attr]
    assert time.monotonic() - started < 30  # (the watchdog decided: the hung gather did not)
    assert acks and acks[0]["ack"] is True and acks[0]["wait_s"] > 0.2
    assert reply["exit"] == code
    assert reply["record"]["action"].startswith(policy) and "watchdog" in reply["record"]["error"]
    assert reply["record"]["path"] == "agent"
    assert bool(client.calls) is (policy == "fail-closed")


# ----------------------------------------------------------------- the fallback


def test_agent_down_falls_back_to_full_path(served: Served) -> None:
    bin_, marker = fake_bin(served.tmp)
    env = served.env(SLURMGPU_AGENT_SOCKET=str(served.tmp / "none.sock"), SLURMGPU_BIN=bin_)
    proc = quickgate(env)
    assert proc.returncode == 7, proc.stderr
    assert marker.read_text().strip() == "prolog"
    assert proc.stderr == ""  # the fallback adds nothing of its own


def test_agent_refusing_falls_back(served: Served) -> None:
    bin_, marker = fake_bin(served.tmp, code=3)
    proc = quickgate(served.env(SLURMD_NODENAME="gpu-n9", SLURMGPU_BIN=bin_), "epilog")
    assert proc.returncode == 3 and marker.read_text().strip() == "epilog"


def test_hung_agent_times_out_and_falls_back(short_dir: Path, tmp_path: Path) -> None:
    path = str(short_dir / "hung.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(8)  # accepts (backlog) but never answers
        bin_, marker = fake_bin(tmp_path)
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
               "SLURMGPU_AGENT_SOCKET": path, "SLURMGPU_AGENT_TIMEOUT": "0.3",
               "SLURMGPU_BIN": bin_, "SLURMGPU_CONFIG": str(tmp_path / "absent.toml")}
        started = time.monotonic()
        proc = quickgate(env)
        elapsed = time.monotonic() - started
    assert proc.returncode == 7 and marker.exists()
    assert 0.3 <= elapsed < 30  # (timed out and fell back: never hung)


def test_config_file_names_the_socket(served: Served) -> None:
    config = served.tmp / "slurmgpu.toml"
    config.write_text(f'[agent]\nsocket = "{served.path}"\nquery_timeout_s = 2.0\n')
    env = served.env(SLURMGPU_CONFIG=str(config))
    del env["SLURMGPU_AGENT_SOCKET"]
    proc = quickgate(env)
    assert proc.returncode == 0 and '"path": "agent"' in proc.stderr


def test_quickgate_usage() -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmgpu.quickgate", "bogus"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_quickgate_imports_only_the_standard_library(served: Served) -> None:
    code = ("import json, sys\nimport slurmgpu.quickgate as q\ncode = q.main(['prolog'])\n"
            "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=served.env(), capture_output=True,
                          text=True, timeout=30, check=False)
    out = json.loads(proc.stdout)
    assert out["code"] == 0, proc.stderr
    modules = out["modules"]
    assert not [m for m in modules if m.split(".")[0] in BANNED]
    assert [m for m in modules if m.startswith("slurmgpu")] == ["slurmgpu", "slurmgpu.localproto",
                                                                 "slurmgpu.quickgate"]
    stdlib = set(sys.stdlib_module_names)
    startup = set(json.loads(subprocess.run(
        [sys.executable, "-c", "import sys, json; print(json.dumps(list(sys.modules)))"],
        capture_output=True, text=True, check=True).stdout))
    extra = {m.split(".")[0] for m in modules} - stdlib - startup - {"slurmgpu"}
    assert not extra, extra


def test_hook_wrappers_try_the_quick_client_first(served: Served) -> None:
    env = served.env(SLURMGPU_QUICKGATE=f"{sys.executable} -m slurmgpu.quickgate")
    proc = subprocess.run([str(REPO / "prolog" / "slurmgpu-prolog")], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0 and '"path": "agent"' in proc.stderr
    # As shipped: the quick client beside the wrapper (prolog/slurmgpu-quickgate).
    shipped = served.env()
    shipped.pop("SLURMGPU_QUICKGATE", None)
    proc = subprocess.run([str(REPO / "prolog" / "slurmgpu-prolog")], env=shipped,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0 and '"path": "agent"' in proc.stderr, proc.stderr
    # The full path runs through the quick client: with the agent down, $SLURMGPU_BIN.
    bin_, marker = fake_bin(served.tmp, code=5)
    env = served.env(SLURMGPU_AGENT_SOCKET=str(served.tmp / "none.sock"), SLURMGPU_BIN=bin_)
    env.pop("SLURMGPU_QUICKGATE", None)
    proc = subprocess.run([str(REPO / "epilog" / "slurmgpu-epilog")], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 5 and marker.read_text().strip() == "epilog"
    # A wrapper without its quick client (a broken install) follows on_error: never a drain
    # for its own install (tests/test_hook_wrappers.py has the cases).
    lonely = served.tmp / "slurmgpu-epilog"
    shutil.copy(REPO / "epilog" / "slurmgpu-epilog", lonely)
    env = served.env(SLURMGPU_QUICKGATE="/nonexistent/slurmgpu-quickgate", SLURMGPU_BIN=bin_)
    proc = subprocess.run([str(lonely)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0 and '"action": "fail-open"' in proc.stderr


def test_quickgate_runs_as_an_isolated_file(served: Served) -> None:
    """`python -I -S .../quickgate.py`: no site-packages, no slurmgpu on sys.path."""
    cmd = [sys.executable, "-I", "-S", str(REPO / "slurmgpu" / "quickgate.py"), "prolog"]
    proc = subprocess.run(cmd, env=served.env(), capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 0 and '"path": "agent"' in proc.stderr, proc.stderr


def test_sim_hooks_export_the_warm_path() -> None:
    from slurmgpu.sim.cluster import hook_environment

    env = hook_environment(Path("/tmp/c"), "gpu-n1", Path("/lib/x.so"))
    assert env["SLURMGPU_AGENT_SOCKET"] == "/tmp/c/nodes/gpu-n1/agent.sock"
    assert env["SLURMGPU_QUICKGATE"].endswith("quickgate.py")


def test_healthcheck_through_quickgate_drains_then_resumes(served: Served) -> None:
    served.agent.facts.gpus[6].lost = True  # outside any job: the healthcheck sees the whole node
    proc = quickgate(served.env(), "healthcheck")
    assert proc.returncode == 2, proc.stderr
    record = json.loads(proc.stderr.strip().splitlines()[-1])
    assert record["path"] == "agent" and record["phase"] == "healthcheck" and record["action"] == "drained"
    assert served.client.calls[0][2].startswith("slurmgpu: gpu.lost GPU 6")
    served.agent.facts.gpus[6].lost = False
    proc = quickgate(served.env(), "healthcheck")
    assert proc.returncode == 0 and json.loads(proc.stderr.strip().splitlines()[-1])["action"] == "resumed"


def test_a_client_cannot_move_the_agents_state_or_jobs_dir(served: Served, tmp_path: Path) -> None:
    """The root agent writes and chowns in these directories: a socket client's
    SLURMGPU_STATE_DIR / SLURMGPU_JOBS_DIR are ignored, the agent's own are used."""
    elsewhere = tmp_path / "elsewhere"
    reply = served.ask({"op": "prolog", "env": served.env(SLURMGPU_STATE_DIR=str(elsewhere / "state"),
                                                          SLURMGPU_JOBS_DIR=str(elsewhere / "jobs"))})
    assert reply["ok"] and reply["exit"] == 0
    assert not elsewhere.exists()
    assert (served.tmp / "state" / "gate.jsonl").is_file() and (served.tmp / "jobs" / "42").is_dir()


def test_quickgate_refuses_an_answer_from_a_non_root_server(tmp_path: Path, short_dir: Path) -> None:
    """Whoever can create a socket at the agent's path must not decide whether jobs run:
    quickgate checks the server's uid (SO_PEERCRED: the uid that created it) and otherwise
    takes the full path."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the impostor as another user")
    short_dir.chmod(0o777)
    path = str(short_dir / "fake.sock")
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the impostor: another user, answering "OK, let it run"
        try:
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
                server.bind(path)
                server.listen(1)
                os.write(ready_w, b"1")  # listening: the parent may connect
                conn, _ = server.accept()
                conn.recv(65536)
                conn.sendall(b'{"ok": true, "exit": 0, "record": {}}\n')
        finally:
            os._exit(0)
    try:
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        with pytest.raises(localproto.AgentUnavailable, match="not root"):
            localproto.ask(path, {"op": "prolog"}, 2.0)
    finally:
        os.close(ready_r)
        os.kill(child, 9)
        os.waitpid(child, 0)


# ------------------------------------------------------------ one protocol module

#: Who speaks the local socket protocol; each through slurmgpu/localproto.py only.
PROTOCOL_USERS = ("slurmgpu/quickgate.py", "slurmgpu/agent/local.py", "slurmgpu/sim/cluster/procs.py",
                  "slurmgpu/doctor/local.py")
#: What writing the protocol again would take: reading lines off the socket, asking for the
#: peer's credentials; defining the socket's default path, variables, bounds.
SOCKET_CALLS = {"recv", "recv_into", "makefile", "getsockopt", "SO_PEERCRED"}
PROTOCOL_NAMES = {"DEFAULT_SOCKET", "SOCKET_ENV", "TIMEOUT_ENV", "ENV_PREFIXES", "ENV_NAMES",
                  "MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "ACK_MARGIN_S"}


def test_quickgate_the_agent_and_the_simulator_share_one_protocol_module() -> None:
    for name in PROTOCOL_USERS:
        tree = ast.parse((REPO / name).read_text())
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        defined = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                   if isinstance(t, ast.Name)}
        own = sorted(used & SOCKET_CALLS | defined & PROTOCOL_NAMES)
        assert own == [], f"{name} speaks the socket protocol itself: {own}"
        imports = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if name == "slurmgpu/quickgate.py":  # a bare file: it loads the module beside it by path
            assert ("importlib.machinery", "SourceFileLoader") in imports
            assert any(isinstance(n, ast.Constant) and n.value == "localproto.py" for n in ast.walk(tree))
        else:
            assert any(m == "slurmgpu.localproto" or (m, a) == ("slurmgpu", "localproto") for m, a in imports), name
    from slurmgpu import quickgate

    assert quickgate.protocol() is localproto  # imported from the package: the same module


def copy_quick_client(directory: Path, *, with_protocol: bool) -> Path:
    """The quick client as a package may install it: a copy named slurmgpu-quickgate,
    the protocol module beside it (or, a broken install, not)."""
    directory.mkdir(parents=True, exist_ok=True)
    client = directory / "slurmgpu-quickgate"
    shutil.copy(REPO / "slurmgpu" / "quickgate.py", client)
    if with_protocol:
        shutil.copy(REPO / "slurmgpu" / "localproto.py", directory / "localproto.py")
    return client


def test_quickgate_runs_from_a_copy_beside_the_protocol(served: Served, tmp_path: Path) -> None:
    """`python -I -S <dir>/slurmgpu-quickgate` with only localproto.py beside it: no slurmgpu
    package anywhere, and the agent answers."""
    client = copy_quick_client(tmp_path / "libexec", with_protocol=True)
    env = served.env()
    del env["PYTHONPATH"]
    proc = subprocess.run([sys.executable, "-I", "-S", str(client), "prolog"], env=env, capture_output=True,
                          text=True, timeout=30, check=False, cwd="/")
    assert proc.returncode == 0 and '"path": "agent"' in proc.stderr, proc.stderr
    assert served.agent.calls  # the agent decided


def test_quickgate_without_its_protocol_takes_the_full_path(served: Served, tmp_path: Path) -> None:
    """A broken install (no localproto.py beside the quick client) is no agent: the full
    path decides, as when the agent is down."""
    client = copy_quick_client(tmp_path / "libexec", with_protocol=False)
    bin_, marker = fake_bin(served.tmp, code=4)
    proc = subprocess.run([sys.executable, "-I", "-S", str(client), "epilog"], env=served.env(SLURMGPU_BIN=bin_),
                          capture_output=True, text=True, timeout=30, check=False, cwd="/")
    assert proc.returncode == 4 and marker.read_text().strip() == "epilog", proc.stderr
    assert served.agent.calls == []
