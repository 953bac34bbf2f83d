"""The agent's side of checkpoint coordination: the ``checkpoint`` command, the ack
watcher, the local fallback (signals to real processes), Link.connected, and the
prolog/epilog job directory. Real files, real processes; the end-to-end tests run a
real agent against the fake NVML library and a test CURVE collector."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import jobfiles, wire
from slurmgpu.agent import Agent
from slurmgpu.agent.checkpoints import EXPIRE_AFTER_S, parse_signal, scan_processes, top_level_pids
from slurmgpu.agent.core import COALESCE_S, load_client_keys
from slurmgpu.agent.link import Link
from slurmgpu.agent.spool import Spool
from slurmgpu.config.schema import Settings
from slurmgpu.engine import Sources, source_facts
from slurmgpu.gate import Gate
from slurmgpu.testing import (
    FakeClock,
    FakeIbSource,
    FakeNvmlSource,
    FakeSlurmClient,
    FakeVersionSource,
    make_facts,
)
from tests.agenthelpers import (
    AgentProcess,
    FakeCollector,
    free_port,
    make_bundle,
    wait_until,
    write_config,
)

REPO = Path(__file__).resolve().parent.parent
NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")


def _sources(clock: FakeClock) -> Sources:
    facts = make_facts("n1", gpus=4, ib_ports=2)
    return Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib), FakeVersionSource(facts.versions),
                   clock)


def make_agent(tmp_path: Path, *, poll_s: float = 0.02, clock: FakeClock | None = None,
               **agent_settings: Any) -> Agent:
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.agent.jobs_dir = str(tmp_path / "jobs")
    settings.paths.state_dir = str(tmp_path / "state")  # the XIDs it remembers are saved there
    settings.paths.kmsg = str(tmp_path / "kmsg")
    settings.agent.checkpoint_poll_s = poll_s
    for key, value in agent_settings.items():
        setattr(settings.agent, key, value)
    clock = clock or FakeClock(now=time.time())
    agent = Agent(settings, "n1", sources=_sources(clock), clock=clock, environ={})
    agent.open_spool()
    return agent


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = make_agent(tmp_path)
    yield a
    a.shutdown()


def messages(agent: Agent, mtype: str | None = None) -> list[wire.Envelope]:
    assert agent.spool is not None
    out = [wire.decode(f) for _, f in agent.spool.pending(limit=10000)]
    return [m for m in out if mtype is None or m.type == mtype]


def results(agent: Agent) -> list[dict[str, Any]]:
    return [m.body for m in messages(agent, wire.COMMAND_RESULT)]


def checkpoint_command(job_id: str, **args: Any) -> wire.Envelope:
    now = time.time()
    body = {"job_id": job_id, "action": "checkpoint", "reason": "thermal.throttle GPU 2",
            "deadline": now + 300, "requested_at": now, "trigger_node": "n7", "user": None}
    body.update(args)
    return wire.Envelope(type=wire.COMMAND, node="n1", seq=0,
                         body={"command": "checkpoint", "args": body})


def ckpt_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SLURMGPU_"))}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "slurmgpu", "ckpt", *args], env=full,
                          capture_output=True, text=True, timeout=60, check=False)


# --------------------------------------------------------------------------- jobfiles


@pytest.mark.parametrize("job_id", ["1", "123456", "77_3"])
def test_valid_job_ids(job_id: str) -> None:
    assert jobfiles.valid_job_id(job_id)
    assert jobfiles.checkpoint_file("/j", job_id) == Path("/j") / job_id / "checkpoint"


@pytest.mark.parametrize("job_id", ["", "..", "../1", "1/2", "1_2_3", "_1", "1_", "12a", "١٢", " 1",
                                    "1\n", None, 12])
def test_bad_job_ids_never_become_paths(job_id: Any) -> None:
    assert not jobfiles.valid_job_id(job_id)
    with pytest.raises(ValueError, match="bad job id"):
        jobfiles.checkpoint_file("/j", job_id)


def test_jobs_dir_env_overrides_settings() -> None:
    from slurmgpu.config.env import apply_env

    settings = Settings()
    assert jobfiles.jobs_dir(settings) == Path("/run/slurmgpu/jobs")
    settings.agent.jobs_dir = "/a"
    assert jobfiles.jobs_dir(settings) == Path("/a")
    assert jobfiles.jobs_dir(apply_env(settings, {"SLURMGPU_JOBS_DIR": "/b"})) == Path("/b")


@pytest.mark.parametrize(("text", "state", "note"), [
    ("done\n", "acked", None), ("ACK saved step 12", "acked", None), ("acked", "acked", None),
    ('{"state": "acked", "note": "step 9", "acked_at": 5}', "acked", "step 9"),
    ('{"state": "requested", "action": "checkpoint"}', "requested", None),
    ("doing it", "unknown", None), ("", "unknown", None), ("[1]", "unknown", None),
])
def test_ack_detection(text: str, state: str, note: str | None) -> None:
    parsed = jobfiles.parse(text)
    assert parsed["state"] == state
    if state == "acked":
        assert parsed["note"] == note


# --------------------------------------------------------------------------- the command


@as_root
def test_checkpoint_command_delivers_then_cli_ack_is_reported_once(tmp_path: Path,
                                                                   agent: Agent) -> None:
    assert NOBODY is not None
    jobs = tmp_path / "jobs"
    jobfiles.make_job_dir(jobs, "4242", NOBODY.pw_uid, NOBODY.pw_gid)  # as the prolog does
    command = checkpoint_command("4242", action="drain-now")
    agent.handle_command(command)

    [delivered] = results(agent)
    path = jobs / "4242" / "checkpoint"
    assert delivered == {"command_id": command.id, "ok": True,
                         "result": {"job_id": "4242", "state": "delivered", "file": str(path)}}
    content = json.loads(path.read_text())
    args = command.body["args"]
    assert content == {"job_id": "4242", "state": "requested", "action": "drain-now",
                       "reason": args["reason"], "deadline": args["deadline"],
                       "requested_at": args["requested_at"], "node": "n1", "trigger_node": "n7"}
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)  # the job's user may replace it
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert agent.checkpoints.open_jobs() == ["4242"]

    before = time.time()
    proc = ckpt_cli("ack", "--note", "saved step 1200", SLURM_JOB_ID="4242",
                    SLURMGPU_JOBS_DIR=str(jobs))
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: len(results(agent)) == 2, timeout=10, what="the ack result")
    ack = results(agent)[1]
    assert ack["command_id"] == command.id and ack["ok"] is True
    assert ack["result"]["state"] == "acked" and ack["result"]["job_id"] == "4242"
    assert ack["result"]["note"] == "saved step 1200"
    assert before <= ack["result"]["acked_at"] <= time.time()
    acked_text = path.read_text()
    time.sleep(0.2)  # ~10 more polls: reported once, the file left as the job wrote it
    assert len(results(agent)) == 2 and path.read_text() == acked_text
    assert agent.checkpoints.open_jobs() == []

    again = checkpoint_command("4242")  # a second request after the ack: answered, not rewritten
    agent.handle_command(again)
    last = results(agent)[-1]
    assert last["command_id"] == again.id and last["ok"] is True
    assert last["result"]["state"] == "acked" and last["result"]["acked_at"] == ack["result"]["acked_at"]
    assert path.read_text() == acked_text


def test_second_request_before_ack_rewrites_and_keeps_the_first_id(tmp_path: Path,
                                                                   agent: Agent) -> None:
    (tmp_path / "jobs" / "7").mkdir(parents=True)
    first = checkpoint_command("7")
    agent.handle_command(first)
    path = tmp_path / "jobs" / "7" / "checkpoint"
    second = checkpoint_command("7", action="drain-now", deadline=time.time() + 60)
    agent.handle_command(second)
    assert [r["result"]["state"] for r in results(agent)] == ["delivered", "delivered"]
    assert json.loads(path.read_text())["action"] == "drain-now"  # not acked yet: rewritten
    path.write_text("done\n")  # a plain-text ack
    wait_until(lambda: len(results(agent)) == 3, timeout=5, what="the ack")
    ack = results(agent)[2]
    assert ack["command_id"] == first.id  # the original command
    assert ack["result"]["note"] is None
    assert ack["result"]["acked_at"] == pytest.approx(path.stat().st_mtime)


def test_an_ack_before_the_watcher_saw_it_is_reported_with_the_second_command(
        tmp_path: Path) -> None:
    agent = make_agent(tmp_path, poll_s=3600)  # the watcher will not look in time
    try:
        (tmp_path / "jobs" / "8").mkdir(parents=True)
        first = checkpoint_command("8")
        agent.handle_command(first)
        jobfiles.write_atomic(tmp_path / "jobs" / "8" / "checkpoint",
                              {"job_id": "8", "state": "acked", "acked_at": 123.0, "note": None})
        second = checkpoint_command("8")
        agent.handle_command(second)
        bodies = results(agent)
        assert [(b["command_id"], b["result"]["state"]) for b in bodies] == [
            (first.id, "delivered"), (first.id, "acked"), (second.id, "acked")]
        assert bodies[1]["result"]["acked_at"] == bodies[2]["result"]["acked_at"] == 123.0
    finally:
        agent.shutdown()


def test_stale_ack_from_an_earlier_request_is_overwritten(tmp_path: Path, agent: Agent) -> None:
    path = tmp_path / "jobs" / "9" / "checkpoint"
    path.parent.mkdir(parents=True)
    jobfiles.write_atomic(path, {"job_id": "9", "state": "acked", "acked_at": time.time() - 7200,
                                 "note": "old"})
    agent.handle_command(checkpoint_command("9"))  # requested now: the old ack is not for it
    assert results(agent)[0]["result"]["state"] == "delivered"
    assert json.loads(path.read_text())["state"] == "requested"


@pytest.mark.parametrize("job_id", ["../../etc", "1/2", "", None])
def test_bad_job_id_is_an_error_result(tmp_path: Path, agent: Agent, job_id: Any) -> None:
    command = checkpoint_command("1")
    command.body["args"]["job_id"] = job_id
    agent.handle_command(command)
    [body] = results(agent)
    assert body["command_id"] == command.id and body["ok"] is False
    assert body["result"]["error"] == "bad job id"
    assert not (tmp_path / "jobs").exists() or list((tmp_path / "jobs").iterdir()) == []
    assert not (tmp_path / "etc").exists()


def test_io_error_is_an_error_result(tmp_path: Path, agent: Agent) -> None:
    (tmp_path / "jobs").write_text("not a directory")
    command = checkpoint_command("5")
    agent.handle_command(command)
    [body] = results(agent)
    assert body["ok"] is False and body["result"]["job_id"] == "5"
    assert "Error" in body["result"]["error"]


@as_root
def test_missing_job_dir_is_made_for_the_user_or_root(tmp_path: Path, agent: Agent) -> None:
    assert NOBODY is not None
    agent.handle_command(checkpoint_command("11", user="nobody"))
    agent.handle_command(checkpoint_command("12", user="no-such-user-xyz"))
    agent.handle_command(checkpoint_command("13"))
    assert [r["ok"] for r in results(agent)] == [True, True, True]
    d11 = (tmp_path / "jobs" / "11").stat()
    assert (d11.st_uid, d11.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert stat.S_IMODE(d11.st_mode) == 0o700
    assert (tmp_path / "jobs" / "11" / "checkpoint").stat().st_uid == NOBODY.pw_uid
    for job in ("12", "13"):
        assert (tmp_path / "jobs" / job).stat().st_uid == 0
        assert (tmp_path / "jobs" / job / "checkpoint").stat().st_uid == 0


def test_watcher_forgets_a_job_whose_directory_goes_and_then_sleeps(tmp_path: Path,
                                                                    agent: Agent) -> None:
    import shutil

    (tmp_path / "jobs" / "21").mkdir(parents=True)
    agent.handle_command(checkpoint_command("21"))
    assert agent.checkpoints.open_jobs() == ["21"]
    calls = []
    real = agent.checkpoints.check_once

    def counting() -> None:
        calls.append(time.monotonic())
        real()

    agent.checkpoints.check_once = counting  # type: ignore[method-assign]
    wait_until(lambda: len(calls) >= 3, timeout=5, what="polling while a request is open")
    shutil.rmtree(tmp_path / "jobs" / "21")  # the epilog ran
    wait_until(lambda: agent.checkpoints.open_jobs() == [], timeout=5, what="the job to be dropped")
    time.sleep(0.05)
    idle_from = len(calls)
    time.sleep(0.5)  # poll_s is 0.02: a polling thread would have looked ~25 times
    assert len(calls) == idle_from
    assert len(results(agent)) == 1  # no ack was reported


def test_request_expires_an_hour_after_its_deadline(tmp_path: Path) -> None:
    clock = FakeClock(now=time.time())
    agent = make_agent(tmp_path, poll_s=3600, clock=clock)
    try:
        (tmp_path / "jobs" / "31").mkdir(parents=True)
        agent.handle_command(checkpoint_command("31", deadline=clock.now + 10))
        agent.checkpoints.check_once()
        assert agent.checkpoints.open_jobs() == ["31"]
        clock.advance(10 + EXPIRE_AFTER_S + 1)
        agent.checkpoints.check_once()
        assert agent.checkpoints.open_jobs() == []
    finally:
        agent.shutdown()


# --------------------------------------------------------------------------- local fallback


CHILD = r"""
import os, signal, subprocess, sys, time
marker = sys.argv[1]
def on_usr1(signum, frame):
    with open(marker, "w") as f:
        f.write("USR1")
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_usr1)
grandchild = subprocess.Popen(["sleep", "60"])  # in the job too, but its parent is
print(grandchild.pid, flush=True)
time.sleep(60)
sys.exit(3)
"""


def unique_job_id() -> str:
    """A job id no other process on this machine names (tests run side by side)."""
    return str(int.from_bytes(os.urandom(5), "big") + 10**13)


class JobProcess:
    """A stand-in for a job's batch shell: its environment names the job; it has a
    child (like srun) whose parent is in the job."""

    def __init__(self, tmp_path: Path, job_id: str) -> None:
        self.job_id = job_id
        self.marker = tmp_path / f"usr1-{job_id}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_JOB_ID"] = job_id
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(self.marker)], env=env,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.grandchild = int(self.proc.stdout.readline())

    def got_usr1(self, timeout: float = 10.0) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return self.proc.returncode == 0 and self.marker.read_text() == "USR1"

    def grandchild_alive(self) -> bool:
        try:
            os.kill(self.grandchild, 0)
        except ProcessLookupError:
            return False
        try:
            with open(f"/proc/{self.grandchild}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def close(self) -> None:
        for pid in (self.proc.pid, self.grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(5)
        deadline = time.monotonic() + 5
        while self.grandchild_alive() and time.monotonic() < deadline:  # (orphaned: init reaps it)
            time.sleep(0.01)


@pytest.fixture
def job_process(tmp_path: Path) -> Iterator[JobProcess]:
    job = JobProcess(tmp_path, unique_job_id())
    yield job
    job.close()


def test_scan_finds_only_top_level_job_processes(job_process: JobProcess) -> None:
    job_id = job_process.job_id
    # The grandchild has just been exec'd; on a loaded machine its /proc entry can lag.
    deadline = time.monotonic() + 10
    processes = scan_processes("/proc")
    while job_process.grandchild not in processes and time.monotonic() < deadline:
        time.sleep(0.05)
        processes = scan_processes("/proc")
    assert job_id in processes[job_process.grandchild][0]
    assert top_level_pids(processes, job_id) == [job_process.proc.pid]
    assert top_level_pids(processes, "1" + job_id) == []


def test_array_task_ids_match_array_variables(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, ppid, env in ((10, 1, b"SLURM_JOB_ID=501\0SLURM_ARRAY_JOB_ID=500\0SLURM_ARRAY_TASK_ID=1\0"),
                           (11, 10, b"SLURM_JOB_ID=501\0SLURM_ARRAY_JOB_ID=500\0SLURM_ARRAY_TASK_ID=1\0"),
                           (12, 1, b"PATH=/bin\0")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(env)
        (proc / str(pid) / "stat").write_text(f"{pid} (a (weird) name) S {ppid} 1 1")
    processes = scan_processes(str(proc))
    assert top_level_pids(processes, "500_1") == top_level_pids(processes, "501") == [10]


def test_parse_signal() -> None:
    assert parse_signal("USR1") is parse_signal("SIGUSR1") is parse_signal("usr1") is signal.SIGUSR1
    assert parse_signal("15") is signal.SIGTERM
    with pytest.raises(ValueError):
        parse_signal("NOPE")


def test_xid79_without_collector_signals_the_job_locally(tmp_path: Path, agent: Agent,
                                                         job_process: JobProcess) -> None:
    job_id = job_process.job_id
    (tmp_path / "jobs" / job_id).mkdir(parents=True)
    (tmp_path / "jobs" / "77").mkdir()  # a job with no local process: still asked
    agent.poll()
    assert not agent.link_connected()
    agent.on_nvml_event("xid", 3, 79)

    assert job_process.got_usr1(), "the job's top process did not get SIGUSR1"
    assert job_process.grandchild_alive()  # only the top-level process is signalled
    xid_event, local = messages(agent, wire.EVENT)
    assert xid_event.body["kind"] == "xid"
    body = local.body
    assert (body["kind"], body["gpu"], body["data"], body["verdict"]) == ("local_checkpoint", 3, None, "FAIL")
    assert [f["check"] for f in body["findings"]] == ["xid.recent"]
    assert sorted(body["jobs"], key=lambda j: j["job_id"] != "77") == [
        {"job_id": "77", "pids": [], "signal": "USR1"},
        {"job_id": job_id, "pids": [job_process.proc.pid], "signal": "USR1"}]
    request = json.loads((tmp_path / "jobs" / job_id / "checkpoint").read_text())
    assert request["action"] == "drain-now" and request["local"] is True
    assert request["state"] == "requested" and "xid.recent GPU 3" in request["reason"]
    assert request["deadline"] == pytest.approx(request["requested_at"] + 300)

    agent.on_nvml_event("xid", 3, 79)  # within 10 minutes: not again
    assert isinstance(agent.clock, FakeClock)
    agent.clock.advance(COALESCE_S)  # the second event waited for the coalescing window
    assert agent.run_deferred() is None
    assert len(messages(agent, wire.EVENT)) == 3  # just the second xid event


class _ConnectedLink:
    connected = True

    def wake(self) -> None:
        pass

    def send_unspooled(self, frame: bytes) -> None:
        pass

    def stop(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


@pytest.mark.parametrize("case", ["connected", "no signal", "not drain-now"])
def test_no_local_fallback(tmp_path: Path, job_process: JobProcess, case: str) -> None:
    agent = make_agent(tmp_path, fallback_signal="" if case == "no signal" else "USR1")
    try:
        if case == "connected":
            agent.link = _ConnectedLink()
        (tmp_path / "jobs" / job_process.job_id).mkdir(parents=True)
        agent.poll()
        agent.on_nvml_event("xid", 3, 79 if case != "not drain-now" else 31)
        assert [m.body["kind"] for m in messages(agent, wire.EVENT)] == ["xid"]
        assert not job_process.got_usr1(timeout=0.3)
    finally:
        agent.shutdown()


# --------------------------------------------------------------------------- Link.connected


def test_link_connected_follows_the_collector(tmp_path: Path) -> None:
    keys_dir, collector_secret = make_bundle(tmp_path)
    port = free_port()
    spool = Spool(tmp_path / "spool")
    link = Link(addresses=[f"tcp://127.0.0.1:{port}"], node="n1", keys=load_client_keys(str(keys_dir)),
                spool=spool, heartbeat_s=0.2, on_command=lambda m: None)
    link.start()
    collector = FakeCollector(port, collector_secret)
    try:
        assert not link.connected
        collector.start()
        spool.append(wire.HELLO, lambda seq: wire.encode(wire.Envelope(
            type=wire.HELLO, node="n1", seq=seq, body={"version": "x", "gpus": 0, "interval_s": 1.0})))
        link.wake()  # the collector learns the peer and heartbeats it
        wait_until(lambda: link.connected, timeout=10, what="connected")
        collector.stop()
        wait_until(lambda: not link.connected, timeout=5, what="not connected once silent")
    finally:
        link.stop()
        link.join(5)
        collector.stop()
        spool.close()


# --------------------------------------------------------------------------- prolog/epilog


@as_root
def test_prolog_makes_the_job_dir_and_epilog_removes_it(tmp_path: Path) -> None:
    assert NOBODY is not None
    jobs = tmp_path / "jobs"
    settings = Settings()
    settings.gpu.count = 8
    env = {"SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3",
           "SLURM_JOB_UID": str(NOBODY.pw_uid), "SLURM_JOB_GID": str(NOBODY.pw_gid),
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_KMSG": str(tmp_path / "kmsg"),
           "SLURMGPU_JOBS_DIR": str(jobs)}
    facts = make_facts("gpu-n1")
    src = Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                  FakeVersionSource(facts.versions), FakeClock(now=time.time()))
    client = FakeSlurmClient(["gpu-n1"])
    gate = Gate(settings, env, lambda: client, source_facts(src, settings, env), exit=lambda code: None)
    assert gate.prolog() == 0
    st = (jobs / "42").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700)
    assert stat.S_IMODE(jobs.stat().st_mode) == 0o755
    (jobs / "42" / "checkpoint").write_text("done")
    assert gate.epilog() == 0
    assert not (jobs / "42").exists()
    assert gate.epilog() == 0  # already gone: fine

    refused = make_facts("gpu-n1")
    assert refused.gpus[3].remapped_rows is not None
    refused.gpus[3].remapped_rows.failure = True
    src = Sources(FakeNvmlSource(refused.nvml), FakeIbSource(refused.ib),
                  FakeVersionSource(refused.versions), FakeClock(now=time.time()))
    gate = Gate(settings, env, lambda: client, source_facts(src, settings, env), exit=lambda code: None)
    assert gate.prolog() == 1
    assert not (jobs / "42").exists()  # the job does not run here: no directory


def test_job_dir_failure_never_fails_the_prolog(tmp_path: Path) -> None:
    (tmp_path / "jobs").write_text("a file where the directory should be")
    settings = Settings()
    settings.gpu.count = 8
    env = {"SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": "42", "SLURMGPU_JOBS_DIR": str(tmp_path / "jobs"),
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_KMSG": str(tmp_path / "kmsg")}
    facts = make_facts("gpu-n1")
    src = Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                  FakeVersionSource(facts.versions), FakeClock(now=time.time()))
    gate = Gate(settings, env, lambda: FakeSlurmClient(["gpu-n1"]), source_facts(src, settings, env),
                exit=lambda code: None)
    assert gate.prolog() == 0
    assert gate.epilog() == 0


# --------------------------------------------------------------------------- a real agent


def test_agent_process_checkpoint_roundtrip_and_local_fallback(tmp_path: Path, fake_nvml_lib: Path,
                                                               scenario_file: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.simfixtures import sim_env

    scenario = scenario_file("h100-sxm-8")
    keys, collector_secret = make_bundle(tmp_path)
    port = free_port()
    jobs = tmp_path / "jobs"
    monkeypatch.delenv("SLURMGPU_JOBS_DIR")  # the agent takes [agent] jobs_dir from its config
    config = write_config(tmp_path / "agent.toml", port=port, spool=tmp_path / "spool")
    text = config.read_text().replace("[agent]\n", f'[agent]\njobs_dir = "{jobs}"\n'
                                                    "checkpoint_poll_s = 0.05\n", 1)
    config.write_text(text)
    collector = FakeCollector(port, collector_secret).start()
    agent = AgentProcess(config, keys, sim_env(fake_nvml_lib, scenario), tmp_path / "agent.log")
    job = None
    try:
        collector.wait_for(lambda e: e.type == "hello")
        (jobs / "601").mkdir(parents=True)
        command_id = collector.send_command("n1", "checkpoint", job_id="601", action="checkpoint",
                                            reason="thermal", deadline=time.time() + 300,
                                            requested_at=time.time(), trigger_node="n1", user=None)
        delivered = collector.wait_for(lambda e: e.type == "command-result"
                                       and e.body["command_id"] == command_id).envelope
        assert delivered.body["result"]["state"] == "delivered"
        path = Path(delivered.body["result"]["file"])
        assert json.loads(path.read_text())["state"] == "requested"
        proc = ckpt_cli("ack", "--json", SLURMGPU_CHECKPOINT_FILE=str(path), SLURM_JOB_ID="601")
        assert proc.returncode == 0, proc.stderr
        acked = collector.wait_for(lambda e: e.type == "command-result"
                                   and e.body["result"].get("state") == "acked").envelope
        assert acked.body["command_id"] == command_id
        assert acked.body["result"]["acked_at"] == json.loads(proc.stdout)["acked_at"]

        # The collector goes away; an XID 79 arrives: the agent signals the job itself.
        def silent() -> int:
            return agent.output().count("collector_silent_reconnecting")

        collector.stop()
        seen = silent()  # (counted after the stop: a later line is about this silence)
        # Not a fixed 3 heartbeats of silence: wait until the agent's link logged them (it
        # logs once it is past them, so Link.connected is False from then on; on a loaded
        # machine it may get there late, and the XID would take the collector's path).
        wait_until(lambda: silent() > seen, timeout=15, what="the agent to find the collector silent")
        job = JobProcess(tmp_path, unique_job_id())
        (jobs / job.job_id).mkdir()
        scenario_file.update(scenario, lambda d: d.setdefault("events", []).append(
            {"gpu": 2, "type": 8, "data": 79, "id": 1}))
        assert job.got_usr1(), agent.output()[-3000:]
        # ... and tells the collector once it is back
        started = time.monotonic()
        collector = FakeCollector(port, collector_secret).start()
        local = collector.wait_for(lambda e: e.type == "event" and e.body["kind"] == "local_checkpoint",
                                   timeout=15, after=started - 60).envelope
        assert {"job_id": job.job_id, "pids": [job.proc.pid], "signal": "USR1"} \
            in local.body["jobs"]
        assert local.body["gpu"] == 2
    finally:
        if job is not None:
            job.close()
        rc = agent.stop()
        collector.stop()
    assert rc == 0, agent.output()[-3000:]


def test_warm_path_forwards_the_job_owner() -> None:
    """The quick client and the agent's socket pass SLURM_JOB_UID/GID/USER to the Gate."""
    from slurmgpu.agent.local import job_env
    from slurmgpu.localproto import job_environment

    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "100",
           "SLURM_JOB_USER": "alice", "HOME": "/root"}
    assert job_env(job_environment(env)) == {k: v for k, v in env.items() if k != "HOME"}
