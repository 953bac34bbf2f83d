"""A job's own files are hostile input (issue 37), tested as the attack: a real agent
process (fake NVML, a test CURVE collector), a job directory owned by an unprivileged user
(``nobody``) holding what that user chose to write there, and the root hooks and agent
that read and delete it. docs/reliability.md, "Hostile job", lists each row's test."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import jobfiles, localproto
from slurmgpu.agent import Agent
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
as_root = pytest.mark.skipif(os.geteuid() != 0 or NOBODY is None,
                             reason="needs root and a 'nobody' user (chown to another user)")

#: The two payloads of the attack: an "ack" whose time is no float, and JSON too deep to parse.
ACK_400_DIGITS = '{"state": "acked", "acked_at": ' + "9" * 400 + "}"
DEEP_BRACKETS = "[" * 60_000


def nobody() -> pwd.struct_passwd:
    assert NOBODY is not None
    return NOBODY


def plant(jobs: Path, job_id: str, text: str | None = None) -> Path:
    """The job's directory, owned by nobody (as the prolog makes it), and ``text`` written
    by the job as its checkpoint file."""
    user = nobody()
    directory = jobfiles.make_job_dir(jobs, job_id, user.pw_uid, user.pw_gid)
    if text is not None:
        path = directory / jobfiles.CHECKPOINT_NAME
        path.write_text(text)
        os.chown(path, user.pw_uid, user.pw_gid)
    return directory


def checkpoint_args(job_id: str) -> dict[str, Any]:
    now = time.time()
    return {"job_id": job_id, "action": "checkpoint", "reason": "gpu.lost GPU 2",
            "deadline": now + 300, "requested_at": now, "trigger_node": "n1", "user": "nobody"}


@pytest.fixture
def shm_jobs() -> Iterator[Path]:
    """A jobs dir on a tmpfs (/dev/shm), as /run is: files are made and deleted at its speed."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    base = Path("/dev/shm") / f"slurmgpu-test-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    try:
        yield base / "jobs"
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Node:
    """A real agent process (``n1``) connected to a test collector."""

    def __init__(self, tmp_path: Path, jobs: Path, env: dict[str, str], extra: str = "") -> None:
        keys, secret = make_bundle(tmp_path)
        port = free_port()
        self.jobs = jobs
        self.socket = str(tmp_path / "spool" / "agent.sock")
        config = write_config(tmp_path / "agent.toml", port=port, spool=tmp_path / "spool",
                              extra=extra)
        config.write_text(config.read_text().replace(
            "[agent]\n", f'[agent]\njobs_dir = "{jobs}"\ncheckpoint_poll_s = 0.05\n', 1))
        self.collector = FakeCollector(port, secret).start()
        env = {**env, "SLURMGPU_JOBS_DIR": str(jobs), "SLURMGPU_STATE_DIR": str(tmp_path / "state")}
        self.agent = AgentProcess(config, keys, env, tmp_path / "agent.log")
        self.collector.wait_for(lambda e: e.type == "hello", timeout=30)

    def command(self, command: str, **args: Any) -> dict[str, Any]:
        """Send a command; its first command-result's body."""
        command_id = self.collector.send_command("n1", command, **args)
        return self.collector.wait_for(lambda e: e.type == "command-result"
                                       and e.body["command_id"] == command_id).envelope.body

    def output(self) -> str:
        return self.agent.output()

    def stop(self) -> int:
        try:
            return self.agent.stop()
        finally:
            self.collector.stop()


@pytest.fixture
def node_factory(tmp_path: Path, fake_nvml_lib: Path,
                 scenario_file: Any) -> Iterator[Callable[..., Node]]:
    from tests.simfixtures import sim_env

    made: list[Node] = []

    def make(jobs: Path | None = None, extra: str = "") -> Node:
        env = sim_env(fake_nvml_lib, scenario_file("h100-sxm-8"))
        made.append(Node(tmp_path, jobs or tmp_path / "jobs", env, extra))
        return made[-1]

    yield make
    for node in made:
        node.stop()


# --------------------------------------------------------------------- 1. the link lives


@as_root
@pytest.mark.parametrize("payload", [ACK_400_DIGITS, DEEP_BRACKETS],
                         ids=["acked_at-400-digits", "60000-brackets"])
def test_a_poisoned_checkpoint_file_never_cuts_the_node_off(node_factory: Callable[..., Node],
                                                            payload: str) -> None:
    """Planted before any request: the request replaces it, and the node stays connected
    (was: link_crashed, and nothing more from the node)."""
    node = node_factory()
    directory = plant(node.jobs, "701", payload)
    result = node.command("checkpoint", **checkpoint_args("701"))
    assert result["ok"] and result["result"]["state"] == "delivered", result
    assert json.loads((directory / "checkpoint").read_text())["state"] == "requested"
    pong = node.command("ping")
    assert pong["ok"] and pong["result"]["pong"], pong
    out = node.output()
    assert "checkpoint_file_not_understood" in out
    assert "link_crashed" not in out and "Traceback" not in out


@pytest.mark.parametrize("text", [ACK_400_DIGITS, DEEP_BRACKETS, "[" * 999 + "]" * 999,
                                  '{"state": "acked", "acked_at": NaN, "note": ' + "[" * 900 + "]" * 900 + "}",
                                  '{"state": "acked", "acked_at": 1e999}', "\udcff" * 10, "{" * 70_000])
def test_parsing_a_jobs_file_is_total(text: str) -> None:
    parsed = jobfiles.parse(text)
    assert parsed["state"] in ("unknown", "acked")
    assert parsed.get("acked_at") is None and "error" in parsed


def test_a_command_whose_handler_raises_never_ends_the_link(tmp_path: Path) -> None:
    """Whatever a command's handler raises (RecursionError, as a poisoned file did): the
    link logs it and goes on; a message spooled after it still reaches the collector."""
    from slurmgpu import wire
    from slurmgpu.agent.core import load_client_keys

    called = threading.Event()

    def handler(message: wire.Envelope) -> None:
        called.set()
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    keys_dir, secret = make_bundle(tmp_path)
    port = free_port()
    spool = Spool(tmp_path / "spool")
    collector = FakeCollector(port, secret).start()
    link = Link(addresses=[f"tcp://127.0.0.1:{port}"], node="n1", keys=load_client_keys(str(keys_dir)),
                spool=spool, heartbeat_s=0.2, on_command=handler)
    link.start()

    def send(mtype: str, body: dict[str, Any]) -> None:
        spool.append(mtype, lambda seq: wire.message_frame(mtype, "n1", seq, body, epoch=spool.epoch))
        link.wake()

    try:
        send(wire.HELLO, {"version": "x", "gpus": 0, "interval_s": 1.0})
        collector.wait_for(lambda e: e.type == wire.HELLO)
        collector.send_command("n1", "checkpoint", job_id="1")
        assert called.wait(10)
        send(wire.EVENT, {"kind": "xid", "gpu": 0, "data": 79, "verdict": "FAIL", "findings": []})
        collector.wait_for(lambda e: e.type == wire.EVENT)
        assert link.is_alive() and link.commands_failed == 1
    finally:
        link.stop()
        link.join(5)
        collector.stop()
        spool.close()


def _settings(tmp_path: Path, port: int) -> Settings:
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.agent.jobs_dir = str(tmp_path / "jobs")
    settings.agent.interval_s = 0.2
    settings.agent.heartbeat_s = 0.5
    settings.agent.events = False
    settings.collector.address = f"tcp://127.0.0.1:{port}"
    return settings


def _crash(link: Link) -> None:
    raise RuntimeError("injected: the link thread dies")


def test_a_dead_link_thread_is_started_again_and_one_that_keeps_dying_stops_the_watchdog(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection (whatever kills it): the main loop starts a new link, which the
    collector hears from; a link that dies at every start is dead for good: no more
    WATCHDOG=1, so systemd restarts the agent (was: pings went on for a deaf agent)."""
    bundle, secret = make_bundle(tmp_path)
    port = free_port()
    collector = FakeCollector(port, secret).start()
    name = f"slurmgpu-test-{uuid.uuid4().hex}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind("\0" + name)
    notify.settimeout(0.05)
    facts = make_facts("n1", gpus=2)
    sources = Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                      FakeVersionSource(facts.versions), FakeClock(now=time.time()))
    agent = Agent(_settings(tmp_path, port), "n1", sources=sources, keys_dir=str(bundle),
                  environ={"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "200000"})
    agent.restarts_max = 2
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    try:
        collector.wait_for(lambda e: e.type == "hello")
        first = agent.link
        said_hello = {e.id for e in collector.of_type("hello")}  # before the crash: its restart's hello can be quick
        monkeypatch.setattr(first, "_flush", lambda: _crash(first))
        agent.submit("event", {"kind": "xid", "gpu": 0, "data": 13, "verdict": "WARN", "findings": []})
        collector.wait_for(lambda e: e.type == "event" and e.body["data"] == 13, timeout=15)
        assert agent.link is not first and agent.link.is_alive()
        collector.wait_for(lambda e: e.type == "hello" and e.id not in said_hello, timeout=15)  # a new connection

        monkeypatch.setattr(Link, "_flush", _crash)  # from now on every link dies
        agent.submit("event", {"kind": "xid", "gpu": 0, "data": 31, "verdict": "WARN", "findings": []})
        wait_until(lambda: agent.vital_dead == "link", timeout=20, what="the link to be dead for good")
        with contextlib.suppress(TimeoutError):
            while notify.recv(64):  # what was sent before
                pass
        time.sleep(1.0)  # five watchdog intervals
        pings = []
        with contextlib.suppress(TimeoutError):
            while True:
                pings.append(notify.recv(64))
        assert b"WATCHDOG=1" not in pings
    finally:
        agent.stop()
        runner.join(10)
        collector.stop()
        notify.close()


# ------------------------------------------------------------- 2. each job on its own


@as_root
def test_one_poisoned_file_never_hides_another_jobs_ack(node_factory: Callable[..., Node]) -> None:
    """Job 801 turns its request into 60,000 '[' after it arrived, then 70,000 '{'; job
    802's ack is still relayed, and 801's file is one log line, not one per poll nor per
    rewrite (was: no other ack ever seen, 98 tracebacks in 5 s)."""
    node = node_factory()
    for job_id in ("801", "802"):
        plant(node.jobs, job_id)
        result = node.command("checkpoint", **checkpoint_args(job_id))
        assert result["result"]["state"] == "delivered", result
    poisoned = node.jobs / "801" / "checkpoint"
    poisoned.write_text(DEEP_BRACKETS)
    time.sleep(0.5)  # 10 polls of the poisoned file
    poisoned.write_text("{" * 70_000)  # a new version: still within the job's log allowance
    time.sleep(0.5)
    (node.jobs / "802" / "checkpoint").write_text("done")
    acked = node.collector.wait_for(lambda e: e.type == "command-result"
                                    and e.body["result"].get("state") == "acked").envelope
    assert acked.body["result"]["job_id"] == "802"
    out = node.output()
    assert out.count("checkpoint_file_not_understood") == 1, out[-3000:]
    assert "Traceback" not in out


# -------------------------------------------------- 3. the epilog decides first


def _gate(tmp_path: Path, jobs: Path, job_id: str, client: FakeSlurmClient, **epilog: Any) -> Gate:
    settings = Settings()
    settings.gpu.count = 8
    for key, value in epilog.items():
        setattr(settings.epilog, key, value)
    user = nobody()
    env = {"SLURMD_NODENAME": "gpu-n1", "SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": "0",
           "SLURM_JOB_UID": str(user.pw_uid), "SLURM_JOB_GID": str(user.pw_gid),
           "SLURMGPU_STATE_DIR": str(tmp_path / "state"), "SLURMGPU_KMSG": str(tmp_path / "kmsg"),
           "SLURMGPU_JOBS_DIR": str(jobs)}
    facts = make_facts("gpu-n1")
    src = Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                  FakeVersionSource(facts.versions), FakeClock(now=time.time()))
    return Gate(settings, env, lambda: client, source_facts(src, settings, env), exit=lambda code: None)


def fill(directory: Path, count: int, name_len: int = 32) -> None:
    """What a job can leave: ``count`` empty files (as nobody) with long names."""
    user = nobody()
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stem = "x" * (name_len - 8)
        for i in range(count):
            os.mknod(f"{stem}{i:08d}", 0o600 | stat.S_IFREG, dir_fd=fd)
    finally:
        os.close(fd)
    os.chown(directory, user.pw_uid, user.pw_gid)


@as_root
def test_a_job_dir_full_of_files_never_stalls_the_epilogs_decision(tmp_path: Path,
                                                                   shm_jobs: Path) -> None:
    """150,000 files take rmtree ~2 s: past a 0.5 s watchdog with fail-closed, any user drained
    any node they ran on. Now the epilog decides first (healthy: exit 0, no drain), then
    moves the directory away at once and deletes it within its budget."""
    client = FakeSlurmClient(["gpu-n1"])
    fill(plant(shm_jobs, "901"), 150_000)
    gate = _gate(tmp_path, shm_jobs, "901", client, timeout_s=0.5, on_error="fail-closed",
                 strays="ignore")
    assert gate.epilog() == 0
    assert [r["action"] for r in gate.records] == ["none"], gate.records
    assert "DRAIN" not in client.states["gpu-n1"].flags  # not drained
    assert not (shm_jobs / "901").exists()


@as_root
def test_a_deeply_nested_or_swapped_job_dir_is_still_deleted(tmp_path: Path, shm_jobs: Path) -> None:
    """3,000 nested directories (rmtree: RecursionError, the directory stayed on /run) and
    symlinks to root's files: all deleted, nothing outside followed."""
    outside = tmp_path / "root-owned"
    outside.mkdir()
    (outside / "keep").write_text("root's")
    directory = plant(shm_jobs, "902")
    (directory / "link").symlink_to(outside)
    (directory / "file-link").symlink_to(outside / "keep")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.symlink(str(outside), "up", dir_fd=fd)
    os.close(fd)
    gate = _gate(tmp_path, shm_jobs, "902", FakeSlurmClient(["gpu-n1"]))
    assert gate.epilog() == 0
    assert not (shm_jobs / "902").exists()
    assert os.listdir(shm_jobs / jobfiles.TRASH_NAME) == []
    assert (outside / "keep").read_text() == "root's"


def test_a_sweep_that_cannot_finish_says_so_and_the_next_one_goes_on(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    directory = jobfiles.make_job_dir(jobs, "903")
    for i in range(50):
        (directory / f"f{i}").write_text("x")
    jobfiles.retire_job_dir(jobs, "903")
    first = jobfiles.sweep_trash(jobs, max_entries=20)
    assert (first.removed, first.done) == (20, False)
    rest = jobfiles.sweep_trash(jobs)
    assert rest.done and rest.removed == 31  # 30 files and the directory
    assert os.listdir(jobs / jobfiles.TRASH_NAME) == []


@as_root
def test_what_no_sweep_can_delete_is_said_and_swept_again(tmp_path: Path) -> None:
    """An entry the sweep cannot remove (here a mount point: EBUSY) is left, logged, and
    an ``agent.jobs_dir`` WARN in the agent's report until a later sweep removes it."""
    jobs = tmp_path / "jobs"
    directory = plant(jobs, "905")
    (directory / "stuck").mkdir()
    (directory / "file").write_text("x")
    if os.system(f"mount -t tmpfs -o size=64k slurmgpu-test {directory / 'stuck'} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    settings = Settings()
    settings.agent.spool_dir = str(tmp_path / "spool")
    settings.agent.jobs_dir = str(jobs)
    facts = make_facts("n1", gpus=2)
    agent = Agent(settings, "n1", sources=Sources(FakeNvmlSource(facts.nvml), FakeIbSource(facts.ib),
                                                 FakeVersionSource(facts.versions), FakeClock()),
                  environ={})
    try:
        assert _gate(tmp_path, jobs, "905", FakeSlurmClient(["gpu-n1"])).epilog() == 0
        assert not directory.exists()
        agent.sweep_jobs_trash()
        _, verdict = agent.poll()
        [finding] = [f for f in verdict.findings if f.check == "agent.jobs_dir"]
        assert finding.severity.name == "WARN" and "not deleted" in finding.message
    finally:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.startswith("slurmgpu-test ") and str(jobs) in line]
        for mount in mounts:
            os.system(f"umount {mount}")
    agent.sweep_soon()
    agent.sweep_jobs_trash()
    _, verdict = agent.poll()
    assert not [f for f in verdict.findings if f.check == "agent.jobs_dir"]
    assert os.listdir(jobs / ".trash") == []


# ------------------------------------ 4. the warm path: bounded inside the root agent


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@as_root
def test_the_agent_deletes_a_huge_job_dir_in_bounded_memory(node_factory: Callable[..., Node],
                                                            shm_jobs: Path) -> None:
    """150,000 entries with 200-character names, through the agent's warm-path epilog:
    rmtree's listing raised the root agent's peak memory by ~60 MB (700,000 such entries:
    past the unit's MemoryMax=256M, then the OOM kill). The sweep streams them: the peak
    stays flat, and the directory is gone."""
    node = node_factory(shm_jobs)
    fill(plant(shm_jobs, "904"), 150_000, name_len=200)
    pid = node.agent.proc.pid
    before = _vm_hwm_kb(pid)
    user = nobody()
    reply = localproto.ask(node.socket, {"op": "epilog", "env": {
        "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "904", "SLURM_JOB_GPUS": "0",
        "SLURM_JOB_UID": str(user.pw_uid), "SLURM_JOB_GID": str(user.pw_gid)}}, 60)
    assert reply["ok"] and reply["exit"] == 0, reply
    assert not (shm_jobs / "904").exists()
    trash = shm_jobs / ".trash"  # (none before: rmtree ran inside the epilog)
    wait_until(lambda: not trash.exists() or not os.listdir(trash), timeout=60,
               what="the sweep to empty the trash")
    grown_mb = (_vm_hwm_kb(pid) - before) / 1024
    assert grown_mb < 20, f"the agent's peak memory grew {grown_mb:.0f} MB"
    assert node.agent.proc.poll() is None


def test_job_dirs_outlive_an_agent_restart() -> None:
    """systemd deletes a unit's RuntimeDirectory= when it stops, restarts included, unless
    it is preserved: the agent's restart (an OOM kill, an upgrade) deleted every running
    job's directory under /run/slurmgpu/jobs."""
    unit = (REPO / "daemon" / "slurmgpu-agent.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines()
                    if "=" in line and not line.startswith("#"))
    assert settings["RuntimeDirectory"] == "slurmgpu"
    assert jobfiles.DEFAULT_JOBS_DIR.startswith("/run/slurmgpu/")
    assert settings.get("RuntimeDirectoryPreserve") == "yes"


# ------------------------------------------------------------------- 5. smaller


@as_root
def test_a_full_jobs_dir_is_an_error_result_and_a_finding(tmp_path: Path,
                                                          node_factory: Callable[..., Node]) -> None:
    """One user fills the job dirs' filesystem: another job's checkpoint request cannot be
    written. It is an error result, a log line, and an ``agent.jobs_dir`` WARN in the node's
    next report; the link goes on."""
    jobs = tmp_path / "small"
    jobs.mkdir()
    if os.system(f"mount -t tmpfs -o size=256k,mode=0755 slurmgpu-test {jobs} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        node = node_factory(jobs)
        hog = plant(jobs, "951")
        with contextlib.suppress(OSError), open(hog / "fill", "wb") as f:
            f.write(b"x" * (1 << 20))
        plant(jobs, "952")  # (the prolog made it before the filesystem was full)
        result = node.command("checkpoint", **checkpoint_args("952"))
        assert not result["ok"] and "No space left" in result["result"]["error"], result
        report = node.collector.wait_for(lambda e: e.type == "report" and any(
            f["check"] == "agent.jobs_dir" for f in e.body["findings"]), timeout=15).envelope
        finding = next(f for f in report.body["findings"] if f["check"] == "agent.jobs_dir")
        assert finding["severity"] == "WARN" and "952" in finding["message"]
        assert node.command("ping")["ok"]
    finally:
        os.system(f"umount -l {jobs}")  # (detached now, gone once the agent stops)


def test_state_and_spool_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """A source or venv install under umask 000 (or 022) made them readable by every user:
    GPU snapshots, each job's user and strays, the spool's messages."""
    old = os.umask(0)
    try:
        client = FakeSlurmClient(["gpu-n1"])
        gate = _gate(tmp_path, tmp_path / "jobs", "990", client) if NOBODY else None
        if gate is None:
            pytest.skip("needs a 'nobody' user")
        assert gate.prolog() == 0
        assert gate.epilog() == 0
        spool = Spool(str(tmp_path / "spool"), 10)
        spool.close()
    finally:
        os.umask(old)
    state = tmp_path / "state"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in
             (state, state / "gate.jsonl", state / "job-summaries.jsonl", state / "jobs",
              tmp_path / "spool", tmp_path / "spool" / "spool.db")}
    assert modes == {"state": 0o700, "gate.jsonl": 0o600, "job-summaries.jsonl": 0o600,
                     "jobs": 0o700, "spool": 0o700, "spool.db": 0o600}
