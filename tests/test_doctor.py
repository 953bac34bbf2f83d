"""`slurmgpu doctor` on real installations in a tmp dir: a real config, keys made with
slurmgpu.keys, a real collector, the agent's real local socket server, the repository's
own hook programs, the real scontrol and the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from slurmgpu import keys
from slurmgpu.cli import cli
from slurmgpu.config.schema import Settings
from slurmgpu.doctor import CHECKS, Context, Level, detect_role
from slurmgpu.doctor.collector import check_clock
from slurmgpu.doctor.model import Check, CollectorReply, run_check
from slurmgpu.doctor.slurmconf import env_command
from slurmgpu.engine import evaluate
from slurmgpu.facts import NodeFacts
from slurmgpu.result import Verdict
from slurmgpu.slurm.conf import SlurmConfError, find_slurm_conf, parse_slurm_conf
from slurmgpu.testing import make_facts
from tests.agenthelpers import NEEDS_NOBODY, free_port
from tests.simfixtures import ScenarioFactory, sim_env
from tests.test_collector import make_settings, running

REPO = Path(__file__).resolve().parent.parent
NODE = "gpu-n1"
HEARTBEAT_S = 0.2
LEVELS = {"OK", "WARN", "FAIL", "SKIP"}
# Variables of the machine running the tests that would point doctor elsewhere.
LEAKY_ENV = ("SLURM_CONF", "SLURMGPU_CONFIG", "SLURMGPU_KEYS_DIR", "SLURMGPU_AGENT_SOCKET",
             "SLURMD_NODENAME", "SLURMGPU_STATE_DIR")


# --------------------------------------------------------------------------- an installation


@dataclass
class Install:
    """One node's installation under ``root``; every part can be broken by a test."""

    root: Path
    keys_root: Path  # the head node's keys directory
    bundle: Path  # this node's keys directory
    config: Path
    slurm_conf: Path
    bin_dir: Path  # a Slurm client whose `scontrol ping` answers UP
    port: int
    events_port: int
    # A node with the agent: its config names the collector and its keys directory holds
    # the bundle. Without: the hooks-only install (no agent/collector checks, no waits).
    agent_node: bool = False
    config_extra: str = ""
    slurm_lines: dict[str, str] = field(default_factory=dict)

    def write(self) -> None:
        collector = f"""
[collector]
address = "tcp://127.0.0.1:{self.port}"
events_port = {self.events_port}
heartbeat_s = {HEARTBEAT_S}
keys_dir = "{self.bundle}"
""" if self.agent_node else f'[collector]\nkeys_dir = "{self.root / "no-keys"}"\n'
        self.config.write_text(f"""
[gpu]
count = 0

[slurm]
bin_dir = "{self.bin_dir}"

[paths]
state_dir = "{self.root / 'state'}"

[agent]
spool_dir = "{self.root / 'spool'}"
socket = "{self.root / 'agent.sock'}"
{collector}
{self.config_extra}
""", encoding="utf-8")
        lines = "\n".join(f"{k}={v}" for k, v in self.slurm_lines.items() if v)
        self.slurm_conf.write_text(f"ClusterName=doctor\nSlurmctldHost=localhost\n{lines}\n",
                                   encoding="utf-8")

    def doctor(self, *args: str, write: bool = True) -> Result:
        if write:
            self.write()
        return CliRunner().invoke(cli, ["doctor", "--config", str(self.config), "--slurm-conf",
                                        str(self.slurm_conf), "--node", NODE, *args])

    def findings(self, *args: str, write: bool = True) -> tuple[int, dict[str, dict[str, Any]]]:
        result = self.doctor("--json", *args, write=write)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        rows = json.loads(result.output)
        return result.exit_code, {row["check"]: row for row in rows}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sgd-", dir="/tmp"))  # AF_UNIX paths: <= 107 bytes
    d.chmod(0o755)  # the TaskProlog there runs as a job's user
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def install(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    for name in (*LEAKY_ENV, "SLURMGPU_NVML_LIBRARY"):
        monkeypatch.delenv(name, raising=False)
    keys_root = short_dir / "head-keys"
    keys.init(keys_root)
    bundle = keys.add_node(keys_root, NODE)
    bin_dir = short_dir / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1" = ping ] && echo "Slurmctld(primary) at head is UP" && exit 0\n'
                        '[ "$*" = "show config" ] && echo "SLURM_VERSION           = 25.11.7" && exit 0\n'
                        'exit 1\n')
    scontrol.chmod(0o755)
    return Install(root=short_dir, keys_root=keys_root, bundle=bundle, config=short_dir / "slurmgpu.toml",
                   slurm_conf=short_dir / "slurm.conf", bin_dir=bin_dir, port=free_port(), events_port=free_port(),
                   slurm_lines={"Prolog": str(REPO / "prolog" / "slurmgpu-prolog"),
                                "Epilog": str(REPO / "epilog" / "slurmgpu-epilog"),
                                "PrologFlags": "Alloc,Contain",
                                "SchedulerParameters": "bf_continue,nohold_on_prolog_fail",
                                "HealthCheckProgram": str(REPO / "daemon" / "slurmgpu-healthcheck"),
                                "JobRequeue": "1",
                                "TaskProlog": str(REPO / "prolog" / "slurmgpu-taskprolog")})


@dataclass
class FakeAgent:
    """What the agent's local socket server needs of an agent."""

    facts: NodeFacts
    settings: Settings = field(default_factory=Settings)
    node: str = NODE

    def latest(self) -> tuple[NodeFacts, Verdict, float]:
        self.facts.collected_at = time.time()
        return self.facts, evaluate(self.facts, self.settings), time.time()

    def facts_for(self, gpus: frozenset[int] | None, max_age_s: float) -> NodeFacts:
        return self.facts


@pytest.fixture
def agent_socket(install: Install) -> Iterator[Path]:
    """The agent's real local socket server, answering for NODE."""
    from slurmgpu.agent.local import serve_local

    install.agent_node = True
    path = install.root / "agent.sock"
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve_local, args=(FakeAgent(make_facts(NODE)), str(path), stop),
                              kwargs={"ready": ready}, daemon=True)
    thread.start()
    assert ready.wait(5)
    yield path
    stop.set()
    thread.join(5)


def collector_settings(install: Install, **kw: Any) -> Any:
    install.agent_node = True
    kw.setdefault("events_port", install.events_port)
    return make_settings(install.root, install.keys_root, port=install.port, heartbeat_s=HEARTBEAT_S, **kw)


# --------------------------------------------------------------------------- whole runs


@NEEDS_NOBODY
def test_healthy_node_is_all_ok_and_exits_0(install: Install, agent_socket: Path) -> None:
    with running(collector_settings(install)):
        result = install.doctor()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"slurmgpu doctor: {NODE} as node (node bundle in {install.bundle})"
    assert not [line for line in lines if line.startswith(("FAIL", "WARN"))], result.output
    by_check = {line.split()[1]: line for line in lines[1:-1]}
    assert "accepted key" in by_check["collector"] and f"answered {NODE}'s heartbeat" in by_check["collector"]
    assert by_check["collector.events"].startswith("OK") and \
        f"tcp://127.0.0.1:{install.events_port} accepted key" in by_check["collector.events"]
    assert by_check["clock"].startswith("OK")
    assert by_check["agent"].startswith("OK") and f"{NODE} OK" in by_check["agent"]
    assert "exports SLURMGPU_CHECKPOINT_FILE" in by_check["slurm.task_prolog"]
    assert by_check["slurmctld"] == "OK    slurmctld           Slurmctld(primary) at head is UP"
    assert by_check["slurm.version"] == ("OK    slurm.version       slurmctld runs Slurm 25.11 "
                                         "(tested in CI)")
    assert by_check["nvml"].startswith("SKIP") and "[gpu] count = 0" in by_check["nvml"]
    assert by_check["dir.spool"].startswith("OK")
    assert lines[-1].startswith(f"{NODE}: OK - ")


def test_json_is_a_list_of_check_severity_message_fix(install: Install) -> None:
    install.slurm_lines["PrologFlags"] = ""
    code, _ = install.findings()
    rows = json.loads(install.doctor("--json").output)
    assert isinstance(rows, list) and rows
    for row in rows:
        assert set(row) == {"check", "severity", "message", "fix"}
        assert row["severity"] in LEVELS and isinstance(row["message"], str) and row["message"]
        assert (row["fix"] is None) == (row["severity"] in ("OK", "SKIP")), row
    assert code == 2


@NEEDS_NOBODY
def test_exit_codes_follow_the_worst_finding(install: Install, agent_socket: Path) -> None:
    with running(collector_settings(install)):
        assert install.findings()[0] == 0
        install.slurm_lines["SchedulerParameters"] = ""  # a WARN
        assert install.findings()[0] == 1
        install.slurm_lines["Epilog"] = str(install.root / "missing-epilog")  # and a FAIL
        assert install.findings()[0] == 2


def test_help_names_options_and_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["doctor", "-h"])
    assert result.exit_code == 0
    for text in ("--config FILE", "--slurm-conf FILE", "--json", "--role [auto|node|head]",
                 "0  every check OK or SKIP", "1  a WARN", "2  a FAIL", "3  the config file is invalid"):
        assert text in result.output, text


def test_invalid_config_names_file_and_key_and_exits_3(install: Install) -> None:
    install.config_extra = '\n[thermal]\nmargin_warn_c = "five"\n'
    code, rows = install.findings()
    assert code == 3
    config = rows["config"]
    assert config["severity"] == "FAIL"
    assert str(install.config) in config["message"] and "thermal.margin_warn_c" in config["message"]
    assert "`thermal.margin_warn_c`" in config["fix"] and "slurmgpu config check" in config["fix"]
    for check in ("nvml", "agent", "collector", "dirs"):
        assert rows[check]["severity"] == "SKIP" and "valid config" in rows[check]["message"]


# --------------------------------------------------------------------------- collector


def test_collector_refuses_a_key_not_on_the_allow_list(install: Install) -> None:
    keys.revoke(install.keys_root, NODE)  # the bundle stays, the collector no longer knows it
    with running(collector_settings(install)) as collector:
        code, rows = install.findings()
        assert collector.counters.received == 0  # refused in the handshake: no frame got in
    collector_row = rows["collector"]
    fp = keys.fingerprint(keys.public_key(install.bundle / "node.key"))
    assert collector_row["severity"] == "FAIL"
    assert f"refused this node's key {fp}" in collector_row["message"]
    assert f"slurmgpu keys add-node {NODE}" in collector_row["fix"]
    assert rows["clock"]["severity"] == "SKIP"
    assert code == 2


def test_collector_probe_stores_nothing_and_leaves_the_agents_route(install: Install) -> None:
    """The probe is answered (at once), stores nothing, and does not take the node's route
    (where checkpoint commands go) or its last-seen time from the running agent."""
    import zmq

    from tests.agenthelpers import query_db
    from tests.test_collector import Agent

    cfg = collector_settings(install)
    ctx = zmq.Context()
    try:
        with running(cfg) as collector:
            agent = Agent(ctx, cfg, install.keys_root, NODE, routing_id="")  # as agents: zmq picks the id
            agent.report(1)
            assert agent.acked() == [1]
            route, seen = collector.transport.routes[NODE], collector.transport.liveness.seen[NODE]
            _, rows = install.findings()
            assert rows["collector"]["severity"] == "OK"
            assert collector.counters.probes_answered == 1 and collector.counters.heartbeats_received == 0
            assert collector.transport.routes[NODE] == route
            # (not refreshed by the probe; the collector forgets it after 3 silent heartbeats)
            assert collector.transport.liveness.seen.get(NODE, seen) == seen
    finally:
        ctx.destroy(linger=0)
    assert query_db(Path(cfg.db), "SELECT COUNT(*) FROM messages") == [(1,)]  # the agent's report only


def test_key_of_another_node_gets_no_answer(install: Install) -> None:
    with running(collector_settings(install)):
        result = install.doctor("--json", "--node", "gpu-n2")  # the last --node wins
    row = {r["check"]: r for r in json.loads(result.output)}["collector"]
    assert row["severity"] == "FAIL" and "did not answer gpu-n2's heartbeat" in row["message"]
    assert "slurmgpu keys list" in row["fix"]


def test_wrong_collector_key_in_the_bundle(install: Install, short_dir: Path) -> None:
    other = short_dir / "other-head"
    keys.init(other)
    shutil.copy(other / "collector.key", install.bundle / "collector.key")
    with running(collector_settings(install)):
        _, rows = install.findings()
    assert rows["collector"]["severity"] == "FAIL"
    assert "is not that collector's key" in rows["collector"]["message"]


def test_no_collector_listening(install: Install) -> None:
    install.agent_node = True
    started = time.monotonic()
    _, rows = install.findings()
    assert time.monotonic() - started < 15
    assert rows["collector"]["severity"] == "FAIL"
    assert f"no connection to tcp://127.0.0.1:{install.port}" in rows["collector"]["message"]
    assert "systemctl start slurmgpu-collector" in rows["collector"]["fix"]


def test_an_events_port_without_a_collector_is_a_warning(install: Install) -> None:
    """The collector answers on its main port but not on the events port (a firewall, a
    collector that could not bind it): events still arrive, later; a WARN that says so."""
    with running(collector_settings(install, events_port=0)):
        code, rows = install.findings()
    assert rows["collector"]["severity"] == "OK"
    events = rows["collector.events"]
    assert events["severity"] == "WARN", events
    assert events["message"].startswith(f"no CURVE handshake at tcp://127.0.0.1:{install.events_port} "
                                         "([collector] events_port)")
    assert "go with the reports" in events["message"]
    assert f"open TCP port {install.events_port}" in events["fix"] and "events_port = 0" in events["fix"]
    assert code >= 1


def test_head_role_checks_the_collector_keys_and_port(install: Install) -> None:
    install.bundle = install.keys_root  # the head node's config names its own keys directory
    with running(collector_settings(install)):
        result = install.doctor("--json")
    rows = {r["check"]: r for r in json.loads(result.output)}
    assert rows["keys"]["severity"] == "OK" and "1 node allow-listed" in rows["keys"]["message"]
    assert rows["collector"] == {"check": "collector", "severity": "OK", "fix": None,
                                 "message": f"listening at tcp://127.0.0.1:{install.port}"}
    assert rows["collector.events"] == {"check": "collector.events", "severity": "OK", "fix": None,
                                        "message": f"listening at tcp://127.0.0.1:{install.events_port}"}
    assert rows["nvml"]["severity"] == rows["agent"]["severity"] == rows["clock"]["severity"] == "SKIP"
    assert "the programs are checked on the GPU nodes" in rows["slurm.prolog"]["message"]
    assert "dir.db" in rows and "dir.spool" not in rows


def test_role_auto() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert detect_role("auto", tmp) == ("node", f"no keys in {tmp}")
        keys.init(tmp)
        assert detect_role("auto", tmp) == ("head", f"collector keys in {tmp}")
        assert detect_role("node", tmp) == ("node", "--role")
        bundle = keys.add_node(tmp, NODE)
        assert detect_role("auto", str(bundle)) == ("node", f"node bundle in {bundle}")


@pytest.mark.parametrize(("skew", "level"), [(0.2, Level.OK), (-5.0, Level.WARN), (60.0, Level.FAIL)])
def test_clock_skew_thresholds(skew: float, level: Level) -> None:
    ctx = Context(role="node", role_reason="", node=NODE, keys_dir="", config_file=None,
                  config_path="", slurm_conf_file=None, environ={})
    now = time.time()
    ctx.collector_reply = CollectorReply(ts=now - skew, received_at=now, waited_s=0.1)
    (finding,) = check_clock(ctx)
    assert finding.level is level
    if level is not Level.OK:
        side = "ahead of" if skew > 0 else "behind"
        assert f"{abs(skew):.1f} s {side} the collector's" in finding.message and "ntp" in finding.fix


# --------------------------------------------------------------------------- keys


def test_loose_key_mode_fails_with_the_chmod_fix(install: Install) -> None:
    install.agent_node = True
    secret = install.bundle / "node.key_secret"
    secret.chmod(0o644)
    code, rows = install.findings()
    assert code == 2
    assert rows["keys"]["severity"] == "FAIL"
    assert f"{secret} is readable by group/others (mode 0644)" in rows["keys"]["message"]
    assert rows["keys"]["fix"] == f"run: chmod 600 {secret}"
    assert rows["collector"]["severity"] == "SKIP"  # one cause, one FAIL line


def test_allow_list_dir_writable_by_others_fails_with_chmod_700(install: Install) -> None:
    (install.keys_root / "nodes").chmod(0o777)
    install.agent_node = True
    install.bundle = install.keys_root
    _, rows = install.findings("--role", "head")
    assert rows["keys"]["severity"] == "FAIL"
    assert rows["keys"]["fix"] == f"run: chmod 700 {install.keys_root / 'nodes'}"


def test_missing_bundle_names_the_add_node_command(install: Install) -> None:
    install.agent_node = True
    (install.bundle / "node.key_secret").unlink()
    _, rows = install.findings()  # [collector] address is set: this node should have an agent
    assert rows["keys"]["severity"] == "FAIL"
    assert f"slurmgpu keys add-node {NODE}" in rows["keys"]["fix"]


# --------------------------------------------------------------------------- slurm.conf


def test_missing_prolog_flags_alloc_names_the_line(install: Install) -> None:
    install.slurm_lines["PrologFlags"] = ""
    _, rows = install.findings()
    row = rows["slurm.prolog_flags"]
    assert row["severity"] == "FAIL" and f"{install.slurm_conf} sets no PrologFlags" in row["message"]
    assert row["fix"] == f"add `PrologFlags=Alloc` to {install.slurm_conf}"


def test_prolog_flags_without_alloc(install: Install) -> None:
    install.slurm_lines["PrologFlags"] = "X11"
    _, rows = install.findings()
    assert rows["slurm.prolog_flags"]["severity"] == "FAIL"
    assert rows["slurm.prolog_flags"]["fix"] == f"change it to `PrologFlags=X11,Alloc` at {install.slurm_conf}:5"


def test_keys_are_case_insensitive_and_includes_are_followed(install: Install) -> None:
    flags = install.slurm_lines.pop("PrologFlags")
    install.write()
    (install.root / "gpu.conf").write_text(f"prologflags={flags}  # from an included file\n")
    with install.slurm_conf.open("a") as fh:
        fh.write("Include gpu.conf\n")
    _, rows = install.findings(write=False)
    assert rows["slurm.conf"]["message"] == f"{install.slurm_conf} (+1 included file)"
    assert rows["slurm.prolog_flags"]["message"] == f"PrologFlags={flags} ({install.root / 'gpu.conf'}:1)"


def test_missing_task_prolog_program(install: Install) -> None:
    missing = install.root / "libexec" / "slurmgpu-taskprolog"
    install.slurm_lines["TaskProlog"] = str(missing)
    _, rows = install.findings()
    row = rows["slurm.task_prolog"]
    assert row["severity"] == "FAIL" and f"TaskProlog={missing}" in row["message"] and "no such file" in row["message"]


def test_task_prolog_not_executable_and_failing(install: Install) -> None:
    script = install.root / "taskprolog"
    script.write_text("#!/bin/sh\necho 'no job dir' >&2\nexit 3\n")
    script.chmod(0o644)
    install.slurm_lines["TaskProlog"] = str(script)
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "FAIL" and row["fix"] == f"run: chmod 755 {script}"
    script.chmod(0o755)
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "FAIL"
    who, as_user = (" as nobody", "runuser -u nobody -- ") if os.geteuid() == 0 else ("", "")
    assert row["message"] == f"{script} exited 3{who} given only SLURM_JOB_ID: no job dir"
    assert row["fix"] == f"run `{as_user}env -i SLURM_JOB_ID=1 {script}` to see why"


def test_task_prolog_runs_with_only_a_job_id(install: Install) -> None:
    script = install.root / "taskprolog"
    script.write_text('#!/bin/sh\necho "export SLURMGPU_CHECKPOINT_FILE=/x/$SLURM_JOB_ID/checkpoint"\n'
                      'env | grep -v "^SLURM_JOB_ID=" | grep -v "^PWD=" | grep -v "^SHLVL=" | grep -v "^_=" >&2\n'
                      'exit 0\n')
    script.chmod(0o755)
    install.slurm_lines["TaskProlog"] = str(script)
    assert install.findings()[1]["slurm.task_prolog"]["severity"] == "OK"
    script.write_text("#!/bin/sh\nexit 0\n")  # runs, but jobs never learn their file
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "WARN" and "exports no SLURMGPU_CHECKPOINT_FILE" in row["message"]


@pytest.mark.skipif(os.geteuid() != 0, reason="doctor drops to a job's user only as root")
def test_task_prolog_runs_as_a_job_user_not_root(install: Install) -> None:
    """Issue 28 item 10: doctor ran the TaskProlog as root, so it could not see that a
    job's user cannot run the interpreter it names (here: a program only root may run)."""
    private = install.root / "root-only"
    private.mkdir(mode=0o700)
    (private / "python").write_text("#!/bin/sh\necho 'export SLURMGPU_CHECKPOINT_FILE=/x'\n")
    (private / "python").chmod(0o755)
    script = install.root / "taskprolog"
    script.write_text(f"#!/bin/sh\nid -un >&2\nexec {private / 'python'}\n")
    script.chmod(0o755)
    install.slurm_lines["TaskProlog"] = str(script)
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "FAIL" and "as nobody" in row["message"], row
    assert "runuser -u nobody" in row["fix"]


def test_a_hanging_task_prolog_leaves_no_process_behind(install: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28 item 10: on a timeout only the TaskProlog itself was killed; what it had
    started ran on, orphaned."""
    monkeypatch.setattr("slurmgpu.doctor.slurmconf.STEP_TIMEOUT_S", 0.5)
    pidfile = install.root / "child.pid"
    pidfile.touch(mode=0o666)
    pidfile.chmod(0o666)
    script = install.root / "taskprolog"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    script.chmod(0o755)
    install.slurm_lines["TaskProlog"] = str(script)
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "FAIL" and "did not finish" in row["message"]
    child = int(pidfile.read_text())
    try:
        os.kill(child, 0)
        alive = not Path(f"/proc/{child}/stat").read_text().split(") ")[1].startswith("Z")
    except ProcessLookupError:
        alive = False
    assert not alive, f"the TaskProlog's child {child} still runs"


def test_task_prolog_unset_warns(install: Install) -> None:
    install.slurm_lines["TaskProlog"] = ""
    row = install.findings()[1]["slurm.task_prolog"]
    assert row["severity"] == "WARN" and "TaskProlog=/usr/libexec/slurmgpu/slurmgpu-taskprolog" in row["fix"]


@pytest.mark.parametrize(("first_line", "why"), [
    ("#!/no/such/sh\n", "its interpreter /no/such/sh does not exist"),
    ("#!/usr/bin/env -S no-such-python3 -I\n", "no-such-python3 is not in /bin:/usr/bin"),
    ("echo no shebang\n", "starts with no #! line"),
])
def test_prolog_interpreter_must_exist(install: Install, first_line: str, why: str) -> None:
    prolog = install.root / "prolog"
    prolog.write_text(first_line + "exit 0\n")
    prolog.chmod(0o755)
    install.slurm_lines["Prolog"] = str(prolog)
    row = install.findings()[1]["slurm.prolog"]
    assert row["severity"] == "FAIL" and why in row["message"], row


def test_hook_writable_by_others_fails(install: Install) -> None:
    epilog = install.root / "epilog"
    epilog.write_text("#!/bin/sh\nexit 0\n")
    epilog.chmod(0o777)
    install.slurm_lines["Epilog"] = f"{REPO / 'epilog' / 'slurmgpu-epilog'},{epilog}"  # a comma list
    row = install.findings()[1]["slurm.epilog"]
    assert row["severity"] == "FAIL" and row["fix"] == f"run: chmod go-w {epilog}"


def test_job_requeue_0_and_missing_prolog(install: Install) -> None:
    install.slurm_lines["JobRequeue"] = "0"
    install.slurm_lines["Prolog"] = ""
    _, rows = install.findings()
    assert rows["slurm.job_requeue"]["severity"] == "WARN"
    assert rows["slurm.prolog"]["severity"] == "FAIL"
    assert rows["slurm.prolog"]["fix"] == f"add `Prolog=/usr/libexec/slurmgpu/slurmgpu-prolog` to {install.slurm_conf}"


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol")
def test_slurmctld_unreachable_names_slurm_conf(install: Install) -> None:
    install.config_extra = ""
    install.bin_dir = Path(os.path.dirname(shutil.which("scontrol") or ""))  # the real one
    install.slurm_lines["SlurmctldPort"] = str(free_port())  # nobody listens there
    started = time.monotonic()
    _, rows = install.findings()
    assert time.monotonic() - started < 20
    row = rows["slurmctld"]
    assert row["severity"] == "FAIL" and row["message"].startswith("slurmctld does not answer: ")
    assert f"SLURM_CONF={install.slurm_conf}" in row["fix"] and "SLURM_CONF" in row["fix"]


def test_slurmgpu_drains_point_at_the_whole_reasons(install: Install) -> None:
    """Issue 29 item 6: `sinfo -R` shows 20 characters of a reason, 10 after the prefix."""
    (install.bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$1" = ping ] && echo "Slurmctld(primary) at head is UP" && exit 0\n'
        '[ "$1 $2 $3" = "-o show node" ] || exit 1\n'
        'echo "NodeName=gpu-n3 State=IDLE+DRAIN Reason=slurmgpu: pin.driver driver 550.54 off-pin [root@2026-11-27T10:00:00]"\n'
        'echo "NodeName=gpu-n4 State=IDLE+DRAIN Reason=fan [root@2026-11-27T10:00:00]"\n'
        'echo "NodeName=gpu-n1 State=IDLE"\n')
    _, rows = install.findings()
    row = rows["slurm.drains"]
    assert row["severity"] == "OK" and row["message"].startswith("1 node(s) drained by slurmgpu (gpu-n3): ")
    assert '`slurmgpu nodes` or `sinfo -R -o "%60E %19H %N"`' in row["message"]


def test_no_slurm_conf_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("slurmgpu.slurm.conf.DEFAULT_PATHS", (str(tmp_path / "a.conf"),))
    assert find_slurm_conf(None, {}) == (None, [str(tmp_path / "a.conf")])
    assert find_slurm_conf(None, {"SLURM_CONF": "/x/slurm.conf"}) == ("/x/slurm.conf", ["$SLURM_CONF=/x/slurm.conf"])
    assert find_slurm_conf("/y.conf", {"SLURM_CONF": "/x"})[0] == "/y.conf"


def test_slurm_conf_parser(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gpu.conf").write_text("TaskProlog=/opt/tp\n")
    (tmp_path / "doctor.conf").write_text("JobRequeue=0\n")  # %c: ClusterName in lower case
    (tmp_path / "slurm.conf").write_text(
        "# comment Prolog=/not/this\n"
        "ClusterName=Doctor\n"
        "NodeName=gpu-[1-4] Prolog=/node/level CPUs=8\n"
        "PROLOG=/first  # a comment\n"
        "prolog=/usr/libexec/p1,/usr/libexec/p2\n"
        'SchedulerParameters="bf_continue,\\\n'
        '  nohold_on_prolog_fail" Epilog=/e\n'
        "Include conf.d/gpu.conf\n"
        "include %c.conf\n")
    conf = parse_slurm_conf(str(tmp_path / "slurm.conf"))
    prolog = conf.get("Prolog")
    assert prolog is not None and prolog.items() == ["/usr/libexec/p1", "/usr/libexec/p2"]
    assert prolog.line == 5 and prolog.key == "prolog"
    sched = conf.get("schedulerparameters")
    assert sched is not None and "nohold_on_prolog_fail" in sched.items() and sched.line == 6
    assert conf.get("Epilog") is not None and conf.get("CPUs") is None
    task = conf.get("TaskProlog")
    assert task is not None and task.file == str(tmp_path / "conf.d" / "gpu.conf")
    assert conf.get("JobRequeue") is not None and conf.files[-1] == str(tmp_path / "doctor.conf")
    (tmp_path / "bad.conf").write_text("Include missing.conf\n")
    with pytest.raises(SlurmConfError, match=r"bad.conf:1: Include .*missing.conf: no such file"):
        parse_slurm_conf(str(tmp_path / "bad.conf"))
    (tmp_path / "loop.conf").write_text("Include loop.conf\n")
    with pytest.raises(SlurmConfError, match="nested"):
        parse_slurm_conf(str(tmp_path / "loop.conf"))


def test_env_command() -> None:
    assert env_command(["-S", "python3", "-I", "-S"]) == "python3"
    assert env_command(["-u", "PATH", "FOO=1", "bash"]) == "bash"
    assert env_command(["-i"]) is None


# --------------------------------------------------------------------------- NVML


def run_doctor(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    """In a child process: pynvml binds the library it loads for the life of the process."""
    env = {k: v for k, v in env.items() if k not in LEAKY_ENV}
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "doctor", "--json", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    return proc.returncode, {row["check"]: row for row in json.loads(proc.stdout)}


@pytest.mark.parametrize(("count", "level"), [(8, "OK"), (4, "FAIL")])
def test_gpu_count_against_the_fake_nvml(fake_nvml_lib: Path, scenario_file: ScenarioFactory,
                                         tmp_path: Path, count: int, level: str) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[gpu]\ncount = {count}\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    env = sim_env(fake_nvml_lib, scenario_file("h100-sxm-8"))
    _, rows = run_doctor(["--config", str(config), "--node", "gpu-h100-001", "--keys-dir", str(tmp_path)], env)
    row = rows["nvml"]
    assert row["severity"] == level, row
    if level == "OK":
        assert row["message"] == "NVML loaded, driver 550.90.07: 8 GPUs"
    else:
        assert row["message"] == "8 GPUs present, 4 expected"
        assert f"set [gpu] count = 8 in {config}" in row["fix"]


def test_no_nvml_library_fails_when_gpus_are_expected(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text('[gpu]\ncount = 8\n')
    env = dict(os.environ, SLURMGPU_NVML_LIBRARY=str(tmp_path / "libnvidia-ml.so.1"))
    code, rows = run_doctor(["--config", str(config), "--node", NODE, "--keys-dir", str(tmp_path)], env)
    row = rows["nvml"]
    assert row["severity"] == "FAIL" and "libnvidia-ml.so.1 not found" in row["message"]
    assert "expected 8 GPUs" in row["message"] and "nvidia-smi" in row["fix"]
    assert code == 2


# --------------------------------------------------------------------------- agent, dirs


def test_agent_down_fails_with_the_restart_fix(install: Install) -> None:
    install.agent_node = True
    _, rows = install.findings()  # a node bundle and a collector: the agent belongs here
    row = rows["agent"]
    assert row["severity"] == "FAIL" and f"no answer on {install.root / 'agent.sock'}" in row["message"]
    assert row["fix"].startswith("systemctl restart slurmgpu-agent")


def test_unwritable_state_dir_fails(install: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = install.root / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("SLURMGPU_STATE_DIR", str(blocker / "state"))  # even root cannot mkdir there
    code, rows = install.findings()
    row = rows["dir.state"]
    assert row["severity"] == "FAIL"
    assert row["message"] == f"{blocker / 'state'} ([paths] state_dir) cannot be created: {blocker} is not a directory"
    monkeypatch.setenv("SLURMGPU_STATE_DIR", str(blocker))
    row = install.findings()[1]["dir.state"]
    assert row["severity"] == "FAIL" and row["message"] == f"{blocker} ([paths] state_dir) is not a directory"
    assert code == 2


def test_writable_dirs_are_ok_and_left_clean(install: Install) -> None:
    for name in ("state", "spool"):
        (install.root / name).mkdir()
    with running(collector_settings(install)):  # an agent node: its spool is checked too
        _, rows = install.findings()
    assert rows["dir.state"] == {"check": "dir.state", "severity": "OK", "fix": None,
                                 "message": f"{install.root / 'state'} is writable"}
    assert rows["dir.spool"]["severity"] == "OK"
    assert list((install.root / "state").iterdir()) == []


# --------------------------------------------------------------------------- the runner


def test_a_crashing_check_is_one_fail_line_and_the_rest_still_run(install: Install,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(ctx: Context) -> list[Any]:
        raise RuntimeError("boom")

    checks = tuple(Check(c.id, boom) if c.id == "slurm.hooks" else c for c in CHECKS)
    monkeypatch.setattr("slurmgpu.doctor.CHECKS", checks)
    result = install.doctor()
    assert "Traceback" not in result.output
    line = next(line for line in result.output.splitlines() if "slurm.hooks" in line)
    assert line.startswith("FAIL") and "check crashed: RuntimeError: boom" in line
    assert "slurm.task_prolog" in result.output and result.exit_code == 2


def test_a_hanging_check_is_cut_off() -> None:
    release = threading.Event()

    def hang(ctx: Context) -> list[Any]:
        release.wait(10)
        return []

    ctx = Context(role="node", role_reason="", node=NODE, keys_dir="", config_file=None,
                  config_path="", slurm_conf_file=None, environ={})
    started = time.monotonic()
    (finding,) = run_check(Check("slow", hang, budget_s=0.2), ctx)
    release.set()
    assert time.monotonic() - started < 2
    assert finding.level is Level.FAIL and finding.message == "did not finish within 0.2 s (hung?)"


@pytest.mark.parametrize(("answer", "level", "message"), [
    ("SLURM_VERSION           = 25.11.7\n", "OK", "slurmctld runs Slurm 25.11 (tested in CI)"),
    ("SLURM_VERSION = 22.05.8\n", "OK", "slurmctld runs Slurm 22.05 (tested in CI)"),
    ("SLURM_VERSION = 23.11.4\n", "OK",
     "slurmctld runs Slurm 23.11 (CI tests 22.05, 25.11 only)"),
    ("ClusterName = x\n", "WARN", "`scontrol show config` printed no SLURM_VERSION"),
])
def test_doctor_reports_the_slurm_version_slurmctld_runs(answer: str, level: str, message: str) -> None:
    from slurmgpu.doctor.slurmconf import slurm_version_report
    from slurmgpu.slurm.cli import CliSlurmClient

    def runner(argv: Any, env: Any, timeout: float) -> subprocess.CompletedProcess[str]:
        assert list(argv[1:]) == ["show", "config"]
        return subprocess.CompletedProcess(list(argv), 0, f"Configuration data as of x\n{answer}", "")

    finding = slurm_version_report(CliSlurmClient(runner=runner, retries=1))
    assert (finding.level.name, finding.message) == (level, message)
