"""`slurmgpu demo`: the whole product on one machine, in about a minute.

A 4-node Slurm mini-cluster (``slurmgpu.sim.cluster``: 8 simulated H100s per node, one
agent per node, the collector with ``[automation]`` on) runs real jobs while faults are
injected live, and every effect slurmgpu should have is waited for (bounded) and narrated
with the seconds since its step began:

Design notes: docs/design-notes.md (``slurmgpu/sim/demo.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from slurmgpu.collector.store import queries
from slurmgpu.decision import Action
from slurmgpu.errors import SlurmGpuError
from slurmgpu.result import Severity
from slurmgpu.sim.cluster import (
    DEFAULT_SCENARIO,
    DEMO_DIR,
    STATE_FILE,
    SimCluster,
    node_names,
    repo_root,
)

DEFAULT_DIR = DEMO_DIR
NODES = 4
GPUS = 8
#: The longest any one wait may take by default (seconds); `--timeout`.
DEFAULT_TIMEOUT_S = 30.0
#: What the demo promises on a 2-core machine (printed next to the total).
BUDGET_S = 240.0
EXIT_OK, EXIT_MISSING = 0, 1
EXAMPLE = repo_root() / "examples" / "train_with_checkpoint.py"
#: The munge socket's path must fit in sockaddr_un (108 bytes, NUL included).
_SOCKET_TAIL = "/munge/munge.socket.2"
_SUN_PATH_MAX = 107

# Roles: the trainer runs on XID_NODE or SPARE (whichever Slurm picks: it is kept off the
# other two), the XID hits it there, and it resumes on the other one.
REMAP_NODE, DRIVER_NODE = "gpu-n2", "gpu-n3"
REMAP_SCENARIO, REMAP_GPU = "fault-row-remap-pending", 2
DRIVER_SCENARIO = "fault-wrong-driver"
XID, XID_GPU, XID_TEXT = 79, 0, "GPU has fallen off the bus"
#: Automation as `sim cluster up --automation` (the breaker's defaults: at most 2 of the
#: 4 nodes drained by the automation), with a short checkpoint deadline so that a job that
#: never acks still ends the step in bounded time.
AUTOMATION = "checkpoint_deadline_s = 30\n"
#: The trainer: ~0.1 s steps; long enough to still run on the spare node when the job
#: refused by the prolog is submitted (so that job can only land on the bad node).
TRAIN_STEPS, TRAIN_STEP_S = 300, 0.1
POLL_S = 0.1
#: Node states the summary table waits for (briefly) after the last job.
SETTLED = frozenset({"idle", "drained", "mixed", "allocated", "down", "down*"})

T = TypeVar("T")


class DemoError(SlurmGpuError):
    """The demo cannot run here (not root, no Slurm, a bad --dir): one line, exit 3."""


# ------------------------------------------------------------------------- results


@dataclass
class Effect:
    """One thing slurmgpu should have done, and whether (and when) it was seen."""

    name: str
    ok: bool
    detail: str
    at_s: float | None = None  # seconds since the step began

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail,
                "at_s": None if self.at_s is None else round(self.at_s, 2)}


@dataclass
class Step:
    name: str
    title: str
    effects: list[Effect] = field(default_factory=list)
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.effects)

    def since(self, wall_ts: float | None = None) -> float:
        """Seconds since the step began: now, or at the wall-clock time ``wall_ts``."""
        if wall_ts is None:
            return time.monotonic() - self.started
        return max(0.0, wall_ts - self.started_wall)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "ok": self.ok,
                "seconds": round(self.seconds, 2), "effects": [e.to_json() for e in self.effects]}


@dataclass
class DemoResult:
    dir: str
    steps: list[Step]
    total_s: float = 0.0
    fresh: bool = False
    report: str | None = None
    report_summary: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, str]] = field(default_factory=list)
    jobs: list[dict[str, str]] = field(default_factory=list)
    breaker: dict[str, Any] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        """``step/effect`` for every expected effect that was not observed."""
        return [f"{s.name}/{e.name}" for s in self.steps for e in s.effects if not e.ok]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if not self.missing else EXIT_MISSING

    @property
    def teardown(self) -> str:
        return f"slurmgpu sim cluster down --dir {shlex.quote(self.dir)}"

    @property
    def explore(self) -> str:
        return f'eval "$(slurmgpu sim cluster env --dir {shlex.quote(self.dir)})"'

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.missing, "exit_code": self.exit_code, "dir": self.dir,
            "fresh_cluster": self.fresh, "total_s": round(self.total_s, 2), "budget_s": BUDGET_S,
            "steps": [s.to_json() for s in self.steps], "missing": self.missing,
            "nodes": self.nodes, "jobs": self.jobs, "breaker": self.breaker,
            "report": self.report, "report_summary": self.report_summary,
            "teardown": self.teardown, "explore": self.explore,
        }


# ------------------------------------------------------------------------- the run


class Demo:
    """One run: the cluster, the narration, what each step found out for the next ones."""

    def __init__(self, directory: Path, timeout: float = DEFAULT_TIMEOUT_S,
                 say: Callable[[str], None] | None = None) -> None:
        self.dir = directory.expanduser().absolute()
        self.timeout = timeout
        self.say = say or (lambda line: None)
        self.cluster = SimCluster(self.dir)
        self.result = DemoResult(dir=str(self.dir), steps=[])
        self.jobs: dict[str, str] = {}  # label -> Slurm job id
        self.labels: dict[str, str] = {}  # job id -> what it is
        self.xid_node: str | None = None  # where the trainer first ran
        self.spare: str | None = None  # the node left healthy: where jobs end up
        self.saved_step: int | None = None
        self.aborted = False  # the cluster is not there: the other steps cannot run

    # ---- narration and bookkeeping

    @contextlib.contextmanager
    def step(self, name: str, title: str) -> Iterator[Step]:
        step = Step(name, title)
        self.result.steps.append(step)
        self.say(f"[{len(self.result.steps)}] {title}")
        try:
            yield step
        except Exception as exc:  # the step stops here, recorded; the demo goes on (exit 1)
            self.effect(step, "error", False, f"{type(exc).__name__}: {_one_line(exc)}")
        finally:
            step.seconds = step.since()

    def effect(self, step: Step, name: str, ok: bool, detail: str,
               wall_ts: float | None = None) -> Effect:
        """Record (and print) one effect; ``wall_ts`` when it happened (default: now)."""
        eff = Effect(name, ok, detail, step.since(wall_ts))
        step.effects.append(eff)
        mark = "" if ok else "NOT OBSERVED: "
        self.say(f"  {eff.at_s:6.1f} s  {mark}{detail}")
        return eff

    def wait(self, predicate: Callable[[], T | None], timeout: float | None = None, *,
             needs: bool = True) -> T | None:
        """Poll ``predicate`` until it returns something truthy; None after the timeout
        (``--timeout`` by default). ``needs``: what this effect follows from was observed;
        when it was not, look once instead of waiting out the timeout for nothing.
        Errors while polling (a busy slurmctld, a locked database) count as "not yet"."""
        if not needs:
            timeout = 0.0
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            with contextlib.suppress(SlurmGpuError, OSError, sqlite3.Error, ValueError):
                value = predicate()
                if value:
                    return value
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    # ---- small readers

    def job_events(self, job: str, kind: str) -> tuple[float, str, str] | None:
        """(ts, node, detail) of the job's first ``kind`` event in the collector's timeline."""
        row = ask_db(self.cluster.collector_db(), lambda db: queries.first_job_event(db, job, kind))
        return (row["ts"], str(row["node"] or ""), str(row["detail"] or "")) if row else None

    def decision(self, node: str, since: float, *,
                 held: bool | None = None) -> dict[str, Any] | None:
        """The automation's first decision about ``node`` at or after ``since``."""
        rows = ask_db(self.cluster.collector_db(), lambda db: queries.decisions_since(db, node, since))
        for d in rows or ():
            if held is not None and d["held"] != held:
                continue
            return {"time": float(d["time"]), "action": d["action"], "reason": d["reason"] or "",
                    "held": d["held"], "trigger": d["trigger"] or "", "result": d["result"] or ""}
        return None

    def drained(self, node: str) -> str | None:
        """The node's drain reason once sinfo says it is drained (or draining)."""
        state = self.cluster.node_states().get(node, "")
        if "drain" not in state:
            return None
        return self.cluster.node_reasons().get(node) or "(no reason)"

    def output(self, job: str) -> str:
        try:
            return self.cluster.job_output(job)
        except SlurmGpuError:
            return ""

    def gate_record(self, node: str, job: str, phase: str = "prolog") -> dict[str, Any] | None:
        path = self.cluster.state_dir(node) / "gate.jsonl"
        if not path.exists():
            return None
        found = None
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("phase") == phase and str(record.get("job")) == job:
                    found = record
        return found

    def submit(self, label: str, what: str, script: str, *args: str) -> str:
        job = self.cluster.sbatch(script, "-J", f"demo-{label}", *args)
        self.jobs[label] = job
        self.labels[job] = what
        return job


# ------------------------------------------------------------------------- the steps


def step_cluster(demo: Demo) -> None:
    """Bring the cluster up (installing Slurm if needed) or reuse it after a reset; turn
    the automation on."""
    c = demo.cluster
    with demo.step("cluster", f"cluster: {NODES} nodes x {GPUS} simulated H100s, an agent per "
                              f"node, the collector with automation on, in {demo.dir}") as st:
        demo.result.fresh = fresh = not c.is_up()
        c.up(nodes=NODES, gpus=GPUS, scenario=DEFAULT_SCENARIO, agents=True,
             timeout=max(demo.timeout, 60))
        if not fresh:
            c.reset(timeout=demo.timeout)  # cancels jobs, healthy GPUs, nodes resumed
        c.set_automation(AUTOMATION)
        work = demo.dir / "demo"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        status = c.status()
        agents = sum(1 for n in status["nodes"] if n.get("agent_running"))
        up = bool(status["up"]) and agents == NODES and status["collector"]["running"]
        how = "brought up" if fresh else "reused and reset (jobs cancelled, GPUs healthy, nodes resumed)"
        demo.effect(st, "up", up, f"cluster {how}: Slurm {status['slurm_version']}, "
                                  f"{agents} agents + collector at {status['collector']['address']}")
        settings = c.automation_settings()
        demo.effect(st, "automation", settings is not None and "dry_run" not in settings,
                    "automation on (not a dry run): drains, checkpoint requests, circuit breaker")
    demo.aborted = not demo.result.steps[-1].ok


def step_jobs(demo: Demo) -> None:
    """Two GPU jobs that run to completion, and the checkpointing trainer."""
    c = demo.cluster
    with demo.step("jobs", "jobs: two GPU jobs, and a training job that checkpoints "
                           "when slurmgpu asks") as st:
        wrap = 'echo "GPUs $CUDA_VISIBLE_DEVICES on $SLURMD_NODENAME"'
        plain = [demo.submit(f"gpu{n}", f"{n}-GPU job", "", f"--gres=gpu:{n}", "--wrap", wrap)
                 for n in (2, 4)]
        if not EXAMPLE.is_file():
            demo.effect(st, "trainer", False, f"no {EXAMPLE} (the demo needs a source checkout)")
            return
        ckpt = demo.dir / "demo" / "train-ckpt.json"
        train = demo.submit("train", "checkpointing trainer", _training_script(ckpt), "--requeue",
                            "--gres=gpu:1", "-N1", "--open-mode=append",
                            "-x", f"{REMAP_NODE},{DRIVER_NODE}")
        for job in plain:
            state = _final_state(demo, job)
            out = demo.output(job).strip().splitlines()
            record = demo.gate_record(c.job(job).get("NodeList", ""), job) or {}
            gate = f"; prolog {record.get('verdict', '?')} via the {record.get('path', 'full')} path" \
                if record else ""
            demo.effect(st, f"job-{job}", state == "COMPLETED",
                        f"{demo.labels[job]} {job}: {state}, {out[-1] if out else 'no output'}{gate}")
        running = demo.wait(lambda: c.job(train).get("JobState") == "RUNNING"
                            and "starting fresh" in demo.output(train))
        node = c.job(train).get("NodeList", "") if running else ""
        time.sleep(1.0)  # let it train a few steps, so that there is something to save
        if node:
            demo.xid_node = node
            demo.spare = next(n for n in node_names(NODES)
                              if n not in (node, REMAP_NODE, DRIVER_NODE))
        demo.effect(st, "trainer", bool(node),
                    f"checkpointing trainer {train} is training on {node} (1 GPU, "
                    f"{TRAIN_STEPS} steps)" if node else
                    f"checkpointing trainer {train} did not start: {c.job(train).get('JobState')}")


def step_xid(demo: Demo) -> None:
    """XID 79 under the trainer: drain-now -> signal -> ack -> drain -> requeue -> resume."""
    c, node, job = demo.cluster, demo.xid_node, demo.jobs.get("train")
    with demo.step("xid", f"fault: XID {XID} ({XID_TEXT}) on {node or '?'} GPU {XID_GPU}, "
                          "under the checkpointing job") as st:
        if node is None or job is None:
            demo.effect(st, "trainer", False, "no checkpointing job running: nothing to signal")
            return
        c.inject_xid(node, XID_GPU, XID, XID_TEXT)
        demo.effect(st, "injected", True, f"XID {XID} in {node}'s kernel log and as an NVML event")
        decided = demo.wait(lambda: demo.decision(node, st.started_wall - 1))
        demo.effect(st, "decision", bool(decided and decided["action"] == Action.DRAIN_NOW),
                    f"agent -> collector: automation decides {decided['action']} "
                    f"({decided['trigger']}): the node must go, its jobs first checkpoint"
                    if decided else "no automation decision for the XID",
                    decided["time"] if decided else None)
        signalled = demo.wait(lambda: demo.job_events(job, "signalled"), needs=st.ok)
        demo.effect(st, "signal", bool(signalled),
                    f"checkpoint signal: job {job} got SIGUSR1 and its request file "
                    f"($SLURMGPU_CHECKPOINT_FILE)" if signalled else
                    f"job {job} was never asked to checkpoint", signalled[0] if signalled else None)
        acked = demo.wait(lambda: demo.job_events(job, "acked"), needs=st.ok)
        demo.saved_step = _saved_step(demo.output(job))
        saved = f"saved step {demo.saved_step}" if demo.saved_step is not None else "saved"
        demo.effect(st, "ack", bool(acked), f"job {job} {saved} and acked (slurmgpu ckpt ack)"
                    if acked else f"no ack from job {job}", acked[0] if acked else None)
        reason = demo.wait(lambda: demo.drained(node), needs=st.ok)
        drained = demo.job_events(job, "drained")
        demo.effect(st, "drain", bool(reason and "xid.recent" in reason),
                    f"{node} drained on the ack: {reason}" if reason else f"{node} not drained",
                    drained[0] if drained else None)
        requeued = demo.wait(lambda: demo.job_events(job, "requeued"), needs=st.ok)
        demo.effect(st, "requeue", bool(requeued), f"job {job} requeued"
                    if requeued else f"job {job} was not requeued", requeued[0] if requeued else None)
        resumed = demo.wait(lambda: _resumed_on(demo, job), demo.timeout + 20, needs=st.ok)
        if resumed:
            where, step_no = resumed
            kept = demo.saved_step is not None and step_no >= demo.saved_step
            demo.effect(st, "resume", where != node and kept,
                        f"job {job} restarted on {where} and resumed from step {step_no} "
                        f"(restart 1)")
        else:
            demo.effect(st, "resume", False, f"job {job} did not resume on a healthy node")


def step_row_remap(demo: Demo) -> None:
    """A pending row remap: mem.row_remap FAIL; the automation's "checkpoint" action drains
    the node at once, as no job runs there."""
    c, node = demo.cluster, REMAP_NODE
    with demo.step("row-remap", f"fault: a row remap pending on {node} GPU {REMAP_GPU} "
                                f"({REMAP_SCENARIO})") as st:
        c.inject(node, REMAP_SCENARIO)
        demo.effect(st, "injected", True, f"{node} GPU {REMAP_GPU} now reports a pending row remap")
        decided = demo.wait(lambda: demo.decision(node, st.started_wall - 1))
        verdict = c.agent_status(node).get("verdict")
        demo.effect(st, "decision", bool(decided and decided["trigger"] == "mem.row_remap"),
                    f"agent: mem.row_remap {verdict} (a GPU reset is needed); automation: "
                    f"{decided['action']} -> {decided['result']} (no job there to wait for)"
                    if decided else "no automation decision for the row remap",
                    decided["time"] if decided else None)
        reason = demo.wait(lambda: demo.drained(node), needs=st.ok)
        demo.effect(st, "drain", bool(reason and "mem.row_remap" in reason),
                    f"{node} drained: {reason}" if reason else f"{node} not drained")


def step_driver(demo: Demo) -> None:
    """The wrong driver: the breaker holds the automation's third drain; the prolog refuses
    the next job on the node, drains it, and Slurm requeues the job."""
    c, node = demo.cluster, DRIVER_NODE
    with demo.step("driver", f"fault: the wrong driver on {node} ({DRIVER_SCENARIO}: "
                             "535.104.05, pinned 550.90.07)") as st:
        c.inject(node, DRIVER_SCENARIO)
        demo.effect(st, "injected", True, f"{node} now runs driver 535.104.05")
        held = demo.wait(lambda: demo.decision(node, st.started_wall - 1, held=True))
        demo.effect(st, "breaker", bool(held),
                    f"automation: {held['action']} {node} for {held['trigger']} -> HELD: the "
                    "circuit breaker opened (a third drain would take 3 of 4 nodes)"
                    if held else "the breaker did not hold the third drain",
                    held["time"] if held else None)
        train = c.job(demo.jobs["train"]) if "train" in demo.jobs else {}
        busy = train.get("JobState") == "RUNNING" and train.get("NodeList") == demo.spare
        # Kept off the drained nodes; 8 GPUs: the spare node has the trainer on one of its
        # GPUs, so this job lands on the bad node (pinned there when the trainer is done).
        where = ["-x", f"{demo.xid_node},{REMAP_NODE}"] if busy else ["-w", node]
        job = demo.submit("gpu8", "8-GPU job", "", "--gres=gpu:8", *where, "--wrap",
                          'echo "8 GPUs on $SLURMD_NODENAME"')
        demo.effect(st, "submitted", True,
                    f"8-GPU job {job} submitted: {demo.spare} has the trainer on one GPU and "
                    f"{demo.xid_node}, {REMAP_NODE} are drained, so it lands on {node}" if busy
                    else f"8-GPU job {job} submitted, pinned to {node}")
        record = demo.wait(lambda: demo.gate_record(node, job))
        blocked = bool(record and record.get("verdict") == Severity.FAIL.name)
        problems = "; ".join((record or {}).get("problems") or []) or "?"
        demo.effect(st, "prolog", blocked, f"prolog refused job {job} on {node}: {problems}"
                    if blocked else f"the prolog did not refuse job {job} on {node}",
                    float(record["time"]) if record and "time" in record else None)
        reason = demo.wait(lambda: demo.drained(node), needs=blocked)
        demo.effect(st, "drain", bool(blocked and reason and "pin.driver" in reason),
                    f"the prolog drained {node} (the breaker limits the automation, never the "
                    f"gate): {reason}" if blocked and reason else
                    f"{node} not drained by the prolog ({reason or 'not drained'})")
        requeued = demo.wait(lambda: _requeued(c.job(job)), needs=blocked)
        demo.effect(st, "requeue", bool(requeued),
                    f"Slurm requeued job {job} ({requeued}): it waits for a healthy node"
                    if requeued else f"job {job} was not requeued")


def step_breaker(demo: Demo) -> None:
    """`slurmgpu breaker status`: open, why, the drain it holds, the forecast."""
    with demo.step("breaker", "breaker: slurmgpu breaker status") as st:
        status = breaker_status(demo.cluster)
        demo.result.breaker = status
        why = status.get("why") or ""
        held = [f"{h['node']} ({h.get('trigger', '')})" for h in status.get("held", [])]
        now = status.get("drained_now") or {}
        text = (f"OPEN (opened on: {why}); held: {', '.join(held) or 'none'}" if status.get("breaker_open")
                else "closed")
        # The driver node's held drain, or (once the collector polled Slurm) the prolog's drain of it.
        covered = any(h["node"] == DRIVER_NODE for h in status.get("held", [])) or now.get(DRIVER_NODE) == "prolog"
        demo.effect(st, "status", bool(status.get("breaker_open")) and covered,
                    f"breaker {text}; now drained: "
                    f"{', '.join(f'{n} (by {who})' for n, who in sorted(now.items())) or 'none'}")


def step_finish(demo: Demo) -> None:
    """The jobs end on the healthy node: the trainer after its restart, then the 8-GPU job
    the prolog refused."""
    c = demo.cluster
    with demo.step("finish", f"jobs finish on the healthy node ({demo.spare or '?'})") as st:
        for label in ("train", "gpu8"):
            job = demo.jobs.get(label)
            if job is None:
                demo.effect(st, label, False, f"no {label} job was submitted")
                continue
            state = _final_state(demo, job, demo.timeout + 30)
            info = c.job(job)
            where, restarts = info.get("NodeList") or "-", info.get("Restarts", "0")
            extra = ""
            if label == "train":
                last = [ln for ln in demo.output(job).splitlines() if ln.startswith("finished")]
                extra = f", {last[-1]}" if last else ""
            demo.effect(st, label, state == "COMPLETED" and where == demo.spare
                        and int(restarts or 0) >= 1,
                        f"{demo.labels[job]} {job}: {state} on {where} after {restarts} "
                        f"restart(s){extra}")


def step_report(demo: Demo) -> None:
    """`slurmgpu report --since 1h` into the demo directory."""
    with demo.step("report", "report: slurmgpu report --since 1h") as st:
        path = demo.dir / "fleet-report.html"
        summary = write_report(demo.cluster, path)
        demo.result.report, demo.result.report_summary = str(path), summary
        demo.effect(st, "written", path.is_file(),
                    f"{path}: {summary.get('nodes')} nodes, {summary.get('availability_pct')}% "
                    f"available, {summary.get('drains')} drains, {summary.get('xids')} XID(s), "
                    f"{summary.get('jobs_prolog_blocked')} job(s) blocked by the prolog, "
                    f"{summary.get('jobs_checkpointed')} checkpointed, "
                    f"{summary.get('jobs_requeued')} requeued")
        off = summary.get("off_pin_nodes") or []
        demo.effect(st, "off-pin", DRIVER_NODE in off,
                    f"the report shows {', '.join(off) or 'no node'} off its version pins")


STEPS: tuple[Callable[[Demo], None], ...] = (
    step_cluster, step_jobs, step_xid, step_row_remap, step_driver, step_breaker, step_finish,
    step_report,
)


def run_demo(directory: Path = DEFAULT_DIR, *, timeout: float = DEFAULT_TIMEOUT_S,
             say: Callable[[str], None] | None = None,
             steps: tuple[Callable[[Demo], None], ...] = STEPS) -> DemoResult:
    """Run every step (``check_directory`` first for a one-line error on a bad --dir)."""
    started = time.monotonic()
    demo = Demo(directory, timeout, say)
    for step in steps:
        if demo.aborted:
            break
        step(demo)
    with contextlib.suppress(SlurmGpuError, OSError):
        # sinfo may still say "completing" or "planned" for a moment after the last job
        demo.wait(lambda: all(s in SETTLED for s in demo.cluster.node_states().values()), 5)
        demo.result.nodes = node_table(demo.cluster)
        demo.result.jobs = job_table(demo)
    demo.result.total_s = time.monotonic() - started
    return demo.result


# ------------------------------------------------------------------------- checks


def check_directory(directory: Path) -> Path:
    """The demo's directory, or DemoError (exit 3): not root, a path too long for the munge
    socket, a non-empty directory that holds no simulated cluster, a file, or another
    cluster that is up there."""
    d = directory.expanduser().absolute()
    if os.geteuid() != 0:
        raise DemoError("the demo runs a Slurm mini-cluster and must run as root")
    if len(str(d)) + len(_SOCKET_TAIL) > _SUN_PATH_MAX:
        raise DemoError(f"--dir {d}: too long for the munge socket path (at most "
                        f"{_SUN_PATH_MAX - len(_SOCKET_TAIL)} characters)")
    if d.exists() and not d.is_dir():
        raise DemoError(f"--dir {d}: not a directory")
    if d.is_dir() and any(d.iterdir()) and not (d / STATE_FILE).is_file():
        raise DemoError(f"--dir {d}: not empty and holds no simulated cluster; "
                        "choose an empty or new directory")
    c = SimCluster(d)
    if (d / STATE_FILE).is_file() and c.is_up():
        scenario = c.status().get("scenario")
        if c.nodes != node_names(NODES) or c.gpus != GPUS or scenario != DEFAULT_SCENARIO:
            raise DemoError(f"--dir {d}: another cluster is up there ({len(c.nodes)} nodes x "
                            f"{c.gpus} GPUs, scenario {scenario}); run `slurmgpu sim cluster "
                            f"down --dir {shlex.quote(str(d))}` or choose another --dir")
    return d


# ------------------------------------------------------------------------- helpers


def ask_db(db: Path, question: Callable[[queries.Connection], T]) -> T | None:
    """One of the store's named queries on the collector's database (read-only; None
    when it does not exist yet)."""
    if not db.exists():
        return None
    with queries.snapshot(db) as conn:
        return question(conn)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _training_script(ckpt: Path) -> str:
    """The trainer's batch script: the example, with this installation's `slurmgpu` on
    PATH so that it acks with `slurmgpu ckpt ack`."""
    bin_dir = Path(sys.executable).parent
    run = (f"{shlex.quote(sys.executable)} {shlex.quote(str(EXAMPLE))} "
           f"--ckpt {shlex.quote(str(ckpt))} --steps {TRAIN_STEPS} --step-time {TRAIN_STEP_S}")
    path = f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"\n' \
        if (bin_dir / "slurmgpu").exists() else ""
    return f"#!/bin/bash\n{path}exec {run}\n"


def _saved_step(output: str) -> int | None:
    marker = "checkpoint saved at step "
    if marker not in output:
        return None
    try:
        return int(output.rsplit(marker, 1)[1].split()[0])
    except (IndexError, ValueError):
        return None


def _resumed_on(demo: Demo, job: str) -> tuple[str, int] | None:
    """(node, step) once the requeued job printed "resumed from step N" on another node."""
    marker = "resumed from step "
    out = demo.output(job)
    if marker not in out:
        return None
    info = demo.cluster.job(job)
    if info.get("JobState") not in ("RUNNING", "COMPLETING", "COMPLETED"):
        return None
    return info.get("NodeList", "?"), int(out.rsplit(marker, 1)[1].split()[0])


def _requeued(info: dict[str, str]) -> str | None:
    """"PENDING, restart 1" once Slurm has put a job whose prolog failed back in the queue."""
    restarts = int(info.get("Restarts", "0") or 0)
    state = info.get("JobState", "")
    if restarts < 1 or state == "COMPLETING":
        return None
    return f"{state}, restart {restarts}"


def _final_state(demo: Demo, job: str, timeout: float | None = None) -> str:
    """The job's final state, or its state when the wait ran out."""
    from slurmgpu.sim.cluster import TERMINAL_JOB_STATES

    def done() -> str | None:
        state = demo.cluster.job(job).get("JobState", "")
        return state if state in TERMINAL_JOB_STATES else None

    found = demo.wait(done, timeout)
    return found or demo.cluster.job(job).get("JobState", "?")


def breaker_status(cluster: SimCluster) -> dict[str, Any]:
    """What `slurmgpu breaker status --json --config <head config>` prints, less the forecast
    rules' texts: the automation's state in the collector's database, read only."""
    from slurmgpu.collector.policy import Automation
    from slurmgpu.collector.store import Store
    from slurmgpu.config.load import load_config
    from slurmgpu.slurm.factory import make_client

    settings = load_config(str(cluster.head_config)).settings_for(None)
    with contextlib.closing(Store(settings.collector.db)) as store:
        auto = Automation(settings.automation, make_client(settings.slurm), settings.paths.state_dir,
                          store=store, read_only=True)
        status = auto.status()
        status["forecast"] = auto.forecast()
    return status


def write_report(cluster: SimCluster, path: Path, since: str = "1h") -> dict[str, Any]:
    """`slurmgpu report --since 1h --config <head config> --out PATH` (HTML); its summary."""
    from slurmgpu.config.load import load_config
    from slurmgpu.fileutil import write_text_atomic
    from slurmgpu.report import html
    from slurmgpu.report.model import report_from_path, resolve_window

    now = time.time()
    t0, t1 = resolve_window(since, None, None, now)
    model = report_from_path(cluster.collector_db(), t0, t1,
                             config=load_config(str(cluster.head_config)), generated_at=now)
    write_text_atomic(str(path), html.render(model))
    summary: dict[str, Any] = {**model["summary"], "off_pin_nodes": model["pin-drift"]["off_pin_nodes"]}
    return summary


def node_table(cluster: SimCluster) -> list[dict[str, str]]:
    states, reasons = cluster.node_states(), cluster.node_reasons()
    return [{"node": n, "state": states.get(n, "?"),
             "reason": "" if reasons.get(n) in (None, "none") else reasons.get(n, "")}
            for n in cluster.nodes]


def job_table(demo: Demo) -> list[dict[str, str]]:
    rows = []
    for label, job in demo.jobs.items():
        info = demo.cluster.job(job)
        rows.append({"job": job, "name": f"demo-{label}", "what": demo.labels.get(job, label),
                     "state": info.get("JobState", "?"), "node": info.get("NodeList") or "-",
                     "restarts": info.get("Restarts", "0")})
    return rows


# ------------------------------------------------------------------------- rendering


def render_tables(result: DemoResult) -> list[str]:
    """The summary: nodes (state, reason) and jobs (state, node, restarts)."""
    lines = [f"{'NODE':<8} {'STATE':<10} REASON"]
    lines += [f"{n['node']:<8} {n['state']:<10} {n['reason'] or '-'}" for n in result.nodes]
    lines.append("")
    lines.append(f"{'JOB':<6} {'NAME':<12} {'STATE':<10} {'NODE':<8} RESTARTS")
    lines += [f"{j['job']:<6} {j['name']:<12} {j['state']:<10} {j['node']:<8} {j['restarts']}"
              for j in result.jobs]
    return lines


def render_end(result: DemoResult) -> list[str]:
    lines = []
    if result.report:
        lines.append(f"fleet report: {result.report}")
    verdict = "every expected effect observed" if not result.missing else \
        f"NOT OBSERVED: {', '.join(result.missing)}"
    lines.append(f"total {result.total_s:.1f} s (budget {BUDGET_S:.0f} s): {verdict}")
    lines.append(f"explore:   {result.explore}; sinfo; slurmgpu fleet; slurmgpu breaker status")
    lines.append(f"tear down: {result.teardown}")
    return lines
