"""The demo's return-to-service part (steps 9 to 12): with ``[remediation]`` on, a transient
fault on the healthy node is drained, healed and validated back in its
``slurmgpu-rts-<node>`` reservation; a persistent one climbs GPU reset, reboot and the
repair ticket; then ``slurmgpu validations`` and the verdict quality."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurmgpu.collector.store import remediation as remediation_store
from slurmgpu.sim.cluster.render import slurmgpu_command
from slurmgpu.sim.demo import AUTOMATION, STEPS, Demo, Step, _final_state, ask_db
from slurmgpu.sim.scenario import load_scenario

HEALTHY, FAULT, SDC = "h100-sxm-8", "fault-ecc-dbe", "fault-sdc"
SDC_GPU = 3
#: The breaker wide open, a node resumed on its first healthy report, and the ladder's
#: shortest timeouts and no backoffs: the story in seconds, not hours.
RTS_SETTINGS = ("max_fraction = 1.0\nmax_per_hour = 100\nstorm_fraction = 1.0\nlemon_drains = 100\n"
                "resume_healthy_reports = 1\nresume_after_s = 0\n"
                "[remediation]\nenabled = true\nvalidation_timeout_s = 60\nreservation_s = 600\n"
                "validate_backoff_s = 0\nreset_backoff_s = 0\nreboot_backoff_s = 0\n"
                "reset_timeout_s = 30\nreboot_timeout_s = 60\n")
VALIDATIONS_COLUMNS = "node, trigger, verdict, reservation, outcome"


def reservation(node: str) -> str:
    return f"slurmgpu-rts-{node}"


def job_program(work: Path, demo: Demo) -> Path:
    """slurmgpu as the validation and reset jobs run it: with the simulated GPUs of the node
    the job landed on ($SLURMD_NODENAME), the GEMM test alone (fast)."""
    cases = "".join(f"  {node})\n" + "".join(f"    export {k}={shlex.quote(v)}\n"
                                            for k, v in demo.cluster.node_env(node).items()) + "    ;;\n"
                    for node in demo.cluster.nodes)
    script = work / "slurmgpu-on-node"
    script.write_text(f"#!/bin/sh\ncase \"$SLURMD_NODENAME\" in\n{cases}esac\n"
                      "if [ \"$1\" = validate ]; then set -- \"$@\" --tests gemm; fi\n"
                      f"exec {slurmgpu_command()} \"$@\"\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def repair_script(work: Path) -> Path:
    """The demo's repair_command: the ticket (stdin) into ``repair-ticket.json``."""
    ticket = shlex.quote(str(work / "repair-ticket.json"))
    script = work / "repair"
    script.write_text(f"#!/bin/sh\ncat > {ticket}.tmp && mv {ticket}.tmp {ticket}\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def ladder(demo: Demo, node: str) -> dict[str, Any] | None:
    """The node's open remediation ladder (None: none open)."""
    return (ask_db(demo.cluster.collector_db(), remediation_store.load_ladders) or {}).get(node)


def validations(demo: Demo, node: str, since: float) -> list[tuple[Any, ...]]:
    """(verdict, reservation, job id, duration) of the node's finished runs since ``since``."""
    rows = ask_db(demo.cluster.collector_db(), lambda db: remediation_store.validations(db, node)) or []
    return [(r.verdict, r.reservation, r.job_id, r.duration_s) for r in rows
            if r.started >= since and r.verdict is not None]


def reservations(demo: Demo) -> list[str]:
    out = demo.cluster.scontrol("-o", "show", "reservation")
    return sorted(w.split("=", 1)[1] for w in out.split() if w.startswith("ReservationName="))


def drained_with_ladder(demo: Demo, st: Step, node: str) -> bool:
    """Inject the ECC fault; the effect: drained for it, with its ladder open."""
    demo.cluster.inject(node, FAULT)
    reason = demo.wait(lambda: ladder(demo, node) and demo.drained(node))
    ok = bool(reason and "ecc." in reason)
    demo.effect(st, "drain", ok, f"{FAULT} on {node}: drained ({reason}), its ladder open"
                if ok else f"{node} not drained with a ladder ({reason or 'not drained'})")
    return ok


def step_remediation_on(demo: Demo) -> None:
    """Restart the collector with ``[remediation]`` on (its job program and repair script
    in the demo directory)."""
    c = demo.cluster
    with demo.step("remediation", "return to service: the collector with [remediation] on") as st:
        work = demo.dir / "demo"
        work.mkdir(parents=True, exist_ok=True)
        settings = (AUTOMATION + RTS_SETTINGS + f"job_program = {json.dumps(str(job_program(work, demo)))}\n"
                    f"repair_command = {json.dumps(str(repair_script(work)))}\n")
        c.set_automation(settings, timeout=max(demo.timeout, 15))
        on = "[remediation]" in (c.automation_settings() or "")
        demo.effect(st, "on", on, "collector restarted: a drained node now returns only after passing "
                                  "`slurmgpu validate` in a Slurm MAINT reservation; a failing one climbs "
                                  "reset -> reboot -> repair")


def step_transient(demo: Demo) -> None:
    """Drain, heal, a passing validation in the reservation, back in service."""
    node = demo.spare
    with demo.step("return", f"return to service: a transient fault on {node or '?'}") as st:
        if node is None or not drained_with_ladder(demo, st, node):
            return
        demo.cluster.inject(node, HEALTHY)
        demo.effect(st, "healed", True, f"{node} healed: its passive checks pass again")
        runs = demo.wait(lambda: validations(demo, node, st.started_wall - 1))
        verdict, res, job, took = runs[0] if runs else (None, None, None, None)
        demo.effect(st, "validation", verdict == "pass" and res == reservation(node),
                    f"validation job {job} ran in reservation {res} (resumed into it, no user job "
                    f"could land): {verdict} in {took or 0:.1f} s" if runs else "no validation ran")
        back = demo.wait(lambda: not reservations(demo) and ladder(demo, node) is None
                         and demo.cluster.node_states().get(node) == "idle", needs=st.ok)
        demo.effect(st, "released", bool(back), f"reservation deleted, {node} idle: back in service"
                    if back else f"{node} not back in service ({demo.cluster.node_states().get(node)})")
        job_id = demo.submit("back", "job after return", "", "-w", node, "--wrap", "true")
        state = _final_state(demo, job_id) if st.ok else "not run"
        demo.effect(st, "takes-jobs", state == "COMPLETED", f"{node} takes jobs again: job {job_id} {state}")


def step_persistent(demo: Demo) -> None:
    """Validation fails, reset, fails, reboot, fails, repair ticket."""
    node = demo.spare
    with demo.step("ladder", f"return to service: a persistent fault on {node or '?'} "
                             f"(GEMM wrong on GPU {SDC_GPU}, a reset does not clear it)") as st:
        if node is None or not drained_with_ladder(demo, st, node):
            return
        sdc = load_scenario(SDC)
        sdc["gpus"][SDC_GPU]["persistent"] = True
        demo.cluster.inject(node, sdc)
        demo.effect(st, "injected", True, f"{node}: passive checks pass, GPU {SDC_GPU} computes wrong results")
        _fails(demo, st, node, 1, "validation", "the validation in the reservation fails -> GPU reset")
        reset = demo.wait(lambda: _resets(demo, node), needs=st.ok)
        demo.effect(st, "reset", bool(reset), f"GPU reset job in the reservation reset GPU {SDC_GPU} "
                    f"(nvidia-smi -r, {reset} time)" if reset else f"GPU {SDC_GPU} was not reset")
        _fails(demo, st, node, 2, "revalidation", "validation after the reset fails again -> reboot")
        issued = demo.wait(lambda: (ladder(demo, node) or {}).get("stage") == "reboot" and "REBOOT_ISSUED"
                           in demo.cluster.scontrol("-o", "show", "node", node), needs=st.ok)
        demo.effect(st, "reboot", bool(issued), f"scontrol reboot ASAP nextstate=DOWN {node} issued; "
                    "the demo plays the boot" if issued else "no reboot issued")
        if issued:
            demo.cluster.boot(node)
        _fails(demo, st, node, 3, "after-reboot", "validation after the reboot fails -> repair hand-off")
        ticket = demo.wait(lambda: _ticket(demo, node), needs=st.ok)
        demo.effect(st, "repair", bool(ticket), _ticket_line(demo, node, ticket) if ticket
                    else "no repair ticket written")


def _fails(demo: Demo, st: Step, node: str, n: int, name: str, what: str) -> None:
    runs = demo.wait(lambda: [r for r in validations(demo, node, st.started_wall - 1)
                              if r[0] == "fail"][n - 1:], needs=st.ok)
    demo.effect(st, name, bool(runs), f"{what} (job {runs[0][2]})" if runs else f"no failing validation #{n}")


def _resets(demo: Demo, node: str) -> int:
    scenario = json.loads(demo.cluster.scenario_path(node).read_text(encoding="utf-8"))
    return int(scenario["gpus"][SDC_GPU].get("resets", 0))


def _ticket(demo: Demo, node: str) -> dict[str, Any] | None:
    path = demo.dir / "demo" / "repair-ticket.json"
    if ladder(demo, node) is not None or not path.is_file():
        return None
    ticket: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return ticket if ticket.get("node") == node else None


def _ticket_line(demo: Demo, node: str, ticket: dict[str, Any]) -> str:
    serials = ",".join(str(g.get("serial")) for g in ticket.get("gpus", [])[:2])
    return (f"repair ticket {demo.dir / 'demo' / 'repair-ticket.json'}: {ticket.get('schema')}, node "
            f"{ticket['node']}, reason {ticket.get('reason')!r}, remedies {ticket['ladder']['remedies']}, "
            f"validations {[v['verdict'] for v in ticket.get('validations', [])]}, "
            f"{len(ticket.get('gpus', []))} GPUs (serials {serials}, ...); {node} stays drained")


def step_validations(demo: Demo) -> None:
    """`slurmgpu validations`: the history of the runs above."""
    with demo.step("validations", "validations: slurmgpu validations") as st:
        env = {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"}, **demo.cluster.env()}
        out = subprocess.run([sys.executable, "-m", "slurmgpu", "validations", "--config",
                              str(demo.cluster.head_config)], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        for line in out.stdout.splitlines():
            demo.say(f"    {line}")
        ok = out.returncode == 0 and reservation(demo.spare or "?") in out.stdout
        demo.effect(st, "table", ok, f"{len(out.stdout.splitlines()) - 1} run(s) listed, each with its "
                    "trigger, verdict, reservation and outcome" if ok else
                    f"slurmgpu validations: exit {out.returncode}: {out.stderr.strip()[-200:]}")
        rows = _verdict_quality(demo, st.started_wall - 3600)
        demo.effect(st, "verdict-quality", bool(rows), "verdict quality (the report's verdict_quality, "
                    f"/metrics' slurmgpu_drain_outcomes): {'; '.join(rows)}" if rows else "no drain outcomes")


def _verdict_quality(demo: Demo, since: float) -> list[str]:
    from slurmgpu.report.model.remediation import OUTCOMES, verdict_quality

    found = ask_db(demo.cluster.collector_db(), lambda db: verdict_quality(db, since, time.time()))
    return [f"{r['check']}: {r['drains']} drain(s), " + ", ".join(f"{r[o]} {o}" for o in OUTCOMES if r[o])
            for r in (found or {}).get("checks", [])]


RTS_STEPS = (step_remediation_on, step_transient, step_persistent, step_validations)
#: The whole demo: the first eight steps (slurmgpu.sim.demo), then these.
ALL_STEPS = (*STEPS, *RTS_STEPS)
