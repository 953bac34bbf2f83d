"""Fleet automation end to end on the real Slurm mini-cluster: 2 nodes x 8 simulated GPUs,
an agent per node, the collector with ``[automation]`` on (``fleet.set_automation``), real
sbatch jobs, real scancel/scontrol. Run with `pytest -m slurm`."""

from __future__ import annotations

import json
import shlex
import sys
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


def timeline(fleet: SimCluster, job_id: str) -> list[str]:
    return [k for (k,) in query(fleet, "SELECT kind FROM job_events WHERE job_id = ? ORDER BY ts, id",
                                job_id)]


def reason(fleet: SimCluster, node: str) -> str:
    return fleet.node_reasons().get(node, "")


def drained(fleet: SimCluster, node: str) -> bool:
    return "drain" in fleet.node_states().get(node, "")


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
    state = fleet.wait_job(job, ("RUNNING",), timeout=30)
    assert state == "RUNNING", fleet.job(job)
    node = fleet.job(job)["NodeList"]
    # A signal before the script set up its handler would kill it.
    ready = "starting fresh" if ack else "trap set"
    wait_until(lambda: ready in _output(fleet, job), 20, "the job to be ready for signals")
    return job, node


def _output(fleet: SimCluster, job: str) -> str:
    try:
        return fleet.job_output(job)
    except Exception:
        return ""


def test_job_acks_is_requeued_and_resumes_from_its_checkpoint(fleet: SimCluster, tmp_path: Path) -> None:
    fleet.set_automation(OPEN_BREAKER + "checkpoint_deadline_s = 60\n")
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
    fleet.set_automation(OPEN_BREAKER + "checkpoint_deadline_s = 4\n")
    job, node = submit_training(fleet, tmp_path, ack=False)
    fleet.inject_xid(node, 2, 79)
    wait_until(lambda: "signalled" in timeline(fleet, job), 15, "the signal")
    signalled = time.monotonic()
    assert not drained(fleet, node)  # waiting for the ack
    wait_until(lambda: drained(fleet, node), 20, "the drain at the deadline")
    assert time.monotonic() - signalled >= 2.5
    wait_until(lambda: "requeued" in timeline(fleet, job), 10, "the requeue")
    kinds = timeline(fleet, job)
    assert "acked" not in kinds and kinds.index("deadline") < kinds.index("drained")
    assert "got USR1, ignoring" in _output(fleet, job) or int(fleet.job(job).get("Restarts", "0")) >= 1


def test_collector_restart_mid_checkpoint_keeps_the_timeline(fleet: SimCluster, tmp_path: Path) -> None:
    fleet.set_automation(OPEN_BREAKER + "checkpoint_deadline_s = 6\n")
    job, node = submit_training(fleet, tmp_path, ack=False)
    fleet.inject_xid(node, 1, 79)
    wait_until(lambda: "signalled" in timeline(fleet, job), 15, "the signal")
    fleet.kill_collector()  # SIGKILL, mid-checkpoint
    fleet.start_collector()
    wait_until(lambda: drained(fleet, node), 25, "the drain at the deadline after the restart")
    wait_until(lambda: "requeued" in timeline(fleet, job), 10, "the requeue")
    kinds = timeline(fleet, job)
    assert kinds.count("signalled") == 1, kinds  # not signalled again after the restart
    assert kinds.index("deadline") < kinds.index("drained") < kinds.index("requeued")


def test_bad_pin_on_every_node_trips_the_breaker(fleet: SimCluster) -> None:
    # 2 nodes, at most 10 % drained (at least 1): the second failing node trips the breaker.
    fleet.set_automation("max_fraction = 0.1\nstorm_fraction = 0.5\n")
    fleet.write_config(fleet.default_config().replace('driver = ["550.90.07"]', 'driver = ["999.1"]'))
    for node in NODES:
        fleet.restart_agent(node)
    wait_until(lambda: query(fleet, "SELECT count(*) FROM decisions WHERE held = 1")[0][0] >= 1, 20,
             "a held drain")
    time.sleep(3)  # more reports: still no second drain
    states = [drained(fleet, n) for n in NODES]
    assert states.count(True) <= 1, fleet.node_states()
    out = fleet._run([sys.executable, "-m", "slurmgpu", "breaker", "status", "--json",
                      "--config", str(fleet.dir / "etc" / "collector.toml")])
    status = json.loads(out)
    assert status["breaker_open"] and "pin.driver" in status["why"]


def test_auto_resume_after_recovery_not_before(fleet: SimCluster) -> None:
    fleet.set_automation(OPEN_BREAKER + "resume_healthy_reports = 2\nresume_after_s = 6\n")
    node = "gpu-n1"
    fleet.inject(node, "fault-ecc-dbe")  # uncorrected ECC: drain
    wait_until(lambda: drained(fleet, node), 20, "the drain")
    fleet.inject(node, "h100-sxm-8")
    healthy = wait_until(lambda: query(fleet, "SELECT min(ts) FROM report_history WHERE node = ? "
                                     "AND verdict = 'OK' AND ts > ?", node, time.time() - 1)[0][0]
                       or None, 20, "a healthy report")
    time.sleep(3)
    assert drained(fleet, node), "resumed before resume_after_s"
    wait_until(lambda: not drained(fleet, node), 20, "the auto-resume")
    assert time.time() - healthy >= 5.5


def test_lemon_stays_drained(fleet: SimCluster) -> None:
    fleet.set_automation(OPEN_BREAKER + "resume_healthy_reports = 1\nresume_after_s = 0\n"
                         "lemon_drains = 2\n")
    node = "gpu-n2"
    for round_ in range(2):
        fleet.inject(node, "fault-ecc-dbe")
        wait_until(lambda: drained(fleet, node), 20, f"drain {round_ + 1}")
        fleet.inject(node, "h100-sxm-8")
        if round_ == 0:
            wait_until(lambda: not drained(fleet, node), 20, "the first auto-resume")
    time.sleep(6)  # three healthy reports
    assert drained(fleet, node), "a lemon was resumed"
    lemons = {n for (n,) in query(fleet, "SELECT node FROM automation_lemons")}  # the collector's state
    assert node in lemons


def test_operator_drain_is_never_resumed(fleet: SimCluster) -> None:
    fleet.set_automation(OPEN_BREAKER + "resume_healthy_reports = 1\nresume_after_s = 0\n")
    node = "gpu-n1"
    fleet.scontrol("update", f"nodename={node}", "state=drain", "reason=disk swap, ticket 42")
    fleet.inject(node, "fault-ecc-dbe")
    # (wait for the FAIL to be handled, not a fixed time: the automation keeps the drain)
    wait_until(lambda: ("operator-drain-kept",) in query(fleet, "SELECT result FROM decisions WHERE node = ?",
                                                          node), 30, "the FAIL report handled")
    fleet.inject(node, "h100-sxm-8")
    time.sleep(6)  # healthy reports that must not resume it (resume_healthy_reports = 1)
    assert drained(fleet, node) and reason(fleet, node) == "disk swap, ticket 42"
    results = [r for (r,) in query(fleet, "SELECT result FROM decisions WHERE node = ?", node)]
    assert "operator-drain-kept" in results and "resumed" not in results
    # The collector's Slurm poll recorded who drained it, for the fleet report.
    assert ("drained", "disk swap, ticket 42", "root") in query(
        fleet, "SELECT kind, reason, actor FROM node_states WHERE node = ?", node)


def test_prolog_blocked_job_is_reported(fleet: SimCluster) -> None:
    node = "gpu-n2"
    fleet.inject(node, "fault-row-remap-failure")
    job = fleet.sbatch("", "-w", node, "--gres=gpu:8", "-o", "/dev/null", "--wrap", "true")
    rows = wait_until(lambda: query(fleet, "SELECT node, body FROM events WHERE kind = 'prolog_blocked'"),
                      30, "the prolog_blocked event")
    body = msgpack.unpackb(rows[0][1], raw=False)
    assert rows[0][0] == node and body["job_id"] == job
    assert any("mem.row_remap" in p for p in body["problems"])


def test_dry_run_changes_nothing_in_slurm(fleet: SimCluster) -> None:
    fleet.set_automation(OPEN_BREAKER + "dry_run = true\n")
    node = "gpu-n2"
    fleet.inject(node, "fault-ecc-dbe")
    wait_until(lambda: query(fleet, "SELECT count(*) FROM decisions WHERE node = ? AND dry_run = 1",
                           node)[0][0], 20, "a dry-run decision")
    time.sleep(2)
    assert not drained(fleet, node) and reason(fleet, node) in ("", "none")


def test_reboot_action_when_allowed(fleet: SimCluster) -> None:
    fleet.set_automation(OPEN_BREAKER + 'reboot_allowed = true\n[automation.policy]\n'
                         '"ecc.uncorrected" = "reboot"\n')
    node = "gpu-n1"
    fleet.inject(node, "fault-ecc-dbe")
    wait_until(lambda: query(fleet, "SELECT result FROM decisions WHERE node = ? AND action = 'reboot'",
                             node), 20, "the reboot decision")
    assert query(fleet, "SELECT result FROM decisions WHERE node = ? AND action = 'reboot'",
                 node)[0][0] == "reboot-requested"
    line = fleet.scontrol("show", "node", "-o", node)
    assert "REBOOT" in line and "Reason=slurmgpu: ecc.uncorrected" in line, line
