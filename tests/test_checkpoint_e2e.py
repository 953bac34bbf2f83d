"""Fleet automation end to end on the real Slurm mini-cluster: 2 nodes x 8 simulated GPUs,
an agent per node, the collector with ``[automation]`` on (``fleet.set_automation``), real
sbatch jobs, real scancel/scontrol. Run with `pytest -m slurm`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from slurmgpu.sim.cluster import SimCluster
from tests.agenthelpers import query_db
from tests.agenthelpers import wait_until as _wait_until

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_with_checkpoint.py"
NODES = ("gpu-n1", "gpu-n2")
# Generous limits so the breaker does not get in the way of the tests that are not about it.
OPEN_BREAKER = "max_fraction = 1.0\nmax_per_hour = 100\nstorm_fraction = 1.0\n"




def wait_until(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Slurm is polled (sinfo, scontrol): every 0.1 s is plenty."""
    return _wait_until(predicate, timeout, what, interval=0.1)


def query(fleet: SimCluster, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return query_db(fleet.collector_db(), sql, *params)


def set_automation(fleet: SimCluster, settings: str) -> None:
    """``fleet.set_automation``, which restarts the collector, then wait until every agent
    has reconnected (a hello from it stored since): an agent that has not yet signals the
    jobs on its node itself on a drain-now fault (its local fallback). An agent configured
    for another port than the collector's (a collector restarted while its port was taken
    moves to the next free one) would never reconnect: it is restarted."""
    restarted = time.time()
    fleet.set_automation(settings)
    for node in NODES:
        if f'"{fleet.collector_address}"' not in fleet.agent_config_path(node).read_text():
            fleet.restart_agent(node)
    wait_until(lambda: len(query(fleet, "SELECT DISTINCT node FROM messages WHERE type = 'hello' "
                                        "AND received_at >= ?", restarted)) == len(NODES),
               30, "every agent reconnected to the restarted collector")


def timeline(fleet: SimCluster, job_id: str) -> list[str]:
    return [k for (k,) in query(fleet, "SELECT kind FROM job_events WHERE job_id = ? ORDER BY ts, id",
                                job_id)]


def reason(fleet: SimCluster, node: str) -> str:
    return fleet.node_reasons().get(node, "")


def drained(fleet: SimCluster, node: str) -> bool:
    return "drain" in fleet.node_states().get(node, "")


def first_healthy(fleet: SimCluster, node: str, since: float) -> tuple[float, float] | None:
    """(its timestamp, when the collector received it) of the node's first OK report made
    after ``since`` (report_history keeps a row only where a node's verdict changes)."""
    rows = query(fleet, "SELECT h.ts, m.received_at FROM report_history h JOIN messages m "
                        "ON m.node = h.node AND m.seq = h.seq AND m.ts = h.ts "
                        "WHERE h.node = ? AND h.verdict = 'OK' AND h.ts > ? ORDER BY h.ts LIMIT 1",
                 node, since)
    return rows[0] if rows else None


def handled_reports(fleet: SimCluster, node: str, since: float) -> int:
    """How many of the node's reports received at or after ``since`` (the collector's clock)
    the automation has handled. The collector's loop is single-threaded: it stores a batch,
    acks it and runs the automation on it before it takes the next batch, so every batch
    received before the newest one stored has been handled."""
    [(newest,)] = query(fleet, "SELECT max(received_at) FROM messages")
    [(count,)] = query(fleet, "SELECT count(*) FROM messages WHERE node = ? AND type = 'report' "
                              "AND received_at >= ? AND received_at < ?", node, since, newest)
    return int(count)


def submit_training(fleet: SimCluster, tmp_path: Path, steps: int = 150, step_time: float = 0.1,
                    *, ack: bool = True) -> tuple[str, str]:
    """Submit the example training job; return (job id, node it runs on)."""
    ckpt = tmp_path / "ckpt.json"
    run = f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLE))} --ckpt {shlex.quote(str(ckpt))} " \
          f"--steps {steps} --step-time {step_time}"
    if not ack:  # traps the signal (so the shell survives it) but never acks
        script = ("#!/bin/bash\ntrap 'echo got USR1, ignoring' USR1\necho trap set\n"
                  "sleep 600 & wait\nsleep 600 & wait\n")
    else:
        script = f"#!/bin/bash\nexec {run}\n"
    job = fleet.sbatch(script, "--requeue", "--gres=gpu:1", "-N1", "--open-mode=append")
    state = fleet.wait_job(job, ("RUNNING",), timeout=60)
    assert state == "RUNNING", fleet.job(job)
    node = fleet.job(job)["NodeList"]
    # A signal before the script set up its handler would kill it.
    ready = "starting fresh" if ack else "trap set"
    wait_until(lambda: ready in _output(fleet, job), 60, "the job to be ready for signals")
    return job, node


def _output(fleet: SimCluster, job: str) -> str:
    try:
        return fleet.job_output(job)
    except Exception:
        return ""


def test_job_acks_is_requeued_and_resumes_from_its_checkpoint(fleet: SimCluster, tmp_path: Path) -> None:
    set_automation(fleet, OPEN_BREAKER + "checkpoint_deadline_s = 60\n")
    job, node = submit_training(fleet, tmp_path)
    other = next(n for n in NODES if n != node)
    # The job sees where its request file is (TaskProlog).
    start = time.monotonic()
    fleet.inject_xid(node, 0, 79, "GPU has fallen off the bus")
    wait_until(lambda: drained(fleet, node), 20, f"{node} drained after the ack")
    took = time.monotonic() - start
    assert reason(fleet, node).startswith("slurmgpu: xid.recent GPU 0")
    wait_until(lambda: fleet.job(job).get("JobState") == "COMPLETED", 90, "the requeued job to finish")
    out = fleet.job_output(job)
    # (the ack itself is checked in the timeline below: after it the requeue may kill the
    # job before it prints anything more)
    assert "got signal SIGUSR1" in out and "checkpoint saved at step" in out, out
    saved = int(out.split("checkpoint saved at step ")[1].split()[0])
    assert f"resumed from step {saved}" in out and "restart 1" in out, out
    assert fleet.job(job)["NodeList"] == other
    kinds = timeline(fleet, job)
    for expected in ("detected", "signalled", "delivered", "acked", "drained", "requeued"):
        assert expected in kinds, kinds
    assert kinds.index("acked") < kinds.index("drained") < kinds.index("requeued")
    # Drained on the ack, long before the 60 s deadline.
    assert took < 30
    result = fleet._run([sys.executable, "-m", "slurmgpu", "jobs", "events", job, "--json",
                         "--db", str(fleet.collector_db())])
    doc = json.loads(result)
    assert doc["checkpoints"][0]["state"] == "acked" and doc["checkpoints"][0]["acked_by"] == node


def test_job_that_never_acks_is_requeued_at_the_deadline(fleet: SimCluster, tmp_path: Path) -> None:
    set_automation(fleet, OPEN_BREAKER + "checkpoint_deadline_s = 4\n")
    job, node = submit_training(fleet, tmp_path, ack=False)
    fleet.inject_xid(node, 2, 79)
    wait_until(lambda: "signalled" in timeline(fleet, job), 30, "the signal")
    [(requested, deadline)] = query(fleet, "SELECT requested, deadline FROM checkpoints WHERE job_id = ?", job)
    assert deadline - requested == pytest.approx(4)
    # Waiting for the ack: not drained yet. (Only a look that ends before the deadline can
    # tell; the collector's own times below are checked however late this test looks.)
    assert not drained(fleet, node) or time.time() >= deadline, "drained before the deadline"
    wait_until(lambda: drained(fleet, node), 30, "the drain at the deadline")
    wait_until(lambda: "requeued" in timeline(fleet, job), 30, "the requeue")
    kinds = timeline(fleet, job)
    assert "acked" not in kinds and kinds.index("deadline") < kinds.index("drained")
    # Drained at the deadline, not before: when the collector did it, not when this test saw it.
    at = dict(query(fleet, "SELECT kind, ts FROM job_events WHERE job_id = ?", job))
    assert at["deadline"] >= deadline and at["drained"] >= deadline, (at, deadline)
    assert "got USR1, ignoring" in _output(fleet, job) or int(fleet.job(job).get("Restarts", "0")) >= 1


def test_collector_restart_mid_checkpoint_keeps_the_timeline(fleet: SimCluster, tmp_path: Path) -> None:
    set_automation(fleet, OPEN_BREAKER + "checkpoint_deadline_s = 6\n")
    job, node = submit_training(fleet, tmp_path, ack=False)
    fleet.inject_xid(node, 1, 79)
    wait_until(lambda: "signalled" in timeline(fleet, job), 30, "the signal")
    fleet.kill_collector()  # SIGKILL, mid-checkpoint
    fleet.start_collector()
    wait_until(lambda: drained(fleet, node), 30, "the drain at the deadline after the restart")
    wait_until(lambda: "requeued" in timeline(fleet, job), 30, "the requeue")
    kinds = timeline(fleet, job)
    assert kinds.count("signalled") == 1, kinds  # not signalled again after the restart
    assert kinds.index("deadline") < kinds.index("drained") < kinds.index("requeued")


def test_bad_pin_on_every_node_trips_the_breaker(fleet: SimCluster) -> None:
    # 2 nodes, at most 10 % drained (at least 1): the second failing node trips the breaker.
    set_automation(fleet, "max_fraction = 0.1\nstorm_fraction = 0.5\n")
    fleet.write_config(fleet.default_config().replace('driver = ["550.90.07"]', 'driver = ["999.1"]'))
    for node in NODES:
        fleet.restart_agent(node)
    held = wait_until(lambda: query(fleet, "SELECT min(time) FROM decisions WHERE held = 1")[0][0], 30,
                      "a held drain")
    # More reports from both nodes handled since (not a fixed wait): still no second drain.
    wait_until(lambda: all(handled_reports(fleet, n, held) >= 2 for n in NODES), 30,
               "more reports from both nodes handled")
    states = [drained(fleet, n) for n in NODES]
    assert states.count(True) <= 1, fleet.node_states()
    out = fleet._run([sys.executable, "-m", "slurmgpu", "breaker", "status", "--json",
                      "--config", str(fleet.dir / "etc" / "collector.toml")])
    status = json.loads(out)
    assert status["breaker_open"] and "pin.driver" in status["why"]


def test_auto_resume_after_recovery_not_before(fleet: SimCluster) -> None:
    set_automation(fleet, OPEN_BREAKER + "resume_healthy_reports = 2\nresume_after_s = 6\n")
    node = "gpu-n1"
    fleet.inject(node, "fault-ecc-dbe")  # uncorrected ECC: drain
    wait_until(lambda: drained(fleet, node), 30, "the drain")
    since = time.time()
    fleet.inject(node, "h100-sxm-8")
    healthy, received = wait_until(lambda: first_healthy(fleet, node, since), 30, "a healthy report")
    # Not a fixed wait: once the automation has handled resume_healthy_reports (2) healthy
    # reports, only resume_after_s holds the node. (Only a look that ends before that time
    # can tell; the resume's own time is checked below however late this test looks.)
    wait_until(lambda: handled_reports(fleet, node, received) >= 2, 30, "two healthy reports handled")
    assert drained(fleet, node) or time.time() >= received + 6, "resumed before resume_after_s"
    wait_until(lambda: not drained(fleet, node), 30, "the auto-resume")
    [(resumed,)] = query(fleet, "SELECT time FROM decisions WHERE node = ? AND action = 'resume'", node)
    assert resumed - healthy >= 5.5  # when the collector resumed it, not when this test saw it


def test_lemon_stays_drained(fleet: SimCluster) -> None:
    set_automation(fleet, OPEN_BREAKER + "resume_healthy_reports = 1\nresume_after_s = 0\n"
                          "lemon_drains = 2\n")
    node = "gpu-n2"
    since = 0.0
    for round_ in range(2):
        fleet.inject(node, "fault-ecc-dbe")
        wait_until(lambda: drained(fleet, node), 30, f"drain {round_ + 1}")
        since = time.time()
        fleet.inject(node, "h100-sxm-8")
        if round_ == 0:
            wait_until(lambda: not drained(fleet, node), 30, "the first auto-resume")
    # Three healthy reports handled (not a fixed wait): each would resume a node that is not
    # a lemon (resume_healthy_reports = 1, resume_after_s = 0).
    _, received = wait_until(lambda: first_healthy(fleet, node, since), 30, "a healthy report")
    wait_until(lambda: handled_reports(fleet, node, received) >= 3, 30, "three healthy reports handled")
    assert drained(fleet, node), "a lemon was resumed"
    lemons = {n for (n,) in query(fleet, "SELECT node FROM automation_lemons")}  # the collector's state
    assert node in lemons


def test_operator_drain_is_never_resumed(fleet: SimCluster) -> None:
    set_automation(fleet, OPEN_BREAKER + "resume_healthy_reports = 1\nresume_after_s = 0\n")
    node = "gpu-n1"
    fleet.scontrol("update", f"nodename={node}", "state=drain", "reason=disk swap, ticket 42")
    fleet.inject(node, "fault-ecc-dbe")
    # (wait for the FAIL to be handled, not a fixed time: the automation keeps the drain)
    wait_until(lambda: ("operator-drain-kept",) in query(fleet, "SELECT result FROM decisions WHERE node = ?",
                                                          node), 30, "the FAIL report handled")
    since = time.time()
    fleet.inject(node, "h100-sxm-8")
    # Healthy reports handled (not a fixed wait) that must not resume it (resume_healthy_reports = 1).
    _, received = wait_until(lambda: first_healthy(fleet, node, since), 30, "a healthy report")
    wait_until(lambda: handled_reports(fleet, node, received) >= 3, 30, "three healthy reports handled")
    assert drained(fleet, node) and reason(fleet, node) == "disk swap, ticket 42"
    results = [r for (r,) in query(fleet, "SELECT result FROM decisions WHERE node = ?", node)]
    assert "operator-drain-kept" in results and "resumed" not in results
    # The collector's Slurm poll recorded who drained it, for the fleet report.
    assert ("drained", "disk swap, ticket 42", "root") in query(
        fleet, "SELECT kind, reason, actor FROM node_states WHERE node = ?", node)


def test_prolog_blocked_job_is_reported(fleet: SimCluster) -> None:
    node = "gpu-n2"
    fleet.inject(node, "fault-row-remap-failure")
    # The prolog asks the agent, whose facts may predate the fault by up to max_age_s.
    wait_until(lambda: fleet.agent_status(node).get("verdict") == "FAIL", 30, "the agent to see the fault")
    job = fleet.sbatch("", "-w", node, "--gres=gpu:8", "-o", "/dev/null", "--wrap", "true")
    rows = wait_until(lambda: query(fleet, "SELECT node, body FROM events WHERE kind = 'prolog_blocked'"),
                      30, "the prolog_blocked event")
    body = msgpack.unpackb(rows[0][1], raw=False)
    assert rows[0][0] == node and body["job_id"] == job
    assert any("mem.row_remap" in p for p in body["problems"])


def test_dry_run_changes_nothing_in_slurm(fleet: SimCluster) -> None:
    set_automation(fleet, OPEN_BREAKER + "dry_run = true\n")
    node = "gpu-n2"
    fleet.inject(node, "fault-ecc-dbe")
    decided = wait_until(lambda: query(fleet, "SELECT min(time) FROM decisions WHERE node = ? AND dry_run = 1",
                                       node)[0][0], 30, "a dry-run decision")
    # More reports handled since (not a fixed wait): none of them drained it either.
    wait_until(lambda: handled_reports(fleet, node, decided) >= 2, 30, "more reports handled")
    assert not drained(fleet, node) and reason(fleet, node) in ("", "none")


def test_reboot_action_when_allowed(fleet: SimCluster) -> None:
    set_automation(fleet, OPEN_BREAKER + 'reboot_allowed = true\n[automation.policy]\n'
                          '"ecc.uncorrected" = "reboot"\n')
    node = "gpu-n1"
    fleet.inject(node, "fault-ecc-dbe")
    wait_until(lambda: query(fleet, "SELECT result FROM decisions WHERE node = ? AND action = 'reboot'",
                             node), 20, "the reboot decision")
    assert query(fleet, "SELECT result FROM decisions WHERE node = ? AND action = 'reboot'",
                 node)[0][0] == "reboot-requested"
    line = fleet.scontrol("show", "node", "-o", node)
    assert "REBOOT" in line and "Reason=slurmgpu: ecc.uncorrected" in line, line


def test_a_poisoned_checkpoint_file_leaves_the_node_connected(fleet: SimCluster) -> None:
    """A job plants 60,000 '[' as its checkpoint file, then its node degrades (XID 79): the
    agent answers the checkpoint command, and a later fault on that node still reaches the
    collector (was: the agent's link thread died reading the file; nothing more from the
    node, while systemd's watchdog still heard from it). Issue 37."""
    set_automation(fleet, OPEN_BREAKER + "checkpoint_deadline_s = 60\n")
    plant = f"{shlex.quote(sys.executable)} -c " + shlex.quote(
        "import os; open(os.environ['SLURMGPU_CHECKPOINT_FILE'], 'w').write('[' * 60000)")
    script = (f"#!/bin/bash\ntrap 'echo got USR1' USR1\n{plant}\necho planted\n"
              "sleep 600 & wait\nsleep 600 & wait\n")
    job = fleet.sbatch(script, "--gres=gpu:1", "-w", "gpu-n1", "--open-mode=append")
    wait_until(lambda: "planted" in _output(fleet, job), 60, "the job to plant its file")
    fleet.inject_xid("gpu-n1", 0, 79, "GPU has fallen off the bus")
    wait_until(lambda: "delivered" in timeline(fleet, job), 30, "the agent to answer the checkpoint")
    later = time.time()
    fleet.inject_xid("gpu-n1", 5, 48)
    rows = wait_until(lambda: query(fleet, "SELECT gpu, data FROM events WHERE node = 'gpu-n1' "
                                           "AND kind = 'xid' AND ts >= ?", later),
                      30, "the later XID from gpu-n1")
    assert (5, 48) in rows


def _as_user(fleet: SimCluster, *argv: str, script: str | None = None) -> str:
    """A Slurm client command run as ``nobody`` (a plain user: no admin rights)."""
    env = {**os.environ, **fleet.env()}
    proc = subprocess.run(["runuser", "-u", "nobody", "--", *argv], env=env, capture_output=True, text=True,
                          timeout=30, check=True, cwd="/tmp", input=script)
    return proc.stdout


def test_a_plain_user_reads_why_their_job_moved(fleet: SimCluster) -> None:
    """Issue 29 item 1: a prolog refusal and a drain-now requeue left nothing a user could
    find. Both jobs are a plain user's; each carries what happened in its AdminComment
    (`scontrol show job`; `sacct -o AdminComment` where accounting is on), and `jobs
    events` shows both."""
    # (the automation leaves the row-remap failure to the prolog, which refuses the job)
    set_automation(fleet, OPEN_BREAKER + "checkpoint_deadline_s = 4\npolicy = { \"mem.row_remap\" = \"none\" }\n")
    fleet.inject("gpu-n2", "fault-row-remap-failure")
    wait_until(lambda: fleet.agent_status("gpu-n2").get("verdict") == "FAIL", 30, "the agent to see the fault")
    refused = _as_user(fleet, "sbatch", "--parsable", "-w", "gpu-n2", "--gres=gpu:8", "-o", "/dev/null",
                       "--wrap", "true").strip()
    trapped = "#!/bin/bash\ntrap 'echo got USR1' USR1\necho trap set\nsleep 600 & wait\nsleep 600 & wait\n"
    output = Path(tempfile.mkstemp(prefix="slurmgpu-e2e-", suffix=".out", dir="/tmp")[1])  # the user writes it
    output.chmod(0o666)
    # The job itself runs the TaskProlog, with this interpreter: as the plain user where it
    # may run it (not where it lives under a 0700 /root), else as root, read as the user.
    runs = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-x", sys.executable], check=False).returncode == 0
    submit = ["sbatch", "--parsable", "--requeue", "-w", "gpu-n1", "--gres=gpu:1", "-o", str(output),
              "--open-mode=append"]
    moved = (_as_user(fleet, *submit, script=trapped) if runs else fleet.sbatch(trapped, *submit[2:])).strip()
    # (a signal before the script set its trap would kill it, and nothing would be requeued)
    wait_until(lambda: "trap set" in output.read_text(), 60, "the job's trap")
    fleet.inject_xid("gpu-n1", 0, 79, "GPU has fallen off the bus")

    def comments() -> dict[str, str] | None:
        shown = {job: _as_user(fleet, "scontrol", "show", "job", job) for job in (refused, moved)}
        found = {job: text.split("AdminComment=", 1)[1].split("\n")[0].strip()
                 for job, text in shown.items() if "AdminComment=" in text}
        return found if len(found) == 2 else None

    try:
        seen = wait_until(comments, 60, "both jobs' AdminComment, as their user sees it")
    except AssertionError as exc:  # what happened instead
        said = {job: {k: fleet.job(job).get(k) for k in ("JobState", "Reason", "AdminComment", "Restarts")}
                for job in (refused, moved)}
        log = (fleet.dir / "log" / "collector.log").read_text(errors="replace").splitlines()
        raise AssertionError(f"{exc}; refused {refused}: {timeline(fleet, refused)} {said[refused]}; "
                             f"moved {moved}: {timeline(fleet, moved)} {said[moved]}; "
                             f"{[line for line in log if 'job_comment' in line][-3:]}") from None
    assert seen[refused].startswith("slurmgpu: refused by the prolog on gpu-n2: ") and "mem.row_remap" in seen[refused]
    assert seen[moved].startswith("slurmgpu: requeued from gpu-n1: xid.recent GPU 0 XID 79"), seen[moved]
    reasons = _as_user(fleet, "squeue", "-h", "-j", refused, "-o", "%r").strip()
    print(f"squeue reason of the refused job: {reasons!r}")
    assert reasons.startswith(("BeginTime", "ReqNodeNotAvail")), reasons
    for job, kind in ((refused, "prolog-refused"), (moved, "requeued")):
        out = fleet._run([sys.executable, "-m", "slurmgpu", "jobs", "events", job, "--db", str(fleet.collector_db())])
        assert kind in out, out
    output.unlink()


def test_a_job_whose_drain_the_breaker_holds_keeps_saving_until_released(fleet: SimCluster,
                                                                        tmp_path: Path) -> None:
    """Issue 29 item 2: acked, its drain held by the breaker, the example stopped saving:
    the steps trained until the release were lost. Now it knows the drain is held
    (`ckpt status`), keeps saving, and resumes after the release from a later step."""
    set_automation(fleet, "max_per_hour = 0\ncheckpoint_deadline_s = 300\n")  # every drain is held
    job, node = submit_training(fleet, tmp_path, steps=400, step_time=0.05)
    fleet.inject_xid(node, 0, 79, "GPU has fallen off the bus")
    wait_until(lambda: _output(fleet, job).count("after the ack") >= 2, 60, "two saves after the ack")
    out = _output(fleet, job)
    assert "checkpoint requested: slurmgpu: xid.recent GPU 0 XID 79" in out and \
        "(drain held by the circuit breaker; the job is requeued when an admin releases it)" in out, out
    acked_at = int(out.split("checkpoint saved at step ")[1].split()[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURMGPU_CHECKPOINT"))}
    status = subprocess.run([sys.executable, "-m", "slurmgpu", "ckpt", "status", "--job", job],
                            env={**env, "SLURMGPU_JOBS_DIR": str(fleet.jobs_dir(node))}, capture_output=True,
                            text=True, timeout=30, check=True).stdout
    assert "drain held by the circuit breaker; the job is requeued when an admin releases it" in status, status
    assert not drained(fleet, node)
    fleet._run([sys.executable, "-m", "slurmgpu", "breaker", "release", "--config", str(fleet.head_config)])
    wait_until(lambda: fleet.job(job).get("JobState") == "COMPLETED", 90, "the released job to finish")
    resumed = int(fleet.job_output(job).split("resumed from step ")[1].split()[0])
    assert resumed >= acked_at + 2 and resumed % 10 == 0, (acked_at, resumed)  # a save after the ack
