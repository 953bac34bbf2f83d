"""Slurm clients: parsers on captured 22.05 / hand-written 24.11 output, retry and
rejection handling with a fake runner, and the ``SlurmClient`` contract against the
real mini-cluster (``-m slurm``, fixture ``cluster`` from tests/slurmfixtures.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.config.schema import SlurmSettings
from slurmgpu.slurm import REASON_PREFIX, JobInfo, NodeState, SlurmError, SlurmUnreachable
from slurmgpu.slurm.cli import (
    CliSlurmClient,
    parse_gres_gpu_indices,
    parse_job_json,
    parse_job_state,
    parse_job_text,
    parse_jobs_text,
    parse_node_state,
    parse_node_text,
    parse_nodes_json,
    parse_nodes_text,
    parse_version,
    sanitize_reason,
    text_pairs,
)
from slurmgpu.slurm.factory import make_client
from slurmgpu.slurm.pyslurm_client import PyslurmClient
from slurmgpu.slurm.pyslurm_client import available as pyslurm_available
from tests.agenthelpers import wait_until

DATA = Path(__file__).parent / "data" / "slurm"
D22 = DATA / "22.05"
D24 = DATA / "24.11"

HOSTILE_REASON = 'slurmgpu: xid 79 on GPU 2; "quoted" $(reboot) it'
HOSTILE_COMMENT = 'slurmgpu: gpu 2 bad; "x" $(reboot) a=b'

# The contract tests need the ``cluster`` fixture of tests/slurmfixtures.py (loaded by
# conftest or ``-p tests.slurmfixtures``, which also registers the ``slurm`` marker).
# Without it they skip, except under CI, where a missing fixture must fail loudly.
_NOT_LOADED = pytest.mark.skip(reason="tests.slurmfixtures not loaded "
                                      "(run with -p tests.slurmfixtures)")
if "tests.slurmfixtures" in sys.modules or os.environ.get("CI"):
    try:
        slurm_mark = pytest.mark.slurm
    except pytest.fail.Exception:  # --strict-markers and the marker is not registered
        slurm_mark = _NOT_LOADED
else:
    slurm_mark = _NOT_LOADED


def load_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def by_name(nodes: list[NodeState]) -> dict[str, NodeState]:
    return {n.name: n for n in nodes}


def by_id(jobs: list[JobInfo]) -> dict[str, JobInfo]:
    return {j.job_id: j for j in jobs}


# =========================================================================== parsers


def test_parse_version() -> None:
    assert parse_version((D22 / "scontrol_version.txt").read_text()) == (22, 5)
    assert parse_version("slurm 24.11.5") == (24, 11)
    assert parse_version("garbage") is None


@pytest.mark.parametrize(("state", "flags", "want_state", "want_flags"), [
    ("IDLE", (), "idle", set()),
    ("IDLE+DRAIN", (), "idle", {"DRAIN"}),
    ("MIXED+DRAIN", (), "mixed", {"DRAIN"}),
    ("ALLOCATED+DRAIN", (), "allocated", {"DRAIN"}),
    ("DOWN*", (), "down", {"NOT_RESPONDING"}),
    ("DOWN*+DRAIN", (), "down", {"NOT_RESPONDING", "DRAIN"}),
    ("DOWN+NOT_RESPONDING", (), "down", {"NOT_RESPONDING"}),
    ("IDLE+DRAIN+REBOOT_REQUESTED", (), "idle", {"DRAIN", "REBOOT_REQUESTED"}),
    ("idle~", (), "idle", {"POWERED_DOWN"}),
    ("drained", (), "idle", {"DRAIN"}),
    ("alloc", (), "allocated", set()),
    ("idle", ["DRAIN"], "idle", {"DRAIN"}),  # 22.05 JSON
    (["IDLE", "DRAIN"], (), "idle", {"DRAIN"}),  # >= 23.02 JSON
    (["NOT_RESPONDING", "DOWN"], (), "down", {"NOT_RESPONDING"}),  # flag first: still found
    ("", (), "unknown", set()),
])
def test_parse_node_state(state: Any, flags: Any, want_state: str, want_flags: set[str]) -> None:
    assert parse_node_state(state, flags) == (want_state, frozenset(want_flags))


def test_node_json_22_05_busy() -> None:
    nodes = by_name(parse_nodes_json(load_json(D22 / "sinfo_busy.json")))
    n1, n2 = nodes["gpu-n1"], nodes["gpu-n2"]
    assert (n1.state, n1.flags) == ("mixed", frozenset({"DRAIN"}))
    assert n1.drained and n1.owned_by_slurmgpu
    assert n1.reason == HOSTILE_REASON
    assert n1.reason_user == "root"
    assert n1.reason_time == 1795659836
    assert (n2.state, n2.flags, n2.reason, n2.reason_time) == ("allocated", frozenset(), None, None)


def test_node_json_22_05_not_responding_and_down() -> None:
    nr = by_name(parse_nodes_json(load_json(D22 / "sinfo_notresponding.json")))["gpu-n2"]
    assert (nr.state, nr.flags, nr.reason) == ("allocated", frozenset({"NOT_RESPONDING"}), None)
    down = by_name(parse_nodes_json(load_json(D22 / "sinfo_down.json")))
    assert (down["gpu-n2"].state, down["gpu-n2"].flags) == ("down", frozenset({"NOT_RESPONDING"}))
    assert down["gpu-n2"].reason == "Not responding"
    assert (down["gpu-n1"].state, down["gpu-n1"].flags) == ("idle", frozenset({"DRAIN"}))
    assert not down["gpu-n2"].drained


@pytest.mark.parametrize(("json_file", "text_file"), [
    ("sinfo_idle.json", "scontrol_node_idle.txt"),
    ("sinfo_busy.json", "scontrol_nodes_busy.txt"),
    ("sinfo_notresponding.json", "scontrol_nodes_notresponding.txt"),
    ("sinfo_down.json", "scontrol_nodes_down.txt"),
])
def test_node_text_matches_json_22_05(json_file: str, text_file: str) -> None:
    """Text parsing (the fallback) gives the same NodeState as JSON, reason time included
    (the text shows local time; both were captured on this machine's time zone)."""
    from_json = by_name(parse_nodes_json(load_json(D22 / json_file)))
    from_text = by_name(parse_nodes_text((D22 / text_file).read_text()))
    assert from_text
    for name, node in from_text.items():
        assert node == from_json[name]


def test_node_text_reason_with_spaces_and_following_keys() -> None:
    line = ("NodeName=gpu-n3 Arch=x86_64 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC State=IDLE+DRAIN "
            "ThreadsPerCore=1 Reason=slurmgpu: a=b Foo=bar; \"q\" [root@2026-11-26T02:20:07] "
            "Comment=c1 x=y")
    n = parse_node_text(line)
    assert (n.name, n.state, n.flags) == ("gpu-n3", "idle", frozenset({"DRAIN"}))
    assert n.reason == 'slurmgpu: a=b Foo=bar; "q"'
    assert n.reason_user == "root"
    assert n.reason_time == time.mktime(time.strptime("2026-11-26T02:20:07", "%Y-%m-%dT%H:%M:%S"))
    bare = parse_node_text("NodeName=x State=DOWN Reason=no stamp here Comment=c")
    assert (bare.reason, bare.reason_user, bare.reason_time) == ("no stamp here", None, None)


def test_text_pairs_values_with_spaces() -> None:
    pairs = dict(text_pairs("A=1 OS=Linux 6.1 #1 SMP B= C=x=y,z=1 AllocNode:Sid=h:1"))
    assert pairs == {"A": "1", "OS": "Linux 6.1 #1 SMP", "B": "", "C": "x=y,z=1",
                     "AllocNode:Sid": "h:1"}


@pytest.mark.parametrize(("gres", "want"), [
    ("gpu:3(IDX:0-2)", (0, 1, 2)),
    ("gpu(IDX:0,2,5-7)", (0, 2, 5, 6, 7)),
    ("gpu:1(IDX:3)", (3,)),
    ("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3)", (0, 1, 3)),
    ("gpu:nvidia_h100:2(IDX:4,6)", (4, 6)),
    ("mps:100(IDX:0),gpu:1(IDX:2)", (2,)),
    ("gres:gpu:1(IDX:5)", (5,)),
    ("gpu:0(IDX:N/A)", ()),
    ("gpu:4", ()),
    ("", ()),
    (None, ()),
])
def test_parse_gres_gpu_indices(gres: str | None, want: tuple[int, ...]) -> None:
    assert parse_gres_gpu_indices(gres) == want


def test_jobs_json_22_05() -> None:
    jobs = by_id([parse_job_json(j) for j in load_json(D22 / "squeue_busy.json")["jobs"]])
    j5 = jobs["5"]
    assert (j5.state, j5.nodes, j5.gpus) == ("RUNNING", ("gpu-n2",), {"gpu-n2": (0, 1, 2)})
    assert (j5.user, j5.batch_host, j5.restart_count) == ("root", "gpu-n2", 0)
    assert j5.admin_comment == HOSTILE_COMMENT
    j6 = jobs["6"]
    assert j6.nodes == ("gpu-n1", "gpu-n2")
    assert j6.gpus == {"gpu-n1": (0,), "gpu-n2": (3,)}  # gres_detail: one entry per node
    assert j6.batch_host == "gpu-n1"
    assert jobs["7"].gpus == {"gpu-n1": (1, 2)}
    assert (jobs["8"].state, jobs["8"].gpus) == ("RUNNING", {})
    assert (jobs["10"].state, jobs["10"].nodes, jobs["10"].batch_host) == ("PENDING", (), None)
    assert jobs["3"].state == "CANCELLED"
    requeued = by_id([parse_job_json(j) for j in load_json(D22 / "squeue_requeued.json")["jobs"]])
    assert (requeued["7"].state, requeued["7"].restart_count) == ("PENDING", 1)
    assert requeued["7"].state_reason == "BeginTime"


def test_jobs_text_matches_json_22_05() -> None:
    from_json = by_id([parse_job_json(j) for j in load_json(D22 / "squeue_busy.json")["jobs"]])
    from_text = by_id(parse_jobs_text((D22 / "scontrol_jobs_busy.txt").read_text()))
    assert set(from_text) == set(from_json)
    for jid, job in from_text.items():
        want = from_json[jid]
        # The pending reason text differs between squeue (Resources) and scontrol.
        assert job == JobInfo(**{**want.__dict__, "state_reason": job.state_reason}), jid


def test_job_text_detail_groups() -> None:
    multi = parse_job_text((D22 / "scontrol_job_multinode.txt").read_text())
    assert multi.gpus == {"gpu-n1": (0,), "gpu-n2": (3,)}
    line = ("JobId=42 JobName=x y UserId=alice(1000) JobState=RUNNING Reason=None Restarts=2 "
            "NodeList=gpu-n[1-3] BatchHost=gpu-n1 NumNodes=3 "
            "Nodes=gpu-n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) "
            "Nodes=gpu-n3 CPU_IDs=0-1 Mem=0 GRES=gpu(IDX:0,2,5-7) MinCPUsNode=1 "
            "AdminComment=slurmgpu: a b")
    j = parse_job_text(line)
    assert (j.job_id, j.user, j.state, j.restart_count) == ("42", "alice", "RUNNING", 2)
    assert j.nodes == ("gpu-n1", "gpu-n2", "gpu-n3")
    assert j.gpus == {"gpu-n1": (0, 1), "gpu-n2": (0, 1), "gpu-n3": (0, 2, 5, 6, 7)}
    assert (j.state_reason, j.admin_comment) == (None, "slurmgpu: a b")


def test_nodes_json_24_11() -> None:
    nodes = by_name(parse_nodes_json(load_json(D24 / "scontrol_show_node_all.json")))
    assert (nodes["gpu-n1"].state, nodes["gpu-n1"].flags, nodes["gpu-n1"].reason) == (
        "idle", frozenset(), None)
    n2 = nodes["gpu-n2"]
    assert (n2.state, n2.flags, n2.reason) == ("mixed", frozenset({"DRAIN"}), HOSTILE_REASON)
    assert (n2.reason_user, n2.reason_time) == ("root", 1795659836)
    n3 = nodes["gpu-n3"]
    assert (n3.state, n3.flags, n3.reason_user) == ("down", frozenset({"NOT_RESPONDING"}), "slurm")
    n4 = nodes["gpu-n4"]
    assert n4.drained and n4.rebooting and n4.state == "idle"


def test_jobs_json_24_11() -> None:
    jobs = by_id([parse_job_json(j) for j in load_json(D24 / "squeue.json")["jobs"]])
    assert jobs["5"].gpus == {"gpu-n2": (0, 1, 2)}
    assert jobs["5"].admin_comment == HOSTILE_COMMENT
    assert jobs["6"].nodes == ("gpu-n1", "gpu-n2")
    assert jobs["6"].gpus == {"gpu-n1": (0,), "gpu-n2": (3,)}
    assert (jobs["7"].state, jobs["7"].restart_count, jobs["7"].state_reason) == (
        "PENDING", 1, "BeginTime")
    assert jobs["8"].state == "COMPLETING"  # ["COMPLETED", "COMPLETING"]
    assert (jobs["9"].state, jobs["9"].gpus) == ("SUSPENDED", {"gpu-n1": (4, 6)})
    assert jobs["10"].state == "COMPLETED"
    one = load_json(D24 / "scontrol_show_job_multinode.json")["jobs"][0]
    assert parse_job_json(one) == jobs["6"]


def test_parse_job_state_shapes() -> None:
    assert parse_job_state("RUNNING") == "RUNNING"
    assert parse_job_state(["RUNNING"]) == "RUNNING"
    assert parse_job_state(["REQUEUED", "PENDING"]) == "PENDING"
    assert parse_job_state(["CANCELLED", "COMPLETING"]) == "COMPLETING"
    assert parse_job_state(None) == "UNKNOWN"


# =========================================================================== sanitising


def test_sanitize_reason_keeps_quotes_and_semicolons() -> None:
    text = "slurmgpu: a \"b\" 'c' ; $(reboot) `id` & | > x"
    assert sanitize_reason(text) == text


def test_sanitize_reason_one_line() -> None:
    assert sanitize_reason("a\nb\r\n\tc\x00d\x1b[31m e\u2028f  \x7f g") == "a b c d [31m e f g"
    assert sanitize_reason("  \n\t ") == "no reason given"
    assert sanitize_reason("") == "no reason given"


def test_sanitize_reason_caps_length() -> None:
    out = sanitize_reason("slurmgpu: " + "x" * 1000)
    assert len(out) == 256 and out.endswith("…") and out.startswith("slurmgpu: xxx")
    assert sanitize_reason("y" * 256) == "y" * 256
    short = sanitize_reason("word " * 100, max_len=20)
    assert len(short) <= 20 and short.endswith("…") and "\n" not in short


# =========================================================================== fake runner


Response = subprocess.CompletedProcess[str] | BaseException


def cp(rc: int = 0, stdout: str = "", stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["x"], rc, stdout, stderr)


class FakeRunner:
    """Answers by the argv after the binary; a list value is consumed one per call."""

    def __init__(self, table: Mapping[tuple[str, ...], Response | list[Response]],
                 default: Response | None = None) -> None:
        self.table = {k: (list(v) if isinstance(v, list) else v) for k, v in table.items()}
        self.default = default
        self.calls: list[list[str]] = []
        self.envs: list[Mapping[str, str]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str],
                 timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        self.envs.append(env)
        key = (argv[0].rsplit("/", 1)[-1], *argv[1:])
        answer: Any = self.table.get(key, self.default)
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if answer is None:
            raise AssertionError(f"unexpected command {list(argv)}")
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(list(argv), answer.returncode, answer.stdout,
                                           answer.stderr)

    def commands(self) -> list[tuple[str, ...]]:
        return [(c[0].rsplit("/", 1)[-1], *c[1:]) for c in self.calls]


V22 = cp(stdout="slurm-wlm 22.05.8\n")
V24 = cp(stdout="slurm 24.11.5\n")
ERRORS = load_json(D22 / "errors.json")


def recorded(name: str) -> subprocess.CompletedProcess[str]:
    e = ERRORS[name]
    return cp(e["returncode"], e["stdout"], e["stderr"])


def client(runner: FakeRunner, **kw: Any) -> tuple[CliSlurmClient, list[float]]:
    sleeps: list[float] = []
    kw.setdefault("retries", 3)
    kw.setdefault("retry_delay_s", 0.5)
    c = CliSlurmClient(bin_dir="/opt/slurm/bin", env={"SLURM_CONF": "/etc/x/slurm.conf"},
                       sleep=sleeps.append, runner=runner, **kw)
    c._bins = {t: f"/opt/slurm/bin/{t}" for t in ("scontrol", "sinfo", "squeue", "scancel")}
    return c, sleeps


def test_unreachable_retries_then_raises() -> None:
    runner = FakeRunner({("scontrol", "--version"): V22, ("sinfo", "--all", "--json"): V22},
                        default=recorded("unreachable_show_node"))
    runner.table[("sinfo", "--all", "--json")] = recorded("unreachable_sinfo_json")
    c, sleeps = client(runner, retries=4, retry_delay_s=0.25)
    with pytest.raises(SlurmUnreachable) as exc:
        c.node("gpu-n1")
    msg = str(exc.value)
    assert msg == ("slurmctld unreachable after 4 tries: slurm_load_node error: "
                   "Unable to contact slurm controller (connect failure)")
    # 22.05: sinfo --json exits 0 with {"errors": [...]}: one JSON try, then text x4.
    assert runner.commands().count(("scontrol", "-o", "show", "node", "gpu-n1")) == 4
    assert sleeps == [0.25, 0.25, 0.25]


@pytest.mark.parametrize("name", ["unreachable_update", "unreachable_requeue",
                                  "unreachable_scancel"])
def test_recorded_unreachable_outputs_are_retried(name: str) -> None:
    runner = FakeRunner({}, default=recorded(name))
    c, sleeps = client(runner, retries=2)
    with pytest.raises(SlurmUnreachable, match="after 2 tries"):
        c.run("scontrol", "requeue", "1")
    assert len(runner.calls) == 2 and sleeps == [0.5]


def test_timeout_counts_as_unreachable() -> None:
    runner = FakeRunner({}, default=subprocess.TimeoutExpired(["scontrol"], 10))
    c, sleeps = client(runner, retries=3)
    with pytest.raises(SlurmUnreachable, match=r"after 3 tries: scontrol requeue timed out after 10s"):
        c.requeue("7")
    assert len(runner.calls) == 3 and len(sleeps) == 2


def test_recovers_when_slurmctld_comes_back() -> None:
    runner = FakeRunner({("scontrol", "requeue", "7"): [recorded("unreachable_requeue"),
                                            recorded("unreachable_requeue"), cp()]})
    c, sleeps = client(runner, retries=3)
    c.requeue("7")
    assert len(runner.calls) == 3 and sleeps == [0.5, 0.5]


@pytest.mark.parametrize(("name", "call"), [
    ("invalid_node_update", lambda c: c.drain("gpu-nX", "x")),
    ("requeue_unknown_job", lambda c: c.requeue("999999")),
    ("signal_unknown_job", lambda c: c.signal_job("999999")),
    ("admin_comment_unknown_job", lambda c: c.set_admin_comment("999999", "x")),
    ("drain_no_reason", lambda c: c.drain("gpu-n1", "x")),
])
def test_rejections_are_not_retried(name: str, call: Callable[[CliSlurmClient], None]) -> None:
    runner = FakeRunner({}, default=recorded(name))
    c, sleeps = client(runner)
    with pytest.raises(SlurmError) as exc:
        call(c)
    assert not isinstance(exc.value, SlurmUnreachable)
    first = _first(ERRORS[name]["stderr"])
    assert str(exc.value).endswith(first)
    assert str(exc.value).split(":")[0] in ("scontrol update", "scontrol requeue", "scancel")
    assert len(runner.calls) == 1 and sleeps == []


def _first(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip())


def test_unknown_node_text_is_no_such_node() -> None:
    runner = FakeRunner({("scontrol", "--version"): V22,
                         ("sinfo", "--all", "--json"): cp(stdout=(D22 / "sinfo_idle.json").read_text()),
                         ("scontrol", "-o", "show", "node", "gpu-nX"): recorded("show_unknown_node")})
    c, _ = client(runner)
    with pytest.raises(SlurmError, match=r"^no such node: gpu-nX$"):
        c.node("gpu-nX")


def test_unknown_job_is_no_such_job() -> None:
    runner = FakeRunner({("scontrol", "--version"): V22,
                         ("squeue", "--all", "--json"): cp(stdout=(D22 / "squeue_busy.json").read_text()),
                         ("scontrol", "-o", "show", "job", "-d", "999999"): recorded("show_unknown_job")})
    c, _ = client(runner)
    with pytest.raises(SlurmError, match=r"^no such job: 999999$"):
        c.job("999999")


def test_resume_not_drained_is_quiet_success(capfd: pytest.CaptureFixture[str]) -> None:
    runner = FakeRunner({}, default=recorded("resume_not_drained"))
    c, sleeps = client(runner)
    c.resume("gpu-n1")
    assert runner.commands() == [("scontrol", "update", "nodename=gpu-n1", "state=resume")]
    assert sleeps == []
    assert capfd.readouterr() == ("", "")  # logs nothing


@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_recorded_rejections_of_both_releases(release: str) -> None:
    """22.05 refuses a resume of an idle node with "Invalid node state specified", 25.11
    with "Invalid node state transition": both are "already resumed"; unknown nodes and
    jobs are SlurmErrors, never retried as an unreachable slurmctld."""
    errors = load_json(DATA / release / "errors.json")

    def answer(name: str) -> subprocess.CompletedProcess[str]:
        e = errors[name]
        return cp(e["returncode"], e["stdout"], e["stderr"])

    c, sleeps = client(FakeRunner({("scontrol", "--version"): cp(1),
                                   ("scontrol", "update", "nodename=gpu-n1", "state=resume"):
                                       answer("resume_not_drained"),
                                   ("scontrol", "-o", "show", "node", "gpu-nX"): answer("show_unknown_node"),
                                   ("scontrol", "-o", "show", "job", "-d", "999999"): answer("show_unknown_job"),
                                   ("scontrol", "requeue", "999999"): answer("requeue_unknown_job")}))
    c.resume("gpu-n1")
    with pytest.raises(SlurmError, match=r"^no such node: gpu-nX$"):
        c.node("gpu-nX")
    with pytest.raises(SlurmError, match=r"^no such job: 999999$"):
        c.job("999999")
    with pytest.raises(SlurmError, match="Invalid job id specified") as exc:
        c.requeue("999999")
    assert not isinstance(exc.value, SlurmUnreachable) and sleeps == []


def test_25_11_a_resumed_nodes_old_reason_is_not_its_reason() -> None:
    """25.11 keeps the reason of a resumed node until a job runs there (recorded: idle,
    "slurmgpu: x"); it is no drain of slurmgpu's, in JSON or in text."""
    node = parse_nodes_json(load_json(DATA / "25.11" / "scontrol_show_node_resumed.json"))[0]
    assert (node.state, node.drained, node.reason, node.reason_user, node.reason_time) == (
        "idle", False, None, None, None)
    assert not node.owned_by_slurmgpu
    assert parse_node_text((DATA / "25.11" / "scontrol_node_resumed.txt").read_text()) == node


def test_22_05_uses_sinfo_json_and_filters() -> None:
    runner = FakeRunner({("scontrol", "--version"): V22,
                         ("sinfo", "--all", "--json"): cp(stdout=(D22 / "sinfo_busy.json").read_text())})
    c, _ = client(runner)
    assert c.node("gpu-n1").reason == HOSTILE_REASON
    assert c.node("gpu-n2").state == "allocated"
    assert {n.name for n in c.nodes()} == {"gpu-n1", "gpu-n2"}
    # Version detected once; no text fallback needed.
    assert runner.commands().count(("scontrol", "--version")) == 1
    assert all(cmd[0] == "sinfo" or cmd == ("scontrol", "--version") for cmd in runner.commands())
    assert runner.calls[1][0] == "/opt/slurm/bin/sinfo"


def test_22_05_jobs_via_squeue_json() -> None:
    runner = FakeRunner({("scontrol", "--version"): V22,
                         ("squeue", "--all", "--json"): cp(stdout=(D22 / "squeue_busy.json").read_text())})
    c, _ = client(runner)
    assert {j.job_id for j in c.jobs_on_node("gpu-n1")} == {"6", "7"}
    assert {j.job_id for j in c.jobs_on_node("gpu-n2")} == {"5", "6", "8"}
    assert c.job("6").gpus == {"gpu-n1": (0,), "gpu-n2": (3,)}


def test_24_11_uses_scontrol_json() -> None:
    runner = FakeRunner({
        ("scontrol", "--version"): V24,
        ("scontrol", "show", "node", "gpu-n2", "--json"): cp(stdout=(D24 / "scontrol_show_node_drain.json").read_text()),
        ("scontrol", "show", "node", "gpu-nX", "--json"): cp(1, (D24 / "scontrol_show_node_unknown.json").read_text()),
        ("scontrol", "-o", "show", "node", "gpu-nX"): recorded("show_unknown_node"),
        ("scontrol", "show", "job", "6", "--json"): cp(stdout=(D24 / "scontrol_show_job_multinode.json").read_text()),
        ("squeue", "--all", "--json", "--nodelist", "gpu-n1"): cp(stdout=(D24 / "squeue.json").read_text()),
    })
    c, _ = client(runner)
    n2 = c.node("gpu-n2")
    assert (n2.state, n2.flags, n2.reason) == ("mixed", frozenset({"DRAIN"}), HOSTILE_REASON)
    assert c.job("6").gpus == {"gpu-n1": (0,), "gpu-n2": (3,)}
    assert {j.job_id for j in c.jobs_on_node("gpu-n1")} == {"6", "8", "9"}
    with pytest.raises(SlurmError, match="no such node: gpu-nX"):
        c.node("gpu-nX")


def test_25_11_recorded_job_in_json_and_text() -> None:
    """Slurm 25.11.7 (data_parser v0.0.44), recorded: a 2-node job with gpu:2 per node."""
    d25 = DATA / "25.11"
    runner = FakeRunner({
        ("scontrol", "--version"): cp(stdout=(d25 / "scontrol_version.txt").read_text()),
        ("scontrol", "show", "job", "1", "--json"): cp(stdout=(d25 / "scontrol_show_job_multinode.json").read_text()),
        ("squeue", "--all", "--json", "--nodelist", "gpu-n1"): cp(stdout=(d25 / "squeue_node.json").read_text()),
    })
    c, _ = client(runner)
    job = c.job("1")
    assert (job.job_id, job.state, job.user, job.nodes, job.batch_host, job.restart_count) == (
        "1", "RUNNING", "root", ("gpu-n1", "gpu-n2"), "gpu-n1", 0)
    assert job.gpus == {"gpu-n1": (0, 1), "gpu-n2": (0, 1)}
    assert c.jobs_on_node("gpu-n1") == [job]
    assert parse_job_text((d25 / "scontrol_job_multinode.txt").read_text()) == job


def test_json_unsupported_falls_back_to_text_once() -> None:
    line = (D22 / "scontrol_node_idle.txt").read_text()
    runner = FakeRunner({("scontrol", "--version"): V24,
                         ("scontrol", "show", "node", "gpu-n1", "--json"): recorded("json_scontrol_unsupported"),
                         ("scontrol", "-o", "show", "node", "gpu-n1"): cp(stdout=line)})
    c, _ = client(runner)
    assert c.node("gpu-n1").state == "idle"
    assert c.node("gpu-n1").state == "idle"
    assert runner.commands().count(("scontrol", "show", "node", "gpu-n1", "--json")) == 1


def test_version_unknown_uses_text() -> None:
    runner = FakeRunner({("scontrol", "--version"): cp(1, "", "scontrol: fatal: Could not establish a "
                                                "configuration source\n"),
                         ("scontrol", "-o", "show", "node", "gpu-n1"):
                             cp(stdout=(D22 / "scontrol_node_idle.txt").read_text())})
    c, _ = client(runner)
    assert c.node("gpu-n1").state == "idle"


def test_command_argv_no_shell_hostile_text_verbatim() -> None:
    runner = FakeRunner({}, default=cp())
    c, _ = client(runner)
    hostile = 'slurmgpu: "a" \'b\'; $(reboot) `id`\nnext\tline'
    c.drain("gpu-n1", hostile)
    c.set_admin_comment("12", hostile)
    c.signal_job("12")
    c.signal_job("12", "TERM", full=True)
    c.requeue("12")
    c.resume("gpu-n1")
    clean = 'slurmgpu: "a" \'b\'; $(reboot) `id` next line'
    assert runner.commands() == [
        ("scontrol", "update", "nodename=gpu-n1", "state=drain", f"reason={clean}"),
        ("scontrol", "update", "jobid=12", f"AdminComment={clean}"),
        ("scancel", "--signal=USR1", "--batch", "12"),
        ("scancel", "--signal=TERM", "--full", "12"),
        ("scontrol", "requeue", "12"),
        ("scontrol", "update", "nodename=gpu-n1", "state=resume"),
    ]
    assert runner.calls[2][0] == "/opt/slurm/bin/scancel"
    assert runner.envs[0]["SLURM_CONF"] == "/etc/x/slurm.conf"


def test_reboot_argv_reason_sanitised_like_drain() -> None:
    runner = FakeRunner({}, default=cp())
    c, _ = client(runner)
    hostile = 'slurmgpu: "a" \'b\'; $(reboot) `id`\nnext\tline' + "x" * 1000
    c.reboot("gpu-n1", hostile)
    c.drain("gpu-n1", hostile)
    clean = sanitize_reason(hostile)
    assert len(clean) == 256
    assert runner.commands() == [
        ("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={clean}", "gpu-n1"),
        ("scontrol", "update", "nodename=gpu-n1", "state=drain", f"reason={clean}"),
    ]
    assert runner.calls[0][0] == "/opt/slurm/bin/scontrol"


# Measured: Debian's Slurm 22.05.8, slurm.conf without RebootProgram.
NO_REBOOT_PROGRAM = cp(1, "", "scontrol: error: RebootProgram isn't defined\n"
                              "scontrol_reboot_nodes error: Unspecified error\n")


def test_reboot_without_reboot_program_is_a_clear_error() -> None:
    runner = FakeRunner({}, default=NO_REBOOT_PROGRAM)
    c, sleeps = client(runner)
    with pytest.raises(SlurmError) as exc:
        c.reboot("gpu-n1", "slurmgpu: x")
    assert not isinstance(exc.value, SlurmUnreachable)
    assert str(exc.value) == ("cannot reboot gpu-n1: Slurm has no RebootProgram configured "
                              "(slurm.conf RebootProgram=...): "
                              "scontrol: error: RebootProgram isn't defined")
    assert len(runner.calls) == 1 and sleeps == []  # a rejection: not retried


def test_reboot_unreachable_retries_then_raises() -> None:
    runner = FakeRunner({}, default=recorded("unreachable_requeue"))
    c, sleeps = client(runner, retries=2)
    with pytest.raises(SlurmUnreachable):
        c.reboot("gpu-n1", "x")
    assert len(runner.calls) == 2 and sleeps == [0.5]


def test_reboot_other_rejection_unchanged() -> None:
    runner = FakeRunner({}, default=cp(1, "", "scontrol: error: Invalid node name specified\n"))
    c, _ = client(runner)
    with pytest.raises(SlurmError, match=r"^scontrol reboot: scontrol: error: Invalid node name"):
        c.reboot("gpu-nX", "x")
    with pytest.raises(SlurmError, match="invalid node name"):
        c.reboot("gpu-n[1-2]", "x")
    assert len(runner.calls) == 1


@pytest.mark.parametrize("bad", ["", "gpu-n[1-2]", "a,b", "a b", "-x", "n=1", "a\nb"])
def test_invalid_node_names_rejected_before_running(bad: str) -> None:
    runner = FakeRunner({})
    c, _ = client(runner)
    with pytest.raises(SlurmError, match="invalid node name"):
        c.drain(bad, "x")
    assert runner.calls == []


@pytest.mark.parametrize("bad", ["", "12 13", "-1", "12;reboot", "abc"])
def test_invalid_job_ids_rejected(bad: str) -> None:
    c, _ = client(FakeRunner({}))
    with pytest.raises(SlurmError, match="invalid job id"):
        c.requeue(bad)


def test_binary_lookup(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "scontrol"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert CliSlurmClient(bin_dir=str(tmp_path / "bin")).binary("scontrol") == str(tool)
    assert CliSlurmClient(env={"PATH": str(tmp_path / "bin")}).binary("scontrol") == str(tool)
    # A prolog gets no PATH on 22.05: fall back to /usr/bin.
    no_path = CliSlurmClient(env={"PATH": ""})
    assert no_path.binary("squeue") == "/usr/bin/squeue"


def test_from_settings() -> None:
    s = SlurmSettings(bin_dir="/opt/s/bin", retries=5, retry_delay_s=0.1, command_timeout_s=3)
    c = CliSlurmClient.from_settings(s, env={"SLURM_CONF": "/x"})
    assert (c.bin_dir, c.retries, c.retry_delay_s, c.command_timeout_s) == ("/opt/s/bin", 5, 0.1, 3)
    assert c.env["SLURM_CONF"] == "/x" and c.env["SLURM_TIME_FORMAT"] == "standard"


# =========================================================================== pyslurm (faked)


class FakeRPCError(Exception):
    pass


def fake_pyslurm(version: str = "22.05.0") -> types.SimpleNamespace:
    """Just enough of pyslurm 25.x's object API to exercise PyslurmClient's mapping."""
    log: list[tuple[Any, ...]] = []
    nodes: dict[str, dict[str, Any]] = {
        "gpu-n1": {"state": "IDLE+DRAIN", "reason": "slurmgpu: x", "reason_user": "root",
                   "reason_time": 1795659836},
        "gpu-n2": {"state": "MIXED", "reason": None, "reason_user": None, "reason_time": None},
    }
    down = {"flag": 0}

    def rpc(msg: str) -> None:
        if down["flag"] > 0:
            down["flag"] -= 1
            raise FakeRPCError("Unable to contact slurm controller (connect failure)")
        if msg:
            raise FakeRPCError(msg)

    class Node:
        state: str | None = None

        def __init__(self, name: str | None = None, **kw: Any) -> None:
            self.name = name
            self.__dict__.update(nodes.get(name or "", {}))
            self.__dict__.update(kw)

        @staticmethod
        def load(name: str) -> Node:
            rpc("" if name in nodes else f"Node '{name}' does not exist")
            return Node(name)

        def modify(self, changes: Node) -> None:
            bad = changes.state == "RESUME" and "DRAIN" not in nodes[self.name or ""]["state"]
            rpc("Invalid node state specified" if bad else "")
            log.append(("modify", self.name, changes.state, getattr(changes, "reason", None)))

    class Nodes(dict[str, Any]):
        @staticmethod
        def load() -> Nodes:
            rpc("")
            return Nodes({n: Node(n) for n in nodes})

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id
            self.state, self.user_name, self.allocated_nodes = "RUNNING", "root", "gpu-n[1-2]"
            self.batch_host, self.requeue_count = "gpu-n1", 1
            self.state_reason, self.admin_comment = None, "c"
            self.start_time, self.end_time = 1795659608, 1827195608  # (running: the end is a projection)

        @staticmethod
        def load(job_id: int) -> Job:
            rpc("" if job_id == 6 else "Invalid job id specified")
            return Job(job_id)

        def get_resource_layout_per_node(self) -> dict[str, Any]:
            return {"gpu-n1": {"cpu_ids": "0", "gres": {"gpu": {"count": 1, "indexes": "0"}}},
                    "gpu-n2": {"cpu_ids": "1", "gres": {"gpu:h100": {"count": 2, "indexes": "2-3"}}}}

        def send_signal(self, signal: str, steps: str = "children", hurry: bool = False) -> None:
            log.append(("signal", self.id, signal, steps))

        def requeue(self, hold: bool = False) -> None:
            log.append(("requeue", self.id))

        def modify(self, changes: Any) -> None:
            log.append(("job-modify", self.id, changes.admin_comment))

    class Jobs(dict[int, Any]):
        @staticmethod
        def load() -> Jobs:
            return Jobs({6: Job(6)})

    class JobSubmitDescription:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    return types.SimpleNamespace(
        __version__=version, Node=Node, Nodes=Nodes, Job=Job, Jobs=Jobs,
        JobSubmitDescription=JobSubmitDescription, RPCError=FakeRPCError,
        PyslurmError=FakeRPCError, log=log, down=down)


def test_pyslurm_client_mapping() -> None:
    mod = fake_pyslurm()
    sleeps: list[float] = []
    c = PyslurmClient(module=mod, sleep=sleeps.append, retries=3, retry_delay_s=0.2)
    n1 = c.node("gpu-n1")
    assert (n1.state, n1.flags, n1.reason, n1.reason_time) == (
        "idle", frozenset({"DRAIN"}), "slurmgpu: x", 1795659836)
    assert {n.name for n in c.nodes()} == {"gpu-n1", "gpu-n2"}
    with pytest.raises(SlurmError, match="no such node: gpu-nX"):
        c.node("gpu-nX")
    c.drain("gpu-n2", "slurmgpu: a\nb")
    c.resume("gpu-n2")  # not drained in the fake: "Invalid node state specified" -> quiet
    job = c.job("6")
    assert job.nodes == ("gpu-n1", "gpu-n2")
    assert job.gpus == {"gpu-n1": (0,), "gpu-n2": (2, 3)}
    assert (job.restart_count, job.state) == (1, "RUNNING")
    assert (job.start_time, job.end_time) == (1795659608.0, None)
    assert [j.job_id for j in c.jobs_on_node("gpu-n2")] == ["6"]
    with pytest.raises(SlurmError, match="no such job"):
        c.job("7")
    c.signal_job("6")
    c.signal_job("6", "TERM", full=True)
    c.requeue("6")
    c.set_admin_comment("6", "x;\ny")
    assert mod.log == [
        ("modify", "gpu-n2", "DRAIN", "slurmgpu: a b"),
        ("signal", 6, "SIGUSR1", "batch"),
        ("signal", 6, "SIGTERM", "all"),
        ("requeue", 6),
        ("job-modify", 6, "x; y"),
    ]
    mod.down["flag"] = 10
    with pytest.raises(SlurmUnreachable, match="after 3 tries"):
        c.node("gpu-n1")
    assert sleeps == [0.2, 0.2]


def test_pyslurm_reboot_goes_through_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyslurm has no reboot call: the same scontrol argv, with the client's settings."""
    runner = FakeRunner({}, default=cp())
    made: list[CliSlurmClient] = []
    real_init = CliSlurmClient.__init__

    def init(self: CliSlurmClient, **kw: Any) -> None:
        real_init(self, runner=runner, **kw)
        made.append(self)

    monkeypatch.setattr(CliSlurmClient, "__init__", init)
    mod = fake_pyslurm()
    c = PyslurmClient(module=mod, bin_dir="/opt/slurm/bin", env={"SLURM_CONF": "/etc/x/slurm.conf"},
                      retries=4, retry_delay_s=0.3, command_timeout_s=7)
    c.reboot("gpu-n2", "slurmgpu: a\nb")
    assert runner.commands() == [
        ("scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=slurmgpu: a b", "gpu-n2")]
    [cli] = made
    assert (cli.bin_dir, cli.retries, cli.retry_delay_s, cli.command_timeout_s) == (
        "/opt/slurm/bin", 4, 0.3, 7)
    assert cli.env["SLURM_CONF"] == "/etc/x/slurm.conf"
    assert mod.log == []
    with pytest.raises(SlurmError, match="invalid node name"):
        c.reboot("a b", "x")


def test_a_caller_with_a_deadline_gets_the_command_client() -> None:
    """A hook's Slurm calls must end within its share of the watchdog: a libslurm call
    waits out MessageTimeout per try, so ``bounded`` swaps pyslurm for the commands."""
    from slurmgpu.slurm.factory import bounded

    c = PyslurmClient(module=fake_pyslurm(), bin_dir="/opt/s/bin", env={"SLURM_CONF": "/x"},
                      retries=4, retry_delay_s=0.3, command_timeout_s=7)
    cli = bounded(c)
    assert isinstance(cli, CliSlurmClient)
    assert (cli.bin_dir, cli.retries, cli.retry_delay_s, cli.command_timeout_s) == ("/opt/s/bin", 4, 0.3, 7)
    assert cli.env["SLURM_CONF"] == "/x"
    assert bounded(cli) is cli


def test_pyslurm_available_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    import importlib.util

    if importlib.util.find_spec("pyslurm") is None:
        ok, why = pyslurm_available()
        assert not ok and "pyslurm is not installed" in why
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("25.11.2"))
    monkeypatch.setattr(CliSlurmClient, "version", lambda self: (22, 5))
    ok, why = pyslurm_available()
    assert not ok and why == "pyslurm 25.11.2 is for Slurm 25.11, running Slurm is 22.05"
    assert isinstance(make_client(SlurmSettings()), CliSlurmClient)
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("22.05.0"))
    assert pyslurm_available() == (True, "pyslurm 22.05.0 matches Slurm 22.05")
    assert isinstance(make_client(SlurmSettings()), PyslurmClient)


def test_pyslurm_for_another_slurm_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing pyslurm loads the libslurm it was built for, which then reads this
    cluster's slurm.conf: a pyslurm 25.11 must not be imported where 22.05 runs."""
    from slurmgpu.slurm import pyslurm_client

    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    real_find_spec = pyslurm_client.importlib.util.find_spec
    monkeypatch.setattr(pyslurm_client.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "pyslurm" else real_find_spec(name, *a))
    monkeypatch.setattr(pyslurm_client, "installed_version", lambda: "25.11.2")
    monkeypatch.setattr(pyslurm_client, "_import_pyslurm", lambda env=None: pytest.fail("imported"))
    monkeypatch.setattr(CliSlurmClient, "version", lambda self: (22, 5))
    assert pyslurm_available() == (False, "pyslurm 25.11.2 is for Slurm 25.11, running Slurm is 22.05")


# =========================================================================== contract


# The pyslurm case also carries the ``pyslurm`` mark: `-m pyslurm` runs just those.
IMPLEMENTATIONS = ["cli", pytest.param("pyslurm", marks=pytest.mark.pyslurm)]


def make_impl(kind: str, env: Mapping[str, str], **kw: Any) -> Any:
    if kind == "cli":
        return CliSlurmClient(env=env, **kw)
    ok, why = pyslurm_available(env)
    if not ok and os.environ.get("CI") and os.environ.get("SLURMGPU_SLURM_PREFIX"):
        # CI's 25.11 stage builds pyslurm for that Slurm: a skip would hide a broken build
        pytest.fail(f"PyslurmClient unavailable under CI on 25.11: {why}", pytrace=False)
    if not ok:
        pytest.skip(f"PyslurmClient unavailable: {why}")
    return PyslurmClient(env=env, **kw)


wait_for = functools.partial(wait_until, timeout=15, interval=0.2)  # (Slurm is polled)


# Each shell says when its trap is set (a USR1 before that would kill it); the child shell
# also adds a byte to $ticks after each loop turn (see test_signal_job).
SIGNAL_SCRIPT = """#!/bin/bash
out={out}
ticks={ticks}
trap 'echo got batch >> "$out"' USR1
( trap 'echo got child >> "$out"' USR1
  echo ready child >> "$out"
  while :; do sleep 0.1; echo >> "$ticks"; done ) &
echo ready batch >> "$out"
while :; do sleep 0.1 & wait $!; done
"""


def lines(path: Path) -> set[str]:
    return set(path.read_text().splitlines()) if path.exists() else set()


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def reboot_program(cluster: Any) -> str | None:
    m = re.search(r"(?m)^RebootProgram\s*=\s*(\S+)", cluster.scontrol("show", "config"))
    return None if m is None or m.group(1) == "(null)" else m.group(1)


def reconfigure(cluster: Any, conf: str) -> None:
    """Write slurm.conf and ``scontrol reconfigure`` (25.11's slurmctld and slurmds restart
    themselves, 22.05's re-read the file); back when every node is idle again."""
    Path(cluster.env()["SLURM_CONF"]).write_text(conf)
    cluster.scontrol("reconfigure")
    want = (re.search(r"(?m)^RebootProgram=(\S+)", conf) or [None, None])[1]
    wait_for(lambda: cluster._ping() and reboot_program(cluster) == want, timeout=60,
             what="slurmctld back with the new slurm.conf")
    cluster.wait_idle(60)


@contextlib.contextmanager
def without_reboot_program(cluster: Any) -> Iterator[None]:
    """The cluster's slurm.conf without its RebootProgram, for the duration."""
    conf = Path(cluster.env()["SLURM_CONF"]).read_text()
    reconfigure(cluster, re.sub(r"(?m)^RebootProgram=.*\n", "", conf))
    try:
        yield
    finally:
        reconfigure(cluster, conf)


def unreachable_conf(cluster: Any, tmp_path: Path) -> Path:
    """The cluster's slurm.conf with a SlurmctldPort nobody listens on, MessageTimeout=2."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = Path(cluster.env()["SLURM_CONF"]).read_text()
    conf = re.sub(r"(?im)^SlurmctldPort=.*$", f"SlurmctldPort={port}", conf)
    conf = re.sub(r"(?im)^MessageTimeout=.*$\n?", "", conf) + "MessageTimeout=2\n"
    bad = tmp_path / "slurm.conf"
    bad.write_text(conf)
    return bad


# Run in a process of its own (its SLURM_CONF names a port nobody listens on): prints the
# SlurmUnreachable and the pauses between the tries.
PYSLURM_UNREACHABLE = """
import sys
from slurmgpu.slurm import SlurmUnreachable
from slurmgpu.slurm.pyslurm_client import PyslurmClient
sleeps = []
client = PyslurmClient(retries=3, retry_delay_s=0.1, sleep=sleeps.append)
try:
    client.node(sys.argv[1])
except SlurmUnreachable as exc:
    print(exc, "sleeps", sleeps)
    sys.exit(0)
sys.exit("no SlurmUnreachable")
"""


@slurm_mark
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
class TestContract:
    """Every ``SlurmClient`` implementation against the real mini-cluster."""

    @pytest.fixture
    def client(self, cluster: Any, impl: str) -> Any:
        # The client contract does not involve slurmgpu's own hooks: keep them out.
        if hasattr(cluster, "set_hooks_enabled"):
            cluster.set_hooks_enabled(False)
        return make_impl(impl, cluster.env(), retries=2, retry_delay_s=0.2)

    def test_node_idle(self, client: Any, cluster: Any) -> None:
        node = client.node(cluster.nodes[0])
        assert node.name == cluster.nodes[0]
        assert node.state == "idle" and not node.drained
        assert node.reason is None
        assert set(cluster.nodes) <= {n.name for n in client.nodes()}

    def test_drain_hostile_reason(self, client: Any, cluster: Any, tmp_path: Path) -> None:
        marker = tmp_path / "pwned"
        reason = (f'{REASON_PREFIX} gpu 2 "dq" \'sq\' ; $(touch {marker}) `touch {marker}`'
                  f"\n second line\ttab; " + "x" * 1000)
        want = sanitize_reason(reason)
        before = time.time()
        node = cluster.nodes[2]
        client.drain(node, reason)
        got = client.node(node)
        assert got.drained and got.owned_by_slurmgpu
        assert got.reason == want
        assert got.reason_user == "root"
        assert got.reason_time is not None and before - 5 <= got.reason_time <= time.time() + 5
        # Independent check through scontrol itself.
        assert f"Reason={want} [root@" in cluster.scontrol("-o", "show", "node", node)
        assert not marker.exists()

    def test_resume_and_idempotent(self, client: Any, cluster: Any) -> None:
        node = cluster.nodes[2]
        client.drain(node, f"{REASON_PREFIX} contract test")
        assert client.node(node).drained
        client.resume(node)
        assert not client.node(node).drained
        client.resume(node)  # not drained any more: no error
        client.resume(cluster.nodes[3])  # never drained

    def test_jobs_on_node_and_job_gpus(self, client: Any, cluster: Any) -> None:
        node = cluster.nodes[1]
        jid = cluster.sbatch("", "--gres=gpu:2", "-w", node, "-o", "/dev/null",
                             "--wrap", "sleep 30")
        assert cluster.wait_job(jid, states=("RUNNING",), timeout=30) == "RUNNING"
        # RUNNING comes before the prolog ends (reason 'Prolog'): compare once it has.
        wait_for(lambda: client.job(jid).state_reason is None, timeout=60, what="prolog done")
        jobs = {j.job_id: j for j in client.jobs_on_node(node)}
        assert jid in jobs
        assert jid not in {j.job_id for j in client.jobs_on_node(cluster.nodes[0])}
        info = client.job(jid)
        assert (info.job_id, info.state, info.nodes) == (jid, "RUNNING", (node,))
        assert (info.batch_host, info.restart_count, info.user) == (node, 0, "root")
        assert len(info.gpus[node]) == 2
        assert set(info.gpus[node]) <= set(range(8))
        scontrol_gres = re.search(r"\sGRES=(\S+)", cluster.scontrol("-o", "show", "job", "-d", jid))
        assert scontrol_gres is not None
        assert info.gpus[node] == parse_gres_gpu_indices(scontrol_gres.group(1))
        assert jobs[jid] == info

    @pytest.mark.parametrize("full", [False, True])
    def test_signal_job(self, client: Any, cluster: Any, tmp_path: Path, full: bool) -> None:
        out, ticks = tmp_path / "signals", tmp_path / "ticks"
        jid = cluster.sbatch(SIGNAL_SCRIPT.format(out=out, ticks=ticks), "-w", cluster.nodes[0],
                             "-o", "/dev/null")
        cluster.wait_job(jid, states=("RUNNING",), timeout=60)
        wait_for(lambda: {"ready batch", "ready child"} <= lines(out), timeout=60, what="job traps")
        client.signal_job(jid, "USR1", full=full)
        wait_for(lambda: "got batch" in lines(out), timeout=60, what="batch shell USR1")
        if full:
            wait_for(lambda: "got child" in lines(out), timeout=60, what="child USR1")
        else:
            # Not a fixed wait: bash runs a pending trap before its next command, so a USR1
            # sent to the child shell too (by now: the batch shell has handled its own) would
            # be handled before the child's second loop turn from here.
            turns = size(ticks)
            wait_for(lambda: size(ticks) >= turns + 2, timeout=60, what="two more child loop turns")
            assert "got child" not in lines(out)
        assert client.job(jid).state == "RUNNING"

    def test_requeue(self, client: Any, cluster: Any) -> None:
        jid = cluster.sbatch("", "-w", cluster.nodes[3], "-o", "/dev/null", "--requeue",
                             "--wrap", "sleep 60")
        cluster.wait_job(jid, states=("RUNNING",), timeout=30)
        client.requeue(jid)
        info = wait_for(lambda: (j := client.job(jid)).restart_count >= 1 and j, timeout=60,
                        what="restart count")
        assert info.restart_count == 1
        assert info.state in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING", "COMPLETING")

    def test_set_admin_comment(self, client: Any, cluster: Any) -> None:
        jid = cluster.sbatch("", "-w", cluster.nodes[0], "-o", "/dev/null", "--wrap", "sleep 30")
        comment = f'{REASON_PREFIX} gpu 2; "x" $(reboot)\nline2 a=b'
        client.set_admin_comment(jid, comment)
        assert client.job(jid).admin_comment == sanitize_reason(comment, max_len=1024)

    def test_reboot_without_reboot_program_refused(self, client: Any, cluster: Any) -> None:
        node = cluster.nodes[2]
        with without_reboot_program(cluster):
            with pytest.raises(SlurmError, match=r"^cannot reboot .*no RebootProgram configured.*"
                                                 r"RebootProgram isn't defined$") as exc:
                client.reboot(node, f"{REASON_PREFIX} reboot test")
            assert not isinstance(exc.value, SlurmUnreachable)
            got = client.node(node)  # refused: nothing changed
            assert got.state == "idle" and not got.drained and not got.rebooting and got.reason is None

    def test_reboot(self, client: Any, cluster: Any) -> None:
        if not reboot_program(cluster):
            pytest.skip("the simulated cluster's slurm.conf has no RebootProgram: "
                        "scontrol reboot is refused (\"RebootProgram isn't defined\")")
        node = cluster.nodes[1]
        # A running job keeps the ASAP reboot pending (REBOOT_REQUESTED) and is not killed.
        jid = cluster.sbatch("", "-w", node, "-o", "/dev/null", "--wrap", "sleep 60")
        cluster.wait_job(jid, states=("RUNNING",), timeout=30)
        reason = f'{REASON_PREFIX} xid 79 GPU 2 "q" $(id)\nline2'
        try:
            client.reboot(node, reason)
            got = client.node(node)
            assert got.drained and got.rebooting and got.owned_by_slurmgpu
            assert "REBOOT_REQUESTED" in got.flags
            assert got.reason is not None and got.reason.startswith(sanitize_reason(reason))
            assert client.job(jid).state == "RUNNING"
            assert "NextState=RESUME" in cluster.scontrol("-o", "show", "node", node)
        finally:
            # Once idle the node would go REBOOT_ISSUED until ResumeTimeout (the sim's
            # RebootProgram reboots nothing), which reset() cannot undo. cancel_reboot
            # also lifts the reboot's drain (measured, 22.05).
            cluster.scontrol("cancel_reboot", node)
        got = client.node(node)
        assert not got.rebooting and not got.drained

    def test_reserved_node(self, client: Any, cluster: Any) -> None:
        """A node in a maintenance reservation reads as such; drain and resume still work."""
        node = cluster.nodes[3]
        cluster.scontrol("create", "reservation", "ReservationName=sgd-maint", "StartTime=now",
                         "Duration=10", f"Nodes={node}", "Users=root", "Flags=MAINT,IGNORE_JOBS")
        try:
            # slurmctld flags the node on its next pass (seconds: measured, 25.11)
            got = wait_for(lambda: next((n for n in [client.node(node)] if "MAINTENANCE" in n.flags),
                                        None), timeout=60, what="the MAINTENANCE flag")
            assert (got.state, got.drained) == ("idle", False)
            client.drain(node, f"{REASON_PREFIX} reserved")
            got = client.node(node)
            assert got.drained and "MAINTENANCE" in got.flags and got.owned_by_slurmgpu
            client.resume(node)
            assert not client.node(node).drained
        finally:
            cluster.scontrol("delete", "reservation", "sgd-maint")

    def test_unknown_node_and_job(self, client: Any) -> None:
        with pytest.raises(SlurmError, match="no such node: gpu-nX") as exc:
            client.node("gpu-nX")
        assert not isinstance(exc.value, SlurmUnreachable)
        with pytest.raises(SlurmError) as exc2:
            client.job("999999")
        assert not isinstance(exc2.value, SlurmUnreachable)

    def test_slurmctld_unreachable(self, cluster: Any, impl: str, tmp_path: Path) -> None:
        make_impl(impl, cluster.env())  # skips an unavailable implementation
        bad = unreachable_conf(cluster, tmp_path)
        if impl != "cli":  # libslurm reads SLURM_CONF once per process: a process of its own
            proc = subprocess.run([sys.executable, "-c", PYSLURM_UNREACHABLE, cluster.nodes[0]],
                                  env={**os.environ, **cluster.env(), "SLURM_CONF": str(bad)},
                                  capture_output=True, text=True, timeout=120, check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert proc.stdout.startswith("slurmctld unreachable after 3 tries: "), proc.stdout
            assert proc.stdout.rstrip().endswith("sleeps [0.1, 0.1]"), proc.stdout
            return
        sleeps: list[float] = []

        def sleep(s: float) -> None:
            sleeps.append(s)
            time.sleep(s)

        c = CliSlurmClient(env={**cluster.env(), "SLURM_CONF": str(bad)}, retries=3,
                           retry_delay_s=0.1, command_timeout_s=5, sleep=sleep)
        start = time.monotonic()
        with pytest.raises(SlurmUnreachable, match=r"^slurmctld unreachable after 3 tries: "):
            c.node(cluster.nodes[0])
        elapsed = time.monotonic() - start
        assert sleeps == [0.1, 0.1]
        # 22.05: one sinfo --json try + 3 text tries, ~1 s each with MessageTimeout=2.
        assert elapsed < 4 * 5 + 1, elapsed
        with pytest.raises(SlurmUnreachable):
            c.drain(cluster.nodes[0], "x")


@slurm_mark
def test_client_and_controller_report_the_clusters_version(cluster: Any) -> None:
    """``version`` (scontrol --version) and ``controller_version`` (what slurmctld says)."""
    c = CliSlurmClient(env=cluster.env())
    want = parse_version(cluster.status()["slurm_version"])
    assert want is not None and c.version() == want and c.controller_version() == want
