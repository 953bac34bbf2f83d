"""Return to service end to end on the real Slurm mini-cluster: the collector (with
``[automation]`` and ``[remediation]`` on) and an agent per node, real reservations, real
``slurmgpu validate`` and ``slurmgpu remediate reset`` jobs in them, ``scontrol reboot``
(``cluster.boot`` plays the boot) and a real repair command. Run with `pytest -m slurm`."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.sim.cluster import SimCluster
from slurmgpu.sim.cluster.render import slurmgpu_command
from slurmgpu.sim.scenario import load_scenario
from tests.agenthelpers import query_db
from tests.agenthelpers import wait_until as _wait_until
from tests.test_checkpoint_e2e import NODES, OPEN_BREAKER, drained, reason, set_automation

pytestmark = pytest.mark.slurm

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "docs" / "repair-ticket.schema.json"


def wait_until(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    return _wait_until(predicate, timeout, what, interval=0.2)


def query(fleet: SimCluster, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return query_db(fleet.collector_db(), sql, *params)


def job_program(fleet: SimCluster, tmp_path: Path) -> Path:
    """slurmgpu as the validation and reset jobs run it: with the simulated GPUs of the
    node the job landed on ($SLURMD_NODENAME), the GEMM test alone (fast), a pause
    while ``hold`` exists (a test's window to act mid-validation), and its output thrown
    away while ``no-output`` exists (a head node that does not share the nodes' files)."""
    cases = "".join(f"  {node})\n" + "".join(f"    export {k}={shlex.quote(v)}\n"
                                            for k, v in fleet.node_env(node).items()) + "    ;;\n"
                    for node in NODES)
    script = tmp_path / "slurmgpu-on-node"
    script.write_text(f"#!/bin/sh\ncase \"$SLURMD_NODENAME\" in\n{cases}esac\n"
                      f"if [ \"$1\" = validate ]; then\n"
                      f"  while [ -e {shlex.quote(str(tmp_path / 'hold'))} ]; do sleep 0.2; done\n"
                      f"  set -- \"$@\" --tests gemm\nfi\n"
                      f"if [ -e {shlex.quote(str(tmp_path / 'no-output'))} ]; then\n"
                      f"  exec {slurmgpu_command()} \"$@\" > /dev/null\nfi\n"
                      f"exec {slurmgpu_command()} \"$@\"\n")
    script.chmod(0o755)
    tmp_path.chmod(0o755)
    return script


def repair_script(tmp_path: Path) -> Path:
    script = tmp_path / "repair"
    script.write_text(f"#!/bin/sh\ncat >> {shlex.quote(str(tmp_path / 'tickets'))}\necho >> "
                      f"{shlex.quote(str(tmp_path / 'tickets'))}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def remediation(fleet: SimCluster, tmp_path: Path) -> None:
    set_automation(fleet, OPEN_BREAKER + "resume_healthy_reports = 1\nresume_after_s = 0\n"
                   "[remediation]\nenabled = true\nvalidation_timeout_s = 120\nreservation_s = 600\n"
                   "validate_backoff_s = 0\nreset_backoff_s = 0\nreboot_backoff_s = 0\n"
                   "reset_timeout_s = 60\nreboot_timeout_s = 120\n"
                   f"job_program = {json.dumps(str(job_program(fleet, tmp_path)))}\n"
                   f"repair_command = {json.dumps(str(repair_script(tmp_path)))}\n")


def ladder(fleet: SimCluster, node: str) -> dict[str, Any] | None:
    rows = query(fleet, "SELECT state FROM remediation_ladders WHERE node = ?", node)
    return json.loads(rows[0][0]) if rows else None


def reservations(fleet: SimCluster) -> list[str]:
    out = fleet.scontrol("-o", "show", "reservation")
    return sorted(w.split("=", 1)[1] for w in out.split() if w.startswith("ReservationName="))


def active_jobs(fleet: SimCluster) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env={**os.environ, **fleet.env()},
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def verdict_quality(fleet: SimCluster) -> dict[str, dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "slurmgpu", "report", "--format", "json", "--config",
                          str(fleet.head_config)], env={**os.environ, **fleet.env()}, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    found = _find(json.loads(out), "verdict_quality")
    return {row["check"]: row for row in found["checks"]}


def _find(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for item in doc:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def added(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], key: str) -> dict[str, int]:
    return {c: row[key] - before.get(c, {}).get(key, 0) for c, row in after.items()
            if row[key] != before.get(c, {}).get(key, 0)}


def drained_with_a_ladder(fleet: SimCluster, tmp_path: Path, node: str) -> dict[str, dict[str, Any]]:
    """The collector with [remediation] on, ``node`` drained for an uncorrected ECC error
    and its ladder open; the report's verdict_quality from before."""
    remediation(fleet, tmp_path)
    before = verdict_quality(fleet)
    fleet.inject(node, "fault-ecc-dbe")
    wait_until(lambda: drained(fleet, node) and ladder(fleet, node), 30, "the drain and its ladder")
    return before


def test_a_transient_fault_returns_only_after_a_passing_validation_in_the_reservation(
        fleet: SimCluster, tmp_path: Path) -> None:
    node = "gpu-n1"
    before = drained_with_a_ladder(fleet, tmp_path, node)
    users_job = fleet.sbatch("", "-w", node, "-o", "/dev/null", "--wrap", "true")
    (tmp_path / "hold").touch()
    fleet.inject(node, "h100-sxm-8")  # healed: the passive checks pass
    wait_until(lambda: (ladder(fleet, node) or {}).get("job_id"), 60, "the validation job")
    assert reservations(fleet) == [f"slurmgpu-rts-{node}"]
    assert not drained(fleet, node)  # resumed, into the reservation
    wait_until(lambda: "reserved" in fleet.job(users_job)["Reason"].lower(), 30, "the job held off by the reservation")
    assert fleet.job(users_job)["JobState"] == "PENDING"
    (tmp_path / "hold").unlink()
    assert fleet.wait_job(users_job, timeout=90) == "COMPLETED"
    [(verdict, res, finished)] = query(fleet, "SELECT verdict, reservation, started + duration_s "
                                              "FROM validations WHERE node = ?", node)
    assert (verdict, res) == ("pass", f"slurmgpu-rts-{node}")
    started = datetime.fromisoformat(fleet.job(users_job)["StartTime"]).timestamp()
    assert started >= int(finished), "the user's job started before the validation passed"
    assert reservations(fleet) == [] and ladder(fleet, node) is None
    outcomes = query(fleet, "SELECT check_id, outcome FROM drain_outcomes WHERE node = ?", node)
    assert {o for _, o in outcomes} == {"cleared_by_validation"}
    after = verdict_quality(fleet)
    checks = {c for c, _ in outcomes}
    assert added(before, after, "drains") == dict.fromkeys(checks, 1)
    assert added(before, after, "cleared_by_validation") == dict.fromkeys(checks, 1)
    assert added(before, after, "confirmed") == {}


def test_a_persistent_fault_climbs_to_repair_and_a_restart_mid_ladder_resumes_it(
        fleet: SimCluster, tmp_path: Path) -> None:
    node = "gpu-n2"
    before = drained_with_a_ladder(fleet, tmp_path, node)
    sdc = load_scenario("fault-sdc")
    sdc["gpus"][3]["persistent"] = True  # broken hardware: a reset clears nothing
    (tmp_path / "hold").touch()
    fleet.inject(node, sdc)  # the passive checks pass, GEMM on GPU 3 is wrong
    first = wait_until(lambda: (ladder(fleet, node) or {}).get("job_id"), 60, "the first validation job")
    # (e) the collector dies mid-validation and starts again
    fleet.kill_collector()
    fleet.start_collector()
    wait_until(lambda: "restart" in [h["event"] for h in (ladder(fleet, node) or {}).get("history", [])], 30,
               "the ladder taken over")
    second = wait_until(lambda: (ladder(fleet, node) or {}).get("job_id"), 60, "the validation again")
    assert second != first  # (not the cancelled one, still COMPLETING for a moment)
    wait_until(lambda: first not in active_jobs(fleet), 30, "the cancelled validation gone")
    assert reservations(fleet) == [f"slurmgpu-rts-{node}"]
    assert list(active_jobs(fleet).values()) == [f"slurmgpu-validate-{node}"]
    (tmp_path / "hold").unlink()
    # (b) fails, reset, fails, reboot (played by cluster.boot), fails, repair
    wait_until(lambda: (ladder(fleet, node) or {}).get("stage") == "reboot" and
               "REBOOT_ISSUED" in fleet.scontrol("-o", "show", "node", node), 120, "the reboot issued")
    assert reservations(fleet) == [f"slurmgpu-rts-{node}"]  # made before the reboot, kept through the boot
    users_job = fleet.sbatch("", "-w", node, "-o", "/dev/null", "--wrap", "true")
    (tmp_path / "no-output").touch()  # the last validation's findings come through the agent
    fleet.boot(node)  # (25.11, ReturnToService=2: IDLE on registration, within the second)
    # (the ladder is saved, closed, before its repair command runs: the ticket comes a moment later)
    tickets = tmp_path / "tickets"
    wait_until(lambda: ladder(fleet, node) is None and tickets.is_file() and tickets.read_text().endswith("\n"),
               120, "the repair hand-off")
    assert drained(fleet, node) and reason(fleet, node).startswith("slurmgpu: repair (tried: reset, reboot)")
    [text] = [t for t in tickets.read_text().split("\n") if t.strip()]  # called once
    ticket = json.loads(text)
    assert check_ticket(ticket)["node"] == node and ticket["ladder"]["remedies"] == ["reset", "reboot"]
    assert [v["verdict"] for v in ticket["validations"]] == ["cancelled", "fail", "fail", "fail"]
    for run in ticket["validations"][1:]:  # from the job's output, then (the last) from its event
        assert {(f["check"], f["gpu"]) for f in run["findings"]} == {("validate.gemm", 3)}, run
    scenario = json.loads(fleet.scenario_path(node).read_text())
    assert scenario["gpus"][3]["resets"] == 1  # the reset job ran nvidia-smi -r on GPU 3, once
    assert {g["serial"] for g in ticket["gpus"]} and all(g["uuid"] for g in ticket["gpus"])
    assert fleet.job(users_job)["JobState"] == "PENDING"  # never on the rebooted, unvalidated node
    subprocess.run(["scancel", users_job], env={**os.environ, **fleet.env()}, timeout=30, check=True)
    wait_until(lambda: users_job not in active_jobs(fleet), 30, "the user's job cancelled")
    assert reservations(fleet) == [] and active_jobs(fleet) == {}
    # (d) the report counts the drain as confirmed
    checks = {c for (c,) in query(fleet, "SELECT check_id FROM drain_outcomes WHERE node = ?", node)}
    after = verdict_quality(fleet)
    assert added(before, after, "confirmed") == dict.fromkeys(checks, 1)
    assert added(before, after, "cleared_by_validation") == {}


def check_ticket(ticket: dict[str, Any]) -> dict[str, Any]:
    try:
        import jsonschema
    except ImportError:
        assert {"schema", "schema_version", "node", "reason", "gpus", "findings", "ladder", "validations"} <= set(ticket)
        return ticket
    jsonschema.validate(ticket, json.loads(SCHEMA_FILE.read_text()))
    return ticket
